//! `braid migrate -m` (Lustre's `lfs migrate -m`) between two MDTs served by
//! separate `braid mds` processes: a tree's directories move to the other MDT with
//! their entries, attributes, extended attributes and default layouts, while a FUSE
//! mount keeps reading and writing in them; running it again moves nothing; and
//! each process killed with SIGKILL at every step of one directory's move leaves a
//! namespace the checker passes, which a second run finishes.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use testkit::{stderr, Cluster, Mount};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

/// The MDT holding `path`'s inode.
fn mdt_of(c: &Cluster, path: &str) -> u32 {
    c.braid_ok(&["getstripe", "-m", &c.url(path)]).trim().parse().expect("an MDT index")
}

/// What a directory shows, to compare before and after a move: mode, owner, times,
/// link count, entries with their kinds, inode numbers of files and contents.
fn picture(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let m = std::fs::symlink_metadata(dir).unwrap();
    out.push(format!(
        "{} dir {:o} {}:{} mtime {} nlink {}",
        dir.display(),
        m.mode(),
        m.uid(),
        m.gid(),
        m.mtime(),
        m.nlink()
    ));
    let mut names: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    for p in names {
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            out.extend(picture(&p));
        } else if m.file_type().is_symlink() {
            out.push(format!("{} -> {}", p.display(), std::fs::read_link(&p).unwrap().display()));
        } else {
            let data = std::fs::read(&p).unwrap();
            out.push(format!(
                "{} ino {} nlink {} {:?}",
                p.display(),
                m.ino(),
                m.nlink(),
                String::from_utf8_lossy(&data)
            ));
        }
    }
    out
}

fn cstr(s: &str) -> std::ffi::CString {
    std::ffi::CString::new(s).unwrap()
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let (p, n) = (cstr(path.to_str().unwrap()), cstr(name));
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let r = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(r, 0, "setxattr {}: {}", path.display(), std::io::Error::last_os_error());
}

fn get_xattr(path: &Path, name: &str) -> Vec<u8> {
    let (p, n) = (cstr(path.to_str().unwrap()), cstr(name));
    let mut buf = vec![0u8; 256];
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(r >= 0, "getxattr {}: {}", path.display(), std::io::Error::last_os_error());
    buf.truncate(r as usize);
    buf
}

