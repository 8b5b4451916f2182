//! Operations that span MDTs (Lustre's DNE), the coordinator's side: a remote mkdir
//! (`braid mkdir -i K`), a hard link to a file on another MDT, and the removal of an
//! entry naming an inode on another MDT (rmdir of a remote directory, unlink of
//! such a link). The MDT holding the entry's directory coordinates; the MDT holding
//! the inode participates.
//!
//! The steps of each operation (the participant's are in [`crate::mdt::update`]):
//! 1. check what can be checked here (permission, the name) and revoke other
//!    clients' leases on the parent, so the entry's batch cannot meet one;
//! 2. mark the operation under way (in memory: a restart ends it), and ask the
//!    participant to apply its half ([`Request::MdsUpdate`]); it records the half as
//!    pending, durably, before answering;
//! 3. apply the entry, with the client's reply and the decision that the operation
//!    committed, in one batch of this MDT;
//! 4. end the mark, tell the participant the verdict ([`Request::MdsUpdateDone`]),
//!    which keeps or takes back its half, and forget the decision once it answered.
//!
//! A crash anywhere leaves at most a pending half on the participant, which asks
//! ([`Request::MdsUpdateQuery`], by [`UpdateResolve`]) once the operation is no
//! longer under way: a decision means committed, none means aborted (presumed
//! abort); and decisions whose participants did not answer are told again. The
//! client's retry after a crash is answered from the reply cache if step 3
//! happened, and runs the operation again otherwise. Each step has a fault point
//! ([`fault_point`]) a test can kill the process at.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use layout::DirHash;
use proto::msg::{
    Attr, ClusterConfig, Creds, DirSpec, FileKind, InodeCopy, Request, Response, TargetKind, UpdateId, UpdateOp,
    UpdateState, DIR_STRIPES_ALL, MDT_BALANCED,
};
use proto::{Errno, Fid, RpcError};
use rpc::server::{Callbacks, RequestCtx};
use rpc::{Identity, RpcClient, RpcOptions};

use crate::cluster::ClusterView;
use crate::commit::{kept_reply, now_secs, CoordinatedOp, JobKind};
use crate::inode::S_ISGID;
use crate::mdt::{OpError, Participant};
use crate::target::Mdt;
use crate::workers::Worker;

mod rename;
mod striped;

pub use rename::{RENAME_LOCK_LEASE, WALK_MAX};
pub use striped::{RootStripe, ShardSyncRetry};

/// The environment variable naming the fault point at which this process kills
/// itself with SIGKILL (tests of crash safety; see [`fault_point`]).
pub const FAULT_ENV: &str = "BRAID_FAULT";

/// Kills this process with SIGKILL if `BRAID_FAULT` names `point`: a crash at an
/// exact step of a protocol, for tests, without sleeping to hit it.
pub fn fault_point(point: &str) {
    static FAULT: OnceLock<Option<String>> = OnceLock::new();
    if FAULT.get_or_init(|| std::env::var(FAULT_ENV).ok()).as_deref() == Some(point) {
        tracing::error!(point, "fault injection: killing this process");
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// How long a coordinator keeps trying an MDT that does not answer before the
/// operation fails with EIO (the client's own call must outlive it).
pub const PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a participant's half stays pending before it asks the coordinator.
pub const PENDING_ASK_AFTER: Duration = Duration::from_secs(2);

/// Most bytes of an inode's copy one step of `braid migrate -m` carries (a message
/// is at most 1 MiB; its attributes, extended attributes, a directory's entries, a
/// file's Data-on-MDT bytes).
pub const MIGRATE_COPY_MAX: usize = 768 << 10;

/// Most pending halves one pass of [`UpdateResolve`] settles.
const RESOLVE_BATCH: usize = 256;

/// The coordinator's state: operations under way, and connections to other MDSs.
pub struct Dne {
    identity: Arc<Identity>,
    cluster: Arc<RwLock<ClusterView>>,
    mgs: Arc<RpcClient>,
    book: Arc<PeerBook>,
    under_way: Mutex<HashSet<UpdateId>>,
    next_seq: AtomicU64,
    /// Round-robin cursor of `-i -1`.
    rr: AtomicU64,
    /// One copy of a striped directory's attributes to its shards at a time (see
    /// [`Dne::sync_shards`]); an entry lives while a copy runs or waits.
    syncing: Mutex<HashMap<Fid, Arc<tokio::sync::Mutex<()>>>>,
    /// Whether this MDS serves MDT 0, which keeps the rename lock (see `rename`).
    serves_mdt0: bool,
    bfl: Arc<rename::Bfl>,
}

/// Where a new directory goes: its shards' MDTs in shard order (one for a plain
/// directory), their name hash, and whether the caller asked for it (`mkdir -i/-c`,
/// root only) rather than a default placing it.
pub(crate) struct DirPlacement {
    pub mdts: Vec<u32>,
    pub hash: DirHash,
    pub explicit: bool,
}

/// Ends an operation's "under way" mark when dropped.
struct UnderWay<'a> {
    dne: &'a Dne,
    id: UpdateId,
}

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.dne.under_way.lock().expect("under way").remove(&self.id);
    }
}

