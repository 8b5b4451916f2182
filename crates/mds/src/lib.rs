//! The MDS: serves one or more MDTs — the namespace, inodes, layouts and xattrs.
//!
//! Reads (lookup, getattr, readdir, xattr reads, open) run on redb read transactions
//! in parallel. Mutations go to one committer thread per MDT through a bounded queue
//! and are applied in batches with one durable commit each (see [`mdt`]); replies are
//! sent after the commit, so an acknowledged operation survives a crash of the MDS.
//!
//! The MDS is never on the data path: it hands out layouts and the client talks to
//! the OSTs. It talks to OSTs itself only to destroy the objects of deleted files,
//! from a persistent queue drained in the background (fast unlink, no orphans).

pub mod inode;
pub mod locks;
pub mod mdt;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use layout::{LayoutSpec, OstState};
use proto::msg::{ClusterConfig, Request, Response};
use proto::rpc::{Identity, RpcClient, RpcOptions};
use proto::server::{Answer, RequestCtx, Service};
use proto::{Errno, Fid};
use redb::ReadableTable;
use store::{decode, encode, Store, StoreError};
use tokio::sync::{mpsc, oneshot};

use mdt::{DestroyRecord, OpError, Placement, View, Writer, DENTRIES, DESTROY, INODES, REPLIES, XATTRS};
use proto::msg::LockType;

#[derive(Debug, Clone)]
pub struct MdsConfig {
    /// The file system's default layout (the root directory's default at format).
    pub default_layout: LayoutSpec,
    /// How often the OST list is fetched from the MGS.
    pub config_refresh: Duration,
    /// Most mutations applied in one transaction.
    pub batch_max: usize,
    /// How long a reply stays in the reply cache (well above any client's recovery
    /// timeout, so a retry always finds it).
    pub reply_keep: Duration,
    /// How often the destroy queue is drained.
    pub destroy_interval: Duration,
    /// After a restart, orphans (unlinked files open at the time) are destroyed after
    /// this long.
    pub orphan_grace: Duration,
}

impl Default for MdsConfig {
    fn default() -> Self {
        MdsConfig {
            default_layout: LayoutSpec::raid0(Some(1), Some(1 << 20)),
            config_refresh: Duration::from_secs(1),
            batch_max: 256,
            reply_keep: Duration::from_secs(600),
            destroy_interval: Duration::from_millis(500),
            orphan_grace: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MdsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("MDT {index} in {dir}: {detail}")]
    Format { index: u32, dir: PathBuf, detail: String },
}

enum JobKind {
    Client {
        client_id: u64,
        xid: u64,
        req: Request,
    },
    DestroyDone(Vec<u64>),
    PruneReplies {
        before_secs: u64,
    },
    /// Destroy these orphans if nobody holds them open any more (`None`: all).
    ReapOrphans(Option<Vec<Fid>>),
}

/// Who holds each FID open: FID → client id → handles.
type Opens = Arc<Mutex<HashMap<Fid, HashMap<u64, u32>>>>;

struct Job {
    kind: JobKind,
    reply: oneshot::Sender<Response>,
}

/// Bound of each MDT's mutation queue; senders wait when it is full.
const JOB_QUEUE: usize = 4096;

/// What the MDS knows of the cluster, refreshed from the MGS.
#[derive(Default)]
struct ClusterView {
    osts: Vec<OstState>,
    config: Option<ClusterConfig>,
}

pub struct Mdt {
    pub index: u32,
    store: Arc<Store>,
    jobs: mpsc::Sender<Job>,
    opens: Opens,
    locks: Mutex<locks::LockTable>,
    lock_released: tokio::sync::Notify,
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

fn reply_key(client_id: u64, xid: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&client_id.to_be_bytes());
    k[8..].copy_from_slice(&xid.to_be_bytes());
    k
}

fn op_error(e: OpError) -> Response {
    match e {
        OpError::Errno(code, msg) => Response::error(code, msg),
        OpError::Store(e) => Response::error(Errno::Io, format!("MDT storage error: {e}")),
    }
}

impl Mdt {
    fn open(
        index: u32,
        dir: &std::path::Path,
        cfg: &MdsConfig,
        cluster: Arc<RwLock<ClusterView>>,
    ) -> Result<Arc<Mdt>, MdsError> {
        let store = Arc::new(Store::open(&dir.join("mdt.redb"))?);
        mdt::format(&store, index, &cfg.default_layout).map_err(|e| MdsError::Format {
            index,
            dir: dir.to_path_buf(),
            detail: match e {
                OpError::Errno(_, m) => m,
                OpError::Store(e) => e.to_string(),
            },
        })?;
        let (tx, rx) = mpsc::channel(JOB_QUEUE);
        let opens: Opens = Default::default();
        let (st, c, o) = (store.clone(), cfg.clone(), opens.clone());
        std::thread::Builder::new()
            .name(format!("mdt{index}-commit"))
            .spawn(move || committer(index, st, rx, c, cluster, o))
            .map_err(|e| MdsError::Format {
                index,
                dir: dir.to_path_buf(),
                detail: format!("cannot start committer: {e}"),
            })?;
        Ok(Arc::new(Mdt {
            index,
            store,
            jobs: tx,
            opens,
            locks: Mutex::new(locks::LockTable::default()),
            lock_released: tokio::sync::Notify::new(),
        }))
    }

