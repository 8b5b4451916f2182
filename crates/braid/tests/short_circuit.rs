//! Short-circuit local I/O through real processes: a native client on the OSS's
//! machine (the test process beside an OSS process) reads and writes the object
//! files through descriptors the OSS hands it, and everything else still holds:
//! a client over TCP reads what it wrote and the other way round, a destroyed object
//! leaves no descriptor behind, and a killed OSS fails its stripes as over TCP until
//! it is back. Also who gets descriptors: a user the OSS does not allow is refused
//! before the handshake and goes over TCP, and an OSS without a cluster secret hands
//! out none unless told to.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proto::auth::Secret;
use proto::msg::OpenFlags;
use proto::Errno;
use testkit::{client_errno, connect, pattern, runtime, wait_for, within, Cluster, ClusterSpec, WAIT};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

const RW: OpenFlags = OpenFlags { read: true, write: true, truncate: false };

/// Descriptors this process holds of object files under `dir`: (held, of those,
/// of unlinked files).
fn object_descriptors(dir: &Path) -> (usize, usize) {
    let (mut held, mut unlinked) = (0, 0);
    for entry in std::fs::read_dir("/proc/self/fd").expect("list /proc/self/fd").flatten() {
        let Ok(target) = std::fs::read_link(entry.path()) else { continue };
        let t = target.to_string_lossy();
        if t.starts_with(&*dir.to_string_lossy()) && t.contains("/objects/") {
            held += 1;
            unlinked += usize::from(t.ends_with(" (deleted)"));
        }
    }
    (held, unlinked)
}

