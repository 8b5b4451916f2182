//! The metadata service of one process: routes each request to the MDT that owns its
//! FID, runs reads inline and hands mutations to the MDT's group commit, and starts
//! the background workers.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use proto::msg::{Creds, FileKind, OpenFlags, Request, Response};
use proto::Errno;
use proto::Fid;
use rpc::server::{Answer, Callbacks, RequestCtx, Service};
use rpc::{Identity, RpcClient};

use crate::cluster::ClusterView;
use crate::commit::{JobKind, Outcome};
use crate::dne::{answer_of_first_try, Dne, RootStripe, ShardSyncRetry, UpdateResolve, PENDING_ASK_AFTER};
use crate::mdt::view::Found;
use crate::target::Mdt;
use crate::workers::{CheckpointTick, ClusterRefresh, DestroyDrain, OrphanReap, ReplyPrune, Workers};
use crate::{MdsConfig, MdsError};

/// The metadata service of one process.
pub struct Mds {
    mdts: HashMap<u32, Arc<Mdt>>,
    dirs: HashMap<u32, PathBuf>,
    /// Clients' connections, for revoking directory leases.
    callbacks: Arc<Callbacks>,
    /// Operations that span MDTs, as their coordinator (see [`crate::dne`]).
    dne: Arc<Dne>,
    /// Stopped when the MDS is dropped.
    workers: Workers,
    /// What this MDS knows of the cluster, and where it learns it.
    cluster: Arc<RwLock<ClusterView>>,
    mgs: Arc<RpcClient>,
}

impl Mds {
    /// Opens every registered MDT and starts the background workers. Must run inside
    /// a tokio runtime.
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
        Ok(Mds::serve_mdts(mdts, dirs, cfg, identity, mgs, cluster, Arc::default()))
    }

    /// Starts the background workers of MDTs opened already (a replicated MDT's
    /// leader, [`crate::replica`], opens its own), with lease callbacks through
    /// `callbacks`.
    pub(crate) fn serve_mdts(
        mdts: HashMap<u32, Arc<Mdt>>,
        dirs: HashMap<u32, PathBuf>,
        cfg: MdsConfig,
        identity: Arc<Identity>,
        mgs: Arc<RpcClient>,
        cluster: Arc<RwLock<ClusterView>>,
        callbacks: Arc<Callbacks>,
    ) -> Arc<Mds> {
        let workers = Workers::default();
        let dne = Arc::new(Dne::new(identity.clone(), cluster.clone(), mgs.clone(), mdts.get(&0).map(|m| &**m)));
        workers.spawn(ClusterRefresh {
            mgs: mgs.clone(),
            cluster: cluster.clone(),
            every: cfg.config_refresh,
            away: false,
        });
        for m in mdts.values() {
            // Open counts do not survive a restart: orphans left by the previous run
            // are destroyed once clients had a grace period to come back.
            let mdt = m.clone();
            workers.once("orphan-grace", cfg.orphan_grace, async move {
                mdt.submit_own(JobKind::ReapOrphans(None)).await;
            });
            workers.spawn(DestroyDrain::new(m.clone(), cluster.clone(), identity.clone(), cfg.destroy_interval));
            workers.spawn(ReplyPrune { mdt: m.clone(), keep: cfg.reply_keep });
            workers.spawn(CheckpointTick { mdt: m.clone(), every: cfg.checkpoint_interval });
            workers.spawn(OrphanReap { mdt: m.clone(), callbacks: callbacks.clone() });
            workers.spawn(UpdateResolve { mdt: m.clone(), dne: dne.clone(), every: PENDING_ASK_AFTER, after: None });
            workers.spawn(ShardSyncRetry { mdt: m.clone(), dne: dne.clone(), every: PENDING_ASK_AFTER });
        }
        if let (Some(m), true) = (mdts.get(&0), cfg.root_stripes > 1) {
            workers.spawn(RootStripe { mdt: m.clone(), dne: dne.clone(), count: cfg.root_stripes, done: false });
        }
        Arc::new(Mds { mdts, dirs, callbacks, dne, workers, cluster, mgs })
    }

    /// Stops the background workers (dropping the MDS does too).
    pub fn stop(&self) {
        self.workers.stop();
    }

    /// Fetches the configuration from the MGS: done before the MDS serves, so that
    /// no client request is taken before the root squash rule is known.
    pub async fn load_config(&self) -> Result<(), proto::RpcError> {
        crate::workers::refresh_cluster(&self.mgs, &self.cluster).await
    }

    /// Root squash ([`proto::squash`]): root's credentials in a client's request
    /// become the squash user's, unless the client's address is exempt. A request
    /// of another MDS carries credentials its coordinator already squashed.
    fn squash(&self, ctx: &RequestCtx, req: &mut Request) {
        if ctx.from_server {
            return;
        }
        let Some(creds) = req.creds_mut().filter(|c| c.uid == 0) else { return };
        let view = self.cluster.read().expect("cluster view");
        if let Some(rule) = view.config.as_ref().and_then(|c| c.root_squash.as_ref()) {
            creds.squash(rule, ctx.peer.ip());
        }
    }

    fn mdt(&self, fid: Fid) -> Result<&Arc<Mdt>, Box<Response>> {
        self.mdts
            .get(&fid.mdt())
            .ok_or_else(|| Box::new(Response::error(Errno::Stale, format!("MDT {} is not served here", fid.mdt()))))
    }
}

