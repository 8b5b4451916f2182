//! File-level mirrors (FLR) through real processes: an MGS, an MDS, two OSSs of two
//! OSTs each (pools `hot` on the first, `cool` on the second), the `braid` CLI, FUSE
//! mounts and native clients. Mirrors are made with `braid mirror`, written through
//! a mount, read back with an OSS killed, resynced, verified and split.

use std::time::Duration;

use testkit::{field, pattern, wait_for, Cluster, ClusterSpec, Mount};

fn cluster() -> Cluster {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_braid"));
    let c = Cluster::start(bin, ClusterSpec { osts_per_oss: vec![2, 2], ..Default::default() });
    let cl = c.url("/");
    for (name, osts) in [("braid.hot", "0-1"), ("braid.cool", "2-3")] {
        c.braid_ok(&["pool", "create", name, "--cluster", &cl]);
        c.braid_ok(&["pool", "add", name, osts, "--cluster", &cl]);
    }
    c
}

fn fails_with(c: &Cluster, args: &[&str], want: &str) {
    let out = c.braid(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "braid {args:?} should fail");
    assert!(err.contains(want), "braid {args:?}: want '{want}' in: {err}");
}

/// Each component of `file` as `getstripe` prints it: (mirror id, flags, OSTs).
fn mirrors_of(c: &Cluster, file: &str) -> Vec<(u16, String, Vec<u32>)> {
    let text = c.braid_ok(&["getstripe", &c.url(file)]);
    text.split("lcme_id:")
        .skip(1)
        .map(|comp| {
            let mirror = field(comp, "lcme_mirror_id").expect("a mirror id").parse().unwrap();
            let flags = field(comp, "lcme_flags").expect("flags").to_string();
            let osts = comp
                .lines()
                .filter_map(|l| l.split("l_ost_idx: ").nth(1))
                .map(|r| r.split(',').next().unwrap().trim().parse().unwrap())
                .collect();
            (mirror, flags, osts)
        })
        .collect()
}

/// Object files on every OST.
fn object_files(c: &Cluster) -> usize {
    (0..4).map(|k| testkit::objects_in(&c.ost_dir(k)).len()).sum()
}

