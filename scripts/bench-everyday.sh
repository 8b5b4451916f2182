#!/bin/bash
# Everyday file work (issue 39): extract a source tree, find, du, cp -a, read it all,
# rm -rf, as a user does it, on several file systems in one run, rounds alternated.
#
#   scripts/bench-everyday.sh [ROUNDS]      (root; peers installed with ../shared/peers/install.sh)
#
# The tree: the crates of this repository's Cargo.lock found in cargo's registry,
# in name order, until at least TREE_ENTRIES (6000) entries, packed once into
# $WORK/everyday/tree.tar (same lock, same tree on every machine of this kind).
# Caches are dropped (sync; drop_caches) before the extract, find and read steps.
# Systems (SYSTEMS, default "local bindfs braid-tcp moosefs"): local ext4 under $WORK,
# the peers' FUSE passthrough of it (bindfs.sh: one FUSE request per call, no network,
# the floor of any FUSE file system here), braid through a separate `braid mount`
# over TCP with the default layout (also braid-tcp-dom: seed 002's Table 5 as the
# default; braid-tcp-base: BRAID_BASE, a binary of an earlier commit), MooseFS.
# Output: one TSV line per step and round in $WORK/everyday/results.tsv, then the
# medians and ratios as a Markdown table (scripts/everyday-summary.py).
set -uo pipefail
ROUNDS=${1:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS:-$HERE/../shared/peers}
export WORK=${WORK:-/var/tmp/peers}
BRAID=${BRAID:-$HERE/target/release/braid}
BRAID_BASE=${BRAID_BASE:-}
SYSTEMS=${SYSTEMS:-"local bindfs braid-tcp moosefs"}
TREE_ENTRIES=${TREE_ENTRIES:-6000}
OUT=$WORK/everyday
TREE=$OUT/tree.tar
mkdir -p "$OUT" "$WORK/local"
# shellcheck source=lib-braid.sh
source "$HERE/scripts/lib-braid.sh"

if [ ! -s "$TREE" ]; then
    reg=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/ | head -1)
    crates=()
    n=0
    while read -r c; do
        [ -d "$reg/$c" ] || continue
        crates+=("$c")
        n=$((n + $(find "$reg/$c" | wc -l)))
        [ "$n" -ge "$TREE_ENTRIES" ] && break
    done < <(python3 - "$HERE/Cargo.lock" <<'EOF'
import sys, tomllib
lock = tomllib.load(open(sys.argv[1], "rb"))
for p in sorted(lock["package"], key=lambda p: (p["name"], p["version"])):
    if "source" in p:
        print(f'{p["name"]}-{p["version"]}')
EOF
)
    [ "$n" -ge "$TREE_ENTRIES" ] || { echo "only $n entries in the registry's crates" >&2; exit 1; }
    tar cf "$TREE" -C "$reg" "${crates[@]}"
    echo "tree: ${#crates[@]} crates, $n entries, $(du -m "$TREE" | cut -f1) MiB"
fi

wants() { [[ " $SYSTEMS " == *" $1 "* ]]; }
cleanup() {
    for s in braid-tcp braid-tcp-dom braid-tcp-base; do wants $s && braid_down $s; done
    wants bindfs && BASE=$WORK/bindfs bash "$PEERS/bindfs.sh" stop
    wants moosefs && bash "$PEERS/moosefs.sh" stop
}
trap cleanup EXIT

if wants braid-tcp; then braid_up braid-tcp 19600 tcp || exit 1; fi
if wants braid-tcp-dom; then braid_up braid-tcp-dom 19650 tcp "$BRAID" --default-layout seed-table5 || exit 1; fi
if wants braid-tcp-base; then braid_up braid-tcp-base 19800 tcp "$BRAID_BASE" || exit 1; fi
if wants bindfs; then BASE=$WORK/bindfs bash "$PEERS/bindfs.sh" start || exit 1; fi
if wants moosefs; then bash "$PEERS/moosefs.sh" start || exit 1; fi

declare -A DIRS=(
    [local]=$WORK/local/everyday
    [bindfs]=$WORK/bindfs/mnt/everyday
    [braid-tcp]=$WORK/braid-tcp/mnt/everyday
    [braid-tcp-dom]=$WORK/braid-tcp-dom/mnt/everyday
    [braid-tcp-base]=$WORK/braid-tcp-base/mnt/everyday
    [moosefs]=$WORK/mfs/mnt/everyday
)
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
step() {  # step SYSTEM ROUND NAME DROP COMMAND...
    local sys=$1 r=$2 name=$3 d=$4
    shift 4
    [ "$d" = drop ] && drop
    local t0 t1
    t0=$(date +%s.%N)
    "$@" || { echo "$sys round $r: $name failed" >&2; exit 1; }
    t1=$(date +%s.%N)
    printf '%s\t%s\t%s\t%.3f\n' "$sys" "$r" "$name" "$(echo "$t1 - $t0" | bc)" | tee -a "$OUT/results.tsv"
}
read_all() { tar cf - -C "$1" . | cat > /dev/null; }

: > "$OUT/results.tsv"
REVERSED=$(echo "$SYSTEMS" | tr ' ' '\n' | tac | tr '\n' ' ')
for r in $(seq 1 "$ROUNDS"); do
    order=$SYSTEMS
    if (( r % 2 == 0 )); then order=$REVERSED; fi
    for sys in $order; do
        d=${DIRS[$sys]}
        rm -rf "$d"
        mkdir -p "$d/a"
        sleep "${SETTLE:-3}"
        step "$sys" "$r" extract drop tar xf "$TREE" -C "$d/a"
        step "$sys" "$r" find drop sh -c "find '$d/a' > /dev/null"
        step "$sys" "$r" du keep sh -c "du -s '$d/a' > /dev/null"
        step "$sys" "$r" cp-a keep cp -a "$d/a" "$d/b"
        step "$sys" "$r" read-all drop read_all "$d/a"
        step "$sys" "$r" rm-rf keep rm -rf "$d/a" "$d/b"
        rmdir "$d"
    done
done
python3 "$HERE/scripts/everyday-summary.py" "$OUT/results.tsv" $SYSTEMS | tee "$OUT/summary.md"
