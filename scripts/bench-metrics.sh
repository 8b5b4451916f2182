#!/usr/bin/env bash
# Metrics on against metrics off (issue 42's performance target: mdtest creates and IOR
# bandwidth within 2%): two binaries, each its own `braid local` cluster (4 OSTs) and a
# separate `braid mount` process over TCP of the same binary. BRAID_BASE is a build
# without metrics (the commit before they came); BRAID is a build with them, run with
# `braid local --metrics` and the mount's `-o metrics=`, both endpoints scraped once a
# second (curl GET /metrics, as Prometheus would) for as long as that side runs.
# Only one cluster runs at a time: each round starts one side's cluster on fresh data,
# measures through its mount, stops it, then does the same for the other side; rounds
# alternate which side goes first. Measured through each mount:
#   mdtest: `braid bench mdtest -F -C -T -r`, TASKS tasks x ITEMS empty files each in
#           one shared directory: creates/s, stats/s, removes/s;
#   IOR:    `braid bench ior -N 4 -F -C -e -t 1m -b BLOCK --drop-caches` on a directory
#           striped over the 4 OSTs (`braid setstripe -c 4 -S 1M`): write and read MiB/s.
# Prints each round, then the medians (min-max over rounds), the ratio new/base of the
# medians and the median (min-max) of each round's own ratio (the two sides of a round
# run back to back, so a slow drift of the machine falls on both).
#   BRAID_BASE=BINARY [BRAID=BINARY] scripts/bench-metrics.sh [ROUNDS]   (default 3)
# Environment: BRAID (default target/release/braid), BRAID_BASE (required), TASKS (4),
# ITEMS (2000), BLOCK (256m per IOR task), TMPDIR (where the scratch directory is made
# and removed at the end; default /var/tmp), NEW_METRICS (1; 0 runs BRAID without
# endpoints or scraper: with BRAID=BRAID_BASE an A/A run, what noise alone makes of the
# ratios). Needs curl; run as root (FUSE, drop_caches).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
BRAID=${BRAID:-$PWD/target/release/braid}
BRAID_BASE=${BRAID_BASE:?set BRAID_BASE to a braid binary built without metrics}
tasks=${TASKS:-4}
items=${ITEMS:-2000}
block=${BLOCK:-256m}
new_metrics=${NEW_METRICS:-1}
for b in "$BRAID" "$BRAID_BASE"; do [ -x "$b" ] || { echo "no braid binary at $b" >&2; exit 1; }; done
command -v curl > /dev/null || { echo "curl is needed for the scraper" >&2; exit 1; }
WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/braid-bench-metrics.XXXXXX")
# Ports below the kernel's ephemeral range (32768 on), where the OS's picks and other
# clusters' OSS/MDS ports land; each start takes the next three that are free.
port=$((20000 + RANDOM % 10000))
free_ports() {  # the first port >= $1 with it and the next two free to listen on
  python3 - "$1" <<'PY'
import socket, sys
p = int(sys.argv[1])
def free(n):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", n)); return True
    except OSError:
        return False
    finally:
        s.close()
while not all(free(p + k) for k in range(3)):
    p += 3
print(p)
PY
}

