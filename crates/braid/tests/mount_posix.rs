//! POSIX semantics through a real FUSE mount (`braid mount -f`) of a real cluster:
//! file data, namespace operations, links, attributes, xattrs, special open flags,
//! fallocate, sparse and large files, mmap. Error codes are checked against what Linux
//! file systems return.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use testkit::{errno, last_errno, pattern, Cluster, MountedCluster};

fn start(opts: &str) -> MountedCluster {
    MountedCluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), opts)
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

/// Asserts two byte strings are equal, reporting lengths and the first difference
/// instead of printing megabytes.
#[track_caller]
fn same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!(
            "{what}: {} bytes read, {} expected; first difference at byte {i} (got {:?}, want {:?})",
            got.len(),
            want.len(),
            got.get(i..(i + 8).min(got.len())),
            want.get(i..(i + 8).min(want.len()))
        );
    }
}

#[test]
fn create_read_write_truncate_and_errors() {
    let e = start("");
    let f = e.m.path("a.txt");
    let data = pattern(300_000, 1);
    fs::write(&f, &data).unwrap();
    same(&fs::read(&f).unwrap(), &data, "read back");
    assert_eq!(fs::metadata(&f).unwrap().len(), 300_000);

    // Overwrite in the middle, read back at an offset.
    let mut h = OpenOptions::new().read(true).write(true).open(&f).unwrap();
    h.write_all_at(b"HELLO", 1000).unwrap();
    let mut buf = [0u8; 7];
    h.read_exact_at(&mut buf, 999).unwrap();
    assert_eq!(&buf, &[data[999], b'H', b'E', b'L', b'L', b'O', data[1005]]);

    // ftruncate down and up: the tail reads back as zeros.
    h.set_len(10).unwrap();
    assert_eq!(h.metadata().unwrap().len(), 10);
    h.set_len(5000).unwrap();
    let mut all = Vec::new();
    h.seek(SeekFrom::Start(0)).unwrap();
    h.read_to_end(&mut all).unwrap();
    assert_eq!(all.len(), 5000);
    assert_eq!(&all[..10], &data[..10]);
    assert!(all[10..].iter().all(|&b| b == 0), "grown tail must be zeros");
    drop(h);

    // truncate(2) by path.
    let c = cpath(&f);
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), 3) }, 0, "truncate: errno {}", last_errno());
    assert_eq!(fs::read(&f).unwrap(), &data[..3]);

    // O_TRUNC empties, O_APPEND appends even after seeking elsewhere.
    fs::write(&f, b"0123456789").unwrap();
    OpenOptions::new().write(true).truncate(true).open(&f).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().len(), 0);
    fs::write(&f, b"abc").unwrap();
    let mut a = OpenOptions::new().append(true).open(&f).unwrap();
    a.write_all(b"def").unwrap();
    a.seek(SeekFrom::Start(0)).unwrap();
    a.write_all(b"ghi").unwrap();
    drop(a);
    assert_eq!(fs::read(&f).unwrap(), b"abcdefghi");

    // O_EXCL.
    assert_eq!(errno(OpenOptions::new().write(true).create_new(true).open(&f)), libc::EEXIST);
    let n = e.m.path("new-excl");
    OpenOptions::new().write(true).create_new(true).open(&n).unwrap().write_all(b"x").unwrap();
    assert_eq!(fs::read(&n).unwrap(), b"x");

    // Errors as Linux gives them.
    assert_eq!(errno(File::open(e.m.path("missing"))), libc::ENOENT);
    assert_eq!(errno(File::open(e.m.path("missing/x"))), libc::ENOENT);
    assert_eq!(errno(File::open(e.m.path("a.txt/x"))), libc::ENOTDIR);
    fs::create_dir(e.m.path("d")).unwrap();
    assert_eq!(errno(fs::create_dir(e.m.path("d"))), libc::EEXIST);
    assert_eq!(errno(OpenOptions::new().write(true).open(e.m.path("d"))), libc::EISDIR);
    fs::write(e.m.path("d/inner"), b"1").unwrap();
    assert_eq!(errno(fs::remove_dir(e.m.path("d"))), libc::ENOTEMPTY);
    assert_eq!(errno(fs::remove_dir(e.m.path("a.txt"))), libc::ENOTDIR);
    assert_eq!(errno(fs::remove_file(e.m.path("d"))), libc::EISDIR);
    assert_eq!(errno(fs::remove_file(e.m.path("missing"))), libc::ENOENT);
    fs::remove_file(e.m.path("d/inner")).unwrap();
    fs::remove_dir(e.m.path("d")).unwrap();
    assert_eq!(errno(fs::metadata(e.m.path("d"))), libc::ENOENT);
    let long = "x".repeat(256);
    assert_eq!(errno(File::create(e.m.path(&long))), libc::ENAMETOOLONG);

    // fsync, fdatasync, statfs.
    let h = OpenOptions::new().write(true).open(&f).unwrap();
    h.write_all_at(b"Z", 0).unwrap();
    h.sync_all().unwrap();
    h.sync_data().unwrap();
    drop(h);
    assert_eq!(fs::read(&f).unwrap(), b"Zbcdefghi");
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let root = cpath(&e.m.dir);
    // SAFETY: valid C string and out pointer.
    assert_eq!(unsafe { libc::statvfs(root.as_ptr(), &mut st) }, 0);
    assert!(st.f_blocks > 0 && st.f_bsize > 0, "statfs shows capacity: {} blocks", st.f_blocks);
    assert!(st.f_bfree <= st.f_blocks && st.f_bavail <= st.f_blocks);
    assert!(st.f_files > 0, "statfs shows inodes");
    assert_eq!(st.f_namemax, 255);

    // readdir shows what is there.
    let mut names: Vec<String> =
        fs::read_dir(&e.m.dir).unwrap().map(|d| d.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, vec!["a.txt".to_string(), "new-excl".to_string()]);
}

