#!/usr/bin/env bash
# braid fsck at scale, with and without a workload beside it: one `braid local`
# cluster (4 OSTs) filled with FILES empty files by `braid bench mdtest -C` over the
# native client (plus one striped file per 1000 files' worth of data from IOR, so the
# OSTs hold objects too), then
#   1. the workload alone (mdtest: 2 tasks x ITEMS files each, create/stat/remove),
#   2. `braid fsck` alone (its time),
#   3. both at once (fsck's time, the workload's rates),
# each RUNS times; prints every run and the medians, and the workload's rates beside
# fsck as a ratio of its rates alone.
#   scripts/bench-fsck.sh [FILES] [RUNS] [ITEMS]     (defaults: 1000000, 3, 5000)
# FSCK_OPTS are more options of braid fsck (e.g. --speed-limit 0).
# Needs a release build (cargo build --release -p braid); run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
files=${1:-1000000}
runs=${2:-3}
items=${3:-5000}
BRAID=${BRAID:-$PWD/target/release/braid}
WORK=$(mktemp -d /var/tmp/braid-bench-fsck.XXXXXX)
port=$((20000 + RANDOM % 20000))
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 1
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BRAID" local --data "$WORK/data" --osts 4 --listen 127.0.0.1:$port > "$WORK/local.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do grep -q "^MGS at" "$WORK/local.log" && break; sleep 0.2; done
export BRAID_SECRET_FILE=$WORK/data/cluster.secret
url=braid://127.0.0.1:$port
per=$(( (files + 3) / 4 ))
echo "filling: 4 tasks x $per empty files"
t0=$(date +%s.%N)
"$BRAID" bench mdtest -a native -d "$url/fill" -N 4 -n "$per" -F -u -C --json > "$WORK/fill.json"
echo "filled in $(python3 -c "print('%.0f' % ($(date +%s.%N) - $t0))") s"
"$BRAID" mkdir "$url/data"
"$BRAID" setstripe -c 4 -S 1M "$url/data"
"$BRAID" bench ior -a native -N 4 -F -k -t 1m -b 64m -o "$url/data/f" --json > /dev/null

workload() {  # workload TAG -> "creates/s stats/s removes/s"
  "$BRAID" bench mdtest -a native -d "$url/work-$1" -N 2 -n "$items" -F -u --json |
    python3 -c 'import json,sys; s={r["operation"]: r["ops_per_s"]["mean"] for r in json.load(sys.stdin)["summary"]}; print("%.0f %.0f %.0f" % (s["File creation"], s["File stat"], s["File removal"]))'
}
fsck_time() {  # fsck_time -> seconds (fsck must find nothing)
  local t0 t1
  t0=$(date +%s.%N)
  "$BRAID" fsck "$url" ${FSCK_OPTS:-} > "$WORK/fsck.out"
  t1=$(date +%s.%N)
  python3 -c "print('%.1f' % ($t1 - $t0))"
}

alone=() ; fsck_alone=() ; beside=() ; fsck_beside=()
for r in $(seq 1 "$runs"); do
  a=$(workload "a$r"); alone+=("$a")
  f=$(fsck_time); fsck_alone+=("$f")
  fsck_time > "$WORK/fsck-beside.t" &
  fp=$!
  b=$(workload "b$r"); beside+=("$b")
  wait "$fp"
  fb=$(cat "$WORK/fsck-beside.t"); fsck_beside+=("$fb")
  echo "run $r: workload alone $a | fsck alone ${f} s | beside fsck: workload $b, fsck ${fb} s"
done
head -1 "$WORK/fsck.out"
python3 - "$files" "${alone[@]}" -- "${beside[@]}" -- "${fsck_alone[@]}" -- "${fsck_beside[@]}" <<'PY'
import statistics, sys
files = int(sys.argv[1])
groups, cur = [], []
for a in sys.argv[2:]:
    if a == "--":
        groups.append(cur); cur = []
    else:
        cur.append(a)
groups.append(cur)
alone = [list(map(float, x.split())) for x in groups[0]]
beside = [list(map(float, x.split())) for x in groups[1]]
fa = statistics.median(map(float, groups[2])); fb = statistics.median(map(float, groups[3]))
print(f"{files} files: fsck alone {fa:.1f} s, beside the workload {fb:.1f} s (medians)")
for i, name in enumerate(["creates/s", "stats/s", "removes/s"]):
    ma = statistics.median(r[i] for r in alone); mb = statistics.median(r[i] for r in beside)
    print(f"workload {name}: alone {ma:.0f}, beside fsck {mb:.0f}, ratio {mb / ma:.2f}")
PY
