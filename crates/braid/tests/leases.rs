//! Directory leases through real processes. A client that makes a directory holds a
//! lease on it and answers lookups of names it did not put there with ENOENT, without
//! asking the MDS; every change to the directory's entries by anyone else must first
//! take the lease back. These tests make the other client change the directory in
//! every way there is, and check that the holder sees the change at once — also when
//! the holder is stopped (it must be evicted, and must not trust its lease when it
//! wakes), killed, or when the MDS restarts under it.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

use client::Client;
use proto::msg::{OpenFlags, RenameFlags};
use proto::{Errno, Fid};
use testkit::{runtime, wait_for, within, Cluster, ClusterSpec, Mount, WAIT};

fn cluster() -> Cluster {
    Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default())
}

fn connect(rt: &tokio::runtime::Runtime, c: &Cluster, dir_leases: bool) -> Client {
    let mut cfg = c.client_config();
    cfg.dir_leases = dir_leases;
    testkit::connect(rt, cfg)
}

const RW: OpenFlags = OpenFlags { read: true, write: true, truncate: false };

#[derive(Debug, Clone, Copy)]
enum Change {
    Create,
    Mkdir,
    Symlink,
    Link,
    RenameInto,
    Unlink,
}

#[test]
fn every_entry_change_by_another_client_revokes_the_lease_and_the_holder_sees_it() {
    let c = cluster();
    let rt = runtime();
    let creds = client::process_creds();
    let holder = connect(&rt, &c, true);
    let other = connect(&rt, &c, false);
    // Sources for the other client's link and rename, outside any leased directory.
    let (f, src, _) = rt.block_on(other.create(&creds, Fid::ROOT, "src", 0o644, true, RW, None)).unwrap();
    rt.block_on(other.close(f)).unwrap();

    for (i, change) in
        [Change::Create, Change::Mkdir, Change::Symlink, Change::Link, Change::RenameInto, Change::Unlink]
            .into_iter()
            .enumerate()
    {
        let job = rt.block_on(holder.mkdir(&creds, Fid::ROOT, &format!("job{i}"), 0o755)).unwrap();
        assert_eq!(holder.dir_leases_held(), 1, "{change:?}: mkdir granted a lease (earlier ones were revoked)");
        // The holder's own names do not disturb its lease, and it still finds them.
        for n in 0..20 {
            let (f, _, _) =
                rt.block_on(holder.create(&creds, job.fid, &format!("mine{n}"), 0o644, true, RW, None)).unwrap();
            rt.block_on(holder.close(f)).unwrap();
        }
        let mine = rt.block_on(holder.lookup(&creds, job.fid, "mine7")).expect("a name the holder made");
        let absent = rt.block_on(holder.lookup(&creds, job.fid, "x")).unwrap_err();
        assert_eq!(absent.errno(), Errno::NoEnt);
        assert_eq!(holder.dir_leases_held(), 1, "{change:?}: the holder's own changes keep the lease");

        // The other client changes the directory; it must not wait for a timeout,
        // the holder acks the revocation.
        let made = within(&rt, &format!("{change:?} by the other client"), async {
            match change {
                Change::Create => {
                    let (f, a, _) = other.create(&creds, job.fid, "x", 0o644, true, RW, None).await?;
                    other.close(f).await?;
                    Ok(Some(a.fid))
                }
                Change::Mkdir => other.mkdir(&creds, job.fid, "x", 0o755).await.map(|a| Some(a.fid)),
                Change::Symlink => other.symlink(&creds, job.fid, "x", "target").await.map(|a| Some(a.fid)),
                Change::Link => other.link(&creds, src.fid, job.fid, "x").await.map(|a| Some(a.fid)),
                Change::RenameInto => {
                    let (f, a, _) = other.create(&creds, Fid::ROOT, "moving", 0o644, true, RW, None).await?;
                    other.close(f).await?;
                    other.rename(&creds, Fid::ROOT, "moving", job.fid, "x", RenameFlags::default()).await?;
                    Ok(Some(a.fid))
                }
                Change::Unlink => other.unlink(&creds, job.fid, "mine7").await.map(|()| None),
            }
        })
        .unwrap_or_else(|e| panic!("{change:?} by the other client: {e}"));

        assert_eq!(holder.dir_leases_held(), 0, "{change:?}: the lease was revoked");
        match made {
            Some(fid) => {
                let seen = rt
                    .block_on(holder.lookup(&creds, job.fid, "x"))
                    .unwrap_or_else(|e| panic!("{change:?}: the holder does not see the other client's name: {e}"));
                assert_eq!(seen.fid, fid, "{change:?}");
            }
            None => {
                let gone = rt.block_on(holder.lookup(&creds, job.fid, "mine7")).unwrap_err();
                assert_eq!(gone.errno(), Errno::NoEnt, "{change:?}: {mine:?} was removed");
                // And the holder, without its lease, can make the name again.
                let (f, _, _) = rt.block_on(holder.create(&creds, job.fid, "mine7", 0o644, true, RW, None)).unwrap();
                rt.block_on(holder.close(f)).unwrap();
            }
        }
        // A revoked lease is not granted again: the directory is shared now.
        let (f, _, _) = rt.block_on(holder.create(&creds, job.fid, "after", 0o644, true, RW, None)).unwrap();
        rt.block_on(holder.close(f)).unwrap();
        assert_eq!(holder.dir_leases_held(), 0);
    }
}