    async fn submit(&self, kind: JobKind) -> Response {
        let (tx, rx) = oneshot::channel();
        if self.jobs.send(Job { kind, reply: tx }).await.is_err() {
            return Response::error(Errno::Io, "MDT committer stopped");
        }
        rx.await.unwrap_or_else(|_| Response::error(Errno::Io, "MDT committer dropped the request"))
    }

    async fn read<F>(&self, f: F) -> Response
    where
        F: FnOnce(&View<ReadTable, ReadTable, ReadTable>) -> Result<Response, OpError> + Send + 'static,
    {
        let store = self.store.clone();
        let r = tokio::task::spawn_blocking(move || -> Result<Response, OpError> {
            let txn = store.begin_read()?;
            let view = View {
                inodes: txn.open_table(INODES)?,
                dentries: txn.open_table(DENTRIES)?,
                xattrs: txn.open_table(XATTRS)?,
            };
            f(&view)
        })
        .await;
        match r {
            Ok(Ok(resp)) => resp,
            Ok(Err(e)) => op_error(e),
            Err(e) => Response::error(Errno::Io, format!("MDT reader failed: {e}")),
        }
    }

    fn pending_destroys(&self, max: usize) -> Result<Vec<(u64, DestroyRecord)>, StoreError> {
        let txn = self.store.begin_read()?;
        let t = txn.open_table(DESTROY).map_err(|e| StoreError::engine("open destroy", e))?;
        let mut out = Vec::new();
        for row in t.iter().map_err(|e| StoreError::engine("scan destroy", e))?.take(max) {
            let (k, v) = row.map_err(|e| StoreError::engine("scan destroy", e))?;
            out.push((k.value(), decode(v.value(), "destroy")?));
        }
        Ok(out)
    }
}

type ReadTable = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;

/// The committer: applies batches of mutations, one durable commit per batch.
fn committer(
    index: u32,
    store: Arc<Store>,
    mut rx: mpsc::Receiver<Job>,
    cfg: MdsConfig,
    cluster: Arc<RwLock<ClusterView>>,
    opens: Opens,
) {
    let mut cursor: u64 = now_secs();
    let is_open = move |fid: Fid| opens.lock().expect("opens").contains_key(&fid);
    while let Some(first) = rx.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < cfg.batch_max {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        let osts = cluster.read().expect("cluster view").osts.clone();
        let mut replies: Vec<Response> = Vec::with_capacity(batch.len());
        let outcome = (|| -> Result<(), OpError> {
            let txn = store.begin_write()?;
            {
                let mut w = Writer::open(&txn, index)?;
                let mut cache = txn.open_table(REPLIES)?;
                for job in &batch {
                    let resp = match &job.kind {
                        JobKind::Client { client_id, xid, req } => {
                            let key = reply_key(*client_id, *xid);
                            if let Some(v) = cache.get(key.as_slice())? {
                                let (_, resp): (u64, Response) = decode(v.value(), "reply")?;
                                replies.push(resp);
                                continue;
                            }
                            let mut place = Placement {
                                osts: &osts,
                                cursor,
                                default_layout: &cfg.default_layout,
                                is_open: &is_open,
                            };
                            let resp = match w.apply(req.clone(), &mut place) {
                                Ok(r) => r,
                                Err(OpError::Errno(c, m)) => Response::error(c, m),
                                Err(e @ OpError::Store(_)) => return Err(e),
                            };
                            if matches!(req, Request::MdsCreate { .. }) {
                                cursor = cursor.wrapping_add(1);
                            }
                            // `Again` means nothing was applied and the client will ask
                            // again with the same xid: it must not find this answer then.
                            let again = matches!(&resp, Response::Error(e) if e.code == Errno::Again);
                            if !again {
                                cache.insert(key.as_slice(), encode(&(now_secs(), &resp)).as_slice())?;
                            }
                            resp
                        }
                        JobKind::DestroyDone(keys) => {
                            for k in keys {
                                w.destroy.remove(*k)?;
                            }
                            Response::Ok
                        }
                        JobKind::ReapOrphans(which) => {
                            let place = Placement {
                                osts: &osts,
                                cursor,
                                default_layout: &cfg.default_layout,
                                is_open: &is_open,
                            };
                            let fids: Vec<Fid> = match which {
                                Some(list) => list.clone(),
                                None => w
                                    .orphans
                                    .iter()?
                                    .filter_map(|r| r.ok().and_then(|(k, _)| Fid::from_key(k.value())))
                                    .collect(),
                            };
                            for fid in fids {
                                w.reap_orphan(fid, &place)?;
                            }
                            Response::Ok
                        }
                        JobKind::PruneReplies { before_secs } => {
                            let old: Vec<Vec<u8>> = cache
                                .iter()?
                                .filter_map(|r| r.ok())
                                .filter(|(_, v)| {
                                    decode::<(u64, Response)>(v.value(), "reply")
                                        .map_or(true, |(t, _)| t < *before_secs)
                                })
                                .map(|(k, _)| k.value().to_vec())
                                .collect();
                            for k in &old {
                                cache.remove(k.as_slice())?;
                            }
                            Response::Ok
                        }
                    };
                    replies.push(resp);
                }
            }
            txn.commit()?;
            Ok(())
        })();
        if let Err(e) = outcome {
            let msg = match e {
                OpError::Store(e) => e.to_string(),
                OpError::Errno(_, m) => m,
            };
            tracing::error!(mdt = index, "batch of {} mutations aborted: {msg}", batch.len());
            for job in batch {
                let _ = job.reply.send(Response::error(Errno::Io, format!("MDT commit failed: {msg}")));
            }
            continue;
        }
        for (job, resp) in batch.into_iter().zip(replies) {
            let _ = job.reply.send(resp);
        }
    }
}

/// The metadata service of one process.
pub struct Mds {
    mdts: HashMap<u32, Arc<Mdt>>,
    dirs: HashMap<u32, PathBuf>,
}

impl Mds {
    /// Opens every registered MDT and starts the background work (OST list refresh,
    /// destroy queue, reply cache pruning). Must run inside a tokio runtime.
    pub fn start(
        targets: &[(u32, PathBuf)],
        cfg: MdsConfig,
        identity: Arc<Identity>,
        mgs: Arc<RpcClient>,
    ) -> Result<Arc<Mds>, MdsError> {
        let cluster = Arc::new(RwLock::new(ClusterView::default()));
        let mut mdts = HashMap::new();
        let mut dirs = HashMap::new();
        for (index, dir) in targets {
            mdts.insert(*index, Mdt::open(*index, dir, &cfg, cluster.clone())?);
            dirs.insert(*index, dir.clone());
        }
        let mds = Arc::new(Mds { mdts, dirs });
        tokio::spawn(refresh_cluster(mgs, cluster.clone(), cfg.config_refresh));
        for m in mds.mdts.values() {
            // Open counts do not survive a restart: orphans left by the previous run
            // are destroyed once clients had a grace period to come back.
            let (mdt, grace) = (m.clone(), cfg.orphan_grace);
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                mdt.submit(JobKind::ReapOrphans(None)).await;
            });
            tokio::spawn(drain_destroys(m.clone(), cluster.clone(), identity.clone(), cfg.destroy_interval));
            tokio::spawn(prune_replies(m.clone(), cfg.reply_keep));
            tokio::spawn(reap_replaced(m.clone()));
        }
        Ok(mds)
    }

    fn mdt(&self, fid: Fid) -> Result<&Arc<Mdt>, Box<Response>> {
        self.mdts
            .get(&fid.mdt())
            .ok_or_else(|| Box::new(Response::error(Errno::Stale, format!("MDT {} is not served here", fid.mdt()))))
    }
}