impl Service for Mds {
    async fn handle(&self, ctx: RequestCtx, mut req: Request, _payload: Bytes) -> Answer {
        self.squash(&ctx, &mut req);
        match req {
            // The two answers that carry file data.
            Request::MdsOpen { creds, fid, flags } => self.open(ctx, creds, Opened::Fid(fid), flags).await,
            Request::MdsOpenAt { creds, parent, name, flags } => {
                self.open(ctx, creds, Opened::Name(parent, name), flags).await
            }
            Request::MdsDomRead { len, .. } if len as u64 > DOM_READ_MAX => (
                Response::error(
                    Errno::Inval,
                    format!("a DoM read of {len} bytes is more than {DOM_READ_MAX} at a time"),
                ),
                vec![],
            ),
            Request::MdsDomRead { fid, offset, len } => match self.mdt(fid) {
                Ok(mdt) => {
                    mdt.read_answer(move |v| {
                        v.dom_end(fid)?;
                        let data = v.dom_read(fid, offset, len as u64)?;
                        Ok((Response::Data, vec![Bytes::from(data)]))
                    })
                    .await
                }
                Err(r) => (*r, vec![]),
            },
            Request::MdsFsckScan { mdt, table, after, max } => match self.mdts.get(&mdt) {
                Some(m) => crate::mdt::fsck::scan(m, table, after, max),
                None => (Response::error(Errno::NoEnt, format!("MDT {mdt} is not served here")), vec![]),
            },
            req => (self.dispatch(ctx, req).await, vec![]),
        }
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
            let mut written = Vec::new();
            m.opens.lock().expect("opens").retain(|fid, holders| {
                if holders.remove(&client_id).is_some_and(|h| h.writer) {
                    written.push(*fid);
                }
                !holders.is_empty()
            });
            // What it wrote and never reported must not be read from caches keyed on
            // the old data version.
            if !written.is_empty() {
                let m = m.clone();
                tokio::spawn(async move {
                    let n = written.len();
                    match m.submit_own(JobKind::WriterGone(written)).await {
                        Response::Error(e) => tracing::warn!(
                            mdt = m.index,
                            client = client_id,
                            "cannot move the data versions of the files a departed writer held: {e}"
                        ),
                        _ => tracing::info!(
                            mdt = m.index,
                            client = client_id,
                            "moved the data version of {n} file(s) a departed client held open for writing"
                        ),
                    }
                });
            }
        }
    }
}

