#!/bin/bash
# The issue-3 comparison: braid's mount, the local disk, MooseFS and GlusterFS measured
# in one run with the peers' own bench.sh (../shared/peers), systems alternated round
# by round, memory settled the same 15 s before every phase, medians over the rounds.
#
#   scripts/bench-peers.sh [ROUNDS]        (root; peers installed with install.sh)
#
# Results: $WORK/results/final/<system>/ (fio/fsbench JSON, one file per round), and
# the Markdown tables of summarize.py in $WORK/results/final/summary.md.
# Environment: PEERS (the peers' scripts; default ../shared/peers), WORK (default
# /var/tmp/peers), BRAID (the braid binary; default target/release/braid).
set -uo pipefail
ROUNDS=${1:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS:-$HERE/../shared/peers}
export WORK=${WORK:-/var/tmp/peers}
BRAID=${BRAID:-$HERE/target/release/braid}
BD=$WORK/braid              # braid local's data directory and mount point
OUT=$WORK/results/final
export MEM_SETTLE=${MEM_SETTLE:-15} REPS=1
mkdir -p "$OUT" "$WORK/local"

braid_up() {
    rm -rf "$BD/data"; mkdir -p "$BD/data" "$BD/mnt"
    "$BRAID" local --data "$BD/data" --osts 4 --listen 127.0.0.1:19500 --mount "$BD/mnt" \
        > "$BD/local.log" 2>&1 &
    echo $! > "$BD/pid"
    for _ in $(seq 1 100); do mountpoint -q "$BD/mnt" && return 0; sleep 0.2; done
    echo "braid did not mount" >&2; return 1
}
braid_down() {
    mountpoint -q "$BD/mnt" && umount "$BD/mnt"
    [ -f "$BD/pid" ] && kill "$(cat "$BD/pid")" 2>/dev/null
    sleep 2
}
cleanup() { braid_down; bash "$PEERS/moosefs.sh" stop; bash "$PEERS/gluster.sh" stop; }
trap cleanup EXIT

braid_up || exit 1
bash "$PEERS/moosefs.sh" start || exit 1
bash "$PEERS/gluster.sh" start || exit 1

declare -A DIRS=(
    [local]=$WORK/local/bench
    [braid]=$BD/mnt/bench
    [moosefs]=$WORK/mfs/mnt/bench
    [gluster]=$WORK/gluster/mnt/bench
)
for r in $(seq 1 "$ROUNDS"); do
    for sys in local braid moosefs gluster; do
        name=$sys-round$r
        rm -rf "$WORK/results/$name"
        bash "$PEERS/bench.sh" "$name" "${DIRS[$sys]}" "seq rand md small"
        mkdir -p "$OUT/$sys"
        for f in "$WORK/results/$name"/*-r1.json; do
            cp "$f" "$OUT/$sys/$(basename "${f%-r1.json}")-r$r.json"
        done
        cp "$WORK/results/$name/env.txt" "$OUT/$sys/env.txt"
    done
done
python3 "$PEERS/summarize.py" "$OUT" local braid moosefs gluster | tee "$OUT/summary.md"