#[test]
fn a_client_beside_the_oss_reads_and_writes_the_object_files_itself() {
    let mut c = Cluster::start(bin(), ClusterSpec::default());
    c.wait_placement(4, WAIT);
    c.braid_ok(&["mkdir", &c.url("/d")]);
    c.braid_ok(&["setstripe", "-c", "4", "-S", "64K", &c.url("/d")]);
    let rt = runtime();
    let mut cfg = c.client_config();
    cfg.short_circuit = true;
    // A stripe whose OSS is gone fails after 3 s, not after the default wait.
    cfg.rpc.recovery_timeout = Duration::from_secs(3);
    let local = connect(&rt, cfg);
    let remote = c.connect(&rt);
    let creds = client::process_creds();
    let dir = within(&rt, "resolve", local.resolve(&creds, "/d", true)).expect("resolve").fid;

    // The first I/O of each OST goes over TCP while its local connection is made.
    let (f, attr, _) = within(&rt, "create", local.create(&creds, dir, "f", 0o644, true, RW, None)).expect("create");
    wait_for("local connections to the 4 OSTs", WAIT, || {
        within(&rt, "write", local.write(&f, 0, Bytes::from(pattern(256 << 10, 1)))).expect("write");
        local.short_circuit_osts() == [0, 1, 2, 3]
    });

    // 1 MiB over the 4 stripes, written and read back without a request to an OST.
    let data = Bytes::from(pattern(1 << 20, 2));
    let before = local.rpc_counts();
    within(&rt, "write", local.write(&f, 0, data.clone())).expect("write");
    within(&rt, "fsync", local.fsync(&f)).expect("fsync");
    let synced = local.rpc_counts();
    assert_eq!(synced.local - before.local, 4, "one local write per object: {before:?} -> {synced:?}");
    assert!(synced.ost - before.ost <= 4, "only the syncs went to the OSS: {before:?} -> {synced:?}");
    let back = within(&rt, "read", local.read(&f, 0, 1 << 20)).expect("read");
    assert!(back == data, "the bytes read back through the descriptors");
    let after = local.rpc_counts();
    assert_eq!((after.ost, after.local - synced.local), (synced.ost, 4), "{synced:?} -> {after:?}");
    within(&rt, "close", local.close(f)).expect("close");
    let (held, _) = object_descriptors(c.dir.path());
    assert!(held >= 4, "the client keeps its objects' descriptors ({held})");

    // A client over TCP reads those bytes from the OSS, and what it writes is what
    // the local client reads after its next open (close-to-open).
    let (g, _) = within(&rt, "open", remote.open(&creds, attr.fid, RW)).expect("open over TCP");
    assert!(within(&rt, "read", remote.read(&g, 0, 1 << 20)).expect("read") == data);
    let patch = Bytes::from(pattern(100_000, 3));
    within(&rt, "write", remote.write(&g, 70_000, patch.clone())).expect("write over TCP");
    within(&rt, "close", remote.close(g)).expect("close");
    let (f, _) = within(&rt, "open", local.open(&creds, attr.fid, RW)).expect("reopen");
    let now = within(&rt, "read", local.read(&f, 0, 1 << 20)).expect("read");
    let mut want = data.to_vec();
    want[70_000..170_000].copy_from_slice(&patch);
    assert!(now == want, "the local client reads what the TCP client wrote");
    within(&rt, "close", local.close(f)).expect("close");

    // Unlinked: the OSS destroys the objects and tells the client, which keeps no
    // descriptor of them.
    within(&rt, "unlink", remote.unlink(&creds, dir, "f")).expect("unlink");
    wait_for("the objects destroyed", WAIT, || (0..4).all(|i| c.ost_objects(i).is_empty()));
    wait_for("no descriptor of a destroyed object", WAIT, || object_descriptors(c.dir.path()).1 == 0);

    // The OSS killed: its connections end with it, and its stripes fail as they do
    // over TCP (the writes, at the latest at their fsync).
    let (f, _, _) = within(&rt, "create", local.create(&creds, dir, "g", 0o644, true, RW, None)).expect("create");
    within(&rt, "write", local.write(&f, 0, data.clone())).expect("write");
    within(&rt, "fsync", local.fsync(&f)).expect("fsync");
    c.kill("oss0");
    wait_for("the local connections ended", WAIT, || local.short_circuit_osts().is_empty());
    assert_eq!(object_descriptors(c.dir.path()).0, 0, "no descriptor outlives the connection");
    let failed = within(&rt, "write with the OSS gone", async {
        local.write(&f, 0, Bytes::from(pattern(1 << 20, 4))).await?;
        local.fsync(&f).await
    });
    assert_eq!(client_errno(failed), Errno::Io);

    let _ = within(&rt, "close", local.close(f));

    // Back: the bytes synced before are there, over TCP first, then locally again.
    c.restart("oss0");
    c.wait_osts_up(4, WAIT);
    let (f, _) = within(&rt, "open", local.open(&creds, attr_of(&rt, &local, &creds, dir, "g"), RW)).expect("open");
    wait_for("local connections again", WAIT, || {
        let _ = within(&rt, "read", local.read(&f, 0, 1 << 20));
        local.short_circuit_osts() == [0, 1, 2, 3]
    });
    let before = local.rpc_counts();
    let back = within(&rt, "read", local.read(&f, 0, 1 << 20)).expect("read");
    assert_eq!(local.rpc_counts().local - before.local, 4);
    assert!(back == data, "what was synced before the OSS died");
    within(&rt, "close", local.close(f)).expect("close");
}

fn attr_of(
    rt: &tokio::runtime::Runtime,
    cl: &client::Client,
    creds: &proto::msg::Creds,
    dir: proto::Fid,
    name: &str,
) -> proto::Fid {
    within(rt, "lookup", cl.lookup(creds, dir, name)).expect("lookup").fid
}

