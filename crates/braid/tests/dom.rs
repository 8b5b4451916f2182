//! Data-on-MDT through real server processes: a small file never touches an OST and
//! is read with one MDS round trip; a file that grows past the DoM component goes on
//! to the OSTs; the MDS's cap (`--dom-max`); fsynced DoM data across a SIGKILL of the
//! MDS; a damaged DoM block read as an error, never as data; and two FUSE mounts
//! sharing DoM files (close-to-open, disjoint writes, unlink while open, rename, links).

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use proto::msg::{OpenFlags, SetAttr};
use proto::Errno;
use testkit::{client_errno, field, pattern, runtime, stderr, within, Cluster, ClusterSpec, Mount, WAIT};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

const RW: OpenFlags = OpenFlags { read: true, write: true, truncate: false };
const RO: OpenFlags = OpenFlags { read: true, write: false, truncate: false };

/// The seed's Table 5: 64 KiB on the MDT, then 4 stripes of 1 MiB.
const TABLE5: [&str; 9] = ["setstripe", "-E", "64K", "-L", "mdt", "-E", "-1", "-c", "4"];

fn setstripe_table5(c: &Cluster, url: &str) {
    let mut args = TABLE5.to_vec();
    args.extend(["-S", "1M", url]);
    c.braid_ok(&args);
}

fn ost_objects(c: &Cluster) -> usize {
    (0..4).map(|i| c.ost_objects(i).len()).sum()
}

#[test]
fn a_small_dom_file_lives_on_the_mdt_and_is_read_in_one_round_trip() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    c.wait_placement(4, WAIT);
    c.braid_ok(&["mkdir", &c.url("/d")]);
    setstripe_table5(&c, &c.url("/d"));
    let rt = runtime();
    let cl = c.connect(&rt);
    let creds = client::process_creds();
    let dir = within(&rt, "resolve", cl.resolve(&creds, "/d", true)).expect("resolve").fid;
    let small = Bytes::from(pattern(4096, 1));
    let (f, attr, _) = within(&rt, "create", cl.create(&creds, dir, "small", 0o644, true, RW, None)).expect("create");
    assert_eq!(attr.layout.as_ref().and_then(|l| l.dom_end()), Some(64 << 10), "the directory's DoM default");
    within(&rt, "write", cl.write(&f, 0, small.clone())).expect("write");
    within(&rt, "close", cl.close(f)).expect("close");
    assert_eq!(ost_objects(&c), 0, "a file within its DoM component has no OST object");

    // Open and read: one MDS round trip, no OST one (the deferred close of the
    // writer goes out first, not within the count).
    within(&rt, "deferred closes", cl.settle_closes());
    let before = cl.rpc_counts();
    let (f, attr) = within(&rt, "open", cl.open(&creds, attr.fid, RO)).expect("open");
    assert_eq!(attr.size, 4096);
    let back = within(&rt, "read", cl.read(&f, 0, 1 << 20)).expect("read");
    let after = cl.rpc_counts();
    assert_eq!(back, small);
    assert_eq!((after.mds - before.mds, after.ost - before.ost), (1, 0), "open+read of a 4 KiB DoM file");
    within(&rt, "close", cl.close(f)).expect("close");
    // By name: the lookup, the open and the bytes in that one round trip.
    within(&rt, "deferred closes", cl.settle_closes());
    let before = cl.rpc_counts();
    let (f, _) = within(&rt, "open by name", cl.open_at(&creds, dir, "small", RO)).expect("open_at");
    let back = within(&rt, "read", cl.read(&f, 0, 1 << 20)).expect("read");
    let after = cl.rpc_counts();
    assert_eq!(back, small);
    assert_eq!((after.mds - before.mds, after.ost - before.ost), (1, 0), "lookup+open+read of a 4 KiB DoM file");
    within(&rt, "close", cl.close(f)).expect("close");
    let missing = within(&rt, "open a missing name", cl.open_at(&creds, dir, "nothing", RO));
    assert_eq!(client_errno(missing.map(|(_, a)| a)), Errno::NoEnt);

    // The CLI shows the DoM component as Lustre does.
    let gs = c.braid_ok(&["getstripe", &c.url("/d/small")]);
    assert!(gs.contains("lmm_pattern:       mdt") && gs.contains("lmm_stripe_count:  0"), "{gs}");
    assert_eq!(field(&gs, "lcme_extent.e_end"), Some("65536"), "{gs}");

    // A file that grows past 64 KiB continues on the OSTs; the two parts read as one.
    let big = Bytes::from(pattern(300 << 10, 2));
    let (f, _, _) = within(&rt, "create", cl.create(&creds, dir, "big", 0o644, true, RW, None)).expect("create");
    within(&rt, "write", cl.write(&f, 0, big.clone())).expect("write across the DoM end");
    within(&rt, "fsync", cl.fsync(&f)).expect("fsync");
    assert_eq!(within(&rt, "read", cl.read(&f, 0, 300 << 10)).expect("read"), big);
    assert!(ost_objects(&c) >= 1, "the part past the DoM component is on an OST");
    // A truncate into the DoM component cuts both; a hole punched reads as zeros.
    within(&rt, "truncate", cl.ftruncate(&creds, &f, 10_000)).expect("truncate");
    within(&rt, "punch", cl.punch_hole(&f, 100, 200)).expect("punch");
    within(&rt, "extend", cl.ftruncate(&creds, &f, 200_000)).expect("extend");
    let back = within(&rt, "read", cl.read(&f, 0, 200_000)).expect("read");
    assert_eq!(&back[..100], &big[..100]);
    assert!(back[100..300].iter().all(|&b| b == 0), "the punched hole");
    assert_eq!(&back[300..10_000], &big[300..10_000]);
    assert!(back[10_000..].iter().all(|&b| b == 0), "nothing of the old bytes past the cut");
    within(&rt, "close", cl.close(f)).expect("close");
    let glimpsed = within(&rt, "getattr", cl.getattr(attr.fid)).expect("getattr");
    assert_eq!(glimpsed.size, 4096);

    // A descriptor opened while another one's DoM write is still on its way to the
    // MDT reads that write (it returned before the open), not the bytes the open got.
    for round in 0..20u8 {
        let new = Bytes::from(vec![round + 10; 4096]);
        let got = within(&rt, "write, then open and read", async {
            let (w, _) = cl.open(&creds, attr.fid, RW).await?;
            cl.write(&w, 0, new.clone()).await?;
            let (r, _) = cl.open(&creds, attr.fid, RO).await?;
            let got = cl.read(&r, 0, 4096).await;
            cl.close(r).await?;
            cl.close(w).await?;
            got
        })
        .expect("write, then open and read");
        assert!(got == new, "round {round}: a new descriptor read bytes older than a write that returned");
    }
}

