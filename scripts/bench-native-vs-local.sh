#!/usr/bin/env bash
# Native client vs local disk: 2 GiB through the native client (1 file, 4 stripes of
# 1 MiB) vs the local disk the OSTs live on, with braid bench ior; caches dropped and
# memory settled before every phase, systems alternated, 3 repetitions.
# Usage: scripts/bench-native-vs-local.sh BRAID_BIN braid://HOST:PORT LOCAL_DIR OUT_DIR
# (needs root for drop_caches; the cluster must have a directory /s4 striped -c 4 -S 1M,
# and BRAID_SECRET_FILE set). SETTLE (default 15) is the wait after each drop_caches.
set -euo pipefail
R=$1; U=$2; LOCAL=$3; OUT=$4; SETTLE=${SETTLE:-15}
mkdir -p "$OUT"
settle() { sync; echo 3 > /proc/sys/vm/drop_caches; sleep "$SETTLE"; }
for rep in 1 2 3; do
  for t in 1m 16m; do
    for sys in native local; do
      if [ $sys = native ]; then api=native; f=$U/s4/ior; else api=posix; f=$LOCAL/ior; fi
      settle; $R bench ior -a $api -o $f -b 2g -t $t -w -e -k -q --json > "$OUT/$sys-$t-w-$rep.json"
      settle; $R bench ior -a $api -o $f -b 2g -t $t -r -q --json > "$OUT/$sys-$t-r-$rep.json"
    done
  done
done
