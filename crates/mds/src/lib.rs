//! The MDS: serves one or more MDTs — the namespace, inodes, layouts and xattrs.
//!
//! Reads (lookup, getattr, readdir, xattr reads, open) run on redb read transactions
//! in parallel, inline on the request's task. Mutations are applied in batches, one
//! transaction each (group commit, see [`Mdt::submit`] and [`mdt`]), and each batch's
//! changes are appended to the MDT's redo log before the replies go out, so an
//! acknowledged operation survives a crash of the MDS process; a checkpoint every
//! second (and fsync, through `MdsSync`) puts them on disk (see [`store::wal`]).
//!
//! The MDS is never on the data path: it hands out layouts and the client talks to
//! the OSTs. It talks to OSTs itself only to destroy the objects of deleted files,
//! from a persistent queue drained in the background (fast unlink, no orphans).

pub mod inode;
pub mod lease;
pub mod locks;
pub mod mdt;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use layout::{LayoutSpec, OstState};
use proto::msg::Callback;
use proto::msg::{ClusterConfig, Request, Response};
use proto::rpc::{Identity, RpcClient, RpcOptions};
use proto::server::{Answer, CallbackError, Callbacks, RequestCtx, Service, CALLBACK_TIMEOUT, IN_PROCESS_CONN};
use proto::{Errno, Fid};
use store::wal::Wal;
use store::{decode, encode, Store, StoreError};
use tokio::sync::oneshot;

use lease::DirLeases;
use mdt::{Base, DestroyRecord, OpError, Placement, Redo, Tbl, View, Writer};
use proto::msg::LockType;
use store::memtable::MemTable;

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
    /// How often the database is made durable and the redo log emptied: the most a
    /// crash of the machine (not of the process) can take back without an fsync.
    pub checkpoint_interval: Duration,
    /// Force the redo log to disk before every reply (Lustre's `sync_journal`):
    /// every acknowledged operation survives a power loss, at one fsync per batch.
    pub sync_journal: bool,
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
            checkpoint_interval: Duration::from_secs(1),
            sync_journal: false,
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
        /// The connection it came on (directory leases are granted per connection).
        conn_id: u64,
        xid: u64,
        req: Request,
    },
    DestroyDone(Vec<u64>),
    PruneReplies {
        before_secs: u64,
    },
    /// Destroy these orphans if nobody holds them open any more (`None`: all).
    ReapOrphans(Option<Vec<Fid>>),
    /// Force the redo log to disk before answering.
    Sync,
    /// Nothing to apply; lets a due checkpoint run when no client writes.
    Checkpoint,
}

/// Who holds each FID open: FID → client id → handles.
type Opens = Arc<Mutex<HashMap<Fid, HashMap<u64, u32>>>>;

struct Job {
    kind: JobKind,
    reply: oneshot::Sender<Outcome>,
}

/// A request's part in the revocation of one directory's lease; the last one out,
/// finished or cancelled, removes the directory from [`Mdt::revoking`].
struct RevokeTurn<'a> {
    revoking: &'a Mutex<HashMap<Fid, Arc<tokio::sync::Mutex<()>>>>,
    dir: Fid,
    slot: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for RevokeTurn<'_> {
    fn drop(&mut self) {
        let mut m = self.revoking.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // The map's reference and ours: nobody else waits on this directory.
        if m.get(&self.dir).is_some_and(|s| Arc::ptr_eq(s, &self.slot)) && Arc::strong_count(&self.slot) == 2 {
            m.remove(&self.dir);
        }
    }
}

/// What a batch answers a job.
enum Outcome {
    Done(Response),
    /// The request changes the entries of a directory another client holds a lease
    /// on: nothing was applied, and the request comes back to be submitted again once
    /// the lease is revoked.
    Leased(Fid, Request),
}

/// What the MDS knows of the cluster, refreshed from the MGS.
#[derive(Default)]
struct ClusterView {
    osts: Vec<OstState>,
    config: Option<ClusterConfig>,
}