#[test]
fn unlinked_open_file_lives_until_last_close() {
    let e = start("");
    let f = e.m.path("doomed");
    let data = pattern(200_000, 2);
    fs::write(&f, &data).unwrap();
    let h = OpenOptions::new().read(true).write(true).open(&f).unwrap();
    let h2 = File::open(&f).unwrap();
    fs::remove_file(&f).unwrap();
    assert_eq!(errno(fs::metadata(&f)), libc::ENOENT);
    assert_eq!(fs::read_dir(&e.m.dir).unwrap().count(), 0, "the name is gone from the listing");

    // Still readable and writable through both descriptors.
    let mut buf = vec![0u8; data.len()];
    h.read_exact_at(&mut buf, 0).unwrap();
    same(&buf, &data, "unlinked file");
    h.write_all_at(b"still here", 250_000).unwrap();
    let mut tail = [0u8; 10];
    h2.read_exact_at(&mut tail, 250_000).unwrap();
    assert_eq!(&tail, b"still here");
    assert_eq!(h.metadata().unwrap().nlink(), 0, "fstat of an unlinked file shows nlink 0");
    assert_eq!(h.metadata().unwrap().len(), 250_010);
    h.set_len(100).unwrap();
    drop(h);
    // One descriptor closed: the other still works.
    let mut b = [0u8; 100];
    h2.read_exact_at(&mut b, 0).unwrap();
    assert_eq!(&b[..], &data[..100]);
    drop(h2);

    // A new file of the same name is a different, empty file.
    fs::write(&f, b"new").unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"new");
}