impl Dne {
    pub fn new(
        identity: Arc<Identity>,
        cluster: Arc<RwLock<ClusterView>>,
        mgs: Arc<RpcClient>,
        mdt0: Option<&Mdt>,
    ) -> Dne {
        // Random per process (the client id is): ids of a restarted coordinator
        // never meet those of its previous run.
        let base = identity.client_id;
        Dne {
            book: Arc::new(PeerBook {
                identity: identity.clone(),
                cluster: cluster.clone(),
                conns: Mutex::new(HashMap::new()),
            }),
            identity,
            cluster,
            mgs,
            under_way: Mutex::new(HashSet::new()),
            next_seq: AtomicU64::new(base),
            rr: AtomicU64::new(0),
            syncing: Mutex::new(HashMap::new()),
            serves_mdt0: mdt0.is_some(),
            bfl: Arc::new(rename::Bfl::new(mdt0.is_some_and(|m| m.recovery.is_some()))),
        }
    }

    fn begin(&self, mdt: u32) -> UnderWay<'_> {
        let id = UpdateId { mdt, seq: self.next_seq.fetch_add(1, Ordering::Relaxed) };
        self.under_way.lock().expect("under way").insert(id);
        UnderWay { dne: self, id }
    }

    /// An update whose coordinator is not an MDT of this file system, as this MDS
    /// knows it, is refused: nobody could ever settle it.
    pub(crate) async fn refuse_update(&self, req: &Request) -> Option<Response> {
        let Request::MdsUpdate { id, .. } = req else { return None };
        self.peer(id.mdt).await.err()
    }

    pub fn under_way(&self, id: UpdateId) -> bool {
        self.under_way.lock().expect("under way").contains(&id)
    }

    /// The MDS serving MDT `index`, as the MGS's configuration names it (asked of
    /// the MGS again when the configuration this MDS holds does not know it: it may
    /// predate the MDT's registration).
    pub(crate) async fn peer(&self, index: u32) -> Result<Peer, Response> {
        let address = match self.book.address_of(index) {
            Some(a) => a,
            None => {
                let config = match self.mgs.call(&Request::MgsGetConfig, vec![]).await {
                    Ok(r) => match r.response {
                        Response::Config(c) => c,
                        other => return Err(Response::error(Errno::Io, format!("the MGS answered {other:?}"))),
                    },
                    Err(e) => return Err(Response::error(Errno::Io, format!("cannot reach the MGS: {e}"))),
                };
                match config.target(TargetKind::Mdt, index) {
                    Some(t) => t.address.clone(),
                    None => {
                        return Err(Response::error(
                            Errno::Inval,
                            format!("MDT {index} is not in this file system (it has {} MDT(s))", config.mdts.len()),
                        ))
                    }
                }
            }
        };
        Ok(Peer { client: self.book.conn(&address), book: self.book.clone() })
    }

    /// Tells the participants the verdict, in the background (see [`tell_now`]).
    fn tell(&self, mdt: Arc<Mdt>, id: UpdateId, committed: bool, to: Vec<(Peer, Participant)>) {
        tokio::spawn(tell_now(mdt, id, committed, to));
    }

    /// Steps 3 and 4 once every participant in `prepared` holds its half: applies the
    /// entry `op` with the client's reply and the decision, forces it to disk, ends
    /// the mark and tells the participants. `step` names the fault points.
    async fn commit(
        &self,
        ctx: &RequestCtx,
        mdt: &Arc<Mdt>,
        step: &str,
        flight: UnderWay<'_>,
        op: CoordinatedOp,
        prepared: Vec<(Peer, Participant)>,
    ) -> Response {
        fault_point(&format!("{step}:before-commit"));
        let (client_id, conn_id, xid, id) = (ctx.client_id, ctx.conn_id, ctx.xid, flight.id);
        let participants = prepared.iter().map(|p| p.1).collect();
        let r =
            mdt.submit_own(JobKind::Coordinated { client_id, conn_id, xid, op: Box::new(op), id, participants }).await;
        // Applied now, if its decision is kept. A retry running beside its first try
        // gets the first try's answer from the reply cache instead: its own halves
        // were never part of an applied operation, and go.
        let decided = mdt.view().and_then(|v| v.decision(id)).is_ok_and(|d| d.is_some());
        let committed = decided && !matches!(r, Response::Error(_));
        if committed {
            // On disk before anyone acts on it: a machine crash must not take the entry
            // back once a participant keeps its half.
            mdt.submit_own(JobKind::Sync).await;
        }
        drop(flight);
        fault_point(&format!("{step}:before-done"));
        // Before the answer: once the caller has it, every half is as the verdict says
        // (the old name of a rename is gone, a link count is right), as on one MDT. A
        // participant that does not answer within the peer timeout settles later.
        tell_now(mdt.clone(), id, committed, prepared).await;
        r
    }
}

