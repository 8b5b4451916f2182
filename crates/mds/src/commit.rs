//! Group commit: mutations queue, and whichever request finds the committer free
//! applies everything queued in batches of one journal record each.
//!
//! No thread of its own: the request that takes the committer applies its own job
//! and those that arrived meanwhile, on its own task; the others wait for the answer
//! it sends them. A client working alone thus pays no hand-off between threads, and
//! many clients share each record. The queue is bounded by the requests in flight
//! (each waits for its own answer; the server caps them per connection), a batch by
//! [`crate::MdsConfig::batch_max`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use proto::msg::{Attr, Creds, FileKind, Request, Response, Timespec, UpdateId};
use proto::{Errno, Fid};
use store::memtable::MemTable;
use store::Store;
use tokio::sync::oneshot;

use crate::cluster::ClusterView;
use crate::journal::Journaled;
use crate::lease::DirLeases;
use crate::mdt::schema::RedoBatch;
use crate::mdt::{FidBlock, OpError, OpResult, Participant, Placement, Reply, Tbl, Writer};
use crate::MdsConfig;

/// What a job asks of a batch.
pub enum JobKind {
    Client {
        client_id: u64,
        /// The connection it came on (directory leases are granted per connection).
        conn_id: u64,
        xid: u64,
        req: Request,
    },
    /// The coordinator's half of a client's operation that spans MDTs (see
    /// [`crate::mdt::update`]), answered and kept for reply reconstruction like a
    /// client request.
    /// `conn_id`: the connection it came on (the client's own lease on the parent,
    /// granted on it, is no obstacle). Applied, it records the decision of operation
    /// `id` for its `participants` (the inodes they keep their halves under).
    Coordinated {
        client_id: u64,
        conn_id: u64,
        xid: u64,
        op: Box<CoordinatedOp>,
        id: UpdateId,
        participants: Vec<Participant>,
    },
    /// Every participant of operation `id` knows the verdict: its decision goes.
    Forget(UpdateId),
    /// Every shard of striped directory `fid` took its attributes as of change `seq`:
    /// the note goes, unless a later change came meanwhile.
    ShardSynced { fid: Fid, seq: u64 },
    /// The verdict on this MDT's half of an operation spanning MDTs (see
    /// [`crate::mdt::update`]), learned from the coordinator.
    Settle { fid: Fid, id: UpdateId, committed: bool },
    /// These destroy-queue entries were destroyed on their OSTs.
    DestroyDone(Vec<u64>),
    /// A client that held these files open for writing is gone without closing them:
    /// the bytes it wrote were never reported, so their data versions move (readers'
    /// caches of them go at their next open).
    WriterGone(Vec<Fid>),
    /// Drop answers kept for reply reconstruction before this time (seconds).
    PruneReplies { before_secs: u64 },
    /// Destroy these orphans if nobody holds them open any more (`None`: all).
    ReapOrphans(Option<Vec<Fid>>),
    /// Force the journal to stable storage before answering.
    Sync,
    /// Nothing to apply; lets a due checkpoint run when no client writes.
    Checkpoint,
}

/// The coordinator's halves of operations that span MDTs.
pub enum CoordinatedOp {
    /// The entry of an inode on another MDT: a directory made there, or a file
    /// linked there.
    Link { creds: Creds, parent: Fid, name: String, child: Attr },
    /// The entry of an inode on another MDT, which that MDT is unlinking.
    Unlink { creds: Creds, parent: Fid, name: String, child: Attr },
    /// A rename to `new_name` in `new_parent` (here) of `child`, `name` in `parent`,
    /// coordinated across MDTs (see [`crate::dne`]), replacing the inode `replaced`
    /// (what the participants were prepared for: anything else stops it).
    Rename {
        creds: Creds,
        parent: Fid,
        name: String,
        new_parent: Fid,
        new_name: String,
        child: Attr,
        replaced: Option<Fid>,
        noreplace: bool,
    },
    /// `renameat2(RENAME_EXCHANGE)` of `a_name` in `a_dir` (naming `a`) and `b_name`
    /// in `b_dir` (here, naming `b`), coordinated across MDTs.
    Exchange { creds: Creds, a: (Fid, String, Attr), b: (Fid, String, Attr) },
    /// Directory `fid`, empty, becomes shard 0 of a striped directory (`--root-stripes`).
    Stripe { fid: Fid, stripes: proto::msg::DirStripes },
    /// `braid migrate -m`: entry `name` in `parent` names `moved`, the copy of
    /// directory `old` the participant made, if `old` is still as `copy` says; `old`
    /// goes.
    Migrate { parent: Fid, name: String, old: Fid, copy: Box<proto::msg::InodeCopy>, moved: Attr },
    /// `braid migrate -m` of a remote directory: entry `name` in `parent` names
    /// `moved` instead of `old` (both on other MDTs, which hold their halves).
    MigrateRemote { parent: Fid, name: String, old: Fid, moved: Attr },
}

