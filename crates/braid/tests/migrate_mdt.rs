//! `braid migrate -m` (Lustre's `lfs migrate -m`) between two MDTs served by
//! separate `braid mds` processes: a tree's inodes move to the other MDT,
//! directories with their entries, attributes, extended attributes and default
//! layouts, files with their bytes on the MDT (Data-on-MDT) while their OST objects
//! stay where they are, while a FUSE mount keeps reading and writing in them;
//! hard-linked and open files stay; running it again moves nothing; fsck finds no
//! object lost or orphaned; and each process killed with SIGKILL at every step of
//! one inode's move leaves a namespace the checker passes, which a second run
//! finishes.

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
/// link count, entries with their kinds, files' link counts and contents (not inode
/// numbers: an inode that moves gets a new FID, as in Lustre).
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
            out.push(format!("{} nlink {} {:?}", p.display(), m.nlink(), String::from_utf8_lossy(&data)));
        }
    }
    out
}

/// What `braid migrate -m` said it did: directories and files moved, inodes there
/// already, files that stay.
fn moved(out: &str) -> (u64, u64, u64, u64) {
    let num = |after: &str| -> u64 {
        let at = out.find(after).unwrap_or_else(|| panic!("no {after:?} in {out}"));
        let head = out[..at].trim_end();
        let digits: String = head.chars().rev().take_while(char::is_ascii_digit).collect();
        digits.chars().rev().collect::<String>().parse().unwrap_or_else(|_| panic!("{after:?} in {out}"))
    };
    let stay = if out.contains("files stay") { num(" files stay") } else { 0 };
    (num(" directories and"), num(" files moved"), num(" there already"), stay)
}

/// What `braid fsck` finds in the whole file system (kind: detail), none if sound.
fn fsck_findings(c: &Cluster) -> Vec<String> {
    let out = c.braid(&["fsck", &c.url("/"), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("fsck --json ({e}): {}{}", testkit::stdout(&out), stderr(&out)));
    let findings = v["findings"].as_array().unwrap_or_else(|| panic!("{v:#}"));
    findings.iter().map(|f| format!("{}: {}", f["kind"], f["detail"])).collect()
}

/// The FID `braid stat` shows for `path`, as the prefix of its objects' file names
/// on the OSTs (`seq-oid-`).
fn object_prefix(c: &Cluster, path: &str) -> String {
    let out = c.braid_ok(&["stat", &c.url(path)]);
    let f = out.split("FID: [").nth(1).and_then(|r| r.split(']').next()).unwrap_or_else(|| panic!("{out}"));
    let n: Vec<u64> = f.split(':').map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap()).collect();
    format!("{:x}-{:x}-", n[0], n[1])
}

