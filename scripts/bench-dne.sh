#!/bin/bash
# Metadata served by one MDT against two, as separate MDS nodes would serve it: an MGS,
# an OSS and two `braid mds` processes (MDT 0 and MDT 1), each MDS held to CAP of a core
# by a cpu cgroup (a small MDS node of its own; the clients are not capped), and one
# `braid mount` over TCP. The peers' fsbench runs its mdtest-like create / stat /
# unlink phases with NPROCS processes, one directory each: once with every directory
# on MDT 0 ("1 MDT"), once with the directories alternating MDT 0 and MDT 1 ("2 MDTs",
# made with `braid mkdir -i`), alternated run by run. Medians and the 2/1 ratio are
# printed as a Markdown table.
#
#   scripts/bench-dne.sh [RUNS]        (root, cgroup v1 cpu controller or cgroup v2;
#                                      fsbench built by the peers' install.sh)
#
# Environment: BRAID (default target/release/braid), WORK (/var/tmp/peers/dne), FSBENCH
# (/var/tmp/peers/fsbench), NPROCS (4), MD_FILES (files per process, 1000 as seed 002's
# Table 3), CAP (cores per MDS, 0.05; "none" for uncapped).
set -uo pipefail
RUNS=${1:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
BRAID=${BRAID:-$HERE/target/release/braid}
WORK=${WORK:-/var/tmp/peers/dne}
FSBENCH=${FSBENCH:-/var/tmp/peers/fsbench}
NPROCS=${NPROCS:-4}
MD_FILES=${MD_FILES:-1000}
CAP=${CAP:-0.05}
[ -x "$BRAID" ] || { echo "no braid binary at $BRAID (cargo build --release)" >&2; exit 1; }
[ -x "$FSBENCH" ] || { echo "no fsbench at $FSBENCH (run the peers' install.sh)" >&2; exit 1; }
rm -rf "$WORK"; mkdir -p "$WORK/mnt"
OUT=$WORK/results.jsonl
: > "$OUT"
SECRET=$WORK/cluster.secret
"$BRAID" gen-secret "$SECRET" > /dev/null
PIDS=()
CGROUPS=()

start() {  # start NAME ARGS...: a server in the background, logged to WORK/NAME.log
    local name=$1; shift
    "$BRAID" "$@" --secret-file "$SECRET" --heartbeat-ms 200 > "$WORK/$name.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do grep -q "listening on" "$WORK/$name.log" && return 0; sleep 0.1; done
    echo "$name did not start:" >&2; tail "$WORK/$name.log" >&2; return 1
}
cap() {  # cap NAME PID: holds the process to CAP of a core
    [ "$CAP" = none ] && return 0
    local quota period=100000 d
    quota=$(python3 -c "print(int($CAP * 100000))")
    if [ -d /sys/fs/cgroup/cpu ]; then
        d=/sys/fs/cgroup/cpu/braid-bench-$1
        mkdir -p "$d" && echo $period > "$d/cpu.cfs_period_us" && echo "$quota" > "$d/cpu.cfs_quota_us"
    else
        d=/sys/fs/cgroup/braid-bench-$1
        mkdir -p "$d" && echo "$quota $period" > "$d/cpu.max"
    fi
    echo "$2" > "$d/cgroup.procs" || { echo "cannot cap $1" >&2; return 1; }
    CGROUPS+=("$d")
}
cleanup() {
    mountpoint -q "$WORK/mnt" && "$BRAID" umount "$WORK/mnt"
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    sleep 1
    for d in "${CGROUPS[@]}"; do rmdir "$d" 2>/dev/null; done
}
trap cleanup EXIT

start mgs mgs --listen 127.0.0.1:19930 --data "$WORK/mgs" || exit 1
start oss oss --listen 127.0.0.1:19931 --mgs 127.0.0.1:19930 --ost "$WORK/ost0" --ost "$WORK/ost1" || exit 1
start mds0 mds --listen 127.0.0.1:19932 --mgs 127.0.0.1:19930 --mdt "$WORK/mdt0" || exit 1
cap mds0 "${PIDS[-1]}" || exit 1
sleep 0.5  # MDT 0 registers first, so it gets index 0
start mds1 mds --listen 127.0.0.1:19933 --mgs 127.0.0.1:19930 --mdt "$WORK/mdt1" || exit 1
cap mds1 "${PIDS[-1]}" || exit 1
URL=braid://127.0.0.1:19930
for _ in $(seq 1 100); do
    [ "$("$BRAID" df "$URL/" --secret-file "$SECRET" 2>/dev/null | grep -c '\[MDT:')" = 2 ] && break
    sleep 0.2
done
"$BRAID" mount "$URL/" "$WORK/mnt" --secret-file "$SECRET" --log "$WORK/mount.log" || exit 1

one() {  # one LAYOUT: "1" (every directory on MDT 0) or "2" (alternating)
    local top=md$1 r
    "$BRAID" mkdir -p "$URL/$top" --secret-file "$SECRET" || return 1
    for r in $(seq 0 $((NPROCS - 1))); do
        local mdt=0
        [ "$1" = 2 ] && mdt=$((r % 2))
        "$BRAID" mkdir -i "$mdt" "$URL/$top/p$r" --secret-file "$SECRET" || return 1
    done
    local json
    json=$("$FSBENCH" md -d "$WORK/mnt/$top" -n "$NPROCS" -f "$MD_FILES") || return 1
    python3 -c 'import json,sys; d=json.loads(sys.argv[2]); d["mdts"]=sys.argv[1]; print(json.dumps(d))' \
        "$1" "$json" >> "$OUT"
}
for r in $(seq 1 "$RUNS"); do
    if (( r % 2 )); then one 1 && one 2; else one 2 && one 1; fi || exit 1
    echo "run $r of $RUNS done" >&2
done
echo "NPROCS=$NPROCS MD_FILES=$MD_FILES CAP=$CAP, $RUNS runs"
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    for k in ("create_ops", "stat_ops", "unlink_ops"):
        if isinstance(d.get(k), (int, float)):
            rows.setdefault(k, {}).setdefault(d["mdts"], []).append(d[k])
print("| phase (per s) | 1 MDT (median) | 2 MDTs (median) | 2 / 1 | runs |")
print("|---|---|---|---|---|")
for k, sides in rows.items():
    a, b = sides.get("1", []), sides.get("2", [])
    if a and b:
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"| {k.replace('_ops', 's')} | {ma:,.0f} | {mb:,.0f} | {mb / ma:.2f} | {len(a)}+{len(b)} |")
PY
