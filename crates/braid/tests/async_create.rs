//! Creates a client answers itself, through real processes: in a directory it holds
//! the lease on (Data-on-MDT, or with the default layout on OSTs), a client answers
//! creates with FIDs the MDT granted it and sends them in the background. Another client that looks finds every
//! file with the attributes the creator was told and the bytes it wrote; a caller who
//! may not write there is refused at once; the set-group-ID directory's group is
//! given; a small file's bytes go with its create; an MDS killed under the creates
//! still gets every file.

use std::path::Path;

use bytes::Bytes;
use client::Client;
use proto::msg::{Creds, OpenFlags};
use proto::{Errno, Fid};
use testkit::{within, Cluster, ClusterSpec};

const RW: OpenFlags = OpenFlags { read: true, write: true, truncate: false };

fn cluster() -> Cluster {
    Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default())
}

fn connect(rt: &tokio::runtime::Runtime, c: &Cluster, dir_leases: bool) -> Client {
    let mut cfg = c.client_config();
    cfg.dir_leases = dir_leases;
    testkit::connect(rt, cfg)
}

fn content(i: usize) -> Vec<u8> {
    testkit::pattern(100 + i % 900, i as u64)
}

/// A directory made by `holder` (which holds its lease) with seed 002's Table 5 as
/// its default layout.
fn dom_dir(c: &Cluster, rt: &tokio::runtime::Runtime, holder: &Client, name: &str, mode: u32) -> Fid {
    let creds = client::process_creds();
    let d = within(rt, "mkdir", holder.mkdir(&creds, Fid::ROOT, name, mode)).unwrap();
    let out = c.braid(&["setstripe", "--template", "seed-table5", &c.url(&format!("/{name}"))]);
    assert!(out.status.success(), "setstripe: {}", String::from_utf8_lossy(&out.stderr));
    assert!(holder.holds_dir_lease(d.fid), "the maker holds the directory's lease");
    d.fid
}

/// Creates `n` files `f0`.. in `dir`, writes each its content and closes it, the
/// closes deferred as a mount defers them.
fn write_files(rt: &tokio::runtime::Runtime, holder: &Client, creds: &Creds, dir: Fid, n: usize) -> Vec<Fid> {
    within(rt, "creates", async {
        let mut fids = Vec::new();
        for i in 0..n {
            let (f, attr, existed) = holder.create(creds, dir, &format!("f{i}"), 0o640, true, RW, None).await.unwrap();
            assert!(!existed);
            holder.write(&f, 0, Bytes::from(content(i))).await.unwrap();
            match holder.defer_flush(&f) {
                Some(ticket) => holder.finish_deferred(&f, ticket).await,
                None => holder.flush(&f).await.unwrap(),
            }
            holder.close(f).await.unwrap();
            fids.push(attr.fid);
        }
        fids
    })
}

#[test]
fn creates_in_a_leased_dom_directory_are_answered_here_and_land_whole_on_the_mds() {
    let c = cluster();
    let rt = testkit::runtime();
    let creds = client::process_creds();
    let holder = connect(&rt, &c, true);
    let dir = dom_dir(&c, &rt, &holder, "job", 0o755);
    const N: usize = 300;
    let fids = write_files(&rt, &holder, &creds, dir, N);
    let answered = holder.creates_answered_here();
    assert!(answered >= N as u64 / 2, "{answered} of {N} creates answered by the client");
    assert!(holder.holds_dir_lease(dir), "the creates kept the lease");

    // Another client's listing takes the lease back, which waits for every create.
    let other = connect(&rt, &c, false);
    let names = within(&rt, "readdir", other.readdir_all(&creds, dir)).unwrap();
    assert_eq!(names.len(), N, "every file is listed");
    for (i, fid) in fids.iter().enumerate() {
        let a = within(&rt, "lookup", other.lookup(&creds, dir, &format!("f{i}"))).unwrap();
        assert_eq!((a.fid, a.size, a.mode, a.uid, a.gid), (*fid, content(i).len() as u64, 0o640, creds.uid, creds.gid));
        assert_eq!(a.layout.as_ref().and_then(|l| l.dom_end()), Some(64 << 10), "f{i} has the directory's layout");
        let (f, _) = within(&rt, "open", other.open(&creds, *fid, RW)).unwrap();
        let got = within(&rt, "read", other.read(&f, 0, 1 << 20)).unwrap();
        assert!(got == content(i), "f{i}: {} bytes read", got.len());
        within(&rt, "close", other.close(f)).unwrap();
    }
    // The FIDs came from grants: none is the MDS's own, none twice.
    let mut sorted = fids.clone();
    sorted.sort_by_key(|f| (f.seq, f.oid));
    sorted.dedup();
    assert_eq!(sorted.len(), N);
}

