#!/bin/bash
# An A/B of two braid binaries through separate `braid mount` processes over TCP (as a
# client on another node sees braid), on the metadata and small-file workloads of the
# peers' fsbench, alternated run by run many times so that the machine's drift falls
# on both sides alike. Medians and new/base ratios are printed as a Markdown table.
#
#   scripts/bench-ab.sh BASE_BINARY NEW_BINARY [RUNS]       (root; fsbench built by
#                                                           the peers' install.sh)
#
# Environment: WORK (default /var/tmp/peers/ab), FSBENCH (default /var/tmp/peers/fsbench),
# MD_FILES (2000), SMALL_FILES (10000), SETTLE (seconds after each drop_caches; 3),
# ROWS (all; md1: only creates, stats and unlinks of one process in a shared
# directory, the quickest row, for many runs; small: only the small-file rows),
# BASE_ARGS and NEW_ARGS (extra `braid local` arguments of each side, e.g.
# NEW_ARGS="--default-layout seed-table5" to compare layouts with one binary). The same
# binary twice is an A/A run: what the machine's noise alone makes of the ratios.
set -uo pipefail
BASE=${1:?base binary}
NEW=${2:?new binary}
RUNS=${3:-15}
WORK=${WORK:-/var/tmp/peers/ab}
FSBENCH=${FSBENCH:-/var/tmp/peers/fsbench}
MD_FILES=${MD_FILES:-2000}
SMALL_FILES=${SMALL_FILES:-10000}
SETTLE=${SETTLE:-3}
mkdir -p "$WORK"
OUT=$WORK/results.jsonl
: > "$OUT"

up() {  # up NAME BINARY PORT [LOCAL-ARGS...]
    local d=$WORK/$1 bin=$2 port=$3
    shift 3
    rm -rf "$d"; mkdir -p "$d/data" "$d/mnt"
    "$bin" local --data "$d/data" --osts 4 --listen 127.0.0.1:$port "$@" > "$d/local.log" 2>&1 &
    echo $! > "$d/pid"
    for _ in $(seq 1 100); do grep -q "^MGS at" "$d/local.log" && break; sleep 0.2; done
    "$bin" mount "braid://127.0.0.1:$port/" "$d/mnt" --secret-file "$d/data/cluster.secret" --log "$d/mount.log" \
        || { echo "braid mount ($1) failed" >&2; return 1; }
    for _ in $(seq 1 100); do mountpoint -q "$d/mnt" && return 0; sleep 0.2; done
    echo "braid ($1) did not mount" >&2; return 1
}
down() {  # down NAME BINARY
    local d=$WORK/$1
    mountpoint -q "$d/mnt" && "$2" umount "$d/mnt"
    [ -f "$d/pid" ] && kill "$(cat "$d/pid")" 2>/dev/null
    rm -f "$d/pid"
}
trap 'down base "$BASE"; down new "$NEW"' EXIT
# shellcheck disable=SC2086
up base "$BASE" 19900 ${BASE_ARGS:-} || exit 1
# shellcheck disable=SC2086
up new "$NEW" 19910 ${NEW_ARGS:-} || exit 1
settle() { sync; echo 3 > /proc/sys/vm/drop_caches; sleep "$SETTLE"; }
record() {  # record SIDE ROW JSON
    python3 -c 'import json,sys; d=json.loads(sys.argv[3]); d["side"]=sys.argv[1]; d["row"]=sys.argv[2]; print(json.dumps(d))' "$1" "$2" "$3" >> "$OUT"
}
one() {  # one SIDE: every workload once on that side's mount
    local dir=$WORK/$1/mnt/bench
    mkdir -p "$dir"
    if [ "${ROWS:-all}" = md1 ]; then
        record "$1" "md shared n1" "$("$FSBENCH" md -d "$dir/md" -n 1 -f "$MD_FILES" -s)"
        sleep 1
        return
    fi
    [ "${ROWS:-all}" = small ] || for np in 1 2; do
        for lay in shared unique; do
            flag=; [ $lay = shared ] && flag=-s
            record "$1" "md $lay n$np" "$("$FSBENCH" md -d "$dir/md" -n $np -f "$MD_FILES" $flag)"
        done
    done
    "$FSBENCH" small-clean -d "$dir/small" -n 1 -f "$SMALL_FILES" > /dev/null 2>&1
    settle
    record "$1" "small-write" "$("$FSBENCH" small-write -d "$dir/small" -n 1 -f "$SMALL_FILES" -b 4096)"
    settle
    record "$1" "small-read" "$("$FSBENCH" small-read -d "$dir/small" -n 1 -f "$SMALL_FILES" -b 4096)"
    "$FSBENCH" small-clean -d "$dir/small" -n 1 -f "$SMALL_FILES" > /dev/null 2>&1
}
for r in $(seq 1 "$RUNS"); do
    if (( r % 2 )); then one base; one new; else one new; one base; fi
    echo "run $r of $RUNS done" >&2
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    for k, v in d.items():
        if k in ("create_ops", "stat_ops", "unlink_ops", "files_per_s"):
            if isinstance(v, (int, float)):
                rows.setdefault((d["row"], k), {}).setdefault(d["side"], []).append(v)
print("| row | base (median) | new (median) | new / base | runs |")
print("|---|---|---|---|---|")
for (row, k), sides in sorted(rows.items()):
    b, n = sides.get("base", []), sides.get("new", [])
    if not b or not n:
        continue
    mb, mn = statistics.median(b), statistics.median(n)
    print(f"| {row}: {k} | {mb:,.0f} | {mn:,.0f} | {mn / mb:.3f} | {len(b)}+{len(n)} |")
PY