impl Dne {
    /// Step 1 of an operation with several halves: marks it under way on `mdt` and
    /// has every participant apply its half (`(MDT, the inode it is kept under,
    /// half)`), all at once. The mark and the participants holding their halves, or
    /// the first refusal as the answer (the halves already held are told to go).
    /// `in_time`: checked once all answered (the rename lock's lease); false
    /// refuses with `EAGAIN`.
    async fn prepare(
        &self,
        mdt: &Arc<Mdt>,
        step: &str,
        halves: Vec<(u32, Fid, UpdateOp)>,
        in_time: impl FnOnce() -> bool,
    ) -> Result<(UnderWay<'_>, Vec<(Peer, Participant)>), Response> {
        let mut peers = Vec::with_capacity(halves.len());
        for (k, ..) in &halves {
            peers.push(self.peer(*k).await?);
        }
        let flight = self.begin(mdt.index);
        let id = flight.id;
        fault_point(&format!("{step}:before-update"));
        let sends = halves
            .iter()
            .zip(&peers)
            .map(|((k, _, op), p)| (p.clone(), *k, Request::MdsUpdate { mdt: *k, id, op: Box::new(op.clone()) }));
        let mut prepared = Vec::new();
        let mut refused = None;
        for (((k, fid, _), peer), r) in halves.iter().zip(&peers).zip(ask_all(sends.collect()).await) {
            match r {
                Response::Ok | Response::Attr(_) => prepared.push((peer.clone(), Participant { mdt: *k, fid: *fid })),
                other => refused = refused.or(Some(other)),
            }
        }
        if refused.is_none() && !in_time() {
            refused = Some(Response::error(Errno::Again, "the rename lock's lease ran out"));
        }
        match refused {
            Some(r) => {
                self.tell(mdt.clone(), id, false, prepared);
                Err(r)
            }
            None => Ok((flight, prepared)),
        }
    }
}

/// Tells the participants the verdict, all at once, and forgets a committed decision
/// once all of them answered: if a message is lost, the participant asks, and
/// [`UpdateResolve`] tells it again.
async fn tell_now(mdt: Arc<Mdt>, id: UpdateId, committed: bool, to: Vec<(Peer, Participant)>) {
    let told = to.iter().map(|(peer, Participant { mdt: k, fid })| {
        (peer.clone(), *k, Request::MdsUpdateDone { mdt: *k, fid: *fid, id, committed })
    });
    let answers = ask_all(told.collect()).await;
    let all = answers.iter().all(|r| !matches!(r, Response::Error(_)));
    for (r, (_, p)) in answers.iter().zip(&to) {
        if let Response::Error(e) = r {
            tracing::debug!(fid = %p.fid, "verdict on a pending update not taken (sent again later): {e:?}");
        }
    }
    if committed && all {
        mdt.submit_own(JobKind::Forget(id)).await;
    }
}

/// Whether the root (on `mdt`, MDT 0) is striped.
fn root_striped(mdt: &Mdt) -> bool {
    mdt.view().and_then(|v| v.must_inode(Fid::ROOT)).is_ok_and(|r| r.attr.stripes.is_some())
}

/// Sends each participant its half at once; the answers in the order of `halves`.
async fn ask_all(halves: Vec<(Peer, u32, Request)>) -> Vec<Response> {
    let tasks: Vec<_> =
        halves.into_iter().map(|(peer, k, req)| tokio::spawn(async move { ask(&peer, k, &req).await })).collect();
    let mut answers = Vec::with_capacity(tasks.len());
    for t in tasks {
        answers.push(t.await.unwrap_or_else(|e| Response::error(Errno::Io, format!("a peer request failed: {e}"))));
    }
    answers
}

fn peer_options() -> RpcOptions {
    RpcOptions { request_timeout: PEER_TIMEOUT, recovery_timeout: PEER_TIMEOUT, ..RpcOptions::default() }
}

/// How often a request a peer MDS has not answered looks whether its MDT moved.
const MOVE_CHECK: Duration = Duration::from_secs(1);

/// The MDSs this one talks to: connections by address, and the configuration (kept
/// fresh by the `cluster-refresh` worker) that says which address serves an MDT.
struct PeerBook {
    identity: Arc<Identity>,
    cluster: Arc<RwLock<ClusterView>>,
    conns: Mutex<HashMap<String, Arc<RpcClient>>>,
}

impl PeerBook {
    fn conn(&self, address: &str) -> Arc<RpcClient> {
        let mut conns = self.conns.lock().expect("peers");
        let c = conns
            .entry(address.to_string())
            .or_insert_with(|| Arc::new(RpcClient::new(address.to_string(), self.identity.clone(), peer_options())));
        c.clone()
    }

    /// Where the configuration this MDS holds says MDT `index` is served.
    fn address_of(&self, index: u32) -> Option<String> {
        let view = self.cluster.read().expect("cluster view");
        view.config.as_ref().and_then(|c| c.target(TargetKind::Mdt, index)).map(|t| t.address.clone())
    }
}

/// The MDS serving one MDT, as [`ask`] reaches it: a request follows the MDT when a
/// failover moves it elsewhere while the request waits.
#[derive(Clone)]
pub(crate) struct Peer {
    book: Arc<PeerBook>,
    client: Arc<RpcClient>,
}