/// The OST of each file's only stripe, as `other` finds it, after checking its bytes.
fn osts_of(rt: &tokio::runtime::Runtime, other: &Client, creds: &Creds, dir: Fid, names: &[String]) -> Vec<u32> {
    let mut osts = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let a = within(rt, "lookup", other.lookup(creds, dir, name)).unwrap();
        assert_eq!((a.size, a.mode, a.uid), (content(i).len() as u64, 0o640, creds.uid), "{name}");
        let layout = a.layout.clone().expect("a file has a layout");
        assert_eq!(layout.components.len(), 1, "{name}: the default layout, {layout:?}");
        assert_eq!(layout.components[0].osts.len(), 1, "{name}: one stripe, {layout:?}");
        osts.push(layout.components[0].osts[0]);
        let (f, _) = within(rt, "open", other.open(creds, a.fid, RW)).unwrap();
        let got = within(rt, "read", other.read(&f, 0, 1 << 20)).unwrap();
        assert!(got == content(i), "{name}: {} bytes read", got.len());
        within(rt, "close", other.close(f)).unwrap();
    }
    osts
}

#[test]
fn creates_with_ost_objects_are_answered_here_on_osts_the_mds_placed_and_subdirectories_start_answered() {
    let c = cluster();
    let rt = testkit::runtime();
    let creds = client::process_creds();
    let holder = connect(&rt, &c, true);
    // The file system's default layout: one 1 MiB stripe on an OST.
    let dir = within(&rt, "mkdir", holder.mkdir(&creds, Fid::ROOT, "plain", 0o755)).unwrap().fid;
    const N: usize = 200;
    write_files(&rt, &holder, &creds, dir, N);
    let answered = holder.creates_answered_here();
    assert!(answered >= N as u64 / 2, "{answered} of {N} creates answered by the client");

    // A directory made here takes its parent's template: its first create is
    // answered here too. (A chmod of the parent drops the template; the next create
    // there goes to the MDS and gives a fresh one.)
    let mode = client::SetAttr { mode: Some(0o755), ..Default::default() };
    within(&rt, "chmod", holder.setattr(&creds, dir, mode)).unwrap();
    within(&rt, "create", async {
        let (f, _, _) = holder.create(&creds, dir, "fresh", 0o640, true, RW, None).await.unwrap();
        holder.close(f).await.unwrap();
    });
    let sub = within(&rt, "mkdir", holder.mkdir(&creds, dir, "sub", 0o755)).unwrap().fid;
    let before = holder.creates_answered_here();
    let subs = write_files(&rt, &holder, &creds, sub, 4);
    assert_eq!(holder.creates_answered_here() - before, 4, "the new directory's creates were answered here");

    // Another client finds every file whole, with the default layout, spread over
    // the OSTs by the creates the MDS placed.
    let other = connect(&rt, &c, false);
    let names: Vec<String> = (0..N).map(|i| format!("f{i}")).collect();
    let mut osts = osts_of(&rt, &other, &creds, dir, &names);
    osts.sort();
    osts.dedup();
    assert!(osts.len() > 1, "{N} files all on OST {osts:?}");
    assert_eq!(osts_of(&rt, &other, &creds, sub, &names[..subs.len()]).len(), 4);

    // A default that names its OST (`setstripe -i 3`) is kept by every create.
    let fixed = within(&rt, "mkdir", holder.mkdir(&creds, Fid::ROOT, "fixed", 0o755)).unwrap().fid;
    let out = c.braid(&["setstripe", "-i", "3", &c.url("/fixed")]);
    assert!(out.status.success(), "setstripe: {}", String::from_utf8_lossy(&out.stderr));
    let before = holder.creates_answered_here();
    write_files(&rt, &holder, &creds, fixed, 40);
    assert!(holder.creates_answered_here() - before >= 20, "creates under -i answered here");
    let names: Vec<String> = (0..40).map(|i| format!("f{i}")).collect();
    assert!(osts_of(&rt, &other, &creds, fixed, &names).iter().all(|&o| o == 3), "every file on OST 3");
}

