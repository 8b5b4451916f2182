//! Several MDTs on separate `braid mds` processes: remote directories (`mkdir -i K`)
//! and hard links to files on another MDT, made and removed through the CLI, the
//! native client and a FUSE mount, the namespace checker over both MDTs' stores, and
//! each process killed with SIGKILL at every step of the protocol of a remote mkdir,
//! rmdir, link and unlink (fault points switched on by `BRAID_FAULT`): the client's
//! retried call gets the answer of the first, and the namespace is consistent
//! afterwards (and, checked between the crash and the restart, the checker reports
//! the half left undecided).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use proto::msg::{OpenFlags, RenameFlags};
use proto::{Errno, Fid};
use testkit::{client_errno, runtime, stderr, within, Cluster, Mount};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

const RW: OpenFlags = OpenFlags { read: true, write: true, truncate: false };
const RO: OpenFlags = OpenFlags { read: true, write: false, truncate: false };

/// The link count `braid stat` shows.
fn links(c: &Cluster, path: &str) -> u32 {
    let out = c.braid_ok(&["stat", &c.url(path)]);
    let at = out.find("Links:").expect("a Links field");
    out[at + 6..].split_whitespace().next().and_then(|n| n.parse().ok()).expect("a link count")
}

fn fid_of(c: &Cluster, path: &str) -> Fid {
    let out = c.braid_ok(&["stat", &c.url(path)]);
    let line = out.lines().find(|l| l.trim_start().starts_with("FID:")).expect("a FID line");
    let inner = line.split('[').nth(1).and_then(|s| s.split(']').next()).expect("[seq:oid:ver]");
    let parts: Vec<u64> =
        inner.split(':').map(|p| u64::from_str_radix(p.trim_start_matches("0x"), 16).expect("hex")).collect();
    Fid { seq: parts[0], oid: parts[1] as u32, ver: parts[2] as u32 }
}

#[test]
fn remote_directories_live_on_the_mdt_asked_for_and_the_namespace_stays_whole() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/remote")]);
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/local")]);
    assert_eq!(fid_of(&c, "/remote").mdt(), 1, "mkdir -i 1 puts the inode on MDT 1");
    assert_eq!(fid_of(&c, "/local").mdt(), 0);
    // As `lfs getdirstripe` and `lfs getstripe -m` show them.
    let shown = c.braid_ok(&["getdirstripe", &c.url("/remote")]);
    assert_eq!(shown.trim(), "lmv_stripe_count: 0 lmv_stripe_offset: 1 lmv_hash_type: none");
    assert_eq!(c.braid_ok(&["getdirstripe", "-i", &c.url("/local")]).trim(), "0");
    assert_eq!(c.braid_ok(&["getstripe", "-m", &c.url("/remote")]).trim(), "1");

    let rt = runtime();
    let cl = c.connect(&rt);
    let creds = client::process_creds();
    let remote = within(&rt, "resolve", cl.resolve(&creds, "/remote", true)).expect("resolve");
    let root = within(&rt, "getattr", cl.getattr(Fid::ROOT)).expect("getattr");
    assert_eq!(root.nlink, 4, "the root counts both subdirectories");
    // Files and directories inside a remote directory live on its MDT.
    let data = Bytes::from_static(b"on MDT 1");
    let (f, attr, _) =
        within(&rt, "create", cl.create(&creds, remote.fid, "file", 0o644, true, RW, None)).expect("create");
    assert_eq!(attr.fid.mdt(), 1);
    within(&rt, "write", cl.write(&f, 0, data.clone())).expect("write");
    within(&rt, "close", cl.close(f)).expect("close");
    let sub = within(&rt, "mkdir", cl.mkdir(&creds, remote.fid, "sub", 0o755)).expect("mkdir inside");
    assert_eq!(sub.fid.mdt(), 1);
    // A remote directory back on MDT 0, below one on MDT 1.
    let back = within(&rt, "mkdir -i 0", cl.mkdir_on(&creds, sub.fid, "back", 0o755, Some(0))).expect("mkdir -i 0");
    assert_eq!(back.fid.mdt(), 0);
    assert_eq!(c.braid_ok(&["ls", &c.url("/remote")]).split_whitespace().collect::<Vec<_>>(), ["file", "sub"]);
    // `df -i` counts each MDT's own inodes: /remote, its file and sub on MDT 1.
    let df = c.braid_ok(&["df", "-i", &c.url("/")]);
    let mdt1 = df.lines().find(|l| l.contains("[MDT:1]")).unwrap_or_else(|| panic!("no MDT 1 in\n{df}"));
    assert_eq!(mdt1.split_whitespace().nth(2), Some("3"), "IUsed of MDT 1:\n{df}");

    // What cannot be done says why and changes nothing.
    let non_empty = within(&rt, "rmdir", cl.rmdir(&creds, Fid::ROOT, "remote"));
    assert_eq!(client_errno(non_empty), Errno::NotEmpty);
    let out = c.braid(&["mkdir", "-i", "7", &c.url("/nowhere")]);
    assert!(!out.status.success() && stderr(&out).contains("MDT 7 is not in this file system"), "{}", stderr(&out));
    let user = proto::msg::Creds { uid: 1000, gid: 1000, groups: vec![] };
    let denied = within(&rt, "mkdir -i as a user", cl.mkdir_on(&user, Fid::ROOT, "mine", 0o755, Some(1)));
    assert_eq!(client_errno(denied), Errno::Perm, "only root makes remote directories, as in Lustre");
    let local = within(&rt, "resolve", cl.resolve(&creds, "/local", true)).expect("resolve").fid;
    let no_flags = RenameFlags::default();
    // Into another directory of its entry's MDT and back (its MDT moves its `..`).
    within(&rt, "rename", cl.rename(&creds, Fid::ROOT, "remote", local, "moved", no_flags)).expect("moved");
    assert_eq!(fid_of(&c, "/local/moved"), remote.fid);
    within(&rt, "rename", cl.rename(&creds, local, "moved", Fid::ROOT, "remote", no_flags)).expect("back");
    // Within its directory a remote directory's rename is its entry's alone.
    within(&rt, "rename in place", cl.rename(&creds, Fid::ROOT, "remote", Fid::ROOT, "moved", no_flags))
        .expect("rename within the directory");
    assert_eq!(fid_of(&c, "/moved"), remote.fid);
    within(&rt, "rename back", cl.rename(&creds, Fid::ROOT, "moved", Fid::ROOT, "remote", no_flags)).expect("back");
    let exists = within(&rt, "mkdir over a name", cl.mkdir_on(&creds, Fid::ROOT, "local", 0o755, Some(1)));
    assert_eq!(client_errno(exists), Errno::Exist);

    // A client's own lease on the parent is no obstacle to its remote mkdir there.
    let mut cfg = c.client_config();
    cfg.dir_leases = true;
    let leasing = testkit::connect(&rt, cfg);
    let own = within(&rt, "mkdir", leasing.mkdir_on(&creds, Fid::ROOT, "own", 0o755, Some(0))).expect("mkdir own");
    assert_eq!(leasing.dir_leases_held(), 1, "the client holds a lease on the directory it made");
    let x = within(&rt, "mkdir -i 1 under a lease", leasing.mkdir_on(&creds, own.fid, "x", 0o755, Some(1)));
    assert_eq!(x.expect("remote mkdir under the client's own lease").fid.mdt(), 1);
    within(&rt, "rmdir", leasing.rmdir(&creds, own.fid, "x")).expect("remote rmdir under the client's own lease");
    // A move whose loop check passes through another MDT is checked all the same:
    // /w/a on MDT 1, /w/a/p on MDT 0, /w/a/p/x on MDT 1; /w/a into x would be a cycle.
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/w")]);
    c.braid_ok(&["mkdir", &c.url("/w/a")]);
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/w/a/p")]);
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/w/a/p/x")]);
    let (w, x) = (fid_of(&c, "/w"), fid_of(&c, "/w/a/p/x"));
    let cycle = within(&rt, "rename into itself", cl.rename(&creds, w, "a", x, "a", RenameFlags::default()));
    assert_eq!(client_errno(cycle), Errno::Inval);

    // The root's own default, as Lustre's: new top-level directories spread
    // round-robin over the MDTs (free inodes are alike here).
    let mut on = [0; 2];
    for i in 0..4 {
        let d = within(&rt, "mkdir", cl.mkdir(&creds, Fid::ROOT, &format!("top{i}"), 0o755)).expect("mkdir at /");
        on[d.fid.mdt() as usize] += 1;
    }
    assert_eq!(on, [2, 2], "four new top-level directories spread over both MDTs");
    // A default for new directories (`setdirstripe -D`): spread round-robin (`-i -1`)
    // or on one MDT, for anyone making directories there, inherited below.
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/spread")]);
    c.braid_ok(&["setdirstripe", "-D", "-i", "-1", &c.url("/spread")]);
    assert_eq!(
        c.braid_ok(&["getdirstripe", "-D", &c.url("/spread")]).trim(),
        "lmv_stripe_count: 1 lmv_stripe_offset: -1 lmv_hash_type: none"
    );
    let spread = within(&rt, "resolve", cl.resolve(&creds, "/spread", true)).expect("resolve").fid;
    let open_up = proto::msg::SetAttr { mode: Some(0o777), ..Default::default() };
    within(&rt, "chmod", cl.setattr(&creds, spread, open_up)).expect("chmod 777");
    let mut on = [0; 2];
    for i in 0..4 {
        let d = within(&rt, "mkdir", cl.mkdir(&user, spread, &format!("d{i}"), 0o755)).expect("a user's mkdir");
        on[d.fid.mdt() as usize] += 1;
    }
    assert_eq!(on, [2, 2], "four new directories spread over both MDTs");
    let inherited = c.braid_ok(&["getdirstripe", "-D", &c.url("/spread/d1")]);
    assert!(inherited.contains("lmv_stripe_offset: -1"), "{inherited}");
    c.braid_ok(&["setdirstripe", "-D", "-i", "1", &c.url("/spread/d0")]);
    c.braid_ok(&["mkdir", &c.url("/spread/d0/one")]);
    assert_eq!(fid_of(&c, "/spread/d0/one").mdt(), 1);
    c.braid_ok(&["setdirstripe", "-D", "-d", &c.url("/spread")]);
    assert!(c.braid_ok(&["getdirstripe", "-D", &c.url("/spread")]).starts_with("lmv_stripe_count: 0"));
    c.braid_ok(&["mkdir", &c.url("/spread/plain")]);
    assert_eq!(fid_of(&c, "/spread/plain").mdt(), 0, "without the default, the parent's MDT");
    // A striped default (`mkdir -D` is `setdirstripe -D`, as `lfs mkdir -D`): any
    // user's new directories get two shards.
    c.braid_ok(&["mkdir", "-D", "-c", "2", &c.url("/spread/d1")]);
    let d1 = within(&rt, "resolve", cl.resolve(&creds, "/spread/d1", true)).expect("resolve").fid;
    let striped = within(&rt, "mkdir", cl.mkdir(&user, d1, "st", 0o755)).expect("a user's mkdir by a default");
    assert_eq!(striped.stripes.map(|s| s.shards.len()), Some(2));
    let shown = c.braid_ok(&["getdirstripe", "-D", &c.url("/spread/d1/st")]);
    assert_eq!(shown.trim(), "lmv_stripe_count: 2 lmv_stripe_offset: -1 lmv_hash_type: fnv_1a_64", "inherited");
    let out = c.braid(&["mkdir", "-c", "3", &c.url("/three")]);
    assert!(!out.status.success() && stderr(&out).contains("larger than the number of MDTs (2)"), "{}", stderr(&out));
    let out = c.braid(&["mkdir", "-c", "2", "-H", "crush", &c.url("/crush")]);
    assert!(!out.status.success() && stderr(&out).contains("unknown directory hash type 'crush'"), "{}", stderr(&out));
    let as_user =
        cl.mkdir_with(&user, spread, "mine", 0o755, Some(client::DirSpec { count: 2, ..client::DirSpec::on(0) }));
    assert_eq!(client_errno(within(&rt, "mkdir -c 2 by a user", as_user)), Errno::Perm);
    let garbage = cl.setxattr(&creds, spread, "trusted.dmv", b"stripe_count=1 pool=x", client::XattrMode::Any);
    assert_eq!(client_errno(within(&rt, "setxattr", garbage)), Errno::Inval);
    c.check_two_mdts(&mdts).expect("consistent with remote directories");

    // Through a FUSE mount: the same tree, and rmdir of remote directories.
    let m = Mount::new(&c, "");
    assert_eq!(std::fs::read(m.path("remote/file")).expect("read through the mount"), &data[..]);
    std::fs::write(m.path("remote/sub/new"), b"x").expect("write through the mount");
    std::fs::create_dir(m.path("local/plain")).expect("mkdir through the mount");
    assert!(std::fs::remove_dir(m.path("remote")).is_err(), "not empty");
    std::fs::remove_dir_all(m.path("remote")).expect("rm -r of a remote tree");
    assert!(!m.path("remote").exists());
    assert_eq!(
        std::fs::metadata(m.path("")).expect("stat root").nlink_count(),
        10,
        "/local, /spread, /own, /w, /top0..3"
    );
    drop(m);
    c.check_two_mdts(&mdts).expect("consistent after the removals");
}