async fn refresh_cluster(mgs: Arc<RpcClient>, cluster: Arc<RwLock<ClusterView>>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match mgs.call(&Request::MgsGetConfig, vec![]).await {
            Ok(r) => {
                if let Response::Config(c) = r.response {
                    let osts = c
                        .osts
                        .iter()
                        .map(|t| OstState {
                            index: t.index,
                            up: t.up,
                            free_bytes: t.usage.avail_bytes,
                            total_bytes: t.usage.total_bytes,
                        })
                        .collect();
                    let mut v = cluster.write().expect("cluster view");
                    v.osts = osts;
                    v.config = Some(c);
                }
            }
            Err(e) => tracing::warn!("cannot fetch configuration from the MGS: {e}"),
        }
    }
}

async fn drain_destroys(mdt: Arc<Mdt>, cluster: Arc<RwLock<ClusterView>>, identity: Arc<Identity>, every: Duration) {
    let opts = RpcOptions {
        recovery_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let mut clients: HashMap<String, Arc<RpcClient>> = HashMap::new();
    loop {
        tokio::time::sleep(every).await;
        let m = mdt.clone();
        let pending = match tokio::task::spawn_blocking(move || m.pending_destroys(256)).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                tracing::error!(mdt = mdt.index, "cannot read destroy queue: {e}");
                continue;
            }
            Err(_) => continue,
        };
        if pending.is_empty() {
            continue;
        }
        let config = cluster.read().expect("cluster view").config.clone();
        let Some(config) = config else { continue };
        let mut done = Vec::new();
        for (key, rec) in pending {
            let mut all = true;
            for (ost, object) in &rec.objects {
                let Some(t) = config.target(proto::msg::TargetKind::Ost, *ost) else {
                    // The OST was removed from the configuration: nothing to destroy.
                    continue;
                };
                if !t.up {
                    all = false;
                    break;
                }
                let c = clients
                    .entry(t.address.clone())
                    .or_insert_with(|| Arc::new(RpcClient::new(t.address.clone(), identity.clone(), opts.clone())))
                    .clone();
                if let Err(e) = c.call(&Request::OstDestroy { ost: *ost, object: *object }, vec![]).await {
                    tracing::debug!("destroy of {} on OST {ost} failed: {e}", object.file_name());
                    all = false;
                    break;
                }
            }
            if all {
                done.push(key);
            }
        }
        if !done.is_empty() {
            mdt.submit(JobKind::DestroyDone(done)).await;
        }
    }
}

