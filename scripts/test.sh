#!/usr/bin/env bash
# Runs the whole braid test suite: formatting, lints, unit, property and integration
# tests (real server processes, real FUSE mounts). Installs what it needs on a fresh
# Debian/Ubuntu machine (fuse3) when run as root; otherwise says what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkg() {  # need_pkg COMMAND PACKAGE
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing $2 (for $1)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
  else
    echo "missing $1: install the '$2' package (e.g. sudo apt-get install -y $2)" >&2
    exit 1
  fi
}
need_pkg fusermount3 fuse3
[ -e /dev/fuse ] || { echo "/dev/fuse is missing: load the fuse module (modprobe fuse)" >&2; exit 1; }

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# Integration tests start several server processes each; bound the parallelism so a
# 2-core machine is not oversubscribed.
cargo test --workspace -- --test-threads="${BRAID_TEST_THREADS:-3}"