/// The user probes run as.
const NOBODY: u32 = 65534;
const PROBE_MGS: &str = "BRAID_TEST_PROBE_MGS";
const PROBE_SOCKET: &str = "BRAID_TEST_PROBE_SOCKET";
const PROBE_SECRET: &str = "BRAID_TEST_PROBE_SECRET";

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Not a test of its own: what [`probe_as_nobody`] runs in a child process of user
/// nobody (this test binary again). With the cluster secret in hand it asks OST 0's
/// socket for a descriptor by hand, then runs a short-circuit client that writes and
/// reads a file, and prints what each got.
#[test]
fn probe_as_another_user() {
    let (Ok(mgs), Ok(socket), Ok(hex)) =
        (std::env::var(PROBE_MGS), std::env::var(PROBE_SOCKET), std::env::var(PROBE_SECRET))
    else {
        return;
    };
    let key: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    let secret = Secret::Key(key);
    let rt = runtime();
    let raw: Result<bool, String> = rt.block_on(async {
        use proto::frame::{read_frame, write_frame, FrameKind, FrameLimits};
        let mut s = rpc::short_circuit::connect(&socket).map_err(|e| e.to_string())?;
        let shake = proto::auth::client_handshake(&mut s, &secret, 1, "client");
        tokio::time::timeout(Duration::from_secs(10), shake)
            .await
            .map_err(|_| "no handshake in 10 s".to_string())?
            .map_err(|e| e.reason)?;
        let (rd, mut wr) = s.into_split();
        let object = proto::ObjectId { fid: proto::Fid { seq: 0x200000400, oid: 77, ver: 0 }, component: 0, stripe: 0 };
        let open = proto::msg::encode(&proto::msg::Request::OstOpen { ost: 0, object, create: true }).unwrap();
        write_frame(&mut wr, FrameKind::Request, 1, &open, &[]).await.map_err(|e| e.to_string())?;
        let mut rd = rpc::short_circuit::FdReader::new(rd);
        let limits = FrameLimits { max_msg_bytes: 4096, max_payload_bytes: 0 };
        read_frame(&mut rd, &limits).await.map_err(|e| e.to_string())?.ok_or("closed before answering")?;
        Ok(rd.take_fd().is_some())
    });
    match raw {
        Ok(true) => println!("PROBE raw: descriptor"),
        Ok(false) => println!("PROBE raw: no descriptor"),
        Err(why) => println!("PROBE raw: refused: {why}"),
    }
    let mut cfg = testkit::client_config(&mgs, secret);
    cfg.short_circuit = true;
    let cl = connect(&rt, cfg);
    // As root on the file system (the creds are the client's word): the test is
    // about the OSS's socket, not the MDS's permissions.
    let creds = proto::msg::Creds::root();
    let root = within(&rt, "resolve", cl.resolve(&creds, "/", true)).expect("resolve").fid;
    let name = format!("probe-{}", std::process::id());
    let (f, _, _) = within(&rt, "create", cl.create(&creds, root, &name, 0o644, true, RW, None)).expect("create");
    // The first writes start the local connection; long enough for it to be made.
    let data = Bytes::from(pattern(256 << 10, 9));
    let start = Instant::now();
    while cl.short_circuit_osts().is_empty() && start.elapsed() < Duration::from_secs(3) {
        within(&rt, "write", cl.write(&f, 0, data.clone())).expect("write");
        std::thread::sleep(Duration::from_millis(50));
    }
    within(&rt, "write", cl.write(&f, 0, data.clone())).expect("write");
    let back = within(&rt, "read", cl.read(&f, 0, data.len() as u64)).expect("read");
    within(&rt, "close", cl.close(f)).expect("close");
    let osts = cl.short_circuit_osts();
    println!("PROBE client: local={} osts={osts:?} same={}", cl.rpc_counts().local, back == data);
}

/// Runs [`probe_as_another_user`] as user nobody against OST 0 of `c`; its output.
fn probe_as_nobody(c: &Cluster) -> String {
    let uuid = std::fs::read_to_string(c.dir.path().join("ost0").join("target.uuid")).expect("OST 0's uuid");
    let Secret::Key(key) = Secret::load(&c.secret).expect("the cluster secret") else { panic!("a keyed cluster") };
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let mut cmd = Command::new(std::env::current_exe().expect("this test binary"));
    cmd.args(["--exact", "probe_as_another_user", "--nocapture", "--test-threads=1"])
        .env(PROBE_MGS, &c.mgs_addr)
        .env(PROBE_SOCKET, rpc::short_circuit::socket_name(uuid.trim()))
        .env(PROBE_SECRET, hex)
        .uid(NOBODY)
        .gid(NOBODY);
    let out = testkit::output_within(&mut cmd, Duration::from_secs(90))
        .unwrap_or_else(|o| panic!("the probe hung: {}", testkit::stdout(&o)));
    let text = format!("{}{}", testkit::stdout(&out), testkit::stderr(&out));
    assert!(out.status.success(), "the probe failed: {text}");
    text
}

