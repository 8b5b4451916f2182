//! `braid fsck` on a real cluster in use (issue 42, item 3): an object file deleted
//! from an OST, a stray object added, and a link count damaged are each found, with
//! the file and the byte ranges that now read as zeros, while a workload runs and
//! without a false finding; `--repair` repairs each (the stray to lost+found/), and a
//! second run is clean. An OST that cannot be listed is reported and left alone.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proto::msg::{Creds, FsckFix, Request};
use proto::{Fid, ObjectId};
use testkit::{pattern, Cluster, ClusterSpec, Mount};

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The FID `braid stat` prints (`[0xSEQ:0xOID:0xVER]`).
fn fid_of(c: &Cluster, path: &Path) -> Fid {
    let out = c.braid_ok(&["stat", &s(path)]);
    let f = out.split("FID: [").nth(1).and_then(|r| r.split(']').next()).unwrap_or_else(|| panic!("{out}"));
    let n: Vec<u64> = f.split(':').map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap()).collect();
    Fid { seq: n[0], oid: n[1] as u32, ver: n[2] as u32 }
}

fn links(c: &Cluster, path: &Path) -> u32 {
    let out = c.braid_ok(&["stat", &s(path)]);
    out.split("Links: ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap().parse().unwrap()
}

fn object_path(c: &Cluster, ost: usize, o: &ObjectId) -> PathBuf {
    c.ost_dir(ost).join("objects").join(o.bucket()).join(o.file_name())
}

/// `braid fsck URL ARGS --json`: its exit status and report.
fn fsck(c: &Cluster, args: &[&str]) -> (i32, serde_json::Value) {
    let url = c.url("/");
    let out = c.braid(&[&["fsck", &url, "--json"][..], args].concat());
    let text = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("fsck --json ({e}): {text}\n{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), v)
}

fn kinds(report: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> =
        report["findings"].as_array().unwrap().iter().map(|f| f["kind"].as_str().unwrap().to_string()).collect();
    k.sort();
    k
}

#[test]
fn fsck_finds_and_repairs_lost_stray_and_miscounted_while_files_change() {
    let c = Cluster::start(
        Path::new(env!("CARGO_BIN_EXE_braid")),
        ClusterSpec { osts_per_oss: vec![2], ..Default::default() },
    );
    let m = Mount::new(&c, "");
    std::fs::create_dir(m.path("d")).unwrap();
    c.braid_ok(&["setstripe", "-c", "2", "-S", "1M", &s(&m.path("d"))]);
    let data = pattern(4 << 20, 3);
    std::fs::write(m.path("d/big"), &data).unwrap();
    std::fs::write(m.path("d/small"), b"small").unwrap();
    std::fs::hard_link(m.path("d/small"), m.path("d/small-link")).unwrap();

    // A workload of creates, writes, renames and unlinks all along.
    let stop = Arc::new(AtomicBool::new(false));
    std::fs::create_dir(m.path("busy")).unwrap();
    let worker = {
        let (stop, dir) = (stop.clone(), m.path("busy"));
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let f = dir.join(format!("f{n}"));
                std::fs::write(&f, pattern(70_000 + (n as usize % 5) * 100_000, n)).unwrap();
                std::fs::rename(&f, dir.join(format!("g{n}"))).unwrap();
                if n >= 3 {
                    std::fs::remove_file(dir.join(format!("g{}", n - 3))).unwrap();
                }
                n += 1;
            }
            n
        })
    };

    let (rc, clean) = fsck(&c, &[]);
    assert_eq!((rc, kinds(&clean)), (0, vec![]), "a sound file system under a workload: {clean:#}");
    assert!(clean["inodes"].as_u64().unwrap() >= 5 && clean["objects"].as_u64().unwrap() >= 2, "{clean:#}");

    // 1. The object of big's second stripe deleted from its OST.
    let big = fid_of(&c, &m.path("d/big"));
    let layout = c.braid_ok(&["getstripe", &s(&m.path("d/big"))]);
    let objs = testkit::getstripe_objects(&layout);
    let (ost1, _) = objs[1];
    let lost = ObjectId { fid: big, component: 0, stripe: 1 };
    let lost = (0..4)
        .map(|component| ObjectId { component, ..lost })
        .find(|o| object_path(&c, ost1 as usize, o).exists())
        .unwrap_or_else(|| panic!("big's stripe 1 on OST {ost1}: {layout}"));
    std::fs::remove_file(object_path(&c, ost1 as usize, &lost)).unwrap();
    // 2. A stray object: a copy under the name of a file that does not exist.
    let stray = ObjectId { fid: Fid { oid: big.oid + 100_000, ..big }, component: lost.component, stripe: 0 };
    std::fs::copy(object_path(&c, objs[0].0 as usize, &ObjectId { stripe: 0, ..lost }), object_path(&c, 0, &stray))
        .unwrap();
    // 3. A link count damaged: 'small' has two names, its inode now says 5.
    let small = fid_of(&c, &m.path("d/small"));
    assert_eq!(links(&c, &m.path("d/small")), 2);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let secret = proto::auth::Secret::load(&c.secret).unwrap();
        let mds = rpc::RpcClient::new(c.addr("mds"), rpc::Identity::new("admin", secret), Default::default());
        let fix = FsckFix::LinkCount { fid: small, was: 2, nlink: 5 };
        mds.call(&Request::MdsFsckRepair { creds: Creds::root(), fix }, vec![]).await.expect("damage the link count");
    });

    let (rc, found) = fsck(&c, &[]);
    assert_eq!(rc, 1, "{found:#}");
    assert_eq!(kinds(&found), ["dangling_object", "link_count", "orphan_object"], "{found:#}");
    let finding =
        |kind: &str| found["findings"].as_array().unwrap().iter().find(|f| f["kind"] == kind).unwrap().clone();
    let dangling = finding("dangling_object");
    assert_eq!(dangling["path"], "/d/big", "{dangling}");
    let d = dangling["detail"].as_str().unwrap();
    assert!(d.contains("2097152 bytes read as zeros") && d.contains("[1048576, 2097152) [3145728, 4194304)"), "{d}");
    assert!(finding("orphan_object")["detail"].as_str().unwrap().contains(&stray.file_name()));
    assert_eq!(finding("link_count")["path"], "/d/small");
    assert!(object_path(&c, 0, &stray).exists(), "a dry run touches nothing");

    let (rc, repaired) = fsck(&c, &["--repair"]);
    assert_eq!(rc, 0, "{repaired:#}");
    assert!(repaired["findings"].as_array().unwrap().iter().all(|f| f["repaired"] == true), "{repaired:#}");
    assert!(!object_path(&c, 0, &stray).exists());
    assert!(c.ost_dir(0).join("lost+found").join(stray.file_name()).exists(), "the stray kept in lost+found/");
    assert_eq!(links(&c, &m.path("d/small")), 2);
    let (rc, after) = fsck(&c, &[]);
    assert_eq!((rc, kinds(&after)), (0, vec![]), "{after:#}");

    stop.store(true, Ordering::Relaxed);
    let rounds = worker.join().unwrap();
    assert!(rounds > 3, "the workload ran along ({rounds} rounds)");
    // The lost stripe reads as zeros, as fsck said; the rest is intact.
    let back = std::fs::read(m.path("d/big")).unwrap();
    for (i, chunk) in back.chunks(1 << 20).enumerate() {
        if i % 2 == 1 {
            assert!(chunk.iter().all(|&b| b == 0), "MiB {i} of big was on the lost object");
        } else {
            assert!(chunk == &data[i << 20..(i + 1) << 20], "MiB {i} of big is intact");
        }
    }
}

