//! readdir through a real mount: a directory of 100,000 entries lists completely and
//! exactly once, and entries created during a listing do not make it skip or repeat.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

use client::{Client, ClientConfig, Secret};
use proto::msg::{Creds, OpenFlags};
use proto::Fid;
use testkit::{Cluster, ClusterSpec, Mount};

fn names(dir: &Path) -> Vec<String> {
    fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

#[test]
fn listing_survives_concurrent_creates() {
    let c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default());
    let m = Mount::new(&c, "");
    let d = m.path("d");
    fs::create_dir(&d).unwrap();
    let orig: Vec<String> = (0..3000).map(|i| format!("f{i:05}")).collect();
    for n in &orig {
        fs::File::create(d.join(n)).unwrap();
    }
    let mut it = fs::read_dir(&d).unwrap();
    let mut seen = Vec::new();
    for _ in 0..1000 {
        seen.push(it.next().unwrap().unwrap().file_name().to_string_lossy().into_owned());
    }
    // Create entries sorting before, between and after those already listed.
    for i in 0..500 {
        for p in ["a", "f0", "z"] {
            fs::File::create(d.join(format!("{p}new{i}"))).unwrap();
        }
    }
    seen.extend(it.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()));
    let set: HashSet<&String> = seen.iter().collect();
    assert_eq!(set.len(), seen.len(), "no entry listed twice");
    let missing: Vec<&String> = orig.iter().filter(|n| !set.contains(n)).collect();
    assert!(
        missing.is_empty(),
        "{} original entries skipped, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    assert_eq!(names(&d).len(), 3000 + 1500, "a fresh listing shows everything");
}

#[test]
fn directory_of_100000_entries() {
    let c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default());
    let m = Mount::new(&c, "");
    fs::create_dir(m.path("big")).unwrap();
    const N: usize = 100_000;
    const TASKS: usize = 64;
    // Created by the native client from many concurrent tasks (the MDS commits them in
    // groups); one by one through FUSE this takes minutes on a 2-core machine. The
    // listing and the checks go through the mount.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let secret = Secret::load(&c.secret).unwrap();
    let client = rt.block_on(Client::connect(ClientConfig::new(c.mgs_addr.clone(), secret))).unwrap();
    rt.block_on(async {
        let root = Creds::root();
        let big = client.lookup(&root, Fid::ROOT, "big").await.unwrap().fid;
        let mut set = tokio::task::JoinSet::new();
        for t in 0..TASKS {
            let (client, root) = (client.clone(), root.clone());
            set.spawn(async move {
                let flags = OpenFlags { read: false, write: false, truncate: false };
                for i in (t..N).step_by(TASKS) {
                    let (f, _, _) =
                        client.create(&root, big, &format!("e{i:06}"), 0o644, true, flags, None).await.unwrap();
                    client.close(f).await.unwrap();
                }
            });
        }
        while let Some(r) = set.join_next().await {
            r.unwrap();
        }
    });
    let dir = m.path("big");
    let listed = names(&dir);
    assert_eq!(listed.len(), N, "every entry listed");
    let set: HashSet<&String> = listed.iter().collect();
    assert_eq!(set.len(), N, "no entry listed twice");
    assert!((0..N).all(|i| set.contains(&format!("e{i:06}"))), "the listed names are the created ones");
    assert_eq!(fs::metadata(dir.join("e099999")).unwrap().len(), 0);
}

/// What a listing gives for each entry (the kernel's READDIRPLUS answers `stat` of
/// every listed name from what the listing brought): kind, mode, owner, size, links.
fn listed(dir: &Path) -> Vec<(String, u32, u32, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = fs::symlink_metadata(e.path()).unwrap();
            (e.file_name().to_string_lossy().into_owned(), m.mode(), m.uid(), m.size(), m.nlink())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_listing_with_attributes_gives_what_a_lookup_gives_on_every_mdt_and_in_striped_directories() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec { mdts: 2, ..Default::default() });
    let a = Mount::new(&c, "");
    let b = Mount::new(&c, "");
    // Files, a subdirectory, a symlink, hard links, an entry whose inode is on the
    // other MDT, and a striped directory.
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/d")]);
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/d/remote")]);
    c.braid_ok(&["mkdir", "-c", "2", &c.url("/d/striped")]);
    for (i, dir) in ["d", "d/striped"].iter().enumerate() {
        for n in 0..40 {
            fs::write(a.path(&format!("{dir}/f{n}")), vec![b'x'; n * 100 + i]).unwrap();
        }
        fs::set_permissions(a.path(&format!("{dir}/f3")), fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(a.path(&format!("{dir}/f4")), Some(77), Some(88)).unwrap();
        fs::hard_link(a.path(&format!("{dir}/f5")), a.path(&format!("{dir}/link5"))).unwrap();
        symlink("f1", a.path(&format!("{dir}/sym"))).unwrap();
        fs::create_dir(a.path(&format!("{dir}/sub"))).unwrap();
    }
    fs::write(a.path("d/remote/inside"), b"x").unwrap();
    for dir in ["d", "d/striped", "d/remote"] {
        // B has cached nothing: its listing brings every attribute, and they must
        // be the ones a lookup brings (a fresh mount with no entry cache asks).
        let fresh = Mount::new(&c, "attr_timeout=0,entry_timeout=0");
        assert_eq!(listed(&b.path(dir)), listed(&fresh.path(dir)), "{dir}");
    }
    let got = listed(&b.path("d"));
    let find = |n: &str| got.iter().find(|e| e.0 == n).unwrap_or_else(|| panic!("{n} listed")).clone();
    assert_eq!(find("f3").1 & 0o7777, 0o600);
    assert_eq!(find("f4").2, 77);
    assert_eq!((find("f5").4, find("link5").4), (2, 2));
    assert_eq!(find("f39").3, 3900);
    assert_eq!(find("sub").1 & libc::S_IFMT, libc::S_IFDIR);
    assert_eq!(find("sym").1 & libc::S_IFMT, libc::S_IFLNK);

    // A change B's listing cached is seen as the cache time allows, as after lookups.
    fs::set_permissions(a.path("d/f7"), fs::Permissions::from_mode(0o640)).unwrap();
    fs::write(a.path("d/f8"), b"longer than before, by a little").unwrap();
    testkit::wait_for("B to see A's changes", std::time::Duration::from_secs(30), || {
        let got = listed(&b.path("d"));
        let f = |n: &str| got.iter().find(|e| e.0 == n).cloned().unwrap();
        f("f7").1 & 0o7777 == 0o640 && f("f8").3 == 31
    });
    // B's own change after its listing is what B then sees, at once.
    let _ = listed(&b.path("d"));
    fs::set_permissions(b.path("d/f9"), fs::Permissions::from_mode(0o604)).unwrap();
    assert_eq!(find_mode(&b.path("d"), "f9"), 0o604);
}