#[test]
fn a_long_lived_holder_gives_back_the_leases_it_pushes_out_and_keeps_getting_new_ones() {
    let c = cluster();
    let rt = runtime();
    let creds = client::process_creds();
    let holder = connect(&rt, &c, true);
    let top = rt.block_on(holder.mkdir(&creds, Fid::ROOT, "many", 0o755)).unwrap();
    // More directories than the MDS grants one connection (8,192) while the client
    // keeps 4,096: only the leases it gives back make room for new ones.
    let mkdirs = async {
        let mut last = None;
        for i in 0..9_000 {
            last = Some(holder.mkdir(&creds, top.fid, &format!("d{i}"), 0o755).await?);
        }
        client::Result::Ok(last)
    };
    let dirs = rt.block_on(async { tokio::time::timeout(Duration::from_secs(300), mkdirs).await });
    let newest = dirs.expect("9,000 mkdirs within 5 minutes").expect("mkdirs").expect("a directory");
    assert!(holder.holds_dir_lease(newest.fid), "the newest directory is leased");
    assert_eq!(holder.dir_leases_held(), 4096);
    let absent = rt.block_on(holder.lookup(&creds, newest.fid, "x")).unwrap_err();
    assert_eq!(absent.errno(), Errno::NoEnt);
}

#[test]
fn a_client_without_leases_asks_for_none() {
    let c = cluster();
    let rt = runtime();
    let creds = client::process_creds();
    let plain = connect(&rt, &c, false);
    rt.block_on(plain.mkdir(&creds, Fid::ROOT, "d", 0o755)).unwrap();
    assert_eq!(plain.dir_leases_held(), 0);
}