pub struct Mdt {
    pub index: u32,
    store: Arc<Store>,
    /// Changes since the last checkpoint, in front of the database (see [`mdt::View`]).
    mem: Arc<RwLock<MemTable>>,
    /// Mutations waiting for the next batch. Bounded by the requests in flight: each
    /// waits for its own answer (the server caps them per connection).
    queue: Mutex<Vec<Job>>,
    committer: Mutex<CommitterState>,
    opens: Opens,
    locks: Mutex<locks::LockTable>,
    lock_released: tokio::sync::Notify,
    /// Directory leases (see [`lease`]); the committer consults them in every batch.
    leases: Arc<Mutex<DirLeases>>,
    /// Revocations under way, by directory: requests that find the same lease wait for
    /// its one revocation rather than each sending their own, and a holder that does
    /// not answer holds up only changes in its own directories. Bounded by the
    /// requests in flight.
    revoking: Mutex<HashMap<Fid, Arc<tokio::sync::Mutex<()>>>>,
    /// After a restart, changes to directory entries wait until then: a client may
    /// still rely on a lease of the previous run until [`CALLBACK_TIMEOUT`] has passed.
    recovery_until: Option<tokio::time::Instant>,
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
        e @ OpError::Leased(_) => Response::error(Errno::Again, e.to_string()),
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
        let fresh = mdt::format(&store, index, &cfg.default_layout).map_err(|e| MdsError::Format {
            index,
            dir: dir.to_path_buf(),
            detail: e.to_string(),
        })?;
        let mem = Arc::new(RwLock::new(mdt::new_memtable()));
        let (wal, seq) = recover(&store, &mem, index, dir).map_err(|e| MdsError::Format {
            index,
            dir: dir.to_path_buf(),
            detail: format!("cannot recover from the redo log: {e}"),
        })?;
        let opens: Opens = Default::default();
        let leases: Arc<Mutex<DirLeases>> = Default::default();
        let committer = CommitterState {
            index,
            store: store.clone(),
            mem: mem.clone(),
            leases: leases.clone(),
            opens: opens.clone(),
            wal,
            seq,
            cursor: now_secs(),
            last_checkpoint: std::time::Instant::now(),
            unsynced: false,
            committed_len: 0,
            cfg: cfg.clone(),
            cluster,
            fids: mdt::FidBlock::default(),
        };
        Ok(Arc::new(Mdt {
            index,
            store,
            mem,
            queue: Mutex::new(Vec::new()),
            committer: Mutex::new(committer),
            opens,
            locks: Mutex::new(locks::LockTable::default()),
            lock_released: tokio::sync::Notify::new(),
            leases,
            revoking: Mutex::default(),
            recovery_until: (!fresh).then(|| tokio::time::Instant::now() + CALLBACK_TIMEOUT),
        }))
    }

    /// Queues a mutation and waits for its answer. Group commit without a thread of
    /// its own: whichever request finds the committer free applies everything queued
    /// (its own job and those that arrived meanwhile) in batches, on its own task; the
    /// others wait for the answer it sends them. A client working alone thus pays no
    /// hand-off between threads, and many clients share each commit.
    async fn submit(&self, kind: JobKind) -> Outcome {
        let (tx, rx) = oneshot::channel();
        self.queue.lock().expect("queue").push(Job { kind, reply: tx });
        loop {
            let mut committer = match self.committer.try_lock() {
                Ok(c) => c,
                // A panic in a batch aborted its transaction: take back its log record.
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    let mut c = p.into_inner();
                    let len = c.committed_len;
                    if let Err(e) = c.wal.truncate(len) {
                        tracing::error!(mdt = self.index, "cannot take back an aborted batch's log record: {e}");
                    }
                    c.fids = mdt::FidBlock::default();
                    self.committer.clear_poison();
                    c
                }
                Err(std::sync::TryLockError::WouldBlock) => break,
            };
            loop {
                let batch: Vec<Job> = {
                    let mut q = self.queue.lock().expect("queue");
                    let n = q.len().min(committer.cfg.batch_max);
                    q.drain(..n).collect()
                };
                if batch.is_empty() {
                    break;
                }
                committer.commit_batch(batch);
            }
            drop(committer);
            // A job queued while this task held the committer, whose sender then
            // found it busy, is this task's to apply.
            if self.queue.lock().expect("queue").is_empty() {
                break;
            }
        }
        rx.await.unwrap_or_else(|_| Outcome::Done(Response::error(Errno::Io, "MDT committer dropped the request")))
    }

    /// Submits a job of the MDS's own (no directory entries change, so no lease stops it).
    async fn submit_own(&self, kind: JobKind) -> Response {
        match self.submit(kind).await {
            Outcome::Done(r) => r,
            Outcome::Leased(dir, _) => Response::error(Errno::Io, format!("internal job stopped by a lease on {dir}")),
        }
    }

    /// The directory leases. A batch that panicked while holding them was undone by
    /// its writer (grants included), so a poisoned table is still right.
    fn leases(&self) -> std::sync::MutexGuard<'_, DirLeases> {
        self.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Revokes the lease on `dir`, if there is one, once for all the requests that
    /// ask at the same time.
    async fn revoke(&self, dir: Fid, callbacks: &Callbacks) {
        let slot =
            self.revoking.lock().unwrap_or_else(std::sync::PoisonError::into_inner).entry(dir).or_default().clone();
        let turn = RevokeTurn { revoking: &self.revoking, dir, slot };
        let _one = turn.slot.lock().await;
        self.revoke_now(dir, callbacks).await;
    }

    /// The holder acks the callback; or its connection is gone, or it does not answer
    /// and is evicted: then the lease ends [`CALLBACK_TIMEOUT`] after (the holder may
    /// rely on it until then). An in-process holder that is gone relies on nothing.
    async fn revoke_now(&self, dir: Fid, callbacks: &Callbacks) {
        let Some(lease) = self.leases().get(dir) else { return };
        let cb = Callback::RevokeLease { dir, lease: lease.id };
        match callbacks.call(lease.holder, lease.conn, &cb).await {
            Ok(()) => self.leases().remove(dir, lease.id),
            Err(CallbackError::NoConnection(_)) if lease.conn == IN_PROCESS_CONN => {
                self.leases().drop_connection(lease.holder, lease.conn)
            }
            Err(CallbackError::NoConnection(_)) => {
                let closed = self.leases().closed_at(lease.holder, lease.conn);
                let until = closed.unwrap_or_else(std::time::Instant::now) + CALLBACK_TIMEOUT;
                tokio::time::sleep_until(until.into()).await;
                self.leases().drop_connection(lease.holder, lease.conn);
            }
            Err(e) => {
                tracing::warn!(mdt = self.index, client = lease.holder, "evicting a directory lease holder: {e}");
                callbacks.evict(lease.holder, lease.conn);
                tokio::time::sleep(CALLBACK_TIMEOUT).await;
                self.leases().drop_connection(lease.holder, lease.conn);
            }
        }
    }

    /// A consistent view of the MDT for reading.
    fn view(&self) -> Result<View<std::sync::RwLockReadGuard<'_, MemTable>>, OpError> {
        let mem = self.mem.read().expect("memtable");
        Ok(View::new(Base::new(&self.store)?, mem))
    }

    async fn read<F>(&self, f: F) -> Response
    where
        F: FnOnce(&View<std::sync::RwLockReadGuard<'_, MemTable>>) -> Result<Response, OpError> + Send + 'static,
    {
        // Inline on the runtime's thread: a read of a few cached B-tree pages takes
        // microseconds, less than handing it to a blocking thread and back (two
        // thread wake-ups, which dominate a lookup's latency).
        self.view().and_then(|v| f(&v)).unwrap_or_else(op_error)
    }

    fn pending_destroys(&self, max: usize) -> Result<Vec<(u64, DestroyRecord)>, OpError> {
        let view = self.view()?;
        let mut out = Vec::new();
        for row in view.scan(Tbl::Destroy, std::ops::Bound::Unbounded)?.take(max) {
            let (k, v) = row?;
            let seq = k.as_slice().try_into().map(u64::from_be_bytes).map_err(|_| {
                OpError::Store(StoreError::Corrupt { what: "destroy", detail: "key is not 8 bytes".into() })
            })?;
            out.push((seq, decode(&v, "destroy")?));
        }
        Ok(out)
    }
}

