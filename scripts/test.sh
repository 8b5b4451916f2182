#!/usr/bin/env bash
# Runs the whole braid test suite: formatting, lints, unit, property and integration
# tests (real server processes, real FUSE mounts, the pjdfstest and fsx suites). Installs
# what it needs on a fresh Debian/Ubuntu machine (fuse3; pjdfstest and fsx with cargo
# install; the user `tests`; libnbd-bin, python3-libnbd and qemu-utils for the NBD
# clients) when run as root; otherwise says what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkg() {  # need_pkg COMMAND PACKAGE [APT-GET OPTION...]
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing $2 (for $1)"
    [ -n "${apt_updated:-}" ] || { apt-get update -qq >/dev/null && apt_updated=1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${@:3}" "$2" >/dev/null
  else
    echo "missing $1: install the '$2' package (e.g. sudo apt-get install -y $2)" >&2
    exit 1
  fi
}
need_cargo_bin() {  # need_cargo_bin COMMAND CRATE[@VERSION]
  command -v "$1" >/dev/null 2>&1 && return 0
  [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/$1" ] && return 0
  echo "installing $2 (for $1)"
  cargo install --locked --quiet "$2"
}
need_user() {  # need_user NAME
  id "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v useradd >/dev/null 2>&1; then
    echo "creating user $1"
    useradd --user-group --no-create-home --home-dir / --shell /usr/sbin/nologin --comment "pjdfstest dummy user" "$1"
  else
    echo "missing user $1: create it (e.g. sudo useradd -U -M -s /usr/sbin/nologin $1)" >&2
    exit 1
  fi
}
need_pkg fusermount3 fuse3
[ -e /dev/fuse ] || { echo "/dev/fuse is missing: load the fuse module (modprobe fuse)" >&2; exit 1; }
# The POSIX suites (crates/braid/tests/posix_suites.rs): pjdfstest switches to the users
# nobody and tests, remounts read-only and bind-mounts with mount(8), and finds sleep(1)
# with which(1); fsx's O_DIRECT runs build a small LD_PRELOAD shim with cc, which is
# also the linker `cargo install` needs below.
need_pkg cc gcc
need_pkg mount mount
need_pkg which debianutils
need_user tests
need_user nobody
# The NBD export's tests drive real NBD clients (crates/braid/tests/nbd.rs).
need_pkg nbdinfo libnbd-bin  # also nbdcopy and nbdfuse
need_pkg nbdsh python3-libnbd
need_pkg qemu-io qemu-utils
# The cluster of separate nodes (scripts/netns-cluster.sh, crates/braid/tests/netns.rs):
# network namespaces, veth pairs, a bridge and tc; nsenter runs each node's processes.
need_pkg ip iproute2
need_pkg nsenter util-linux
# The metrics tests (crates/braid/tests/metrics.rs) check what every process serves
# with Prometheus' own linter, `promtool check metrics`.
need_pkg promtool prometheus --no-install-recommends
# The units in dist/systemd/ are checked with `systemd-analyze verify`, and mount(8)
# runs braid as its fuse.braid helper in a private mount namespace (unshare, util-linux;
# crates/braid/tests/admin.rs).
need_pkg systemd-analyze systemd
need_pkg unshare util-linux
# scripts/run-tests.py runs the test binaries.
need_pkg python3 python3

# pjdfstest and fsx build in their own directories while the workspace builds.
installs=$(mktemp)
trap 'rm -f "$installs" "${built:-}"' EXIT
{ need_cargo_bin pjdfstest pjdfstest@0.2.2 && need_cargo_bin fsx fsx@0.3.2; } >"$installs" 2>&1 &
install_pid=$!

# A clean checkout (CI) gains nothing from incremental compilation, and its caches
# were the largest part of target/ after the test binaries.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
built=$(mktemp)
cargo test --workspace --no-run --message-format=json-render-diagnostics >"$built"
cargo test --workspace --doc
# The fuzz targets (fuzz/, a crate of its own for cargo fuzz) are built, and each
# target's decoder runs over its saved corpus (fuzz/tests/corpus.rs).
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}" cargo test --manifest-path fuzz/Cargo.toml

if ! wait "$install_pid"; then
  cat "$installs" >&2
  echo "cannot install pjdfstest or fsx (above)" >&2
  exit 1
fi
cat "$installs"

# Every test binary, two at a time (BRAID_TEST_JOBS), longest first; then the mount
# tests and the POSIX suites again in the same queue, over a root striped over two
# MDTs, each in its own MDS (the suites' directories striped too): names spread over
# the MDTs and renames cross them; and with every separate mount's object I/O
# short-circuited (-o short_circuit: read and written through the descriptors its
# OSS, on this machine, hands over). POSIX through the mount must not change.
second="striped:BRAID_TEST_ROOT_STRIPES=2,BRAID_TEST_SHORT_CIRCUIT=1"
second+=":mount_posix,mount_ops,mount_perms,mount_readdir,mount_truncate,mount_multi,posix_suites"
python3 scripts/run-tests.py main "$second" <"$built"