#[test]
fn a_small_files_first_bytes_go_with_its_create_in_one_request() {
    let c = cluster();
    let rt = testkit::runtime();
    let creds = client::process_creds();
    let holder = connect(&rt, &c, true);
    let dir = dom_dir(&c, &rt, &holder, "job", 0o755);
    // The first creates learn the directory's template and get a FID grant.
    write_files(&rt, &holder, &creds, dir, 5);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (answered, before) = (holder.creates_answered_here(), holder.rpc_counts().mds);
    const N: usize = 100;
    let made: Vec<Fid> = within(&rt, "creates and writes", async {
        let mut made = Vec::new();
        for i in 0..N {
            let (f, attr, _) = holder.create(&creds, dir, &format!("s{i}"), 0o640, true, RW, None).await.unwrap();
            holder.write(&f, 0, Bytes::from(content(i))).await.unwrap();
            let ticket = holder.defer_flush(&f).expect("a new small file's flush is deferred");
            holder.finish_deferred(&f, ticket).await;
            holder.close(f).await.unwrap();
            made.push(attr.fid);
        }
        made
    });
    assert_eq!(holder.creates_answered_here() - answered, N as u64, "every create was answered here");
    let sent = holder.rpc_counts().mds - before;
    // A create and a DoM write each were 2 per file; the closes go in batches.
    assert!(sent < N as u64 * 3 / 2, "{sent} MDS requests for {N} small files");

    // Bytes written elsewhere than at offset 0 first, or after the flush, take the
    // way they always took.
    let (f, late, _) = within(&rt, "create", holder.create(&creds, dir, "late", 0o640, true, RW, None)).unwrap();
    within(&rt, "write at 4 KiB", holder.write(&f, 4096, Bytes::from_static(b"tail"))).unwrap();
    within(&rt, "write at 0", holder.write(&f, 0, Bytes::from_static(b"head"))).unwrap();
    within(&rt, "flush", holder.flush(&f)).unwrap();
    within(&rt, "close", holder.close(f)).unwrap();

    let other = connect(&rt, &c, false);
    for (i, fid) in made.iter().enumerate() {
        let (f, attr) = within(&rt, "open", other.open(&creds, *fid, RW)).unwrap();
        assert_eq!(attr.size, content(i).len() as u64, "s{i}'s size");
        let got = within(&rt, "read", other.read(&f, 0, 1 << 20)).unwrap();
        assert!(got == content(i), "s{i}: {} bytes read", got.len());
        within(&rt, "close", other.close(f)).unwrap();
    }
    let (f, attr) = within(&rt, "open", other.open(&creds, late.fid, RW)).unwrap();
    assert_eq!(attr.size, 4100);
    let got = within(&rt, "read", other.read(&f, 0, 8192)).unwrap();
    let mut want = vec![0u8; 4100];
    want[..4].copy_from_slice(b"head");
    want[4096..].copy_from_slice(b"tail");
    assert!(got == want, "late: {} bytes read", got.len());
}

#[test]
fn a_caller_who_may_not_write_is_refused_at_once_and_a_set_group_id_directory_gives_its_group() {
    let c = cluster();
    let rt = testkit::runtime();
    let root = Creds::root();
    let holder = connect(&rt, &c, true);
    let dir = dom_dir(&c, &rt, &holder, "shared", 0o755);
    write_files(&rt, &holder, &root, dir, 3);
    let user = Creds { uid: 4321, gid: 4321, groups: vec![] };
    let Err(e) = within(&rt, "create", holder.create(&user, dir, "nope", 0o644, true, RW, None)) else {
        panic!("a user without write permission created a file");
    };
    assert_eq!(e.errno(), Errno::Access, "{e}");

    // A set-group-ID directory of group 50 that its members may write in.
    let sgid = dom_dir(&c, &rt, &holder, "sgid", 0o2775);
    within(&rt, "chgrp", holder.setattr(&root, sgid, client::SetAttr { gid: Some(50), ..Default::default() })).unwrap();
    let member = Creds { uid: 4321, gid: 4321, groups: vec![50] };
    let made: Vec<_> = (0..20)
        .map(|i| within(&rt, "create", holder.create(&member, sgid, &format!("g{i}"), 0o644, true, RW, None)).unwrap())
        .collect();
    assert!(holder.creates_answered_here() > 3, "creates in the set-group-ID directory were answered here");
    let other = connect(&rt, &c, false);
    for (i, (f, attr, _)) in made.into_iter().enumerate() {
        assert_eq!((attr.uid, attr.gid), (4321, 50), "g{i} as the creator was told");
        let a = within(&rt, "lookup", other.lookup(&root, sgid, &format!("g{i}"))).unwrap();
        assert_eq!((a.fid, a.uid, a.gid, a.mode), (attr.fid, 4321, 50, 0o644), "g{i} as the MDS made it");
        within(&rt, "close", holder.close(f)).unwrap();
    }
}

#[test]
fn creates_sent_in_the_background_survive_an_mds_killed_under_them() {
    let mut c = cluster();
    let rt = testkit::runtime();
    let creds = client::process_creds();
    let holder = connect(&rt, &c, true);
    let dir = dom_dir(&c, &rt, &holder, "job", 0o755);
    // A first batch makes sure the client has its template and FIDs.
    write_files(&rt, &holder, &creds, dir, 5);
    let before = holder.creates_answered_here();
    let made: Vec<_> = within(&rt, "creates", async {
        let mut made = Vec::new();
        for i in 5..200 {
            made.push(holder.create(&creds, dir, &format!("f{i}"), 0o640, true, RW, None).await.unwrap());
        }
        made
    });
    c.kill("mds");
    c.restart("mds");
    assert!(holder.creates_answered_here() > before, "creates went out in the background");
    within(&rt, "writes and closes", async {
        for (i, (f, _, _)) in made.into_iter().enumerate() {
            holder.write(&f, 0, Bytes::from(content(i + 5))).await.unwrap();
            holder.flush(&f).await.unwrap();
            holder.close(f).await.unwrap();
        }
    });
    let other = connect(&rt, &c, false);
    for i in 0..200 {
        let a = within(&rt, "lookup", other.lookup(&creds, dir, &format!("f{i}"))).unwrap();
        assert_eq!(a.size, content(i).len() as u64, "f{i} after the MDS restart");
    }
}
