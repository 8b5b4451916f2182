//! Permission checks for non-root users through a real FUSE mount: `allow_other`,
//! owner/group/other bits, supplementary groups, directory search and write bits,
//! sticky directories, setgid inheritance, chmod/chown/utimensat rules, trusted.* xattrs.
//!
//! Calls run on a thread whose filesystem uid/gid and groups are switched with the raw
//! per-thread syscalls (setfsuid, setfsgid, setgroups), so each check sees the exact
//! errno; `allow_other` is checked with child processes running under another uid.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::{code, last_errno, Cluster, ClusterSpec, Mount, MountedCluster};

fn start(opts: &str) -> MountedCluster {
    MountedCluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), opts)
}

/// Runs `f` on a new thread acting as `uid:gid` with supplementary `groups` for file
/// access (the thread's fsuid/fsgid; raw syscalls change only the calling thread).
fn as_user<T: Send + 'static>(uid: u32, gid: u32, groups: &[u32], f: impl FnOnce() -> T + Send + 'static) -> T {
    let groups: Vec<libc::gid_t> = groups.to_vec();
    std::thread::spawn(move || {
        // SAFETY: raw per-thread credential syscalls with valid arguments.
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()), 0);
            libc::syscall(libc::SYS_setfsgid, gid);
            libc::syscall(libc::SYS_setfsuid, uid);
            assert_eq!(libc::syscall(libc::SYS_setfsuid, -1i32 as u32) as u32, uid, "fsuid switched");
        }
        f()
    })
    .join()
    .expect("user thread")
}

fn read(p: &Path) -> i32 {
    code(File::open(p))
}

fn write(p: &Path) -> i32 {
    code(OpenOptions::new().write(true).open(p))
}

fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn owner_group_other_bits() {
    let e = start("allow_other");
    let f = e.m.path("f");
    fs::write(&f, b"secret").unwrap();
    chown(&f, 1000, 2000);
    chmod(&f, 0o640);
    let g = f.clone();
    // Owner: rw.
    assert_eq!(as_user(1000, 1000, &[], move || (read(&g), write(&g))), (0, 0));
    // Group member by primary gid: r only.
    let g = f.clone();
    assert_eq!(as_user(1001, 2000, &[], move || (read(&g), write(&g))), (0, libc::EACCES));
    // Group member by a supplementary group.
    let g = f.clone();
    assert_eq!(as_user(1002, 3000, &[2000], move || (read(&g), write(&g))), (0, libc::EACCES));
    // Other: nothing.
    let g = f.clone();
    assert_eq!(as_user(1003, 3000, &[], move || (read(&g), write(&g))), (libc::EACCES, libc::EACCES));
    // The owner bits apply to the owner even when group/other bits are wider.
    chmod(&f, 0o077);
    let g = f.clone();
    assert_eq!(as_user(1000, 2000, &[], move || read(&g)), libc::EACCES);
    // Root reads anyway.
    assert_eq!(read(&f), 0);
    chmod(&f, 0o640);

    // Execute bit and O_TRUNC need their bits too.
    let g = f.clone();
    assert_eq!(
        as_user(1001, 2000, &[], move || code(OpenOptions::new().write(true).truncate(true).open(&g))),
        libc::EACCES
    );
    assert_eq!(fs::read(&f).unwrap(), b"secret", "a refused O_TRUNC left the data");
    let g = f.clone();
    let acc = as_user(1000, 1000, &[], move || {
        let c = CString::new(g.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid C string.
        let x = unsafe { libc::access(c.as_ptr(), libc::X_OK) };
        (x, last_errno())
    });
    assert_eq!(acc, (-1, libc::EACCES));

    // Directories: search (x) and write (w) bits.
    let d = e.m.path("d");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("inner"), b"in").unwrap();
    chmod(&d.join("inner"), 0o644);
    chmod(&d, 0o755);
    let dd = d.clone();
    let r = as_user(1000, 1000, &[], move || {
        (code(File::create(dd.join("new"))), code(fs::remove_file(dd.join("inner"))), code(fs::read(dd.join("inner"))))
    });
    assert_eq!(r, (libc::EACCES, libc::EACCES, 0), "no w on the directory: no create, no unlink; reading is fine");
    chmod(&d, 0o700);
    let dd = d.clone();
    let r = as_user(1000, 1000, &[], move || {
        (code(fs::metadata(dd.join("inner"))), code(fs::read_dir(&dd)), code(fs::create_dir(dd.join("x"))))
    });
    assert_eq!(r, (libc::EACCES, libc::EACCES, libc::EACCES), "no x: no lookup; no r: no listing");
    chmod(&d, 0o711);
    let dd = d.clone();
    let r = as_user(1000, 1000, &[], move || (code(fs::read(dd.join("inner"))), code(fs::read_dir(&dd))));
    assert_eq!(r, (0, libc::EACCES), "x without r: open a known name, not list");
    chmod(&d, 0o777);
    let dd = d.clone();
    let r = as_user(1000, 1000, &[], move || {
        File::create(dd.join("mine")).unwrap().write_all(b"m").unwrap();
        fs::create_dir(dd.join("mydir")).unwrap();
        code(fs::remove_file(dd.join("inner")))
    });
    assert_eq!(r, 0, "w+x on a plain directory lets anyone unlink");
    let m = fs::metadata(d.join("mine")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1000, 1000), "new files belong to the caller");
    assert_eq!(fs::metadata(d.join("mydir")).unwrap().uid(), 1000);
}