/// The mode a listing of `dir` gives `name`.
fn find_mode(dir: &Path, name: &str) -> u32 {
    listed(dir).into_iter().find(|e| e.0 == name).unwrap().1 & 0o7777
}

/// `OPENDIR` fetches the listing's first batch with its entries' attributes. A
/// change this mount makes between opendir(3) and the listing (`cp -a` makes the
/// copy's directory in between) must not be undone by those older attributes: the
/// kernel would take them over the newer ones it has.
#[test]
fn a_listing_after_this_mount_changed_an_entry_since_opendir_gives_its_current_attributes() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default());
    let m = Mount::new(&c, "");
    let dir = m.path("d");
    fs::create_dir(&dir).unwrap();
    for i in 0..5 {
        fs::write(dir.join(format!("f{i}")), vec![b'x'; i * 100]).unwrap();
        fs::set_permissions(dir.join(format!("f{i}")), fs::Permissions::from_mode(0o644)).unwrap();
    }
    // Forget what the kernel knows of the entries, so the listing is what tells it.
    drop(m);
    let m = Mount::new(&c, "");
    let dir = m.path("d");
    let cdir = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string; the stream is closed below.
    let stream = unsafe { libc::opendir(cdir.as_ptr()) };
    assert!(!stream.is_null(), "opendir");
    fs::set_permissions(dir.join("f2"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(dir.join("f3"), vec![b'y'; 7]).unwrap();
    let mut listed = Vec::new();
    loop {
        // SAFETY: `stream` is an open directory stream.
        let e = unsafe { libc::readdir(stream) };
        if e.is_null() {
            break;
        }
        // SAFETY: readdir returned an entry whose name is a NUL-terminated string.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) }.to_string_lossy().into_owned();
        listed.push(name);
    }
    // SAFETY: closes the stream opened above, once.
    unsafe { libc::closedir(stream) };
    listed.retain(|n| n != "." && n != "..");
    listed.sort();
    assert_eq!(listed, ["f0", "f1", "f2", "f3", "f4"]);
    let f2 = fs::metadata(dir.join("f2")).unwrap();
    assert_eq!(f2.mode() & 0o777, 0o600, "the mode this mount set after opendir");
    assert_eq!(fs::metadata(dir.join("f3")).unwrap().size(), 7, "the size this mount wrote after opendir");
    assert_eq!(fs::metadata(dir.join("f4")).unwrap().size(), 400);
}

#[test]
fn a_directory_opened_again_right_after_a_listing_lists_what_is_there_now() {
    // `rm -rf` opens each directory twice; the mount serves the second open from the
    // first's listing while no one can have changed it (its lease, its own epoch).
    let c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default());
    let m = Mount::new(&c, "");
    let other = Mount::new(&c, "");
    let d = m.path("d");
    fs::create_dir(&d).unwrap();
    for i in 0..10 {
        fs::write(d.join(format!("f{i}")), b"x").unwrap();
    }
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let first = sorted(names(&d));
    assert_eq!(first.len(), 10);
    assert_eq!(sorted(names(&d)), first, "opened again at once");
    // This mount's own change in between.
    fs::write(d.join("f10"), b"x").unwrap();
    assert!(names(&d).contains(&"f10".to_string()), "a create of this mount since the listing");
    fs::remove_file(d.join("f0")).unwrap();
    assert!(!names(&d).contains(&"f0".to_string()), "an unlink of this mount since the listing");
    // Another mount's change in between (it takes the lease back first).
    let before = names(&d);
    fs::write(other.path("d/g"), b"y").unwrap();
    let after = names(&d);
    assert!(
        after.contains(&"g".to_string()),
        "another mount's create since the listing: {after:?} (before: {before:?})"
    );
}
