//! What a mount keeps of file data between opens, through real `braid mount`
//! processes: the kernel's page cache survives the reopen of a file nobody changed,
//! and goes at the open after any change, also one made on another client that left
//! the size and mtime as they were (only the MDS's data version tells); and the SSD
//! read cache (`-o cache_dir`): hits, coherence with writes, punches and other
//! clients, a remount or SIGKILL, damaged or full cache disks, `braid cache`; and a
//! file the cache holds whole, read by the kernel from its cache file (passthrough).

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use testkit::{pattern, Cluster, ClusterSpec, Mount};

const PAGE: usize = 4096;

fn cluster() -> Cluster {
    Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default())
}

/// How many of the open file's pages the kernel holds in its page cache (mincore of
/// a mapping, which reads nothing).
fn resident_pages(f: &File, len: usize) -> usize {
    // SAFETY: a fresh shared read-only mapping of `len` bytes of an open file, unmapped
    // before returning; mincore only writes the `len / PAGE` bytes of `vec`.
    unsafe {
        let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
        assert_ne!(p, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        let mut vec = vec![0u8; len.div_ceil(PAGE)];
        let r = libc::mincore(p, len, vec.as_mut_ptr());
        let err = std::io::Error::last_os_error();
        libc::munmap(p, len);
        assert_eq!(r, 0, "mincore: {err}");
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }
}

/// Sets `path`'s atime and mtime to `mtime` (seconds and nanoseconds), as `cp -p` or
/// rsync leave a rewritten file.
fn set_times(path: &Path, mtime: (i64, i64)) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let t = libc::timespec { tv_sec: mtime.0, tv_nsec: mtime.1 };
    // SAFETY: a NUL-terminated path and an array of two timespecs.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [t, t].as_ptr(), 0) };
    assert_eq!(r, 0, "utimensat: {}", std::io::Error::last_os_error());
}

fn mtime_of(path: &Path) -> (i64, i64) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).unwrap();
    (m.mtime(), m.mtime_nsec())
}

#[test]
fn a_reopened_file_keeps_its_pages_until_another_client_changes_it() {
    let c = cluster();
    let a = Mount::new(&c, "");
    let b = Mount::new(&c, "");
    const LEN: usize = 3 << 20;
    let v1 = pattern(LEN, 1);
    fs::write(b.path("f"), &v1).unwrap();
    let mtime = mtime_of(&b.path("f"));

    // A reads it whole: its pages are cached, and a reopen keeps them. The kernel may
    // reclaim clean pages at any time, even with memory to spare (DAMON's proactive
    // reclaim does, on the machines these tests run on): a few may be gone, while an
    // open that dropped the cache leaves none.
    assert!(fs::read(a.path("f")).unwrap() == v1);
    let f = File::open(a.path("f")).unwrap();
    let kept = resident_pages(&f, LEN);
    assert!(kept > LEN / PAGE / 2, "a reopen of an unchanged file keeps its pages ({kept} of {} resident)", LEN / PAGE);
    drop(f);
    assert!(fs::read(a.path("f")).unwrap() == v1);

    // B rewrites the middle, then puts the size and mtime back as they were: what A's
    // kernel cached of the attributes still matches, the bytes do not.
    let v2 = {
        let mut v = v1.clone();
        v[LEN / 3..LEN / 3 + 100_000].copy_from_slice(&pattern(100_000, 2));
        v
    };
    let g = OpenOptions::new().write(true).open(b.path("f")).unwrap();
    g.write_all_at(&v2[LEN / 3..LEN / 3 + 100_000], (LEN / 3) as u64).unwrap();
    drop(g);
    set_times(&b.path("f"), mtime);
    assert_eq!(mtime_of(&b.path("f")), mtime);

    let f = File::open(a.path("f")).unwrap();
    assert_eq!(resident_pages(&f, LEN), 0, "the open after B's change dropped A's pages");
    drop(f);
    assert!(fs::read(a.path("f")).unwrap() == v2, "A reads B's bytes after B's change");

    // A truncate to nothing and a rewrite to the same length, the mtime put back.
    assert!(fs::read(a.path("f")).unwrap() == v2);
    let v3 = pattern(LEN, 3);
    fs::write(b.path("f"), &v3).unwrap();
    set_times(&b.path("f"), mtime);
    assert!(fs::read(a.path("f")).unwrap() == v3, "A reads B's rewrite");

    // A's own change: the next open on A reads what A wrote (its pages, or fresh ones).
    let g = OpenOptions::new().write(true).open(a.path("f")).unwrap();
    g.write_all_at(b"own bytes", 10).unwrap();
    drop(g);
    let mut v4 = v3.clone();
    v4[10..19].copy_from_slice(b"own bytes");
    assert!(fs::read(a.path("f")).unwrap() == v4);
    assert!(fs::read(b.path("f")).unwrap() == v4, "B sees A's write after A's close");
}