/// The committer's state: the MDT's database, its redo log, and what the batches
/// need between them. One request task at a time holds it (see [`Mdt::submit`]).
struct CommitterState {
    index: u32,
    store: Arc<Store>,
    mem: Arc<RwLock<MemTable>>,
    leases: Arc<Mutex<DirLeases>>,
    opens: Opens,
    wal: Wal,
    /// The redo log's last sequence number.
    seq: u64,
    cursor: u64,
    last_checkpoint: std::time::Instant,
    /// Log records appended since the log was last forced to disk.
    unsynced: bool,
    /// Length of the log up to the last committed batch.
    committed_len: u64,
    cfg: MdsConfig,
    cluster: Arc<RwLock<ClusterView>>,
    /// FIDs reserved by a committed batch and not handed out yet.
    fids: mdt::FidBlock,
}

impl CommitterState {
    /// Applies one batch of mutations: one transaction and one redo-log record (see
    /// [`store::wal`]). redb commits without fsync, the record is appended before the
    /// replies go out, and a due checkpoint makes redb durable and empties the log.
    fn commit_batch(&mut self, batch: Vec<Job>) {
        let (index, cfg) = (self.index, &self.cfg);
        let opens = self.opens.clone();
        let is_open = move |fid: Fid| opens.lock().expect("opens").contains_key(&fid);
        let osts = self.cluster.read().expect("cluster view").osts.clone();
        let mut replies: Vec<Outcome> = Vec::with_capacity(batch.len());
        let (wal, seq, cursor) = (&mut self.wal, &mut self.seq, &mut self.cursor);
        let committed_len = &mut self.committed_len;
        let fids = &mut self.fids;
        let (store, mem, leases) = (&self.store, &self.mem, &self.leases);
        let outcome = (|| -> Result<bool, OpError> {
            let base = Base::new(store)?;
            // Readers wait while the batch applies, so they never see a change the log
            // does not hold yet. A batch that panicked was undone by its writer.
            let mut mem = mem.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut leases = leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut w = Writer::new(base, &mut mem, index).with_leases(&mut leases);
            w.fids = std::mem::take(fids);
            for job in &batch {
                let resp = match &job.kind {
                    JobKind::Client { client_id, conn_id, xid, req } => {
                        let key = reply_key(*client_id, *xid);
                        if let Some((_, resp)) =
                            w.view.with(Tbl::Replies, &key, |v| Ok(decode::<(u64, Response)>(v, "reply")?))?
                        {
                            replies.push(Outcome::Done(resp));
                            continue;
                        }
                        let mut place = Placement {
                            osts: &osts,
                            cursor: *cursor,
                            default_layout: &cfg.default_layout,
                            is_open: &is_open,
                        };
                        let start = w.savepoint();
                        (w.client, w.conn) = (*client_id, *conn_id);
                        let resp = match w.apply(req, &mut place) {
                            Ok(r) => r,
                            Err(OpError::Errno(c, m)) => Response::error(c, m),
                            Err(OpError::Leased(dir)) => {
                                w.rollback(start);
                                replies.push(Outcome::Leased(dir, req.clone()));
                                continue;
                            }
                            Err(e @ OpError::Store(_)) => return Err(e),
                        };
                        if matches!(req, Request::MdsCreate { .. }) {
                            *cursor = cursor.wrapping_add(1);
                        }
                        // `Again` means nothing was applied and the client will ask
                        // again with the same xid: it must not find this answer then.
                        let again = matches!(&resp, Response::Error(e) if e.code == Errno::Again);
                        if !again {
                            w.put(Tbl::Replies, &key, &encode(&(now_secs(), &resp)))?;
                        }
                        resp
                    }
                    JobKind::DestroyDone(keys) => {
                        for k in keys {
                            w.del(Tbl::Destroy, &k.to_be_bytes())?;
                        }
                        Response::Ok
                    }
                    JobKind::ReapOrphans(which) => {
                        let place = Placement {
                            osts: &osts,
                            cursor: *cursor,
                            default_layout: &cfg.default_layout,
                            is_open: &is_open,
                        };
                        let fids: Vec<Fid> = match which {
                            Some(list) => list.clone(),
                            None => w
                                .view
                                .scan(Tbl::Orphans, std::ops::Bound::Unbounded)?
                                .map(|r| r.map(|(k, _)| Fid::from_key(&k)))
                                .collect::<Result<Vec<_>, _>>()?
                                .into_iter()
                                .flatten()
                                .collect(),
                        };
                        for fid in fids {
                            w.reap_orphan(fid, &place)?;
                        }
                        Response::Ok
                    }
                    JobKind::PruneReplies { before_secs } => {
                        let mut old = Vec::new();
                        for row in w.view.scan(Tbl::Replies, std::ops::Bound::Unbounded)? {
                            let (k, v) = row?;
                            if decode::<(u64, Response)>(&v, "reply").map_or(true, |(t, _)| t < *before_secs) {
                                old.push(k);
                            }
                        }
                        for k in &old {
                            w.del(Tbl::Replies, k)?;
                        }
                        Response::Ok
                    }
                    JobKind::Sync | JobKind::Checkpoint => Response::Ok,
                };
                replies.push(Outcome::Done(resp));
            }
            *fids = std::mem::take(&mut w.fids);
            if w.redo.is_empty() {
                return Ok(false);
            }
            // The log first: a batch it does not hold is taken back (the writer undoes
            // its changes when dropped unfinished).
            wal.append(*seq + 1, &encode(&w.redo))?;
            w.finish();
            *seq += 1;
            *committed_len = wal.len();
            Ok(true)
        })();
        match outcome {
            Ok(wrote) => self.unsynced |= wrote,
            Err(e) => {
                // The block may come from a reservation this batch did not commit.
                self.fids = mdt::FidBlock::default();
                tracing::error!(mdt = index, "batch of {} mutations aborted: {e}", batch.len());
                for job in batch {
                    let _ =
                        job.reply.send(Outcome::Done(Response::error(Errno::Io, format!("MDT commit failed: {e}"))));
                }
                return;
            }
        }
        let sync_asked = cfg.sync_journal || batch.iter().any(|j| matches!(j.kind, JobKind::Sync));
        if sync_asked && self.unsynced {
            if let Err(e) = self.wal.sync() {
                tracing::error!(mdt = index, "cannot force the redo log to disk: {e}");
                for (job, resp) in batch.into_iter().zip(replies) {
                    let r = if matches!(job.kind, JobKind::Sync) {
                        Outcome::Done(Response::error(Errno::Io, e.to_string()))
                    } else {
                        resp
                    };
                    let _ = job.reply.send(r);
                }
                return;
            }
            self.unsynced = false;
        }
        for (job, resp) in batch.into_iter().zip(replies) {
            let _ = job.reply.send(resp);
        }
        let due = self.last_checkpoint.elapsed() >= cfg.checkpoint_interval || self.wal.len() >= WAL_CHECKPOINT_BYTES;
        if due && !self.wal.is_empty() {
            match checkpoint(&self.store, &self.mem, &mut self.wal, self.seq) {
                Ok(()) => {
                    self.unsynced = false;
                    self.committed_len = 0;
                }
                Err(e) => tracing::error!(mdt = index, "checkpoint failed, the redo log is kept: {e}"),
            }
            self.last_checkpoint = std::time::Instant::now();
        }
    }
}