/// What a batch answers a job.
pub enum Outcome {
    Done(Response),
    /// The request changes the entries of a directory another client holds a lease
    /// on: nothing was applied, and the request comes back to be submitted again once
    /// the lease is revoked.
    Leased(Fid, Request),
    /// The request's entry names an inode on another MDT (see
    /// [`OpError::Elsewhere`]): nothing was applied or kept for a retry.
    Elsewhere(Fid, FileKind),
}

struct Job {
    kind: JobKind,
    reply: oneshot::Sender<Outcome>,
}

/// The files open on an MDT (see [`OpenTable`]).
pub type Opens = Arc<Mutex<OpenTable>>;

/// Most files [`OpenTable`] remembers as moved away lately: an open that read its
/// inode before more moves than this is asked to try again.
const LEFT_KEPT: usize = 4096;

/// Who holds each FID open (FID → client id → handles; the table derefs to that
/// map), and the files that move to another MDT (`braid migrate -m`), so none is
/// opened here as it goes: a batch that moves a file marks it leaving if no client
/// holds it open ([`OpenTable::leave`]), and an open reads its inode, then counts
/// its handle only if that file did not leave meanwhile ([`OpenTable::may_open`]).
#[derive(Debug, Default)]
pub struct OpenTable {
    files: HashMap<Fid, HashMap<u64, Holds>>,
    /// Marked by the batch being applied.
    leaving: Vec<Fid>,
    /// Batches applied that moved files away.
    moves: u64,
    /// The latest files that left, with the count of moves once they had.
    left: std::collections::VecDeque<(u64, Fid)>,
}

impl OpenTable {
    /// Marks `fid` leaving, unless a client holds it open (false).
    pub fn leave(&mut self, fid: Fid) -> bool {
        if self.files.contains_key(&fid) {
            return false;
        }
        self.leaving.push(fid);
        true
    }

    /// The batch that marked files leaving is applied (its changes are what a read
    /// sees from now on, moved or not).
    pub fn applied(&mut self) {
        if self.leaving.is_empty() {
            return;
        }
        self.moves += 1;
        for fid in std::mem::take(&mut self.leaving) {
            if self.left.len() == LEFT_KEPT {
                self.left.pop_front();
            }
            self.left.push_back((self.moves, fid));
        }
    }

    /// What an open notes before it reads the inode, for [`OpenTable::may_open`].
    pub fn moves(&self) -> u64 {
        self.moves
    }

    /// Whether an open of `fid` whose read came after `moves` may count its handle:
    /// not if the file is leaving, or left since (or it cannot be told).
    pub fn may_open(&self, fid: Fid, moves: u64) -> bool {
        if self.leaving.contains(&fid) {
            return false;
        }
        if self.moves == moves {
            return true;
        }
        let covered = self.left.front().is_some_and(|&(first, _)| first <= moves + 1);
        covered && !self.left.iter().any(|&(at, f)| at > moves && f == fid)
    }
}

impl std::ops::Deref for OpenTable {
    type Target = HashMap<Fid, HashMap<u64, Holds>>;
    fn deref(&self) -> &Self::Target {
        &self.files
    }
}

impl std::ops::DerefMut for OpenTable {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.files
    }
}

/// One client's handles of one open file.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Holds {
    pub handles: u32,
    /// One of them was opened for writing (until the client's last handle closes): a
    /// client that dies now may have written bytes it never reported.
    pub writer: bool,
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs()
}

fn reply_key(client_id: u64, xid: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&client_id.to_be_bytes());
    k[8..].copy_from_slice(&xid.to_be_bytes());
    k
}

