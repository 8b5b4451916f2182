//! Several MDTs on separate `braid mds` processes: remote directories (`mkdir -i K`)
//! made and removed through the CLI, the native client and a FUSE mount, the
//! namespace checker over both MDTs' stores, and each process killed with SIGKILL at
//! every step of the protocol of a remote mkdir and rmdir (fault points switched on
//! by `BRAID_FAULT`): the client's retried call gets the answer of the first, and the
//! namespace is consistent afterwards.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use proto::msg::{OpenFlags, RenameFlags};
use proto::{Errno, Fid};
use testkit::{client_errno, runtime, stderr, within, Cluster, ClusterSpec, Mount};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

const RW: OpenFlags = OpenFlags { read: true, write: true, truncate: false };

/// An MGS, an OSS, MDT 0 in process `mds` and MDT 1 in process `mds1`.
fn two_mds() -> (Cluster, Vec<PathBuf>) {
    let mut c = Cluster::start(bin(), ClusterSpec::default());
    let mdt1 = c.dir.path().join("mdt1");
    c.add_mds("mds1", std::slice::from_ref(&mdt1));
    c.wait_mdts_up(2, testkit::WAIT);
    let mdts = vec![c.dir.path().join("mdt0"), mdt1];
    (c, mdts)
}

/// Stops both MDSs, runs the namespace checker, and starts them again; the
/// checker's output.
fn check(c: &mut Cluster, mdts: &[PathBuf]) -> Result<String, String> {
    c.stop("mds");
    c.stop("mds1");
    let mut args = vec!["check-namespace".to_string()];
    for m in mdts {
        args.extend(["--mdt".into(), m.display().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = c.braid(&args);
    c.restart("mds");
    c.restart("mds1");
    c.wait_mdts_up(2, testkit::WAIT);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{text}{}", stderr(&out)))
    }
}

/// The checker passes within `timeout` (a participant settles what a crash left
/// undecided once it asks the coordinator).
fn consistent_within(c: &mut Cluster, mdts: &[PathBuf], timeout: Duration) {
    let start = Instant::now();
    loop {
        match check(c, mdts) {
            Ok(_) => return,
            Err(e) if start.elapsed() > timeout => panic!("the namespace is not consistent:\n{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
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
    let (mut c, mdts) = two_mds();
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/remote")]);
    c.braid_ok(&["mkdir", &c.url("/local")]);
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
    let renamed = within(&rt, "rename", cl.rename(&creds, Fid::ROOT, "remote", local, "moved", no_flags));
    assert_eq!(client_errno(renamed), Errno::XDev, "renames across MDTs are refused (mv copies)");
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
    let own = within(&rt, "mkdir", leasing.mkdir(&creds, Fid::ROOT, "own", 0o755)).expect("mkdir own");
    assert_eq!(leasing.dir_leases_held(), 1, "the client holds a lease on the directory it made");
    let x = within(&rt, "mkdir -i 1 under a lease", leasing.mkdir_on(&creds, own.fid, "x", 0o755, Some(1)));
    assert_eq!(x.expect("remote mkdir under the client's own lease").fid.mdt(), 1);
    within(&rt, "rmdir", leasing.rmdir(&creds, own.fid, "x")).expect("remote rmdir under the client's own lease");
    // A move whose loop check would pass through another MDT is refused, not made:
    // /w/a on MDT 1, /w/a/p on MDT 0, /w/a/p/x on MDT 1; /w/a into x would be a cycle.
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/w")]);
    c.braid_ok(&["mkdir", &c.url("/w/a")]);
    c.braid_ok(&["mkdir", "-i", "0", &c.url("/w/a/p")]);
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/w/a/p/x")]);
    let (w, x) = (fid_of(&c, "/w"), fid_of(&c, "/w/a/p/x"));
    let cycle = within(&rt, "rename into itself", cl.rename(&creds, w, "a", x, "a", RenameFlags::default()));
    assert_eq!(client_errno(cycle), Errno::XDev);

    // A default for new directories (`setdirstripe -D`): spread round-robin (`-i -1`)
    // or on one MDT, for anyone making directories there, inherited below.
    c.braid_ok(&["mkdir", &c.url("/spread")]);
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
    let out = c.braid(&["setdirstripe", "-D", "-c", "2", &c.url("/spread")]);
    assert!(!out.status.success() && stderr(&out).contains("not supported yet"), "{}", stderr(&out));
    let garbage = cl.setxattr(&creds, spread, "trusted.dmv", b"stripe_count=1 pool=x", client::XattrMode::Any);
    assert_eq!(client_errno(within(&rt, "setxattr", garbage)), Errno::Inval);
    check(&mut c, &mdts).expect("consistent with remote directories");

    // Through a FUSE mount: the same tree, and rmdir of remote directories.
    let m = Mount::new(&c, "");
    assert_eq!(std::fs::read(m.path("remote/file")).expect("read through the mount"), &data[..]);
    std::fs::write(m.path("remote/sub/new"), b"x").expect("write through the mount");
    std::fs::create_dir(m.path("local/plain")).expect("mkdir through the mount");
    assert!(std::fs::remove_dir(m.path("remote")).is_err(), "not empty");
    std::fs::remove_dir_all(m.path("remote")).expect("rm -r of a remote tree");
    assert!(!m.path("remote").exists());
    assert_eq!(std::fs::metadata(m.path("")).expect("stat root").nlink_count(), 6, "/local, /spread, /own, /w");
    drop(m);
    check(&mut c, &mdts).expect("consistent after the removals");
}

/// MDS-to-MDS requests from a hostile or confused peer get errors and leave nothing
/// behind; with MDT 1's MDS down, a remote mkdir fails with EIO after the peer
/// timeout while MDT 0 keeps serving, and nothing is left half made.
#[test]
fn hostile_updates_and_a_down_mdt_get_clear_errors() {
    use proto::msg::{Creds, Request, Response, UpdateId, UpdateOp};
    let (mut c, mdts) = two_mds();
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
    };
    let rmdir = |fid: Fid| UpdateOp::RmdirInode { fid, parent: Fid::ROOT, name: "x".into() };
    let id = |mdt: u32| UpdateId { mdt, seq: 42 };
    let hostile = [
        Request::MdsUpdate { mdt: 1, id: id(1), op: mkdir(Fid::ROOT) },
        Request::MdsUpdate { mdt: 1, id: id(0), op: mkdir(dir) },
        Request::MdsUpdate { mdt: 7, id: id(0), op: mkdir(Fid::ROOT) },
        Request::MdsUpdate { mdt: 1, id: id(0), op: rmdir(file) },
        Request::MdsUpdate { mdt: 1, id: id(0), op: rmdir(dir) },
        Request::MdsUpdate { mdt: 1, id: id(0), op: rmdir(Fid::new(1, 1, 999_999)) },
        Request::MdsUpdateQuery { id: id(0), parent: dir, fid: file },
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
    let done = Request::MdsUpdateDone { fid: dir, id: id(0), committed: false };
    assert!(matches!(within(&rt, "verdict", rpc.call(&done, vec![])).expect("answered").response, Response::Ok));
    let stray = Request::MdsUpdate { mdt: 1, id: id(0), op: mkdir(Fid::ROOT) };
    within(&rt, "stray update", rpc.call(&stray, vec![])).expect("applied as pending");
    consistent_within(&mut c, &mdts, Duration::from_secs(30));
    assert_eq!(c.braid_ok(&["ls", &c.url("/r")]).trim(), "file", "the directory and its file are untouched");

    // MDT 1 down: EIO after the peer timeout, never a hang; MDT 0 goes on.
    c.stop("mds1");
    let out = c.braid(&["mkdir", "-i", "1", &c.url("/down")]);
    assert!(!out.status.success() && stderr(&out).contains("MDT 1"), "{}", stderr(&out));
    c.braid_ok(&["mkdir", &c.url("/up")]);
    c.restart("mds1");
    c.wait_mdts_up(2, testkit::WAIT);
    assert!(!c.braid(&["stat", &c.url("/down")]).status.success(), "no half-made /down");
    consistent_within(&mut c, &mdts, Duration::from_secs(30));
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
/// checks the CLI's call succeeded (its retry got the answer of the first) and the
/// namespace is consistent. `op` is "mkdir" (of `/NAME` on MDT 1) or "rmdir" (of
/// `/NAME`, made on MDT 1 first).
fn crash_at(c: &mut Cluster, mdts: &[PathBuf], process: &str, point: &str, op: &str, name: &str) {
    let url = c.url(&format!("/{name}"));
    if op == "rmdir" {
        c.braid_ok(&["mkdir", "-i", "1", &url]);
    }
    c.set_env(process, mds::dne::FAULT_ENV, Some(point));
    c.restart(process);
    c.wait_mdts_up(2, testkit::WAIT);
    let args: Vec<String> = match op {
        "mkdir" => vec!["mkdir".into(), "-i".into(), "1".into(), url.clone()],
        _ => vec!["rm".into(), "-r".into(), url.clone()],
    };
    let bin = c.bin.clone();
    let secret = c.secret.clone();
    let call = std::thread::spawn(move || {
        let mut cmd = std::process::Command::new(bin);
        cmd.args(&args).env("BRAID_SECRET_FILE", secret);
        testkit::output_within(&mut cmd, testkit::CLI_WATCHDOG)
    });
    assert!(c.wait_exit(process, Duration::from_secs(60)), "{process} did not stop at {point}");
    c.set_env(process, mds::dne::FAULT_ENV, None);
    c.restart(process);
    let out = call.join().expect("the CLI thread").unwrap_or_else(|o| o);
    assert!(out.status.success(), "{op} across a SIGKILL of {process} at {point}: {}", stderr(&out));
    match op {
        "mkdir" => assert_eq!(fid_of(c, &format!("/{name}")).mdt(), 1, "{point}"),
        _ => assert!(!c.braid(&["stat", &url]).status.success(), "{name} still exists after {point}"),
    }
    consistent_within(c, mdts, Duration::from_secs(30));
}

#[test]
fn a_remote_mkdir_and_rmdir_survive_a_sigkill_at_every_step() {
    let (mut c, mdts) = two_mds();
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