/// How long an orphan (a file replaced by a rename, or unlinked while open) outlives
/// its last name and its last handle before the reaper destroys it.
const REPLACED_GRACE_SECS: u64 = 2;

async fn reap_replaced(mdt: Arc<Mdt>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let m = mdt.clone();
        let before = now_secs().saturating_sub(REPLACED_GRACE_SECS);
        let due = tokio::task::spawn_blocking(move || -> Result<Vec<Fid>, StoreError> {
            let txn = m.store.begin_read()?;
            let t = txn.open_table(mdt::ORPHANS).map_err(|e| StoreError::engine("open orphans", e))?;
            let opens = m.opens.lock().expect("opens");
            Ok(t.iter()
                .map_err(|e| StoreError::engine("scan orphans", e))?
                .filter_map(|r| r.ok())
                .filter(|(_, at)| at.value() < before)
                .filter_map(|(k, _)| Fid::from_key(k.value()))
                .filter(|fid| !opens.contains_key(fid))
                .take(1024)
                .collect())
        })
        .await;
        if let Ok(Ok(fids)) = due {
            if !fids.is_empty() {
                mdt.submit(JobKind::ReapOrphans(Some(fids))).await;
            }
        }
    }
}

async fn prune_replies(mdt: Arc<Mdt>, keep: Duration) {
    loop {
        tokio::time::sleep(Duration::from_secs(60)).await;
        let before_secs = now_secs().saturating_sub(keep.as_secs());
        mdt.submit(JobKind::PruneReplies { before_secs }).await;
    }
}