#[test]
fn unlinks_under_a_lease_are_answered_here_and_every_later_look_sees_them_done() {
    let c = cluster();
    let rt = runtime();
    let creds = client::process_creds();
    let holder = connect(&rt, &c, true);
    let other = connect(&rt, &c, false);
    const N: usize = 200;
    let fill = |dir: &str| {
        let job = rt.block_on(holder.mkdir(&creds, Fid::ROOT, dir, 0o755)).unwrap();
        within(&rt, "creates", async {
            for n in 0..N {
                let (f, _, _) = holder.create(&creds, job.fid, &format!("f{n}"), 0o644, true, RW, None).await?;
                holder.write(&f, 0, bytes::Bytes::from(vec![n as u8; 100])).await?;
                holder.close(f).await?;
            }
            client::Result::Ok(())
        })
        .unwrap();
        job
    };

    // Emptied, then removed at once by the holder: the rmdir waits for the unlinks.
    let job = fill("job");
    let before = holder.unlinks_answered_here();
    within(&rt, "unlinks and the rmdir", async {
        for n in 0..N {
            holder.unlink_vetted(&creds, job.fid, &format!("f{n}")).await?;
        }
        holder.rmdir(&creds, Fid::ROOT, "job").await
    })
    .expect("the directory emptied by unlinks answered here is removed at once");
    // The directory's attributes, as its creates left them, are kept for a second
    // only; past that an unlink goes to the MDS and brings them back.
    assert!(holder.unlinks_answered_here() > before, "unlinks in a leased directory are answered here");

    // Emptied, then listed and looked into by another client at once: its look takes
    // the lease back, and the revocation's ack waits for the unlinks.
    let job = fill("job2");
    within(&rt, "unlinks", async {
        for n in 0..N {
            holder.unlink_vetted(&creds, job.fid, &format!("f{n}")).await?;
        }
        client::Result::Ok(())
    })
    .unwrap();
    let held = holder.dir_leases_held();
    let listed = within(&rt, "the other client's listing", other.readdir_all(&creds, job.fid)).unwrap();
    assert!(listed.is_empty(), "the other client lists {} removed names", listed.len());
    for n in 0..N {
        let r = within(&rt, "lookup", other.lookup(&creds, job.fid, &format!("f{n}")));
        assert_eq!(r.unwrap_err().errno(), Errno::NoEnt, "f{n} is gone for the other client");
    }
    assert_eq!(holder.dir_leases_held(), held - 1, "the other client's look took the lease back");

    // One the MDS refuses after all (here a directory, which the kernel would never
    // have let through) drops the lease and fails the next fsync of the directory.
    let job = rt.block_on(holder.mkdir(&creds, Fid::ROOT, "job3", 0o755)).unwrap();
    let held = holder.dir_leases_held();
    let sub = rt.block_on(holder.mkdir(&creds, job.fid, "sub", 0o755)).unwrap();
    assert_eq!(holder.dir_leases_held(), held + 1);
    let answered = holder.unlinks_answered_here();
    within(&rt, "unlink", holder.unlink_vetted(&creds, job.fid, "sub")).expect("answered here");
    assert_eq!(holder.unlinks_answered_here(), answered + 1);
    let synced = within(&rt, "fsync of the directory", holder.sync_metadata(job.fid));
    assert_eq!(synced.unwrap_err().errno(), Errno::Io, "the refused unlink is reported");
    within(&rt, "again", holder.sync_metadata(job.fid)).expect("once");
    assert_eq!(within(&rt, "lookup", holder.lookup(&creds, job.fid, "sub")).unwrap().fid, sub.fid);
    assert_eq!(holder.dir_leases_held(), held, "job3's lease was dropped, sub's kept");
}

#[test]
fn attribute_changes_of_a_file_created_under_a_lease_are_answered_here_and_land_before_anyone_looks() {
    use proto::msg::{SetAttr, TimeSet, Timespec};
    let c = cluster();
    let rt = runtime();
    let creds = client::process_creds();
    let holder = connect(&rt, &c, true);
    let other = connect(&rt, &c, false);
    let job = rt.block_on(holder.mkdir(&creds, Fid::ROOT, "job", 0o755)).unwrap();
    let (f, made, _) = rt.block_on(holder.create(&creds, job.fid, "f", 0o644, true, RW, None)).unwrap();
    within(&rt, "write", holder.write(&f, 0, bytes::Bytes::from_static(b"twelve bytes"))).unwrap();
    let at = |sec| Some(TimeSet::At(Timespec { sec, nsec: 0 }));
    let answered = holder.setattrs_answered_here();
    let changes = [
        SetAttr { uid: Some(4242), gid: Some(4343), ..Default::default() },
        SetAttr { mode: Some(0o640), ..Default::default() },
        SetAttr { atime: at(100), mtime: at(200), ..Default::default() },
    ];
    for set in &changes {
        let a = rt.block_on(holder.setattr_behind(&creds, made.fid, set)).expect("answered here");
        assert_eq!(a.size, 12, "the handle's size");
    }
    assert_eq!(holder.setattrs_answered_here(), answered + 3);
    // Its attributes and (no) xattrs are known here while no one else can find it.
    let mds = holder.rpc_counts().mds;
    let known = holder.attr_behind(made.fid).expect("known here");
    assert_eq!((known.uid, known.mode, known.mtime.sec, known.size), (4242, 0o640, 200, 12));
    assert!(within(&rt, "listxattr", holder.listxattr(&creds, made.fid)).unwrap().is_empty());
    let none = within(&rt, "getxattr", holder.getxattr(&creds, made.fid, "user.k"));
    assert_eq!(none.unwrap_err().errno(), Errno::NoData);
    assert_eq!(holder.rpc_counts().mds, mds, "answered without a request");
    // The other client's first look takes the lease back; the ack waits for them.
    let seen = within(&rt, "the other client's lookup", other.lookup(&creds, job.fid, "f")).unwrap();
    assert_eq!((seen.uid, seen.gid, seen.mode, seen.atime.sec, seen.mtime.sec), (4242, 4343, 0o640, 100, 200));
    // The lease is gone: the next change goes to the MDS, and the close's size
    // report leaves the mtime set above alone.
    let set = SetAttr { mode: Some(0o600), ..Default::default() };
    assert!(rt.block_on(holder.setattr_behind(&creds, made.fid, &set)).is_none(), "no lease, no answer here");
    within(&rt, "setattr", holder.setattr(&creds, made.fid, set)).unwrap();
    within(&rt, "flush", holder.flush(&f)).unwrap();
    within(&rt, "close", holder.close(f)).unwrap();
    let seen = within(&rt, "getattr", other.getattr(made.fid)).unwrap();
    assert_eq!((seen.mode, seen.size, seen.mtime.sec), (0o600, 12, 200));

    // A set-group-ID bit is the MDS's to judge: that change, and every later one of
    // the file, goes to it.
    let job2 = rt.block_on(holder.mkdir(&creds, Fid::ROOT, "job2", 0o755)).unwrap();
    let (f, made, _) = rt.block_on(holder.create(&creds, job2.fid, "g", 0o644, true, RW, None)).unwrap();
    let sgid = SetAttr { mode: Some(0o2755), ..Default::default() };
    assert!(rt.block_on(holder.setattr_behind(&creds, made.fid, &sgid)).is_none());
    let plain = SetAttr { mode: Some(0o755), ..Default::default() };
    assert!(rt.block_on(holder.setattr_behind(&creds, made.fid, &plain)).is_none(), "given up for the file");
    assert!(holder.attr_behind(made.fid).is_none(), "and its attributes are the MDS's to tell");
    within(&rt, "close", holder.close(f)).unwrap();
}

