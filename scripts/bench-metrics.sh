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
# CPU time as well, because throughput on a shared machine is noisy and CPU spent per
# operation far less so: the CPU seconds (utime+stime, /proc/PID/stat fields 14 and 15,
# which sum the process's threads; plus cutime+cstime, 16 and 17, of children it has
# reaped, and the same of any children still alive) of the `braid local` process (all
# servers) and of the `braid mount` daemon, read right before and right after the mdtest
# run and right before and right after the IOR run. Each round gets a second line, "cpu":
#   srv us/md, mnt us/md:    CPU microseconds per metadata operation, over all three
#                            mdtest phases: TASKS*ITEMS creates + as many stats + as
#                            many removes, so divided by 3*TASKS*ITEMS;
#   srv ms/GiB, mnt ms/GiB:  CPU milliseconds per GiB IOR moved (written + read bytes,
#                            from its JSON);
#   children:                the most child processes `braid local` and the mount had
#                            at a sample (their CPU is in the sums above).
# The final table has these four as rows too (new/base above 1: metrics cost CPU).
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
  cur_local='' cur_mount_pid='' cur_mnt=''
}
cleanup() {
  stop_side
  # Never through a mount that is still there.
  if grep -q " ${WORK}/" /proc/mounts; then echo "left $WORK: still mounted there" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# cpu_sample: "SERVER_TICKS MOUNT_TICKS KIDS" now: the CPU clock ticks so far of the
# `braid local` process and of the mount daemon, each with its threads (the stat line
# sums them), its reaped children (cutime+cstime) and its live descendants, summed the
# same way; KIDS, how many live descendants the two had. Descendants are found by
# parent PID over all of /proc (this kernel may lack /proc/PID/task/TID/children). The
# command name, field 2, may hold spaces: fields are counted after its last ')'.
cpu_sample() {
  python3 - "$cur_local" "$cur_mount_pid" <<'PY'
import os, sys
stat = {}
for d in os.listdir("/proc"):
    if d.isdigit():
        try:
            f = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        # f[0] is field 3; ppid is field 4, utime..cstime fields 14-17.
        stat[int(d)] = (int(f[1]), sum(int(x) for x in f[11:15]))
kids = {}
for pid, (ppid, _) in stat.items():
    kids.setdefault(ppid, []).append(pid)
out, n = [], 0
for root in map(int, sys.argv[1:]):
    todo, t = [root], 0
    while todo:
        p = todo.pop()
        t += stat[p][1]
        todo += kids.get(p, [])
        n += p != root
    out.append(t)
print(*out, n)
PY
}
tck=$(getconf CLK_TCK)
max_kids=0  # the most live children of the two seen at a sample this round

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
  "$bin" local --data "$d/data" --osts 4 --listen "127.0.0.1:$port" "${local_extra[@]}" > "$d/local.log" 2>&1 &
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

kids() {  # kids "SAMPLE SAMPLE": raise max_kids to the KIDS of either
  local k
  for k in $(echo "$1" | awk '{print $3, $6}'); do [ "$k" -gt "$max_kids" ] && max_kids=$k; done
  return 0
}

mdtest() {  # mdtest SIDE: m="creates_s stats_s removes_s", md_cpu="server_ticks mount_ticks"
  local c0 c1
  c0=$(cpu_sample)
  run_bench "$WORK/$1/mdtest.json" "$cur_bin" bench mdtest -N "$tasks" -n "$items" -F -C -T -r -d "$WORK/$1/mnt/md" --json -q
  m=$(python3 -c 'import json,sys; s={r["operation"]: r["ops_per_s"]["mean"] for r in json.load(sys.stdin)["summary"]}; print("%.0f %.0f %.0f" % (s["File creation"], s["File stat"], s["File removal"]))' < "$WORK/$1/mdtest.json")
  c1=$(cpu_sample)
  kids "$c0 $c1"
  md_cpu=$(echo "$c0 $c1" | awk '{print $4 - $1, $5 - $2}')
}

ior() {  # ior SIDE: i="write_mib_s read_mib_s", ior_cpu="server_ticks mount_ticks bytes_moved"
  local c0 c1 moved
  c0=$(cpu_sample)
  run_bench "$WORK/$1/ior.json" "$cur_bin" bench ior -N 4 -F -C -e -t 1m -b "$block" --drop-caches -o "$WORK/$1/mnt/ior/f" --json
  i=$(python3 -c 'import json,sys; s={r["operation"]: r["bandwidth_mib_s"]["mean"] for r in json.load(sys.stdin)["summary"]}; print("%.0f %.0f" % (s["write"], s["read"]))' < "$WORK/$1/ior.json")
  c1=$(cpu_sample)
  moved=$(python3 -c 'import json,sys; print(sum(r["bytes"] for r in json.load(sys.stdin)["results"] if r["operation"] in ("write", "read")))' < "$WORK/$1/ior.json")
  kids "$c0 $c1"
  ior_cpu=$(echo "$c0 $c1 $moved" | awk '{print $4 - $1, $5 - $2, $7}')
}

# measure SIDE: out="creates stats removes write read", cpu="srv_us/md mnt_us/md srv_ms/GiB
# mnt_ms/GiB"; the side runs only meanwhile.
measure() {
  local m i ok md_cpu ior_cpu
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
  # Ticks to microseconds per metadata operation (3 of them per file) and milliseconds
  # per GiB moved.
  cpu=$(echo "$md_cpu $ior_cpu" | awk -v tck="$tck" -v ops=$((3 * tasks * items)) \
    '{g = $5 / 2^30; printf "%.1f %.1f %.0f %.0f", $1 / tck * 1e6 / ops, $2 / tck * 1e6 / ops, $3 / tck * 1e3 / g, $4 / tck * 1e3 / g}')
}

if [ "$new_metrics" = 1 ]; then on="metrics served and scraped each second"; else on="no endpoints, no scraper"; fi
echo "braid bench metrics: base $BRAID_BASE, new $BRAID ($on)"
echo "mdtest: $tasks tasks x $items files, shared dir (ops/s); IOR: 4 tasks x $block, file per process, fsync, 1 MiB (MiB/s)"
echo "round first  base: create stat remove write read  |  new: create stat remove write read  | new: scrapes ok/failed, FUSE requests/RPCs counted"
echo "  cpu        base: srv us/md mnt us/md srv ms/GiB mnt ms/GiB  |  new: the same  | children (CPU: $tck ticks/s; md = 3*$tasks*$items ops)"
results=$WORK/results
: > "$results"
scrapes=- counted=-
for r in $(seq 1 "$rounds"); do
  max_kids=0
  if [ $((r % 2)) = 1 ]; then first=base; measure base; b=$out; bc=$cpu; measure new; n=$out; nc=$cpu
  else first=new; measure new; n=$out; nc=$cpu; measure base; b=$out; bc=$cpu; fi
  echo "$r     $first   $b  |  $n  | $scrapes, $counted"
  echo "  cpu        $bc  |  $nc  | $max_kids"
  echo "$b $n $bc $nc" >> "$results"
done
python3 - "$results" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
cols = list(zip(*rows))
# Each row: 5 throughputs of base, 5 of new, 4 CPU figures of base, 4 of new.
names = ["creates/s", "stats/s", "removes/s", "IOR write MiB/s", "IOR read MiB/s"]
cpu_names = ["server CPU us/md op", "mount CPU us/md op", "server CPU ms/GiB", "mount CPU ms/GiB"]
print(f"\nmedians of {len(rows)} rounds (min-max); new/base of the medians; each round's new/base, median (min-max);")
print("spread = (max-min)/median of each side")
print("| measure | base | new | new/base | rounds' new/base | spread base | spread new |")
print("|---|---|---|---|---|---|---|")
table = [(name, cols[k], cols[k + 5], ",.0f") for k, name in enumerate(names)]
table += [(name, cols[10 + k], cols[14 + k], ",.1f" if k < 2 else ",.0f") for k, name in enumerate(cpu_names)]
for name, b, n, f in table:
    mb, mn = statistics.median(b), statistics.median(n)
    rr = [y / x for x, y in zip(b, n)]
    print(f"| {name} | {mb:{f}} ({min(b):{f}}-{max(b):{f}}) | {mn:{f}} ({min(n):{f}}-{max(n):{f}}) "
          f"| {mn / mb:.3f} | {statistics.median(rr):.3f} ({min(rr):.2f}-{max(rr):.2f}) "
          f"| {(max(b) - min(b)) / mb:.1%} | {(max(n) - min(n)) / mn:.1%} |")
EOF
