#!/bin/bash
# Issue 13's PFL targets, measured as a client on another node sees braid: one
# `braid local --osts 4` cluster and a separate `braid mount` process over TCP, two
# directories side by side, one with a plain 4-stripe layout (`-c 4 -S 1M`) and one
# with seed 002's Table 4 (`--template seed-table4`), the same workloads on each,
# alternated run by run (the order reversed every other run):
#   - one 4 GiB file written then read with 1 MiB transfers (`braid bench ior`),
#     caches dropped between;
#   - 10,000 empty files created, then removed (`braid bench mdtest -F -C` / `-r`).
# Medians and Table 4 / plain ratios are printed as a Markdown table.
#
#   scripts/bench-pfl.sh [RUNS]            (root; release build in target/release)
#
# Environment: BRAID (default target/release/braid), WORK (default
# /var/tmp/peers/pfl), FILE_SIZE (4g), FILES (10000), ONLY (ior or mdtest: one of the
# two workloads, e.g. for more runs of the quicker one).
set -uo pipefail
RUNS=${1:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
BRAID=${BRAID:-$HERE/target/release/braid}
WORK=${WORK:-/var/tmp/peers/pfl}
FILE_SIZE=${FILE_SIZE:-4g}
FILES=${FILES:-10000}
PORT=19950
rm -rf "$WORK"; mkdir -p "$WORK/data" "$WORK/mnt"
OUT=$WORK/results.jsonl
: > "$OUT"

"$BRAID" local --data "$WORK/data" --osts 4 --listen 127.0.0.1:$PORT > "$WORK/local.log" 2>&1 &
echo $! > "$WORK/pid"
down() {
    mountpoint -q "$WORK/mnt" && "$BRAID" umount "$WORK/mnt"
    [ -f "$WORK/pid" ] && kill "$(cat "$WORK/pid")" 2>/dev/null
    rm -f "$WORK/pid"
}
trap down EXIT
for _ in $(seq 1 100); do grep -q "^MGS at" "$WORK/local.log" && break; sleep 0.2; done
"$BRAID" mount "braid://127.0.0.1:$PORT/" "$WORK/mnt" --secret-file "$WORK/data/cluster.secret" \
    --log "$WORK/mount.log" || exit 1
for _ in $(seq 1 100); do mountpoint -q "$WORK/mnt" && break; sleep 0.2; done
export BRAID_SECRET_FILE=$WORK/data/cluster.secret
mkdir -p "$WORK/mnt/plain" "$WORK/mnt/table4"
"$BRAID" setstripe -c 4 -S 1M "$WORK/mnt/plain" || exit 1
"$BRAID" setstripe --template seed-table4 "$WORK/mnt/table4" || exit 1

record() {  # record LAYOUT KIND JSON
    python3 -c 'import json,sys; d=json.loads(sys.argv[3]); print(json.dumps({"layout": sys.argv[1], "kind": sys.argv[2], "report": d}))' \
        "$1" "$2" "$3" >> "$OUT"
}
one() {  # one LAYOUT
    local d=$WORK/mnt/$1
    if [ "${ONLY:-ior}" = ior ]; then
        record "$1" ior "$("$BRAID" bench ior -w -r -t 1m -b "$FILE_SIZE" -o "$d/big" --drop-caches --json -q)"
    fi
    if [ "${ONLY:-mdtest}" = mdtest ]; then
        record "$1" mdtest "$("$BRAID" bench mdtest -F -C -n "$FILES" -d "$d/md" --json -q)"
        "$BRAID" bench mdtest -F -r -n "$FILES" -d "$d/md" -q > /dev/null
    fi
}
for r in $(seq 1 "$RUNS"); do
    if (( r % 2 )); then one plain; one table4; else one table4; one plain; fi
    echo "run $r of $RUNS done" >&2
done
"$BRAID" getstripe "$WORK/mnt/table4" -d | head -3
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    for row in d["report"]["summary"]:
        if d["kind"] == "ior":
            key, value = f"4 GiB file {row['operation']}, MiB/s", row["bandwidth_mib_s"]["mean"]
        elif row["operation"] == "File creation":
            key, value = "empty files created, per s", row["ops_per_s"]["mean"]
        else:
            continue
        rows.setdefault(key, {}).setdefault(d["layout"], []).append(value)
print("| row | plain -c 4 (median) | Table 4 (median) | Table 4 / plain | runs |")
print("|---|---|---|---|---|")
for key, sides in rows.items():
    p, t = sides.get("plain", []), sides.get("table4", [])
    if p and t:
        mp, mt = statistics.median(p), statistics.median(t)
        print(f"| {key} | {mp:,.0f} | {mt:,.0f} | {mt / mp:.3f} | {len(p)}+{len(t)} |")
PY