#[test]
fn chmod_chown_utimens_rules_and_trusted_xattrs() {
    let e = start("allow_other");
    let f = e.m.path("f");
    fs::write(&f, b"x").unwrap();
    chown(&f, 1000, 1000);
    chmod(&f, 0o666);
    let g = f.clone();
    // Non-owner may not chmod; non-root may not chown to someone else.
    assert_eq!(
        as_user(1001, 1001, &[], move || code(fs::set_permissions(&g, fs::Permissions::from_mode(0o777)))),
        libc::EPERM
    );
    let g = f.clone();
    assert_eq!(as_user(1000, 1000, &[], move || code(std::os::unix::fs::chown(&g, Some(1001), None))), libc::EPERM);
    // The owner may chmod, and chgrp to a group it belongs to, not to another.
    let g = f.clone();
    let r = as_user(1000, 1000, &[4000], move || {
        (
            code(fs::set_permissions(&g, fs::Permissions::from_mode(0o640))),
            code(std::os::unix::fs::chown(&g, None, Some(4000))),
            code(std::os::unix::fs::chown(&g, None, Some(5000))),
        )
    });
    assert_eq!(r, (0, 0, libc::EPERM));
    let m = fs::metadata(&f).unwrap();
    assert_eq!((m.mode() & 0o7777, m.uid(), m.gid()), (0o640, 1000, 4000));

    // utimensat: anyone with write permission may set both times to now; only the
    // owner (or root) may set explicit times.
    chmod(&f, 0o666);
    let utimens = |p: PathBuf, now: bool| {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        let t = if now {
            [libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW }; 2]
        } else {
            [libc::timespec { tv_sec: 12345, tv_nsec: 0 }; 2]
        };
        // SAFETY: valid C string and two timespecs.
        let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), t.as_ptr(), 0) };
        if r == 0 {
            0
        } else {
            last_errno()
        }
    };
    let g = f.clone();
    assert_eq!(as_user(1001, 1001, &[], move || utimens(g, true)), 0);
    let g = f.clone();
    assert_eq!(as_user(1001, 1001, &[], move || utimens(g, false)), libc::EPERM);
    let g = f.clone();
    assert_eq!(as_user(1000, 1000, &[], move || utimens(g, false)), 0);
    assert_eq!(fs::metadata(&f).unwrap().mtime(), 12345);
    chmod(&f, 0o644);
    let g = f.clone();
    assert_eq!(as_user(1001, 1001, &[], move || utimens(g, true)), libc::EACCES, "no write permission");

    // trusted.* is for root only; user.* follows the file's bits.
    let c = CString::new(f.as_os_str().as_bytes()).unwrap();
    let t = CString::new("trusted.k").unwrap();
    // SAFETY: valid C strings and buffer.
    assert_eq!(unsafe { libc::setxattr(c.as_ptr(), t.as_ptr(), b"v".as_ptr().cast(), 1, 0) }, 0);
    let g = f.clone();
    let r = as_user(1000, 1000, &[], move || {
        let c = CString::new(g.as_os_str().as_bytes()).unwrap();
        let (t, u) = (CString::new("trusted.k").unwrap(), CString::new("user.k").unwrap());
        let mut buf = [0u8; 256];
        // SAFETY: valid C strings and buffers.
        unsafe {
            let set_t = libc::setxattr(c.as_ptr(), t.as_ptr(), b"v".as_ptr().cast(), 1, 0);
            let set_t_err = last_errno();
            let get_t = libc::getxattr(c.as_ptr(), t.as_ptr(), buf.as_mut_ptr().cast(), 256);
            let get_t_err = last_errno();
            let set_u = libc::setxattr(c.as_ptr(), u.as_ptr(), b"v".as_ptr().cast(), 1, 0);
            let n = libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), 256);
            let listed = String::from_utf8_lossy(&buf[..n.max(0) as usize]).into_owned();
            (set_t, set_t_err, get_t, get_t_err, set_u, listed)
        }
    });
    assert_eq!((r.0, r.1), (-1, libc::EPERM), "non-root may not set trusted.*");
    assert_eq!((r.2, r.3), (-1, libc::ENODATA), "non-root does not see trusted.*");
    assert_eq!(r.4, 0, "the owner sets user.*");
    assert!(!r.5.contains("trusted."), "trusted.* not listed for non-root: {:?}", r.5);
    let g = f.clone();
    let r = as_user(1001, 1001, &[], move || {
        let c = CString::new(g.as_os_str().as_bytes()).unwrap();
        let u = CString::new("user.k").unwrap();
        // SAFETY: valid C strings and buffer.
        let r = unsafe { libc::setxattr(c.as_ptr(), u.as_ptr(), b"w".as_ptr().cast(), 1, 0) };
        (r, last_errno())
    });
    assert_eq!(r, (-1, libc::EACCES), "user.* needs write permission on the file");
}

