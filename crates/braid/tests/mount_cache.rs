//! What a mount keeps of file data between opens, through real `braid mount`
//! processes: the kernel's page cache survives the reopen of a file nobody changed,
//! and goes at the open after any change, also one made on another client that left
//! the size and mtime as they were (only the MDS's data version tells).

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

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

    // A reads it whole: its pages are cached, and a reopen keeps them.
    assert!(fs::read(a.path("f")).unwrap() == v1);
    let f = File::open(a.path("f")).unwrap();
    assert_eq!(resident_pages(&f, LEN), LEN / PAGE, "a reopen of an unchanged file keeps every page");
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
