#!/usr/bin/env bash
# A replicated MDT (braid mds --replicas) against a single MDS, on separate nodes
# (scripts/netns-cluster.sh: the MGS, each MDS, the OSS and the client each in a
# network namespace of its own; unshaped links): 1 OSS with 2 OSTs, 1 client, and
# MDT 0 served by 1 MDS or replicated by 3.
#
# 1. Metadata rate: an mdtest-like run through a mount on the client, from inside the
#    client's namespace: FILES empty files created (os.open(O_CREAT|O_EXCL) and
#    close) by P processes, each in a directory of its own (mdtest -u), then all stat'ed (after
#    the kernel's dentry and inode caches are dropped, so each stat asks the mount),
#    then all unlinked. RUNS runs with 1 replica, then RUNS with 3, each cluster
#    brought up fresh; per phase the median and the ratio 3 replicas / 1.
# 2. Failover (3 replicas): a probe on the client creates a file every 50 ms and logs
#    when each create returned. KILLS times: the node serving the MDT is SIGKILLed
#    (netns-cluster.sh kill NODE KILL), the next leader awaited, the killed node
#    started again, 5 s pause. Per kill: (a) the client's stall, from the kill
#    command being issued to the first create that returned after the killed process
#    was gone; (b) from the kill being issued to the new leader's "leading the replica
#    group" (elected) and "MDT0000 served by this replica" log lines (its own
#    timestamps); (c) the longest gap between creates while the killed node rejoins
#    (from its start to the next kill).
#
#   scripts/bench-replicas.sh [--bin PATH] [--runs N] [--files N] [--procs P]
#       [--kills N] [--work DIR]
#
# Defaults: the binary BRAID or target/release/braid, 3 runs, 5000 files, 10 kills,
# work under a new /var/tmp/braid-bench-replicas.XXXXXX (removed at the end unless
# --work is given). Needs root, python3 and what netns-cluster.sh needs; keep the
# machine otherwise idle. Prints a Markdown summary at the end (also in WORK/summary.md).
set -euo pipefail
cd "$(dirname "$0")/.."
HERE=$PWD
NC=$HERE/scripts/netns-cluster.sh
CMDLINE="scripts/bench-replicas.sh $*"
BRAID=${BRAID:-$HERE/target/release/braid}
RUNS=3
FILES=5000
PROCS=1
KILLS=10
WORK=
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BRAID=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --files) FILES=$2; shift 2 ;;
    --procs) PROCS=$2; shift 2 ;;
    --kills) KILLS=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-replicas.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for n in "$RUNS" "$FILES" "$KILLS" "$PROCS"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "bench-replicas.sh: --runs, --files, --procs and --kills want whole numbers, not '$n'" >&2; exit 2; }
done
[ "$PROCS" -ge 1 ] || { echo "bench-replicas.sh: --procs wants 1 or more" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "bench-replicas.sh: run as root (network namespaces, mounts)" >&2; exit 1; }
[ -x "$BRAID" ] || { echo "bench-replicas.sh: no braid binary at $BRAID (cargo build --release, or --bin PATH)" >&2; exit 1; }
"$BRAID" mds --help | grep -q -- --replicas || { echo "bench-replicas.sh: $BRAID has no braid mds --replicas" >&2; exit 1; }
BRAID=$(realpath "$BRAID")
KEEP=1
if [ -z "$WORK" ]; then
  WORK=$(mktemp -d /var/tmp/braid-bench-replicas.XXXXXX)
  KEEP=0
fi
mkdir -p "$WORK"
WORK=$(realpath "$WORK")
MNT=$WORK/mnt
STATES=()
PROBE_PID=

cleanup() {
  local rc=$? s
  set +e
  if [ -n "$PROBE_PID" ]; then kill "$PROBE_PID" 2>/dev/null; wait "$PROBE_PID" 2>/dev/null; fi
  for s in "${STATES[@]}"; do
    "$NC" down --state "$s" --grace 5 >/dev/null || echo "bench-replicas.sh: down --state $s failed" >&2
  done
  if [ "$KEEP" = 0 ] && [ "$rc" = 0 ]; then
    rm -rf "$WORK"
  else
    echo "bench-replicas.sh: logs and results kept in $WORK" >&2
  fi
}
trap cleanup EXIT

# The mdtest-like workload: FILES files in DIR, created, stat'ed, unlinked; prints
# "creates stats unlinks" per second.
cat >"$WORK/md.py" <<'EOF'
import multiprocessing as mp, os, sys, time
d, n, procs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.mkdir(d)
# As mdtest -u: each process in a directory of its own, n/procs files each; the
# phases start together, and a phase's time runs until its last process is done.
def work(k, bar):
    sub = os.path.join(d, "p%d" % k)
    os.mkdir(sub)
    names = [os.path.join(sub, "f%07d" % i) for i in range(n // procs)]
    for op in (lambda p: os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)), os.stat, os.unlink):
        bar.wait()
        for p in names:
            op(p)
        bar.wait()
    os.rmdir(sub)
bar = mp.Barrier(procs + 1)
workers = [mp.Process(target=work, args=(k, bar)) for k in range(procs)]
for w in workers:
    w.start()