#[test]
fn a_tree_moves_to_another_mdt_while_a_mount_reads_and_writes_in_it() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/proj")]);
    let m = Mount::new(&c, "");
    let root = m.path("proj");
    for d in ["a", "a/b", "a/b/c", "empty", "work"] {
        std::fs::create_dir(root.join(d)).unwrap();
    }
    for (f, data) in [("top", "top"), ("a/one", "1"), ("a/b/two", "22"), ("a/b/c/three", "333")] {
        std::fs::write(root.join(f), data).unwrap();
    }
    std::fs::hard_link(root.join("a/one"), root.join("a/b/one-again")).unwrap();
    std::os::unix::fs::symlink("../one", root.join("a/b/link")).unwrap();
    std::fs::set_permissions(root.join("a/b"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::chown(root.join("a/b/c"), Some(1000), Some(1000)).unwrap();
    c.braid_ok(&["setstripe", "-c", "1", "-S", "2M", &c.url("/proj/a")]);
    set_xattr(&root.join("a/b"), "user.note", b"kept");
    // proj/work is the writer's and proj/a/b/c the shell's below: their times move.
    let still = |p: Vec<String>| {
        let moving = |l: &String| l.contains("/proj/work") || l.contains("/proj/a/b/c dir");
        p.into_iter().filter(|l| !moving(l)).collect::<Vec<_>>()
    };
    let before = still(picture(&root));

    // A reader and a writer through the mount, by path, the whole time: the reader
    // reads every file, the writer makes and removes files in proj/work.
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (root, stop) = (root.clone(), stop.clone());
        std::thread::spawn(move || -> Result<u32, String> {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                for (f, data) in [("top", "top"), ("a/one", "1"), ("a/b/two", "22"), ("a/b/c/three", "333")] {
                    let got = std::fs::read_to_string(root.join(f)).map_err(|e| format!("read {f}: {e}"))?;
                    if got != data {
                        return Err(format!("{f} read {got:?}"));
                    }
                }
                let name = root.join(format!("work/f{rounds}"));
                std::fs::write(&name, format!("{rounds}")).map_err(|e| format!("create {}: {e}", name.display()))?;
                if rounds > 0 {
                    let old = root.join(format!("work/f{}", rounds - 1));
                    std::fs::remove_file(&old).map_err(|e| format!("remove {}: {e}", old.display()))?;
                }
                std::fs::read_dir(root.join("a/b")).map_err(|e| format!("list a/b: {e}"))?.count();
                rounds += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(rounds)
        })
    };
    // A shell whose working directory is proj/a/b/c from before the moves: it
    // carries on there after them (the kernel keeps the old directory's inode).
    let go = c.dir.path().join("go");
    let shell = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd {} && while [ ! -e {} ]; do sleep 0.05; done && cat three && ls && echo here > made && cat made",
            root.join("a/b/c").display(),
            go.display()
        ))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // Back and forth, back to back, so that the worker meets every step of some
    // move, and walks through directories that moved while it walked.
    let mut out = String::new();
    for to in ["1", "0", "1", "0", "1"] {
        out = c.braid_ok(&["migrate", "-m", to, "-v", &c.url("/proj")]);
        assert!(out.contains(&format!("6 directories moved to MDT {to}, 0 there already")), "{out}");
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let rounds = worker.join().unwrap().unwrap_or_else(|e| panic!("the mount's reader and writer: {e}\n{out}"));
    std::fs::write(&go, b"").unwrap();
    let shell = shell.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&shell.stdout),
        "333three\nhere\n",
        "the shell in proj/a/b/c: {}",
        String::from_utf8_lossy(&shell.stderr)
    );
    std::fs::remove_file(root.join("a/b/c/made")).unwrap();
    assert!(rounds > 10, "the worker went round {rounds} times");

    for d in ["/proj", "/proj/a", "/proj/a/b", "/proj/a/b/c", "/proj/empty", "/proj/work"] {
        assert_eq!(mdt_of(&c, d), 1, "{d} moved");
    }
    // Files keep their inodes on MDT 0; their names moved with their directories.
    assert_eq!(mdt_of(&c, "/proj/a/b/two"), 0);
    std::fs::remove_file(root.join(format!("work/f{}", rounds - 1))).unwrap();
    assert_eq!(still(picture(&root)), before, "the tree reads as it did");
    let layout = c.braid_ok(&["getstripe", "-d", &c.url("/proj/a")]);
    assert!(layout.contains("stripe_count:  1") || layout.contains("stripe_count: 1"), "{layout}");
    assert!(layout.contains("2097152"), "the default layout moved with the directory: {layout}");
    assert_eq!(get_xattr(&root.join("a/b"), "user.note"), b"kept", "the extended attribute moved");
    // New entries go to the directory where it now is.
    std::fs::write(root.join("a/b/c/new"), b"new").unwrap();
    assert_eq!(std::fs::read(root.join("a/b/c/new")).unwrap(), b"new");
    assert_eq!(mdt_of(&c, "/proj/a/b/c/new"), 1);

    let again = c.braid_ok(&["migrate", "-m", "1", &c.url("/proj")]);
    assert!(again.contains("0 directories moved to MDT 1, 6 there already"), "{again}");
    let back = c.braid_ok(&["migrate", "-m", "0", &c.url("/proj/a")]);
    assert!(back.contains("3 directories moved to MDT 0"), "{back}");
    assert_eq!((mdt_of(&c, "/proj/a/b/c"), mdt_of(&c, "/proj")), (0, 1));
    assert_eq!(std::fs::read_to_string(root.join("a/b/c/three")).unwrap(), "333");
    drop(m);
    c.check_two_mdts(&mdts).unwrap_or_else(|e| panic!("the namespace after the moves:\n{e}"));
}