#[test]
fn rename_semantics() {
    let e = start("");
    let p = |s: &str| e.m.path(s);
    fs::create_dir(p("d1")).unwrap();
    fs::create_dir(p("d2")).unwrap();
    fs::write(p("d1/a"), b"AAA").unwrap();
    fs::write(p("d2/b"), b"BBB").unwrap();
    let ino_a = fs::metadata(p("d1/a")).unwrap().ino();

    // Across directories, replacing an existing target.
    fs::rename(p("d1/a"), p("d2/b")).unwrap();
    assert_eq!(errno(fs::metadata(p("d1/a"))), libc::ENOENT);
    assert_eq!(fs::read(p("d2/b")).unwrap(), b"AAA");
    assert_eq!(fs::metadata(p("d2/b")).unwrap().ino(), ino_a);

    // Directories move too, with their contents.
    fs::create_dir(p("d1/sub")).unwrap();
    fs::write(p("d1/sub/f"), b"in sub").unwrap();
    fs::rename(p("d1/sub"), p("d2/moved")).unwrap();
    assert_eq!(fs::read(p("d2/moved/f")).unwrap(), b"in sub");
    assert_eq!(errno(fs::metadata(p("d1/sub"))), libc::ENOENT);
    // Replacing an empty directory works, a non-empty one does not.
    fs::create_dir(p("d1/empty")).unwrap();
    fs::rename(p("d2/moved"), p("d1/empty")).unwrap();
    assert_eq!(fs::read(p("d1/empty/f")).unwrap(), b"in sub");
    fs::create_dir(p("d2/x")).unwrap();
    assert_eq!(errno(fs::rename(p("d2/x"), p("d1/empty"))), libc::ENOTEMPTY);
    // Kind mismatches and moving a directory under itself.
    assert_eq!(errno(fs::rename(p("d2/x"), p("d2/b"))), libc::ENOTDIR);
    assert_eq!(errno(fs::rename(p("d2/b"), p("d2/x"))), libc::EISDIR);
    assert_eq!(errno(fs::rename(p("d1"), p("d1/empty/inside"))), libc::EINVAL);
    assert_eq!(errno(fs::rename(p("nope"), p("d2/y"))), libc::ENOENT);
    // Link counts of the directories follow subdirectory moves.
    assert_eq!(fs::metadata(p("d1")).unwrap().nlink(), 3, "d1 holds one subdirectory");
    assert_eq!(fs::metadata(p("d2")).unwrap().nlink(), 3, "d2 holds one subdirectory");

    // RENAME_NOREPLACE.
    fs::write(p("n1"), b"1").unwrap();
    fs::write(p("n2"), b"2").unwrap();
    let renameat2 = |from: &str, to: &str, flags: u32| -> i32 {
        let (a, b) = (cpath(&p(from)), cpath(&p(to)));
        // SAFETY: valid C strings; AT_FDCWD with absolute paths.
        let r = unsafe {
            libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags)
        };
        if r == 0 {
            0
        } else {
            last_errno()
        }
    };
    assert_eq!(renameat2("n1", "n2", libc::RENAME_NOREPLACE), libc::EEXIST);
    assert_eq!(fs::read(p("n2")).unwrap(), b"2", "NOREPLACE left the target alone");
    assert_eq!(renameat2("n1", "n3", libc::RENAME_NOREPLACE), 0);
    assert_eq!(fs::read(p("n3")).unwrap(), b"1");

    // Atomic replace: a reader opening the name while it is replaced again and again
    // always finds a whole version, never a missing or partial file.
    let v = |i: u8| vec![i; 100_000];
    fs::write(p("live"), v(0)).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let live = p("live");
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let d = fs::read(&live).expect("the name never disappears");
                assert_eq!(d.len(), 100_000, "a whole version");
                assert!(d.iter().all(|&b| b == d[0]), "one version, not a mix");
                reads += 1;
            }
            reads
        })
    };
    for i in 1..=30u8 {
        fs::write(p("tmp"), v(i)).unwrap();
        fs::rename(p("tmp"), p("live")).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().expect("reader saw only whole versions");
    assert!(reads > 0);
    assert_eq!(fs::read(p("live")).unwrap(), v(30));
}

#[test]
fn symlinks_and_hard_links() {
    let e = start("");
    let p = |s: &str| e.m.path(s);
    fs::create_dir(p("dir")).unwrap();
    fs::write(p("dir/target"), b"target data").unwrap();

    std::os::unix::fs::symlink("dir/target", p("ln")).unwrap();
    assert_eq!(fs::read_link(p("ln")).unwrap(), Path::new("dir/target"));
    assert!(fs::symlink_metadata(p("ln")).unwrap().file_type().is_symlink());
    assert_eq!(fs::symlink_metadata(p("ln")).unwrap().len(), "dir/target".len() as u64);
    assert_eq!(fs::read(p("ln")).unwrap(), b"target data");
    assert_eq!(errno(std::os::unix::fs::symlink("x", p("ln"))), libc::EEXIST);
    assert_eq!(errno(fs::read_link(p("dir/target"))), libc::EINVAL);
    std::os::unix::fs::symlink("nowhere", p("dangling")).unwrap();
    assert_eq!(errno(fs::read(p("dangling"))), libc::ENOENT);
    fs::remove_file(p("ln")).unwrap();
    assert_eq!(fs::read(p("dir/target")).unwrap(), b"target data", "removing a symlink leaves the target");

    // Hard links: one inode, link count and attributes right through every name.
    fs::hard_link(p("dir/target"), p("h1")).unwrap();
    fs::hard_link(p("dir/target"), p("dir/h2")).unwrap();
    let names = ["dir/target", "h1", "dir/h2"];
    let ino = fs::metadata(p("h1")).unwrap().ino();
    for n in names {
        let m = fs::metadata(p(n)).unwrap();
        assert_eq!(m.nlink(), 3, "{n}");
        assert_eq!(m.ino(), ino, "{n}");
    }
    fs::set_permissions(p("h1"), fs::Permissions::from_mode(0o604)).unwrap();
    OpenOptions::new().append(true).open(p("dir/h2")).unwrap().write_all(b"+more").unwrap();
    for n in names {
        let m = fs::metadata(p(n)).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o604, "{n}");
        assert_eq!(m.len(), 16, "{n}");
        assert_eq!(fs::read(p(n)).unwrap(), b"target data+more", "{n}");
    }
    fs::remove_file(p("dir/target")).unwrap();
    for n in ["h1", "dir/h2"] {
        assert_eq!(fs::metadata(p(n)).unwrap().nlink(), 2, "{n}");
    }
    fs::rename(p("h1"), p("dir/h2")).unwrap(); // Same inode: rename is a no-op (POSIX).
    assert_eq!(fs::read(p("dir/h2")).unwrap(), b"target data+more");
    fs::remove_file(p("h1")).ok();
    assert_eq!(fs::metadata(p("dir/h2")).unwrap().nlink(), 1);
    assert_eq!(errno(fs::hard_link(p("dir"), p("dirlink"))), libc::EPERM);
    assert_eq!(errno(fs::hard_link(p("missing"), p("x"))), libc::ENOENT);
    assert_eq!(errno(fs::hard_link(p("dir/h2"), p("dir/h2"))), libc::EEXIST);
}

