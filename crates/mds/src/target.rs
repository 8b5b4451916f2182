//! One MDT as this MDS serves it: its group commit, its readers, who holds what open,
//! its POSIX locks and the revocation of its directory leases.
//!
//! Reads (lookup, getattr, readdir, xattr reads, open) run on a snapshot of the
//! database seen through the memtable, in parallel, inline on the request's task.
//! Mutations go through [`GroupCommit`]; see [`crate::commit`] and [`crate::journal`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use proto::msg::{Callback, LockRequest, LockType, Response};
use proto::{Errno, Fid};
use rpc::server::{CallbackError, Callbacks, CALLBACK_TIMEOUT, IN_PROCESS_CONN};
use store::memtable::MemTable;
use store::wal::Wal;
use store::{Store, StoreError};

use crate::cluster::ClusterView;
use crate::commit::{now_secs, Committer, GroupCommit, JobKind, Opens, Outcome};
use crate::lease::DirLeases;
use crate::mdt::{self, DestroyRecord, FidBlock, OpError, Tbl, View};
use crate::recovery::Recovery;
use crate::{journal, locks, MdsConfig, MdsError};

pub struct Mdt {
    pub index: u32,
    store: Arc<Store>,
    /// Changes since the last checkpoint, in front of the database (see [`mdt::View`]).
    mem: Arc<RwLock<MemTable>>,
    commit: GroupCommit,
    /// How many inodes the MDT holds (`df -i`).
    inodes: Arc<std::sync::atomic::AtomicU64>,
    pub(crate) opens: Opens,
    pub(crate) locks: Mutex<locks::LockTable>,
    pub(crate) lock_released: tokio::sync::Notify,
    /// Directory leases (see [`crate::lease`]); the committer consults them in every batch.
    leases: Arc<Mutex<DirLeases>>,
    /// Revocations under way, by directory: requests that find the same lease wait for
    /// its one revocation rather than each sending their own, and a holder that does
    /// not answer holds up only changes in its own directories. Bounded by the
    /// requests in flight.
    revoking: Mutex<HashMap<Fid, Arc<tokio::sync::Mutex<()>>>>,
    /// After a restart, what reads and changes of directory entries wait for (see
    /// [`crate::recovery`]).
    pub(crate) recovery: Option<Arc<Recovery>>,
    /// The latest opens, for a tiering service (see [`OpenLog`]).
    open_log: Mutex<OpenLog>,
}

impl OpenLog {
    fn push(&mut self, open: proto::msg::LoggedOpen) {
        self.last += 1;
        if self.entries.len() == OPEN_LOG_MAX {
            self.entries.pop_front();
        }
        self.entries.push_back(open);
    }

    /// The oldest number held, the number after the last one returned, and the
    /// opens numbered after `after` (at most a batch).
    fn after(&self, after: u64) -> (u64, u64, Vec<proto::msg::LoggedOpen>) {
        let first = self.last + 1 - self.entries.len() as u64;
        // A reader ahead of the log read it before this MDS restarted: all of it is new.
        let after = if after > self.last { 0 } else { after };
        let skip = after.saturating_sub(first - 1) as usize;
        let opens: Vec<proto::msg::LoggedOpen> =
            self.entries.iter().skip(skip).take(proto::msg::OPEN_LOG_BATCH).copied().collect();
        (first, first + (skip + opens.len()) as u64, opens)
    }
}

/// Most opens [`OpenLog`] keeps: a reader further behind loses the oldest.
const OPEN_LOG_MAX: usize = 65_536;

/// The latest opens of an MDT's files, numbered from 1 (Lustre's changelog `OPEN`
/// records, in memory and bounded): what `braid tier` reads to stage a purged file
/// back to the hot pool once it is read again (`Request::MdsOpenLog`).
#[derive(Default)]
struct OpenLog {
    /// The number of the latest open (the entries are the ones up to it, in order).
    last: u64,
    /// Oldest first.
    entries: std::collections::VecDeque<proto::msg::LoggedOpen>,
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

pub(crate) fn op_error(e: OpError) -> Response {
    e.into_response()
}

/// Bytes an inode takes on an MDT, with its entry, for the free inode estimate.
pub const INODE_BYTES: u64 = 1024;

impl Mdt {
    /// Opens the MDT in `dir`: formats a new one or checks an existing one, replays
    /// its journal, and upgrades a database of an earlier format.
    pub(crate) fn open(
        index: u32,
        dir: &Path,
        cfg: &MdsConfig,
        cluster: Arc<RwLock<ClusterView>>,
    ) -> Result<Arc<Mdt>, MdsError> {
        let failed = |what: &str, e: OpError| MdsError::Format {
            index,
            dir: dir.to_path_buf(),
            detail: if what.is_empty() { e.to_string() } else { format!("{what}: {e}") },
        };
        let store = Arc::new(Store::open(&dir.join("mdt.redb"))?);
        let formatted = mdt::schema::format(&store, index, &cfg.default_layout).map_err(|e| failed("", e))?;
        let mem = Arc::new(RwLock::new(mdt::new_memtable()));
        let (wal, records) =
            Wal::open(&dir.join("mdt.wal")).map_err(|e| failed("cannot open the journal", e.into()))?;
        let journal =
            journal::recover(&store, &mem, index, Box::new(wal), records, formatted.format, cfg.checkpoint_interval)
                .map_err(|e| failed("cannot recover from the journal", e))?;
        if formatted.format < mdt::schema::FORMAT {
            mdt::schema::upgrade(&store, index, formatted.format).map_err(|e| failed("cannot upgrade", e))?;
        }
        Mdt::serve(index, store, mem, journal, formatted.fresh, cfg, cluster).map_err(|e| failed("", e))
    }

