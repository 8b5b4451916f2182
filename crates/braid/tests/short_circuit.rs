//! Short-circuit local I/O through real processes: a native client on the OSS's
//! machine (the test process beside an OSS process) reads and writes the object
//! files through descriptors the OSS hands it, and everything else still holds:
//! a client over TCP reads what it wrote and the other way round, a destroyed object
//! leaves no descriptor behind, and a killed OSS fails its stripes as over TCP until
//! it is back.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
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
