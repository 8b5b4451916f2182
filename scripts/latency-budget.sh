#!/bin/bash
# What each system call of the everyday work costs on a mount, as the application
# waits for it (issue 39's first measurement): extract, cp -a, read all (`tar cf -`,
# the kernel's caches dropped first) and rm -rf of the benchmark tree (scripts/bench-everyday.sh makes it) in DIR, each under
# `strace -f -c -w`, printing the calls that took the most time with their count and
# microseconds per call.
#
#   scripts/latency-budget.sh DIR [TREE]     (DIR: an empty directory on the mount)
#
# TREE defaults to /var/tmp/peers/everyday/tree.tar. Needs strace.
set -euo pipefail
DIR=$1
TREE=${2:-/var/tmp/peers/everyday/tree.tar}
TOP=${TOP:-8}
[ -d "$DIR" ] || { echo "$DIR is not a directory" >&2; exit 1; }
[ -s "$TREE" ] || { echo "no tree at $TREE (run scripts/bench-everyday.sh once)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$DIR/a"
budget() {  # budget NAME COMMAND...
    local name=$1
    shift
    strace -f -c -w -o "$out/$name" "$@"
    echo "== $name"
    # strace -c: % time, seconds, usecs/call, calls, errors, syscall
    awk -v top="$TOP" '/^-/ { n++; next } n == 1 && NF >= 5 && $NF != "total" {
        printf "  %-18s %8d calls %8d us/call %8.3f s\n", $NF, $4, $3, $2; if (++k >= top) exit }' "$out/$name"
}
budget extract tar xf "$TREE" -C "$DIR/a"
budget cp-a cp -a "$DIR/a" "$DIR/b"
sync; echo 3 > /proc/sys/vm/drop_caches
budget read-all sh -c "tar cf - -C \"$DIR/b\" . | cat > /dev/null"
budget rm-rf rm -rf "$DIR/a" "$DIR/b"
