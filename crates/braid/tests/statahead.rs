//! Statahead through real processes: a client whose lookups walk a directory gets the
//! entries' attributes in bulk (far fewer MDS requests than lookups), and what it
//! answers from them is never older than its own changes, never served to other
//! credentials, and never older than the statahead age for other clients' changes.
//! Through two `braid mount` processes, a reader walking a directory another mount
//! rewrote reads the new bytes whole.

use std::fs;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use client::{Client, SetAttr};
use proto::msg::{Creds, OpenFlags};
use proto::{Errno, Fid};
use testkit::{pattern, runtime, wait_for, Cluster, ClusterSpec, Mount, WAIT};

const RW: OpenFlags = OpenFlags { read: true, write: true, truncate: false };

fn cluster() -> Cluster {
    Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default())
}

fn connect(rt: &tokio::runtime::Runtime, c: &Cluster, statahead: bool) -> Client {
    let mut cfg = c.client_config();
    cfg.statahead = statahead;
    testkit::connect(rt, cfg)
}

/// Makes `dir` in the root, searchable by all but listed by its owner alone, with `n`
/// files `f0`..: file `i` holds `i % 100 + 1` bytes.
fn populate(rt: &tokio::runtime::Runtime, writer: &Client, creds: &Creds, dir: &str, n: usize) -> Fid {
    let d = rt.block_on(writer.mkdir(creds, Fid::ROOT, dir, 0o711)).unwrap().fid;
    rt.block_on(async {
        for i in 0..n {
            let (f, _, _) = writer.create(creds, d, &format!("f{i}"), 0o644, true, RW, None).await.unwrap();
            writer.write(&f, 0, Bytes::from(vec![b'x'; i % 100 + 1])).await.unwrap();
            writer.close(f).await.unwrap();
        }
    });
    d
}

#[test]
fn a_walk_of_a_directory_is_answered_from_bulk_fetches_that_this_clients_changes_void() {
    let c = cluster();
    let rt = runtime();
    let creds = client::process_creds();
    let writer = connect(&rt, &c, false);
    const N: usize = 2000;
    let dir = populate(&rt, &writer, &creds, "walk", N);
    let fids: Vec<Fid> =
        (0..N).map(|i| rt.block_on(writer.lookup(&creds, dir, &format!("f{i}"))).unwrap().fid).collect();

    // Without statahead, one MDS request per lookup.
    let plain = connect(&rt, &c, false);
    let before = plain.rpc_counts().mds;
    for i in 0..200 {
        rt.block_on(plain.lookup(&creds, dir, &format!("f{i}"))).unwrap();
    }
    assert_eq!(plain.rpc_counts().mds - before, 200);

    // With it, a walk costs a small fraction, and every answer is right.
    let reader = connect(&rt, &c, true);
    let before = reader.rpc_counts().mds;
    for (i, fid) in fids.iter().enumerate() {
        let a = rt.block_on(reader.lookup(&creds, dir, &format!("f{i}"))).unwrap();
        assert_eq!((a.fid, a.size), (*fid, (i % 100 + 1) as u64), "f{i}");
    }
    let sent = reader.rpc_counts().mds - before;
    assert!(sent < N as u64 / 4, "{sent} MDS requests for {N} lookups");

    // This client's own unlink, truncate and rename are seen by its next lookups,
    // whatever was fetched before them.
    let walk_until_fetched = |from: usize| {
        let mut i = from;
        wait_for("a statahead fetch", WAIT, || {
            let _ = rt.block_on(reader.lookup(&creds, dir, &format!("f{i}")));
            i += 1;
            reader.statahead_entries() > 100
        });
        i
    };
    let next = walk_until_fetched(0);
    let (gone, cut, moved) = (next + 10, next + 11, next + 12);
    rt.block_on(reader.unlink(&creds, dir, &format!("f{gone}"))).unwrap();
    let err = rt.block_on(reader.lookup(&creds, dir, &format!("f{gone}"))).unwrap_err();
    assert_eq!(err.errno(), Errno::NoEnt, "an unlinked name is not answered from statahead");

    let next = walk_until_fetched(next + 20);
    let cut = cut.max(next + 10);
    rt.block_on(reader.setattr(&creds, fids[cut], SetAttr { size: Some(3), ..Default::default() })).unwrap();
    assert_eq!(rt.block_on(reader.lookup(&creds, dir, &format!("f{cut}"))).unwrap().size, 3);

    let next = walk_until_fetched(next + 20);
    let moved = moved.max(next + 10);
    rt.block_on(reader.rename(&creds, dir, &format!("f{moved}"), dir, "renamed", Default::default())).unwrap();
    let err = rt.block_on(reader.lookup(&creds, dir, &format!("f{moved}"))).unwrap_err();
    assert_eq!(err.errno(), Errno::NoEnt, "a renamed name is not answered from statahead");

    // Entries are fetched for one caller's credentials and answer no one else: a user
    // who may search the directory but not list it has every lookup go to the MDS.
    let next = walk_until_fetched(next + 20);
    let user = Creds { uid: 4321, gid: 4321, groups: vec![] };
    let before = reader.rpc_counts().mds;
    for i in next..next + 20 {
        rt.block_on(reader.lookup(&user, dir, &format!("f{i}"))).unwrap();
    }
    assert!(reader.rpc_counts().mds - before >= 20, "the user's lookups all went to the MDS");
}

