#!/bin/bash
# Metadata served by one MDT against several, as separate MDS nodes would serve it: an
# MGS, an OSS and MDTS `braid mds` processes (one MDT each), each MDS held to CAP of a
# core by a cpu cgroup (a small MDS node of its own; the clients are not capped), and
# one `braid mount` over TCP. The peers' fsbench runs its mdtest-like create / stat /
# unlink phases with NPROCS processes, in six layouts alternated run by run:
#   1, 2, 4      one directory per process, all on MDT 0 / spread round-robin over the
#                first 2 / 4 MDTs (`braid mkdir -i`)
#   1s, 2s, 4s   one directory shared by all processes, on MDT 0 / striped over 2 / 4
#                MDTs (`braid mkdir -c`)
# (layouts needing more MDTs than MDTS are left out). Medians and the ratios to one MDT
# are printed as a Markdown table.
#
#   scripts/bench-dne.sh [RUNS]        (root, cgroup v1 cpu controller or cgroup v2;
#                                      fsbench built by the peers' install.sh)
#
# Environment: BRAID (default target/release/braid), WORK (/var/tmp/peers/dne), FSBENCH
# (/var/tmp/peers/fsbench), NPROCS (4), MD_FILES (files per process, 1000 as seed 002's
# Table 3), CAP (cores per MDS, 0.05; "none" for uncapped), MDTS (4).
set -uo pipefail
RUNS=${1:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
BRAID=${BRAID:-$HERE/target/release/braid}
WORK=${WORK:-/var/tmp/peers/dne}
FSBENCH=${FSBENCH:-/var/tmp/peers/fsbench}
NPROCS=${NPROCS:-4}
MD_FILES=${MD_FILES:-1000}
CAP=${CAP:-0.05}
MDTS=${MDTS:-4}
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
for k in $(seq 0 $((MDTS - 1))); do
    start "mds$k" mds --listen "127.0.0.1:$((19932 + k))" --mgs 127.0.0.1:19930 --mdt "$WORK/mdt$k" || exit 1
    cap "mds$k" "${PIDS[-1]}" || exit 1
    sleep 0.5  # one at a time: MDT k registers as index k
done
URL=braid://127.0.0.1:19930
for _ in $(seq 1 100); do
    [ "$("$BRAID" df "$URL/" --secret-file "$SECRET" 2>/dev/null | grep -c '\[MDT:')" = "$MDTS" ] && break
    sleep 0.2
done
"$BRAID" mount "$URL/" "$WORK/mnt" --secret-file "$SECRET" --log "$WORK/mount.log" || exit 1

one() {  # one LAYOUT: 1, 2, 4 (a directory per process over that many MDTs) or 1s, 2s, 4s (shared)
    local top=md$1 n=${1%s} r json shared=""
    "$BRAID" mkdir -i 0 "$URL/$top" --secret-file "$SECRET" || return 1
    if [ "$n" != "$1" ]; then
        shared=-s
        "$BRAID" mkdir -c "$n" -i 0 "$URL/$top/shared" --secret-file "$SECRET" || return 1
    else
        for r in $(seq 0 $((NPROCS - 1))); do
            "$BRAID" mkdir -i $((r % n)) "$URL/$top/p$r" --secret-file "$SECRET" || return 1
        done
    fi
    json=$("$FSBENCH" md -d "$WORK/mnt/$top" -n "$NPROCS" -f "$MD_FILES" $shared) || return 1
    "$BRAID" rm -r "$URL/$top" --secret-file "$SECRET" || return 1
    python3 -c 'import json,sys; d=json.loads(sys.argv[2]); d["layout"]=sys.argv[1]; print(json.dumps(d))' \
        "$1" "$json" >> "$OUT"
}
LAYOUTS=()
for n in 1 2 4; do (( n <= MDTS )) && LAYOUTS+=("$n" "${n}s"); done
for r in $(seq 1 "$RUNS"); do
    order=("${LAYOUTS[@]}")
    (( r % 2 )) || order=($(printf '%s\n' "${LAYOUTS[@]}" | tac))
    for l in "${order[@]}"; do one "$l" || exit 1; done
    echo "run $r of $RUNS done" >&2
done
echo "NPROCS=$NPROCS MD_FILES=$MD_FILES CAP=$CAP MDTS=$MDTS, $RUNS runs"
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    for k in ("create_ops", "stat_ops", "unlink_ops"):
        if isinstance(d.get(k), (int, float)):
            rows.setdefault(k, {}).setdefault(d["layout"], []).append(d[k])
for shared, title in (("", "a directory per process"), ("s", "one shared directory")):
    layouts = [l for l in ("1", "2", "4") if any(l + shared in s for s in rows.values())]
    head = " | ".join(f"{l} MDT{'s' if l != '1' else ''}" for l in layouts)
    ratios = " | ".join(f"{l} / 1" for l in layouts[1:])
    print(f"\n{title}:\n\n| phase (per s, median) | {head} | {ratios} |")
    print("|---" * (1 + len(layouts) + len(layouts) - 1) + "|")
    for k, sides in rows.items():
        med = [statistics.median(sides[l + shared]) for l in layouts]
        cells = " | ".join(f"{m:,.0f}" for m in med)
        rs = " | ".join(f"{m / med[0]:.2f}" for m in med[1:])
        print(f"| {k.replace('_ops', 's')} | {cells} | {rs} |")
PY