/// A hard link in a directory on MDT 0 to a file on MDT 1: one inode with two
/// names, opened, created over, renamed and removed through either, by the native
/// client and through a FUSE mount; the last name gone, the file goes (after its
/// last close); the namespace checker agrees throughout.
#[test]
fn hard_links_to_a_file_on_another_mdt_behave_as_links() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/r")]);
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/d")]);
    let rt = runtime();
    let cl = c.connect(&rt);
    let creds = client::process_creds();
    let r = within(&rt, "resolve", cl.resolve(&creds, "/r", true)).expect("resolve /r").fid;
    let d = within(&rt, "resolve", cl.resolve(&creds, "/d", true)).expect("resolve /d").fid;
    let objects_before: usize = (0..4).map(|i| c.ost_objects(i).len()).sum();
    let data = Bytes::from(vec![7u8; 200_000]);
    let (f, file, _) = within(&rt, "create", cl.create(&creds, r, "f", 0o644, true, RW, None)).expect("create");
    assert_eq!(file.fid.mdt(), 1);
    within(&rt, "write", cl.write(&f, 0, data.clone())).expect("write");
    within(&rt, "close", cl.close(f)).expect("close");

    let linked = within(&rt, "link", cl.link(&creds, file.fid, Fid::ROOT, "link")).expect("link across MDTs");
    assert_eq!((linked.fid, linked.nlink), (file.fid, 2));
    assert_eq!(within(&rt, "lookup", cl.lookup(&creds, Fid::ROOT, "link")).expect("lookup").fid, file.fid);
    assert_eq!(links(&c, "/r/f"), 2);
    let read_via = |name: &str| {
        let (h, _) = within(&rt, "open by name", cl.open_at(&creds, Fid::ROOT, name, RO)).expect("open by name");
        let got = within(&rt, "read", cl.read(&h, 0, data.len() as u64)).expect("read");
        within(&rt, "close", cl.close(h)).expect("close");
        got
    };
    assert_eq!(read_via("link"), data, "opened by its name on MDT 0");
    let (h, a, existed) =
        within(&rt, "create over", cl.create(&creds, Fid::ROOT, "link", 0o644, false, RO, None)).expect("O_CREAT");
    assert!(existed && a.fid == file.fid, "O_CREAT without O_EXCL opens the linked file");
    within(&rt, "close", cl.close(h)).expect("close");
    let excl = within(&rt, "create excl", cl.create(&creds, Fid::ROOT, "link", 0o644, true, RW, None));
    assert_eq!(client_errno(excl.map(|(_, a, _)| a)), Errno::Exist);
    let again = within(&rt, "link over a name", cl.link(&creds, file.fid, Fid::ROOT, "link"));
    assert_eq!(client_errno(again), Errno::Exist);
    let dir_link = within(&rt, "link a directory", cl.link(&creds, r, d, "dir"));
    assert_eq!(client_errno(dir_link), Errno::Perm, "no hard links to directories, on any MDT");
    // Renamed within its directory, and between directories on both MDTs: into the
    // file's own MDT and back, where it is a link across MDTs again.
    let plain = RenameFlags::default();
    within(&rt, "rename", cl.rename(&creds, Fid::ROOT, "link", Fid::ROOT, "renamed", plain)).expect("rename");
    within(&rt, "rename", cl.rename(&creds, Fid::ROOT, "renamed", r, "back", plain)).expect("rename across");
    assert_eq!((fid_of(&c, "/r/back"), links(&c, "/r/f")), (file.fid, 2));
    within(&rt, "rename", cl.rename(&creds, r, "back", Fid::ROOT, "renamed", plain)).expect("rename back");
    assert_eq!((fid_of(&c, "/renamed"), links(&c, "/r/f")), (file.fid, 2));
    // A directory holding such a link is not empty.
    within(&rt, "link", cl.link(&creds, file.fid, d, "x")).expect("a second link across MDTs");
    assert_eq!(links(&c, "/r/f"), 3);
    assert_eq!(client_errno(within(&rt, "rmdir", cl.rmdir(&creds, Fid::ROOT, "d"))), Errno::NotEmpty);
    within(&rt, "unlink", cl.unlink(&creds, d, "x")).expect("unlink of a link across MDTs");
    // The first name goes; the file lives on through the link.
    within(&rt, "unlink", cl.unlink(&creds, r, "f")).expect("unlink the first name");
    assert_eq!(links(&c, "/renamed"), 1);
    assert_eq!(read_via("renamed"), data);
    c.check_two_mdts(&mdts).expect("consistent with links across MDTs");

    // Through a mount: ln across MDTs, and the last name removed while open.
    let m = Mount::new(&c, "");
    std::fs::hard_link(m.path("renamed"), m.path("r/g")).expect("ln into MDT 1 (the file's own)");
    std::fs::hard_link(m.path("r/g"), m.path("d/h")).expect("ln across MDTs through the mount");
    assert_eq!(std::fs::metadata(m.path("d/h")).expect("stat").nlink_count(), 3);
    assert_eq!(std::fs::read(m.path("d/h")).expect("read through the link"), &data[..]);
    std::fs::remove_file(m.path("renamed")).expect("rm");
    std::fs::remove_file(m.path("r/g")).expect("rm");
    let mut open = std::fs::File::open(m.path("d/h")).expect("open the last name");
    std::fs::remove_file(m.path("d/h")).expect("rm the last name, across MDTs, while open");
    let mut back = Vec::new();
    std::io::Read::read_to_end(&mut open, &mut back).expect("read after the last name went");
    assert_eq!(back, &data[..], "an open file outlives its last name");
    drop(open);
    drop(m);
    testkit::wait_for("the file's objects to be destroyed", testkit::WAIT, || {
        (0..4).map(|i| c.ost_objects(i).len()).sum::<usize>() == objects_before
    });
    c.check_two_mdts(&mdts).expect("consistent after the last link went");
}