#[test]
fn the_mds_caps_dom_and_can_turn_it_off() {
    let spec = ClusterSpec { mds_args: vec!["--dom-max".into(), "64K".into()], ..Default::default() };
    let c = Cluster::start(bin(), spec);
    c.wait_placement(4, WAIT);
    let out = c.braid(&["setstripe", "-E", "128K", "-L", "mdt", "-E", "-1", &c.url("/too-big")]);
    assert!(!out.status.success(), "a DoM component above --dom-max was accepted");
    assert!(stderr(&out).contains("--dom-max"), "{}", stderr(&out));
    c.braid_ok(&["mkdir", &c.url("/d")]);
    let out = c.braid(&["setstripe", "-E", "128K", "-L", "mdt", "-E", "-1", &c.url("/d")]);
    assert!(!out.status.success() && stderr(&out).contains("--dom-max"), "{}", stderr(&out));
    c.braid_ok(&["setstripe", "-E", "64K", "-L", "mdt", "-E", "-1", &c.url("/fits")]);
    drop(c);

    let spec = ClusterSpec { mds_args: vec!["--dom-max".into(), "0".into()], ..Default::default() };
    let c = Cluster::start(bin(), spec);
    c.wait_placement(4, WAIT);
    c.braid_ok(&["setstripe", "-E", "64K", "-L", "mdt", "-E", "-1", "-c", "2", &c.url("/off")]);
    let gs = c.braid_ok(&["getstripe", &c.url("/off")]);
    assert!(!gs.contains("mdt"), "with --dom-max 0 the DoM component is dropped:\n{gs}");
    assert!(gs.contains("lmm_stripe_count:  2"), "{gs}");
}

