//! OST pools and emulated media, through real processes: an MGS, an MDS, an OSS of
//! plain OSTs and an OSS of OSTs emulating a slow medium, the `braid` CLI, and a
//! FUSE mount. Pools are made with `braid pool`, files are placed with `setstripe -p`
//! and written through the mount, and `getstripe` and `df` say where they went.

use std::time::{Duration, Instant};

use testkit::{getstripe_objects, pattern, wait_for, Cluster, ClusterSpec, Mount};

/// OSTs 0 and 1 plain, 2 and 3 an emulated disk of 40 MiB/s and 2 ms.
fn cluster() -> Cluster {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_braid"));
    let mut c = Cluster::start(bin, ClusterSpec { osts_per_oss: vec![2], ..Default::default() });
    let slow: Vec<String> = (2..4)
        .map(|k| format!("{}:class=hdd,bw=40M,lat=2ms", c.dir.path().join(format!("ost{k}")).display()))
        .collect();
    c.add_oss_with("oss-hdd", &slow);
    c.wait_osts_up(4, Duration::from_secs(30));
    c.wait_placement(4, Duration::from_secs(30));
    c
}

fn fails_with(c: &Cluster, args: &[&str], want: &str) {
    let out = c.braid(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "braid {args:?} should fail");
    assert!(err.contains(want), "braid {args:?}: want '{want}' in: {err}");
}

/// The OSTs of `file`'s component `id` (1 for a plain layout), from `getstripe`.
fn osts_of(c: &Cluster, file: &str) -> Vec<u32> {
    getstripe_objects(&c.braid_ok(&["getstripe", &c.url(file)])).iter().map(|o| o.0).collect()
}

/// Object files on every OST of the cluster.
fn object_files(c: &Cluster) -> usize {
    (0..4)
        .map(|k| {
            let objects = c.dir.path().join(format!("ost{k}")).join("objects");
            std::fs::read_dir(objects)
                .unwrap()
                .map(|b| std::fs::read_dir(b.unwrap().path()).unwrap().count())
                .sum::<usize>()
        })
        .sum()
}

#[test]
fn emulated_osts_are_labelled_and_hold_to_their_bandwidth() {
    let c = cluster();
    let df = c.braid_ok(&["df", &c.url("/")]);
    let line = |ost: &str| df.lines().find(|l| l.contains(ost)).unwrap_or_else(|| panic!("{ost} in {df}")).to_string();
    assert!(line("OST0002").ends_with("[hdd 40MiB/s 2ms emulated]"), "{df}");
    assert!(line("OST0003").contains("[hdd 40MiB/s 2ms emulated]"), "{df}");
    assert!(!line("OST0000").contains("emulated"), "{df}");
    // An emulated OST offers no short circuit: reads and writes of its objects must
    // pass through the limits.
    let log = std::fs::read_to_string(c.dir.path().join("oss-hdd.log")).unwrap();
    assert!(log.contains("no short-circuit I/O: the OST emulates a medium"), "{log}");

    // 24 MiB on the emulated OSTs, 12 each, take at least 12 MiB / 40 MiB/s = 0.3 s
    // even in parallel (a timer never fires early: this holds on any machine); the
    // same on the plain OSTs is not limited. Written by a mount with short circuit
    // asked for, which the emulated OSTs refuse.
    let m = Mount::new(&c, "short_circuit");
    c.braid_ok(&["setstripe", "-c", "2", "-o", "2,3", &c.url("/slow")]);
    let data = pattern(24 << 20, 5);
    let t = Instant::now();
    std::fs::write(m.path("slow"), &data).unwrap();
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(300), "24 MiB over two 40 MiB/s OSTs in {took:?}");
    assert!(std::fs::read(m.path("slow")).unwrap() == data, "the bytes are whole");
    assert_eq!(osts_of(&c, "/slow"), vec![2, 3]);
}

