#!/bin/bash
# Issue 15's targets, measured as a client on another node sees braid: one
# `braid local --osts 4` cluster and two separate `braid mount` processes over TCP,
# both with the OSTs behind a client-side network path (`-o ost_limit=200M,
# ost_latency=1`: 200 MB/s and at least 1 ms per OST transfer, a 1-2 Gb/s network to
# disks, as seed 003's testbed; on this one-disk machine the OSTs would otherwise be
# the cache's own disk a loopback hop away), one of them with the SSD cache
# (`-o cache_dir=...`, and `passthrough` unless PASSTHROUGH=0: files it holds whole are
# read by the kernel from their cache files). In one run:
#   1. cached reread, page cache dropped before it, against the cache directory's own
#      cold read (fio after dropping caches): sequential 1 MiB (O_DIRECT, and buffered)
#      and 4 KiB random (O_DIRECT);
#   2. first write and first read with the cache on against off (fio, O_DIRECT), the
#      two mounts alternated run by run;
#   3. the first reread after a remount of the cached mount: its hit rate
#      (`braid cache status`);
#   4. a reread of a file that fits in memory through each mount without O_DIRECT (the
#      plain mount: the page cache kept across opens; the cached one: its reads pass
#      through to the cache file) against the same reread of a local file;
#   5. seed 003's figures 3 and 4: `braid bench sweep --preset cache` on both mounts and
#      on the cache's directory (SVGs and report in $WORK/sweep).
# Prints Markdown tables of medians and ratios.
#
#   scripts/bench-cache.sh [RUNS]          (root; fio; release build in target/release)
#
# Environment: BRAID (default target/release/braid), WORK (default
# /var/tmp/peers/cache), LIMIT (ost_limit, default 200M), LATENCY (ost_latency in ms,
# default 1), SIZE (fio file, default 1g), RAND_SIZE (4 KiB random reads, default
# 32m), SWEEP_SIZE (default 64m: its 4 KiB random phases cross the slow path),
# SETTLE (seconds after each cache drop, default 5), PASSTHROUGH (default 1).
set -uo pipefail
RUNS=${1:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
BRAID=${BRAID:-$HERE/target/release/braid}
WORK=${WORK:-/var/tmp/peers/cache}
LIMIT=${LIMIT:-200M}
LATENCY=${LATENCY:-1}
SIZE=${SIZE:-1g}
RAND_SIZE=${RAND_SIZE:-32m}
SWEEP_SIZE=${SWEEP_SIZE:-64m}
SETTLE=${SETTLE:-5}
PASSTHROUGH=${PASSTHROUGH:-1}
PORT=19970
command -v fio > /dev/null || { echo "fio is needed (apt-get install -y fio)" >&2; exit 1; }
rm -rf "$WORK"; mkdir -p "$WORK/data" "$WORK/plain" "$WORK/cached" "$WORK/ssd" "$WORK/ssd-bench" "$WORK/local"
OUT=$WORK/results.tsv
: > "$OUT"

"$BRAID" local --data "$WORK/data" --osts 4 --listen 127.0.0.1:$PORT > "$WORK/local.log" 2>&1 &
echo $! > "$WORK/pid"
down() {
    for m in plain cached; do mountpoint -q "$WORK/$m" && "$BRAID" umount "$WORK/$m"; done
    [ -f "$WORK/pid" ] && kill "$(cat "$WORK/pid")" 2>/dev/null
    rm -f "$WORK/pid"
}
trap down EXIT
for _ in $(seq 1 100); do grep -q "^MGS at" "$WORK/local.log" && break; sleep 0.2; done
mount_one() {  # mount_one NAME OPTIONS
    "$BRAID" mount "braid://127.0.0.1:$PORT/" "$WORK/$1" --secret-file "$WORK/data/cluster.secret" \
        --log "$WORK/mount-$1.log" -o "$2" > /dev/null || exit 1
    for _ in $(seq 1 100); do mountpoint -q "$WORK/$1" && return 0; sleep 0.2; done
    echo "mount $1 did not come up" >&2; exit 1
}
CACHED_OPTS="ost_limit=$LIMIT,ost_latency=$LATENCY,cache_dir=$WORK/ssd,cache_size=8G"
[ "$PASSTHROUGH" = 1 ] && CACHED_OPTS="$CACHED_OPTS,passthrough"
mount_one plain "ost_limit=$LIMIT,ost_latency=$LATENCY"
mount_one cached "$CACHED_OPTS"
export BRAID_SECRET_FILE=$WORK/data/cluster.secret

# After a drop, memory freed a moment ago refills slowly on this VM (see the peers'
# bench.sh, MEM_SETTLE): every phase waits the same SETTLE seconds.
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; sleep "$SETTLE"; }
# fio_bw NAME RW BS SIZE FILE [extra...]: prints MiB/s (reads or writes) of one job.
fio_bw() {
    local name=$1 rw=$2 bs=$3 size=$4 file=$5; shift 5
    fio --name="$name" --filename="$file" --rw="$rw" --bs="$bs" --size="$size" --ioengine=psync \
        --numjobs=1 --group_reporting --output-format=json "$@" 2> /dev/null |
        python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print("%.2f" % ((j["read"]["bw"] + j["write"]["bw"]) / 1024))'
}
rec() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$OUT"; }  # rec ROW SYSTEM VALUE

