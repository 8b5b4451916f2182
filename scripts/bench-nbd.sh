#!/bin/bash
# Issue 17's targets, in one run on this machine: braid's NBD export of a 4-stripe
# file (`braid local --osts 4`, `braid nbd serve` as a separate client process) against
# nbdkit's file plugin and qemu-nbd, each serving a local file on the same disk. braid
# is measured twice: `braid` reaches its OSTs over TCP (as an export on another node
# would), `braid-sc` is an export with `--short-circuit` (the OSS is on its machine:
# it reads and writes the object files itself). Each export is SIZE long and written
# full first.
#   - sequential copies in and out with nbdcopy (a SIZE file of random bytes in, the
#     export out to null:);
#   - 4 KiB random reads and writes with fio's nbd engine at 1, 8 and 32 requests in
#     flight (IOPS, and mean completion latency at 1).
# The servers are measured one after the other, the order rotated run by run; medians
# and braid's ratio to the better of the two others are printed as Markdown. Then
# seed 004's figures: `braid bench sweep --preset nbd` on the three exports, into
# $WORK/sweep (report.md, SVGs, results.json).
#
#   scripts/bench-nbd.sh [RUNS]    (release build; nbdkit, qemu-utils, libnbd-bin, fio)
#
# Environment: BRAID (default target/release/braid), WORK (default /var/tmp/peers/nbd),
# SIZE (default 1g), SECONDS_EACH (fio run time, default 10), ONLY (sweep: the sweep
# alone, without the nbdcopy and fio runs).
set -uo pipefail
RUNS=${1:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
BRAID=${BRAID:-$HERE/target/release/braid}
WORK=${WORK:-/var/tmp/peers/nbd}
SIZE=${SIZE:-1g}
SECONDS_EACH=${SECONDS_EACH:-10}
PORT=19960
for tool in nbdkit qemu-nbd nbdcopy fio; do
    command -v $tool > /dev/null || { echo "$tool is needed (apt-get install -y nbdkit qemu-utils libnbd-bin fio)" >&2; exit 1; }
done
rm -rf "$WORK"; mkdir -p "$WORK/data"
OUT=$WORK/results.tsv
: > "$OUT"
PIDS=()
down() {
    # The servers before the cluster: braid's flushes its export at exit, which needs
    # the cluster up.
    for (( i = ${#PIDS[@]} - 1; i >= 0; i-- )); do kill "${PIDS[$i]}" 2> /dev/null; wait "${PIDS[$i]}" 2> /dev/null; done
}
trap down EXIT

"$BRAID" local --data "$WORK/data" --osts 4 --listen 127.0.0.1:$PORT > "$WORK/local.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do grep -q "^MGS at" "$WORK/local.log" && break; sleep 0.2; done
export BRAID_SECRET_FILE=$WORK/data/cluster.secret
"$BRAID" setstripe -c 4 -S 1M "braid://127.0.0.1:$PORT/disk.img" || exit 1
"$BRAID" nbd serve "braid://127.0.0.1:$PORT/" --export "disk=/disk.img,size=$SIZE" --listen 127.0.0.1:10831 \
    > "$WORK/braid-nbd.log" 2>&1 &
PIDS+=($!)
"$BRAID" setstripe -c 4 -S 1M "braid://127.0.0.1:$PORT/disk-sc.img" || exit 1
"$BRAID" nbd serve "braid://127.0.0.1:$PORT/" --export "disk=/disk-sc.img,size=$SIZE" --listen 127.0.0.1:10834 \
    --short-circuit > "$WORK/braid-sc-nbd.log" 2>&1 &
PIDS+=($!)
truncate -s "$SIZE" "$WORK/nbdkit.img" "$WORK/qemu.img"
nbdkit -f -i 127.0.0.1 -p 10832 file "$WORK/nbdkit.img" > "$WORK/nbdkit.log" 2>&1 &
PIDS+=($!)
qemu-nbd -f raw -b 127.0.0.1 -p 10833 -x disk -e 64 --persistent --cache=writeback "$WORK/qemu.img" \
    > "$WORK/qemu-nbd.log" 2>&1 &
PIDS+=($!)
sleep 2
declare -A URI=([braid]=nbd://127.0.0.1:10831/disk [braid-sc]=nbd://127.0.0.1:10834/disk [nbdkit]=nbd://127.0.0.1:10832
    [qemu-nbd]=nbd://127.0.0.1:10833/disk)
head -c "$(numfmt --from=iec "${SIZE^^}")" /dev/urandom > "$WORK/src.img"

rec() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$OUT"; }  # rec ROW SERVER VALUE
secs() { local t0 t1; t0=$(date +%s.%N); "$@" || return 1; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
mib() { echo "scale=1; $(numfmt --from=iec "${SIZE^^}") / 1048576 / $1" | bc; }
. "$HERE/scripts/nbd-fio.sh"
servers=(braid braid-sc nbdkit qemu-nbd)
[ "${ONLY:-}" = sweep ] && RUNS=0
for run in $(seq 1 "$RUNS"); do
    for i in 0 1 2 3; do
        s=${servers[$(( (i + run) % 4 ))]}
        u=${URI[$s]}
        # No dirty pages of the server measured before are left to write back meanwhile.
        sync
        rec "sequential copy in, MiB/s" "$s" "$(mib "$(secs nbdcopy "$WORK/src.img" "$u")")"
        sync; echo 3 > /proc/sys/vm/drop_caches
        rec "sequential copy out, MiB/s" "$s" "$(mib "$(secs nbdcopy "$u" null:)")"
        for rw in randread randwrite; do
            rec "4 KiB $rw, 1 in flight, mean latency us" "$s" "$(fio_nbd "$u" $rw 1 "$SIZE" "$SECONDS_EACH" | cut -d" " -f2)"
            for d in 8 32; do
                rec "4 KiB $rw, $d in flight, IOPS" "$s" "$(fio_nbd "$u" $rw $d "$SIZE" "$SECONDS_EACH" | cut -d" " -f1)"
            done
        done
    done
    echo "run $run of $RUNS done" >&2
done

python3 - "$OUT" <<'PY'
import collections, statistics, sys
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    row, server, value = line.rstrip("\n").split("\t")
    try:
        rows.setdefault(row, collections.defaultdict(list))[server].append(float(value))
    except ValueError:
        pass
print("| row | braid | braid-sc | nbdkit file | qemu-nbd | braid / best other | braid-sc / best other |")
print("|---|---|---|---|---|---|---|")
for row, s in rows.items():
    m = {k: statistics.median(v) for k, v in s.items()}
    nan = float("nan")
    b, sc, k, q = (m.get(x, nan) for x in ("braid", "braid-sc", "nbdkit", "qemu-nbd"))
    if "latency" in row:
        ratios = [f"{x / k:.2f} (of nbdkit's)" for x in (b, sc)]
    else:
        ratios = [f"{x / max(k, q):.2f}" for x in (b, sc)]
    print(f"| {row} | {b:.1f} | {sc:.1f} | {k:.1f} | {q:.1f} | {ratios[0]} | {ratios[1]} |")
PY

"$BRAID" bench sweep --preset nbd -q --drop-caches --size "$SIZE" --out "$WORK/sweep" \
    --target "braid=${URI[braid]}" --target "braid-sc=${URI[braid-sc]}" --target "nbdkit=${URI[nbdkit]}" \
    --target "qemu-nbd=${URI[qemu-nbd]}" ||
    echo "the sweep failed" >&2