#[test]
fn pools_keep_files_on_their_osts_and_bad_input_is_a_clear_error() {
    let mut c = cluster();
    let cl = c.url("/");
    let pool = |c: &Cluster, args: &[&str]| {
        let mut all = vec!["pool"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--cluster", &cl]);
        c.braid_ok(&all)
    };
    pool(&c, &["create", "braid.flash"]);
    pool(&c, &["add", "braid.flash", "OST0000", "braid-OST0001_UUID"]);
    pool(&c, &["create", "braid.disk"]);
    pool(&c, &["add", "braid.disk", "OST[2-3]"]);
    pool(&c, &["create", "braid.empty"]);
    assert_eq!(pool(&c, &["list", "braid"]), "Pools from braid:\nbraid.disk\nbraid.empty\nbraid.flash\n");
    assert_eq!(pool(&c, &["list", "braid.disk"]), "Pool: braid.disk\nbraid-OST0002_UUID\nbraid-OST0003_UUID\n");

    // A directory default in a pool, and files in it written through a mount.
    let m = Mount::new(&c, "");
    std::fs::create_dir(m.path("disk")).unwrap();
    c.braid_ok(&["setstripe", "-c", "-1", "-p", "disk", &c.url("/disk")]);
    assert!(c.braid_ok(&["getstripe", "-d", &c.url("/disk")]).contains("pool:          disk"));
    for i in 0..6 {
        std::fs::write(m.path(&format!("disk/f{i}")), pattern(100_000, i)).unwrap();
        let mut osts = osts_of(&c, &format!("/disk/f{i}"));
        osts.sort();
        assert_eq!(osts, vec![2, 3], "f{i}: every OST of the pool, and only those");
    }
    assert!(c.braid_ok(&["getstripe", &c.url("/disk/f0")]).contains("lmm_pool:          disk"));
    // A file of its own in the other pool (FSNAME.POOL works too), and a composite
    // layout whose components are in different pools.
    c.braid_ok(&["setstripe", "-c", "1", "-p", "braid.flash", &c.url("/one")]);
    assert!(matches!(osts_of(&c, "/one")[..], [0] | [1]), "{:?}", osts_of(&c, "/one"));
    c.braid_ok(&[
        "setstripe",
        "-E",
        "1M",
        "-c",
        "1",
        "-p",
        "flash",
        "-E",
        "-1",
        "-c",
        "2",
        "-p",
        "disk",
        &c.url("/pfl"),
    ]);
    std::fs::write(m.path("pfl"), pattern(3 << 20, 7)).unwrap();
    let layout = c.braid_ok(&["getstripe", &c.url("/pfl")]);
    let comps: Vec<&str> = layout.split("lcme_id:").skip(1).collect();
    assert_eq!(comps.len(), 2, "{layout}");
    assert!(comps[0].contains("lmm_pool:          flash") && comps[1].contains("lmm_pool:          disk"), "{layout}");
    let on = |comp: &str| -> Vec<u32> {
        comp.lines()
            .filter_map(|l| l.split("l_ost_idx: ").nth(1))
            .map(|r| r.split(',').next().unwrap().trim().parse().unwrap())
            .collect()
    };
    assert!(on(comps[0]).iter().all(|o| *o < 2) && !on(comps[0]).is_empty(), "{layout}");
    let mut second = on(comps[1]);
    second.sort();
    assert_eq!(second, vec![2, 3], "{layout}");

    // df of one pool: the MDT and the pool's OSTs.
    let df = c.braid_ok(&["df", "--pool", "flash", &c.url("/")]);
    assert!(df.contains("OST0000") && df.contains("OST0001") && df.contains("MDT0000"), "{df}");
    assert!(!df.contains("OST0002") && !df.contains("OST0003"), "{df}");

    // Bad input: each a clear error, nothing changed.
    fails_with(&c, &["setstripe", "-p", "nosuch", &c.url("/x")], "pool 'nosuch' has no OSTs");
    fails_with(&c, &["setstripe", "-p", "empty", &c.url("/x")], "pool 'empty' has no OSTs");
    fails_with(&c, &["setstripe", "-p", "flash", "-o", "2", &c.url("/x")], "OST index 2 is not in pool 'flash'");
    fails_with(&c, &["setstripe", "-p", "way-too-long-a-name", &c.url("/x")], "1 to 15 characters");
    fails_with(&c, &["pool", "destroy", "braid.disk", "--cluster", &cl], "remove them first");
    fails_with(&c, &["pool", "add", "braid.disk", "OST0009", "--cluster", &cl], "OST0009 is not registered");
    fails_with(&c, &["pool", "add", "braid.disk", "OST0002", "--cluster", &cl], "already in pool");
    fails_with(&c, &["pool", "create", "braid.flash", "--cluster", &cl], "already exists");
    fails_with(&c, &["pool", "remove", "braid.flash", "OST0003", "--cluster", &cl], "not in pool");
    fails_with(&c, &["pool", "add", "braid.nosuch", "OST0000", "--cluster", &cl], "does not exist");
    fails_with(&c, &["pool", "add", "braid.flash", "--cluster", &cl], "name the OSTs");
    fails_with(&c, &["pool", "create", "other.flash", "--cluster", &cl], "no file system 'other'");
    fails_with(&c, &["pool", "create", "braid.bad/name", "--cluster", &cl], "letters, digits");
    fails_with(&c, &["df", "--pool", "nosuch", &c.url("/")], "does not exist");
    assert!(c.braid(&["stat", &c.url("/x")]).status.code() != Some(0), "no file made by a refused setstripe");

    // The MGS keeps its pools across a restart.
    c.restart("mgs");
    wait_for("the MGS to answer again", Duration::from_secs(30), || {
        c.braid(&["pool", "list", "braid.disk", "--cluster", &cl]).status.success()
    });
    assert_eq!(pool(&c, &["list", "braid.disk"]), "Pool: braid.disk\nbraid-OST0002_UUID\nbraid-OST0003_UUID\n");

    // A pool shrunk: new files take the OSTs it has now (every MDS has the change
    // when `braid pool` returns); files made before keep theirs.
    pool(&c, &["remove", "braid.disk", "OST0003"]);
    for k in 0..3 {
        let probe = format!("disk/probe{k}");
        std::fs::write(m.path(&probe), b"p").unwrap();
        assert_eq!(osts_of(&c, &format!("/{probe}")), vec![2], "{probe}");
        std::fs::remove_file(m.path(&probe)).unwrap();
    }
    // Emptied and destroyed while files use it: they stay whole, a new file there is
    // refused with a clear error, and a file elsewhere is made as ever.
    pool(&c, &["remove", "braid.disk", "OST0002"]);
    pool(&c, &["destroy", "braid.disk"]);
    assert_eq!(pool(&c, &["list", "braid"]), "Pools from braid:\nbraid.empty\nbraid.flash\n");
    for i in 0..6 {
        assert!(std::fs::read(m.path(&format!("disk/f{i}"))).unwrap() == pattern(100_000, i), "f{i} whole");
    }
    assert!(std::fs::write(m.path("disk/late"), b"l").is_err(), "a new file in the destroyed pool is refused");
    let out = c.braid(&["setstripe", "-p", "disk", &c.url("/y")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("pool 'disk' has no OSTs"));
    std::fs::write(m.path("elsewhere"), b"e").unwrap();
}

#[test]
fn migrate_moves_a_files_bytes_into_another_pool_and_refuses_what_it_cannot_do_safely() {
    let c = cluster();
    let cl = c.url("/");
    for (name, osts) in [("braid.flash", "0-1"), ("braid.disk", "2-3")] {
        c.braid_ok(&["pool", "create", name, "--cluster", &cl]);
        c.braid_ok(&["pool", "add", name, osts, "--cluster", &cl]);
    }
    let m = Mount::new(&c, "");
    let data = pattern(5 << 20, 3);
    c.braid_ok(&["setstripe", "-c", "1", "-p", "disk", &c.url("/f")]);
    std::fs::write(m.path("f"), &data).unwrap();
    let before = osts_of(&c, "/f");
    assert!(matches!(before[..], [2] | [3]), "{before:?}");
    let ino = std::fs::metadata(m.path("f")).unwrap();

    // Into the other pool, wider: the same bytes, name and inode, on the pool's OSTs.
    c.braid_ok(&["migrate", "-c", "2", "-p", "flash", &c.url("/f")]);
    let mut after = osts_of(&c, "/f");
    after.sort();
    assert_eq!(after, vec![0, 1]);
    assert!(c.braid_ok(&["getstripe", &c.url("/f")]).contains("lmm_pool:          flash"));
    assert!(std::fs::read(m.path("f")).unwrap() == data, "the mount reads the same bytes");
    assert!(c.get("/f") == data, "so does a native client");
    let now = std::fs::metadata(m.path("f")).unwrap();
    assert_eq!(
        (now.len(), std::os::unix::fs::MetadataExt::ino(&now)),
        (ino.len(), std::os::unix::fs::MetadataExt::ino(&ino))
    );
    // The old object is destroyed: the OSTs hold the two new ones only.
    wait_for("the old object to be destroyed", Duration::from_secs(30), || object_files(&c) == 2);

    // Refused, and nothing changed: a pool with no OSTs, a file open for writing on
    // another client, a directory.
    fails_with(&c, &["migrate", "-p", "nosuch", &c.url("/f")], "pool 'nosuch' has no OSTs");
    let held = std::fs::OpenOptions::new().write(true).open(m.path("f")).unwrap();
    fails_with(&c, &["migrate", "-p", "disk", &c.url("/f")], "open on another client");
    drop(held);
    // The copy the refused migration made is destroyed again.
    assert_eq!(object_files(&c), 2, "no object left of a refused copy");
    let mut again = osts_of(&c, "/f");
    again.sort();
    assert_eq!(again, vec![0, 1], "the refused migrations left the layout alone");
    assert!(std::fs::read(m.path("f")).unwrap() == data);
    std::fs::create_dir(m.path("d")).unwrap();
    fails_with(&c, &["migrate", "-p", "disk", &c.url("/d")], "a directory");
    // A Data-on-MDT file moves onto the pool's OSTs (its bytes on the MDT go); a
    // DoM layout is no migration's target.
    c.braid_ok(&["setstripe", "-E", "64K", "-L", "mdt", "-E", "-1", "-c", "1", &c.url("/dom")]);
    let small = pattern(100_000, 11);
    std::fs::write(m.path("dom"), &small).unwrap();
    fails_with(&c, &["migrate", "-E", "64K", "-L", "mdt", "-E", "-1", &c.url("/dom")], "Data-on-MDT");
    c.braid_ok(&["migrate", "-c", "1", "-p", "disk", &c.url("/dom")]);
    let layout = c.braid_ok(&["getstripe", &c.url("/dom")]);
    assert!(!layout.contains("mdt") && layout.contains("lmm_pool:          disk"), "{layout}");
    assert!(matches!(osts_of(&c, "/dom")[..], [2] | [3]), "{layout}");
    assert!(std::fs::read(m.path("dom")).unwrap() == small, "the DoM file's bytes, now on an OST");
    assert!(c.get("/dom") == small);
    // Once closed, the same migration goes through (the MDS learns the close within
    // moments; the migration waits for it).
    c.braid_ok(&["migrate", "-p", "disk", &c.url("/f")]);
    let mut back = osts_of(&c, "/f");
    back.sort();
    assert!(back.iter().all(|o| *o >= 2) && !back.is_empty(), "{back:?}");
    assert!(std::fs::read(m.path("f")).unwrap() == data);

    // A sparse file stays sparse: 64 MiB long, 3 bytes written at its end.
    c.braid_ok(&["setstripe", "-c", "1", "-p", "disk", &c.url("/sparse")]);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(m.path("sparse")).unwrap();
        f.write_all_at(b"end", 64 << 20).unwrap();
    }
    c.braid_ok(&["migrate", "-p", "flash", &c.url("/sparse")]);
    let bytes = std::fs::read(m.path("sparse")).unwrap();
    assert_eq!(bytes.len(), (64 << 20) + 3);
    assert!(bytes[..64 << 20].iter().all(|&b| b == 0) && &bytes[64 << 20..] == b"end");
    // (The objects `f` had on these OSTs are destroyed in the background.)
    let allocated = || -> u64 {
        (0..2)
            .flat_map(|k| {
                let objects = c.dir.path().join(format!("ost{k}")).join("objects");
                std::fs::read_dir(objects).unwrap().flat_map(|b| std::fs::read_dir(b.unwrap().path()).unwrap())
            })
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
            .sum()
    };
    wait_for("the new OSTs to hold only a few KiB", Duration::from_secs(30), || allocated() < 1 << 20);
}

#[test]
fn a_burst_of_creates_through_a_mount_spreads_over_the_osts_the_layout_allows() {
    let c = cluster();
    let cl = c.url("/");
    c.braid_ok(&["pool", "create", "braid.flash", "--cluster", &cl]);
    c.braid_ok(&["pool", "add", "braid.flash", "0-1", "--cluster", &cl]);
    let m = Mount::new(&c, "");
    // Most of these creates are answered by the mount (the directory's lease), from
    // the layout of the last file the MDS placed there: they still take every OST in
    // turn, as the MDS's round robin does, within what the layout allows.
    for (dir, setstripe, want) in [
        ("free", vec!["-c", "1"], vec![0, 1, 2, 3]),
        ("pool", vec!["-c", "1", "-p", "flash"], vec![0, 1]),
        ("start", vec!["-c", "1", "-i", "2"], vec![2]),
    ] {
        std::fs::create_dir(m.path(dir)).unwrap();
        let mut args = vec!["setstripe"];
        args.extend(setstripe);
        let url = c.url(&format!("/{dir}"));
        args.push(&url);
        c.braid_ok(&args);
        for i in 0..12 {
            std::fs::write(m.path(&format!("{dir}/f{i}")), b"x").unwrap();
        }
        let mut seen: Vec<u32> = (0..12).flat_map(|i| osts_of(&c, &format!("/{dir}/f{i}"))).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen, want, "{dir}: the OSTs its 12 files are on");
    }
}