#[test]
fn chmod_chown_and_times() {
    let e = start("");
    let f = e.m.path("f");
    fs::write(&f, b"x").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o4751)).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o4751);
    std::os::unix::fs::chown(&f, Some(1234), Some(5678)).unwrap();
    let m = fs::metadata(&f).unwrap();
    assert_eq!((m.uid(), m.gid()), (1234, 5678));
    std::os::unix::fs::chown(&f, None, Some(42)).unwrap();
    let m = fs::metadata(&f).unwrap();
    assert_eq!((m.uid(), m.gid()), (1234, 42));

    let c = cpath(&f);
    let ts = |sec: i64, nsec: i64| libc::timespec { tv_sec: sec, tv_nsec: nsec };
    let utimens = |t: [libc::timespec; 2]| {
        // SAFETY: valid C string and two timespecs.
        let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), t.as_ptr(), 0) };
        assert_eq!(r, 0, "utimensat: errno {}", last_errno());
    };
    utimens([ts(1_000_000_000, 123_456_789), ts(1_100_000_000, 987_654_321)]);
    let m = fs::metadata(&f).unwrap();
    assert_eq!((m.atime(), m.atime_nsec()), (1_000_000_000, 123_456_789));
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_100_000_000, 987_654_321));
    // UTIME_OMIT leaves one alone, UTIME_NOW sets the other to now.
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    utimens([ts(0, libc::UTIME_OMIT), ts(0, libc::UTIME_NOW)]);
    let m = fs::metadata(&f).unwrap();
    assert_eq!((m.atime(), m.atime_nsec()), (1_000_000_000, 123_456_789), "UTIME_OMIT kept atime");
    assert!(m.mtime() >= before - 5 && m.mtime() <= before + 60, "UTIME_NOW: mtime {} vs now {before}", m.mtime());
    utimens([ts(0, libc::UTIME_NOW), ts(0, libc::UTIME_OMIT)]);
    let m2 = fs::metadata(&f).unwrap();
    assert!(m2.atime() >= before - 5, "UTIME_NOW set atime");
    assert_eq!((m2.mtime(), m2.mtime_nsec()), (m.mtime(), m.mtime_nsec()), "UTIME_OMIT kept mtime");
    // Times before the epoch survive too.
    utimens([ts(-86_400, 0), ts(-1, 0)]);
    let m = fs::metadata(&f).unwrap();
    assert_eq!((m.atime(), m.mtime()), (-86_400, -1));

    // A write moves mtime forward; chmod moves ctime.
    utimens([ts(1_000, 0), ts(1_000, 0)]);
    fs::write(&f, b"changed").unwrap();
    assert!(fs::metadata(&f).unwrap().mtime() >= before - 5, "write updated mtime");
    let ctime0 = fs::metadata(&f).unwrap().ctime();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    assert!(fs::metadata(&f).unwrap().ctime() >= ctime0);

    // Directories and symlinks carry attributes too.
    fs::create_dir(e.m.path("d")).unwrap();
    fs::set_permissions(e.m.path("d"), fs::Permissions::from_mode(0o1777)).unwrap();
    assert_eq!(fs::metadata(e.m.path("d")).unwrap().mode() & 0o7777, 0o1777);
    assert!(fs::metadata(e.m.path("d")).unwrap().is_dir());
}