#[test]
fn fsynced_dom_data_survives_a_sigkill_of_the_mds_and_damage_is_an_error() {
    let mut c = Cluster::start(bin(), ClusterSpec::default());
    c.wait_placement(4, WAIT);
    setstripe_table5(&c, &c.url("/f"));
    let rt = runtime();
    let cl = c.connect(&rt);
    let creds = client::process_creds();
    let fid = within(&rt, "resolve", cl.resolve(&creds, "/f", true)).expect("resolve").fid;
    let data = Bytes::from(pattern(20_000, 9));
    let (f, _) = within(&rt, "open", cl.open(&creds, fid, RW)).expect("open");
    within(&rt, "write", cl.write(&f, 0, data.clone())).expect("write");
    within(&rt, "fsync", cl.fsync(&f)).expect("fsync");
    c.kill("mds");
    c.restart("mds");
    let (g, attr) = within(&rt, "open after restart", cl.open(&creds, fid, RO)).expect("open");
    assert_eq!(attr.size, 20_000, "the size fsync published");
    assert_eq!(within(&rt, "read", cl.read(&g, 0, 20_000)).expect("read"), data);
    within(&rt, "close", cl.close(g)).expect("close");

    // The MDS killed while a DoM write is under way: the client sends it again after
    // the restart (answered from the reply cache if it had been applied), and the
    // file holds the write once.
    let more = Bytes::from(pattern(30_000, 10));
    let writer = {
        let (cl, more) = (cl.clone(), more.clone());
        rt.spawn(async move {
            let r = async {
                cl.write(&f, 20_000, more).await?;
                cl.fsync(&f).await
            }
            .await;
            (r, f)
        })
    };
    std::thread::sleep(Duration::from_millis(5));
    c.kill("mds");
    c.restart("mds");
    let (r, f) = within(&rt, "the write across the restart", writer).expect("join");
    r.expect("the write completes once the MDS is back");
    within(&rt, "close", cl.close(f)).expect("close");
    let (g, attr) = within(&rt, "open", cl.open(&creds, fid, RO)).expect("open");
    assert_eq!(attr.size, 50_000);
    let all = within(&rt, "read", cl.read(&g, 0, 50_000)).expect("read");
    assert!(all[..20_000] == data[..] && all[20_000..] == more[..], "both writes, each once");
    within(&rt, "close", cl.close(g)).expect("close");

    // Damage a DoM block record (a byte of its data flipped, the record rewritten
    // through the database as a bad disk under a checksum-less store would leave it)
    // once the MDS checkpointed and stopped. The read is then an error, never the
    // damaged bytes.
    std::thread::sleep(Duration::from_millis(1500)); // past a checkpoint
    c.stop("mds");
    wait_stopped(&mut c);
    let db_path = c.dir.path().join("mdt0").join("mdt.redb");
    let db = store::Store::open(&db_path).expect("open the MDT database");
    let dom = store::Table::new("dom", 7);
    let rows: Vec<(Vec<u8>, Vec<u8>)> = db
        .snapshot()
        .expect("snapshot")
        .range(dom, std::ops::Bound::Unbounded)
        .expect("the dom table")
        .map(|r| r.expect("a row"))
        .filter(|(k, _)| k.starts_with(&fid.to_key()))
        .collect();
    assert_eq!(rows.len(), 1, "20,000 bytes are one DoM block");
    let (key, mut value) = rows.into_iter().next().expect("one row");
    value[2000] ^= 0xff;
    let mut b = db.batch(true).expect("batch");
    b.put(dom, &key, &value).expect("put");
    b.commit().expect("commit");
    drop(db);
    c.restart("mds");
    let read = within(&rt, "read a damaged block", async {
        let (h, _) = cl.open(&creds, fid, RO).await?;
        cl.read(&h, 0, 20_000).await
    });
    match read {
        Ok(got) => panic!("a damaged DoM block was served ({} bytes, same: {})", got.len(), got == data),
        Err(e) => {
            assert_eq!(e.errno(), Errno::Io, "{e}");
            assert!(e.to_string().contains("checksum") || e.to_string().contains("corrupt"), "{e}");
        }
    }
    // The rest of the namespace still works.
    let set = SetAttr { mode: Some(0o600), ..Default::default() };
    within(&rt, "chmod", cl.setattr(&creds, fid, set)).expect("metadata of the file is intact");
    let gone = within(&rt, "lookup", cl.lookup(&creds, proto::Fid::ROOT, "nothing"));
    assert_eq!(client_errno(gone), Errno::NoEnt);

    // A database file damaged under redb is refused when the MDS starts after a crash,
    // with the reason: redb verifies its pages' checksums when it recovers a database
    // that was not closed cleanly, and nothing of it is served. (After a clean close it
    // trusts its pages at open; the DoM blocks' own checksums, above, still catch a
    // damaged block when it is read.) SIGKILL, not SIGTERM: whether a stopping MDS
    // closes its database before the process exits is a race.
    c.kill("mds");
    wait_stopped(&mut c);
    let mut raw = std::fs::read(&db_path).expect("read the MDT database");
    let needle = &data[5000..5064];
    let hits: Vec<usize> =
        raw.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| i).collect();
    assert!(!hits.is_empty(), "the DoM bytes are in the database file");
    for i in hits {
        raw[i + 10] ^= 0xff;
    }
    std::fs::write(&db_path, &raw).expect("write the damaged file");
    let out = testkit::output_within(
        std::process::Command::new(bin())
            .args(["mds", "--mgs", &c.mgs_addr, "--listen", "127.0.0.1:0", "--mdt"])
            .arg(db_path.parent().expect("the MDT directory"))
            .arg("--secret-file")
            .arg(&c.secret),
        Duration::from_secs(60),
    )
    .expect("the MDS exits");
    assert!(!out.status.success() && stderr(&out).contains("corrupt"), "{}", stderr(&out));
}