#[test]
fn sticky_directories_and_setgid_inheritance() {
    let e = start("allow_other");
    let t = e.m.path("tmp");
    fs::create_dir(&t).unwrap();
    chmod(&t, 0o1777);
    let tt = t.clone();
    as_user(1000, 1000, &[], move || {
        fs::write(tt.join("a"), b"a").unwrap();
        fs::write(tt.join("b"), b"b").unwrap();
    });
    let tt = t.clone();
    let r = as_user(1001, 1001, &[], move || {
        (
            code(fs::remove_file(tt.join("a"))),
            code(fs::rename(tt.join("a"), tt.join("stolen"))),
            code(fs::write(tt.join("c"), b"c")),
            code(fs::rename(tt.join("c"), tt.join("b"))),
        )
    });
    assert_eq!(
        r,
        (libc::EPERM, libc::EPERM, 0, libc::EPERM),
        "sticky: others may not unlink, rename or replace files they do not own"
    );
    assert_eq!(fs::read(t.join("a")).unwrap(), b"a");
    assert_eq!(fs::read(t.join("b")).unwrap(), b"b");
    let tt = t.clone();
    assert_eq!(as_user(1000, 1000, &[], move || code(fs::remove_file(tt.join("a")))), 0, "the owner may");
    fs::remove_file(t.join("c")).unwrap(); // root may.

    // setgid directory: new entries take the directory's group; subdirectories keep setgid.
    let s = e.m.path("shared");
    fs::create_dir(&s).unwrap();
    chown(&s, 0, 2000);
    chmod(&s, 0o2777);
    assert_eq!(fs::metadata(&s).unwrap().mode() & 0o7777, 0o2777);
    let ss = s.clone();
    as_user(1000, 1000, &[], move || {
        fs::write(ss.join("f"), b"f").unwrap();
        fs::create_dir(ss.join("sub")).unwrap();
        std::os::unix::fs::symlink("f", ss.join("ln")).unwrap();
    });
    let m = fs::metadata(s.join("f")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1000, 2000), "file inherits the directory's group");
    let m = fs::metadata(s.join("sub")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1000, 2000), "subdirectory inherits the group");
    assert_ne!(m.mode() & 0o2000, 0, "subdirectory inherits setgid");
    // Outside a setgid directory the caller's gid applies.
    let tt = t.clone();
    as_user(1000, 1000, &[], move || fs::write(tt.join("plain"), b"p").unwrap());
    assert_eq!(fs::metadata(t.join("plain")).unwrap().gid(), 1000);
    // Symlinks too (Linux's inode_init_owner applies to every new inode).
    assert_eq!(fs::symlink_metadata(s.join("ln")).unwrap().gid(), 2000, "symlink inherits the group");
}