/// The mount's SSD cache numbers (`braid cache status --json`).
fn cache_status(c: &Cluster, m: &Mount) -> serde_json::Value {
    let out = c.braid_ok(&["cache", "status", "--json", &m.path("").to_string_lossy()]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn num(s: &serde_json::Value, k: &str) -> u64 {
    s.get(k).and_then(|v| v.as_u64()).unwrap_or_else(|| panic!("no {k} in {s}"))
}

/// Waits until the mount's cache has filled at least `bytes` in all.
fn wait_filled(c: &Cluster, m: &Mount, bytes: u64) -> serde_json::Value {
    let mut s = cache_status(c, m);
    testkit::wait_for("the cache fills", std::time::Duration::from_secs(30), || {
        s = cache_status(c, m);
        num(&s, "fill_bytes") >= bytes
    });
    s
}

#[test]
fn the_ssd_cache_serves_rereads_across_remounts_and_never_stale_or_damaged_bytes() {
    let c = cluster();
    let cache_dir = c.dir.path().join("ssd-cache");
    // direct_io: every read reaches the mount process, so the page cache hides nothing.
    let opts = format!("direct_io,cache_dir={},cache_size=64M", cache_dir.display());
    let a = Mount::new(&c, &opts);
    let b = Mount::new(&c, "");
    const LEN: usize = 3 << 20;
    let v1 = pattern(LEN, 11);
    fs::write(b.path("f"), &v1).unwrap();

    // First read: from the OSTs, filled afterwards; the reread comes from the cache.
    assert!(fs::read(a.path("f")).unwrap() == v1);
    let s1 = wait_filled(&c, &a, LEN as u64);
    assert!(fs::read(a.path("f")).unwrap() == v1);
    let s2 = cache_status(&c, &a);
    assert!(num(&s2, "hits") > num(&s1, "hits"), "the reread hit: {s2}");
    assert_eq!(num(&s2, "misses"), num(&s1, "misses"), "and nothing missed: {s2}");
    assert!(num(&s2, "hit_bytes") >= LEN as u64);
    let text = c.braid_ok(&["cache", "status", &a.path("").to_string_lossy()]);
    assert!(text.contains("hit_rate:") && text.contains("evictions:"), "{text}");

    // Another client changes a range, even keeping size and mtime: A reads B's bytes.
    let mtime = mtime_of(&b.path("f"));
    let g = OpenOptions::new().write(true).open(b.path("f")).unwrap();
    g.write_all_at(&pattern(5000, 12), 1_000_000).unwrap();
    drop(g);
    set_times(&b.path("f"), mtime);
    let mut v2 = v1.clone();
    v2[1_000_000..1_005_000].copy_from_slice(&pattern(5000, 12));
    assert!(fs::read(a.path("f")).unwrap() == v2, "A reads B's change, not its cache");
    assert!(num(&cache_status(&c, &a), "invalidations") > 0);

    // A's own writes go through to the OSTs and drop what they touch.
    wait_filled(&c, &a, 2 * LEN as u64);
    assert!(fs::read(a.path("f")).unwrap() == v2);
    let g = OpenOptions::new().read(true).write(true).open(a.path("f")).unwrap();
    g.write_all_at(b"written on A", 2_000_000).unwrap();
    let mut v3 = v2.clone();
    v3[2_000_000..2_000_012].copy_from_slice(b"written on A");
    let mut back = vec![0u8; 4096];
    g.read_exact_at(&mut back, 2_000_000 - 1000).unwrap();
    assert!(back == v3[2_000_000 - 1000..2_000_000 + 3096], "the handle that wrote reads its write");
    drop(g);
    assert!(fs::read(a.path("f")).unwrap() == v3, "A reads its own write");
    assert!(fs::read(b.path("f")).unwrap() == v3, "the write reached the OSTs");

    // A hole punched on B (size kept): A reads zeros there at its next open.
    assert!(fs::read(a.path("f")).unwrap() == v3);
    wait_filled(&c, &a, 3 * LEN as u64);
    let g = OpenOptions::new().write(true).open(b.path("f")).unwrap();
    // SAFETY: fallocate on an open descriptor.
    let r = unsafe {
        libc::fallocate(g.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 500_000, 70_000)
    };
    assert_eq!(r, 0, "punch: {}", std::io::Error::last_os_error());
    drop(g);
    v3[500_000..570_000].fill(0);
    assert!(fs::read(a.path("f")).unwrap() == v3, "A reads the hole B punched, not its cache");

    // Unmounted and mounted again on the same directory: the first reread is a hit.
    assert!(fs::read(a.path("f")).unwrap() == v3);
    wait_filled(&c, &a, 3 * LEN as u64);
    a.umount().unwrap();
    drop(a);
    let mut a = Mount::new(&c, &opts);
    assert!(fs::read(a.path("f")).unwrap() == v3);
    let s = cache_status(&c, &a);
    assert_eq!(num(&s, "misses"), 0, "after a remount every read was served from the cache: {s}");
    assert!(num(&s, "hits") > 0);

    // A client killed with SIGKILL: its cache is used again, and serves only right bytes.
    a.kill();
    drop(a);
    let a = Mount::new(&c, &opts);
    assert!(fs::read(a.path("f")).unwrap() == v3);
    assert_eq!(num(&cache_status(&c, &a), "misses"), 0, "used again after a SIGKILL");
    a.umount().unwrap();
    drop(a);

    // Cached bytes changed behind braid's back: found by their checksum, never served.
    // Each byte is at its own offset of the file's cache file.
    let files: Vec<_> = fs::read_dir(cache_dir.join("files")).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(files.len(), 1, "one cache file, of f: {files:?}");
    let raw = fs::read(&files[0]).unwrap();
    let at = 1_500_000;
    assert!(raw[at..at + 64] == v3[at..at + 64], "the file's bytes are in the cache");
    OpenOptions::new().write(true).open(&files[0]).unwrap().write_all_at(&[raw[at] ^ 0x5a], at as u64).unwrap();
    let a = Mount::new(&c, &opts);
    assert!(fs::read(a.path("f")).unwrap() == v3, "a damaged cache block is read from the OSTs");
    assert!(num(&cache_status(&c, &a), "damaged") >= 1);

    // `braid cache drop` empties it.
    c.braid_ok(&["cache", "drop", &a.path("").to_string_lossy()]);
    let s = cache_status(&c, &a);
    assert_eq!((num(&s, "used"), num(&s, "extents")), (0, 0), "{s}");
    assert!(fs::read(a.path("f")).unwrap() == v3);
}

#[test]
fn a_cache_directory_that_cannot_be_used_leaves_the_mount_working() {
    let c = cluster();
    let m = Mount::new(&c, "cache_dir=/proc/braid-cache,cache_size=64M");
    fs::write(m.path("f"), b"still works").unwrap();
    assert_eq!(fs::read(m.path("f")).unwrap(), b"still works");
    assert!(m.log_text().contains("running without the SSD cache"), "{}", m.log_text());
    let out = c.braid(&["cache", "status", &m.path("").to_string_lossy()]);
    assert!(!out.status.success());
    assert!(testkit::stderr(&out).contains("has no SSD cache"), "{}", testkit::stderr(&out));
    // A bad option is refused before anything is mounted.
    let out = c.braid(&["mount", "-f", &c.url("/"), "/nonexistent", "-o", "cache_size=20G"]);
    assert!(testkit::stderr(&out).contains("cache_size needs cache_dir"), "{}", testkit::stderr(&out));
    let out = c.braid(&["mount", "-f", &c.url("/"), "/nonexistent", "-o", "cache_dir=/x,cache_size=lots"]);
    assert!(testkit::stderr(&out).contains("cache_size=20G"), "{}", testkit::stderr(&out));
    let out = c.braid(&["mount", "-f", &c.url("/"), "/nonexistent", "-o", "passthrough"]);
    assert!(testkit::stderr(&out).contains("passthrough needs cache_dir"), "{}", testkit::stderr(&out));
}

#[test]
fn a_client_killed_while_filling_and_a_full_cache_disk_serve_only_right_bytes() {
    let c = cluster();
    let files: Vec<Vec<u8>> = (0..8).map(|i| pattern(2 << 20, 40 + i)).collect();
    let b = Mount::new(&c, "");
    for (i, v) in files.iter().enumerate() {
        fs::write(b.path(&format!("f{i}")), v).unwrap();
    }
    // Killed right after its reads, with fills still queued or half written.
    let cache_dir = c.dir.path().join("ssd-cache");
    let opts = format!("direct_io,cache_dir={},cache_size=64M", cache_dir.display());
    let mut a = Mount::new(&c, &opts);
    for (i, v) in files.iter().enumerate() {
        assert!(fs::read(a.path(&format!("f{i}"))).unwrap() == *v);
    }
    a.kill();
    drop(a);
    let a = Mount::new(&c, &opts);
    for _ in 0..2 {
        for (i, v) in files.iter().enumerate() {
            assert!(fs::read(a.path(&format!("f{i}"))).unwrap() == *v, "f{i} after a kill mid-fill");
        }
    }
    assert_eq!(num(&cache_status(&c, &a), "damaged"), 0);
    drop(a);

    // A cache directory on a file system of 1 MiB: fills fail, reads stay right.
    let small = c.dir.path().join("small-fs");
    fs::create_dir_all(&small).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "braid-test-small", &small.to_string_lossy()])
        .status()
        .unwrap();
    assert!(st.success(), "mounting a 1 MiB tmpfs (the tests run as root)");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(small.clone());
    let opts = format!("direct_io,cache_dir={},cache_size=64M", small.join("cache").display());
    let a = Mount::new(&c, &opts);
    for _ in 0..2 {
        for (i, v) in files.iter().enumerate() {
            assert!(fs::read(a.path(&format!("f{i}"))).unwrap() == *v, "f{i} with the cache disk full");
        }
    }
    let s = wait_until(&c, &a, |s| num(s, "fill_errors") > 0);
    assert!(num(&s, "fill_errors") > 0, "{s}");
    assert!(a.log_text().contains("writing cached bytes failed"), "the log says so");
    assert_eq!(num(&s, "damaged"), 0);
}

