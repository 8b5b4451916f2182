#!/bin/bash
# Issue 16's targets, measured as a client on another node sees braid: one
# `braid local --osts 4` cluster and three separate `braid mount` processes over TCP:
# tracing off, tracing on (`-o trace,trace_dir=...`: a record into the shared-memory
# ring per operation, a collector process storing them), and a synchronous logger
# (`-o trace_sync=FILE`: each record formatted and written to a file before the
# operation returns, seed 001's contrast). The same workloads on each, the mounts'
# order rotated run by run:
#   - IOR file per process, O_DIRECT (every transfer is one client operation), 4 KiB
#     and 1 MiB transfers, write then read (`braid bench ior`);
#   - mdtest, empty files created then removed (`braid bench mdtest -F`);
#   - the same IOR through the native client (`-a native`), tracing off and on
#     (`BRAID_CLIENT_OPTIONS=trace,trace_dir=...`).
# Then seed 001's figures 4 and 5 (`braid bench sweep --preset tracer`, 4 KiB to 4 MiB)
# on the three mounts. Medians and the ratios to tracing off are printed as Markdown,
# with the records each traced run wrote and dropped.
#
#   scripts/bench-tracer.sh [RUNS]          (root; release build in target/release)
#
# Environment: BRAID (default target/release/braid), WORK (default
# /var/tmp/peers/tracer), SMALL (bytes per task at 4 KiB transfers, 128m), LARGE (at
# 1 MiB, 1g), FILES (mdtest files, 5000), SWEEP_SIZE (sweep bytes per point, 64m;
# "none" skips the sweep).
set -uo pipefail
RUNS=${1:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
BRAID=${BRAID:-$HERE/target/release/braid}
WORK=${WORK:-/var/tmp/peers/tracer}
SMALL=${SMALL:-128m}
LARGE=${LARGE:-1g}
FILES=${FILES:-5000}
SWEEP_SIZE=${SWEEP_SIZE:-64m}
PORT=19965
[ -x "$BRAID" ] || { echo "no braid binary at $BRAID (cargo build --release)" >&2; exit 1; }
rm -rf "$WORK"; mkdir -p "$WORK/data" "$WORK/off" "$WORK/on" "$WORK/sync" "$WORK/trace" "$WORK/native-trace"
OUT=$WORK/results.jsonl
: > "$OUT"

"$BRAID" local --data "$WORK/data" --osts 4 --listen 127.0.0.1:$PORT > "$WORK/local.log" 2>&1 &
echo $! > "$WORK/pid"
down() {
    for m in off on sync; do mountpoint -q "$WORK/$m" && "$BRAID" umount "$WORK/$m"; done
    [ -f "$WORK/pid" ] && kill "$(cat "$WORK/pid")" 2>/dev/null
    rm -f "$WORK/pid"
}
trap down EXIT
for _ in $(seq 1 100); do grep -q "^MGS at" "$WORK/local.log" && break; sleep 0.2; done
export BRAID_SECRET_FILE=$WORK/data/cluster.secret
mount_one() {  # mount_one NAME OPTIONS
    local o=()
    [ -n "$2" ] && o=(-o "$2")
    "$BRAID" mount "braid://127.0.0.1:$PORT/" "$WORK/$1" --log "$WORK/mount-$1.log" "${o[@]}" > /dev/null || exit 1
    for _ in $(seq 1 100); do mountpoint -q "$WORK/$1" && return 0; sleep 0.2; done
    echo "mount $1 did not come up" >&2; exit 1
}
mount_one off ""
mount_one on "trace,trace_dir=$WORK/trace"
mount_one sync "trace_sync=$WORK/sync.log"

record() {  # record SYSTEM KIND JSON
    python3 -c 'import json,sys; print(json.dumps({"system": sys.argv[1], "kind": sys.argv[2], "report": json.loads(sys.argv[3])}))' \
        "$1" "$2" "$3" >> "$OUT"
}
one() {  # one MOUNT
    local d=$WORK/$1/bench
    mkdir -p "$d"
    record "$1" ior-4k "$("$BRAID" bench ior -F -w -r --direct -t 4k -b "$SMALL" -o "$d/small" --json -q)"
    record "$1" ior-1m "$("$BRAID" bench ior -F -w -r --direct -t 1m -b "$LARGE" -o "$d/large" --json -q)"
    record "$1" mdtest "$("$BRAID" bench mdtest -F -C -n "$FILES" -d "$d/md" --json -q)"
    "$BRAID" bench mdtest -F -r -n "$FILES" -d "$d/md" -q > /dev/null
    rm -rf "$d"
}
native() {  # native NAME [BRAID_CLIENT_OPTIONS]
    local url="braid://127.0.0.1:$PORT/native-$1"
    for t in 4k 1m; do
        local b=$SMALL; [ "$t" = 1m ] && b=$LARGE
        record "native-$1" "ior-$t" "$(BRAID_CLIENT_OPTIONS=${2:-} "$BRAID" bench ior -a native -F -w -r -t "$t" -b "$b" -o "$url-$t" --json -q)"
    done
}
mounts=(off on sync)
for r in $(seq 1 "$RUNS"); do
    for i in 0 1 2; do one "${mounts[$(( (i + r) % 3 ))]}"; done
    if (( r % 2 )); then native off; native on "trace,trace_dir=$WORK/native-trace"; else native on "trace,trace_dir=$WORK/native-trace"; native off; fi
    echo "run $r of $RUNS done" >&2
done
"$BRAID" trace status "$WORK/on" | tee "$WORK/trace-status.txt"
stored=$("$BRAID" trace export --csv --dir "$WORK/trace" 2> /dev/null | tail -n +2 | wc -l)
native_stored=$("$BRAID" trace export --csv --dir "$WORK/native-trace" 2> /dev/null | tail -n +2 | wc -l)
echo "records stored: mount $stored, native $native_stored; synchronous log lines: $(wc -l < "$WORK/sync.log")"

if [ "$SWEEP_SIZE" != none ]; then
    "$BRAID" bench sweep --preset tracer --quiet --size "$SWEEP_SIZE" --out "$WORK/sweep" \
        --target "tracing-off=$WORK/off" --target "tracing-on=$WORK/on" --target "sync-logger=$WORK/sync" \
        > "$WORK/sweep.log" 2>&1 || echo "sweep failed: see $WORK/sweep.log" >&2
fi

python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    for row in d["report"]["summary"]:
        if d["kind"].startswith("ior"):
            key, value = f"{d['kind'][4:]} transfers, {row['operation']}, MiB/s", row["bandwidth_mib_s"]["mean"]
        elif row["operation"] == "File creation":
            key, value = "mdtest file creates per s", row["ops_per_s"]["mean"]
        else:
            continue
        rows.setdefault(key, {}).setdefault(d["system"], []).append(value)
med = lambda v: statistics.median(v) if v else float("nan")
print("| row | off | on | sync logger | on / off | sync / off | native off | native on | native on / off |")
print("|---|---|---|---|---|---|---|---|---|")
for key, s in rows.items():
    off, on, sy = med(s.get("off", [])), med(s.get("on", [])), med(s.get("sync", []))
    noff, non = med(s.get("native-off", [])), med(s.get("native-on", []))
    print(f"| {key} | {off:.1f} | {on:.1f} | {sy:.1f} | {on / off:.3f} | {sy / off:.3f} | {noff:.1f} | {non:.1f} | {non / noff:.3f} |")
PY