#[test]
fn xattrs_user_and_trusted() {
    let e = start("");
    let f = e.m.path("f");
    fs::write(&f, b"x").unwrap();
    let c = cpath(&f);
    let set = |name: &str, v: &[u8], flags: i32| -> i32 {
        let n = CString::new(name).unwrap();
        // SAFETY: valid C strings and buffer.
        let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), flags) };
        if r == 0 {
            0
        } else {
            last_errno()
        }
    };
    let get = |name: &str, cap: usize| -> Result<Vec<u8>, i32> {
        let n = CString::new(name).unwrap();
        let mut buf = vec![0u8; cap];
        // SAFETY: valid C strings and buffer of `cap` bytes.
        let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), cap) };
        if r < 0 {
            Err(last_errno())
        } else {
            buf.truncate(if cap == 0 { 0 } else { r as usize });
            if cap == 0 {
                buf = vec![0; r as usize];
            }
            Ok(buf)
        }
    };
    let list = || -> Vec<String> {
        let mut buf = vec![0u8; 4096];
        // SAFETY: valid C string and buffer.
        let r = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert!(r >= 0, "listxattr: errno {}", last_errno());
        let mut v: Vec<String> = buf[..r as usize]
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        v.sort();
        v
    };

    assert_eq!(set("user.color", b"blue", 0), 0);
    assert_eq!(get("user.color", 100).unwrap(), b"blue");
    assert_eq!(get("user.color", 0).unwrap().len(), 4, "size query");
    assert_eq!(get("user.color", 2), Err(libc::ERANGE));
    assert_eq!(get("user.none", 100), Err(libc::ENODATA));
    assert_eq!(set("user.color", b"red", libc::XATTR_CREATE), libc::EEXIST);
    assert_eq!(set("user.other", b"v", libc::XATTR_REPLACE), libc::ENODATA);
    assert_eq!(set("user.color", b"red", libc::XATTR_REPLACE), 0);
    assert_eq!(get("user.color", 100).unwrap(), b"red");
    let big = pattern(4000, 3);
    assert_eq!(set("user.big", &big, 0), 0);
    assert_eq!(get("user.big", 8192).unwrap(), big);
    assert_eq!(set("user.empty", b"", 0), 0);
    assert_eq!(get("user.empty", 10).unwrap(), b"");
    assert_eq!(set("trusted.secret", b"s", 0), 0, "root may set trusted.*");
    assert_eq!(get("trusted.secret", 10).unwrap(), b"s");
    assert_eq!(list(), vec!["trusted.secret", "user.big", "user.color", "user.empty"]);

    let n = CString::new("user.color").unwrap();
    // SAFETY: valid C strings.
    assert_eq!(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) }, 0);
    assert_eq!(get("user.color", 100), Err(libc::ENODATA));
    // SAFETY: valid C strings.
    assert_eq!(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) }, -1);
    assert_eq!(last_errno(), libc::ENODATA);
    assert_eq!(list(), vec!["trusted.secret", "user.big", "user.empty"]);
    // xattrs on directories too, and they go with the inode through a rename.
    fs::create_dir(e.m.path("d")).unwrap();
    let d = cpath(&e.m.path("d"));
    let k = CString::new("user.k").unwrap();
    // SAFETY: valid C strings and buffer.
    assert_eq!(unsafe { libc::setxattr(d.as_ptr(), k.as_ptr(), b"dv".as_ptr().cast(), 2, 0) }, 0);
    fs::rename(&f, e.m.path("d/f2")).unwrap();
    let c2 = cpath(&e.m.path("d/f2"));
    let t = CString::new("trusted.secret").unwrap();
    let mut buf = [0u8; 8];
    // SAFETY: valid C strings and buffer.
    let r = unsafe { libc::getxattr(c2.as_ptr(), t.as_ptr(), buf.as_mut_ptr().cast(), 8) };
    assert_eq!(r, 1);
    assert_eq!(buf[0], b's');
}