#[test]
fn a_mirrored_file_keeps_a_copy_per_pool_goes_stale_on_write_resyncs_and_stays_readable_with_an_oss_down() {
    let mut c = cluster();
    let m = Mount::new(&c, "");

    // Two mirrors, one per pool; getstripe prints them as Lustre does.
    c.braid_ok(&["mirror", "create", "-N", "-c", "1", "-p", "hot", "-N", "-c", "1", "-p", "cool", &c.url("/m")]);
    let text = c.braid_ok(&["getstripe", &c.url("/m")]);
    assert_eq!(field(&text, "lcm_mirror_count"), Some("2"), "{text}");
    let comps = mirrors_of(&c, "/m");
    assert_eq!(comps.len(), 2, "{text}");
    assert_eq!((comps[0].0, comps[1].0), (1, 2), "{text}");
    assert!(comps[0].2.iter().all(|o| *o < 2) && comps[1].2.iter().all(|o| *o >= 2), "{text}");
    assert!(comps.iter().all(|c| c.1 == "init"), "{text}");

    // A write goes to one mirror (the first, none preferred) and makes the other stale.
    let data = pattern(3 << 20, 1);
    std::fs::write(m.path("m"), &data).unwrap();
    let comps = mirrors_of(&c, "/m");
    assert_eq!((comps[0].1.as_str(), comps[1].1.as_str()), ("init", "init,stale"), "{comps:?}");
    assert!(c.get("/m") == data, "reads take the in-sync mirror");
    let v = c.braid_ok(&["mirror", "verify", "-v", &c.url("/m")]);
    assert!(v.contains("in-sync mirrors 1 compared, 0 chunk(s) differ"), "{v}");
    // The last in-sync copy is never dropped.
    fails_with(&c, &["mirror", "split", "--mirror-id", "1", "-d", &c.url("/m")], "no in-sync copy");

    // Resync: both in sync again, and they agree.
    c.braid_ok(&["mirror", "resync", &c.url("/m")]);
    let comps = mirrors_of(&c, "/m");
    assert!(comps.iter().all(|c| c.1 == "init"), "{comps:?}");
    assert!(comps[1].2.iter().all(|o| *o >= 2), "the resynced copy stays in its pool: {comps:?}");
    let v = c.braid_ok(&["mirror", "verify", "-v", &c.url("/m")]);
    assert!(v.contains(&format!("{} bytes of in-sync mirrors 1,2 compared, 0 chunk(s) differ", 3 << 20)), "{v}");

    // Mirror 2 split off into a file of its own: the same bytes, laid out as the
    // mirror was; /m keeps mirror 1.
    c.braid_ok(&["mirror", "split", "--mirror-id", "2", "-f", &c.url("/m2"), &c.url("/m")]);
    assert!(c.get("/m2") == data && c.get("/m") == data);
    let left = c.braid_ok(&["getstripe", &c.url("/m")]);
    assert!(!left.contains("lcm_mirror_count") && left.contains("lmm_pool:          hot"), "one copy left: {left}");
    let split = c.braid_ok(&["getstripe", &c.url("/m2")]);
    assert!(split.contains("lmm_pool:          cool"), "{split}");
    c.braid_ok(&["mirror", "extend", "-N", "-c", "1", "-p", "cool", &c.url("/m")]);

    // A plain file written through the mount gets a second mirror with its bytes.
    let plain = pattern(5 << 20, 2);
    c.braid_ok(&["setstripe", "-c", "2", "-p", "hot", &c.url("/plain")]);
    std::fs::write(m.path("plain"), &plain).unwrap();
    c.braid_ok(&["mirror", "extend", "-N", "-p", "cool", &c.url("/plain")]);
    let comps = mirrors_of(&c, "/plain");
    assert_eq!(comps.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 2], "{comps:?}");
    assert!(comps[1].2.len() == 2 && comps[1].2.iter().all(|o| *o >= 2), "two stripes, as the first: {comps:?}");
    c.braid_ok(&["mirror", "verify", &c.url("/plain")]);

    // The hot pool's OSS is killed: both files read whole from their cool mirrors,
    // by a new native client and through the mount (its cached pages dropped).
    c.kill("oss0");
    assert!(c.get("/m") == data, "/m read with OST0000 and OST0001 down");
    assert!(c.get("/plain") == plain, "/plain read with OST0000 and OST0001 down");
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    assert!(std::fs::read(m.path("plain")).unwrap() == plain, "the mount reads the cool mirror too");
    c.restart("oss0");
    c.wait_osts_up(4, Duration::from_secs(30));

    // Dropping the hot mirror leaves the file whole on cool, and its objects go.
    let before = object_files(&c);
    c.braid_ok(&["mirror", "split", "--mirror-id", "1", "-d", &c.url("/plain")]);
    let comps = mirrors_of(&c, "/plain");
    assert!(comps.is_empty() || comps.iter().all(|c| c.0 == 2), "{comps:?}");
    assert!(c.get("/plain") == plain);
    wait_for("the split mirror's objects to be destroyed", Duration::from_secs(30), || object_files(&c) <= before - 2);
    // One copy left: a plain file again (as Lustre makes it), which has no mirror to split.
    let left = c.braid_ok(&["getstripe", &c.url("/plain")]);
    assert!(!left.contains("lcm_mirror_count") && left.contains("lmm_pool:          cool"), "{left}");
    fails_with(&c, &["mirror", "split", "--mirror-id", "2", "-d", &c.url("/plain")], "has no mirror 2");
}