    /// The MDT in `store` of a replica group's leader ([`crate::replica`]), whose
    /// entries go through `journal`; its database and memtable `mem` hold every
    /// entry committed before.
    pub(crate) fn open_replicated(
        index: u32,
        dir: &Path,
        store: Arc<Store>,
        mem: Arc<RwLock<MemTable>>,
        journal: Box<dyn journal::Journal>,
        cfg: &MdsConfig,
        cluster: Arc<RwLock<ClusterView>>,
    ) -> Result<Arc<Mdt>, MdsError> {
        let failed = |e: OpError| MdsError::Format { index, dir: dir.to_path_buf(), detail: e.to_string() };
        let formatted = mdt::schema::format(&store, index, &cfg.default_layout).map_err(failed)?;
        if formatted.format < mdt::schema::FORMAT {
            return Err(failed(OpError::Store(StoreError::Format(format!(
                "a replicated MDT in format {} cannot be upgraded in place; this braid writes format {}",
                formatted.format,
                mdt::schema::FORMAT
            )))));
        }
        let journal = journal::Journaled::new(journal, cfg.checkpoint_interval);
        Mdt::serve(index, store, mem, journal, false, cfg, cluster).map_err(failed)
    }

    /// The MDT as served from its database and memtable, once its journal is recovered.
    fn serve(
        index: u32,
        store: Arc<Store>,
        mem: Arc<RwLock<MemTable>>,
        journal: journal::Journaled,
        fresh: bool,
        cfg: &MdsConfig,
        cluster: Arc<RwLock<ClusterView>>,
    ) -> Result<Arc<Mdt>, OpError> {
        let opens: Opens = Default::default();
        let recovery = Recovery::starting(index, fresh).map(Arc::new);
        let leases = Arc::new(Mutex::new(DirLeases::starting(recovery.clone())));
        // Counted once here (after the replay); every logged batch moves it since.
        let counted = {
            let view = View::new(store.snapshot()?, mem.read().expect("memtable"));
            let rows = view.scan(Tbl::Inodes, std::ops::Bound::Unbounded)?;
            rows.count() as u64
        };
        let inodes = Arc::new(std::sync::atomic::AtomicU64::new(counted));
        let committer = Committer {
            index,
            store: store.clone(),
            mem: mem.clone(),
            leases: leases.clone(),
            opens: opens.clone(),
            journal,
            cursor: now_secs(),
            cfg: cfg.clone(),
            cluster,
            fids: FidBlock::default(),
            inodes: inodes.clone(),
            stats: crate::stats::MdtStats::of(index),
        };
        Ok(Arc::new(Mdt {
            index,
            store,
            mem,
            commit: GroupCommit::new(committer),
            inodes,
            opens,
            locks: Mutex::new(locks::LockTable::default()),
            lock_released: tokio::sync::Notify::new(),
            leases,
            revoking: Mutex::default(),
            recovery,
            open_log: Mutex::default(),
        }))
    }

    /// Queues a mutation and waits for its answer (see [`crate::commit`]).
    pub(crate) async fn submit(&self, kind: JobKind) -> Outcome {
        self.commit.submit(kind).await
    }

    /// Submits a job of the MDS's own (no directory entries change, so no lease stops it).
    pub(crate) async fn submit_own(&self, kind: JobKind) -> Response {
        self.commit.submit_own(kind).await
    }

    /// The MDT's usage for `df`: the space of its directory's file system, and its own
    /// inodes; free inodes are what the free space would hold at [`INODE_BYTES`] each
    /// (an MDT has no fixed inode table).
    pub(crate) fn usage(&self, dir: &Path) -> proto::msg::Usage {
        let mut u = rpc::target::dir_usage(dir);
        let used = self.inodes.load(std::sync::atomic::Ordering::Acquire);
        u.free_inodes = u.avail_bytes / INODE_BYTES;
        u.total_inodes = used + u.free_inodes;
        u
    }