/// Makes `job` through mount `a` and has `a` look up an absent name in it (answered
/// from its lease).
fn lease_through_the_mount(a: &Mount) {
    fs::create_dir(a.path("job")).unwrap();
    fs::write(a.path("job/mine"), b"a's file").unwrap();
    assert_eq!(fs::metadata(a.path("job/x")).unwrap_err().kind(), ErrorKind::NotFound);
}

#[test]
fn a_holder_that_stops_answering_is_evicted_and_does_not_trust_its_lease_when_it_wakes() {
    let c = cluster();
    let rt = runtime();
    let creds = client::process_creds();
    let a = Mount::new(&c, "");
    lease_through_the_mount(&a);
    let other = connect(&rt, &c, false);
    let job = within(&rt, "lookup", other.lookup(&creds, Fid::ROOT, "job")).unwrap();

    // The holder can ack nothing while stopped: the MDS must evict it rather than wait.
    a.signal(libc::SIGSTOP);
    let made = within(&rt, "a create in the stopped holder's directory", async {
        let (f, attr, _) = other.create(&creds, job.fid, "x", 0o644, true, RW, None).await?;
        other.write(&f, 0, bytes::Bytes::from_static(b"from the other client")).await?;
        other.close(f).await?;
        client::Result::Ok(attr)
    });
    a.signal(libc::SIGCONT);
    made.expect("the other client's create went through");

    // Awake, the holder's first look at the directory goes to the MDS.
    assert_eq!(fs::read(a.path("job/x")).expect("the holder sees the new file"), b"from the other client");
    fs::write(a.path("job/y"), b"still works").unwrap();
    assert_eq!(within(&rt, "lookup", other.lookup(&creds, job.fid, "y")).unwrap().size, 11);
    let mut names: Vec<String> =
        fs::read_dir(a.path("job")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["mine", "x", "y"]);
}