#[test]
fn a_preferred_mirror_takes_the_writes_and_bad_mirror_commands_are_clear_errors() {
    let mut c = cluster();
    let m = Mount::new(&c, "");
    c.braid_ok(&["mirror", "create", "-N", "-p", "hot", "-N", "-p", "cool", "--flags=prefer", &c.url("/p")]);
    let comps = mirrors_of(&c, "/p");
    assert_eq!((comps[0].1.as_str(), comps[1].1.as_str()), ("init", "init,prefer"), "{comps:?}");
    let data = pattern(1 << 20, 3);
    std::fs::write(m.path("p"), &data).unwrap();
    let comps = mirrors_of(&c, "/p");
    assert_eq!((comps[0].1.as_str(), comps[1].1.as_str()), ("init,stale", "init,prefer"), "{comps:?}");
    assert!(std::fs::read(m.path("p")).unwrap() == data);

    // Refused, each with what is wrong, and the file left as it was.
    let held = std::fs::OpenOptions::new().write(true).open(m.path("p")).unwrap();
    fails_with(&c, &["mirror", "resync", &c.url("/p")], "open on another client");
    drop(held);
    // Split off into a file of its own, mirror 2 would take the last in-sync copy
    // along: refused, and the new file made for it goes again.
    fails_with(&c, &["mirror", "split", "--mirror-id", "2", &c.url("/p")], "no in-sync copy");
    assert!(!c.braid(&["stat", &c.url("/p.mirror~2")]).status.success(), "no file left by a refused split");
    fails_with(
        &c,
        &["mirror", "split", "--mirror-id", "2", "-d", "-f", &c.url("/x"), &c.url("/p")],
        "one or the other",
    );
    fails_with(&c, &["mirror", "split", "--mirror-id", "7", "-d", &c.url("/p")], "has no mirror 7");
    fails_with(&c, &["mirror", "extend", "-p", "cool", &c.url("/p")], "before any -N");
    fails_with(&c, &["mirror", "extend", "-N", "-p", "nosuch", &c.url("/p")], "pool 'nosuch' has no OSTs");
    fails_with(&c, &["mirror", "create", "-N", "-E", "64K", "-L", "mdt", "-E", "-1", &c.url("/dom")], "Data-on-MDT");
    assert!(!c.braid(&["stat", &c.url("/dom")]).status.success(), "no file made by a refused create");
    fails_with(&c, &["mirror", "create", "-N2", &c.url("/p")], "exists");
    std::fs::create_dir(m.path("d")).unwrap();
    fails_with(&c, &["mirror", "verify", &c.url("/d")], "regular file");
    fails_with(&c, &["mirror", "frobnicate", &c.url("/p")], "unknown mirror command");
    fails_with(&c, &["setstripe", "--component-add", "-E", "-1", &c.url("/p")], "braid mirror extend and split");
    let comps = mirrors_of(&c, "/p");
    assert_eq!((comps[0].1.as_str(), comps[1].1.as_str()), ("init,stale", "init,prefer"), "unchanged: {comps:?}");
    // A resync that cannot write its copy (the stale mirror's OSS is down) fails and
    // leaves the file as it was, readable; run again once the OSS is back, it works.
    c.kill("oss0");
    let out = c.braid(&["mirror", "resync", "--timeout-s", "2", &c.url("/p")]);
    assert!(!out.status.success(), "a resync onto a stopped OSS: {}", String::from_utf8_lossy(&out.stdout));
    let comps = mirrors_of(&c, "/p");
    assert_eq!((comps[0].1.as_str(), comps[1].1.as_str()), ("init,stale", "init,prefer"), "unchanged: {comps:?}");
    assert!(c.get("/p") == data, "read from the in-sync mirror meanwhile");
    c.restart("oss0");
    // The MDS checks a new layout's OSTs against what the MGS tells it: up again.
    c.wait_placement(4, Duration::from_secs(30));
    c.braid_ok(&["mirror", "resync", &c.url("/p")]);
    assert!(mirrors_of(&c, "/p").iter().all(|c| !c.1.contains("stale")));
    c.braid_ok(&["mirror", "verify", &c.url("/p")]);
}