#[test]
fn another_clients_change_is_seen_once_the_fetched_entries_are_older_than_their_age() {
    let c = cluster();
    let rt = runtime();
    let creds = client::process_creds();
    let writer = connect(&rt, &c, false);
    let dir = populate(&rt, &writer, &creds, "walk", 300);
    let reader = connect(&rt, &c, true);
    let mut i = 0;
    wait_for("a statahead fetch", WAIT, || {
        rt.block_on(reader.lookup(&creds, dir, &format!("f{i}"))).unwrap();
        i += 1;
        reader.statahead_entries() > 100
    });
    // The other client changes a file the reader has fetched, and removes another.
    let (changed, gone) = (format!("f{}", i + 5), format!("f{}", i + 6));
    let fid = rt.block_on(writer.lookup(&creds, dir, &changed)).unwrap().fid;
    rt.block_on(writer.setattr(&creds, fid, SetAttr { mode: Some(0o600), size: Some(1234), ..Default::default() }))
        .unwrap();
    rt.block_on(writer.unlink(&creds, dir, &gone)).unwrap();
    std::thread::sleep(client::statahead::TTL + Duration::from_millis(100));
    let a = rt.block_on(reader.lookup(&creds, dir, &changed)).unwrap();
    assert_eq!((a.mode & 0o777, a.size), (0o600, 1234), "the change is seen once the entry aged out");
    let err = rt.block_on(reader.lookup(&creds, dir, &gone)).unwrap_err();
    assert_eq!(err.errno(), Errno::NoEnt);
}

#[test]
fn a_mount_walking_files_another_mount_rewrote_reads_the_new_bytes_whole() {
    let c = cluster();
    let (a, b) = (Mount::new(&c, ""), Mount::new(&c, ""));
    fs::create_dir(a.path("d")).unwrap();
    const N: usize = 1500;
    let first = |i: usize| pattern(i % 700 + 1, i as u64);
    let second = |i: usize| pattern(i % 300 + 900, 7 + i as u64);
    for i in 0..N {
        fs::write(a.path(&format!("d/f{i}")), first(i)).unwrap();
    }
    // B starts walking the directory: its lookups start statahead fetches of the
    // entries ahead, with the first sizes.
    for i in 0..100 {
        assert!(fs::read(b.path(&format!("d/f{i}"))).unwrap() == first(i), "f{i}");
    }
    // A rewrites the files B reads next with other sizes, at once; B's lookups of them
    // may be answered from what was fetched before, but each open sees A's close.
    for i in 100..300 {
        fs::write(a.path(&format!("d/f{i}")), second(i)).unwrap();
    }
    for i in 100..N {
        let got = fs::read(b.path(&format!("d/f{i}"))).unwrap();
        let want = if i < 300 { second(i) } else { first(i) };
        assert!(got == want, "f{i}: B read {} bytes, want {}", got.len(), want.len());
    }
    // And once the kernel's and statahead's ages have passed, B's stat agrees too.
    std::thread::sleep(Duration::from_millis(1100));
    for i in 100..300 {
        assert_eq!(fs::metadata(b.path(&format!("d/f{i}"))).unwrap().len(), second(i).len() as u64, "f{i}");
    }
}