for run in $(seq 1 "$RUNS"); do
    order="plain cached"; [ $((run % 2)) -eq 0 ] && order="cached plain"
    for m in $order; do
        f=$WORK/$m/fio-$run
        g=$WORK/$m/rand-$run
        drop; rec "first write, 1 MiB, O_DIRECT (MiB/s)" "$m" "$(fio_bw w write 1m "$SIZE" "$f" --direct=1)"
        drop; rec "first read, 1 MiB, O_DIRECT (MiB/s)" "$m" "$(fio_bw r read 1m "$SIZE" "$f" --direct=1)"
        # A file only written so far (writes fill nothing), read at random.
        fio_bw w write 1m "$RAND_SIZE" "$g" --direct=1 > /dev/null
        drop; rec "random 4 KiB first read (MiB/s)" "$m" "$(fio_bw rnd randread 4k "$RAND_SIZE" "$g" --direct=1 --randseed=$run)"
        if [ "$m" = cached ]; then
            # Let the fills land, then read again from the SSD cache, page cache dropped.
            sleep 5
            drop; rec "reread, 1 MiB, O_DIRECT (MiB/s)" "$m" "$(fio_bw rr read 1m "$SIZE" "$f" --direct=1)"
            drop; rec "reread, 1 MiB, buffered, cold (MiB/s)" "$m" "$(fio_bw rb read 1m "$SIZE" "$f")"
            drop; rec "random 4 KiB reread (MiB/s)" "$m" "$(fio_bw rnd2 randread 4k "$RAND_SIZE" "$g" --direct=1 --randseed=$run)"
        fi
        rm -f "$f" "$g"
    done
    # The cache directory's own disk, cold.
    f=$WORK/ssd-bench/fio-$run
    fio_bw w write 1m "$SIZE" "$f" --direct=1 > /dev/null
    drop; rec "reread, 1 MiB, O_DIRECT (MiB/s)" ssd "$(fio_bw r read 1m "$SIZE" "$f" --direct=1)"
    drop; rec "reread, 1 MiB, buffered, cold (MiB/s)" ssd "$(fio_bw rb read 1m "$SIZE" "$f")"
    drop; rec "random 4 KiB reread (MiB/s)" ssd "$(fio_bw rnd randread 4k "$RAND_SIZE" "$f" --direct=1 --randseed=$run)"
    rm -f "$f"
    # A file that fits in memory, reread from memory: the two mounts and a local file,
    # each read twice before (the cached mount's first read fills its cache, and once
    # the fills have landed the second passes through to the cache file, from disk).
    for m in plain cached local; do
        f=$WORK/$m/mem-$run
        fio_bw w write 1m 512m "$f" > /dev/null
        fio_bw r read 1m 512m "$f" --invalidate=0 > /dev/null
        sleep 5
        fio_bw r read 1m 512m "$f" --invalidate=0 > /dev/null
        rec "reread from memory, 512 MiB (MiB/s)" "$m" "$(fio_bw rr read 1m 512m "$f" --invalidate=0)"
        rm -f "$f"
    done
done

# After a remount: the first reread of a file read before comes from the cache.
f=$WORK/cached/remount
fio_bw w write 1m "$SIZE" "$f" --direct=1 > /dev/null
fio_bw r read 1m "$SIZE" "$f" --direct=1 > /dev/null
sleep 5
"$BRAID" umount "$WORK/cached"
mount_one cached "$CACHED_OPTS"
drop
rec "reread after a remount, 1 MiB, O_DIRECT (MiB/s)" cached "$(fio_bw rr read 1m "$SIZE" "$f" --direct=1)"
"$BRAID" cache status "$WORK/cached" | tee "$WORK/remount-status.txt"
rec "hit rate after a remount (%)" cached "$(awk '/^hit_rate:/ {sub("%", "", $2); print $2}' "$WORK/remount-status.txt")"
rm -f "$f"

# Seed 003's figures.
"$BRAID" bench sweep --preset cache --drop-caches --quiet --size "$SWEEP_SIZE" --out "$WORK/sweep" \
    --target "braid=$WORK/plain" --target "braid-ssd-cache=$WORK/cached" --target "cache-disk=$WORK/ssd-bench" \
    > "$WORK/sweep.log" 2>&1 || echo "sweep failed: see $WORK/sweep.log" >&2

python3 - "$OUT" <<'EOF'
import statistics, sys, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    row, system, value = line.rstrip("\n").split("\t")
    try:
        rows.setdefault(row, collections.defaultdict(list))[system].append(float(value))
    except ValueError:
        pass
systems = ["plain", "cached", "ssd", "local"]
print("| row | " + " | ".join(systems) + " | ratio |")
print("|---|" + "---|" * (len(systems) + 1))
for row, by in rows.items():
    med = {s: statistics.median(v) for s, v in by.items()}
    cells = ["%.1f" % med[s] if s in med else "" for s in systems]
    ratio = ""
    if "cached" in med and "local" in med:
        ratio = "cached/local %.2f, plain/local %.2f" % (med["cached"] / med["local"], med.get("plain", 0) / med["local"])
    elif "cached" in med and "ssd" in med:
        ratio = "cached/ssd %.2f" % (med["cached"] / med["ssd"])
    elif "cached" in med and "plain" in med:
        ratio = "cached/plain %.3f" % (med["cached"] / med["plain"])
    elif "plain" in med and "local" in med:
        ratio = "mount/local %.2f" % (med["plain"] / med["local"])
    print("| %s | %s | %s |" % (row, " | ".join(cells), ratio))
EOF
