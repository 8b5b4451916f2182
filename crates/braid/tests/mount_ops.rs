//! Operating a mount: layout commands on mounted paths (setstripe, getstripe, df,
//! mkdir), servers killed and restarted under a busy mount, the `timeout=S` option,
//! unmount while a server is down, and Ctrl-C on `braid mount -f`.

use std::fs::{self, OpenOptions};
use std::path::Path;
use std::time::Duration;

use testkit::{getstripe_objects, is_mounted, pattern, Cluster, ClusterSpec, Mount};

fn cluster() -> Cluster {
    Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default())
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[test]
fn layout_commands_on_mounted_paths() {
    let c = cluster();
    let m = Mount::new(&c, "");
    // mkdir through the tool, on a mounted path.
    c.braid_ok(&["mkdir", &s(&m.path("wide"))]);
    assert!(m.path("wide").is_dir(), "braid mkdir made the directory in the mount");
    // A directory default set on the mounted path applies to files `cp` creates there.
    c.braid_ok(&["setstripe", "-c", "3", "-S", "128K", &s(&m.path("wide"))]);
    let d = c.braid_ok(&["getstripe", "-d", &s(&m.path("wide"))]);
    assert!(d.contains('3'), "getstripe -d shows the default: {d}");
    let local = c.dir.path().join("local-src");
    let data = pattern(1_000_000, 11);
    fs::write(&local, &data).unwrap();
    let out = std::process::Command::new("cp").arg(&local).arg(m.path("wide/copied")).output().unwrap();
    assert!(out.status.success(), "cp into the mount: {}", String::from_utf8_lossy(&out.stderr));
    assert!(fs::read(m.path("wide/copied")).unwrap() == data);
    let g = c.braid_ok(&["getstripe", &s(&m.path("wide/copied"))]);
    let objs = getstripe_objects(&g);
    assert_eq!(objs.len(), 3, "cp's file took the directory default (3 stripes):\n{g}");
    let mut osts: Vec<u32> = objs.iter().map(|o| o.0).collect();
    osts.sort();
    osts.dedup();
    assert_eq!(osts.len(), 3, "three different OSTs:\n{g}");
    // setstripe on a new file path inside the mount creates it with that layout.
    c.braid_ok(&["setstripe", "-c", "1", &s(&m.path("wide/single"))]);
    fs::write(m.path("wide/single"), b"one stripe").unwrap();
    let g = c.braid_ok(&["getstripe", &s(&m.path("wide/single"))]);
    assert_eq!(getstripe_objects(&g).len(), 1, "{g}");
    assert_eq!(fs::read(m.path("wide/single")).unwrap(), b"one stripe");
    // df on a mounted path lists every target.
    let df = c.braid_ok(&["df", &s(&m.dir)]);
    assert_eq!(df.lines().filter(|l| l.contains("[OST:")).count(), 4, "{df}");
    assert!(df.contains("[MDT:"), "{df}");
}

#[test]
fn oss_restart_under_a_busy_mount_resumes() {
    let mut c = cluster();
    let m = Mount::new(&c, "timeout=60");
    fs::create_dir(m.path("d")).unwrap();
    c.braid_ok(&["setstripe", "-c", "-1", &s(&m.path("d"))]);
    const REC: usize = 256 * 1024;
    const N: usize = 40;
    let want: Vec<u8> = (0..N).flat_map(|i| pattern(REC, i as u64)).collect();
    let src = c.dir.path().join("src");
    fs::write(&src, &want).unwrap();
    // The writer is its own process, as an application would be: a process with a
    // thread blocked inside the mount cannot fork a server that the mount waits for.
    let script = format!(
        "for i in $(seq 0 {last}); do dd if={src} of={dst} bs={REC} skip=$i seek=$i count=1 conv=notrunc,fsync \
         status=none || exit 1; sleep 0.05; done",
        last = N - 1,
        src = s(&src),
        dst = s(&m.path("d/busy")),
    );
    let mut writer = std::process::Command::new("sh").arg("-c").arg(&script).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    c.kill("oss0");
    std::thread::sleep(Duration::from_secs(2));
    c.restart("oss0");
    let status = writer.wait().unwrap();
    assert!(status.success(), "the writer blocked and resumed: {status}");
    let got = fs::read(m.path("d/busy")).unwrap();
    assert_eq!(got.len(), want.len());
    let bad: Vec<(usize, bool)> = (0..N)
        .filter(|&i| got[i * REC..(i + 1) * REC] != want[i * REC..(i + 1) * REC])
        .map(|i| (i, got[i * REC..(i + 1) * REC].iter().all(|&b| b == 0)))
        .collect();
    assert!(bad.is_empty(), "records wrong after the OSS restart (index, all zeros): {bad:?}");
}

