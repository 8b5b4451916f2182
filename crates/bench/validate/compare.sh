#!/bin/bash
# Validate `braid bench` against independent tools on one directory, side by side:
#   bandwidth: braid bench ior    vs fio (psync engine, the same sizes and flags)
#   metadata:  braid bench mdtest vs fsbench md (shared/peers/fsbench.c, a C mdtest-like test)
#
#   compare.sh BRAID_BIN DIR [REPS]
#
# Env: SIZE_MIB=1024 (total for sequential cases), RAND_MIB=256, MD_FILES=5000,
#      SETTLE=15 (seconds to wait after sync/drop_caches, so every measurement starts from
#      the same memory state: on a VM whose free memory goes back to the hypervisor, filling
#      the page cache is much faster right after a drop than a while later),
#      FSBENCH=path to a compiled fsbench (metadata cases are skipped without it).
# Needs root for drop_caches. In odd repetitions fio/fsbench runs first, in even ones braid,
# so order effects cancel. Results: DIR/compare.tsv (case, tool, rep, value) and a Markdown
# table of medians with braid/reference ratios on stdout.
set -euo pipefail
BRAID=${1:?braid binary}
DIR=${2:?directory}
REPS=${3:-3}
SIZE_MIB=${SIZE_MIB:-1024}
RAND_MIB=${RAND_MIB:-256}
MD_FILES=${MD_FILES:-5000}
SETTLE=${SETTLE:-15}
FSBENCH=${FSBENCH:-}
CASES=${CASES:-bw md}   # bw: the fio cases, md: the fsbench cases
OUT=$DIR/compare.tsv
mkdir -p "$DIR"
: > "$OUT"

settle() { sync; echo 3 > /proc/sys/vm/drop_caches; sleep "$SETTLE"; }
fio_bw() { # fio args... -> MiB/s of the group
    fio --ioengine=psync --fallocate=none --group_reporting --output-format=json "$@" |
        python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(max(j["write"]["bw_bytes"], j["read"]["bw_bytes"])/2**20)'
}
ior_bw() { # ior args... -> mean MiB/s of the single phase run
    "$BRAID" bench ior -q --json "$@" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["summary"][0]["bandwidth_mib_s"]["mean"])'
}
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$OUT"; echo "$1 $2 rep$3: $4" >&2; }
# pair CASE REP 'fio args' 'ior args': both measurements, order alternating by repetition.
pair() {
    local case=$1 rep=$2 fio_args=$3 ior_args=$4 tool
    local order="fio braid"; [ $((rep % 2)) -eq 0 ] && order="braid fio"
    for tool in $order; do
        settle
        if [ $tool = fio ]; then
            eval "record $case fio $rep \"\$(fio_bw $fio_args)\""
        else
            eval "record $case braid $rep \"\$(ior_bw $ior_args)\""
        fi
    done
}

for rep in $(seq 1 "$REPS"); do
  if [[ " $CASES " == *" bw "* ]]; then
    # Sequential, 1 MiB transfers, file per task, 1 and 2 tasks: O_DIRECT, then buffered
    # (write with fsync inside the timing, read after drop_caches).
    for n in 1 2; do
        per=$((SIZE_MIB / n))
        rm -rf "$DIR/fio" "$DIR/ior"; mkdir -p "$DIR/fio" "$DIR/ior"
        common_fio="--name=v --directory=$DIR/fio --bs=1M --size=${per}M --numjobs=$n"
        common_ior="-F -k -t 1m -b ${per}m -N $n -o $DIR/ior/testFile"
        pair "seq-write-direct-n$n" "$rep" "$common_fio --rw=write --direct=1" "$common_ior -w --direct"
        pair "seq-read-direct-n$n" "$rep" "$common_fio --rw=read --direct=1" "$common_ior -r --direct"
        pair "seq-write-fsync-n$n" "$rep" "$common_fio --rw=write --end_fsync=1" "$common_ior -w -e"
        pair "seq-read-cold-n$n" "$rep" "$common_fio --rw=read" "$common_ior -r"
    done
    # Random 4 KiB reads, O_DIRECT, every block once, one task.
    rm -rf "$DIR/fio" "$DIR/ior"; mkdir -p "$DIR/fio" "$DIR/ior"
    fio --name=layout --filename="$DIR/fio/rr" --rw=write --bs=1M --size=${RAND_MIB}M --end_fsync=1 > /dev/null
    "$BRAID" bench ior -q -F -w -k -e -t 1m -b ${RAND_MIB}m -o "$DIR/ior/rr" > /dev/null
    pair rand-read-4k-direct-n1 "$rep" \
        "--name=rr --filename=$DIR/fio/rr --rw=randread --bs=4k --size=${RAND_MIB}M --direct=1" \
        "-F -r -k -z -t 4k -b ${RAND_MIB}m --direct -o $DIR/ior/rr"
    rm -rf "$DIR/fio" "$DIR/ior"
  fi
    # Metadata: create (O_CREAT|O_EXCL, close), stat, unlink of empty files.
    if [ -n "$FSBENCH" ] && [[ " $CASES " == *" md "* ]]; then
        for n in 1 2; do
            for layout in shared unique; do
                order="fsbench braid"; [ $((rep % 2)) -eq 0 ] && order="braid fsbench"
                for tool in $order; do
                    rm -rf "$DIR/md"; mkdir -p "$DIR/md"
                    sync; sleep "$SETTLE"
                    if [ $tool = fsbench ]; then
                        flag=; [ $layout = shared ] && flag=-s
                        "$FSBENCH" md -d "$DIR/md" -n $n -f "$MD_FILES" $flag > "$DIR/md.json"
                        for op in create stat unlink; do
                            record "md-$op-$layout-n$n" fsbench "$rep" "$(python3 -c "import json; print(json.load(open('$DIR/md.json'))['${op}_ops'])")"
                        done
                    else
                        uflag=; [ $layout = unique ] && uflag=-u
                        "$BRAID" bench mdtest -q --json -F -C -T -r -n "$MD_FILES" -N $n -d "$DIR/md" $uflag > "$DIR/md.json"
                        for op in create stat unlink; do
                            name=$(case $op in create) echo "File creation";; stat) echo "File stat";; unlink) echo "File removal";; esac)
                            record "md-$op-$layout-n$n" braid "$rep" "$(python3 -c "import json; print([r['ops_per_s']['mean'] for r in json.load(open('$DIR/md.json'))['summary'] if r['operation']=='$name'][0])")"
                        done
                    fi
                done
            done
        done
        rm -rf "$DIR/md" "$DIR/md.json"
    fi
done

python3 - "$OUT" <<'PY'
import csv, statistics, sys
rows = list(csv.reader(open(sys.argv[1]), delimiter="\t"))
cases, values = [], {}
for case, tool, rep, value in rows:
    if case not in cases:
        cases.append(case)
    values.setdefault((case, tool), []).append(float(value))
print("| case | unit | braid bench: median (min-max) | reference: median (min-max) | braid / reference |")
print("|---|---|---:|---:|---:|")
for case in cases:
    ref = "fsbench" if case.startswith("md-") else "fio"
    unit = "ops/s" if case.startswith("md-") else "MiB/s"
    if (case, "braid") not in values or (case, ref) not in values:
        continue
    b, r = values[(case, "braid")], values[(case, ref)]
    mb, mr = statistics.median(b), statistics.median(r)
    print(f"| {case} | {unit} | {mb:.0f} ({min(b):.0f}-{max(b):.0f}) | {ref} {mr:.0f} ({min(r):.0f}-{max(r):.0f}) | {mb/mr:.2f} |")
PY