/// Every object file on the cluster's OSTs whose name starts with `prefix`.
fn objects_named(c: &Cluster, prefix: &str) -> Vec<PathBuf> {
    let all = (0..4).flat_map(|i| c.ost_objects(i));
    all.filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix))).collect()
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
    // find(1) and du(1) walking the tree the whole time: fts checks each directory's
    // `..` against the inode number it had on the way down, which a moved
    // directory's new FID changes (the mount answers under the old number).
    let walker = {
        let (root, stop) = (root.clone(), stop.clone());
        std::thread::spawn(move || -> Result<u32, String> {
            let mut walks = 0;
            while !stop.load(Ordering::Relaxed) {
                // (Not in proj/work, whose files the worker removes as they are listed.)
                let find = ["find", ".", "-path", "./work", "-prune", "-o", "-name", "three", "-print"];
                for tool in [&find[..], &["du", "-s", "--exclude=work", "."][..]] {
                    let out = std::process::Command::new(tool[0]).args(&tool[1..]).current_dir(&root).output();
                    let out = out.map_err(|e| format!("{}: {e}", tool[0]))?;
                    if !out.status.success() {
                        return Err(format!("{tool:?}: {}", String::from_utf8_lossy(&out.stderr)));
                    }
                }
                walks += 1;
            }
            Ok(walks)
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
        assert!(out.contains(&format!("moved to MDT {to}")), "{out}");
        // Files open for the worker at that moment stay (it reads four of them in
        // a loop); the rest move, the symlink among them.
        let (dirs, files, _, _) = moved(&out);
        assert!(dirs == 6 && files >= 1, "{out}");
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let rounds = worker.join().unwrap().unwrap_or_else(|e| panic!("the mount's reader and writer: {e}\n{out}"));
    let walks = walker.join().unwrap().unwrap_or_else(|e| panic!("find and du in the tree: {e}\n{out}"));
    assert!(walks > 2, "find and du walked the tree {walks} times");
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

    std::fs::remove_file(root.join(format!("work/f{}", rounds - 1))).unwrap();
    // What was open then moves now.
    let quiet = c.braid_ok(&["migrate", "-m", "1", &c.url("/proj")]);
    assert_eq!(moved(&quiet).3, 2, "only the hard-linked file's two names stay: {quiet}");
    for d in ["/proj", "/proj/a", "/proj/a/b", "/proj/a/b/c", "/proj/empty", "/proj/work"] {
        assert_eq!(mdt_of(&c, d), 1, "{d} moved");
    }
    // (getstripe follows a symlink: a/b/link's own move is in the counts below.)
    for f in ["/proj/top", "/proj/a/b/two", "/proj/a/b/c/three"] {
        assert_eq!(mdt_of(&c, f), 1, "{f} moved");
    }
    // A file with two names keeps its inode on MDT 0 (both names lead there).
    assert_eq!((mdt_of(&c, "/proj/a/one"), mdt_of(&c, "/proj/a/b/one-again")), (0, 0));
    let ino = |p: &str| std::fs::metadata(root.join(p)).unwrap().ino();
    assert_eq!(ino("a/one"), ino("a/b/one-again"));
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
    assert_eq!(moved(&again), (0, 0, 11, 2), "{again}");
    let back = c.braid_ok(&["migrate", "-m", "0", &c.url("/proj/a")]);
    assert_eq!(moved(&back), (3, 4, 2, 0), "two, three, new and link moved; one is there: {back}");
    assert_eq!((mdt_of(&c, "/proj/a/b/c"), mdt_of(&c, "/proj/a/b/c/three"), mdt_of(&c, "/proj")), (0, 0, 1));
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
    // One file moves on its own; with a second name it stays, and says why.
    let one = c.braid_ok(&["migrate", "-m", "1", &c.url("/d/f")]);
    assert_eq!((moved(&one), mdt_of(&c, "/d/f"), c.get("/d/f")), ((0, 1, 0, 0), 1, b"f".to_vec()), "{one}");
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/e")]);
    let m = Mount::new(&c, "");
    std::fs::hard_link(m.path("d/f"), m.path("e/f2")).unwrap();
    let out = c.braid(&["migrate", "-m", "0", &c.url("/d/f")]);
    assert!(out.status.success() && stderr(&out).contains("2 links"), "{}", stderr(&out));
    assert_eq!((moved(&testkit::stdout(&out)), mdt_of(&c, "/d/f")), ((0, 0, 0, 1), 1));
    drop(m);
    assert!(fails(&["migrate", "-m", "1", &c.url("/")]).contains("root"));
    assert!(fails(&["migrate", "-m", "1", &c.url("/nothing")]).contains("nothing"));
    assert!(fails(&["migrate", "-m", "x", &c.url("/d")]).contains("not an MDT index"));
    c.braid_ok(&["mkdir", "-c", "2", &c.url("/striped")]);
    assert!(fails(&["migrate", "-m", "1", &c.url("/striped")]).contains("striped"));
    assert_eq!(mdt_of(&c, "/d"), 0, "nothing moved");
    // An inode asked to move where it is already is answered with itself.
    let rt = testkit::runtime();
    let cl = c.connect(&rt);
    let creds = client::process_creds();
    let d = testkit::within(&rt, "resolve", cl.resolve(&creds, "/d", true)).unwrap();
    let same = testkit::within(&rt, "migrate", cl.migrate_mdt(&creds, proto::Fid::ROOT, "d", 0)).unwrap();
    assert_eq!(same.fid, d.fid);
}

#[test]
fn descriptors_held_across_a_move_see_the_inode_numbers_they_saw() {
    use std::os::fd::{AsRawFd, FromRawFd};
    let (c, _mdts) = Cluster::start_two_mdts(bin());
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/t")]);
    let m = Mount::new(&c, "");
    std::fs::create_dir_all(m.path("t/a/b")).unwrap();
    let ino = |p: &str| std::fs::metadata(m.path(p)).unwrap().ino();
    let (a, b) = (ino("t/a"), ino("t/a/b"));
    // What fts keeps while it walks: a descriptor of the directory it is in.
    let held = std::fs::File::open(m.path("t/a/b")).unwrap();
    let out = c.braid_ok(&["migrate", "-m", "1", &c.url("/t")]);
    assert_eq!(moved(&out), (3, 0, 0, 0), "{out}");
    // Past the mount's attribute and entry times: the kernel asks again.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(held.metadata().unwrap().ino(), b, "the held directory keeps its number");
    let dotdot = cstr("..");
    // SAFETY: a valid descriptor and NUL-terminated name; the new descriptor is owned below.
    let fd = unsafe { libc::openat(held.as_raw_fd(), dotdot.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
    assert!(fd >= 0, "openat ..: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let parent = unsafe { std::fs::File::from_raw_fd(fd) };
    assert_eq!(parent.metadata().unwrap().ino(), a, "its .. is the directory fts went down from");
    // A new walk meets the moved inodes under their new numbers.
    assert_ne!((ino("t/a"), ino("t/a/b")), (a, b));
    assert_eq!(mdt_of(&c, "/t/a/b"), 1);
}

#[test]
fn files_move_with_their_bytes_on_the_mdt_and_keep_their_objects() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/f")]);
    // Data-on-MDT for the first 64 KiB, two stripes after; four stripes of 64 KiB.
    c.braid_ok(&["setstripe", "-E", "64K", "-L", "mdt", "-E", "-1", "-c", "2", &c.url("/f/dom")]);
    c.braid_ok(&["setstripe", "-c", "4", "-S", "64K", &c.url("/f/wide")]);
    let m = Mount::new(&c, "");
    let root = m.path("f");
    let (dom, wide) = (testkit::pattern(200_000, 1), testkit::pattern(1 << 20, 2));
    std::fs::write(root.join("dom"), &dom).unwrap();
    std::fs::write(root.join("wide"), &wide).unwrap();
    std::fs::write(root.join("small"), b"small").unwrap();
    std::fs::File::create(root.join("empty")).unwrap();
    std::os::unix::fs::symlink("wide", root.join("sym")).unwrap();
    let fifo = cstr(root.join("fifo").to_str().unwrap());
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "{}", std::io::Error::last_os_error());
    set_xattr(&root.join("small"), "user.k", b"v");
    std::fs::set_permissions(root.join("small"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(root.join("small"), Some(1000), Some(1000)).unwrap();
    let wide_objects = object_prefix(&c, "/f/wide");
    let layout = |p: &str| testkit::getstripe_objects(&c.braid_ok(&["getstripe", &c.url(p)]));
    let wide_layout = layout("/f/wide");
    assert_eq!((wide_layout.len(), objects_named(&c, &wide_objects).len()), (4, 4));
    let objects_before: Vec<PathBuf> = (0..4).flat_map(|i| c.ost_objects(i)).collect();

    // An open file stays, and says so; once closed, it moves.
    let held = std::fs::File::open(root.join("small")).unwrap();
    let out = c.braid(&["migrate", "-m", "1", &c.url("/f")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("small: stays on MDT 0") && stderr(&out).contains("open"), "{}", stderr(&out));
    assert_eq!(moved(&testkit::stdout(&out)), (1, 5, 0, 1), "{}", testkit::stdout(&out));
    drop(held);
    // The mount tells the MDS of the close a moment later.
    testkit::wait_for("the closed file to move", Duration::from_secs(20), || {
        moved(&c.braid_ok(&["migrate", "-m", "1", &c.url("/f")])).1 == 1
    });
    for f in ["dom", "wide", "small", "empty", "fifo"] {
        assert_eq!(mdt_of(&c, &format!("/f/{f}")), 1, "{f} moved");
    }
    // The bytes read as they were, through the names the mount's kernel kept.
    assert_eq!(std::fs::read(root.join("dom")).unwrap(), dom);
    assert_eq!(std::fs::read(root.join("wide")).unwrap(), wide);
    assert_eq!(std::fs::read(root.join("small")).unwrap(), b"small");
    assert_eq!(std::fs::read_link(root.join("sym")).unwrap(), Path::new("wide"));
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(
        &std::fs::symlink_metadata(root.join("fifo")).unwrap().file_type()
    ));
    let small = std::fs::metadata(root.join("small")).unwrap();
    assert_eq!((small.mode() & 0o7777, small.uid(), small.gid()), (0o640, 1000, 1000));
    assert_eq!(get_xattr(&root.join("small"), "user.k"), b"v");
    // No byte of an OST moved: the same objects, named as before.
    assert_eq!((0..4).flat_map(|i| c.ost_objects(i)).collect::<Vec<_>>(), objects_before);
    assert_eq!(layout("/f/wide"), wide_layout, "the layout names the same objects");
    assert_eq!(fsck_findings(&c), Vec::<String>::new(), "fsck after the move");

    // Writes after the move reach those objects and the file where it is now.
    let tail = testkit::pattern(100, 3);
    let mut f = std::fs::OpenOptions::new().append(true).open(root.join("wide")).unwrap();
    std::io::Write::write_all(&mut f, &tail).unwrap();
    drop(f);
    assert_eq!(c.get("/f/wide"), [&wide[..], &tail[..]].concat());
    std::fs::write(root.join("dom"), b"rewritten").unwrap();
    assert_eq!(c.get("/f/dom"), b"rewritten");

    // Back to MDT 0: the objects keep the name of the file's first FID.
    let back = c.braid_ok(&["migrate", "-m", "0", &c.url("/f")]);
    assert_eq!(moved(&back), (1, 6, 0, 0), "{back}");
    assert_eq!((mdt_of(&c, "/f/wide"), objects_named(&c, &wide_objects).len()), (0, 4));
    assert_eq!(std::fs::read(root.join("wide")).unwrap(), [&wide[..], &tail[..]].concat());
    assert_eq!(fsck_findings(&c), Vec::<String>::new(), "fsck after the move back");

    // Removed, a moved file's objects are destroyed, and nothing else.
    std::fs::remove_file(root.join("wide")).unwrap();
    testkit::wait_for("wide's objects to be destroyed", Duration::from_secs(30), || {
        objects_named(&c, &wide_objects).is_empty()
    });
    assert_eq!(fsck_findings(&c), Vec::<String>::new(), "fsck after the removal");
    drop(m);
    c.check_two_mdts(&mdts).unwrap_or_else(|e| panic!("the namespace after the moves:\n{e}"));
}

#[test]
fn a_client_naming_moved_inodes_by_their_old_fids_is_sent_where_they_are() {
    let (c, _mdts) = Cluster::start_two_mdts(bin());
    for d in ["/x", "/y"] {
        c.braid_ok(&["mkdir", "-i", "0", &c.url(d)]);
    }
    c.put("/x/f", b"moved twice");
    let rt = testkit::runtime();
    let cl = c.connect(&rt);
    let creds = client::process_creds();
    let fid = |p: &str| testkit::within(&rt, "resolve", cl.resolve(&creds, p, false)).unwrap().fid;
    let (x, y, f) = (fid("/x"), fid("/y"), fid("/x/f"));
    c.braid_ok(&["migrate", "-m", "1", &c.url("/x")]);
    c.braid_ok(&["migrate", "-m", "1", &c.url("/y")]);
    // A rename naming both directories by the FIDs they had: each is followed.
    testkit::within(&rt, "rename", cl.rename(&creds, x, "f", y, "g", proto::msg::RenameFlags::default())).unwrap();
    assert_eq!(c.get("/y/g"), b"moved twice");
    // The file moved with x, and back again: its old FID leads to where it is.
    c.braid_ok(&["migrate", "-m", "0", &c.url("/y")]);
    let now = testkit::within(&rt, "getattr", cl.getattr(f)).unwrap();
    assert_eq!((now.fid, now.fid.mdt(), now.size), (fid("/y/g"), 0, 11));
    assert_ne!(now.fid, f, "a moved file has a new FID");
    for (old, path) in [(x, "/x"), (y, "/y")] {
        assert_eq!(testkit::within(&rt, "getattr", cl.getattr(old)).unwrap().fid, fid(path), "{path}");
    }
}

/// Kills `process` at `point` while `braid migrate -m TO /NAME` runs on a tree made
/// on MDT `from` (a remote directory when `from` is not 0: its entry is in the root,
/// on MDT 0), restarts it, and checks that the namespace is whole, and whole and
/// moved after a second run, with every byte and no object left behind. With
/// `remote_file`, the tree also holds a file whose entry is on MDT `to` and inode on
/// MDT `from` (renamed there), which moves first.
fn crash_at(
    c: &mut Cluster,
    mdts: &[PathBuf],
    (process, point): (&str, &str),
    name: &str,
    (from, to): (u32, u32),
    remote_file: bool,
) {
    let dir = format!("/{name}");
    c.braid_ok(&["mkdir", "-i", &from.to_string(), &c.url(&dir)]);
    c.braid_ok(&["mkdir", "-i", &from.to_string(), &c.url(&format!("{dir}/sub"))]);
    c.put(&format!("{dir}/sub/f"), b"data");
    c.put(&format!("{dir}/g"), b"top");
    let moved_in = format!("{dir}/there/moved-in");
    if remote_file {
        c.braid_ok(&["mkdir", "-i", &to.to_string(), &c.url(&format!("{dir}/there"))]);
        c.put(&format!("{dir}/moved-in"), b"remote");
        let m = Mount::new(c, "");
        std::fs::rename(m.path(&format!("{name}/moved-in")), m.path(&moved_in[1..])).unwrap();
        drop(m);
        assert_eq!(mdt_of(c, &moved_in), from, "a file of MDT {from} named on MDT {to}");
    }
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
    assert_eq!(mdt_of(c, &format!("{dir}/sub/f")), to, "{point}");
    if remote_file {
        assert_eq!((c.get(&moved_in), mdt_of(c, &moved_in)), (b"remote".to_vec(), to), "{point}");
    }
    assert_eq!(fsck_findings(c), Vec::<String>::new(), "{point}: no object lost or left behind");
    c.two_mdts_consistent_within(mdts, Duration::from_secs(30));
}

#[test]
fn a_migration_survives_a_sigkill_at_every_step() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    // A directory of MDT 0 to MDT 1, its files first: MDT 0 coordinates, MDT 1 makes
    // the copies.
    let local = [
        ("mds", "migrate-local:before-update"),
        ("mds", "migrate-local:before-commit"),
        ("mds", "migrate-local:before-done"),
        ("mds1", "update:before-reply"),
        ("mds1", "update-done:before-apply"),
    ];
    for (i, step) in local.into_iter().enumerate() {
        crash_at(&mut c, &mdts, step, &format!("m{i}"), (0, 1), false);
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
        crash_at(&mut c, &mdts, step, &format!("r{i}"), (1, 0), false);
    }
    // The same steps, met first by a remote file of MDT 1 named in a directory of
    // MDT 0 (the coordinator, which makes the copy).
    for (i, step) in remote.into_iter().enumerate() {
        crash_at(&mut c, &mdts, step, &format!("rf{i}"), (1, 0), true);
    }
}