#[test]
fn an_ost_that_cannot_be_listed_is_reported_and_left_alone() {
    let mut c = Cluster::start(
        Path::new(env!("CARGO_BIN_EXE_braid")),
        ClusterSpec { osts_per_oss: vec![1, 1], target_timeout_ms: 1500, ..Default::default() },
    );
    let m = Mount::new(&c, "");
    std::fs::write(m.path("f"), b"data").unwrap();
    c.stop("oss1");
    testkit::wait_for("OST1 marked down", Duration::from_secs(30), || {
        c.braid(&["df", &c.url("/")]).stdout.windows(4).any(|w| w == b"down") || !c.alive("oss1")
    });
    std::thread::sleep(Duration::from_secs(3));
    let (rc, report) = fsck(&c, &["--repair"]);
    assert_eq!(rc, 1, "{report:#}");
    let unchecked: Vec<&serde_json::Value> =
        report["findings"].as_array().unwrap().iter().filter(|f| f["kind"] == "unchecked").collect();
    assert_eq!(unchecked.len(), 1, "{report:#}");
    assert!(unchecked[0]["detail"].as_str().unwrap().contains("OST0001"), "{report:#}");
    assert!(
        report["findings"].as_array().unwrap().iter().all(|f| f["kind"] == "unchecked"),
        "nothing judged from a partial view: {report:#}"
    );
}