/// MDS-to-MDS requests from a hostile or confused peer get errors and leave nothing
/// behind; with MDT 1's MDS down, a remote mkdir fails with EIO after the peer
/// timeout while MDT 0 keeps serving, and nothing is left half made.
#[test]
fn hostile_updates_and_a_down_mdt_get_clear_errors() {
    use proto::msg::{Creds, Request, Response, UpdateId, UpdateOp};
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/r")]);
    c.braid_ok(&["setstripe", "-c", "1", &c.url("/r/file")]);
    let (dir, file) = (fid_of(&c, "/r"), fid_of(&c, "/r/file"));
    let rt = runtime();
    let secret = proto::auth::Secret::load(&c.secret).expect("the cluster secret");
    let rpc = rpc::RpcClient::new(c.addr("mds1"), rpc::Identity::new("client", secret), rpc::RpcOptions::default());
    let mkdir = |parent: Fid| UpdateOp::MkdirInode {
        creds: Creds::root(),
        parent,
        name: "x".into(),
        mode: 0o755,
        gid: 0,
        dir_default: None,
        dirs_default: None,
        shard: None,
    };
    let rmdir = |fid: Fid| UpdateOp::RmdirInode { fid, parent: Fid::ROOT, name: "x".into() };
    let link = |fid: Fid| UpdateOp::LinkInode { fid, parent: Fid::ROOT, name: "x".into() };
    let unlink = |fid: Fid| UpdateOp::UnlinkInode { fid, parent: Fid::ROOT, name: "x".into() };
    let id = |mdt: u32| UpdateId { mdt, seq: 42 };
    let hostile = [
        Request::MdsUpdate { mdt: 1, id: id(1), op: Box::new(mkdir(Fid::ROOT)) },
        Request::MdsUpdate { mdt: 1, id: id(0), op: Box::new(mkdir(dir)) },
        Request::MdsUpdate { mdt: 7, id: id(0), op: Box::new(mkdir(Fid::ROOT)) },
        Request::MdsUpdate { mdt: 1, id: id(0), op: Box::new(rmdir(file)) },
        Request::MdsUpdate { mdt: 1, id: id(0), op: Box::new(rmdir(dir)) },
        Request::MdsUpdate { mdt: 1, id: id(0), op: Box::new(rmdir(Fid::new(1, 1, 999_999))) },
        Request::MdsUpdateQuery { id: id(0) },
        Request::MdsUpdateQuery { id: id(7) },
        Request::MdsUpdate { mdt: 1, id: id(0), op: Box::new(link(dir)) },
        Request::MdsUpdate { mdt: 1, id: id(0), op: Box::new(link(Fid::new(1, 1, 999_999))) },
        Request::MdsUpdate { mdt: 1, id: id(0), op: Box::new(link(Fid::new(0, 1, 5))) },
        Request::MdsUpdate { mdt: 1, id: id(0), op: Box::new(unlink(dir)) },
        Request::MdsUpdate {
            mdt: 1,
            id: id(0),
            op: Box::new(UpdateOp::LinkInode { fid: file, parent: dir, name: "y".into() }),
        },
        Request::MdsUpdate {
            mdt: 1,
            id: id(0),
            op: Box::new(UpdateOp::LinkInode { fid: file, parent: Fid::ROOT, name: "a/b".into() }),
        },
    ];
    for req in hostile {
        let what = format!("{req:?}");
        match within(&rt, "a hostile update", rpc.call(&req, vec![])) {
            Err(proto::RpcError::Remote(e)) => assert!(!e.message.is_empty(), "{what}: an error says why"),
            other => panic!("{what} was not refused: {other:?}"),
        }
    }
    // A verdict on nothing pending changes nothing; an update no coordinator made is
    // taken back once its coordinator says it never made the entry.
    let done = Request::MdsUpdateDone { mdt: 1, fid: dir, id: id(0), committed: false };
    assert!(matches!(within(&rt, "verdict", rpc.call(&done, vec![])).expect("answered").response, Response::Ok));
    let stray = Request::MdsUpdate { mdt: 1, id: id(0), op: Box::new(mkdir(Fid::ROOT)) };
    within(&rt, "stray update", rpc.call(&stray, vec![])).expect("applied as pending");
    // A link no coordinator made an entry for is taken back the same way; meanwhile
    // another operation across MDTs on the same file waits (EAGAIN, which the RPC
    // layer retries): it is applied only once the first is settled.
    let link_of = |r: Result<rpc::Reply, proto::RpcError>| match r.map(|r| r.response) {
        Ok(Response::Attr(a)) => a.nlink,
        other => panic!("not applied: {other:?}"),
    };
    let stray = Request::MdsUpdate { mdt: 1, id: UpdateId { mdt: 0, seq: 43 }, op: Box::new(link(file)) };
    assert_eq!(link_of(within(&rt, "stray link", rpc.call(&stray, vec![]))), 2, "applied as pending");
    let busy = Request::MdsUpdate { mdt: 1, id: UpdateId { mdt: 0, seq: 44 }, op: Box::new(unlink(file)) };
    assert_eq!(link_of(within(&rt, "a second update", rpc.call(&busy, vec![]))), 1, "after the first was undone");
    c.two_mdts_consistent_within(&mdts, Duration::from_secs(30));
    assert_eq!(c.braid_ok(&["ls", &c.url("/r")]).trim(), "file", "the directory and its file are untouched");
    assert_eq!(links(&c, "/r/file"), 1, "the stray link was taken back");

    // MDT 1 down: EIO after the peer timeout, never a hang; MDT 0 goes on.
    c.stop("mds1");
    let out = c.braid(&["mkdir", "-i", "1", &c.url("/down")]);
    assert!(!out.status.success() && stderr(&out).contains("MDT 1"), "{}", stderr(&out));
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/up")]);
    c.restart("mds1");
    c.wait_mdts_up(2, testkit::WAIT);
    assert!(!c.braid(&["stat", &c.url("/down")]).status.success(), "no half-made /down");
    c.two_mdts_consistent_within(&mdts, Duration::from_secs(30));
}