#[test]
fn bad_migrations_are_refused_with_what_to_do() {
    let (c, _mdts) = Cluster::start_two_mdts(bin());
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/d")]);
    c.put("/d/f", b"f");
    let fails = |args: &[&str]| {
        let out = c.braid(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        stderr(&out)
    };
    assert!(fails(&["migrate", "-m", "7", &c.url("/d")]).contains("MDT 7"));
    assert!(fails(&["migrate", "-m", "1", &c.url("/d/f")]).contains("moves directories"));
    assert!(fails(&["migrate", "-m", "1", &c.url("/")]).contains("root"));
    assert!(fails(&["migrate", "-m", "1", &c.url("/nothing")]).contains("nothing"));
    assert!(fails(&["migrate", "-m", "x", &c.url("/d")]).contains("not an MDT index"));
    c.braid_ok(&["mkdir", "-c", "2", &c.url("/striped")]);
    assert!(fails(&["migrate", "-m", "1", &c.url("/striped")]).contains("striped"));
    assert_eq!(mdt_of(&c, "/d"), 0, "nothing moved");
    // A directory asked to move where it is already is answered with itself.
    let rt = testkit::runtime();
    let cl = c.connect(&rt);
    let creds = client::process_creds();
    let d = testkit::within(&rt, "resolve", cl.resolve(&creds, "/d", true)).unwrap();
    let same = testkit::within(&rt, "migrate", cl.migrate_dir(&creds, proto::Fid::ROOT, "d", 0)).unwrap();
    assert_eq!(same.fid, d.fid);
}

/// Kills `process` at `point` while `braid migrate -m TO /NAME` runs on a tree made
/// on MDT `from` (a remote directory when `from` is not 0: its entry is in the root,
/// on MDT 0), restarts it, and checks that the namespace is whole, and whole and
/// moved after a second run.
fn crash_at(c: &mut Cluster, mdts: &[PathBuf], (process, point): (&str, &str), name: &str, (from, to): (u32, u32)) {
    let dir = format!("/{name}");
    c.braid_ok(&["mkdir", "-i", &from.to_string(), &c.url(&dir)]);
    c.braid_ok(&["mkdir", "-i", &from.to_string(), &c.url(&format!("{dir}/sub"))]);
    c.put(&format!("{dir}/sub/f"), b"data");
    c.put(&format!("{dir}/g"), b"top");
    c.set_env(process, mds::dne::FAULT_ENV, Some(point));
    c.restart(process);
    c.wait_mdts_up(2, testkit::WAIT);
    let (bin, secret, url) = (c.bin.clone(), c.secret.clone(), c.url(&dir));
    let first = std::thread::spawn(move || {
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["migrate", "-m", &to.to_string(), &url]).env("BRAID_SECRET_FILE", secret);
        testkit::output_within(&mut cmd, testkit::CLI_WATCHDOG).unwrap_or_else(|o| o)
    });
    assert!(c.wait_exit(process, Duration::from_secs(60)), "{process} did not stop at {point}");
    c.set_env(process, mds::dne::FAULT_ENV, None);
    c.restart(process);
    c.wait_mdts_up(2, testkit::WAIT);
    let _ = first.join().expect("the first run");
    c.two_mdts_consistent_within(mdts, Duration::from_secs(30));
    let out = c.braid_ok(&["migrate", "-m", &to.to_string(), &c.url(&dir)]);
    assert!(out.contains("there already"), "{point}: {out}");
    assert_eq!((mdt_of(c, &dir), mdt_of(c, &format!("{dir}/sub"))), (to, to), "{point}");
    assert_eq!((c.get(&format!("{dir}/sub/f")), c.get(&format!("{dir}/g"))), (b"data".to_vec(), b"top".to_vec()));
    c.two_mdts_consistent_within(mdts, Duration::from_secs(30));
}

#[test]
fn a_migration_survives_a_sigkill_at_every_step() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    // A directory of MDT 0 to MDT 1: MDT 0 coordinates, MDT 1 makes the copy.
    let local = [
        ("mds", "migrate-dir:before-update"),
        ("mds", "migrate-dir:before-commit"),
        ("mds", "migrate-dir:before-done"),
        ("mds1", "update:before-reply"),
        ("mds1", "update-done:before-apply"),
    ];
    for (i, step) in local.into_iter().enumerate() {
        crash_at(&mut c, &mdts, step, &format!("m{i}"), (0, 1));
    }
    // A remote directory of MDT 1 (its entry in the root, on MDT 0) back to MDT 0:
    // MDT 0 coordinates and makes the copy, MDT 1 holds the old one until the verdict.
    let remote = [
        ("mds", "migrate-remote:before-update"),
        ("mds", "migrate-remote:before-commit"),
        ("mds", "migrate-remote:before-done"),
        ("mds1", "update:before-reply"),
        ("mds1", "update-done:before-apply"),
    ];
    for (i, step) in remote.into_iter().enumerate() {
        crash_at(&mut c, &mdts, step, &format!("r{i}"), (1, 0));
    }
}