#[test]
fn o_direct_fallocate_sparse_and_large_files() {
    let e = start("");
    // O_DIRECT with aligned buffers.
    let f = e.m.path("direct");
    let layout = std::alloc::Layout::from_size_align(1 << 20, 4096).unwrap();
    // SAFETY: non-zero size; freed below with the same layout.
    let ptr = unsafe { std::alloc::alloc(layout) };
    assert!(!ptr.is_null());
    // SAFETY: ptr is valid for 1 MiB.
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, 1 << 20) };
    buf.copy_from_slice(&pattern(1 << 20, 4));
    let h = OpenOptions::new().read(true).write(true).create(true).custom_flags(libc::O_DIRECT).open(&f).unwrap();
    h.write_all_at(buf, 0).unwrap();
    h.write_all_at(&buf[..4096], 1 << 20).unwrap();
    let want = buf.to_vec();
    buf.fill(0);
    h.read_exact_at(buf, 0).unwrap();
    same(buf, &want, "O_DIRECT read");
    drop(h);
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(ptr, layout) };
    let all = fs::read(&f).unwrap();
    assert_eq!(all.len(), (1 << 20) + 4096);
    same(&all[..1 << 20], &want, "O_DIRECT data");
    same(&all[1 << 20..], &want[..4096], "O_DIRECT tail");

    // fallocate: allocation extends the size (zeros), KEEP_SIZE does not, PUNCH_HOLE zeroes.
    let g = e.m.path("falloc");
    let data = pattern(3 << 20, 5);
    fs::write(&g, &data).unwrap();
    let h = OpenOptions::new().read(true).write(true).open(&g).unwrap();
    let fd = h.as_raw_fd();
    // SAFETY: fallocate on an open descriptor.
    assert_eq!(unsafe { libc::fallocate(fd, 0, 0, 4 << 20) }, 0, "fallocate: errno {}", last_errno());
    assert_eq!(h.metadata().unwrap().len(), 4 << 20);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 0, 8 << 20) }, 0);
    assert_eq!(h.metadata().unwrap().len(), 4 << 20, "KEEP_SIZE keeps the size");
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fallocate(fd, mode, 100_000, 1_500_000) }, 0, "punch: errno {}", last_errno());
    assert_eq!(h.metadata().unwrap().len(), 4 << 20, "punching keeps the size");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE, 0, 10) }, -1);
    assert_eq!(last_errno(), libc::EOPNOTSUPP, "PUNCH_HOLE needs KEEP_SIZE (as on Linux)");
    drop(h);
    let got = fs::read(&g).unwrap();
    assert_eq!(got.len(), 4 << 20);
    same(&got[..100_000], &data[..100_000], "before the hole");
    assert!(got[100_000..1_600_000].iter().all(|&b| b == 0), "hole reads as zeros");
    same(&got[1_600_000..3 << 20], &data[1_600_000..], "after the hole");
    assert!(got[3 << 20..].iter().all(|&b| b == 0), "allocated tail reads as zeros");

    // Sparse file larger than 4 GiB: bytes beyond 2^32 land where written.
    let s = e.m.path("sparse");
    let h = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&s).unwrap();
    let far = (5u64 << 30) + 12_345;
    let rec = pattern(70_000, 6);
    h.write_all_at(&rec, far).unwrap();
    h.write_all_at(b"start", 0).unwrap();
    h.write_all_at(b"4g", 1 << 32).unwrap();
    assert_eq!(h.metadata().unwrap().len(), far + 70_000);
    drop(h);
    assert_eq!(fs::metadata(&s).unwrap().len(), far + 70_000);
    let h = File::open(&s).unwrap();
    let mut b = vec![0u8; 70_000];
    h.read_exact_at(&mut b, far).unwrap();
    same(&b, &rec, "record past 4 GiB");
    let mut b = [0u8; 8];
    h.read_exact_at(&mut b, (1 << 32) - 3).unwrap();
    assert_eq!(&b, &[0, 0, 0, b'4', b'g', 0, 0, 0]);
    let mut b = vec![0xffu8; 1 << 20];
    h.read_exact_at(&mut b, 3 << 30).unwrap();
    assert!(b.iter().all(|&x| x == 0), "a hole in the middle reads as zeros");
    let mut b = [0u8; 7];
    h.read_exact_at(&mut b, 0).unwrap();
    assert_eq!(&b, b"start\0\0");
    // Reading at EOF returns 0 bytes.
    let mut b = [0u8; 16];
    assert_eq!(h.read_at(&mut b, far + 70_000).unwrap(), 0);
    // Sparse: the servers did not store the holes.
    let stored: u64 = (0..4).flat_map(|i| e.c.ost_objects(i)).map(|p| fs::metadata(p).unwrap().blocks() * 512).sum();
    assert!(stored < 1 << 30, "holes are not stored: {stored} bytes on the OSTs");
}

