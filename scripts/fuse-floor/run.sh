#!/bin/bash
# The floor of a FUSE read on this machine, against the same reads of the local file:
# 4 KiB random O_DIRECT reads of 32 MiB after dropping the caches, and a reread of a
# 512 MiB file from memory, through `fuse-floor` serving reads itself (`direct`) and
# passing them through (`pt`). Run as root; needs fio.
#
#   scripts/fuse-floor/run.sh [RUNS]     (WORK: default /var/tmp/fuse-floor)
set -euo pipefail
RUNS=${1:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=${WORK:-/var/tmp/fuse-floor}
mkdir -p "$WORK/m"
CARGO_TARGET_DIR=$WORK/target cargo build --release --quiet --manifest-path "$HERE/Cargo.toml"
BIN=$WORK/target/release/fuse-floor
[ -f "$WORK/back" ] || dd if=/dev/urandom of="$WORK/back" bs=1M count=512 status=none
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; sleep 2; }
# fio_mib FILE RW BS SIZE [extra...]: MiB/s read.
fio_mib() {
    local file=$1 rw=$2 bs=$3 size=$4; shift 4
    fio --name=x --filename="$file" --rw="$rw" --bs="$bs" --size="$size" --ioengine=psync --numjobs=1 \
        --output-format=json "$@" 2> /dev/null |
        python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["read"]["bw"] / 1024))'
}
echo "| mode | run | 4 KiB random, local | through FUSE | ratio | reread from memory, local | through FUSE | ratio |"
echo "|---|---|---|---|---|---|---|---|"
for mode in direct pt; do
    for run in $(seq 1 "$RUNS"); do
        "$BIN" "$WORK/m" "$WORK/back" "$mode" & pid=$!
        for _ in $(seq 1 50); do mountpoint -q "$WORK/m" && break; sleep 0.1; done
        drop; rl=$(fio_mib "$WORK/back" randread 4k 32m --direct=1 --randseed="$run")
        drop; rf=$(fio_mib "$WORK/m/f" randread 4k 32m --direct=1 --randseed="$run")
        fio_mib "$WORK/back" read 1m 512m --invalidate=0 > /dev/null
        ml=$(fio_mib "$WORK/back" read 1m 512m --invalidate=0)
        fio_mib "$WORK/m/f" read 1m 512m --invalidate=0 > /dev/null
        mf=$(fio_mib "$WORK/m/f" read 1m 512m --invalidate=0)
        fusermount3 -u "$WORK/m"; wait "$pid" || true
        python3 -c "print('| $mode | $run | $rl | $rf | %.2f | $ml | $mf | %.2f |' % ($rf / $rl, $mf / $ml))"
    done
done
