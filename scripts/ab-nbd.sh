#!/usr/bin/env bash
# An A/B of braid builds on the NBD export's rows: for each build in turn, a fresh
# `braid local --osts 4` and `braid nbd serve` of a 4-stripe 1 GiB file, `nbdcopy` of
# 1 GiB of random bytes in, the page cache dropped, `nbdcopy` out to null:, then fio's
# nbd engine on 4 KiB random reads and writes at 1, 8 and 32 in flight. The builds
# alternate within each round, so drift of the machine falls on all of them.
#
#   scripts/ab-nbd.sh ROUNDS LABEL=BINARY LABEL=BINARY...   (nbdcopy, fio, root)
#
# Prints one line per row and build ("LABEL ROW VALUE [LATENCY_US]"). Environment:
# WORK (default /var/tmp/peers/nbd-ab), SECONDS_EACH (fio run time, default 4).
set -u
ROUNDS=${1:?usage: scripts/ab-nbd.sh ROUNDS LABEL=BINARY...}
shift
[ $# -ge 1 ] || { echo "name at least one LABEL=BINARY" >&2; exit 1; }
WORK=${WORK:-/var/tmp/peers/nbd-ab}
SECONDS_EACH=${SECONDS_EACH:-4}
PORT=10895
NBD=127.0.0.1:10846
for tool in nbdcopy fio bc; do
    command -v $tool > /dev/null || { echo "$tool is needed (apt-get install -y libnbd-bin fio bc)" >&2; exit 1; }
done
mkdir -p "$WORK"
[ -s "$WORK/src.img" ] || head -c 1G /dev/urandom > "$WORK/src.img"

PIDS=()
down() { for (( i = ${#PIDS[@]} - 1; i >= 0; i-- )); do kill "${PIDS[$i]}" 2> /dev/null; wait "${PIDS[$i]}" 2> /dev/null; done; PIDS=(); }
trap down EXIT

mibs() { echo "scale=0; 1024 / ($2 - $1)" | bc; }
. "$(dirname "$0")/nbd-fio.sh"

stack() {  # stack LABEL BINARY
    local label=$1 bin=$2 w=$WORK/run t0 t1
    rm -rf "$w"; mkdir -p "$w/data"
    "$bin" local --data "$w/data" --osts 4 --listen 127.0.0.1:$PORT > "$w/local.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do grep -q "^MGS at" "$w/local.log" && break; sleep 0.2; done
    export BRAID_SECRET_FILE=$w/data/cluster.secret
    "$bin" setstripe -c 4 -S 1M "braid://127.0.0.1:$PORT/disk.img" || return 1
    "$bin" nbd serve "braid://127.0.0.1:$PORT/" --export disk=/disk.img,size=1g --listen $NBD > "$w/nbd.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do grep -q "^NBD server at" "$w/nbd.log" && break; sleep 0.2; done
    t0=$(date +%s.%N); nbdcopy "$WORK/src.img" "nbd://$NBD/disk" || return 1; t1=$(date +%s.%N)
    echo "$label copy-in-MiB/s $(mibs "$t0" "$t1")"
    sync; echo 3 > /proc/sys/vm/drop_caches
    t0=$(date +%s.%N); nbdcopy "nbd://$NBD/disk" null: || return 1; t1=$(date +%s.%N)
    echo "$label copy-out-MiB/s $(mibs "$t0" "$t1")"
    for rw in randread randwrite; do
        for d in 1 8 32; do echo "$label $rw-qd$d-IOPS $(fio_nbd "nbd://$NBD/disk" $rw $d 1g "$SECONDS_EACH")"; done
    done
    down
}

for _ in $(seq 1 "$ROUNDS"); do
    for b in "$@"; do stack "${b%%=*}" "${b#*=}" || { echo "${b%%=*}: the run failed (logs in $WORK/run)" >&2; exit 1; }; done
done