/// `braid local --mdts 2`: both MDTs in one MDS process (the coordinator reaches
/// the participant over its own listener), through its own mount.
#[test]
fn braid_local_with_two_mdts_makes_remote_directories_through_its_mount() {
    let dir = testkit::TempDir::new("local-dne");
    let local = testkit::LocalCluster::start(bin(), dir.path(), &["--mdts", "2"]);
    let url = format!("{}remote", local.url());
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["mkdir", "-i", "1", &url]).env("BRAID_SECRET_FILE", local.secret());
    let out = testkit::output_within(&mut cmd, testkit::CLI_WATCHDOG).unwrap_or_else(|o| o);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(local.mnt.join("remote/f"), b"data").expect("write below the remote directory");
    assert_eq!(std::fs::read(local.mnt.join("remote/f")).expect("read"), b"data");
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["getstripe", "-m", &format!("{url}/f")]).env("BRAID_SECRET_FILE", local.secret());
    let out = testkit::output_within(&mut cmd, testkit::CLI_WATCHDOG).unwrap_or_else(|o| o);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1", "{}", stderr(&out));
    std::fs::remove_dir_all(local.mnt.join("remote")).expect("rm -r");
    assert!(!local.mnt.join("remote").exists());
}

trait Nlink {
    fn nlink_count(&self) -> u64;
}

impl Nlink for std::fs::Metadata {
    fn nlink_count(&self) -> u64 {
        std::os::unix::fs::MetadataExt::nlink(self)
    }
}

/// Kills `process` at `point` while `op` runs on a fresh name, restarts it, and
/// checks the call succeeded (its retry got the answer of the first) and the
/// namespace is consistent. `op` is "mkdir" (of `/NAME` on MDT 1), "rmdir" (of
/// `/NAME`, made on MDT 1 first), both by the CLI, "link" (`/NAME` to a new file
/// on MDT 1) or "unlink" (of such a link), both by the native client.
fn crash_at(c: &mut Cluster, mdts: &[PathBuf], process: &str, point: &str, op: &str, name: &str) {
    let url = c.url(&format!("/{name}"));
    let target = match op {
        "rmdir" => {
            c.braid_ok(&["mkdir", "-i", "1", &url]);
            None
        }
        "rmdir-striped" => {
            c.braid_ok(&["mkdir", "-c", "2", "-i", "0", &url]);
            None
        }
        "rename" | "rename-back" => {
            c.put(&format!("/src-{name}"), b"moving");
            let fid = fid_of(c, &format!("/src-{name}"));
            if op == "rename-back" {
                // Its entry on MDT 1, its inode on MDT 0: the participant keeps its
                // half under a FID of another MDT.
                let (rt, src) = (runtime(), format!("src-{name}"));
                let cl = c.connect(&rt);
                let creds = client::process_creds();
                let on1 = within(&rt, "resolve", cl.resolve(&creds, "/on1", true)).expect("resolve /on1").fid;
                let plain = RenameFlags::default();
                within(&rt, "rename", cl.rename(&creds, Fid::ROOT, &src, on1, &src, plain)).expect("rename to /on1");
            }
            Some(fid)
        }
        "exchange" => {
            // A file of MDT 0 in the root and a directory of MDT 1 in /on1 swap names.
            c.put(&format!("/src-{name}"), b"moving");
            c.braid_ok(&["mkdir", &c.url(&format!("/on1/{name}"))]);
            c.put(&format!("/on1/{name}/f"), b"dir");
            Some(fid_of(c, &format!("/src-{name}")))
        }
        "rename-dir" | "rename-dir-remote" => {
            // Its entry and inode on MDT 0, moved into /on1; or its inode on MDT 1,
            // moved between two directories of MDT 0 (into /on0).
            let mdt = if op == "rename-dir" { "0" } else { "1" };
            c.braid_ok(&["mkdir", "-i", mdt, &c.url(&format!("/src-{name}"))]);
            c.put(&format!("/src-{name}/f"), b"moving");
            Some(fid_of(c, &format!("/src-{name}")))
        }
        "link" | "unlink" => {
            c.put(&format!("/on1/{name}"), b"linked");
            let fid = fid_of(c, &format!("/on1/{name}"));
            if op == "unlink" {
                let rt = runtime();
                let cl = c.connect(&rt);
                within(&rt, "link", cl.link(&client::process_creds(), fid, Fid::ROOT, name)).expect("link");
            }
            Some(fid)
        }
        _ => None,
    };
    c.set_env(process, mds::dne::FAULT_ENV, Some(point));
    c.restart(process);
    c.wait_mdts_up(2, testkit::WAIT);
    let (bin, secret, cfg) = (c.bin.clone(), c.secret.clone(), c.client_config());
    let (op_name, name_owned) = (op.to_string(), name.to_string());
    let call = std::thread::spawn(move || -> Result<(), String> {
        let Some(fid) = target.filter(|_| op_name != "rmdir") else {
            let args: Vec<&str> = match op_name.as_str() {
                "mkdir" => vec!["mkdir", "-i", "1", &url],
                "mkdir-striped" => vec!["mkdir", "-c", "2", "-i", "0", &url],
                _ => vec!["rm", "-r", &url],
            };
            let mut cmd = std::process::Command::new(bin);
            cmd.args(&args).env("BRAID_SECRET_FILE", secret);
            let out = testkit::output_within(&mut cmd, testkit::CLI_WATCHDOG).unwrap_or_else(|o| o);
            return if out.status.success() { Ok(()) } else { Err(stderr(&out)) };
        };
        let rt = runtime();
        let cl = testkit::connect(&rt, cfg);
        let creds = client::process_creds();
        let r = match op_name.as_str() {
            "link" => within(&rt, "link", cl.link(&creds, fid, Fid::ROOT, &name_owned)).map(|_| ()),
            "rename" | "rename-back" => {
                let on1 = within(&rt, "resolve", cl.resolve(&creds, "/on1", true)).expect("resolve /on1").fid;
                let src = format!("src-{name_owned}");
                let plain = RenameFlags::default();
                let (from, to) = if op_name == "rename" { (Fid::ROOT, on1) } else { (on1, Fid::ROOT) };
                within(&rt, "rename", cl.rename(&creds, from, &src, to, &name_owned, plain))
            }
            "exchange" => {
                let on1 = within(&rt, "resolve", cl.resolve(&creds, "/on1", true)).expect("resolve /on1").fid;
                let src = format!("src-{name_owned}");
                let swap = RenameFlags { exchange: true, ..Default::default() };
                within(&rt, "exchange", cl.rename(&creds, Fid::ROOT, &src, on1, &name_owned, swap))
            }
            "rename-dir" | "rename-dir-remote" => {
                let to = if op_name == "rename-dir" { "/on1" } else { "/on0" };
                let to = within(&rt, "resolve", cl.resolve(&creds, to, true)).expect("resolve").fid;
                let src = format!("src-{name_owned}");
                within(&rt, "rename", cl.rename(&creds, Fid::ROOT, &src, to, &name_owned, RenameFlags::default()))
            }
            _ => within(&rt, "unlink", cl.unlink(&creds, Fid::ROOT, &name_owned)),
        };
        r.map_err(|e| e.to_string())
    });
    assert!(c.wait_exit(process, Duration::from_secs(60)), "{process} did not stop at {point}");
    c.set_env(process, mds::dne::FAULT_ENV, None);
    c.restart(process);
    let out = call.join().expect("the calling thread");
    assert!(out.is_ok(), "{op} across a SIGKILL of {process} at {point}: {out:?}");
    let exists = c.braid(&["stat", &c.url(&format!("/{name}"))]).status.success();
    match op {
        "mkdir" => assert_eq!(fid_of(c, &format!("/{name}")).mdt(), 1, "{point}"),
        "mkdir-striped" => assert_eq!(c.braid_ok(&["getdirstripe", "-c", &c.url(&format!("/{name}"))]).trim(), "2"),
        "link" => {
            assert_eq!(fid_of(c, &format!("/{name}")), target.expect("a file"), "{point}");
            assert_eq!(links(c, &format!("/on1/{name}")), 2, "{point}");
        }
        "rename" | "rename-back" => {
            let (to, from) = if op == "rename" { ("/on1", "") } else { ("", "/on1") };
            assert_eq!(fid_of(c, &format!("{to}/{name}")), target.expect("a file"), "{point}");
            assert!(!c.braid(&["stat", &c.url(&format!("{from}/src-{name}"))]).status.success(), "{point}");
            assert_eq!(c.get(&format!("{to}/{name}")), b"moving", "{point}");
            assert_eq!(links(c, &format!("{to}/{name}")), 1, "{point}");
        }
        "unlink" => {
            assert!(!exists, "{name} still exists after {point}");
            assert_eq!(links(c, &format!("/on1/{name}")), 1, "{point}");
        }
        "exchange" => {
            assert_eq!(fid_of(c, &format!("/on1/{name}")), target.expect("a file"), "{point}");
            assert_eq!(c.get(&format!("/on1/{name}")), b"moving", "{point}");
            assert_eq!(c.get(&format!("/src-{name}/f")), b"dir", "{point}");
        }
        "rename-dir" | "rename-dir-remote" => {
            let to = if op == "rename-dir" { "/on1" } else { "/on0" };
            assert_eq!(fid_of(c, &format!("{to}/{name}")), target.expect("a directory"), "{point}");
            assert!(!c.braid(&["stat", &c.url(&format!("/src-{name}"))]).status.success(), "{point}");
            assert_eq!(c.get(&format!("{to}/{name}/f")), b"moving", "{point}");
        }
        _ => assert!(!exists, "{name} still exists after {point}"),
    }
    c.two_mdts_consistent_within(mdts, Duration::from_secs(30));
}