#[test]
fn allow_other_decides_whether_other_users_enter() {
    let c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default());
    let private = Mount::new(&c, "");
    let shared = Mount::new(&c, "allow_other");
    fs::write(shared.path("pub"), b"public data").unwrap();
    chmod(&shared.path("pub"), 0o644);
    let cat = |p: PathBuf| Command::new("cat").arg(p).uid(1000).gid(1000).output().expect("run cat as uid 1000");
    let out = cat(shared.path("pub"));
    assert!(out.status.success(), "allow_other lets uid 1000 in: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, b"public data");
    let out = cat(private.path("pub"));
    assert!(!out.status.success(), "without allow_other other users are refused");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "EACCES: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Root (the mounting user) still enters the private mount.
    assert_eq!(fs::read(private.path("pub")).unwrap(), b"public data");
    // A process of another user writes through allow_other with the file's bits.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("echo hi > {}", shared.path("pub").display()))
        .uid(1000)
        .gid(1000)
        .output()
        .unwrap();
    assert!(!out.status.success(), "0644 root file is not writable by uid 1000");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"));
    drop(private);
    drop(shared);
}

#[test]
fn a_write_by_a_non_owner_clears_set_id_bits_and_ftruncate_needs_only_the_descriptor() {
    let e = start("allow_other");
    let f = e.m.path("setid");
    fs::write(&f, b"0123456789").unwrap();
    chmod(&f, 0o6777);
    let target = f.clone();
    let written = as_user(1000, 1000, &[], move || {
        let h = OpenOptions::new().write(true).open(&target)?;
        std::os::unix::fs::FileExt::write_all_at(&h, b"x", 3)
    });
    assert_eq!(code(written), 0, "a non-owner who may write, writes");
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o0777, "and the set-id bits are gone");
    assert_eq!(fs::read(&f).unwrap(), b"012x456789");
    // Nobody but the owner sets them again, or changes other bits.
    chmod(&f, 0o6777);
    let target = f.clone();
    let chmodded = as_user(1000, 1000, &[], move || fs::set_permissions(&target, fs::Permissions::from_mode(0o777)));
    assert_eq!(code(chmodded), libc::EPERM, "chmod by a non-owner");
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o6777);

    // A file created mode 0 by its (non-root) owner, opened O_RDWR at creation:
    // ftruncate through that descriptor works, a new open for writing does not.
    let dir = e.m.path("d");
    fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o777);
    let g = dir.join("mode0");
    let path = g.clone();
    let r = as_user(1000, 1000, &[], move || {
        let h = OpenOptions::new().read(true).write(true).create_new(true).mode(0o000).open(&path)?;
        h.set_len(12345)?;
        let again = OpenOptions::new().write(true).open(&path).map(|_| ());
        Ok::<_, std::io::Error>(code(again))
    });
    assert_eq!(r.unwrap(), libc::EACCES, "reopening a mode-0 file for writing is refused");
    assert_eq!(fs::metadata(&g).unwrap().len(), 12345, "ftruncate through the creating descriptor");
}

/// A listing by a caller who may read the directory but not search it: the MDS lists
/// the names without their attributes (a lookup would be refused), the mount's own
/// lookups of them fail, and each entry goes to the kernel as a placeholder that it
/// must not keep. The names and kinds are listed, a stat is refused, and once the
/// caller may search the directory a stat gives the real attributes, not the
/// placeholder's.
#[test]
fn a_listing_without_search_permission_gives_names_and_kinds_and_no_attributes_to_keep() {
    let e = start("allow_other");
    let dir = e.m.path("readable");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("a"), b"hello").unwrap();
    chmod(&dir.join("a"), 0o640);
    fs::create_dir(dir.join("sub")).unwrap();
    chmod(&dir, 0o744);

    let listed = {
        let dir = dir.clone();
        as_user(1000, 1000, &[], move || {
            let mut v: Vec<(String, bool)> = fs::read_dir(&dir)
                .unwrap()
                .map(|e| {
                    let e = e.unwrap();
                    (e.file_name().into_string().unwrap(), e.file_type().unwrap().is_dir())
                })
                .collect();
            v.sort();
            v
        })
    };
    assert_eq!(listed, [("a".to_string(), false), ("sub".to_string(), true)]);
    let refused = {
        let a = dir.join("a");
        as_user(1000, 1000, &[], move || code(fs::metadata(&a)))
    };
    assert_eq!(refused, libc::EACCES, "no search permission on the directory");

    chmod(&dir, 0o755);
    let (size, mode, uid) = {
        let a = dir.join("a");
        as_user(1000, 1000, &[], move || {
            let m = fs::metadata(&a).expect("searchable now");
            (m.size(), m.mode() & 0o7777, m.uid())
        })
    };
    assert_eq!((size, mode, uid), (5, 0o640, 0), "the file's attributes, not the placeholder's");
}
