//! The observation point of the native client, through real MGS, MDS and OSS
//! processes: every public operation of `Client` reports to the observer exactly once,
//! under the name `client::OPS` gives it, failures included. An operation added
//! without observation, or one that stops reporting, fails here. Also: an open
//! handle's layout is replaced by a newer generation only.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use client::{OpObserver, OpRecord};
use layout::{ComponentSpec, LayoutChange, LayoutSpec};
use proto::msg::{FileKind, LockRequest, LockType, OpenFlags, RenameFlags, SetAttr, XattrMode};
use proto::{Errno, Fid};
use testkit::{Cluster, ClusterSpec};

const RW: OpenFlags = OpenFlags { read: true, write: true, truncate: false };

fn cluster() -> Cluster {
    Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), ClusterSpec::default())
}

/// Keeps every record the client reports.
#[derive(Default)]
struct Recorder(Mutex<Vec<OpRecord>>);

impl OpObserver for Recorder {
    fn record(&self, r: &OpRecord) {
        self.0.lock().expect("records").push(r.clone());
    }
}

impl Recorder {
    fn take(&self) -> Vec<OpRecord> {
        std::mem::take(&mut *self.0.lock().expect("records"))
    }
}

/// Calls operations one at a time and checks what each reported.
struct Calls {
    recorder: Arc<Recorder>,
    /// The names the calls reported.
    seen: BTreeSet<&'static str>,
}

impl Calls {
    /// Runs one call, which must succeed and report exactly one record: `op`, a success.
    async fn ok<T>(&mut self, op: &'static str, f: impl std::future::Future<Output = client::Result<T>>) -> T {
        self.recorder.take();
        let value = f.await.unwrap_or_else(|e| panic!("{op}: {e}"));
        let records = self.recorder.take();
        let names: Vec<&str> = records.iter().map(|r| r.op).collect();
        assert_eq!(names, [op], "one call of {op} reports once, under its own name");
        assert_eq!(records[0].result, Ok(()), "{op} succeeded and says so");
        self.seen.insert(op);
        value
    }
}

#[test]
fn every_client_operation_reports_once_to_the_observer() {
    // One poll function holds every call's future at once in a debug build: more than
    // a test thread's stack.
    let body = std::thread::Builder::new().stack_size(64 << 20).spawn(every_operation).expect("a thread");
    body.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
}

