#!/bin/bash
# The issue-3 comparison: braid's mount (in-process, and a separate `braid mount`
# process over TCP), the local disk, MooseFS and GlusterFS measured in one run with
# the peers' own bench.sh (../shared/peers), systems alternated round by round, memory
# settled the same 15 s before every phase, medians over the rounds.
#
#   scripts/bench-peers.sh [ROUNDS]        (root; peers installed with install.sh)
#
# Results: $WORK/results/final/<system>/ (fio/fsbench JSON, one file per round), and
# the Markdown tables of summarize.py in $WORK/results/final/summary.md.
# Environment: PEERS (the peers' scripts; default ../shared/peers), WORK (default
# /var/tmp/peers), BRAID (the braid binary; default target/release/braid), BRAID_BASE
# (a braid binary of an earlier commit, for an A/B run: systems braid-base and
# braid-tcp-base run it as braid and braid-tcp run $BRAID), SYSTEMS (default "local
# braid braid-tcp moosefs gluster"; also braid-tcp-dom and braid-tcp-pfl: braid-tcp
# with seed 002's Table 5 (Data-on-MDT) or Table 4 (PFL) as the file system default; braid-tcp-dom-base: Table 5
# with BRAID_BASE; braid-tcp-sc: the separate mount with -o short_circuit, reading and
# writing the object files of its OSS on this machine itself), WORKLOADS (default "seq rand md small"), RUN (the
# results' folder under $WORK/results; default final). Even rounds run the systems in
# the reverse order, so neither side of a pair always goes first.
set -uo pipefail
ROUNDS=${1:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS:-$HERE/../shared/peers}
export WORK=${WORK:-/var/tmp/peers}
BRAID=${BRAID:-$HERE/target/release/braid}
BRAID_BASE=${BRAID_BASE:-}
SYSTEMS=${SYSTEMS:-"local braid braid-tcp moosefs gluster"}
WORKLOADS=${WORKLOADS:-"seq rand md small"}
OUT=$WORK/results/${RUN:-final}
export MEM_SETTLE=${MEM_SETTLE:-15} REPS=1
mkdir -p "$OUT" "$WORK/local"

# shellcheck source=lib-braid.sh
source "$HERE/scripts/lib-braid.sh"
wants() { [[ " $SYSTEMS " == *" $1 "* ]]; }
cleanup() {
    if wants braid; then braid_down braid; fi
    if wants braid-tcp; then braid_down braid-tcp; fi
    if wants braid-base; then braid_down braid-base; fi
    if wants braid-tcp-base; then braid_down braid-tcp-base; fi
    if wants braid-tcp-dom; then braid_down braid-tcp-dom; fi
    if wants braid-tcp-dom-base; then braid_down braid-tcp-dom-base; fi
    if wants braid-tcp-pfl; then braid_down braid-tcp-pfl; fi
    if wants braid-tcp-sc; then braid_down braid-tcp-sc; fi
    if wants moosefs; then bash "$PEERS/moosefs.sh" stop; fi
    if wants gluster; then bash "$PEERS/gluster.sh" stop; fi
}
trap cleanup EXIT

if wants braid; then braid_up braid 19500 in-process || exit 1; fi
if wants braid-tcp; then braid_up braid-tcp 19600 tcp || exit 1; fi
if wants braid-base; then braid_up braid-base 19700 in-process "$BRAID_BASE" || exit 1; fi
if wants braid-tcp-base; then braid_up braid-tcp-base 19800 tcp "$BRAID_BASE" || exit 1; fi
if wants braid-tcp-dom; then braid_up braid-tcp-dom 19650 tcp "$BRAID" --default-layout seed-table5 || exit 1; fi
if wants braid-tcp-dom-base; then
    braid_up braid-tcp-dom-base 19850 tcp "$BRAID_BASE" --default-layout seed-table5 || exit 1
fi
if wants braid-tcp-pfl; then braid_up braid-tcp-pfl 19670 tcp "$BRAID" --default-layout seed-table4 || exit 1; fi
if wants braid-tcp-sc; then braid_up braid-tcp-sc 19690 tcp-sc || exit 1; fi
if wants moosefs; then bash "$PEERS/moosefs.sh" start || exit 1; fi
if wants gluster; then bash "$PEERS/gluster.sh" start || exit 1; fi

declare -A DIRS=(
    [local]=$WORK/local/bench
    [braid]=$WORK/braid/mnt/bench
    [braid-tcp]=$WORK/braid-tcp/mnt/bench
    [braid-base]=$WORK/braid-base/mnt/bench
    [braid-tcp-base]=$WORK/braid-tcp-base/mnt/bench
    [braid-tcp-dom]=$WORK/braid-tcp-dom/mnt/bench
    [braid-tcp-dom-base]=$WORK/braid-tcp-dom-base/mnt/bench
    [braid-tcp-pfl]=$WORK/braid-tcp-pfl/mnt/bench
    [braid-tcp-sc]=$WORK/braid-tcp-sc/mnt/bench
    [moosefs]=$WORK/mfs/mnt/bench
    [gluster]=$WORK/gluster/mnt/bench
)
REVERSED=$(echo "$SYSTEMS" | tr ' ' '\n' | tac | tr '\n' ' ')
for r in $(seq 1 "$ROUNDS"); do
    order=$SYSTEMS
    if (( r % 2 == 0 )); then order=$REVERSED; fi
    for sys in $order; do
        name=$sys-round$r
        rm -rf "$WORK/results/$name"
        bash "$PEERS/bench.sh" "$name" "${DIRS[$sys]}" "$WORKLOADS"
        mkdir -p "$OUT/$sys"
        for f in "$WORK/results/$name"/*-r1.json; do
            cp "$f" "$OUT/$sys/$(basename "${f%-r1.json}")-r$r.json"
        done
        cp "$WORK/results/$name/env.txt" "$OUT/$sys/env.txt"
    done
done
python3 "$PEERS/summarize.py" "$OUT" $SYSTEMS | tee "$OUT/summary.md"