#[test]
fn a_remote_mkdir_and_rmdir_survive_a_sigkill_at_every_step() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    let points = [
        ("mds", "mkdir-remote:before-update", "mkdir"),
        ("mds", "mkdir-remote:before-commit", "mkdir"),
        ("mds", "mkdir-remote:before-done", "mkdir"),
        ("mds1", "update:before-reply", "mkdir"),
        ("mds1", "update-done:before-apply", "mkdir"),
        ("mds", "rmdir-remote:before-update", "rmdir"),
        ("mds", "rmdir-remote:before-commit", "rmdir"),
        ("mds", "rmdir-remote:before-done", "rmdir"),
        ("mds1", "update:before-reply", "rmdir"),
        ("mds1", "update-done:before-apply", "rmdir"),
    ];
    for (i, (process, point, op)) in points.into_iter().enumerate() {
        crash_at(&mut c, &mdts, process, point, op, &format!("d{i}"));
    }
    // Every mkdir left its directory, every rmdir took its own.
    let listed = c.braid_ok(&["ls", &c.url("/")]);
    let names: Vec<&str> = listed.split_whitespace().collect();
    assert_eq!(names, ["d0", "d1", "d2", "d3", "d4"], "{listed}");
}

/// The checker through the CLI on what a crash leaves: the coordinator of a remote
/// rmdir (MDS 0) killed once the participant (MDT 1) holds its half, and MDT 1
/// stopped before any verdict can reach it. `check-namespace` prints that half and
/// nothing else, and exits 1 (2 where it cannot read an MDT); with both MDSs back, the participant asks, the rmdir
/// completes and the checker passes.
#[test]
fn the_checker_reports_a_half_a_crash_left_undecided_and_exits_1() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    let url = c.url("/gone");
    c.braid_ok(&["mkdir", "-i", "1", &url]);
    let dir = fid_of(&c, "/gone");
    c.set_env("mds", mds::dne::FAULT_ENV, Some("rmdir-remote:before-commit"));
    c.restart("mds");
    c.wait_mdts_up(2, testkit::WAIT);
    let (bin, secret) = (c.bin.clone(), c.secret.clone());
    // The CLI's rmdir retries across the crash.
    let call = std::thread::spawn(move || {
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["rm", "-r", &url]).env("BRAID_SECRET_FILE", secret);
        testkit::output_within(&mut cmd, testkit::CLI_WATCHDOG).unwrap_or_else(|o| o)
    });
    assert!(c.wait_exit("mds", Duration::from_secs(60)), "mds did not stop before its commit");
    c.stop("mds1");

    let out = c.check_namespace(&mdts);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{printed}{}", stderr(&out));
    let root = Fid::ROOT;
    assert_eq!(printed, format!("MDT 1: Rmdir (coordinator MDT 0, {root}/gone) of {dir} is still undecided\n"));
    assert!(stderr(&out).contains("1 problem(s) in the namespace"), "{}", stderr(&out));
    // A directory that holds no MDT cannot be checked at all: exit status 2, not 1.
    let not_an_mdt = c.dir.path().join("not-an-mdt");
    std::fs::create_dir_all(&not_an_mdt).expect("mkdir");
    let out = c.braid(&["check-namespace", "--mdt", &not_an_mdt.display().to_string()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no MDT database here"), "{}", stderr(&out));

    c.set_env("mds", mds::dne::FAULT_ENV, None);
    c.restart("mds");
    c.restart("mds1");
    let out = call.join().expect("the calling thread");
    assert!(out.status.success(), "rm across the crash: {}", stderr(&out));
    assert!(!c.braid(&["stat", &c.url("/gone")]).status.success(), "/gone is still there");
    c.two_mdts_consistent_within(&mdts, Duration::from_secs(30));
}

#[test]
fn a_link_and_unlink_across_mdts_survive_a_sigkill_at_every_step() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/on1")]);
    let points = [
        ("mds", "link-remote:before-update", "link"),
        ("mds", "link-remote:before-commit", "link"),
        ("mds", "link-remote:before-done", "link"),
        ("mds1", "update:before-reply", "link"),
        ("mds1", "update-done:before-apply", "link"),
        ("mds", "unlink-remote:before-update", "unlink"),
        ("mds", "unlink-remote:before-commit", "unlink"),
        ("mds", "unlink-remote:before-done", "unlink"),
        ("mds1", "update:before-reply", "unlink"),
        ("mds1", "update-done:before-apply", "unlink"),
    ];
    for (i, (process, point, op)) in points.into_iter().enumerate() {
        crash_at(&mut c, &mdts, process, point, op, &format!("l{i}"));
    }
    let listed = c.braid_ok(&["ls", &c.url("/")]);
    let names: Vec<&str> = listed.split_whitespace().collect();
    assert_eq!(names, ["l0", "l1", "l2", "l3", "l4", "on1"], "{listed}");
}