/// A holder cut off with a create and an unlink it answered itself still to send
/// (its requests to the MDS held back longer than a revocation is waited for) is
/// evicted when another client looks: the look goes on without them, the late
/// changes are refused when they come, the holder reports them (the file's fsync,
/// the directory's), and the other client never sees the name appear or go late.
#[test]
fn a_cut_off_holders_late_changes_are_refused_and_reported() {
    let c = cluster();
    let rt = runtime();
    let creds = client::process_creds();
    let holder = connect(&rt, &c, true);
    let other = connect(&rt, &c, false);
    let job = rt.block_on(holder.mkdir(&creds, Fid::ROOT, "job", 0o755)).unwrap();
    // Creates until one is answered here (the first gives the template, and a FID
    // grant comes back in the background), all landed.
    let mut n = 0;
    while holder.creates_answered_here() == 0 {
        assert!(n < 50, "no create answered in the leased directory");
        let (f, _, _) =
            within(&rt, "create", holder.create(&creds, job.fid, &format!("f{n}"), 0o644, true, RW, None)).unwrap();
        within(&rt, "close", holder.close(f)).unwrap();
        n += 1;
    }
    rt.block_on(holder.deferred_idle());
    let kept = format!("f{}", n - 1);

    holder.set_mds_latency(Duration::from_secs(8));
    let (unlinks, creates) = (holder.unlinks_answered_here(), holder.creates_answered_here());
    within(&rt, "unlink", holder.unlink_vetted(&creds, job.fid, &kept)).unwrap();
    let (late, _, _) = within(&rt, "create", holder.create(&creds, job.fid, "late", 0o644, true, RW, None)).unwrap();
    assert_eq!(holder.unlinks_answered_here(), unlinks + 1, "the unlink is answered by the holder");
    assert_eq!(holder.creates_answered_here(), creates + 1, "the create is answered by the holder");

    let names = |what| {
        let listed = within(&rt, what, other.readdir_all(&creds, job.fid)).unwrap();
        let mut names: Vec<String> = listed.into_iter().map(|e| e.name).collect();
        names.sort();
        names
    };
    let first = names("the other client's listing, once the holder is evicted");
    assert!(first.contains(&kept) && !first.contains(&"late".to_string()), "{first:?}");
    // Past the holder's delay: its late changes came, and were refused.
    std::thread::sleep(Duration::from_secs(9));
    assert_eq!(names("a listing after the late changes"), first, "nothing appears or goes late");
    assert!(within(&rt, "lookup", other.lookup(&creds, job.fid, &kept)).is_ok());

    holder.set_mds_latency(Duration::ZERO);
    let e = within(&rt, "fsync of the refused create", holder.fsync(&late)).expect_err("the create was refused");
    assert!(e.to_string().contains("refused"), "{e}");
    let e = within(&rt, "fsync of the directory", holder.sync_metadata(job.fid)).expect_err("the unlink was refused");
    assert!(e.to_string().contains(&kept) && e.to_string().contains("refused"), "{e}");
}

#[test]
fn a_dead_holder_does_not_hold_up_other_clients() {
    let c = cluster();
    let rt = runtime();
    let creds = client::process_creds();
    let mut a = Mount::new(&c, "");
    lease_through_the_mount(&a);
    a.kill();
    let other = connect(&rt, &c, false);
    let job = within(&rt, "lookup", other.lookup(&creds, Fid::ROOT, "job")).unwrap();
    within(&rt, "a mkdir in the dead holder's directory", other.mkdir(&creds, job.fid, "x", 0o755))
        .expect("the other client's mkdir went through");
    let names: Vec<String> =
        within(&rt, "readdir", other.readdir_all(&creds, job.fid)).unwrap().into_iter().map(|e| e.name).collect();
    assert!(names.contains(&"x".to_string()) && names.contains(&"mine".to_string()), "{names:?}");
}

#[test]
fn leases_end_with_an_mds_restart() {
    let mut c = cluster();
    let rt = runtime();
    let creds = client::process_creds();
    let holder = connect(&rt, &c, true);
    let job = rt.block_on(holder.mkdir(&creds, Fid::ROOT, "job", 0o755)).unwrap();
    assert_eq!(holder.dir_leases_held(), 1);
    assert_eq!(rt.block_on(holder.lookup(&creds, job.fid, "x")).unwrap_err().errno(), Errno::NoEnt);

    c.kill("mds");
    c.restart("mds");
    let other = connect(&rt, &c, false);
    let made = within(&rt, "a create after the MDS restart", async {
        let (f, a, _) = other.create(&creds, job.fid, "x", 0o644, true, RW, None).await?;
        other.close(f).await?;
        client::Result::Ok(a)
    })
    .expect("create after the restart");
    let seen = within(&rt, "the holder's lookup", holder.lookup(&creds, job.fid, "x"))
        .expect("the holder's lease did not outlive the MDS it was granted by");
    assert_eq!(seen.fid, made.fid);
}