rates = []
for phase in range(3):
    if phase == 1:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2")
    bar.wait()
    t = time.perf_counter()
    bar.wait()
    rates.append((n // procs) * procs / (time.perf_counter() - t))
for w in workers:
    w.join()
os.rmdir(d)
print("%.1f %.1f %.1f" % tuple(rates))
EOF

# The failover probe: a create every 50 ms in DIR, "START END" (epoch seconds) of
# each logged to OUT as it returns; an error is logged and retried.
cat >"$WORK/probe.py" <<'EOF'
import os, sys, time
d, out = sys.argv[1], sys.argv[2]
os.makedirs(d, exist_ok=True)
log = open(out, "a", buffering=1)
i = 0
while True:
    t0 = time.time()
    try:
        os.close(os.open(os.path.join(d, "p%07d" % i), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        log.write("%.6f %.6f\n" % (t0, time.time()))
        i += 1
    except OSError as e:
        log.write("# %.6f %.6f error %s\n" % (t0, time.time(), e))
    time.sleep(0.05)
EOF

now() { date +%s.%N; }

up() {  # up NAME REPLICAS: a fresh cluster in WORK/NAME, mounted on client0 at MNT
  local s=$WORK/$1
  STATES+=("$s")
  "$NC" up --state "$s" --bin "$BRAID" --mdt-replicas "$2" --osss 1 --osts-per-oss 2 --clients 1 >/dev/null
  "$NC" mount --state "$s" client0 "$MNT" >/dev/null
}

down() {  # down NAME: the cluster stopped, its data removed, its logs kept
  "$NC" down --state "$WORK/$1" >/dev/null
  unset 'STATES[-1]'
  rm -rf "$WORK/$1/data"
}

: >"$WORK/md.tsv"
for reps in 1 3; do
  echo "== metadata, $reps replica(s): $RUNS runs of $FILES files" >&2
  up "md$reps" "$reps"
  for r in $(seq 1 "$RUNS"); do
    res=$("$NC" exec --state "$WORK/md$reps" client0 -- python3 "$WORK/md.py" "$MNT/run$r" "$FILES" "$PROCS")
    echo "$reps replica(s), run $r: creates/s stats/s unlinks/s = $res" >&2
    printf '%s\t%s\t%s\n' "$reps" "$r" "${res// /$'\t'}" >>"$WORK/md.tsv"
  done
  if [ "$reps" = 3 ] && [ "$KILLS" -gt 0 ]; then break; fi
  down "md$reps"
done

# Failover, on the 3-replica cluster still up.
: >"$WORK/kills.tsv"
: >"$WORK/restart-failures.tsv"
if [ "$KILLS" -gt 0 ]; then
  S=$WORK/md3
  echo "== failover: $KILLS kills of the leader" >&2
  "$NC" exec --state "$S" client0 -- python3 "$WORK/probe.py" "$MNT/probe" "$WORK/probe.log" &
  PROBE_PID=$!
  sleep 3
  for k in $(seq 1 "$KILLS"); do
    leader=$("$NC" leader --state "$S" --timeout 60)
    t0=$(now)
    "$NC" kill --state "$S" "$leader" KILL >/dev/null
    t1=$(now)
    # The next leader: another running replica serving it.
    next=
    for _ in $(seq 1 600); do
      next=$("$NC" leader --state "$S" --timeout 60)
      [ "$next" != "$leader" ] && break
      sleep 0.1
    done
    # The first create returned after the killed process was gone.
    done_at=
    for _ in $(seq 1 600); do
      done_at=$(awk -v t="$t1" '$1 !~ /^#/ && $2 > t { print $2; exit }' "$WORK/probe.log")
      [ -n "$done_at" ] && break
      sleep 0.1
    done
    [ -n "$done_at" ] || { echo "bench-replicas.sh: no create returned within 60 s of killing $leader" >&2; exit 1; }
    # The new leader's own timestamps: elected, then serving.
    elected=$(grep 'leading the replica group' "$S/logs/$next.log" | tail -n 1 | awk '{ print $1 }' || true)
    served=$(grep 'served by this replica' "$S/logs/$next.log" | tail -n 1 | awk '{ print $1 }' || true)
    t_start=$(now)
    if ! "$NC" start --state "$S" "$leader" >/dev/null 2>"$WORK/start-$k.err"; then
      # Without it the group cannot lose another replica: no more kills.
      reason=$(grep -m1 -E '^braid: |error' "$WORK/start-$k.err" | cut -c1-300 || true)
      printf '%s\t%s\t%s\n' "$k" "$leader" "${reason:-see $WORK/start-$k.err}" >>"$WORK/restart-failures.tsv"
      echo "kill $k: $leader did not start again, failover runs end here: ${reason:-see $WORK/start-$k.err}" >&2
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$k" "$leader" "$next" "$t0" "$t1" "$done_at" "$served" "$t_start" "$elected" \
        >>"$WORK/kills.tsv"
      break
    fi
    rm -f "$WORK/start-$k.err"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$k" "$leader" "$next" "$t0" "$t1" "$done_at" "$served" "$t_start" "$elected" \
      >>"$WORK/kills.tsv"
    echo "kill $k: $leader killed, $next leads; a create returned $(awk -v a="$t0" -v b="$done_at" 'BEGIN { printf "%.2f", b - a }') s after the kill" >&2
    sleep 5
  done
  kill "$PROBE_PID" 2>/dev/null || true
  wait "$PROBE_PID" 2>/dev/null || true
  PROBE_PID=
  "$NC" status --state "$S" >"$WORK/status.txt" || true
fi
[ "${#STATES[@]}" = 0 ] || down md3

python3 - "$WORK/md.tsv" "$WORK/kills.tsv" "$WORK/probe.log" "$CMDLINE" "$BRAID" "$RUNS" "$FILES" "$KILLS" \
  "$WORK/restart-failures.tsv" "$PROCS" <<'EOF' | tee "$WORK/summary.md"
import datetime, os, platform, statistics, subprocess, sys
md, kills, probe, cmdline, braid, runs, files, nkills, failures, procs = sys.argv[1:11]
ver = subprocess.run([braid, "--version"], capture_output=True, text=True).stdout.strip()
print(f"Replicated MDT against a single MDS ({ver}, {os.cpu_count()} cores, Linux {platform.release()}),")
print("every server and the client in its own network namespace (scripts/netns-cluster.sh, unshaped")
print(f"links), 1 OSS x 2 OSTs, 1 client. Produced by `{cmdline}`.")
rows = [l.split("\t") for l in open(md).read().splitlines() if l]
by = {}
for reps, _run, *vals in rows:
    by.setdefault(reps, []).append([float(v) for v in vals])
if by:
    who = "one process, in one directory" if procs == "1" else f"{procs} processes, each in a directory of its own"
    print(f"\nMetadata, {files} empty files from {who} (Python: open(O_CREAT)+close,")
    print(f"stat after dropping the dentry and inode caches, unlink), median of {runs} runs (the runs in brackets):\n")
    print("| phase (per s) | 1 replica | 3 replicas | 3 / 1 |")
    print("|---|---|---|---|")
    for i, phase in enumerate(("creates", "stats", "unlinks")):
        cells, meds = [], []
        for reps in ("1", "3"):
            v = [r[i] for r in by.get(reps, [])]
            m = statistics.median(v) if v else float("nan")
            meds.append(m)
            cells.append(f"{m:,.0f} ({', '.join(f'{x:,.0f}' for x in v)})" if v else "-")
        ratio = f"{meds[1] / meds[0]:.2f}" if meds[0] == meds[0] and meds[1] == meds[1] else "-"
        print(f"| {phase} | {cells[0]} | {cells[1]} | {ratio} |")
krows = [l.split("\t") for l in open(kills).read().splitlines() if l]
if krows:
    def ts(s):
        return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
    done = [(float(r[0]), float(r[1])) for r in (l.split() for l in open(probe) if not l.startswith("#"))]
    errors = sum(1 for l in open(probe) if l.startswith("#"))
    stall, elect, serve, kill_cmd, rejoin = [], [], [], [], []
    for i, (k, leader, nxt, t0, t1, done_at, served, t_start, elected) in enumerate(krows):
        t0, t1, done_at, t_start = float(t0), float(t1), float(done_at), float(t_start)
        stall.append(done_at - t0)
        kill_cmd.append(t1 - t0)
        if elected:
            elect.append(ts(elected) - t0)
        if served:
            serve.append(ts(served) - t0)
        end = float(krows[i + 1][3]) if i + 1 < len(krows) else max(e for _, e in done)
        ends = [t_start] + [e for _, e in done if t_start < e <= end]
        rejoin.append(max(b - a for a, b in zip(ends, ends[1:])) if len(ends) > 1 else float("nan"))
    def line(name, v):
        if not v:
            return f"| {name} | - | - |"
        return f"| {name} | {statistics.median(v):.2f} s | {max(v):.2f} s |"
    print(f"\nFailover, 3 replicas: the leader SIGKILLed {len(krows)} times (netns-cluster.sh kill NODE KILL),")
    print("restarted after the next leader serves, 5 s between kills; a probe on the client creates a file")
    print(f"every 50 ms ({len(done)} creates, {errors} errors):\n")
    print("| from the kill being issued to | median | worst |")
    print("|---|---|---|")
    print(line("the new leader's \"leading the replica group\" log line (elected)", elect))
    print(line("the new leader's \"served by this replica\" log line", serve))
    print(line("the first create to return after it (the client's stall)", stall))
    print(line("(the kill command itself: signal, wait for the exit)", kill_cmd))
    print(line("the longest gap between creates while the killed replica rejoins", rejoin).replace("| the longest", "| (not from the kill) the longest"))
    for l in open(failures).read().splitlines():
        k, node, why = l.split("\t", 2)
        print(f"\nAfter kill {k} of {nkills}, {node} did not start again ({why}); the kills ended there.")
EOF
# A replica that did not start again is a failure of the run, numbers or not.
[ ! -s "$WORK/restart-failures.tsv" ]