#[test]
fn mmap_reads_and_shared_writes() {
    let e = start("");
    let f = e.m.path("mapped");
    let data = pattern(3 * 4096 + 100, 7);
    fs::write(&f, &data).unwrap();
    let h = OpenOptions::new().read(true).write(true).open(&f).unwrap();
    let len = data.len();
    // SAFETY: mapping an open file for its length; unmapped below.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, h.as_raw_fd(), 0)
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap: errno {}", last_errno());
    // SAFETY: p maps len bytes.
    let map = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
    same(map, &data, "mmap reads the file");
    map[10..15].copy_from_slice(b"MMAP!");
    map[len - 3..].copy_from_slice(b"END");
    // SAFETY: p maps len bytes.
    assert_eq!(unsafe { libc::msync(p, len, libc::MS_SYNC) }, 0, "msync: errno {}", last_errno());
    // SAFETY: unmapping what we mapped.
    unsafe { libc::munmap(p, len) };
    drop(h);
    let mut want = data.clone();
    want[10..15].copy_from_slice(b"MMAP!");
    want[len - 3..].copy_from_slice(b"END");
    assert_eq!(fs::metadata(&f).unwrap().len(), len as u64, "shared writes keep the size");
    same(&fs::read(&f).unwrap(), &want, "shared mmap writes reach the file");
    // And they are on the servers, not only in this kernel's page cache.
    same(&e.c.get("/mapped"), &want, "the native client reads the mmap writes");

    // A private mapping's writes stay private.
    let h = File::open(&f).unwrap();
    // SAFETY: as above.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE, h.as_raw_fd(), 0)
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: p maps len bytes.
    unsafe { *p.cast::<u8>() = b'#' };
    // SAFETY: unmapping what we mapped.
    unsafe { libc::munmap(p, len) };
    same(&fs::read(&f).unwrap(), &want, "private mapping");
}

#[test]
fn xattr_unknown_namespace_is_eopnotsupp() {
    let e = start("");
    let f = e.m.path("f");
    fs::write(&f, b"x").unwrap();
    let (c, n) = (cpath(&f), CString::new("bogus.name").unwrap());
    // SAFETY: valid C strings and buffer.
    let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    // Linux file systems return EOPNOTSUPP for a namespace they do not support.
    assert_eq!((r, last_errno()), (-1, libc::EOPNOTSUPP));
    let mut buf = [0u8; 8];
    // SAFETY: valid C strings and buffer.
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), 8) };
    assert_eq!((r, last_errno()), (-1, libc::EOPNOTSUPP));
}

#[test]
fn files_read_then_removed_leave_no_objects_behind() {
    // The kernel sends RELEASE once every read of a file is answered, which can be
    // before the thread that answered the last read let go of the handle. The close must
    // reach the MDS anyway, or it counts the file open until unmount and never
    // destroys it after the unlink.
    let e = start("");
    let objects = |c: &Cluster| -> usize {
        (0..4)
            .flat_map(|k| fs::read_dir(c.dir.path().join(format!("ost{k}/objects"))).unwrap())
            .flat_map(|b| fs::read_dir(b.unwrap().path()).unwrap())
            .count()
    };
    let data = pattern(8 << 20, 5);
    for round in 0..12 {
        let f = e.m.path(&format!("read-then-removed-{round}"));
        fs::write(&f, &data).unwrap();
        // Two readers at once, with the kernel's read-ahead: many READs in flight.
        let (a, b) = (f.clone(), f.clone());
        let t = std::thread::spawn(move || fs::read(a).unwrap().len());
        assert_eq!(fs::read(&b).unwrap().len(), data.len());
        assert_eq!(t.join().unwrap(), data.len());
        fs::remove_file(&f).unwrap();
    }
    testkit::wait_for("every object of the removed files destroyed", std::time::Duration::from_secs(20), || {
        objects(&e.c) == 0
    });
}