/// The redo log is checkpointed at least this often by size.
const WAL_CHECKPOINT_BYTES: u64 = 64 << 20;

/// Writes the memtable into the database in one durable transaction, records that it
/// covers the redo log up to record `seq`, then empties the memtable and the log.
fn checkpoint(store: &Store, mem: &RwLock<MemTable>, wal: &mut Wal, seq: u64) -> Result<(), OpError> {
    let started = std::time::Instant::now();
    let mut txn = store.begin_write()?;
    txn.set_durability(redb::Durability::Immediate).map_err(|e| StoreError::engine("set durability", e))?;
    mdt::write_back(&txn, &mem.read().unwrap_or_else(std::sync::PoisonError::into_inner))?;
    txn.open_table(Tbl::Meta.def())?.insert(WAL_SEQ.as_bytes(), seq.to_le_bytes().as_slice())?;
    txn.commit()?;
    // The database now holds what the memtable did: readers see the same either way.
    let entries = {
        let mut m = mem.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = m.len();
        m.clear();
        n
    };
    wal.truncate(0)?;
    tracing::debug!(seq, entries, elapsed_us = started.elapsed().as_micros() as u64, "checkpoint");
    Ok(())
}

/// `meta` key: the last redo-log record the durable database holds.
const WAL_SEQ: &str = "wal_seq";