/// Waits until the MDS process has exited.
fn wait_stopped(c: &mut Cluster) {
    testkit::wait_for("the MDS to exit", WAIT, || !c.alive("mds"));
}

#[test]
fn two_mounts_share_dom_files_as_any_other() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    c.wait_placement(4, WAIT);
    let a = Mount::new(&c, "");
    let b = Mount::new(&c, "");
    std::fs::create_dir(a.path("d")).expect("mkdir");
    setstripe_table5(&c, &a.path("d").to_string_lossy());

    // Close-to-open: B sees what A wrote and closed, then A sees B's rewrite.
    std::fs::write(a.path("d/f"), b"written by A").expect("A writes");
    assert_eq!(std::fs::read(b.path("d/f")).expect("B reads"), b"written by A");
    std::fs::write(b.path("d/f"), b"B was here").expect("B rewrites");
    assert_eq!(std::fs::read(a.path("d/f")).expect("A reads again"), b"B was here");
    let gs = c.braid_ok(&["getstripe", &a.path("d/f").to_string_lossy()]);
    assert!(gs.contains("lmm_pattern:       mdt"), "{gs}");

    // Disjoint writes of one file from both mounts at once, inside and past the DoM
    // component: every byte lands.
    let shared = a.path("d/shared");
    std::fs::File::create(&shared).expect("create");
    let (pa, pb) = (pattern(96 << 10, 3), pattern(96 << 10, 4));
    let fa = std::fs::OpenOptions::new().write(true).open(&shared).expect("open A");
    let fb = std::fs::OpenOptions::new().write(true).open(b.path("d/shared")).expect("open B");
    std::thread::scope(|s| {
        s.spawn(|| fa.write_all_at(&pa, 0).expect("A's half"));
        s.spawn(|| fb.write_all_at(&pb, 96 << 10).expect("B's half"));
    });
    drop((fa, fb));
    let all = std::fs::read(b.path("d/shared")).expect("read");
    assert_eq!(all.len(), 192 << 10);
    assert!(all[..96 << 10] == pa[..] && all[96 << 10..] == pb[..], "both halves are there");

    // Unlink while open, rename, hard links and O_APPEND.
    let keep = std::fs::File::open(a.path("d/f")).expect("open");
    std::fs::remove_file(b.path("d/f")).expect("unlink through B");
    let mut buf = vec![0u8; 10];
    assert_eq!(keep.read_at(&mut buf, 0).expect("read the unlinked file"), 10);
    assert_eq!(&buf, b"B was here");
    drop(keep);
    std::fs::rename(a.path("d/shared"), a.path("d/moved")).expect("rename");
    std::fs::hard_link(a.path("d/moved"), a.path("d/link")).expect("link");
    assert_eq!(std::fs::read(b.path("d/link")).expect("read the link through B"), all);
    let mut app = std::fs::OpenOptions::new().append(true).open(b.path("d/link")).expect("open O_APPEND");
    std::io::Write::write_all(&mut app, b"end").expect("append");
    drop(app);
    let grown = std::fs::read(a.path("d/moved")).expect("read");
    assert_eq!(grown.len(), (192 << 10) + 3);
    assert_eq!(&grown[192 << 10..], b"end");

    // POSIX locks: a write lock through one mount keeps the other's out until closed.
    let open_rw = |p: std::path::PathBuf| std::fs::OpenOptions::new().read(true).write(true).open(p).expect("open");
    let (la, lb) = (open_rw(a.path("d/moved")), open_rw(b.path("d/moved")));
    assert_eq!(write_lock(&la), 0);
    let refused = write_lock(&lb);
    assert!(refused == libc::EAGAIN || refused == libc::EACCES, "the second lock got {refused}");
    drop(la);
    testkit::wait_for("the lock to go with its descriptor", WAIT, || write_lock(&lb) == 0);
}