/// The queue and the committer of one MDT.
pub struct GroupCommit {
    index: u32,
    queue: Mutex<Vec<Job>>,
    /// The queue's length, for the metrics endpoint (set under the queue's lock).
    depth: metrics::Series<metrics::Gauge>,
    committer: Mutex<Committer>,
}

impl GroupCommit {
    pub fn new(committer: Committer) -> GroupCommit {
        GroupCommit {
            index: committer.index,
            queue: Mutex::new(Vec::new()),
            depth: crate::stats::queue_depth(committer.index),
            committer: Mutex::new(committer),
        }
    }

    /// Queues a mutation and waits for its answer (see the module note).
    pub async fn submit(&self, kind: JobKind) -> Outcome {
        let (tx, rx) = oneshot::channel();
        {
            let mut q = self.queue.lock().expect("queue");
            q.push(Job { kind, reply: tx });
            self.depth.set(q.len() as i64);
        }
        loop {
            let mut committer = match self.committer.try_lock() {
                Ok(c) => c,
                // A panic in a batch aborted its transaction: take back its record.
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    let mut c = p.into_inner();
                    if let Err(e) = c.journal.take_back_unfinished() {
                        tracing::error!(mdt = self.index, "cannot take back an aborted batch's journal record: {e}");
                    }
                    c.fids = FidBlock::default();
                    self.committer.clear_poison();
                    c
                }
                Err(std::sync::TryLockError::WouldBlock) => break,
            };
            loop {
                let batch: Vec<Job> = {
                    let mut q = self.queue.lock().expect("queue");
                    let n = q.len().min(committer.cfg.batch_max);
                    let batch = q.drain(..n).collect();
                    self.depth.set(q.len() as i64);
                    batch
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
    pub async fn submit_own(&self, kind: JobKind) -> Response {
        match self.submit(kind).await {
            Outcome::Done(r) => r,
            Outcome::Leased(dir, _) => Response::error(Errno::Io, format!("internal job stopped by a lease on {dir}")),
            Outcome::Elsewhere(fid, _) => Response::error(Errno::XDev, format!("the entry names {fid} on another MDT")),
        }
    }
}

/// The committer's state: the MDT's database, its journal, and what the batches need
/// between them. One request task at a time holds it.
pub struct Committer {
    pub index: u32,
    pub store: Arc<Store>,
    pub mem: Arc<RwLock<MemTable>>,
    pub leases: Arc<Mutex<DirLeases>>,
    pub opens: Opens,
    pub journal: Journaled,
    /// Where round-robin OST placement starts for the next create.
    pub cursor: u64,
    pub cfg: MdsConfig,
    pub cluster: Arc<RwLock<ClusterView>>,
    /// FIDs reserved by a committed batch and not handed out yet.
    pub fids: FidBlock,
    /// The MDT's inodes (counted at open, moved by every logged batch): `df -i`.
    pub inodes: Arc<std::sync::atomic::AtomicU64>,
    /// Its batches, redo log and checkpoints, for the metrics endpoint.
    pub stats: crate::stats::MdtStats,
}

impl Committer {
    /// Applies one batch of mutations: one memtable change and one journal record,
    /// appended before the replies go out; a due checkpoint follows.
    fn commit_batch(&mut self, batch: Vec<Job>) {
        let index = self.index;
        let applied = self.apply_batch(&batch);
        self.opens.lock().expect("opens").applied();
        let replies = match applied {
            Ok(r) => r,
            Err(e) => {
                // The block may come from a reservation this batch did not commit.
                self.fids = FidBlock::default();
                tracing::error!(mdt = index, "batch of {} mutations aborted: {e}", batch.len());
                for job in batch {
                    let _ =
                        job.reply.send(Outcome::Done(Response::error(Errno::Io, format!("MDT commit failed: {e}"))));
                }
                return;
            }
        };
        self.stats.logged(batch.len(), self.journal.bytes());
        let sync_asked = self.cfg.sync_journal || batch.iter().any(|j| matches!(j.kind, JobKind::Sync));
        let synced = if sync_asked { self.journal.sync() } else { Ok(()) };
        if let Err(e) = &synced {
            tracing::error!(mdt = index, "cannot force the journal to stable storage: {e}");
        }
        let answers: Vec<_> = batch
            .into_iter()
            .zip(replies)
            .map(|(job, resp)| match (&synced, &job.kind) {
                (Err(e), JobKind::Sync) => (job.reply, Outcome::Done(Response::error(Errno::Io, e.to_string()))),
                _ => (job.reply, resp),
            })
            .collect();
        let send = |answers: Vec<(oneshot::Sender<Outcome>, Outcome)>| {
            for (to, answer) in answers {
                let _ = to.send(answer);
            }
        };
        // Replicated, a batch is answered once the group holds every record up to
        // it (an answer from the reply cache may rest on an earlier batch). A leader
        // that lost its group never answers: it restarts, and its clients ask the
        // next leader.
        match self.journal.until_committed() {
            Some(committed) => {
                tokio::spawn(async move {
                    committed.await;
                    send(answers);
                });
            }
            None => send(answers),
        }
        if let Some(took) = self.journal.checkpoint_if_due(&self.store, &self.mem, index) {
            self.stats.checkpointed(took, self.journal.bytes());
        }
    }

    /// Applies every job of `batch` in one writer and journals the changes; the
    /// writer undoes them all if anything fails before the record is appended.
    fn apply_batch(&mut self, batch: &[Job]) -> OpResult<Vec<Outcome>> {
        let opens = self.opens.clone();
        let is_open = move |fid: Fid, client: Option<u64>| {
            let opens = opens.lock().expect("opens");
            let holders = opens.get(&fid);
            match client {
                None => holders.is_some(),
                Some(c) => holders.is_some_and(|h| h.contains_key(&c)),
            }
        };
        let opens = self.opens.clone();
        let open_elsewhere = move |fid: Fid, me: u64| {
            let opens = opens.lock().expect("opens");
            opens.get(&fid).is_some_and(|h| h.keys().any(|c| *c != me))
        };
        let opens = self.opens.clone();
        let leave = move |fid: Fid| opens.lock().expect("opens").leave(fid);
        let osts = self.cluster.read().expect("cluster view").osts.clone();
        let mut place = Placement {
            osts: &osts,
            cursor: self.cursor,
            default_layout: &self.cfg.default_layout,
            dom_max: self.cfg.dom_max,
            is_open: &is_open,
            open_elsewhere: &open_elsewhere,
            leave: &leave,
        };
        // Readers wait while the batch applies, so they never see a change the
        // journal does not hold yet. A batch that panicked was undone by its writer.
        let mut mem = self.mem.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut leases = self.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut w = Writer::new(self.store.snapshot()?, &mut mem, self.index).with_leases(&mut leases);
        w.fids = std::mem::take(&mut self.fids);
        let mut replies = Vec::with_capacity(batch.len());
        for job in batch {
            replies.push(match &job.kind {
                JobKind::Client { client_id, conn_id, xid, req } => {
                    client_job(&mut w, &mut place, (*client_id, *conn_id, *xid), req)?
                }
                JobKind::Coordinated { client_id, conn_id, xid, op, id, participants } => {
                    coordinated_job(&mut w, &place, (*client_id, *conn_id, *xid), op, *id, participants)?
                }
                JobKind::ShardSynced { fid, seq } => {
                    if w.view.shard_sync_seq(*fid)? == Some(*seq) {
                        w.del(Tbl::ShardSync, &fid.to_key())?;
                    }
                    Outcome::Done(Response::Ok)
                }
                JobKind::Forget(id) => {
                    w.forget_decision(*id)?;
                    Outcome::Done(Response::Ok)
                }
                JobKind::Settle { fid, id, committed } => match w.update_done(*fid, *id, *committed, &place) {
                    Ok(r) => Outcome::Done(r),
                    Err(OpError::Errno(c, m)) => Outcome::Done(Response::error(c, m)),
                    // Not expected: a removal's directory lost its lease at prepare.
                    Err(e @ (OpError::Leased(_) | OpError::WrongShard(_))) => Outcome::Done(e.into_response()),
                    Err(e) => return Err(e),
                },
                JobKind::WriterGone(fids) => {
                    for fid in fids {
                        w.data_moved(*fid)?;
                    }
                    Outcome::Done(Response::Ok)
                }
                JobKind::DestroyDone(keys) => {
                    for k in keys {
                        w.del(Tbl::Destroy, &k.to_be_bytes())?;
                    }
                    Outcome::Done(Response::Ok)
                }
                JobKind::ReapOrphans(which) => {
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
                    Outcome::Done(Response::Ok)
                }
                JobKind::PruneReplies { before_secs } => {
                    let mut old = Vec::new();
                    for row in w.view.scan(Tbl::Replies, std::ops::Bound::Unbounded)? {
                        let (k, v) = row?;
                        if store::decode_record::<Reply>(&v).map_or(true, |r| r.at < *before_secs) {
                            old.push(k);
                        }
                    }
                    for k in &old {
                        w.del(Tbl::Replies, k)?;
                    }
                    // Directories moved to another MDT longer ago than that are no
                    // longer sent on.
                    let moved_before = now_secs().saturating_sub(crate::mdt::schema::MOVED_KEEP_SECS);
                    let mut gone = Vec::new();
                    for row in w.view.scan(Tbl::Moved, std::ops::Bound::Unbounded)? {
                        let (k, v) = row?;
                        if crate::mdt::schema::decode_moved(&v).is_none_or(|(_, at)| at < moved_before) {
                            gone.push(k);
                        }
                    }
                    for k in &gone {
                        w.del(Tbl::Moved, k)?;
                    }
                    Outcome::Done(Response::Ok)
                }
                JobKind::Sync | JobKind::Checkpoint => Outcome::Done(Response::Ok),
            });
        }
        self.cursor = place.cursor;
        self.fids = std::mem::take(&mut w.fids);
        if !w.redo.is_empty() {
            // The journal first: a batch it does not hold is taken back (the writer
            // undoes its changes when dropped unfinished).
            self.journal.log(&RedoBatch(std::mem::take(&mut w.redo)))?;
            let delta = w.inodes_delta;
            w.finish();
            self.inodes.fetch_add(delta as u64, std::sync::atomic::Ordering::AcqRel);
        }
        Ok(replies)
    }
}

/// Applies the coordinator's half of an operation spanning MDTs with its decision,
/// or answers it from the reply cache (the client's retry of an operation that
/// committed).
fn coordinated_job(
    w: &mut Writer<'_>,
    place: &Placement<'_>,
    ids: (u64, u64, u64),
    op: &CoordinatedOp,
    id: UpdateId,
    participants: &[Participant],
) -> OpResult<Outcome> {
    let now = Timespec::now();
    as_client(
        w,
        ids,
        |w| {
            w.coordinating = Some(id);
            let r = match op {
                CoordinatedOp::Stripe { fid, stripes } => w.stripe_empty_dir(*fid, stripes)?,
                CoordinatedOp::Migrate { parent, name, old, copy, moved } => {
                    w.migrate_entry((*parent, name), *old, copy, moved, place)?
                }
                CoordinatedOp::MigrateRemote { parent, name, old, moved } => {
                    w.migrate_remote_entry((*parent, name), *old, moved)?
                }
                CoordinatedOp::Exchange { creds, a: (a_dir, a_name, a), b: (b_dir, b_name, b) } => {
                    w.exchange_coordinated(creds, (*a_dir, a_name, a), (*b_dir, b_name, b), place, now)?
                }
                CoordinatedOp::Rename { creds, parent, name, new_parent, new_name, child, replaced, noreplace } => {
                    let names = ((*parent, name.as_str()), (*new_parent, new_name.as_str()));
                    w.rename_coordinated(creds, names, (child, *replaced), *noreplace, place, now)?
                }
                CoordinatedOp::Link { creds, parent, name, child } => {
                    w.link_remote_entry(creds, *parent, name, child, now)?
                }
                CoordinatedOp::Unlink { creds, parent, name, child } => {
                    w.unlink_remote_entry(creds, *parent, name, child, now)?
                }
            };
            w.decide(id, participants.to_vec())?;
            Ok(r)
        },
        // The coordinator revoked other clients' leases on the directory first, and a
        // revoked lease is never granted again: this is not expected.
        |dir| Outcome::Done(Response::error(Errno::Again, format!("directory {dir} is leased"))),
    )
}

/// The answer kept for a client's request, if it was applied.
pub fn kept_reply<M: std::ops::Deref<Target = MemTable>>(
    view: &crate::mdt::View<M>,
    client_id: u64,
    xid: u64,
) -> OpResult<Option<Response>> {
    Ok(view
        .with(Tbl::Replies, &reply_key(client_id, xid), |v| Ok(store::decode_record::<Reply>(v)?))?
        .map(|r| r.response))
}

/// Applies one client request in the batch, or answers it from the reply cache.
fn client_job(w: &mut Writer<'_>, place: &mut Placement<'_>, ids: (u64, u64, u64), req: &Request) -> OpResult<Outcome> {
    as_client(
        w,
        ids,
        |w| {
            let r = w.apply(req, place);
            let placed = matches!(req, Request::MdsCreate { .. } | Request::MdsLayoutChange { .. });
            if placed && !matches!(r, Err(OpError::Leased(_) | OpError::Store(_) | OpError::Elsewhere(..))) {
                place.cursor = place.cursor.wrapping_add(1);
            }
            r
        },
        |dir| Outcome::Leased(dir, req.clone()),
    )
}

/// Applies `apply` in the batch as the client `(client id, connection, xid)`, or
/// answers from the reply cache; keeps the answer there for a retry. A lease met takes
/// the operation back, and `leased` says what to answer.
fn as_client<'w>(
    w: &mut Writer<'w>,
    (client_id, conn_id, xid): (u64, u64, u64),
    apply: impl FnOnce(&mut Writer<'w>) -> OpResult<Response>,
    leased: impl FnOnce(Fid) -> Outcome,
) -> OpResult<Outcome> {
    let key = reply_key(client_id, xid);
    if let Some(reply) = w.view.with(Tbl::Replies, &key, |v| Ok(store::decode_record::<Reply>(v)?))? {
        return Ok(Outcome::Done(reply.response));
    }
    let start = w.savepoint();
    (w.client, w.conn) = (client_id, conn_id);
    w.coordinating = None;
    let response = match apply(w) {
        Ok(r) => r,
        // A refused operation leaves nothing behind, also what it wrote before it
        // met the reason (an update half that checks as it goes).
        Err(e @ (OpError::Errno(..) | OpError::WrongShard(_) | OpError::Moved(..))) => {
            if w.wrote_since(start) {
                w.rollback(start);
            }
            e.into_response()
        }
        Err(OpError::Leased(dir)) => {
            w.rollback(start);
            return Ok(leased(dir));
        }
        Err(OpError::Elsewhere(fid, kind)) => {
            w.rollback(start);
            return Ok(Outcome::Elsewhere(fid, kind));
        }
        Err(e @ OpError::Store(_)) => return Err(e),
    };
    // `Again` means nothing was applied and the client will ask again with the same
    // xid: it must not find this answer then (nor a redirection to another shard).
    let again = matches!(&response, Response::Error(e) if e.code == Errno::Again)
        || matches!(response, Response::Striped(_) | Response::Moved { .. });
    let reply = Reply { at: now_secs(), response };
    if !again {
        w.put(Tbl::Replies, &key, &store::encode_record(&reply))?;
    }
    Ok(Outcome::Done(reply.response))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_leaving_takes_no_open_that_read_it_before() {
        let (a, b) = (Fid::new(0, 1, 10), Fid::new(0, 1, 11));
        let mut t = OpenTable::default();
        t.entry(b).or_default().entry(7).or_default().handles = 1;
        assert!(!t.leave(b), "an open file does not leave");
        let before = t.moves();
        assert!(t.leave(a));
        // Marked: an open that read it, whenever, counts no handle.
        assert!(!t.may_open(a, before) && t.may_open(b, before));
        t.applied();
        // Applied: an open that read it before is asked again; one after may open.
        assert!(!t.may_open(a, before) && t.may_open(b, before));
        assert!(t.may_open(a, t.moves()));
        // A batch that moved nothing counts no move.
        t.applied();
        assert_eq!(t.moves(), before + 1);
        // Moves past what is kept: an open that read before them cannot be told.
        for oid in 0..LEFT_KEPT as u32 + 1 {
            assert!(t.leave(Fid::new(0, 2, oid)));
            t.applied();
        }
        assert!(!t.may_open(b, before), "too many moves since: asked again");
        assert!(t.may_open(b, t.moves() - 1) && !t.may_open(Fid::new(0, 2, LEFT_KEPT as u32), t.moves() - 1));
    }
}