/// Sends `req` to the MDS serving MDT `mdt` and returns its answer, an error answer
/// as it came. While it is unanswered, the configuration is looked at every
/// [`MOVE_CHECK`]; once it names another address for the MDT (a replicated MDT's
/// leader died and another took over, or its MDS came back elsewhere), the request
/// goes there with the same xid, so the MDT's reply cache answers a change that
/// reached the old address as the first time. Without this, a request sent to a
/// leader just killed waited out the peer timeout and failed the client's operation
/// with `EIO` though the MDT was back within seconds.
async fn ask(peer: &Peer, mdt: u32, req: &Request) -> Response {
    let xid = peer.book.identity.next_xid();
    let mut c = peer.client.clone();
    loop {
        let addr = c.addr().to_string();
        let moved = async {
            loop {
                tokio::time::sleep(MOVE_CHECK).await;
                if let Some(to) = peer.book.address_of(mdt).filter(|a| *a != addr) {
                    return to;
                }
            }
        };
        let r = tokio::select! {
            r = c.call_with_xid(xid, req, vec![]) => r,
            to = moved => {
                tracing::info!(mdt, from = %addr, %to, "the MDT moved: sending its request there");
                c = peer.book.conn(&to);
                continue;
            }
        };
        return match r {
            Ok(reply) => reply.response,
            Err(RpcError::Remote(e)) => Response::Error(e),
            Err(e) => Response::error(Errno::Io, format!("MDT {mdt} did not answer: {e}")),
        };
    }
}

impl Dne {
    /// Where a new directory in `parent` goes: as asked (`mkdir -i K -c N`), else as
    /// the parent's default for new directories says, else on the parent's own MDT.
    /// An impossible request (more shards than MDTs, an MDT not in the file system)
    /// gets its error answer; a default asking for more shards than there are MDTs
    /// gets them all, as Lustre's.
    pub(crate) async fn where_to_mkdir(
        &self,
        mdt: &Mdt,
        parent: Fid,
        asked: Option<DirSpec>,
    ) -> Result<DirPlacement, Response> {
        let here = DirPlacement { mdts: vec![mdt.index], hash: DirHash::default(), explicit: false };
        let (spec, explicit) = match asked {
            Some(s) => (s, true),
            None => match mdt.view().ok().and_then(|v| v.dirs_default(parent).ok().flatten()) {
                Some(s) => (s, false),
                // The root's built-in default, as Lustre's (`setdirstripe -D -i -1`):
                // new top-level directories spread over the MDTs. A striped root
                // spreads its names already.
                None if parent == Fid::ROOT && self.several_mdts() && !root_striped(mdt) => {
                    (DirSpec::on(MDT_BALANCED), false)
                }
                None => return Ok(here),
            },
        };
        if let Err(e) = spec.check() {
            return Err(Response::error(Errno::Inval, e));
        }
        let start = if spec.mdt == MDT_BALANCED { self.balanced(mdt.index) } else { spec.mdt };
        let all = self.mdt_indices(start).await?;
        if all.is_empty() {
            return Ok(here);
        }
        let count = match spec.count {
            DIR_STRIPES_ALL => all.len(),
            n if n as usize > all.len() && explicit => {
                let why = format!("stripe count {n} is larger than the number of MDTs ({})", all.len());
                return Err(Response::error(Errno::Inval, why));
            }
            n => (n as usize).min(all.len()),
        };
        let Some(at) = all.iter().position(|&k| k == start) else {
            let why = format!("MDT {start} is not in this file system (it has {} MDT(s))", all.len());
            return Err(Response::error(Errno::Inval, why));
        };
        let mdts = (0..count).map(|i| all[(at + i) % all.len()]).collect();
        Ok(DirPlacement { mdts, hash: spec.hash, explicit })
    }

    /// The indices of the file system's MDTs, in order; asked of the MGS when the
    /// configuration this MDS holds does not know `want` (it may predate it).
    async fn mdt_indices(&self, want: u32) -> Result<Vec<u32>, Response> {
        let indices = |c: &ClusterConfig| {
            let mut all: Vec<u32> = c.mdts.iter().map(|t| t.index).collect();
            all.sort_unstable();
            all
        };
        let known = self.cluster.read().expect("cluster view").config.as_ref().map(indices).unwrap_or_default();
        if known.contains(&want) {
            return Ok(known);
        }
        match self.mgs.call(&Request::MgsGetConfig, vec![]).await {
            Ok(rpc::Reply { response: Response::Config(c), .. }) => Ok(indices(&c)),
            Ok(r) => Err(Response::error(Errno::Io, format!("the MGS answered {:?}", r.response))),
            Err(e) => Err(Response::error(Errno::Io, format!("cannot reach the MGS: {e}"))),
        }
    }

    /// The MDT for a directory the MDS places (`-i -1`): the next one that is up,
    /// round-robin, while their free inodes are within 17 % of each other, else the
    /// one with the most free inodes (Lustre's MDT QoS, as OST placement); `here`
    /// when none is known.
    fn balanced(&self, here: u32) -> u32 {
        let view = self.cluster.read().expect("cluster view");
        let mut up: Vec<(u32, u64)> =
            view.config.iter().flat_map(|c| &c.mdts).filter(|t| t.up).map(|t| (t.index, t.usage.free_inodes)).collect();
        up.sort_unstable();
        let (Some(max), Some(min)) = (up.iter().map(|t| t.1).max(), up.iter().map(|t| t.1).min()) else {
            return here;
        };
        if max > 0 && (max - min) * 100 > max * layout::QOS_THRESHOLD_PERCENT {
            return up.iter().max_by_key(|t| (t.1, std::cmp::Reverse(t.0))).map_or(here, |t| t.0);
        }
        up[(self.rr.fetch_add(1, Ordering::Relaxed) % up.len() as u64) as usize].0
    }