/// `fcntl(F_SETLK)` of a write lock on the whole file: 0 or the errno.
fn write_lock(f: &std::fs::File) -> i32 {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed flock is a valid value; fcntl is given a live descriptor and a
    // pointer to it for the call only.
    unsafe {
        let mut l: libc::flock = std::mem::zeroed();
        l.l_type = libc::F_WRLCK as libc::c_short;
        l.l_whence = libc::SEEK_SET as libc::c_short;
        if libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &l) == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
        }
    }
}

#[test]
fn hostile_layout_and_dom_requests_get_errors_and_the_mds_keeps_serving() {
    use layout::{ComponentSpec, LayoutChange, LayoutSpec, EOF};
    use proto::msg::{Request, Response};

    let c = Cluster::start(bin(), ClusterSpec::default());
    c.wait_placement(4, WAIT);
    setstripe_table5(&c, &c.url("/f"));
    c.braid_ok(&["setstripe", "-E", "1M", "-c", "1", &c.url("/short")]);
    c.braid_ok(&["setstripe", "-c", "2", &c.url("/plain")]);
    let rt = runtime();
    let cl = c.connect(&rt);
    let creds = client::process_creds();
    let fid = |p: &str| within(&rt, "resolve", cl.resolve(&creds, p, true)).expect("resolve").fid;
    let (f, short, plain) = (fid("/f"), fid("/short"), fid("/plain"));
    let data = Bytes::from(pattern(3000, 5));
    within(&rt, "write", async {
        let (h, _) = cl.open(&creds, f, RW).await?;
        cl.write(&h, 0, data.clone()).await?;
        cl.close(h).await
    })
    .expect("a DoM file with bytes");

    let secret = proto::auth::Secret::load(&c.secret).expect("the cluster secret");
    let rpc = rpc::RpcClient::new(c.addr("mds"), rpc::Identity::new("client", secret), rpc::RpcOptions::default());
    let spec = |ends: &[u64]| LayoutSpec {
        components: ends
            .iter()
            .map(|&e| ComponentSpec { extent_end: e, stripe_count: Some(1), ..Default::default() })
            .collect(),
    };
    let many: Vec<u64> = (1..=65).map(|i| i << 20).collect();
    let mut dom_second = spec(&[2 << 20, 3 << 20]);
    dom_second.components[1] = ComponentSpec::dom(3 << 20);
    let mut wide = spec(&[EOF]);
    wide.components[0].stripe_count = Some(1 << 40);
    let mut bad_size = spec(&[EOF]);
    bad_size.components[0].stripe_size = Some(12345);
    let creds_ = creds.clone();
    let change = move |fid, change| Request::MdsLayoutChange { creds: creds_.clone(), fid, change };
    let create = |name: &str, layout: LayoutSpec| Request::MdsCreate {
        creds: creds.clone(),
        parent: proto::Fid::ROOT,
        name: name.into(),
        mode: 0o644,
        exclusive: true,
        flags: RW,
        layout: Some(layout),
    };
    let hostile = vec![
        change(short, LayoutChange::Instantiate { end: 2 << 20 }),
        change(short, LayoutChange::AddComponents(LayoutSpec { components: vec![] })),
        change(short, LayoutChange::AddComponents(spec(&many))),
        change(short, LayoutChange::AddComponents(dom_second.clone())),
        change(short, LayoutChange::AddComponents(spec(&[1 << 20]))),
        change(short, LayoutChange::DelComponents { id: Some(99) }),
        change(proto::Fid::ROOT, LayoutChange::Instantiate { end: 1 }),
        Request::MdsDomWrite { fid: plain, offset: 0, data: vec![1; 10], publish: None },
        Request::MdsDomWrite { fid: f, offset: u64::MAX - 2, data: vec![1; 10], publish: Some(0) },
        Request::MdsDomWrite { fid: f, offset: 60 << 10, data: vec![1; 8 << 10], publish: None },
        Request::MdsDomPunch { fid: proto::Fid::ROOT, size: 0 },
        Request::MdsDomGetattr { fid: plain },
        Request::MdsDomRead { fid: proto::Fid::new(1, 999_999, 0), offset: 0, len: 10 },
        Request::MdsDomRead { fid: f, offset: 0, len: u32::MAX },
        create("bad1", spec(&[4 << 20, 2 << 20])),
        create("bad2", spec(&many)),
        create("bad3", dom_second),
        create("bad4", wide),
        create("bad5", bad_size),
    ];
    for req in hostile {
        let what = format!("{req:?}");
        match within(&rt, "a hostile request", rpc.call(&req, vec![])) {
            Err(proto::RpcError::Remote(e)) => assert!(!e.message.is_empty(), "{what}: an error says why"),
            Err(e) => panic!("{what}: not an error answer but {e}"),
            Ok(reply) => panic!("{what} was accepted: {:?}", reply.response),
        }
    }
    // What is harmless is answered: a read past the object's end is cut there, a trim
    // past it does nothing.
    let reply =
        within(&rt, "read", rpc.call(&Request::MdsDomRead { fid: f, offset: 0, len: 1 << 20 }, vec![])).unwrap();
    assert!(matches!(reply.response, Response::Data) && reply.payload == data, "{:?}", reply.response);
    let trim = Request::MdsDomTrim { fid: f, offset: u64::MAX - 5, len: u64::MAX };
    within(&rt, "trim", rpc.call(&trim, vec![])).expect("answered");
    // An open brings a small DoM file's bytes only to a reader.
    let open = |flags| Request::MdsOpen { creds: creds.clone(), fid: f, flags };
    let wo = OpenFlags { read: false, write: true, truncate: false };
    let reply = within(&rt, "open for writing", rpc.call(&open(wo), vec![])).unwrap();
    let attrs_alone = matches!(reply.response, Response::Attr(_) | Response::OpenedWithoutXattrs { .. });
    assert!(attrs_alone && reply.payload.is_empty(), "{:?}", reply.response);
    let reply = within(&rt, "open for reading", rpc.call(&open(RO), vec![])).unwrap();
    assert!(matches!(reply.response, Response::OpenedWithData { .. }) && reply.payload == data);

    // Nothing changed, and the MDS keeps serving.
    assert_eq!(c.braid_ok(&["getstripe", "--component-count", &c.url("/short")]).trim(), "1");
    let gone = within(&rt, "lookup", cl.lookup(&creds, proto::Fid::ROOT, "bad1"));
    assert_eq!(client_errno(gone), Errno::NoEnt);
    let back = within(&rt, "read", async {
        let (h, _) = cl.open(&creds, f, RO).await?;
        cl.read(&h, 0, 10_000).await
    })
    .expect("read");
    assert_eq!(back, data);
}