/// Opens the MDT's redo log and applies the records the durable database lacks (what
/// the process acknowledged before it died); returns the log and its last sequence.
fn recover(store: &Store, mem: &RwLock<MemTable>, index: u32, dir: &std::path::Path) -> Result<(Wal, u64), OpError> {
    let (mut wal, records) = Wal::open(&dir.join("mdt.wal"))?;
    let durable = View::new(Base::new(store)?, &mdt::new_memtable()).meta_u64(WAL_SEQ)?.unwrap_or(0);
    let mut seq = durable;
    let pending: Vec<_> = records.into_iter().filter(|(s, _)| *s > durable).collect();
    if !pending.is_empty() {
        let mut m = mem.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut w = Writer::new(Base::new(store)?, &mut m, index);
        for (s, payload) in &pending {
            let redo: Vec<Redo> = decode(payload, "redo log record")?;
            for op in &redo {
                w.replay(op);
            }
            seq = *s;
        }
        w.finish();
        tracing::info!(mdt = index, "replayed {} redo-log record(s) up to {seq}", pending.len());
    }
    checkpoint(store, mem, &mut wal, seq)?;
    Ok((wal, seq))
}

/// The metadata service of one process.
pub struct Mds {
    mdts: HashMap<u32, Arc<Mdt>>,
    dirs: HashMap<u32, PathBuf>,
    /// Clients' connections, for revoking directory leases.
    callbacks: Callbacks,
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
        let mds = Arc::new(Mds { mdts, dirs, callbacks: Callbacks::default() });
        tokio::spawn(refresh_cluster(mgs, cluster.clone(), cfg.config_refresh));
        for m in mds.mdts.values() {
            // Open counts do not survive a restart: orphans left by the previous run
            // are destroyed once clients had a grace period to come back.
            let (mdt, grace) = (m.clone(), cfg.orphan_grace);
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                mdt.submit_own(JobKind::ReapOrphans(None)).await;
            });
            tokio::spawn(drain_destroys(m.clone(), cluster.clone(), identity.clone(), cfg.destroy_interval));
            tokio::spawn(prune_replies(m.clone(), cfg.reply_keep));
            tokio::spawn(checkpoint_ticks(m.clone(), cfg.checkpoint_interval));
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
            mdt.submit_own(JobKind::DestroyDone(done)).await;
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
        let due = tokio::task::spawn_blocking(move || -> Result<Vec<Fid>, OpError> {
            let view = m.view()?;
            let opens = m.opens.lock().expect("opens");
            let mut due = Vec::new();
            for row in view.scan(Tbl::Orphans, std::ops::Bound::Unbounded)? {
                let (k, at) = row?;
                let at = at.as_slice().try_into().map(u64::from_le_bytes).unwrap_or(0);
                match Fid::from_key(&k) {
                    Some(fid) if at < before && !opens.contains_key(&fid) => due.push(fid),
                    _ => {}
                }
                if due.len() == 1024 {
                    break;
                }
            }
            Ok(due)
        })
        .await;
        if let Ok(Ok(fids)) = due {
            if !fids.is_empty() {
                mdt.submit_own(JobKind::ReapOrphans(Some(fids))).await;
            }
        }
    }
}