#[test]
fn a_rename_between_mdts_survives_a_sigkill_at_every_step() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/on1")]);
    // From the root (MDT 0, the participant) into /on1 (MDT 1, the coordinator), and
    // a file of MDT 0 from /on1 back to the root (the participant, MDT 1, keeps its
    // half under the file's FID, which names MDT 0).
    let (into, back) = ("rename", "rename-back");
    let points = [
        ("mds1", "rename:before-update", into),
        ("mds1", "rename:before-commit", into),
        ("mds1", "rename:before-done", into),
        ("mds", "update:before-reply", into),
        ("mds", "update-done:before-apply", into),
        ("mds", "rename:before-update", back),
        ("mds", "rename:before-commit", back),
        ("mds", "rename:before-done", back),
        ("mds1", "update:before-reply", back),
        ("mds1", "update-done:before-apply", back),
    ];
    for (i, (process, point, op)) in points.into_iter().enumerate() {
        crash_at(&mut c, &mdts, process, point, op, &format!("m{i}"));
    }
    let listed = c.braid_ok(&["ls", &c.url("/on1")]);
    assert_eq!(listed.split_whitespace().collect::<Vec<_>>(), ["m0", "m1", "m2", "m3", "m4"], "{listed}");
    let listed = c.braid_ok(&["ls", &c.url("/")]);
    assert_eq!(listed.split_whitespace().collect::<Vec<_>>(), ["m5", "m6", "m7", "m8", "m9", "on1"], "{listed}");
}

/// Files renamed between directories on different MDTs: the file keeps its inode
/// (the new entry names it on its MDT), replaces a file there, and the checks a
/// rename makes hold; a reader looking the old name up, then the new one, never
/// finds neither; through a mount `mv` moves without copying.
#[test]
fn files_move_between_directories_on_different_mdts() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/r")]);
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/d")]);
    c.put("/d/f", b"first");
    c.put("/r/victim", b"replaced");
    c.put("/r/keep", b"kept");
    let f = fid_of(&c, "/d/f");
    let rt = runtime();
    let cl = c.connect(&rt);
    let creds = client::process_creds();
    let r = within(&rt, "resolve", cl.resolve(&creds, "/r", true)).expect("resolve /r").fid;
    let d = within(&rt, "resolve", cl.resolve(&creds, "/d", true)).expect("resolve /d").fid;
    let plain = RenameFlags::default();
    let rename = |from: Fid, a: &str, to: Fid, b: &str, flags: RenameFlags| {
        within(&rt, "rename", cl.rename(&creds, from, a, to, b, flags))
    };
    rename(d, "f", r, "g", plain).expect("rename from MDT 0 to MDT 1");
    assert_eq!(fid_of(&c, "/r/g"), f, "the same inode, still on MDT 0");
    assert_eq!(c.get("/r/g"), b"first");
    assert!(!c.braid(&["stat", &c.url("/d/f")]).status.success());
    // Back, replacing a file on the way; then the victim's name holds the file.
    rename(r, "g", d, "f2", plain).expect("rename from MDT 1 to MDT 0");
    c.put("/d/tmp", b"x");
    let victim = fid_of(&c, "/r/victim");
    rename(d, "f2", r, "victim", plain).expect("rename over a file on the other MDT");
    assert_eq!(fid_of(&c, "/r/victim"), f);
    assert_eq!(c.get("/r/victim"), b"first");
    let gone = within(&rt, "getattr", cl.getattr(victim));
    assert!(gone.is_err() || gone.is_ok_and(|a| a.nlink == 0), "the replaced file lost its name");
    // What a rename refuses, it refuses across MDTs too, and changes nothing.
    let noreplace = RenameFlags { noreplace: true, ..Default::default() };
    assert_eq!(client_errno(rename(d, "tmp", r, "keep", noreplace)), Errno::Exist);
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/r/sub")]);
    assert_eq!(client_errno(rename(d, "tmp", r, "sub", plain)), Errno::IsDir);
    c.braid_ok(&["mkdir", &c.url("/d/dir")]);
    c.put("/r/file", b"f");
    assert_eq!(client_errno(rename(d, "dir", r, "file", plain)), Errno::NotDir, "a directory over a file");
    assert_eq!(client_errno(rename(d, "missing", r, "x", plain)), Errno::NoEnt);
    // RENAME_EXCHANGE across MDTs: the two names swap, twice.
    let exchange = RenameFlags { exchange: true, ..Default::default() };
    rename(d, "tmp", r, "keep", exchange).expect("an exchange between MDTs");
    assert_eq!((c.get("/r/keep"), c.get("/d/tmp")), (b"x".to_vec(), b"kept".to_vec()));
    rename(d, "tmp", r, "keep", exchange).expect("and back");
    assert_eq!((c.get("/r/keep"), c.get("/d/tmp")), (b"kept".to_vec(), b"x".to_vec()));
    assert_eq!(client_errno(rename(d, "missing", r, "keep", exchange)), Errno::NoEnt);
    // Two names of one file: renaming one onto the other does nothing (POSIX).
    within(&rt, "link", cl.link(&creds, f, d, "alias")).expect("link");
    rename(d, "alias", r, "victim", plain).expect("a rename between links of one file");
    assert!(c.braid(&["stat", &c.url("/d/alias")]).status.success(), "both names stay");
    within(&rt, "unlink", cl.unlink(&creds, d, "alias")).expect("unlink");
    // Over a name whose inode is on another MDT, from this MDT and from the other:
    // the inode's own MDT takes the replaced link away.
    for (dir, name, data) in [("/d", "v1", "one"), ("/r", "v2", "two"), ("/d", "v3", "three")] {
        c.put(&format!("{dir}/{name}"), data.as_bytes());
    }
    rename(d, "v1", r, "v", plain).expect("a file of MDT 0 into /r");
    let one = fid_of(&c, "/r/v");
    rename(r, "v2", r, "v", plain).expect("within /r, over a link to a file of MDT 0");
    assert_eq!(c.get("/r/v"), b"two");
    let gone = within(&rt, "getattr", cl.getattr(one));
    assert!(gone.is_err() || gone.is_ok_and(|a| a.nlink == 0), "the replaced file lost its only name");
    rename(d, "v3", r, "v", plain).expect("from MDT 0, over a file of MDT 1");
    assert_eq!(c.get("/r/v"), b"three");
    c.check_two_mdts(&mdts).expect("consistent after renames between MDTs");

    // Old name, then new name: one of them is always there.
    let names: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
    for n in &names {
        c.put(&format!("/d/{n}"), n.as_bytes());
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (cfg, watch_names, done) = (c.client_config(), names.clone(), stop.clone());
    let watcher = std::thread::spawn(move || {
        let rt = runtime();
        let cl = testkit::connect(&rt, cfg);
        let creds = client::process_creds();
        let mut looks = 0;
        while !done.load(std::sync::atomic::Ordering::Acquire) {
            for n in &watch_names {
                let old = within(&rt, "lookup", cl.lookup(&creds, d, n)).is_ok();
                let new = old || within(&rt, "lookup", cl.lookup(&creds, r, n)).is_ok();
                assert!(new, "{n}: neither the old name nor the new one");
                looks += 1;
            }
        }
        looks
    });
    for n in &names {
        rename(d, n, r, n, plain).expect("rename while a reader looks");
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    assert!(watcher.join().expect("the reader") > 0);

    // Through a mount: mv between MDTs is a rename.
    let m = Mount::new(&c, "");
    std::fs::rename(m.path("r/m0"), m.path("d/moved")).expect("rename(2) across MDTs");
    assert_eq!(std::fs::read(m.path("d/moved")).expect("read"), b"m0");
    let status = std::process::Command::new("mv").arg(m.path("d/moved")).arg(m.path("r/again")).status();
    assert!(status.expect("mv").success());
    assert_eq!(std::fs::read(m.path("r/again")).expect("read"), b"m0");
    drop(m);
    c.check_two_mdts(&mdts).expect("consistent at the end");
}

/// A directory striped over both MDTs (`mkdir -c 2`): each name lives in the shard
/// its fnv_1a_64 hash picks, its inode on that shard's MDT; a listing merges the
/// shards; the link count sums their subdirectories; `getdirstripe` shows the table;
/// it is removed once every shard is empty; the checker agrees throughout.
#[test]
fn a_striped_directory_spreads_its_names_over_both_mdts() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    c.braid_ok(&["mkdir", "-c", "2", "-i", "1", &c.url("/s")]);
    let shown = c.braid_ok(&["getdirstripe", &c.url("/s")]);
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines[0], "lmv_stripe_count: 2 lmv_stripe_offset: 1 lmv_hash_type: fnv_1a_64", "{shown}");
    assert_eq!(lines[1], "mdtidx\t\t FID[seq:oid:ver]", "{shown}");
    let s = fid_of(&c, "/s");
    assert_eq!(s.mdt(), 1, "shard 0 is the directory, on the first MDT asked for");
    assert!(lines[2].starts_with("     1\t\t [") && lines[3].starts_with("     0\t\t ["), "{shown}");
    let rt = runtime();
    let cl = c.connect(&rt);
    let creds = client::process_creds();
    let dir = within(&rt, "resolve", cl.resolve(&creds, "/s", true)).expect("resolve");
    let stripes = dir.stripes.clone().expect("a shard table");
    let names: Vec<String> = (0..40).map(|i| format!("f{i:02}")).collect();
    for n in &names {
        let (f, a, _) = within(&rt, "create", cl.create(&creds, dir.fid, n, 0o644, true, RW, None)).expect("create");
        within(&rt, "close", cl.close(f)).expect("close");
        let shard = layout::fnv_1a_64(n.as_bytes()) % 2;
        assert_eq!(a.fid.mdt(), stripes.shards[shard as usize].mdt(), "{n} is made on its shard's MDT");
    }
    let on = |k: u32| names.iter().filter(|n| stripes.shard_for(n).mdt() == k).count();
    assert!(on(0) > 5 && on(1) > 5, "both MDTs hold names: {} and {}", on(0), on(1));
    for sub in ["d1", "d2", "d3"] {
        within(&rt, "mkdir", cl.mkdir(&creds, dir.fid, sub, 0o755)).expect("mkdir in a striped directory");
    }
    let listed = within(&rt, "readdir", cl.readdir_all(&creds, dir.fid)).expect("readdir");
    let mut want: Vec<String> = names.clone();
    want.extend(["d1", "d2", "d3"].map(String::from));
    want.sort();
    assert_eq!(listed.iter().map(|e| e.name.clone()).collect::<Vec<_>>(), want, "every name once, in order");
    // In batches of 7: resuming after a name works across the shards.
    let (mut after, mut batched) = (None::<String>, Vec::new());
    loop {
        let (batch, eof) = within(&rt, "readdir", cl.readdir(&creds, dir.fid, after.as_deref(), 7)).expect("batch");
        assert!(batch.len() <= 7);
        after = batch.last().map(|e| e.name.clone()).or(after);
        batched.extend(batch.into_iter().map(|e| e.name));
        if eof {
            break;
        }
    }
    assert_eq!(batched, want);
    // Listed in batches of 5 while another client creates names in every shard: each
    // name that existed throughout shows exactly once, in order.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (cfg, done) = (c.client_config(), stop.clone());
    let maker = std::thread::spawn(move || {
        let rt = runtime();
        let cl = testkit::connect(&rt, cfg);
        let creds = client::process_creds();
        let mut made = 0;
        while !done.load(std::sync::atomic::Ordering::Acquire) && made < 400 {
            let name = format!("new{made:03}");
            let (f, ..) = within(&rt, "create", cl.create(&creds, s, &name, 0o644, true, RW, None)).expect("create");
            within(&rt, "close", cl.close(f)).expect("close");
            made += 1;
        }
        made
    });
    for _ in 0..5 {
        let (mut after, mut seen) = (None::<String>, Vec::new());
        loop {
            let (batch, eof) = within(&rt, "readdir", cl.readdir(&creds, dir.fid, after.as_deref(), 5)).expect("batch");
            after = batch.last().map(|e| e.name.clone()).or(after);
            seen.extend(batch.into_iter().map(|e| e.name));
            if eof {
                break;
            }
        }
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order, none twice");
        assert!(want.iter().all(|n| seen.contains(n)), "every name that existed throughout");
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let made = maker.join().expect("the creating client");
    let listed = within(&rt, "readdir", cl.readdir_all(&creds, dir.fid)).expect("readdir");
    assert_eq!(listed.len(), want.len() + made);
    for n in 0..made {
        within(&rt, "unlink", cl.unlink(&creds, dir.fid, &format!("new{n:03}"))).expect("unlink");
    }
    assert_eq!(within(&rt, "getattr", cl.getattr(dir.fid)).expect("getattr").nlink, 5, "2 + 3 subdirectories");
    assert_eq!(links(&c, "/s"), 5);
    // A client that never saw the table is sent to the right shard.
    let fresh = c.connect(&rt);
    let looked = within(&rt, "lookup", fresh.lookup(&creds, s, "f07")).expect("lookup through shard 0");
    assert_eq!(looked.fid.mdt(), stripes.shard_for("f07").mdt());
    c.check_two_mdts(&mdts).expect("consistent with a striped directory");
    // MDT 0 down (shard 1's): names of shard 0 (on MDT 1) are still made and found;
    // those of shard 1 fail with EIO after the client's timeout, never hang; nothing
    // is left half made.
    c.stop("mds");
    let mut cfg = c.client_config();
    cfg.rpc.recovery_timeout = Duration::from_secs(3);
    let short = testkit::connect(&rt, cfg);
    let name_on = |k: u32| (0..).map(|i| format!("down{i}")).find(|n| stripes.shard_for(n).mdt() == k).unwrap();
    let (up, down) = (name_on(stripes.shards[0].mdt()), name_on(stripes.shards[1].mdt()));
    let (f, ..) =
        within(&rt, "create", short.create(&creds, s, &up, 0o644, true, RW, None)).expect("shard 0 still takes names");
    within(&rt, "close", short.close(f)).expect("close");
    let failed = within(&rt, "create", short.create(&creds, s, &down, 0o644, true, RW, None));
    assert_eq!(client_errno(failed.map(|(_, a, _)| a)), Errno::Io, "a name of the down MDT's shard");
    c.restart("mds");
    c.wait_mdts_up(2, testkit::WAIT);
    within(&rt, "unlink", short.unlink(&creds, s, &up)).expect("unlink");
    assert!(within(&rt, "lookup", short.lookup(&creds, s, &down)).is_err(), "nothing half made");
    let cl = c.connect(&rt);
    let not_empty = within(&rt, "rmdir", cl.rmdir(&creds, Fid::ROOT, "s"));
    assert_eq!(client_errno(not_empty), Errno::NotEmpty);
    c.braid_ok(&["rm", "-r", &c.url("/s")]);
    assert!(!c.braid(&["stat", &c.url("/s")]).status.success());
    // Shard 0 on the parent's own MDT (its half held there by the same operation):
    // removed, and replaced by a rename of an empty directory.
    for d in ["/z0", "/z1"] {
        c.braid_ok(&["mkdir", "-c", "2", "-i", "0", &c.url(d)]);
    }
    within(&rt, "rmdir", cl.rmdir(&creds, Fid::ROOT, "z0")).expect("rmdir of a striped directory");
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/e")]);
    let plain = RenameFlags::default();
    within(&rt, "rename", cl.rename(&creds, Fid::ROOT, "e", Fid::ROOT, "z1", plain)).expect("over a striped dir");
    assert_eq!(c.braid_ok(&["getdirstripe", "-c", &c.url("/z1")]).trim(), "0", "/z1 is the plain directory now");
    c.check_two_mdts(&mdts).expect("consistent after the striped directory went");
}