#[test]
fn two_mounts_take_turns_in_one_directory() {
    let c = cluster();
    let a = Mount::new(&c, "");
    let b = Mount::new(&c, "");
    fs::create_dir(a.path("shared")).unwrap();
    fs::create_dir(b.path("theirs")).unwrap();
    // Each side makes a name the other must see at once: the first change by the
    // other side revokes each lease, and no lease comes back.
    for i in 0..20 {
        fs::write(a.path(&format!("shared/a{i}")), format!("a{i}")).unwrap();
        assert_eq!(fs::read_to_string(b.path(&format!("shared/a{i}"))).unwrap(), format!("a{i}"));
        fs::write(b.path(&format!("shared/b{i}")), format!("b{i}")).unwrap();
        assert_eq!(fs::read_to_string(a.path(&format!("shared/b{i}"))).unwrap(), format!("b{i}"));

        fs::write(b.path(&format!("theirs/b{i}")), "").unwrap();
        assert!(a.path(&format!("theirs/b{i}")).exists());
        fs::create_dir(a.path(&format!("theirs/a{i}"))).unwrap();
        assert!(b.path(&format!("theirs/a{i}")).is_dir());
    }
    wait_for("both listings to agree", WAIT, || {
        let list = |m: &Mount| {
            let mut v: Vec<_> = fs::read_dir(m.path("shared")).unwrap().map(|e| e.unwrap().file_name()).collect();
            v.sort();
            v
        };
        let (la, lb) = (list(&a), list(&b));
        la.len() == 40 && la == lb
    });
}

/// Where `got` differs from `want`, for a failure message.
fn differs(got: &[u8], want: &[u8]) -> String {
    let at = got.iter().zip(want).position(|(g, w)| g != w).unwrap_or(got.len().min(want.len()));
    let zeros = got[at.min(got.len())..].iter().take_while(|b| **b == 0).count();
    format!("{} bytes of {}, first differing at {at}, {zeros} zero bytes from there", got.len(), want.len())
}

/// What file `i` of [`files_closed_in_a_leased_directory_are_whole_for_another_client_at_once`]
/// holds: small ones and ones past a DoM component, each different.
fn content(i: usize) -> Vec<u8> {
    let len = if i.is_multiple_of(3) { 300 << 10 } else { 3000 + i };
    (0..len).map(|b| (b * 7 + i * 13) as u8).collect()
}

/// The holder's close of a file it made in its leased directory returns before the
/// flush is done (the client's `deferred`). Another client that looks into the
/// directory must still find every file whole at once, however it looks: its lookup,
/// listing or create takes the lease back, and the holder acks only once its
/// flushes are done. The files most likely still flushing are read first.
#[test]
fn files_closed_in_a_leased_directory_are_whole_for_another_client_at_once() {
    const FILES: usize = 60;
    let c = cluster();
    // The holder's OST transfers take a while: its flushes are still under way when
    // the other mount looks.
    let a = Mount::new(&c, "ost_latency=200");
    let b = Mount::new(&c, "");
    for (round, (how, dom)) in
        [("lookup", false), ("listing", false), ("create", false), ("lookup", true), ("listing", true)]
            .into_iter()
            .enumerate()
    {
        let dir = format!("job{round}");
        fs::create_dir(a.path(&dir)).unwrap();
        if dom {
            let out =
                c.braid(&["setstripe", "-E", "64K", "-L", "mdt", "-E", "-1", "-c", "2", &c.url(&format!("/{dir}"))]);
            assert!(out.status.success(), "setstripe: {}", String::from_utf8_lossy(&out.stderr));
        }
        for i in 0..FILES {
            fs::write(a.path(&format!("{dir}/f{i}")), content(i)).unwrap();
        }
        let what = format!("{how} in {dir} (DoM: {dom})");
        match how {
            "lookup" => {}
            "listing" => {
                let mut sizes: Vec<(String, u64)> = fs::read_dir(b.path(&dir))
                    .unwrap()
                    .map(|e| {
                        let e = e.unwrap();
                        (e.file_name().into_string().unwrap(), e.metadata().unwrap().len())
                    })
                    .collect();
                sizes.sort();
                let mut want: Vec<(String, u64)> =
                    (0..FILES).map(|i| (format!("f{i}"), content(i).len() as u64)).collect();
                want.sort();
                assert_eq!(sizes, want, "{what}: the sizes another client lists");
            }
            "create" => {
                for i in (0..FILES).rev() {
                    let mut f = fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .open(b.path(&format!("{dir}/f{i}")))
                        .unwrap();
                    let mut got = Vec::new();
                    std::io::Read::read_to_end(&mut f, &mut got).unwrap();
                    assert!(got == content(i), "{what}: f{i} opened with O_CREAT has {} bytes", got.len());
                }
            }
            _ => unreachable!(),
        }
        for i in (0..FILES).rev() {
            let got = fs::read(b.path(&format!("{dir}/f{i}"))).unwrap();
            assert!(got == content(i), "{what}: f{i} read by the other mount has {} bytes", got.len());
        }
    }
}