/// A process of a user the OSS does not allow (neither root, nor the OSS's user, nor
/// listed) is refused before the handshake, even with the cluster secret, and the OSS
/// says why; its client goes on over TCP. Listed with `--short-circuit-uids`, the
/// same process gets descriptors.
#[test]
fn a_user_the_oss_does_not_allow_gets_no_descriptor_and_goes_over_tcp() {
    if !is_root() {
        eprintln!("skipped: running a process as user nobody needs root");
        return;
    }
    let mut c = Cluster::start(bin(), ClusterSpec { osts_per_oss: vec![1], ..Default::default() });
    let out = probe_as_nobody(&c);
    assert!(out.contains("PROBE raw: refused"), "{out}");
    assert!(out.contains("PROBE client: local=0 osts=[] same=true"), "{out}");
    let log = c.servers["oss0"].log.clone();
    wait_for("the OSS to log the refusal", WAIT, || {
        std::fs::read_to_string(&log).unwrap_or_default().contains(&format!(
            "short-circuit client refused: uid {NOBODY} is neither root, the OSS's user (uid 0) nor one of \
             --short-circuit-uids"
        ))
    });

    c.servers.get_mut("oss0").expect("oss0").args.extend(["--short-circuit-uids".into(), format!("1234,{NOBODY}")]);
    c.restart("oss0");
    c.wait_osts_up(1, WAIT);
    let out = probe_as_nobody(&c);
    assert!(out.contains("PROBE raw: descriptor"), "{out}");
    assert!(out.contains("osts=[0] same=true") && !out.contains("local=0 "), "{out}");
}

/// Writes through a short-circuit client of `c` for a few seconds; the OSTs it had
/// local connections to, and the writes made through descriptors.
fn short_circuit_use(c: &Cluster) -> (Vec<u32>, u64) {
    let rt = runtime();
    let mut cfg = c.client_config();
    cfg.short_circuit = true;
    let cl = connect(&rt, cfg);
    let creds = client::process_creds();
    let root = within(&rt, "resolve", cl.resolve(&creds, "/", true)).expect("resolve").fid;
    let (f, _, _) = within(&rt, "create", cl.create(&creds, root, "f", 0o644, true, RW, None)).expect("create");
    let data = Bytes::from(pattern(256 << 10, 5));
    let start = Instant::now();
    while cl.rpc_counts().local == 0 && start.elapsed() < Duration::from_secs(3) {
        within(&rt, "write", cl.write(&f, 0, data.clone())).expect("write");
        std::thread::sleep(Duration::from_millis(50));
    }
    let back = within(&rt, "read", cl.read(&f, 0, data.len() as u64)).expect("read");
    assert!(back == data);
    within(&rt, "close", cl.close(f)).expect("close");
    (cl.short_circuit_osts(), cl.rpc_counts().local)
}

/// Without a cluster secret the handshake proves nothing, so an OSS run `--insecure`
/// opens no local socket, and says so, unless `--short-circuit-insecure` asks for it.
#[test]
fn an_insecure_oss_hands_out_descriptors_only_when_told_to() {
    let spec = ClusterSpec { osts_per_oss: vec![1], insecure: true, ..Default::default() };
    let c = Cluster::start(bin(), spec.clone());
    let (osts, local) = short_circuit_use(&c);
    assert_eq!((osts, local), (vec![], 0), "an insecure OSS handed out descriptors");
    let log = std::fs::read_to_string(&c.servers["oss0"].log).unwrap_or_default();
    assert!(log.contains("short-circuit I/O off: without a cluster secret"), "{log}");
    drop(c);

    let c = Cluster::start(bin(), ClusterSpec { oss_args: vec!["--short-circuit-insecure".into()], ..spec });
    let (osts, local) = short_circuit_use(&c);
    assert_eq!(osts, vec![0]);
    assert!(local > 0, "no I/O through descriptors");
}