impl Service for Mds {
    async fn handle(&self, ctx: RequestCtx, req: Request, _payload: Bytes) -> Answer {
        (self.dispatch(ctx, req).await, vec![])
    }

    fn client_gone(&self, client_id: u64) {
        for m in self.mdts.values() {
            let dropped = m.locks.lock().expect("locks").release_client(client_id);
            if dropped > 0 {
                tracing::info!(mdt = m.index, client = client_id, "released {dropped} lock(s) of a departed client");
                m.lock_released.notify_waiters();
            }
            // Its opens end here; orphans among them are destroyed by the reaper.
            m.opens.lock().expect("opens").retain(|_, holders| {
                holders.remove(&client_id);
                !holders.is_empty()
            });
        }
    }
}

/// How long an `F_SETLKW` request waits on the MDS before the client asks again.
const LOCK_WAIT_SLICE: Duration = Duration::from_secs(10);

impl Mdt {
    fn opened(&self, fid: Fid, client: u64) {
        *self.opens.lock().expect("opens").entry(fid).or_default().entry(client).or_default() += 1;
    }

    /// Drops one handle of `client`.
    fn closed(&self, fid: Fid, client: u64) {
        let mut opens = self.opens.lock().expect("opens");
        let Some(holders) = opens.get_mut(&fid) else { return };
        if let Some(n) = holders.get_mut(&client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                holders.remove(&client);
            }
        }
        if holders.is_empty() {
            opens.remove(&fid);
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn set_lock(
        &self,
        fid: Fid,
        client: u64,
        owner: u64,
        pid: u32,
        lock: LockType,
        start: u64,
        end: u64,
        wait: bool,
    ) -> Response {
        if end < start {
            return Response::error(Errno::Inval, "lock range ends before it starts");
        }
        let deadline = tokio::time::Instant::now() + LOCK_WAIT_SLICE;
        loop {
            let notified = self.lock_released.notified();
            {
                let mut t = self.locks.lock().expect("locks");
                match t.conflict(fid, client, owner, lock, start, end) {
                    None => {
                        if !t.set(fid, client, owner, pid, lock, start, end) {
                            return Response::error(Errno::NoSpc, "too many locks held on this MDT");
                        }
                        drop(t);
                        if matches!(lock, LockType::Unlock | LockType::Read) {
                            self.lock_released.notify_waiters();
                        }
                        return Response::Ok;
                    }
                    Some(c) if !wait || tokio::time::Instant::now() >= deadline => return Response::Lock(Some(c)),
                    Some(_) => {}
                }
            }
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }
}

impl Mds {
    async fn dispatch(&self, ctx: RequestCtx, req: Request) -> Response {
        let target = match &req {
            Request::Ping => return Response::Ok,
            Request::MdsStatfs { mdt } => {
                return match self.dirs.get(mdt) {
                    Some(d) => Response::Usage(proto::target::dir_usage(d)),
                    None => Response::error(Errno::NoEnt, format!("MDT {mdt} is not served here")),
                }
            }
            Request::MdsLookup { parent, .. }
            | Request::MdsCreate { parent, .. }
            | Request::MdsMkdir { parent, .. }
            | Request::MdsSymlink { parent, .. }
            | Request::MdsUnlink { parent, .. }
            | Request::MdsRmdir { parent, .. }
            | Request::MdsRename { parent, .. } => *parent,
            Request::MdsLink { fid, parent, .. } => {
                if fid.mdt() != parent.mdt() {
                    return Response::error(Errno::XDev, "hard link across MDTs is not supported yet");
                }
                *fid
            }
            Request::MdsGetattr { fid }
            | Request::MdsOpen { fid, .. }
            | Request::MdsReaddir { fid, .. }
            | Request::MdsSetattr { fid, .. }
            | Request::MdsReadlink { fid }
            | Request::MdsSetxattr { fid, .. }
            | Request::MdsGetxattr { fid, .. }
            | Request::MdsListxattr { fid, .. }
            | Request::MdsRemovexattr { fid, .. }
            | Request::MdsSetDirLayout { fid, .. }
            | Request::MdsGetDirLayout { fid }
            | Request::MdsSizeUpdate { fid, .. }
            | Request::MdsClose { fid, .. }
            | Request::MdsSetLock { fid, .. }
            | Request::MdsGetLock { fid, .. } => *fid,
            other => return Response::error(Errno::Proto, format!("an MDS does not serve {}", other.op_name())),
        };
        let mdt = match self.mdt(target) {
            Ok(m) => m,
            Err(r) => return *r,
        };
        match req {
            Request::MdsLookup { creds, parent, name } => {
                mdt.read(move |v| Ok(Response::Attr(v.lookup(&creds, parent, &name)?))).await
            }
            Request::MdsGetattr { fid } => mdt.read(move |v| Ok(Response::Attr(v.must_inode(fid)?.attr(fid)))).await,
            Request::MdsOpen { creds, fid, flags } => {
                let r = mdt.read(move |v| Ok(Response::Attr(v.open(&creds, fid, flags)?))).await;
                if matches!(r, Response::Attr(_)) {
                    mdt.opened(fid, ctx.client_id);
                }
                r
            }
            Request::MdsClose { fid, size, mtime } => {
                mdt.closed(fid, ctx.client_id);
                if size.is_some() {
                    let req = Request::MdsClose { fid, size, mtime };
                    return mdt.submit(JobKind::Client { client_id: ctx.client_id, xid: ctx.xid, req }).await;
                }
                // An orphan whose last handle this was is destroyed by the reaper once
                // the grace has passed, not here: a rename's victim must outlive it even
                // when a late close (FUSE sends RELEASE asynchronously) comes right after.
                Response::Ok
            }
            Request::MdsSetLock { fid, owner, pid, lock, start, end, wait } => {
                mdt.set_lock(fid, ctx.client_id, owner, pid, lock, start, end, wait).await
            }
            Request::MdsGetLock { fid, owner, lock, start, end } => {
                Response::Lock(mdt.locks.lock().expect("locks").conflict(fid, ctx.client_id, owner, lock, start, end))
            }
            Request::MdsReaddir { creds, fid, after, max } => {
                mdt.read(move |v| {
                    let (entries, eof) = v.readdir(&creds, fid, after.as_deref(), max)?;
                    Ok(Response::Dirents { entries, eof })
                })
                .await
            }
            Request::MdsReadlink { fid } => {
                mdt.read(move |v| match v.must_inode(fid)?.symlink {
                    Some(t) => Ok(Response::Link(t)),
                    None => Ok(Response::error(Errno::Inval, "not a symlink")),
                })
                .await
            }
            Request::MdsGetxattr { creds, fid, name } => {
                mdt.read(move |v| Ok(Response::Xattr(v.getxattr(&creds, fid, &name)?))).await
            }
            Request::MdsListxattr { creds, fid } => {
                mdt.read(move |v| Ok(Response::XattrNames(v.listxattr(&creds, fid)?))).await
            }
            Request::MdsGetDirLayout { fid } => {
                mdt.read(move |v| Ok(Response::DirLayout(v.must_inode(fid)?.dir_default))).await
            }
            mutation => {
                let create = matches!(mutation, Request::MdsCreate { .. });
                let r = mdt.submit(JobKind::Client { client_id: ctx.client_id, xid: ctx.xid, req: mutation }).await;
                if let (true, Response::Created { attr, .. }) = (create, &r) {
                    mdt.opened(attr.fid, ctx.client_id);
                }
                r
            }
        }
    }
}

/// Serves on `listener`.
pub async fn serve(mds: Arc<Mds>, listener: tokio::net::TcpListener, server: proto::server::ServerConfig) {
    proto::server::serve(listener, Arc::new(server), mds).await
}