/// Largest small DoM file whose bytes an open returns with its attributes.
pub const DOM_OPEN_DATA_MAX: u64 = 64 << 10;

/// Most bytes one DoM read answers (a client asks for at most 4 MiB at a time): a
/// hostile length does not make the MDS build a huge answer.
pub const DOM_READ_MAX: u64 = 8 << 20;

/// What an open names: a FID, or a name in a directory (looked up first).
enum Opened {
    Fid(Fid),
    Name(Fid, String),
}

impl Mds {
    /// Opens a file. A Data-on-MDT file whose bytes (as of the open) all lie in its
    /// DoM component and are at most [`DOM_OPEN_DATA_MAX`] comes back with them, so
    /// reading it costs no further round trip (Lustre's DoM read-on-open). Only an
    /// open for reading gets them: a writer has no right to the bytes.
    async fn open(&self, ctx: RequestCtx, creds: Creds, what: Opened, flags: OpenFlags) -> Answer {
        let on = match &what {
            Opened::Fid(fid) | Opened::Name(fid, _) => *fid,
        };
        let mdt = match self.mdt(on) {
            Ok(m) => m,
            Err(r) => return (*r, vec![]),
        };
        if let Opened::Name(parent, _) = &what {
            self.reading_entries(&ctx, mdt, *parent).await;
        }
        let moves = mdt.opens.lock().expect("opens").moves();
        let (answer, fid) = mdt
            .read_answer_with(move |v| {
                let fid = match what {
                    Opened::Fid(fid) => fid,
                    Opened::Name(parent, name) => v.lookup(&creds, parent, &name)?.fid,
                };
                let attr = v.open(&creds, fid, flags)?;
                let small = flags.read && attr.size <= DOM_OPEN_DATA_MAX && !flags.truncate;
                let answer = match attr.layout.as_ref().and_then(|l| l.dom_end()) {
                    Some(end) if small && attr.size <= end => {
                        let data = v.dom_read(fid, 0, attr.size)?;
                        (Response::OpenedWithData { attr }, vec![Bytes::from(data)])
                    }
                    _ if v.has_xattrs(fid)? => (Response::Attr(attr), vec![]),
                    _ => (Response::OpenedWithoutXattrs { attr }, vec![]),
                };
                Ok((answer, Some(fid)))
            })
            .await;
        if let Some(fid) = fid {
            if !mdt.opened(fid, ctx.client_id, flags.write || flags.truncate, Some(moves)) {
                // It moved to another MDT since it was read: asked again, the open
                // finds where it went.
                let e = format!("{fid} moved to another MDT as it was opened: try again");
                return (Response::error(Errno::Again, e), vec![]);
            }
        }
        answer
    }