    /// A directory `name` in `parent` (on this MDS) with its inode on MDT `k`: asked
    /// for (`mkdir -i K`, root only, as Lustre's default `enable_remote_dir_gid`) or
    /// chosen by the parent's default for new directories (anyone).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn mkdir_remote(
        &self,
        callbacks: &Callbacks,
        ctx: &RequestCtx,
        mdt: &Arc<Mdt>,
        creds: Creds,
        parent: Fid,
        name: String,
        mode: u32,
        (k, explicit): (u32, bool),
    ) -> Response {
        if let Some(r) = kept(mdt, ctx) {
            return r;
        }
        if explicit && creds.uid != 0 {
            return Response::error(Errno::Perm, "only root may make a directory on another MDT");
        }
        let op = match self.new_dir_half(mdt, &creds, parent, &name, mode).await {
            Ok(op) => op,
            Err(r) => return r,
        };
        let entry = move |half: &Response| match half {
            Response::Attr(child) => {
                Some((CoordinatedOp::Link { creds, parent, name, child: child.clone() }, child.fid))
            }
            _ => None,
        };
        self.coordinate(callbacks, ctx, mdt, ("mkdir-remote", parent, k), op, entry).await
    }

    /// The participant's half of a new directory `name` in `parent` (on this MDS),
    /// with what it inherits from the parent (its default layout, its default for new
    /// directories, a setgid bit's group), once the entry is checked.
    async fn new_dir_half(
        &self,
        mdt: &Arc<Mdt>,
        creds: &Creds,
        parent: Fid,
        name: &str,
        mode: u32,
    ) -> Result<UpdateOp, Response> {
        let dir = self.check_new_entry(mdt, creds, parent, name).await?;
        let dir_default = mdt.read(move |v| Ok(Response::DirLayout(v.must_inode(parent)?.dir_default))).await;
        let dir_default = match dir_default {
            Response::DirLayout(d) if parent != Fid::ROOT => d,
            Response::DirLayout(_) => None,
            other => return Err(other),
        };
        let setgid = dir.mode & S_ISGID != 0;
        let gid = if setgid { dir.gid } else { creds.gid };
        let mode = mode | if setgid { S_ISGID } else { 0 };
        let dirs_default = mdt.view().ok().and_then(|v| v.dirs_default(parent).ok().flatten());
        let op = UpdateOp::MkdirInode {
            creds: creds.clone(),
            parent,
            name: name.to_string(),
            mode,
            gid,
            dir_default,
            dirs_default,
            shard: None,
        };
        Ok(op)
    }

    /// A hard link `name` in `parent` (on this MDS) to file `fid` on another MDT.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn link_remote(
        &self,
        callbacks: &Callbacks,
        ctx: &RequestCtx,
        mdt: &Arc<Mdt>,
        creds: Creds,
        fid: Fid,
        parent: Fid,
        name: String,
    ) -> Response {
        if let Some(r) = kept(mdt, ctx) {
            return r;
        }
        if let Err(r) = self.check_new_entry(mdt, &creds, parent, &name).await {
            return r;
        }
        let op = UpdateOp::LinkInode { fid, parent, name: name.clone() };
        let entry = move |half: &Response| match half {
            Response::Attr(child) => Some((CoordinatedOp::Link { creds, parent, name, child: child.clone() }, fid)),
            _ => None,
        };
        self.coordinate(callbacks, ctx, mdt, ("link-remote", parent, fid.mdt()), op, entry).await
    }

    /// `braid migrate -m K`: the inode of entry `name` in `parent` (entry and inode
    /// on this MDS) moves to MDT `k` under a new FID, with its extended attributes
    /// and a directory's entries or a file's DoM bytes: MDT `k` makes the copy (its
    /// half), this MDT points the entry at it and drops the old inode, if nothing
    /// changed since the copy was read (else `EAGAIN`: the caller asks again). A
    /// file with several links (`EMLINK`) or open (`EBUSY`) stays. An inode on `k`
    /// already is answered with its attributes. Root only.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn migrate(
        &self,
        callbacks: &Callbacks,
        ctx: &RequestCtx,
        mdt: &Arc<Mdt>,
        creds: Creds,
        parent: Fid,
        name: String,
        k: u32,
    ) -> Response {
        if let Some(r) = kept(mdt, ctx) {
            return r;
        }
        if creds.uid != 0 {
            return Response::error(Errno::Perm, "only root may migrate an inode to another MDT");
        }
        if let Err(r) = self.peer(k).await {
            return r;
        }
        // The inode and what it takes along, or its FID on another MDT.
        let read = || -> Result<Result<(Fid, InodeCopy), Fid>, OpError> {
            let v = mdt.view()?;
            v.dir_for(&creds, parent, &name, false)?;
            match v.entry(parent, &name)? {
                None => Err(OpError::Errno(Errno::NoEnt, format!("{name}: no such entry in {parent}"))),
                Some((fid, _)) if fid.mdt() != mdt.index || fid.mdt() == k => Ok(Err(fid)),
                Some((fid, _)) => Ok(Ok((fid, v.inode_copy(fid)?))),
            }
        };
        let (old, copy) = match read() {
            Ok(Ok(c)) => c,
            // On MDT `k` already: its attributes, as a move would have answered.
            Ok(Err(here)) if here.mdt() == k && k == mdt.index => {
                return mdt.read(move |v| Ok(Response::Attr(v.must_inode(here)?.attr))).await
            }
            Ok(Err(there)) if there.mdt() == k => return self.remote_attr(there).await,
            Ok(Err(remote)) => return self.migrate_remote(callbacks, ctx, mdt, (parent, name), remote, k).await,
            Err(e) => return crate::target::op_error(e),
        };
        if copy.attr.stripes.is_some() {
            return Response::error(Errno::NotSup, format!("{name} is striped: migrating one is not supported yet"));
        }
        if copy.attr.kind != FileKind::Dir && copy.attr.nlink != 1 {
            let links = copy.attr.nlink;
            return Response::error(Errno::MLink, format!("{name} has {links} links: it stays on MDT {}", mdt.index));
        }
        if copy.attr.kind != FileKind::Dir && mdt.is_open(old) {
            return Response::error(Errno::Busy, format!("{name} is open: it stays on MDT {} until closed", mdt.index));
        }
        if let Some((entry, child, _)) = copy
            .entries
            .iter()
            .find(|(_, child, kind)| *kind == FileKind::Dir && child.mdt() != mdt.index && child.mdt() != k)
        {
            return Response::error(
                Errno::XDev,
                format!(
                    "{name}/{entry} is a directory on MDT {} (neither here nor on MDT {k}): migrate it first",
                    child.mdt()
                ),
            );
        }
        let bytes = proto::msg::encode(&copy).map(|b| b.len()).unwrap_or(usize::MAX);
        if bytes > MIGRATE_COPY_MAX {
            return Response::error(
                Errno::NoSpc,
                format!(
                    "{name} has {} entries and {} bytes on the MDT ({bytes} bytes to copy): more than one step \
                     of a migration carries ({MIGRATE_COPY_MAX} bytes)",
                    copy.entries.len(),
                    copy.dom.iter().map(|(_, b)| b.len()).sum::<usize>()
                ),
            );
        }
        // Leases on a directory itself go too: its entries go with the batch.
        self.revoke_others(callbacks, mdt, old, ctx).await;
        let op = UpdateOp::Adopt { parent, name: name.clone(), from: old, copy: Box::new(copy.clone()) };
        let entry = move |half: &Response| match half {
            Response::Attr(moved) => Some((
                CoordinatedOp::Migrate { parent, name, old, copy: Box::new(copy), moved: moved.clone() },
                moved.fid,
            )),
            _ => None,
        };
        self.coordinate(callbacks, ctx, mdt, ("migrate-local", parent, k), op, entry).await
    }

    /// `braid migrate -m K` of a remote inode: its entry `name` in `parent` here, its
    /// inode `old` on another MDT. That MDT holds the inode unchanged and answers
    /// what it takes along (its half), MDT `k` makes the copy (its half, this MDT's
    /// own if `k` is this one), and this MDT points the entry at the copy; the
    /// verdict drops the old inode.
    async fn migrate_remote(
        &self,
        callbacks: &Callbacks,
        ctx: &RequestCtx,
        mdt: &Arc<Mdt>,
        (parent, name): (Fid, String),
        old: Fid,
        k: u32,
    ) -> Response {
        let (from, to) = match (self.peer(old.mdt()).await, self.peer(k).await) {
            (Ok(f), Ok(t)) => (f, t),
            (Err(r), _) | (_, Err(r)) => return r,
        };
        self.revoke_others(callbacks, mdt, parent, ctx).await;
        let flight = self.begin(mdt.index);
        let id = flight.id;
        fault_point("migrate-remote:before-update");
        let release = UpdateOp::Release { fid: old, parent, name: name.clone(), to: k };
        let copy = match ask(&from, old.mdt(), &Request::MdsUpdate { mdt: old.mdt(), id, op: Box::new(release) }).await
        {
            Response::InodeCopy(c) => c,
            other => {
                // Nothing held, or a refusal after the half was kept: told to go.
                self.tell(mdt.clone(), id, false, vec![(from, Participant { mdt: old.mdt(), fid: old })]);
                return other;
            }
        };
        let mut prepared = vec![(from, Participant { mdt: old.mdt(), fid: old })];
        let adopt = UpdateOp::Adopt { parent, name: name.clone(), from: old, copy };
        let moved = match ask(&to, k, &Request::MdsUpdate { mdt: k, id, op: Box::new(adopt) }).await {
            Response::Attr(a) => a,
            other => {
                self.tell(mdt.clone(), id, false, prepared);
                return other;
            }
        };
        prepared.push((to, Participant { mdt: k, fid: moved.fid }));
        // Where requests naming the old directory go once it is gone (a lost answer
        // only leaves them `ESTALE`).
        let (from, _) = &prepared[0];
        let told = UpdateOp::ReleasedTo { fid: old, to: moved.fid };
        if let Response::Error(e) =
            ask(from, old.mdt(), &Request::MdsUpdate { mdt: old.mdt(), id, op: Box::new(told) }).await
        {
            tracing::debug!(%old, "where the migrated inode went was not kept: {e:?}");
        }
        let op = CoordinatedOp::MigrateRemote { parent, name, old, moved };
        self.commit(ctx, mdt, "migrate-remote", flight, op, prepared).await
    }

    /// The removal of `name` in `parent` (on this MDS), an entry naming `child` on
    /// another MDT: the rmdir of a remote directory, or the unlink of a link to a file
    /// there.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn remove_remote(
        &self,
        callbacks: &Callbacks,
        ctx: &RequestCtx,
        mdt: &Arc<Mdt>,
        creds: Creds,
        parent: Fid,
        name: String,
        child: Fid,
    ) -> Response {
        if let Some(r) = kept(mdt, ctx) {
            return r;
        }
        let attr = if child.mdt() == mdt.index {
            mdt.read(move |v| Ok(Response::Attr(v.must_inode(child)?.attr))).await
        } else {
            self.remote_attr(child).await
        };
        let attr = match attr {
            Response::Attr(a) => a,
            other => return other,
        };
        // What can be checked here is, before the participant holds anything.
        let (c, a, n) = (creds.clone(), attr.clone(), name.clone());
        let checked = mdt
            .read(move |v| {
                let dir = v.dir_for(&c, parent, &n, true)?;
                if !crate::inode::sticky_allows_attr(&dir, &a, &c) {
                    return Err(crate::mdt::OpError::Errno(Errno::Perm, "sticky directory: not the owner".into()));
                }
                Ok(Response::Ok)
            })
            .await;
        if checked != Response::Ok {
            return checked;
        }
        if let Some(stripes) = attr.stripes.clone() {
            return self.rmdir_striped(callbacks, ctx, mdt, creds, (parent, name), attr, *stripes).await;
        }
        let (op, step) = if attr.kind == FileKind::Dir {
            (UpdateOp::RmdirInode { fid: child, parent, name: name.clone() }, "rmdir-remote")
        } else {
            (UpdateOp::UnlinkInode { fid: child, parent, name: name.clone() }, "unlink-remote")
        };
        let entry = move |half: &Response| match half {
            Response::Ok | Response::Attr(_) => {
                Some((CoordinatedOp::Unlink { creds, parent, name, child: attr }, child))
            }
            _ => None,
        };
        self.coordinate(callbacks, ctx, mdt, (step, parent, child.mdt()), op, entry).await
    }

    /// Checks what can be checked of a new entry `name` in `parent` before a
    /// participant holds anything: the parent's attributes, or the error answer.
    async fn check_new_entry(&self, mdt: &Arc<Mdt>, creds: &Creds, parent: Fid, name: &str) -> Result<Attr, Response> {
        let (c, n) = (creds.clone(), name.to_string());
        let checked = mdt
            .read(move |v| {
                crate::mdt::schema::check_name(&n)?;
                let dir = v.dir_for(&c, parent, &n, true)?;
                if v.entry(parent, &n)?.is_some() {
                    return Err(crate::mdt::OpError::Errno(Errno::Exist, format!("{n} exists")));
                }
                Ok(Response::Attr(dir.attr))
            })
            .await;
        match checked {
            Response::Attr(a) => Ok(a),
            other => Err(other),
        }
    }

    /// Steps 1 to 4 of an operation in directory `parent` (on this MDS) whose inode
    /// is on MDT `k`: revoke other clients' leases on the directory, have the
    /// participant apply `op`, apply the entry `entry` makes of its answer (with the
    /// decision), and tell the participant. `step` names the fault points.
    async fn coordinate(
        &self,
        callbacks: &Callbacks,
        ctx: &RequestCtx,
        mdt: &Arc<Mdt>,
        (step, parent, k): (&str, Fid, u32),
        op: UpdateOp,
        entry: impl FnOnce(&Response) -> Option<(CoordinatedOp, Fid)>,
    ) -> Response {
        self.revoke_others(callbacks, mdt, parent, ctx).await;
        let peer = match self.peer(k).await {
            Ok(p) => p,
            Err(r) => return r,
        };
        let flight = self.begin(mdt.index);
        let id = flight.id;
        fault_point(&format!("{step}:before-update"));
        let half = ask(&peer, k, &Request::MdsUpdate { mdt: k, id, op: Box::new(op) }).await;
        let Some((op, participant)) = entry(&half) else { return half };
        self.commit(ctx, mdt, step, flight, op, vec![(peer, Participant { mdt: k, fid: participant })]).await
    }

    /// A participant asks about a pending half (see [`UpdateResolve`]).
    pub(crate) async fn update_query(&self, mdt: &Arc<Mdt>, id: UpdateId) -> Response {
        if id.mdt != mdt.index {
            return Response::error(Errno::Inval, format!("update {id:?} was not coordinated by MDT {}", mdt.index));
        }
        if self.under_way(id) {
            return Response::Update(UpdateState::InFlight);
        }
        mdt.read(move |v| Ok(Response::Update(v.update_state(id)?))).await
    }

    /// Revokes the lease another client holds on `dir`, if any: a lease is never
    /// granted again once revoked, so the coordinator's batch will not meet one.
    async fn revoke_others(&self, callbacks: &Callbacks, mdt: &Arc<Mdt>, dir: Fid, ctx: &RequestCtx) {
        let leased = mdt.leases().get(dir).is_some_and(|l| (l.holder, l.conn) != (ctx.client_id, ctx.conn_id));
        if leased {
            mdt.revoke(dir, callbacks).await;
        }
    }

    /// The attributes of `fid`, on another MDT.
    pub(crate) async fn remote_attr(&self, fid: Fid) -> Response {
        match self.peer(fid.mdt()).await {
            Ok(peer) => ask(&peer, fid.mdt(), &Request::MdsGetattr { fid }).await,
            Err(r) => r,
        }
    }
}

