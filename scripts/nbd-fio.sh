# Sourced by scripts/bench-nbd.sh and scripts/ab-nbd.sh: one fio run on an NBD export.
#
#   fio_nbd URI RW DEPTH SIZE SECONDS    prints "IOPS MEAN_COMPLETION_LATENCY_US"
#
# 4 KiB requests with fio's nbd engine, RW one of fio's --rw modes, DEPTH in flight.
fio_nbd() {
    fio --name=n --ioengine=nbd --uri="$1" --rw="$2" --bs=4k --iodepth="$3" --size="$4" \
        --runtime="$5" --time_based --output-format=json 2> /dev/null |
        python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; k="read" if "read" in sys.argv[1] else "write"; print("%.1f %.1f" % (j[k]["iops"], j[k]["clat_ns"]["mean"]/1000))' "$2"
}
