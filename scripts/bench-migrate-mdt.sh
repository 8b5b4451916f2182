#!/usr/bin/env bash
# braid migrate -m (inodes between MDTs) at scale, with and without a workload beside
# it: one `braid local` cluster (2 MDTs, 4 OSTs; lib-braid.sh) with a tree on MDT 0 of
# FILES empty files in 4 directories (`braid bench mdtest -C` over the native client)
# and 16 files of 16 MiB striped over the 4 OSTs (IOR), then RUNS times:
#   1. the workload alone (mdtest on MDT 0: 2 tasks x ITEMS files, create/stat/remove),
#   2. the tree moved to MDT 1 alone (its time, inodes a second),
#   3. the tree moved back to MDT 0 beside the workload (its time, the workload's rates),
# and fsck after each move (it must find nothing). Prints every run and the medians.
#   scripts/bench-migrate-mdt.sh [FILES] [RUNS] [ITEMS]     (defaults: 20000, 3, 2000)
# MIGRATE_OPTS are more options of braid migrate -m (e.g. --speed-limit 500).
# Needs a release build (cargo build --release -p braid); run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
files=${1:-20000}
runs=${2:-3}
items=${3:-2000}
BRAID=${BRAID:-$PWD/target/release/braid}
WORK=$(mktemp -d /var/tmp/braid-bench-migrate.XXXXXX)
. scripts/lib-braid.sh
trap 'braid_down c; rm -rf "$WORK"' EXIT
port=$((20000 + RANDOM % 20000))
braid_up c "$port" tcp "$BRAID" --mdts 2
export BRAID_SECRET_FILE=$WORK/c/data/cluster.secret
url=braid://127.0.0.1:$port
"$BRAID" mkdir -i 0 "$url/tree"
"$BRAID" mkdir -i 0 "$url/load"
per=$(( (files + 3) / 4 ))
echo "filling: 4 tasks x $per empty files on MDT 0"
"$BRAID" bench mdtest -a native -d "$url/tree/md" -N 4 -n "$per" -F -u -C --json > /dev/null
"$BRAID" mkdir "$url/tree/data"
"$BRAID" setstripe -c 4 -S 1M "$url/tree/data"
"$BRAID" bench ior -a native -N 16 -F -k -t 1m -b 16m -o "$url/tree/data/f" --json > /dev/null
inodes=$("$BRAID" fsck "$url" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["inodes"])')
echo "tree ready ($inodes inodes in the file system)"

workload() {  # workload TAG -> "creates/s stats/s removes/s"
  "$BRAID" bench mdtest -a native -d "$url/load/$1" -N 2 -n "$items" -F -u --json |
    python3 -c 'import json,sys; s={r["operation"]: r["ops_per_s"]["mean"] for r in json.load(sys.stdin)["summary"]}; print("%.0f %.0f %.0f" % (s["File creation"], s["File stat"], s["File removal"]))'
}
move() {  # move MDT -> seconds; the tree is all on MDT and fsck finds nothing
  local t0 t1
  t0=$(date +%s.%N)
  "$BRAID" migrate -m "$1" ${MIGRATE_OPTS:-} "$url/tree" > "$WORK/migrate.out"
  t1=$(date +%s.%N)
  if grep -q "files stay" "$WORK/migrate.out"; then cat "$WORK/migrate.out" >&2; exit 1; fi
  cp "$WORK/migrate.out" "$WORK/migrate-$1.out"
  "$BRAID" fsck "$url" > "$WORK/fsck.out" || { cat "$WORK/fsck.out" >&2; exit 1; }
  python3 -c "print('%.1f' % ($t1 - $t0))"
}

# One line a run: creates stats removes (alone), move alone (s), creates stats
# removes (beside the move back), move back (s).
: > "$WORK/runs"
for r in $(seq 1 "$runs"); do
  a=$(workload "a$r")
  m=$(move 1)
  move 0 > "$WORK/move-beside.t" &
  mp=$!
  b=$(workload "b$r")
  wait "$mp"
  mb=$(cat "$WORK/move-beside.t")
  echo "$a $m $b $mb" >> "$WORK/runs"
  echo "run $r: workload alone $a | move alone ${m} s | beside a move: workload $b, move ${mb} s"
done
cat "$WORK/migrate-1.out"
python3 - "$WORK/migrate-1.out" "$WORK/runs" <<'PY'
import re, statistics, sys
m = re.search(r"(\d+) directories and (\d+) files moved", open(sys.argv[1]).read())
inodes = int(m[1]) + int(m[2])
runs = [list(map(float, line.split())) for line in open(sys.argv[2])]
med = lambda i: statistics.median(r[i] for r in runs)
print(f"{inodes:,} inodes: moved alone in {med(3):.1f} s ({inodes / med(3):,.0f}/s), "
      f"beside the workload in {med(7):.1f} s ({inodes / med(7):,.0f}/s)")
for i, name in enumerate(["creates/s", "stats/s", "removes/s"]):
    print(f"workload {name}: alone {med(i):,.0f}, beside a move {med(4 + i):,.0f} = {med(4 + i) / med(i):.2f}")
PY