/// A failure of a request whose first try (running alongside, or answered and lost)
/// did the operation is answered as the first try was: its checks failed only because
/// the operation was done.
pub(crate) fn answer_of_first_try(mdt: &Mdt, ctx: &RequestCtx, r: Response) -> Response {
    match r {
        Response::Error(_) => kept(mdt, ctx).unwrap_or(r),
        r => r,
    }
}

/// The answer kept for this very request (a retry after its operation committed).
fn kept(mdt: &Mdt, ctx: &RequestCtx) -> Option<Response> {
    let view = mdt.view().ok()?;
    kept_reply(&view, ctx.client_id, ctx.xid).ok().flatten()
}

/// A participant's pending halves whose verdict did not come: asks each one's
/// coordinator, and settles it by the entry (see [`crate::mdt::update`]).
pub struct UpdateResolve {
    pub mdt: Arc<Mdt>,
    pub dne: Arc<Dne>,
    pub every: Duration,
    /// Where the next pass goes on in the table (a pass handles at most
    /// [`RESOLVE_BATCH`] records, so the ones after are reached too).
    pub after: Option<Fid>,
}

impl Worker for UpdateResolve {
    const NAME: &'static str = "update-resolve";

    fn period(&self) -> Duration {
        self.every
    }

    /// At start too: what a previous run left pending is settled at once.
    fn eager(&self) -> bool {
        true
    }