    /// The directory leases. A batch that panicked while holding them was undone by
    /// its writer (grants included), so a poisoned table is still right.
    pub(crate) fn leases(&self) -> std::sync::MutexGuard<'_, DirLeases> {
        self.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Revokes the lease on `dir`, if there is one, once for all the requests that
    /// ask at the same time.
    pub(crate) async fn revoke(&self, dir: Fid, callbacks: &Callbacks) {
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
    pub(crate) fn view(&self) -> Result<View<std::sync::RwLockReadGuard<'_, MemTable>>, OpError> {
        let mem = self.mem.read().expect("memtable");
        Ok(View::new(self.store.snapshot()?, mem))
    }

    pub(crate) async fn read<F>(&self, f: F) -> Response
    where
        F: FnOnce(&View<std::sync::RwLockReadGuard<'_, MemTable>>) -> Result<Response, OpError> + Send + 'static,
    {
        // Inline on the runtime's thread: a read of a few cached B-tree pages takes
        // microseconds, less than handing it to a blocking thread and back (two
        // thread wake-ups, which dominate a lookup's latency).
        self.view().and_then(|v| f(&v)).unwrap_or_else(op_error)
    }

    /// As [`Mdt::read_answer`], with something more for the caller (`None` on error).
    pub(crate) async fn read_answer_with<F, T>(&self, f: F) -> (rpc::server::Answer, Option<T>)
    where
        F: FnOnce(&View<std::sync::RwLockReadGuard<'_, MemTable>>) -> Result<(rpc::server::Answer, Option<T>), OpError>
            + Send
            + 'static,
    {
        self.view().and_then(|v| f(&v)).unwrap_or_else(|e| ((op_error(e), vec![]), None))
    }

    /// As [`Mdt::read`], for an answer that carries a payload.
    pub(crate) async fn read_answer<F>(&self, f: F) -> rpc::server::Answer
    where
        F: FnOnce(&View<std::sync::RwLockReadGuard<'_, MemTable>>) -> Result<rpc::server::Answer, OpError>
            + Send
            + 'static,
    {
        self.view().and_then(|v| f(&v)).unwrap_or_else(|e| (op_error(e), vec![]))
    }

    pub(crate) fn pending_destroys(&self, max: usize) -> Result<Vec<(u64, DestroyRecord)>, OpError> {
        let view = self.view()?;
        let mut out = Vec::new();
        for row in view.scan(Tbl::Destroy, std::ops::Bound::Unbounded)?.take(max) {
            let (k, v) = row?;
            let seq = k.as_slice().try_into().map(u64::from_be_bytes).map_err(|_| {
                OpError::Store(StoreError::Corrupt { what: "destroy", detail: "key is not 8 bytes".into() })
            })?;
            out.push((seq, store::decode_record(&v)?));
        }
        Ok(out)
    }

    /// Counts a handle of `client` (for writing with `write`), and logs the open,
    /// unless `fid` moved to another MDT since the open read it, when `moves` were
    /// counted (false; see [`crate::commit::OpenTable`]). A create's open (`None`)
    /// counts in any case: its answer is kept for a resend, which must find it
    /// counted.
    pub(crate) fn opened(&self, fid: Fid, client: u64, write: bool, moves: Option<u64>) -> bool {
        {
            let mut opens = self.opens.lock().expect("opens");
            if moves.is_some_and(|m| !opens.may_open(fid, m)) {
                return false;
            }
            let holds = opens.entry(fid).or_default().entry(client).or_default();
            holds.handles += 1;
            holds.writer |= write;
        }
        let open = proto::msg::LoggedOpen { fid, at: proto::msg::Timespec::now(), client };
        self.open_log.lock().expect("open log").push(open);
        true
    }

    /// Counts `handles` handles of `client` on `fid` again after it reconnected
    /// ([`proto::msg::Request::MdsReclaimOpen`]): as many as it says, whatever was
    /// counted before (a replay after a lost connection the MDS already forgot, or
    /// one it did not).
    pub(crate) fn reclaim_open(&self, fid: Fid, client: u64, handles: u32, write: bool) {
        if handles == 0 {
            return;
        }
        let mut opens = self.opens.lock().expect("opens");
        let holds = opens.entry(fid).or_default().entry(client).or_default();
        holds.handles = handles;
        holds.writer |= write;
    }

    /// The logged opens numbered after `after` (see [`Request::MdsOpenLog`]).
    ///
    /// [`Request::MdsOpenLog`]: proto::msg::Request::MdsOpenLog
    pub(crate) fn open_log(&self, after: u64) -> Response {
        let (first, next, opens) = self.open_log.lock().expect("open log").after(after);
        Response::OpenLog { first, next, opens }
    }

    /// Whether any client holds `fid` open.
    pub(crate) fn is_open(&self, fid: Fid) -> bool {
        self.opens.lock().expect("opens").contains_key(&fid)
    }

    /// Drops one handle of `client`.
    pub(crate) fn closed(&self, fid: Fid, client: u64) {
        let mut opens = self.opens.lock().expect("opens");
        let Some(holders) = opens.get_mut(&fid) else { return };
        if let Some(h) = holders.get_mut(&client) {
            h.handles = h.handles.saturating_sub(1);
            if h.handles == 0 {
                holders.remove(&client);
            }
        }
        if holders.is_empty() {
            opens.remove(&fid);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn set_lock(&self, fid: Fid, client: u64, lock: LockRequest, wait: bool) -> Response {
        if lock.end < lock.start {
            return Response::error(Errno::Inval, "lock range ends before it starts");
        }
        let deadline = tokio::time::Instant::now() + LOCK_WAIT_SLICE;
        let mut waiting = WaitEntry { locks: &self.locks, client, owner: lock.owner, id: None };
        loop {
            let notified = self.lock_released.notified();
            {
                let mut t = self.locks.lock().expect("locks");
                match t.conflict(fid, client, &lock) {
                    None => {
                        if !t.set(fid, client, &lock) {
                            return Response::error(Errno::NoSpc, "too many locks held on this MDT");
                        }
                        drop(t);
                        if matches!(lock.lock, LockType::Unlock | LockType::Read) {
                            self.lock_released.notify_waiters();
                        }
                        return Response::Ok;
                    }
                    Some(c) if !wait || tokio::time::Instant::now() >= deadline => return Response::Lock(Some(c)),
                    Some(c) => {
                        // Asked again at every wake: the owner in the way may have begun
                        // to wait on this one since.
                        if t.would_deadlock(fid, client, &lock) {
                            return Response::error(
                                Errno::Deadlk,
                                format!(
                                    "waiting for {fid} [{}, {}] would deadlock: the owner of its lock at [{}, {}] \
                                     (pid {}) waits, directly or through others, on this owner",
                                    lock.start, lock.end, c.start, c.end, c.pid
                                ),
                            );
                        }
                        if waiting.id.is_none() {
                            waiting.id = Some(t.wait_begins(fid, client, &lock));
                        }
                    }
                }
            }
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }
}

/// A request's entry among the waiting ones, removed however the request ends (granted,
/// refused, or dropped with its connection).
struct WaitEntry<'a> {
    locks: &'a Mutex<locks::LockTable>,
    client: u64,
    owner: u64,
    id: Option<u64>,
}

impl Drop for WaitEntry<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.locks.lock().expect("locks").wait_ends(self.client, self.owner, id);
        }
    }
}

/// How long an `F_SETLKW` request waits on the MDS before the client asks again. Short,
/// because the request holds a request slot of the connection meanwhile, and a client
/// lets only so many wait at once (the client's `LOCK_WAITS_MAX`): the others take
/// turns as these slices end.
const LOCK_WAIT_SLICE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod open_log_tests {
    use super::*;

    fn open(i: u32) -> proto::msg::LoggedOpen {
        proto::msg::LoggedOpen { fid: Fid::new(0, 1, i), at: proto::msg::Timespec::default(), client: 7 }
    }

    #[test]
    fn the_open_log_is_read_in_batches_keeps_the_latest_and_starts_over_after_a_restart() {
        let mut log = OpenLog::default();
        assert_eq!(log.after(0), (1, 1, vec![]), "empty: the next open is number 1");
        for i in 1..=5 {
            log.push(open(i));
        }
        assert_eq!(log.after(0), (1, 6, (1..=5).map(open).collect()));
        assert_eq!(log.after(3), (1, 6, vec![open(4), open(5)]), "only those after 3");
        assert_eq!(log.after(5), (1, 6, vec![]));
        // A reader that read up to 9 before the MDS restarted takes the new log whole.
        assert_eq!(log.after(9).2.len(), 5);
        // Past the bound the oldest go; a reader behind them learns it from `first`.
        let total = OPEN_LOG_MAX as u32 + proto::msg::OPEN_LOG_BATCH as u32 + 5;
        for i in 6..=total {
            log.push(open(i));
        }
        let (first, next, opens) = log.after(0);
        assert_eq!(first, u64::from(total) - OPEN_LOG_MAX as u64 + 1);
        assert_eq!(opens.len(), proto::msg::OPEN_LOG_BATCH, "one batch at a time");
        assert_eq!((opens[0], next), (open(first as u32), first + proto::msg::OPEN_LOG_BATCH as u64));
        let (_, end, rest) = log.after(u64::from(total) - 2);
        assert_eq!((rest, end), (vec![open(total - 1), open(total)], u64::from(total) + 1));
    }
}