#[test]
fn special_files_are_namespace_only_inodes() {
    let e = start("");
    let (fifo, chr, blk, sock) = (e.m.path("fifo"), e.m.path("chr"), e.m.path("blk"), e.m.path("sock"));
    // SAFETY: mkfifo/mknod of NUL-terminated paths.
    unsafe {
        assert_eq!(libc::mkfifo(cpath(&fifo).as_ptr(), 0o640), 0, "mkfifo: errno {}", last_errno());
        assert_eq!(libc::mknod(cpath(&chr).as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)), 0);
        assert_eq!(libc::mknod(cpath(&blk).as_ptr(), libc::S_IFBLK | 0o640, libc::makedev(8, 17)), 0);
    }
    let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind a UNIX socket in the mount");
    let kinds = [
        (&fifo, libc::S_IFIFO, 0o640, 0),
        (&chr, libc::S_IFCHR, 0o600, libc::makedev(1, 3)),
        (&blk, libc::S_IFBLK, 0o640, libc::makedev(8, 17)),
    ];
    for (p, kind, perm, rdev) in kinds {
        let m = fs::symlink_metadata(p).unwrap();
        assert_eq!(m.mode() & libc::S_IFMT, kind, "{p:?}: type");
        assert_eq!(m.mode() & 0o7777, perm, "{p:?}: permissions");
        assert_eq!(m.rdev(), rdev, "{p:?}: device number");
    }
    assert_eq!(fs::symlink_metadata(&sock).unwrap().mode() & libc::S_IFMT, libc::S_IFSOCK);
    // The socket works: the kernel connects through the name in the mount.
    let client = std::os::unix::net::UnixStream::connect(&sock).expect("connect through the mount");
    let (mut server, _) = listener.accept().unwrap();
    (&client).write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    server.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    // So does the FIFO (the kernel's pipe, named by the mount).
    let reader = std::thread::spawn({
        let fifo = fifo.clone();
        move || fs::read(fifo).unwrap()
    });
    fs::write(&fifo, b"through the fifo").unwrap();
    assert_eq!(reader.join().unwrap(), b"through the fifo");

    // Renamed, linked, chmodded, chowned and listed like any other file.
    fs::create_dir(e.m.path("dir")).unwrap();
    fs::rename(&chr, e.m.path("dir/chr2")).unwrap();
    fs::hard_link(e.m.path("dir/chr2"), e.m.path("chr-link")).unwrap();
    assert_eq!(fs::symlink_metadata(e.m.path("chr-link")).unwrap().nlink(), 2);
    fs::set_permissions(&blk, fs::Permissions::from_mode(0o604)).unwrap();
    std::os::unix::fs::lchown(&fifo, Some(1234), Some(5678)).unwrap();
    let m = fs::symlink_metadata(&fifo).unwrap();
    assert_eq!((m.uid(), m.gid()), (1234, 5678));
    assert_eq!(fs::symlink_metadata(&blk).unwrap().mode() & 0o7777, 0o604);
    let types: std::collections::BTreeMap<String, bool> = fs::read_dir(e.m.dir.clone())
        .unwrap()
        .map(|d| {
            let d = d.unwrap();
            let t = d.file_type().unwrap();
            use std::os::unix::fs::FileTypeExt;
            (
                d.file_name().into_string().unwrap(),
                t.is_fifo() || t.is_char_device() || t.is_block_device() || t.is_socket(),
            )
        })
        .collect();
    for name in ["fifo", "blk", "sock", "chr-link"] {
        assert_eq!(types.get(name), Some(&true), "readdir reports {name} as a special file: {types:?}");
    }
    // Truncating one is refused as on Linux; none ever reached an OST.
    assert_eq!(
        errno(OpenOptions::new().write(true).open(e.m.path("dir/chr2")).and_then(|f| f.set_len(0))),
        libc::EACCES
    );
    let objects: usize = (0..4).map(|i| e.c.ost_objects(i).len()).sum();
    assert_eq!(objects, 0, "special files have no objects");
    for p in [e.m.path("dir/chr2"), e.m.path("chr-link"), blk, sock, fifo] {
        fs::remove_file(&p).unwrap();
    }
    assert_eq!(fs::read_dir(e.m.dir.clone()).unwrap().count(), 1, "only dir is left");
}

#[test]
fn rename_exchange_swaps_two_names_atomically() {
    let e = start("");
    fs::create_dir_all(e.m.path("a/sub")).unwrap();
    fs::create_dir(e.m.path("b")).unwrap();
    fs::write(e.m.path("b/file"), b"file").unwrap();
    fs::write(e.m.path("a/other"), b"other").unwrap();
    let exchange = |from: &str, to: &str| {
        // SAFETY: renameat2 of NUL-terminated paths.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                cpath(&e.m.path(from)).as_ptr(),
                libc::AT_FDCWD,
                cpath(&e.m.path(to)).as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if r == 0 {
            0
        } else {
            last_errno()
        }
    };
    // Two files in two directories.
    assert_eq!(exchange("a/other", "b/file"), 0);
    assert_eq!(fs::read(e.m.path("a/other")).unwrap(), b"file");
    assert_eq!(fs::read(e.m.path("b/file")).unwrap(), b"other");
    // A directory and a file across directories: `..` and the link counts follow.
    let nlink = |p: &str| fs::metadata(e.m.path(p)).unwrap().nlink();
    assert_eq!((nlink("a"), nlink("b")), (3, 2));
    assert_eq!(exchange("a/sub", "b/file"), 0);
    assert!(fs::metadata(e.m.path("b/file")).unwrap().is_dir());
    assert!(fs::metadata(e.m.path("a/sub")).unwrap().is_file());
    assert_eq!((nlink("a"), nlink("b")), (2, 3), "the directory's `..` moved from a to b");
    fs::write(e.m.path("b/file/inside"), b"x").unwrap();
    assert_eq!(fs::read(e.m.path("b/file/inside")).unwrap(), b"x");
    // A missing target, and a directory swapped under itself, are refused.
    assert_eq!(exchange("a/sub", "b/missing"), libc::ENOENT);
    assert_eq!(exchange("b", "b/file/inside"), libc::EINVAL);
    assert!(fs::metadata(e.m.path("b/file/inside")).unwrap().is_file(), "a refused exchange changes nothing");
}
