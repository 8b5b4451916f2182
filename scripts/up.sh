#!/usr/bin/env bash
# Builds braid and brings up an all-in-one cluster (MGS, 1 MDT, 4 OSTs) mounted with
# FUSE, in the foreground: Ctrl-C stops it and unmounts.
#   scripts/up.sh [DATA_DIR] [MOUNTPOINT]
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-/var/tmp/braid-data}
mnt=${2:-/mnt/braid}
if ! command -v fusermount3 >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 >/dev/null
  else
    echo "braid needs FUSE 3: sudo apt-get install -y fuse3" >&2
    exit 1
  fi
fi
cargo build --release
mkdir -p "$mnt"
echo "Mounting on $mnt (data in $data). In another terminal: ls $mnt; ./target/release/braid getstripe $mnt/FILE"
exec ./target/release/braid local --data "$data" --mount "$mnt"
