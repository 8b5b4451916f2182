#!/usr/bin/env bash
# Mirrors and tiering by hand (docs/benchmarks.md, "Mirrors and tiering"): a write to a
# mirrored file against a plain one, `braid mirror resync` onto the cool pool, and the
# time to first byte of a file in hot, in cool, just purged and after staging.
#
# Needs a mounted braid whose OSTs are in pools `hot` and `cool` (e.g. `braid local
# --ost-media 0-1:class=ssd,bw=1G --ost-media 2-3:class=hdd,bw=150M,lat=4ms`, `braid pool`,
# `braid mount`), BRAID_SECRET_FILE set, and root (it drops the page cache).
#   BRAID=target/release/braid MNT=/mnt/braid ROUNDS=3 scripts/bench-mirrors.sh
set -euo pipefail
BRAID=${BRAID:-target/release/braid}
MNT=${MNT:-/mnt/braid}
ROUNDS=${ROUNDS:-3}
D=$MNT/bench-mirrors
WORK=$(mktemp -d)
svc=
cleanup() {
  if [ -n "$svc" ]; then kill "$svc" 2>/dev/null || true; wait "$svc" 2>/dev/null || true; fi
  rm -rf "$D" "$WORK"
}
trap cleanup EXIT
mkdir -p "$D"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# Writes 512 MiB in 1 MiB writes to an existing file, fsync; prints the seconds.
write512() {
  python3 - "$1" <<'PY'
import os, sys, time
buf = os.urandom(1 << 20)
t = time.time()
fd = os.open(sys.argv[1], os.O_WRONLY)
for _ in range(512):
    os.write(fd, buf)
os.fsync(fd)
os.close(fd)
print("%.3f" % (time.time() - t))
PY
}

# Reads a file: the first MiB's time, then the whole file's bandwidth.
ttfb() {
  python3 - "$1" <<'PY'
import os, sys, time
size = os.stat(sys.argv[1]).st_size
t = time.time()
fd = os.open(sys.argv[1], os.O_RDONLY)
os.read(fd, 1 << 20)
t1 = time.time()
while os.read(fd, 4 << 20):
    pass
t2 = time.time()
os.close(fd)
print("first MiB %.1f ms, whole %.0f MiB/s" % ((t1 - t) * 1000, size / (1 << 20) / (t2 - t)))
PY
}

echo "== mirrored write and resync (512 MiB) =="
for r in $(seq 1 "$ROUNDS"); do
  rm -f "$D/plain" "$D/mirrored"
  "$BRAID" setstripe -c 1 -p hot "$D/plain"
  "$BRAID" mirror create -N -c 1 -p hot -N -c 1 -p cool "$D/mirrored"
  drop
  p=$(write512 "$D/plain")
  m=$(write512 "$D/mirrored")
  echo "round $r: write plain $(python3 -c "print('%.0f' % (512 / $p))") MiB/s, mirrored $(python3 -c "print('%.0f' % (512 / $m))") MiB/s"
  t0=$(date +%s.%N)
  "$BRAID" mirror resync "$D/mirrored"
  t1=$(date +%s.%N)
  echo "round $r: resync $(python3 -c "print('%.0f' % (512 / ($t1 - $t0)))") MiB/s"
done

echo "== time to first byte (256 MiB files) =="
cat > "$WORK/policy.toml" <<'P'
hot_pool = "hot"
cool_pool = "cool"
mirror_age_s = 86400
high_watermark = 100
low_watermark = 99
scan_interval_ms = 200
hot_layout = "-c 1"
P
for r in $(seq 1 "$ROUNDS"); do
  for f in hot cool purged; do
    rm -f "$D/$f"
    "$BRAID" setstripe -c 1 -p hot "$D/$f"
    head -c 256M /dev/urandom > "$D/$f"
  done
  for f in cool purged; do "$BRAID" tier purge --policy "$WORK/policy.toml" "$D/$f" > /dev/null; done
  rm -f "$WORK/tier-state.json"
  "$BRAID" tier run --policy "$WORK/policy.toml" "$D" > "$WORK/tier.log" 2>&1 &
  svc=$!
  sleep 1
  drop; echo "round $r in hot: $(ttfb "$D/hot")"
  drop; echo "round $r in cool: $(ttfb "$D/cool")"
  drop; echo "round $r just purged: $(ttfb "$D/purged")"
  for _ in $(seq 1 300); do
    "$BRAID" getstripe "$D/purged" | grep -q "lcm_mirror_count:  2" && break
    sleep 0.2
  done
  drop; echo "round $r after staging: $(ttfb "$D/purged")"
  kill "$svc"; wait "$svc" 2>/dev/null || true; svc=
done