/// Directories moved between directories on different MDTs, in every arrangement
/// of the old parent's, the new parent's and the directory's own MDT: the tree stays
/// a tree (a move below itself is refused even when the walk up crosses MDTs), link
/// counts and `..` follow, an empty directory is replaced, and `mv` through a mount
/// renames without copying.
#[test]
fn directories_move_between_directories_on_different_mdts() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    for (dir, mdt) in [("/a", "0"), ("/b", "1")] {
        c.braid_ok(&["mkdir", "-i", mdt, &c.url(dir)]);
    }
    c.braid_ok(&["mkdir", &c.url("/a/d")]);
    c.put("/a/d/f", b"inside");
    c.braid_ok(&["mkdir", &c.url("/a/d/sub")]);
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/a/r")]);
    let (d, r) = (fid_of(&c, "/a/d"), fid_of(&c, "/a/r"));
    assert_eq!((d.mdt(), r.mdt()), (0, 1));
    let rt = runtime();
    let cl = c.connect(&rt);
    let creds = client::process_creds();
    let at = |p: &str| within(&rt, "resolve", cl.resolve(&creds, p, true)).expect("resolve").fid;
    let (a, b) = (at("/a"), at("/b"));
    let plain = RenameFlags::default();
    let mv = |from: Fid, x: &str, to: Fid, y: &str| within(&rt, "rename", cl.rename(&creds, from, x, to, y, plain));
    // Old parent and directory on MDT 0, new parent on MDT 1.
    mv(a, "d", b, "d").expect("a directory to a directory on another MDT");
    assert_eq!(fid_of(&c, "/b/d"), d, "the same directory");
    assert_eq!(c.get("/b/d/f"), b"inside");
    assert_eq!((links(&c, "/a"), links(&c, "/b")), (3, 3), "/a lost d's `..`, /b gained it");
    // Below itself, even with the walk up crossing MDTs: /b (MDT 1) into /b/d/sub (MDT 0).
    let under = mv(Fid::ROOT, "b", at("/b/d/sub"), "b");
    assert_eq!(client_errno(under), Errno::Inval);
    assert_eq!(client_errno(mv(b, "d", at("/b/d"), "x")), Errno::Inval);
    // Old parent on MDT 1, new parent and directory on MDT 0; over an empty directory.
    c.braid_ok(&["mkdir", &c.url("/a/empty")]);
    mv(b, "d", a, "empty").expect("a directory over an empty one, back to MDT 0");
    assert_eq!(fid_of(&c, "/a/empty"), d);
    assert_eq!((links(&c, "/a"), links(&c, "/b")), (4, 2));
    c.braid_ok(&["mkdir", &c.url("/b/full")]);
    c.put("/b/full/x", b"x");
    assert_eq!(client_errno(mv(a, "empty", b, "full")), Errno::NotEmpty);
    c.put("/b/file", b"x");
    assert_eq!(client_errno(mv(a, "empty", b, "file")), Errno::NotDir);
    // Both parents on MDT 0, the directory on MDT 1: its MDT moves its `..`.
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/c")]);
    mv(a, "r", at("/c"), "r").expect("a remote directory between two directories of one MDT");
    assert_eq!(fid_of(&c, "/c/r"), r);
    assert_eq!((links(&c, "/a"), links(&c, "/c")), (3, 3));
    // Out of a directory another client holds a lease on, to this MDT and to the
    // other: the lease is revoked on whichever MDT removes the old entry.
    let mut cfg = c.client_config();
    cfg.dir_leases = true;
    let holder = testkit::connect(&rt, cfg);
    let leased = within(&rt, "mkdir", holder.mkdir_on(&creds, Fid::ROOT, "leased", 0o755, Some(0))).expect("mkdir");
    for sub in ["s0", "s1"] {
        within(&rt, "mkdir", holder.mkdir(&creds, leased.fid, sub, 0o755)).expect("mkdir in a leased directory");
    }
    assert!(holder.holds_dir_lease(leased.fid));
    mv(leased.fid, "s0", at("/c"), "s0").expect("out of a leased directory, the coordinator's MDT");
    mv(leased.fid, "s1", b, "s1").expect("out of a leased directory, the participant's MDT");
    assert!(!holder.holds_dir_lease(leased.fid), "the holder was told");
    let left = within(&rt, "readdir", holder.readdir_all(&creds, leased.fid)).expect("readdir");
    assert!(left.is_empty(), "the holder sees both names gone: {left:?}");
    c.check_two_mdts(&mdts).expect("consistent after directories moved between MDTs");

    // Through a mount: mv renames (the inode stays), no copy.
    let m = Mount::new(&c, "");
    std::fs::rename(m.path("a/empty"), m.path("b/moved")).expect("rename(2) of a directory across MDTs");
    assert_eq!(std::fs::read(m.path("b/moved/f")).expect("read"), b"inside");
    let status = std::process::Command::new("mv").arg(m.path("b/moved")).arg(m.path("c/r/again")).status();
    assert!(status.expect("mv").success());
    assert_eq!(std::fs::read(m.path("c/r/again/f")).expect("read"), b"inside");
    drop(m);
    assert_eq!(fid_of(&c, "/c/r/again"), d);
    c.check_two_mdts(&mdts).expect("consistent at the end");
}