#[test]
fn mds_restart_under_a_mount_resumes() {
    let mut c = cluster();
    let m = Mount::new(&c, "timeout=60,attr_timeout=0,entry_timeout=0");
    fs::write(m.path("before"), b"before").unwrap();
    c.kill("mds");
    let p = m.path("during");
    let op = std::thread::spawn(move || fs::write(&p, b"during"));
    std::thread::sleep(Duration::from_secs(1));
    c.restart("mds");
    let r = op.join().unwrap();
    assert!(r.is_ok(), "a create during the MDS restart blocked and resumed: {r:?}");
    assert_eq!(fs::read(m.path("during")).unwrap(), b"during");
    assert_eq!(fs::read(m.path("before")).unwrap(), b"before");
}

#[test]
fn dead_mds_gives_eio_after_the_timeout_and_unmount_works() {
    let mut c = cluster();
    let mut m = Mount::new(&c, "timeout=3,attr_timeout=0,entry_timeout=0");
    fs::write(m.path("f"), b"x").unwrap();
    c.kill("mds");
    let (tx, rx) = std::sync::mpsc::channel();
    let p = m.path("f");
    let q = m.path("new");
    std::thread::spawn(move || {
        let a = fs::metadata(&p).map(|_| ()).map_err(|e| e.raw_os_error());
        let b = fs::write(&q, b"y").map_err(|e| e.raw_os_error());
        let _ = tx.send((a, b));
    });
    let (a, b) = rx.recv_timeout(Duration::from_secs(30)).expect("operations on a dead MDS return, never hang");
    assert_eq!(a, Err(Some(libc::EIO)), "stat after timeout=3");
    assert_eq!(b, Err(Some(libc::EIO)), "create after timeout=3");
    // Unmount works while the MDS is still down, and the mount process exits.
    let r = m.umount();
    assert!(r.is_ok(), "braid umount with the MDS down: {r:?}");
    assert!(!is_mounted(&m.dir));
    assert!(m.wait_exit(Duration::from_secs(30)).is_some(), "the mount process exits after unmount");
}

#[test]
fn sigint_unmounts_cleanly() {
    let c = cluster();
    let mut m = Mount::new(&c, "");
    fs::write(m.path("f"), b"data").unwrap();
    let busy = OpenOptions::new().read(true).open(m.path("f")).unwrap();
    drop(busy);
    m.signal(libc::SIGINT);
    let st = m.wait_exit(Duration::from_secs(30)).expect("braid mount -f exits on SIGINT");
    assert!(st.success(), "clean exit: {st}");
    assert!(!is_mounted(&m.dir), "SIGINT unmounted");
    assert_eq!(fs::read_dir(&m.dir).unwrap().count(), 0, "the mount point is an empty directory again");
    // The data is safe on the cluster.
    assert_eq!(c.get("/f"), b"data");
}

#[test]
fn mount_sets_the_kernel_readahead() {
    // FUSE leaves its bdi at the kernel's 128 KiB read-ahead; the mount raises it
    // (sequential reads through the mount otherwise arrive as 128 KiB requests).
    let c = cluster();
    let m = Mount::new(&c, "readahead_kb=2048");
    let target = fs::canonicalize(m.path("")).unwrap();
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dev = info
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.len() > 4 && Path::new(f[4]) == target)
        .map(|f| f[2].to_string())
        .expect("the mount is in mountinfo");
    let kb = fs::read_to_string(format!("/sys/class/bdi/{dev}/read_ahead_kb")).unwrap();
    assert_eq!(kb.trim(), "2048");
}

/// What `stat` shows of `p` that the MDS holds: times, link count, mode, owner, size.
fn view(p: &Path) -> (i64, i64, i64, i64, u64, u32, u32, u64) {
    use std::os::unix::fs::MetadataExt;
    let md = fs::metadata(p).unwrap();
    (md.mtime(), md.mtime_nsec(), md.ctime(), md.ctime_nsec(), md.nlink(), md.mode(), md.uid(), md.len())
}