    async fn dispatch(&self, ctx: RequestCtx, req: Request) -> Response {
        // The MDT's FID, and the inode the request names by its FID (a handle), if
        // it names one.
        let (target, handle) = match &req {
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
            Request::MdsRenameLock { hold, holder } => return self.dne.rename_lock_for(*hold, *holder).await,
            Request::MdsRefreshConfig => {
                return match crate::workers::refresh_cluster(&self.mgs, &self.cluster).await {
                    Ok(()) => Response::Ok,
                    Err(e) => Response::error(Errno::Again, format!("cannot fetch configuration from the MGS: {e}")),
                };
            }
            Request::MdsOpenLog { mdt, after } => {
                return match self.mdts.get(mdt) {
                    Some(m) => m.open_log(*after),
                    None => Response::error(Errno::NoEnt, format!("MDT {mdt} is not served here")),
                }
            }
            Request::MdsStatfs { mdt } => {
                return match (self.dirs.get(mdt), self.mdts.get(mdt)) {
                    (Some(d), Some(m)) => Response::Usage(m.usage(d)),
                    _ => Response::error(Errno::NoEnt, format!("MDT {mdt} is not served here")),
                }
            }
            Request::MdsLookup { parent, .. }
            | Request::MdsCreate { parent, .. }
            | Request::MdsCreateGranted { parent, .. }
            | Request::MdsMkdir { parent, .. }
            | Request::MdsSymlink { parent, .. }
            | Request::MdsMknod { parent, .. }
            | Request::MdsUnlink { parent, .. }
            | Request::MdsUnlinkAt { parent, .. }
            | Request::MdsRmdir { parent, .. } => (*parent, None),
            // The new entry's MDT coordinates a rename from a directory on another.
            Request::MdsRename { new_parent, .. } => (*new_parent, None),
            Request::MdsUpdate { mdt, .. } => (Fid::new(*mdt, 0, 0), None),
            Request::MdsFidGrant { mdt, .. } => (Fid::new(*mdt, 0, 0), None),
            Request::MdsUpdateDone { mdt, .. } => (Fid::new(*mdt, 0, 0), None),
            Request::MdsShardSync(s) => (s.fid, None),
            Request::MdsFsckRepair { fix, .. } => (fix.fid(), None),
            Request::MdsAncestors { fid } => (*fid, Some(*fid)),
            Request::MdsUpdateQuery { id } => (Fid::new(id.mdt, 0, 0), None),
            // The entry's MDT coordinates a link to a file on another MDT.
            Request::MdsLink { parent, fid, .. } => (*parent, Some(*fid)),
            Request::MdsMigrate { parent, .. } => (*parent, None),
            Request::MdsGetattr { fid }
            | Request::MdsOpen { fid, .. }
            | Request::MdsReaddir { fid, .. }
            | Request::MdsStatahead { fid, .. }
            | Request::MdsReaddirPlus { fid, .. }
            | Request::MdsSetattr { fid, .. }
            | Request::MdsReadlink { fid }
            | Request::MdsSetxattr { fid, .. }
            | Request::MdsGetxattr { fid, .. }
            | Request::MdsListxattr { fid, .. }
            | Request::MdsRemovexattr { fid, .. }
            | Request::MdsSetDirLayout { fid, .. }
            | Request::MdsLayoutChange { fid, .. }
            | Request::MdsReplaceLayout { fid, .. }
            | Request::MdsDomWrite { fid, .. }
            | Request::MdsDomTrim { fid, .. }
            | Request::MdsDomPunch { fid, .. }
            | Request::MdsDomGetattr { fid }
            | Request::MdsGetDirLayout { fid }
            | Request::MdsSizeUpdate { fid, .. }
            | Request::MdsClose { fid, .. }
            | Request::MdsSetLock { fid, .. }
            | Request::MdsGetLock { fid, .. }
            | Request::MdsReclaimOpen { fid, .. }
            | Request::MdsSync { fid } => (*fid, Some(*fid)),
            other => return Response::error(Errno::Proto, format!("an MDS does not serve {}", other.op_name())),
        };
        let mdt = match self.mdt(target) {
            Ok(m) => m,
            Err(r) => return *r,
        };
        let answer = self.serve(ctx, mdt, target, req).await;
        match (handle, &answer) {
            // An inode gone from here that moved to another MDT (`braid migrate -m`):
            // the client sends the request where it went.
            (Some(fid), Response::Error(e)) if e.code == Errno::NoEnt && fid.mdt() == mdt.index => {
                match mdt.view().and_then(|v| v.moved(fid)) {
                    Ok(Some(to)) => Response::Moved { from: fid, to },
                    _ => answer,
                }
            }
            _ => answer,
        }
    }