fn every_operation() {
    let c = cluster();
    let rt = testkit::runtime();
    let client = c.connect(&rt);
    let recorder = Arc::new(Recorder::default());
    client.set_observer(Some(recorder.clone()));
    let creds = client::process_creds();
    let mut calls = Calls { recorder: recorder.clone(), seen: BTreeSet::new() };
    let data = Bytes::from(vec![7u8; 200 << 10]);

    rt.block_on(async {
        let calls = &mut calls;
        let (cl, creds) = (&client, &creds);

        // Cluster.
        calls.ok("refresh_config", cl.refresh_config()).await;
        calls.ok("target_usage", cl.target_usage()).await;
        calls.ok("statfs", cl.statfs()).await;
        let pools = calls.ok("pool_change", cl.pool_change("observed", proto::msg::PoolOp::Create, vec![])).await;
        assert!(pools.pool("observed").is_some());

        // A directory whose files stripe over two OSTs, so I/O crosses targets.
        let dir = calls.ok("mkdir", cl.mkdir(creds, Fid::ROOT, "d", 0o755)).await;
        let two = Some(LayoutSpec::raid0(Some(2), Some(64 << 10)));
        calls.ok("setstripe", cl.set_dir_layout(creds, dir.fid, two.clone())).await;
        assert!(calls.ok("getstripe", cl.get_dir_layout(dir.fid)).await.is_some());

        // Data.
        let (f, attr, existed) = calls.ok("create", cl.create(creds, dir.fid, "f", 0o644, true, RW, None)).await;
        assert!(!existed);
        assert_eq!(calls.ok("write", cl.write(&f, 0, data.clone())).await, data.len() as u64);
        assert!(calls.ok("read", cl.read(&f, 0, data.len() as u64)).await == data);
        calls.ok("flush", cl.flush(&f)).await;
        calls.ok("fsync", cl.fsync(&f)).await;
        calls.ok("sync_metadata", cl.sync_metadata(f.fid)).await;
        assert_eq!(calls.ok("glimpse_size", cl.glimpse_size(&attr)).await, data.len() as u64);
        calls.ok("punch", cl.punch_hole(&f, 0, 4096)).await;
        calls.ok("truncate", cl.ftruncate(creds, &f, 100 << 10)).await;
        let set = SetAttr { size: Some(50 << 10), ..Default::default() };
        assert_eq!(calls.ok("setattr", cl.fsetattr(creds, &f, set)).await.size, 50 << 10);
        let set = SetAttr { mode: Some(0o600), ..Default::default() };
        assert_eq!(calls.ok("setattr", cl.setattr(creds, f.fid, set)).await.mode & 0o777, 0o600);
        calls
            .ok(
                "setlk",
                cl.set_lock(f.fid, LockRequest { owner: 1, pid: 1, lock: LockType::Write, start: 0, end: 99 }, false),
            )
            .await;
        assert!(calls
            .ok("getlk", cl.get_lock(f.fid, LockRequest { owner: 2, pid: 0, lock: LockType::Read, start: 0, end: 9 }))
            .await
            .is_some());
        calls
            .ok(
                "setlk",
                cl.set_lock(f.fid, LockRequest { owner: 1, pid: 1, lock: LockType::Unlock, start: 0, end: 99 }, false),
            )
            .await;
        // A layout that ends at 1 MiB gets a component up to EOF.
        let short = LayoutSpec {
            components: vec![ComponentSpec { extent_end: 1 << 20, stripe_count: Some(1), ..Default::default() }],
        };
        let (p, _, _) = calls.ok("create", cl.create(creds, dir.fid, "p1", 0o644, true, RW, Some(short))).await;
        let add = LayoutChange::AddComponents(LayoutSpec::raid0(Some(2), None));
        let grown = calls.ok("layout_change", cl.change_layout(creds, p.fid, add)).await;
        assert_eq!(grown.layout.expect("a file's layout").components.len(), 2);
        calls.ok("close", cl.close(p)).await;
        calls.ok("unlink", cl.unlink(creds, dir.fid, "p1")).await;
        calls.ok("close", cl.close_shared(&f)).await;
        let (g, _) = calls.ok("open", cl.open(creds, f.fid, RW)).await;
        calls.ok("close", cl.close(g)).await;
        // Its bytes moved to a layout of one stripe: the same FID and size.
        let moved = calls.ok("migrate", cl.migrate(creds, dir.fid, "f", LayoutSpec::raid0(Some(1), None))).await;
        let one = moved.layout.expect("a layout").components[0].osts.len();
        assert_eq!((moved.fid, moved.size, one), (f.fid, 50 << 10, 1));
        // And got a second copy (a mirror).
        let spec = client::mirror::MirrorSpec { layout: LayoutSpec::raid0(Some(1), None), prefer: false };
        let mirrored = calls.ok("mirror", cl.mirror_extend(creds, dir.fid, "f", &[spec])).await;
        assert_eq!(mirrored.layout.expect("a layout").mirror_count(), 2);
        // The MDT logged the opens (among them the mirror's own).
        let (_, next, opens) = calls.ok("open_log", cl.open_log(0, 0)).await;
        assert!(opens.iter().any(|o| o.fid == f.fid && o.client == cl.client_id()), "{opens:?}");
        assert!(next > opens.len() as u64, "numbered from 1: {next}");

        // Attributes and extended attributes.
        assert_eq!(calls.ok("getattr", cl.getattr(f.fid)).await.size, 50 << 10);
        calls.ok("setxattr", cl.setxattr(creds, f.fid, "user.k", b"v", XattrMode::Any)).await;
        assert_eq!(calls.ok("getxattr", cl.getxattr(creds, f.fid, "user.k")).await, b"v");
        assert!(calls.ok("listxattr", cl.listxattr(creds, f.fid)).await.contains(&"user.k".to_string()));
        calls.ok("removexattr", cl.removexattr(creds, f.fid, "user.k")).await;

        // Namespace.
        assert_eq!(calls.ok("lookup", cl.lookup(creds, dir.fid, "f")).await.fid, f.fid);
        assert_eq!(calls.ok("resolve", cl.resolve(creds, "/d/f", true)).await.fid, f.fid);
        assert_eq!(calls.ok("resolve_parent", cl.resolve_parent(creds, "/d/f")).await.0.fid, dir.fid);
        let s = calls.ok("symlink", cl.symlink(creds, dir.fid, "s", "f")).await;
        assert_eq!(calls.ok("readlink", cl.readlink(s.fid)).await, "f");
        calls.ok("mknod", cl.mknod(creds, dir.fid, "p", FileKind::Fifo, 0o644, 0)).await;
        calls.ok("link", cl.link(creds, f.fid, dir.fid, "f2")).await;
        calls.ok("rename", cl.rename(creds, dir.fid, "f2", dir.fid, "f3", RenameFlags::default())).await;
        let (batch, _) = calls.ok("readdir", cl.readdir(creds, dir.fid, None, 2)).await;
        assert_eq!(batch.len(), 2);
        let (plus, _) = calls.ok("readdirplus", cl.readdir_plus(creds, dir.fid, None, 3)).await;
        assert_eq!(plus.len(), 3);
        assert!(plus.iter().all(|(_, a)| a.is_some()), "attributes with every entry of one MDT's directory");
        let all = calls.ok("readdir_all", cl.readdir_all(creds, dir.fid)).await;
        let names: BTreeSet<String> = all.into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["f", "f3", "p", "s"].map(String::from).into());
        for name in names {
            calls.ok("unlink", cl.unlink(creds, dir.fid, &name)).await;
        }
        calls.ok("rmdir", cl.rmdir(creds, Fid::ROOT, "d")).await;

        // A failure reports too, with its errno.
        recorder.take();
        let missing = cl.lookup(creds, Fid::ROOT, "d").await.expect_err("d was removed");
        assert_eq!(missing.errno(), Errno::NoEnt);
        let records = recorder.take();
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!((records[0].op, records[0].result), ("lookup", Err(Errno::NoEnt)));
    });

    let ops: BTreeSet<&str> = client::OPS.iter().copied().collect();
    assert_eq!(ops.len(), client::OPS.len(), "each name once in OPS");
    assert_eq!(calls.seen, ops, "the calls reported every name in OPS, and none other");
}

#[test]
fn an_open_files_layout_is_replaced_by_a_newer_generation_only() {
    let c = cluster();
    let rt = testkit::runtime();
    let client = c.connect(&rt);
    let creds = client::process_creds();
    let data = Bytes::from((0..300u32 << 10).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    rt.block_on(async {
        let wide = Some(LayoutSpec::raid0(Some(2), Some(64 << 10)));
        let (f, _, _) = client.create(&creds, Fid::ROOT, "f", 0o644, true, RW, wide).await.expect("create");
        let first = f.layout();
        assert!(!f.replace_layout((*first).clone()), "the same generation is not newer");
        let mut next = (*first).clone();
        next.generation += 1;
        assert!(f.replace_layout(next.clone()), "a newer generation is taken");
        assert_eq!(*f.layout(), next);
        assert!(!f.replace_layout((*first).clone()), "an older generation is a stale answer");
        assert_eq!(f.layout().generation, first.generation + 1);
        // Requests after the swap go by the handle's layout now (same objects here).
        client.write(&f, 0, data.clone()).await.expect("write");
        assert!(client.read(&f, 0, data.len() as u64).await.expect("read") == data);
        client.close(f).await.expect("close");
    });
}