/// The MDS killed right after a mount closed files whose flushes it deferred: the
/// mount sends them again once the MDS is back (within its 2 s recovery window,
/// during which another client's lookups wait), so another mount still reads every
/// file whole.
#[test]
fn closes_that_did_not_wait_survive_an_mds_killed_under_them() {
    // Slow OST transfers keep the plain files' flushes under way at the kill.
    files_closed_then_the_mds_restarted(100, &["dom", "plain"], 40);
}

/// As above, with flushes that outlast the MDS's recovery window: the mount's
/// creates, sent again, go ahead of the window (they are its replay); another
/// mount's lookups wait past it until the first mount acks that its deferred work has
/// landed (the MDS's `recovery`), so they find every file whole, never empty nor
/// without its bytes.
#[test]
fn flushes_that_outlast_a_restarted_mds_recovery_window_are_waited_for() {
    // Each OST transfer longer than the 2 s window.
    files_closed_then_the_mds_restarted(2500, &["plain"], 3);
}

/// Writes `files` files in each of `dirs` (a `dom` one is made Data-on-MDT) through a
/// mount whose OST transfers take `ost_latency_ms` each, kills and restarts the MDS,
/// and reads every file back whole through another mount.
fn files_closed_then_the_mds_restarted(ost_latency_ms: u32, dirs: &[&str], files: usize) {
    let mut c = cluster();
    let a = Mount::new(&c, &format!("ost_latency={ost_latency_ms}"));
    for dir in dirs {
        fs::create_dir(a.path(dir)).unwrap();
        if *dir == "dom" {
            let out = c.braid(&["setstripe", "-E", "64K", "-L", "mdt", "-E", "-1", &c.url("/dom")]);
            assert!(out.status.success(), "setstripe: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    for i in 0..files {
        for dir in dirs {
            fs::write(a.path(&format!("{dir}/f{i}")), content(i)).unwrap();
        }
    }
    c.kill("mds");
    c.restart("mds");
    let b = Mount::new(&c, "");
    for dir in dirs.iter().rev() {
        for i in (0..files).rev() {
            let got = fs::read(b.path(&format!("{dir}/f{i}"))).unwrap();
            assert!(
                got == content(i),
                "{dir}/f{i} read by the other mount after the restart: {}",
                differs(&got, &content(i))
            );
        }
    }
}

/// A flush that finished after its close returned, and failed (its OSTs are gone),
/// is reported by the next fsync of the file in that client, once, as a local file
/// system reports a failed write-back.
#[test]
fn a_deferred_flush_that_fails_is_reported_by_the_next_fsync() {
    let mut c = cluster();
    let rt = runtime();
    let creds = client::process_creds();
    let mut cfg = c.client_config();
    cfg.dir_leases = true;
    cfg.rpc.recovery_timeout = Duration::from_secs(1);
    let holder = testkit::connect(&rt, cfg);
    let job = within(&rt, "mkdir", holder.mkdir(&creds, Fid::ROOT, "job", 0o755)).unwrap();
    let (f, attr, _) = within(&rt, "create", holder.create(&creds, job.fid, "f", 0o644, true, RW, None)).unwrap();
    c.kill("oss0");
    let _ = within(&rt, "write", holder.write(&f, 0, bytes::Bytes::from_static(b"never stored")));
    let ticket = holder.defer_flush(&f).expect("a new small file in a leased directory has its flush deferred");
    within(&rt, "the deferred flush", async {
        holder.finish_deferred(&f, ticket).await;
        client::Result::Ok(())
    })
    .unwrap();

    let (g, _) = within(&rt, "open", holder.open(&creds, attr.fid, RW)).unwrap();
    let e = within(&rt, "fsync", holder.fsync(&g)).expect_err("the failed flush is reported");
    assert_eq!(e.errno(), Errno::Io, "{e}");
    assert!(e.to_string().contains("earlier close"), "{e}");
    within(&rt, "fsync again", holder.fsync(&g)).expect("reported once");
}