# What is running now, for the cleanup: the cluster's PID, the mount's daemon PID, the
# scraper's PID, the benchmark's PID (if interrupted) and the mount point.
cur_bin=
cur_local=
cur_mount_pid=
cur_mnt=
scraper=
bench=
gone() {  # gone PID: wait up to 5 s for it to exit; 1 if it did not
  for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  return 1
}
# In this order: the benchmark and its worker processes first, while the servers still
# answer the requests they wait on; then the mount; the cluster last.
stop_side() {
  if [ -n "$scraper" ]; then kill "$scraper" 2>/dev/null || true; wait "$scraper" 2>/dev/null || true; scraper=; fi
  if [ -n "$bench" ]; then
    pkill -TERM -P "$bench" 2>/dev/null || true
    kill "$bench" 2>/dev/null || true
    wait "$bench" 2>/dev/null || true
    sleep 1
    bench=
  fi
  if [ -n "$cur_mnt" ] && mountpoint -q "$cur_mnt"; then "$cur_bin" umount "$cur_mnt" || true; fi
  if [ -n "$cur_mount_pid" ]; then
    kill "$cur_mount_pid" 2>/dev/null || true
    gone "$cur_mount_pid" || kill -KILL "$cur_mount_pid" 2>/dev/null || true
  fi
  if [ -n "$cur_mnt" ] && mountpoint -q "$cur_mnt"; then umount -l "$cur_mnt" || true; fi
  if [ -n "$cur_local" ]; then
    kill "$cur_local" 2>/dev/null || true
    gone "$cur_local" || kill -KILL "$cur_local" 2>/dev/null || true
    wait "$cur_local" 2>/dev/null || true
  fi
  cur_local= cur_mount_pid= cur_mnt=
}
cleanup() {
  stop_side
  # Never through a mount that is still there.
  if grep -q " ${WORK}/" /proc/mounts; then echo "left $WORK: still mounted there" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# run_bench OUT COMMAND...: COMMAND with its output into OUT, its PID kept for the cleanup.
run_bench() {
  local out=$1 rc=0
  shift
  "$@" > "$out" &
  bench=$!
  wait "$bench" || rc=$?
  bench=
  return $rc
}

# scrape LOG ADDR...: GET /metrics at each address once a second, one HTTP status a line.
scrape() {
  local log=$1
  shift
  while :; do
    for a in "$@"; do
      curl -s -o /dev/null -w '%{http_code}\n' --max-time 5 "http://$a/metrics" >> "$log" || echo fail >> "$log"
    done
    sleep 1
  done
}

# start_side NAME: that side's cluster on fresh data and its mount (and, for new, the
# endpoints and the scraper).
start_side() {
  local side=$1 d=$WORK/$1 bin local_extra=() mount_opts=()
  port=$(free_ports $((port + 3)))
  rm -rf "$d"
  mkdir -p "$d/data" "$d/mnt"
  if [ "$side" = new ]; then
    bin=$BRAID
  else
    bin=$BRAID_BASE
  fi
  if [ "$side" = new ] && [ "$new_metrics" = 1 ]; then
    local_extra=(--metrics 127.0.0.1:$((port + 1)))
    mount_opts=(-o metrics=127.0.0.1:$((port + 2)))
  fi
  cur_bin=$bin
  "$bin" local --data "$d/data" --osts 4 --listen 127.0.0.1:$port "${local_extra[@]}" > "$d/local.log" 2>&1 &
  cur_local=$!
  for _ in $(seq 1 100); do grep -qs "^MGS at" "$d/local.log" && break; sleep 0.2; done
  grep -q "^MGS at" "$d/local.log" || { echo "braid local ($side) did not start:" >&2; cat "$d/local.log" >&2; exit 1; }
  cur_mnt=$d/mnt
  "$bin" mount "braid://127.0.0.1:$port/" "$d/mnt" --secret-file "$d/data/cluster.secret" --log "$d/mount.log" \
    "${mount_opts[@]}" > "$d/mount.out"
  cur_mount_pid=$(sed -n 's/.*(pid \([0-9]*\),.*/\1/p' "$d/mount.out")
  for _ in $(seq 1 100); do mountpoint -q "$d/mnt" && break; sleep 0.2; done
  mountpoint -q "$d/mnt" || { echo "braid mount ($side) did not mount" >&2; exit 1; }
  mkdir -p "$d/mnt/ior" "$d/mnt/md"
  "$bin" setstripe -c 4 -S 1M "$d/mnt/ior"
  if [ "$side" = new ] && [ "$new_metrics" = 1 ]; then
    scrape "$d/scrapes" 127.0.0.1:$((port + 1)) 127.0.0.1:$((port + 2)) &
    scraper=$!
  fi
}

mdtest() {  # mdtest SIDE: m="creates_s stats_s removes_s"
  run_bench "$WORK/$1/mdtest.json" "$cur_bin" bench mdtest -N "$tasks" -n "$items" -F -C -T -r -d "$WORK/$1/mnt/md" --json -q
  m=$(python3 -c 'import json,sys; s={r["operation"]: r["ops_per_s"]["mean"] for r in json.load(sys.stdin)["summary"]}; print("%.0f %.0f %.0f" % (s["File creation"], s["File stat"], s["File removal"]))' < "$WORK/$1/mdtest.json")
}

ior() {  # ior SIDE: i="write_mib_s read_mib_s"
  run_bench "$WORK/$1/ior.json" "$cur_bin" bench ior -N 4 -F -C -e -t 1m -b "$block" --drop-caches -o "$WORK/$1/mnt/ior/f" --json
  i=$(python3 -c 'import json,sys; s={r["operation"]: r["bandwidth_mib_s"]["mean"] for r in json.load(sys.stdin)["summary"]}; print("%.0f %.0f" % (s["write"], s["read"]))' < "$WORK/$1/ior.json")
}

measure() {  # measure SIDE: out="creates stats removes write read"; the side runs only meanwhile
  local m i ok
  start_side "$1"
  mdtest "$1"
  ior "$1"
  if [ "$1" = new ] && [ "$new_metrics" = 1 ]; then
    # The endpoints really answered, and the mount really counted: else this is no "on".
    ok=$(grep -c '^200$' "$WORK/new/scrapes" || true)
    [ "$ok" -gt 0 ] || { echo "the scraper got no answer from the metrics endpoints" >&2; exit 1; }
    scrapes="$ok/$(grep -vc '^200$' "$WORK/new/scrapes" || true)"
    # What the endpoints counted: FUSE requests (the mount) and RPCs served (the servers).
    counted=$(curl -s "http://127.0.0.1:$((port + 2))/metrics" | awk '/^braid_fuse_requests_total/ {s += $NF} END {printf "%d", s}')
    counted="$counted/$(curl -s "http://127.0.0.1:$((port + 1))/metrics" | awk '/^braid_rpc_requests_total/ {s += $NF} END {printf "%d", s}')"
    [ "${counted%/*}" -gt 0 ] || { echo "the mount's endpoint counted no FUSE requests" >&2; exit 1; }
  fi
  stop_side
  rm -rf "${WORK:?}/$1"
  out="$m $i"
}

if [ "$new_metrics" = 1 ]; then on="metrics served and scraped each second"; else on="no endpoints, no scraper"; fi
echo "braid bench metrics: base $BRAID_BASE, new $BRAID ($on)"
echo "mdtest: $tasks tasks x $items files, shared dir (ops/s); IOR: 4 tasks x $block, file per process, fsync, 1 MiB (MiB/s)"
echo "round first  base: create stat remove write read  |  new: create stat remove write read  | new: scrapes ok/failed, FUSE requests/RPCs counted"
results=$WORK/results
: > "$results"
scrapes=- counted=-
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then first=base; measure base; b=$out; measure new; n=$out
  else first=new; measure new; n=$out; measure base; b=$out; fi
  echo "$r     $first   $b  |  $n  | $scrapes, $counted"
  echo "$b $n" >> "$results"
done
python3 - "$results" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
cols = list(zip(*rows))
names = ["creates/s", "stats/s", "removes/s", "IOR write MiB/s", "IOR read MiB/s"]
print(f"\nmedians of {len(rows)} rounds (min-max); new/base of the medians; each round's new/base, median (min-max);")
print("spread = (max-min)/median of each side")
print("| measure | base | new | new/base | rounds' new/base | spread base | spread new |")
print("|---|---|---|---|---|---|---|")
for k, name in enumerate(names):
    b, n = cols[k], cols[k + 5]
    mb, mn = statistics.median(b), statistics.median(n)
    rr = [y / x for x, y in zip(b, n)]
    print(f"| {name} | {mb:,.0f} ({min(b):,.0f}-{max(b):,.0f}) | {mn:,.0f} ({min(n):,.0f}-{max(n):,.0f}) "
          f"| {mn / mb:.3f} | {statistics.median(rr):.3f} ({min(rr):.2f}-{max(rr):.2f}) "
          f"| {(max(b) - min(b)) / mb:.1%} | {(max(n) - min(n)) / mn:.1%} |")
EOF