    /// Serves `req` on `mdt`, the MDT of its FID `target`.
    async fn serve(&self, ctx: RequestCtx, mdt: &Arc<Mdt>, target: Fid, req: Request) -> Response {
        match req {
            Request::MdsLookup { creds, parent, name } => {
                self.reading_entries(&ctx, mdt, parent).await;
                let found = mdt.view().and_then(|v| v.lookup_entry(&creds, parent, &name));
                match found {
                    Ok(Found::Here(attr)) => Response::Attr(attr),
                    // The child's inode is on another MDT: its attributes from there.
                    Ok(Found::Elsewhere(fid, _)) => self.dne.remote_attr(fid).await,
                    Err(e) => crate::target::op_error(e),
                }
            }
            Request::MdsGetattr { fid } => {
                // A directory's times may wait in its lease holder's changes under
                // way (see the client's `unlink_vetted`): they land first. (A
                // lookup of the directory does not wait: a path walk through it
                // must not cost its holder the lease; its times may then lag the
                // holder's unlinks by their round trip.)
                self.reading_entries(&ctx, mdt, fid).await;
                mdt.read(move |v| Ok(Response::Attr(v.handle_inode(fid)?.attr))).await
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
            Request::MdsSetLock { fid, lock, wait, reclaim } => {
                // After a restart, the locks clients held are theirs again before
                // anyone else's request is looked at (see `crate::recovery`).
                if let (Some(r), false) = (&mdt.recovery, reclaim) {
                    r.wait(&ctx, &self.callbacks).await;
                }
                mdt.set_lock(fid, ctx.client_id, lock, wait && !reclaim).await
            }
            Request::MdsReclaimOpen { fid, handles, write } => {
                let exists = mdt.read(move |v| Ok(Response::Attr(v.must_inode(fid)?.attr))).await;
                if matches!(exists, Response::Error(_)) {
                    return exists;
                }
                mdt.reclaim_open(fid, ctx.client_id, handles, write);
                Response::Ok
            }
            Request::MdsGetLock { fid, lock } => {
                if let Some(r) = &mdt.recovery {
                    r.wait(&ctx, &self.callbacks).await;
                }
                Response::Lock(mdt.locks.lock().expect("locks").conflict(fid, ctx.client_id, &lock))
            }
            Request::MdsReaddir { creds, fid, after, max, shard } => {
                self.reading_entries(&ctx, mdt, fid).await;
                mdt.read(move |v| {
                    let (entries, eof) = v.readdir(&creds, fid, after.as_deref(), max, shard)?;
                    Ok(Response::Dirents { entries, eof })
                })
                .await
            }
            Request::MdsStatahead { creds, fid, after, max } => {
                self.reading_entries(&ctx, mdt, fid).await;
                mdt.read(move |v| {
                    let (entries, last, eof) = v.statahead(&creds, fid, after.as_deref(), max)?;
                    Ok(Response::EntryAttrs { entries, last, eof })
                })
                .await
            }
            Request::MdsReaddirPlus { creds, fid, after, max } => {
                self.reading_entries(&ctx, mdt, fid).await;
                mdt.read(move |v| {
                    let (entries, eof) = v.readdir_plus(&creds, fid, after.as_deref(), max)?;
                    Ok(Response::DirentsPlus { entries, eof })
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
            Request::MdsDomGetattr { fid } => {
                mdt.read(move |v| {
                    v.dom_end(fid)?;
                    Ok(Response::ObjectAttr { size: v.dom_size(fid)?, exists: true })
                })
                .await
            }
            Request::MdsSync { .. } => mdt.submit_own(JobKind::Sync).await,
            Request::MdsUpdateQuery { id } => self.dne.update_query(mdt, id).await,
            Request::MdsAncestors { fid } => {
                mdt.read(move |v| Ok(Response::Ancestors(v.ancestors(fid, crate::dne::WALK_MAX)?))).await
            }
            // A participant's half: durable before the answer (fault points around it).
            req @ Request::MdsUpdate { .. } => {
                if let Some(refused) = self.dne.refuse_update(&req).await {
                    return refused;
                }
                let r = self.mutate(&ctx, mdt, req).await;
                // On disk before the coordinator commits on it (a machine crash must
                // not take back a half the coordinator's entry names).
                if !matches!(r, Response::Error(_)) {
                    mdt.submit_own(JobKind::Sync).await;
                }
                crate::dne::fault_point("update:before-reply");
                r
            }
            req @ Request::MdsUpdateDone { .. } => {
                crate::dne::fault_point("update-done:before-apply");
                self.mutate(&ctx, mdt, req).await
            }
            Request::MdsMkdir { creds, parent, name, mode, lease, spec } => {
                let to = match self.dne.where_to_mkdir(mdt, parent, spec).await {
                    Ok(to) => to,
                    Err(refused) => return refused,
                };
                if to.mdts.len() > 1 {
                    self.across(mdt, ctx, move |dne, cb, m, ctx| async move {
                        dne.mkdir_striped(&cb, &ctx, &m, creds, parent, name, mode, to).await
                    })
                    .await
                } else if to.mdts[0] != mdt.index {
                    self.across(mdt, ctx, move |dne, cb, m, ctx| async move {
                        dne.mkdir_remote(&cb, &ctx, &m, creds, parent, name, mode, (to.mdts[0], to.explicit)).await
                    })
                    .await
                } else {
                    self.mutate(&ctx, mdt, Request::MdsMkdir { creds, parent, name, mode, lease, spec: None }).await
                }
            }
            Request::MdsRename { creds, parent, name, new_parent, new_name, flags } => {
                // A directory moving between directories with several MDTs (either one
                // of an exchange): its loop check may cross them, under the rename lock.
                let is_dir = |dir: Fid, n: &str| {
                    matches!(mdt.view().and_then(|v| v.entry(dir, n)), Ok(Some((_, FileKind::Dir))))
                };
                let dir_moves = parent != new_parent
                    && self.dne.several_mdts()
                    && (is_dir(parent, &name) || (flags.exchange && is_dir(new_parent, &new_name)));
                if parent.mdt() == mdt.index && !dir_moves {
                    let (c, n, nn) = (creds.clone(), name.clone(), new_name.clone());
                    let req = Request::MdsRename { creds: c, parent, name: n, new_parent, new_name: nn, flags };
                    // Done here, unless what it replaces lives on another MDT.
                    if let Ok(r) = self.mutate_here(&ctx, mdt, req).await {
                        return r;
                    }
                }
                self.across(mdt, ctx, move |dne, cb, m, ctx| async move {
                    dne.rename_across(&cb, &ctx, &m, creds, (parent, name), (new_parent, new_name), flags).await
                })
                .await
            }
            Request::MdsMigrate { creds, parent, name, mdt: k } => {
                self.across(mdt, ctx, move |dne, cb, m, ctx| async move {
                    dne.migrate(&cb, &ctx, &m, creds, parent, name, k).await
                })
                .await
            }
            Request::MdsLink { creds, fid, parent, name } if fid.mdt() != mdt.index => {
                self.across(mdt, ctx, move |dne, cb, m, ctx| async move {
                    dne.link_remote(&cb, &ctx, &m, creds, fid, parent, name).await
                })
                .await
            }
            req @ (Request::MdsSetattr { .. }
            | Request::MdsSetxattr { .. }
            | Request::MdsRemovexattr { .. }
            | Request::MdsSetDirLayout { .. }) => {
                let r = self.mutate(&ctx, mdt, req).await;
                // A striped directory's shards take the change before the answer.
                if !matches!(r, Response::Error(_)) {
                    if let Err(e) = self.dne.sync_shards(mdt, target).await {
                        tracing::warn!(%target, "shards of a striped directory not updated yet (retried): {e:?}");
                    }
                }
                r
            }
            Request::MdsUnlink { creds, parent, name } => {
                self.remove(ctx, mdt, creds, parent, name, Removal::Unlink).await
            }
            Request::MdsUnlinkAt { creds, parent, name, at, lease } => {
                self.remove(ctx, mdt, creds, parent, name, Removal::UnlinkAt(at, lease)).await
            }
            Request::MdsRmdir { creds, parent, name } => {
                self.remove(ctx, mdt, creds, parent, name, Removal::Rmdir).await
            }
            mutation => self.mutate(&ctx, mdt, mutation).await,
        }
    }

    /// unlink or rmdir of `name` in `parent`; an entry naming an inode on another MDT
    /// is removed across the MDTs.
    async fn remove(
        &self,
        ctx: RequestCtx,
        mdt: &Arc<Mdt>,
        creds: Creds,
        parent: Fid,
        name: String,
        how: Removal,
    ) -> Response {
        let (c, n) = (creds.clone(), name.clone());
        let req = match how {
            Removal::Unlink => Request::MdsUnlink { creds: c, parent, name: n },
            Removal::UnlinkAt(at, lease) => Request::MdsUnlinkAt { creds: c, parent, name: n, at, lease },
            Removal::Rmdir => Request::MdsRmdir { creds: c, parent, name: n },
        };
        let replay = matches!(how, Removal::UnlinkAt(..));
        match self.mutate_here(&ctx, mdt, req).await {
            Ok(r) => r,
            Err(child) => {
                let op = move |dne: Arc<Dne>, cb: Arc<Callbacks>, m: Arc<Mdt>, ctx: RequestCtx| async move {
                    dne.remove_remote(&cb, &ctx, &m, creds, parent, name, child).await
                };
                match replay {
                    true => self.across_now(mdt, ctx, op).await,
                    false => self.across(mdt, ctx, op).await,
                }
            }
        }
    }

    /// Runs an operation this MDS coordinates across MDTs (see [`crate::dne`]), once
    /// recovery is over, on a task of its own: the caller giving up (an in-process
    /// call's timeout) must not end it half way. A failure of a retry whose first try
    /// did the operation gets the first try's answer.
    async fn across<F, Fut>(&self, mdt: &Arc<Mdt>, ctx: RequestCtx, op: F) -> Response
    where
        F: FnOnce(Arc<Dne>, Arc<Callbacks>, Arc<Mdt>, RequestCtx) -> Fut,
        Fut: std::future::Future<Output = Response> + Send + 'static,
    {
        if let Some(r) = &mdt.recovery {
            r.wait(&ctx, &self.callbacks).await;
        }
        self.across_now(mdt, ctx, op).await
    }

    /// As [`Mds::across`], without waiting for recovery: a lease holder's replay.
    async fn across_now<F, Fut>(&self, mdt: &Arc<Mdt>, ctx: RequestCtx, op: F) -> Response
    where
        F: FnOnce(Arc<Dne>, Arc<Callbacks>, Arc<Mdt>, RequestCtx) -> Fut,
        Fut: std::future::Future<Output = Response> + Send + 'static,
    {
        let m = mdt.clone();
        let fut = op(self.dne.clone(), self.callbacks.clone(), mdt.clone(), ctx.clone());
        uncancelled(async move {
            let r = fut.await;
            answer_of_first_try(&m, &ctx, r)
        })
        .await
    }

    /// Before a client reads the entries of `dir` (a lookup, a listing, an open or a
    /// create by name), a lease another client holds on it is revoked: the holder
    /// may be flushing files it made there whose closes already returned (the
    /// client's `deferred`), and acks only once they are done. After a restart, such
    /// reads wait for what the lease holders of the previous run deferred, as changes
    /// do (see [`crate::recovery`]).
    async fn reading_entries(&self, ctx: &RequestCtx, mdt: &Arc<Mdt>, dir: Fid) {
        if let Some(r) = &mdt.recovery {
            r.wait(ctx, &self.callbacks).await;
        }
        if self.leased_by_other(ctx, mdt, dir) {
            mdt.revoke(dir, &self.callbacks).await;
        }
    }

    /// Whether a client other than the caller holds the lease on `dir`.
    fn leased_by_other(&self, ctx: &RequestCtx, mdt: &Arc<Mdt>, dir: Fid) -> bool {
        mdt.leases().get(dir).is_some_and(|l| l.holder != ctx.client_id || l.conn != ctx.conn_id)
    }

    /// A mutation of one MDT, through its group commit; leases of other clients it
    /// meets are revoked and it is applied again.
    async fn mutate(&self, ctx: &RequestCtx, mdt: &Arc<Mdt>, mutation: Request) -> Response {
        self.mutate_here(ctx, mdt, mutation).await.unwrap_or_else(|fid| {
            Response::error(Errno::XDev, format!("the entry names {fid}, whose inode is on MDT {}", fid.mdt()))
        })
    }

    /// As [`Mds::mutate`]; an entry naming an inode on another MDT comes back as that
    /// inode, with nothing applied (see [`crate::mdt::OpError::Elsewhere`]).
    async fn mutate_here(&self, ctx: &RequestCtx, mdt: &Arc<Mdt>, mutation: Request) -> Result<Response, Fid> {
        let create = matches!(mutation, Request::MdsCreate { .. } | Request::MdsCreateGranted { .. });
        // What a lease holder answered itself is its replay after a restart: it goes
        // ahead of what the recovery holds up (and is what it waits for).
        let replay = matches!(mutation, Request::MdsCreateGranted { .. } | Request::MdsUnlinkAt { .. });
        if let Some(r) = mdt.recovery.as_ref().filter(|_| changes_entries(&mutation) && !replay) {
            r.wait(ctx, &self.callbacks).await;
        }
        if let Request::MdsCreate { parent, .. } | Request::MdsCreateGranted { parent, .. } = &mutation {
            // A create may open an existing entry: a read of the directory too.
            if self.leased_by_other(ctx, mdt, *parent) {
                mdt.revoke(*parent, &self.callbacks).await;
            }
        }
        let mut req = mutation;
        let mut revoked = 0;
        let r = loop {
            let job = JobKind::Client { client_id: ctx.client_id, conn_id: ctx.conn_id, xid: ctx.xid, req };
            match mdt.submit(job).await {
                Outcome::Done(r) => break r,
                Outcome::Elsewhere(fid, _) => return Err(fid),
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
            mdt.opened(attr.fid, ctx.client_id, true, None);
        }
        Ok(r)
    }
}

/// Runs `op` on a task of its own and waits for it: dropping the wait (a caller that
/// gave up) does not stop it half way.
async fn uncancelled(op: impl std::future::Future<Output = Response> + Send + 'static) -> Response {
    tokio::spawn(op).await.unwrap_or_else(|e| Response::error(Errno::Io, format!("the operation's task failed: {e}")))
}

/// Most leases one request revokes before it gives up (a rename touches two
/// directories; a lease once revoked is never granted again).
const REVOKES_MAX: usize = 8;

/// Whether `req` may change a directory's entries (what a directory lease covers).
fn changes_entries(req: &Request) -> bool {
    matches!(
        req,
        Request::MdsCreate { .. }
            | Request::MdsCreateGranted { .. }
            | Request::MdsMkdir { .. }
            | Request::MdsSymlink { .. }
            | Request::MdsMknod { .. }
            | Request::MdsLink { .. }
            | Request::MdsUnlink { .. }
            | Request::MdsUnlinkAt { .. }
            | Request::MdsRmdir { .. }
            | Request::MdsRename { .. }
    )
}

/// How [`Mds::remove`] removes a name.
enum Removal {
    Unlink,
    Rmdir,
    /// An unlink at the client's time, answered under a lease (see
    /// [`Request::MdsUnlinkAt`]).
    UnlinkAt(proto::msg::Timespec, u64),
}