#[test]
fn a_directory_move_between_mdts_survives_a_sigkill_at_every_step() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/on1")]);
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/on0")]);
    // From the root into /on1: the coordinator is MDT 1, the old entry's MDT 0 moves
    // the directory's `..` too. Then a directory of MDT 1 between the root and /on0,
    // both on MDT 0 (the coordinator): MDT 1 moves its `..`.
    let (into, remote) = ("rename-dir", "rename-dir-remote");
    let points = [
        ("mds1", "rename:before-update", into),
        ("mds1", "rename:before-commit", into),
        ("mds1", "rename:before-done", into),
        ("mds", "update:before-reply", into),
        ("mds", "update-done:before-apply", into),
        ("mds", "rename:before-update", remote),
        ("mds", "rename:before-commit", remote),
        ("mds", "rename:before-done", remote),
        ("mds1", "update:before-reply", remote),
        ("mds1", "update-done:before-apply", remote),
    ];
    for (i, (process, point, op)) in points.into_iter().enumerate() {
        crash_at(&mut c, &mdts, process, point, op, &format!("m{i}"));
    }
    let listed = c.braid_ok(&["ls", &c.url("/on1")]);
    assert_eq!(listed.split_whitespace().collect::<Vec<_>>(), ["m0", "m1", "m2", "m3", "m4"], "{listed}");
    let listed = c.braid_ok(&["ls", &c.url("/on0")]);
    assert_eq!(listed.split_whitespace().collect::<Vec<_>>(), ["m5", "m6", "m7", "m8", "m9"], "{listed}");
}

#[test]
fn an_exchange_between_mdts_survives_a_sigkill_at_every_step() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/on1")]);
    // The coordinator is MDT 1 (the second name's); MDT 0 swaps the first entry.
    let points = [
        ("mds1", "exchange:before-update"),
        ("mds1", "exchange:before-commit"),
        ("mds1", "exchange:before-done"),
        ("mds", "update:before-reply"),
        ("mds", "update-done:before-apply"),
    ];
    for (i, (process, point)) in points.into_iter().enumerate() {
        crash_at(&mut c, &mdts, process, point, "exchange", &format!("x{i}"));
    }
    assert_eq!(links(&c, "/"), 2 + 1 + 5, "the root holds /on1 and the five directories swapped into it");
    assert_eq!(links(&c, "/on1"), 2, "/on1 holds only files now");
}

#[test]
fn a_striped_mkdir_and_rmdir_survive_a_sigkill_at_every_step() {
    let (mut c, mdts) = Cluster::start_two_mdts(bin());
    // The root's MDT coordinates; shard 0 is made on it (as a participant of its own
    // operation over the same protocol), shard 1 on MDT 1.
    let points = [
        ("mds", "mkdir-striped:before-reserve", "mkdir-striped"),
        ("mds", "mkdir-striped:before-update", "mkdir-striped"),
        ("mds", "mkdir-striped:before-commit", "mkdir-striped"),
        ("mds", "mkdir-striped:before-done", "mkdir-striped"),
        ("mds1", "update:before-reply", "mkdir-striped"),
        ("mds1", "update-done:before-apply", "mkdir-striped"),
        ("mds", "rmdir-striped:before-update", "rmdir-striped"),
        ("mds", "rmdir-striped:before-commit", "rmdir-striped"),
        ("mds", "rmdir-striped:before-done", "rmdir-striped"),
        ("mds1", "update:before-reply", "rmdir-striped"),
        ("mds1", "update-done:before-apply", "rmdir-striped"),
    ];
    for (i, (process, point, op)) in points.into_iter().enumerate() {
        crash_at(&mut c, &mdts, process, point, op, &format!("s{i}"));
    }
    let listed = c.braid_ok(&["ls", &c.url("/")]);
    assert_eq!(listed.split_whitespace().collect::<Vec<_>>(), ["s0", "s1", "s2", "s3", "s4", "s5"], "{listed}");
}