    async fn tick(&mut self) {
        self.ask_coordinators().await;
        self.tell_participants().await;
    }
}

impl UpdateResolve {
    /// The participant's side: pending halves whose verdict did not come.
    async fn ask_coordinators(&mut self) {
        let pending = match self.mdt.view().and_then(|v| v.pending_after(self.after, RESOLVE_BATCH)) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(mdt = self.mdt.index, "cannot list pending updates: {e}");
                return;
            }
        };
        self.after = if pending.len() < RESOLVE_BATCH { None } else { pending.last().map(|p| p.0) };
        let now = now_secs();
        // A coordinator that does not answer is not asked again this pass: the others'
        // updates are not held up behind its timeouts.
        let mut silent = HashSet::new();
        for (fid, p) in pending {
            if now.saturating_sub(p.at) < PENDING_ASK_AFTER.as_secs() || silent.contains(&p.id.mdt) {
                continue;
            }
            let Ok(peer) = self.dne.peer(p.id.mdt).await else {
                silent.insert(p.id.mdt);
                continue;
            };
            let committed = match ask(&peer, p.id.mdt, &Request::MdsUpdateQuery { id: p.id }).await {
                Response::Update(UpdateState::InFlight) => continue,
                Response::Update(s) => s == UpdateState::Committed,
                other => {
                    tracing::debug!(mdt = self.mdt.index, %fid, "coordinator did not settle a pending update: {other:?}");
                    silent.insert(p.id.mdt);
                    continue;
                }
            };
            tracing::info!(mdt = self.mdt.index, %fid, ?p.op, committed, "settled a pending update");
            self.mdt.submit_own(JobKind::Settle { fid, id: p.id, committed }).await;
        }
    }

    /// The coordinator's side: decisions some participant has not acknowledged
    /// (the verdict was lost, or this MDS restarted before sending it).
    async fn tell_participants(&mut self) {
        let decisions = match self.mdt.view().and_then(|v| v.decisions(RESOLVE_BATCH)) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(mdt = self.mdt.index, "cannot list decisions: {e}");
                return;
            }
        };
        let now = now_secs();
        let mut silent = HashSet::new();
        for (id, d) in decisions {
            // One under way, or just made, is told by its own operation.
            if self.dne.under_way(id) || now.saturating_sub(d.at) < PENDING_ASK_AFTER.as_secs() {
                continue;
            }
            let mut told = true;
            for &Participant { mdt: k, fid } in &d.participants {
                let peer = match self.dne.peer(k).await {
                    Ok(p) if !silent.contains(&k) => p,
                    _ => {
                        silent.insert(k);
                        told = false;
                        continue;
                    }
                };
                if let Response::Error(e) =
                    ask(&peer, k, &Request::MdsUpdateDone { mdt: k, fid, id, committed: true }).await
                {
                    tracing::debug!(mdt = self.mdt.index, %fid, "verdict not taken: {e:?}");
                    silent.insert(k);
                    told = false;
                }
            }
            if told {
                self.mdt.submit_own(JobKind::Forget(id)).await;
            }
        }
    }
}