/// Waits until the mount's cache numbers satisfy `ok`, and returns them.
fn wait_until(c: &Cluster, m: &Mount, ok: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let mut s = cache_status(c, m);
    testkit::wait_for("the cache numbers", std::time::Duration::from_secs(30), || {
        s = cache_status(c, m);
        ok(&s)
    });
    s
}

/// A native client (`braid cp`) takes the cache from `BRAID_CLIENT_OPTIONS`: a second
/// copy of a file it read before comes whole from the cache with every OSS down, where
/// the same copy without the cache fails; a mount-only option there is refused.
#[test]
fn a_native_client_uses_the_ssd_cache_from_its_client_options() {
    let mut c = cluster();
    let data = pattern(3 << 20, 11);
    c.put("/native", &data);
    let cache = c.dir.path().join("native-cache");
    let opts = format!("cache_dir={},cache_size=64M", cache.display());
    let out = c.dir.path().join("native-out");
    let cp = |c: &Cluster, opts: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_braid"));
        cmd.args(["cp", "--timeout-s", "2", &c.url("/native")]).arg(&out).env("BRAID_SECRET_FILE", &c.secret);
        if let Some(o) = opts {
            cmd.env("BRAID_CLIENT_OPTIONS", o);
        }
        let _ = fs::remove_file(&out);
        testkit::output_within(&mut cmd, std::time::Duration::from_secs(60)).expect("braid cp ends")
    };
    let first = cp(&c, Some(&opts));
    assert!(first.status.success(), "cp with the cache: {}", testkit::stderr(&first));
    assert_eq!(fs::read(&out).unwrap(), data);
    c.kill("oss0");
    let again = cp(&c, Some(&opts));
    assert!(again.status.success(), "cp from the cache with the OSS down: {}", testkit::stderr(&again));
    assert_eq!(fs::read(&out).unwrap(), data, "the cached bytes, whole");
    let without = cp(&c, None);
    assert!(!without.status.success(), "without the cache the OSTs are needed");
    let bad = cp(&c, Some("cache_dir=/tmp/x,allow_other"));
    assert!(!bad.status.success());
    assert!(testkit::stderr(&bad).contains("not an option of a native client"), "{}", testkit::stderr(&bad));
}

