#!/usr/bin/env bash
# TLS on against TLS off, side by side in one run: IOR streaming (file per process,
# 1 MiB transfers, fsync, written then read back by another task with the page cache
# dropped) through two separate `braid mount` processes of one `braid local` cluster
# (4 OSTs, servers offering TLS): one mount plain, one with -o tls_dir. Rounds
# alternate which mount goes first; prints each round and the medians' ratios.
#   scripts/bench-tls.sh [ROUNDS] [BLOCK]      (defaults: 3 rounds, 512m per task)
# MOUNT_OPTS=ost_limit=400M gives both mounts a link of that speed (the client's
# throttle), as a cluster bound by its network rather than by this machine's 2 cores.
# Needs a release build (cargo build --release -p braid) and openssl; run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
block=${2:-512m}
BRAID=${BRAID:-$PWD/target/release/braid}
WORK=$(mktemp -d /var/tmp/braid-bench-tls.XXXXXX)
port=$((20000 + RANDOM % 20000))
pids=()
mounts=()
cleanup() {
  for m in "${mounts[@]}"; do mountpoint -q "$m" && "$BRAID" umount "$m" || true; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 1
  rm -rf "$WORK"
}
trap cleanup EXIT

# A CA and one certificate for the servers and the TLS mount alike (IP 127.0.0.1).
tls=$WORK/tls
mkdir -p "$tls"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=bench-ca \
  -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=node \
  -keyout "$tls/key.pem" -out "$tls/node.csr" 2>/dev/null
openssl x509 -req -in "$tls/node.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -days 2 -out "$tls/cert.pem" \
  -extfile <(printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n') 2>/dev/null

mkdir -p "$WORK/data" "$WORK/plain" "$WORK/tls-mnt"
"$BRAID" local --data "$WORK/data" --osts 4 --listen 127.0.0.1:$port --tls-dir "$tls" > "$WORK/local.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do grep -q "^MGS at" "$WORK/local.log" && break; sleep 0.2; done
secret=$WORK/data/cluster.secret
extra=${MOUNT_OPTS:+,$MOUNT_OPTS}
"$BRAID" mount "braid://127.0.0.1:$port/" "$WORK/plain" --secret-file "$secret" --log "$WORK/plain.log" \
  ${MOUNT_OPTS:+-o "$MOUNT_OPTS"}
mounts+=("$WORK/plain")
"$BRAID" mount "braid://127.0.0.1:$port/" "$WORK/tls-mnt" --secret-file "$secret" -o "tls_dir=$tls$extra" \
  --log "$WORK/tls.log"
mounts+=("$WORK/tls-mnt")
for m in "$WORK/plain" "$WORK/tls-mnt"; do
  for _ in $(seq 1 100); do mountpoint -q "$m" && break; sleep 0.2; done
  mkdir -p "$m/ior-$(basename "$m")"
  "$BRAID" setstripe -c 4 -S 1M "$m/ior-$(basename "$m")"
done

ior() {  # ior MOUNT -> "write_mib_s read_mib_s"
  local dir=$1/ior-$(basename "$1")
  "$BRAID" bench ior -N 4 -F -C -e -t 1m -b "$block" --drop-caches -o "$dir/f" --json |
    python3 -c 'import json,sys; s={r["operation"]: r["bandwidth_mib_s"]["mean"] for r in json.load(sys.stdin)["summary"]}; print("%.0f %.0f" % (s["write"], s["read"]))'
}

echo "round  plain-write plain-read  tls-write tls-read   (MiB/s; 4 tasks x $block, file per process, fsync)"
results=$WORK/results
: > "$results"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then p=$(ior "$WORK/plain"); t=$(ior "$WORK/tls-mnt"); else t=$(ior "$WORK/tls-mnt"); p=$(ior "$WORK/plain"); fi
  echo "$r      $p      $t"
  echo "$p $t" >> "$results"
done
python3 - "$results" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
med = [statistics.median(c) for c in zip(*rows)]
print(f"median  plain write {med[0]:.0f}, read {med[1]:.0f}; TLS write {med[2]:.0f}, read {med[3]:.0f} MiB/s")
print(f"TLS/plain: write {med[2] / med[0]:.2f}, read {med[3] / med[1]:.2f}")
EOF