#[test]
fn directory_attributes_after_own_creates_and_unlinks_are_the_mds_view() {
    // The mount answers the kernel's re-read of a directory after its own create or
    // unlink from the attributes that operation returned; they must be exactly what
    // the MDS holds (a second mount without attribute caching asks the MDS each time).
    use std::os::unix::fs::PermissionsExt;
    let c = cluster();
    let m = Mount::new(&c, "");
    let fresh = Mount::new(&c, "attr_timeout=0,entry_timeout=0");
    fs::create_dir(m.path("d")).unwrap();
    for i in 0..20 {
        fs::write(m.path(&format!("d/f{i}")), b"x").unwrap();
        if i % 3 == 0 {
            fs::remove_file(m.path(&format!("d/f{}", i / 2))).unwrap();
        }
        if i == 10 {
            fs::set_permissions(m.path("d"), fs::Permissions::from_mode(0o750)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(view(&m.path("d")), view(&fresh.path("d")), "directory attributes after step {i}");
    }
    assert_eq!(view(&m.path("d")).5 & 0o7777, 0o750);
}

#[test]
fn attributes_after_reads_and_listings_are_the_mds_view() {
    // A read drops only the atime the kernel caches of a file, and the mount answers
    // its re-ask from what it last told it (the fuse crate's `told`): never across a
    // change of this mount made since, nor for a directory. A second mount without
    // attribute caching asks the MDS each time.
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let c = cluster();
    let m = Mount::new(&c, "");
    let fresh = Mount::new(&c, "attr_timeout=0,entry_timeout=0");
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/f"), b"first").unwrap();
    let look = || {
        // The root's listing tells the kernel d's attributes; d's listing and f's read
        // then drop their atimes.
        assert!(fs::read_dir(m.path("")).unwrap().count() >= 1);
        fs::read_dir(m.path("d")).unwrap().for_each(drop);
        fs::read(m.path("d/f")).unwrap();
    };
    let steps: [(&str, &dyn Fn()); 6] = [
        ("chmod d", &|| fs::set_permissions(m.path("d"), fs::Permissions::from_mode(0o750)).unwrap()),
        ("chmod f", &|| fs::set_permissions(m.path("d/f"), fs::Permissions::from_mode(0o600)).unwrap()),
        ("rewrite f", &|| fs::write(m.path("d/f"), b"second and longer").unwrap()),
        ("create in d", &|| fs::write(m.path("d/g"), b"g").unwrap()),
        ("chown d", &|| std::os::unix::fs::chown(m.path("d"), Some(7), Some(8)).unwrap()),
        ("unlink in d", &|| fs::remove_file(m.path("d/g")).unwrap()),
    ];
    for (what, change) in steps {
        look();
        std::thread::sleep(Duration::from_millis(5));
        change();
        look();
        assert_eq!(view(&m.path("d")), view(&fresh.path("d")), "d after {what}");
        assert_eq!(view(&m.path("d/f")), view(&fresh.path("d/f")), "f after {what}");
    }
    // Read through a descriptor opened before a change of this mount: the open's
    // attributes are older than the change, and are not answered after it.
    use std::io::{Read, Seek};
    let mut f = fs::File::open(m.path("d/f")).unwrap();
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).unwrap();
    fs::set_permissions(m.path("d/f"), fs::Permissions::from_mode(0o604)).unwrap();
    // Its pages dropped, the next read goes to the mount (and drops the atime).
    use std::os::unix::io::AsRawFd;
    // SAFETY: posix_fadvise on a descriptor this test holds.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
    f.rewind().unwrap();
    f.read_to_end(&mut buf).unwrap();
    assert_eq!(f.metadata().unwrap().mode() & 0o7777, 0o604, "the chmod after the open");
    assert_eq!(view(&m.path("d/f")), view(&fresh.path("d/f")), "f after a chmod under an open descriptor");
}

/// `braid mount` says at once what is wrong with its mount point, before it asks the
/// cluster anything; and against an address where nothing answers, it says that it
/// is retrying, then why it gave up.
#[test]
fn a_mount_names_a_bad_mount_point_at_once_and_says_that_it_retries() {
    use std::process::Command;
    let bin = Path::new(env!("CARGO_BIN_EXE_braid"));
    let run = |args: &[&str]| {
        let out = testkit::output_within(Command::new(bin).args(args), Duration::from_secs(60)).expect("mount exits");
        assert!(!out.status.success(), "mount {args:?} succeeded");
        testkit::stderr(&out)
    };
    let start = std::time::Instant::now();
    let said = run(&["mount", "braid://127.0.0.1:1/", "/nonexistent"]);
    assert!(said.contains("mount point /nonexistent does not exist"), "{said}");
    assert!(start.elapsed() < Duration::from_secs(5), "the missing mount point took {:?}", start.elapsed());
    let dir = testkit::TempDir::new("mount-point");
    let file = dir.path().join("a-file");
    fs::write(&file, b"").unwrap();
    let said = run(&["mount", "braid://127.0.0.1:1/", file.to_str().unwrap()]);
    assert!(said.contains("is not a directory"), "{said}");
    let said = run(&["mount", "-o", "timeout=4", "braid://127.0.0.1:1/", dir.path().to_str().unwrap()]);
    assert!(said.contains("does not answer yet; retrying for up to 4 s"), "{said}");
    assert!(said.contains("cannot connect to the cluster at 127.0.0.1:1"), "{said}");
}
