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