/// Wakes the committer now and then, so the last writes before a quiet spell are
/// checkpointed too.
async fn checkpoint_ticks(mdt: Arc<Mdt>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        mdt.submit_own(JobKind::Checkpoint).await;
        mdt.leases().sweep(std::time::Instant::now());
    }
}

async fn prune_replies(mdt: Arc<Mdt>, keep: Duration) {
    loop {
        tokio::time::sleep(Duration::from_secs(60)).await;
        let before_secs = now_secs().saturating_sub(keep.as_secs());
        mdt.submit_own(JobKind::PruneReplies { before_secs }).await;
    }
}

impl Service for Mds {
    async fn handle(&self, ctx: RequestCtx, req: Request, _payload: Bytes) -> Answer {
        (self.dispatch(ctx, req).await, vec![])
    }

    fn callbacks(&self) -> Option<&Callbacks> {
        Some(&self.callbacks)
    }

    fn connection_closed(&self, client_id: u64, conn_id: u64) {
        let now = std::time::Instant::now();
        for m in self.mdts.values() {
            m.leases().connection_closed(client_id, conn_id, now);
        }
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
            Request::MdsCloseMany { fids } => {
                let Some(first) = fids.first() else { return Response::Ok };
                let mdt = match self.mdt(*first) {
                    Ok(m) => m,
                    Err(r) => return *r,
                };
                if fids.iter().any(|f| f.mdt() != mdt.index) {
                    return Response::error(Errno::Inval, "a close batch names FIDs of several MDTs");
                }
                for fid in fids {
                    mdt.closed(*fid, ctx.client_id);
                }
                return Response::Ok;
            }
            Request::MdsLeaseCancel { leases } => {
                let Some((first, _)) = leases.first() else { return Response::Ok };
                let mdt = match self.mdt(*first) {
                    Ok(m) => m,
                    Err(r) => return *r,
                };
                if leases.iter().any(|(d, _)| d.mdt() != mdt.index) {
                    return Response::error(Errno::Inval, "a lease cancel names directories of several MDTs");
                }
                let mut table = mdt.leases();
                for (dir, id) in leases {
                    table.cancel(*dir, *id, ctx.client_id, ctx.conn_id);
                }
                return Response::Ok;
            }
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
            | Request::MdsMknod { parent, .. }
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
            | Request::MdsGetLock { fid, .. }
            | Request::MdsSync { fid } => *fid,
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
            Request::MdsClose { fid, size, mtime, trunc_epoch } => {
                mdt.closed(fid, ctx.client_id);
                if size.is_some() {
                    let req = Request::MdsClose { fid, size, mtime, trunc_epoch };
                    let job = JobKind::Client { client_id: ctx.client_id, conn_id: ctx.conn_id, xid: ctx.xid, req };
                    return mdt.submit_own(job).await;
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
            Request::MdsSync { .. } => mdt.submit_own(JobKind::Sync).await,
            mutation => {
                let create = matches!(mutation, Request::MdsCreate { .. });
                if let Some(until) = mdt.recovery_until.filter(|_| changes_entries(&mutation)) {
                    tokio::time::sleep_until(until).await;
                }
                let mut req = mutation;
                let mut revoked = 0;
                let r = loop {
                    let job = JobKind::Client { client_id: ctx.client_id, conn_id: ctx.conn_id, xid: ctx.xid, req };
                    match mdt.submit(job).await {
                        Outcome::Done(r) => break r,
                        Outcome::Leased(dir, back) if revoked < REVOKES_MAX => {
                            mdt.revoke(dir, &self.callbacks).await;
                            revoked += 1;
                            req = back;
                        }
                        Outcome::Leased(dir, _) => {
                            break Response::error(Errno::Again, format!("directory {dir} is leased by another client"))
                        }
                    }
                };
                if let (true, Response::Created { attr, .. }) = (create, &r) {
                    mdt.opened(attr.fid, ctx.client_id);
                }
                r
            }
        }
    }
}

/// Most leases one request revokes before it gives up (a rename touches two
/// directories; a lease once revoked is never granted again).
const REVOKES_MAX: usize = 8;

/// Whether `req` may change a directory's entries (what a directory lease covers).
fn changes_entries(req: &Request) -> bool {
    matches!(
        req,
        Request::MdsCreate { .. }
            | Request::MdsMkdir { .. }
            | Request::MdsSymlink { .. }
            | Request::MdsMknod { .. }
            | Request::MdsLink { .. }
            | Request::MdsUnlink { .. }
            | Request::MdsRmdir { .. }
            | Request::MdsRename { .. }
    )
}

/// Serves on `listener`.
pub async fn serve(mds: Arc<Mds>, listener: tokio::net::TcpListener, server: proto::server::ServerConfig) {
    proto::server::serve(listener, Arc::new(server), mds).await
}