/// Checks that every page of `read` is that page of one of `versions` (all of one
/// length): what a reader may see of a file changed meanwhile by a writer that has
/// not closed it.
fn assert_pages_of(read: &[u8], versions: &[&Vec<u8>], who: &str) {
    assert_eq!(read.len(), versions[0].len(), "{who}: the length");
    for (i, page) in read.chunks(PAGE).enumerate() {
        let at = i * PAGE..i * PAGE + page.len();
        assert!(versions.iter().any(|v| &v[at.clone()] == page), "{who}: page {i} is of no version");
    }
}

/// A writer that dies with the file open never reports its writes (its close would
/// have moved the file's data version): the MDS moves the version of every file a
/// departed client held open for writing, so readers that kept the old bytes (the
/// kernel's page cache across opens, the SSD cache) drop them at their next open.
#[test]
fn a_writer_killed_before_its_close_still_makes_readers_drop_their_cached_bytes() {
    let c = cluster();
    const LEN: usize = 2 << 20;
    let v1 = pattern(LEN, 61);
    let w = Mount::new(&c, "direct_io");
    fs::write(w.path("f"), &v1).unwrap();
    let paged = Mount::new(&c, "");
    let cache_dir = c.dir.path().join("ssd-cache");
    let cached = Mount::new(&c, &format!("direct_io,cache_dir={},cache_size=64M", cache_dir.display()));
    assert!(fs::read(paged.path("f")).unwrap() == v1);
    assert!(fs::read(cached.path("f")).unwrap() == v1);
    wait_filled(&c, &cached, LEN as u64);
    assert!(fs::read(cached.path("f")).unwrap() == v1);

    // The writer rewrites a range in place (same size) and dies before closing.
    let fresh = pattern(300_000, 62);
    let at = 700_000;
    let mut v2 = v1.clone();
    v2[at..at + fresh.len()].copy_from_slice(&fresh);
    // The writer is a process of its own holding the only descriptor: a descriptor of
    // this test process would be inherited by every child that another test thread
    // forks, and the close of that copy at its exec flushes the handle (publishing the
    // write, which is not the case under test).
    let fresh_file = c.dir.path().join("fresh");
    fs::write(&fresh_file, &fresh).unwrap();
    let script = "import os, sys, time\n\
                  fd = os.open(sys.argv[1], os.O_WRONLY)\n\
                  data = open(sys.argv[2], 'rb').read()\n\
                  assert os.pwrite(fd, data, int(sys.argv[3])) == len(data)\n\
                  print('written', flush=True)\n\
                  time.sleep(600)\n";
    let mut writer = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(w.path("f"))
        .arg(&fresh_file)
        .arg(at.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(writer.stdout.take().unwrap()), &mut line).unwrap();
    let writer = Reap(writer);
    assert_eq!(line.trim(), "written");
    // The bytes are on the OSTs: the writer's own read (no page cache on a direct_io
    // mount) waits for its writes to land and reads the objects.
    assert!(fs::read(w.path("f")).unwrap() == v2);
    // The SSD-cached reader keeps the old bytes while the writer has not closed
    // (close-to-open): nothing told the MDS of the write, so the data version checked
    // at open has not moved. This is what makes the test able to fail. The paged
    // reader's kernel may have reclaimed some of its clean pages meanwhile (DAMON's
    // proactive reclaim does, even with memory to spare) and read those again from the
    // OSTs: before the writer's close, any page may be of either version.
    assert!(fs::read(cached.path("f")).unwrap() == v1);
    assert_pages_of(&fs::read(paged.path("f")).unwrap(), &[&v1, &v2], "the page-cached reader, before the kill");
    // ... and the writer's client is killed with the file open.
    let mut w = w;
    w.kill();
    drop(w);
    drop(writer);

    let start = std::time::Instant::now();
    loop {
        let (p, s) = (fs::read(paged.path("f")).unwrap(), fs::read(cached.path("f")).unwrap());
        if p == v2 && s == v2 {
            break;
        }
        assert_pages_of(&p, &[&v1, &v2], "the page-cached reader");
        assert_pages_of(&s, &[&v1, &v2], "the SSD-cached reader");
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "readers still serve the bytes from before the dead writer's write (page cache: {}, SSD cache: {})",
            p == v1,
            s == v1
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// `path` read whole with `O_DIRECT` (through an aligned buffer): with the kernel's
/// page cache out of the way, every read reaches the mount unless it passes through.
fn read_direct(path: &Path) -> Vec<u8> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let cap = len.div_ceil(PAGE) * PAGE + PAGE;
    let layout = std::alloc::Layout::from_size_align(cap, PAGE).unwrap();
    // SAFETY: a fresh allocation of `cap` bytes, freed below; read into as bytes only.
    let buf = unsafe { std::slice::from_raw_parts_mut(std::alloc::alloc_zeroed(layout), cap) };
    let mut done = 0;
    loop {
        let n = f.read_at(&mut buf[done..done + (1 << 20).min(cap - done)], done as u64).unwrap();
        done += n;
        if n == 0 || done >= len {
            break;
        }
    }
    let out = buf[..done].to_vec();
    // SAFETY: allocated above with `layout`.
    unsafe { std::alloc::dealloc(buf.as_mut_ptr(), layout) };
    out
}

/// The mount's read counters: reads it served from the cache and from the OSTs.
fn reads_seen(c: &Cluster, m: &Mount) -> (u64, u64) {
    let s = cache_status(c, m);
    (num(&s, "hits"), num(&s, "misses"))
}

/// Reads `path` with O_DIRECT until an open passes through (the mount sees no read).
fn wait_passthrough(c: &Cluster, m: &Mount, path: &Path, want: &[u8]) {
    testkit::wait_for("an open passes through to the cache file", std::time::Duration::from_secs(30), || {
        let before = reads_seen(c, m);
        let got = read_direct(path);
        assert!(got == want, "the bytes of {}", path.display());
        reads_seen(c, m) == before
    });
}

/// `path` opened read-only, once an open of it passes through to the cache file. A
/// handle closed just before may count as open in the mount until the kernel's
/// RELEASE of it is read, and an open beside another handle reads through the mount.
fn open_through(c: &Cluster, m: &Mount, path: &Path) -> File {
    let mut opened = None;
    testkit::wait_for("an open passes through to the cache file", std::time::Duration::from_secs(30), || {
        let backings = num(&cache_status(c, m), "backings");
        let f = File::open(path).unwrap();
        let through = num(&cache_status(c, m), "backings") > backings;
        opened = Some(f);
        through
    });
    opened.expect("opened")
}

#[test]
fn with_passthrough_a_file_the_ssd_cache_holds_whole_is_read_by_the_kernel_from_its_cache_file() {
    let c = cluster();
    let cache_dir = c.dir.path().join("ssd-cache");
    let opts = format!("cache_dir={},cache_size=64M,passthrough", cache_dir.display());
    let a = Mount::new(&c, &opts);
    assert!(a.log_text().contains("FUSE passthrough to the SSD cache on=true"), "{}", a.log_text());
    let b = Mount::new(&c, "");
    const LEN: usize = (3 << 20) + 1234;
    let v1 = pattern(LEN, 61);
    fs::write(b.path("f"), &v1).unwrap();

    // Read once through the mount (it fills the cache), then opens pass through: reads
    // O_DIRECT or buffered reach the mount no more, and read the file's bytes.
    assert!(read_direct(&a.path("f")) == v1);
    wait_passthrough(&c, &a, &a.path("f"), &v1);
    let seen = reads_seen(&c, &a);
    assert!(fs::read(a.path("f")).unwrap() == v1);
    assert_eq!(reads_seen(&c, &a), seen);
    assert!(num(&cache_status(&c, &a), "backings") >= 2, "counted");
    let text = c.braid_ok(&["cache", "status", &a.path("").to_string_lossy()]);
    assert!(text.contains("passthrough:"), "{text}");

    // (An open for writing right after a reader's close: the next test.)

    // While a handle passes through, this client cannot open the file for writing
    // (through a handle naming the cache file, a shared writable mapping would write
    // it alone): ETXTBSY, as for a running executable. Read-only mappings read it; a
    // truncate(2) is seen at once.
    let r = open_through(&c, &a, &a.path("f"));
    let mut got = vec![0u8; 10];
    r.read_exact_at(&mut got, 100).unwrap();
    assert_eq!(got, v1[100..110]);
    for how in [OpenOptions::new().write(true).clone(), OpenOptions::new().write(true).create(true).clone()] {
        let e = how.open(a.path("f")).expect_err("refused");
        assert_eq!(e.raw_os_error(), Some(libc::ETXTBSY), "{e}");
    }
    assert!(fs::read(a.path("f")).unwrap() == v1, "another reader shares it");
    // SAFETY: a read-only mapping of an open descriptor, read and unmapped at once.
    unsafe {
        let m = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, r.as_raw_fd(), 0);
        assert_ne!(m, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        assert_eq!(std::slice::from_raw_parts(m as *const u8, 4096), &v1[..4096]);
        libc::munmap(m, 4096);
    }
    let path = CString::new(a.path("f").as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::truncate(path.as_ptr(), 2 << 20) }, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(r.read_at(&mut got, 2 << 20).unwrap(), 0, "the reader sees the truncate");
    r.read_exact_at(&mut got, (2 << 20) - 10).unwrap();
    assert_eq!(got, v1[(2 << 20) - 10..2 << 20]);
    drop(r);
    // Once it is closed, writes go as always.
    let w = OpenOptions::new().write(true).open(a.path("f")).unwrap();
    w.write_all_at(b"from A", 100).unwrap();
    drop(w);
    let mut v2 = v1[..2 << 20].to_vec();
    v2[100..106].copy_from_slice(b"from A");
    assert!(fs::read(b.path("f")).unwrap() == v2, "the write reached the OSTs");
    assert!(fs::read(a.path("f")).unwrap() == v2);

    // Another client's change: the next open reads it, not the cache file.
    assert!(read_direct(&a.path("f")) == v2);
    wait_passthrough(&c, &a, &a.path("f"), &v2);
    let g = OpenOptions::new().write(true).open(b.path("f")).unwrap();
    g.write_all_at(b"from B", 300_000).unwrap();
    drop(g);
    let mut v3 = v2.clone();
    v3[300_000..300_006].copy_from_slice(b"from B");
    assert!(read_direct(&a.path("f")) == v3, "A reads B's change at its next open");
    assert!(fs::read(a.path("f")).unwrap() == v3);

    // `braid cache drop` while a handle passes through: it keeps reading right bytes.
    wait_passthrough(&c, &a, &a.path("f"), &v3);
    let r = open_through(&c, &a, &a.path("f"));
    c.braid_ok(&["cache", "drop", &a.path("").to_string_lossy()]);
    let mut all = vec![0u8; v3.len()];
    r.read_exact_at(&mut all, 0).unwrap();
    assert!(all == v3, "the dropped cache file stays whole for its reader");
    drop(r);

    // After a remount the cache's bytes are checked by a read through the mount before
    // any open passes through to them.
    assert!(read_direct(&a.path("f")) == v3);
    wait_passthrough(&c, &a, &a.path("f"), &v3);
    a.umount().unwrap();
    drop(a);
    let a = Mount::new(&c, &opts);
    let before = reads_seen(&c, &a);
    assert!(read_direct(&a.path("f")) == v3);
    let after = reads_seen(&c, &a);
    assert!(after.0 > before.0 && after.1 == before.1, "checked through the mount, from the cache: {after:?}");
    wait_passthrough(&c, &a, &a.path("f"), &v3);

    // The cache file changed behind braid's back: no open passes through to it, and the
    // mount's reads find the damage by its checksum.
    let files: Vec<_> = fs::read_dir(cache_dir.join("files")).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let raw = fs::read(&files[0]).unwrap();
    OpenOptions::new().write(true).open(&files[0]).unwrap().write_all_at(&[raw[5] ^ 0xff], 5).unwrap();
    assert!(read_direct(&a.path("f")) == v3, "read from the OSTs, not the changed cache file");
    assert!(num(&cache_status(&c, &a), "damaged") >= 1);
}

/// The mount process's hook that holds back the RELEASE of each handle passing through
/// (`fuse::PASSTHROUGH_RELEASE_DELAY_ENV`), in milliseconds.
const RELEASE_DELAY_ENV: &str = "BRAID_TEST_PASSTHROUGH_RELEASE_DELAY_MS";
const RELEASE_DELAY: Duration = Duration::from_millis(500);

/// close(2) returns before the kernel's RELEASE of the handle reaches the mount: an
/// open for writing right after a reader's close waits for that RELEASE, and is not
/// refused (ETXTBSY) for a handle already closed. The kernel is usually quick enough
/// that a test of this passes without the wait; here the mount holds back each
/// RELEASE of a handle passing through (a test hook, set for this test alone: it runs
/// in a child process of the test binary with the variable set), so every open meets
/// one in flight, and each would be refused without the wait.
#[test]
fn with_passthrough_an_open_for_writing_right_after_a_readers_close_waits_for_its_release() {
    const NAME: &str = "with_passthrough_an_open_for_writing_right_after_a_readers_close_waits_for_its_release";
    if std::env::var_os(RELEASE_DELAY_ENV).is_none() {
        let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(RELEASE_DELAY_ENV, RELEASE_DELAY.as_millis().to_string())
            .output()
            .expect("run the test binary");
        let text = format!("{}{}", testkit::stdout(&out), testkit::stderr(&out));
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        return;
    }
    let c = cluster();
    let cache_dir = c.dir.path().join("ssd-cache");
    let a = Mount::new(&c, &format!("cache_dir={},cache_size=64M,passthrough", cache_dir.display()));
    let b = Mount::new(&c, "");
    const LEN: usize = (3 << 20) + 1234;
    let v1 = pattern(LEN, 62);
    fs::write(b.path("f"), &v1).unwrap();
    assert!(read_direct(&a.path("f")) == v1);
    wait_passthrough(&c, &a, &a.path("f"), &v1);
    for i in 0..5 {
        // The last handle passing through released: a new open passes through afresh
        // instead of sharing it (which `open_through` would not count).
        std::thread::sleep(RELEASE_DELAY * 2);
        let r = open_through(&c, &a, &a.path("f"));
        let mut all = vec![0u8; v1.len()];
        r.read_exact_at(&mut all, 0).unwrap();
        assert!(all == v1);
        drop(r);
        let start = Instant::now();
        OpenOptions::new().write(true).open(a.path("f")).unwrap_or_else(|e| panic!("open {i} for writing: {e}"));
        // It met the reader's RELEASE in flight, and waited for it.
        assert!(start.elapsed() >= RELEASE_DELAY / 2, "open {i} for writing took {:?}", start.elapsed());
    }
}
