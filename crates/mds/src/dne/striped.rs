//! Striped directories, the coordinator's side: making one (a FID reserved on each
//! shard's MDT, then every shard made with the whole table, then the entry), removing
//! one (every shard checked empty and held, then the entry), and keeping the copy of
//! the directory's attributes each shard holds (its permissions decide creates there)
//! true to shard 0's: a change is noted in `shard_sync` in the batch that makes it,
//! copied to the shards before the answer, and retried by [`ShardSyncRetry`] after a
//! crash or while an MDT is down.

use std::sync::Arc;
use std::time::Duration;

use proto::msg::{Attr, Creds, DirSpec, DirStripes, Request, Response, ShardSync, UpdateOp};
use proto::{Errno, Fid};
use rpc::server::{Callbacks, RequestCtx};

use super::{ask_all, fault_point, kept, DirPlacement, Dne, Peer, RESOLVE_BATCH};
use crate::commit::{CoordinatedOp, JobKind};
use crate::mdt::Participant;
use crate::target::Mdt;
use crate::workers::Worker;

impl Dne {
    /// A striped directory `name` in `parent` (on this MDS), its shards on the MDTs
    /// of `to` (`mkdir -c N`, root only as [`Dne::mkdir_remote`], or a default): a
    /// FID reserved on each shard's MDT, then every shard made with the whole table,
    /// then the entry. Every shard is a participant's half, on this MDT's too.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn mkdir_striped(
        &self,
        callbacks: &Callbacks,
        ctx: &RequestCtx,
        mdt: &Arc<Mdt>,
        creds: Creds,
        parent: Fid,
        name: String,
        mode: u32,
        to: DirPlacement,
    ) -> Response {
        if let Some(r) = kept(mdt, ctx) {
            return r;
        }
        if to.explicit && creds.uid != 0 {
            return Response::error(Errno::Perm, "only root may make a striped directory");
        }
        let shard_op = match self.new_dir_half(mdt, &creds, parent, &name, mode).await {
            Ok(op) => op,
            Err(r) => return r,
        };
        self.revoke_others(callbacks, mdt, parent, ctx).await;
        let flight = self.begin(mdt.index);
        let (prepared, stripes, made) = match self.make_shards(mdt, flight.id, None, &to, shard_op).await {
            Ok(made) => made,
            Err(r) => return r,
        };
        let Some(child) = made.into_iter().find(|a| a.fid == stripes.master()) else {
            self.tell(mdt.clone(), flight.id, false, prepared);
            return Response::error(Errno::Io, "shard 0 did not answer its attributes");
        };
        let op = CoordinatedOp::Link { creds, parent, name, child };
        self.commit(ctx, mdt, "mkdir-striped", flight, op, prepared).await
    }

    /// Steps 1 of making a striped directory, for operation `id`: a FID reserved on
    /// each MDT of `to` that makes a new shard (all of them, or all but the first when
    /// shard 0 is the existing directory `first`), then each such shard made by
    /// `shard_op` with the whole table. The participants holding their halves, the
    /// table, and the new shards' attributes; on a refusal, the halves already held
    /// are told to go and the refusal is the answer.
    async fn make_shards(
        &self,
        mdt: &Arc<Mdt>,
        id: proto::msg::UpdateId,
        first: Option<Fid>,
        to: &DirPlacement,
        shard_op: UpdateOp,
    ) -> Result<(Vec<(Peer, Participant)>, DirStripes, Vec<Attr>), Response> {
        let new = &to.mdts[usize::from(first.is_some())..];
        let mut peers = Vec::with_capacity(new.len());
        for &k in new {
            peers.push((self.peer(k).await?, k));
        }
        fault_point("mkdir-striped:before-reserve");
        let reserve = |(p, k): &(Peer, u32)| {
            (p.clone(), *k, Request::MdsUpdate { mdt: *k, id, op: Box::new(UpdateOp::ReserveFid) })
        };
        let mut prepared = Vec::new();
        let mut shards: Vec<Fid> = first.into_iter().collect();
        let mut refused = None;
        for ((peer, k), r) in peers.iter().zip(ask_all(peers.iter().map(reserve).collect()).await) {
            match r {
                Response::Reserved(fid) if fid.mdt() == *k => {
                    prepared.push((peer.clone(), Participant { mdt: *k, fid }));
                    shards.push(fid);
                }
                other => refused = refused.or(Some(other)),
            }
        }
        if let Some(r) = refused {
            self.tell(mdt.clone(), id, false, prepared);
            return Err(r);
        }
        let stripes = DirStripes { hash: to.hash, shards };
        fault_point("mkdir-striped:before-update");
        let make = |(peer, p): &(Peer, Participant)| {
            let mut op = shard_op.clone();
            if let UpdateOp::MkdirInode { shard, .. } = &mut op {
                *shard = Some((p.fid, stripes.clone()));
            }
            (peer.clone(), p.mdt, Request::MdsUpdate { mdt: p.mdt, id, op: Box::new(op) })
        };
        let mut made = Vec::new();
        for r in ask_all(prepared.iter().map(make).collect()).await {
            match r {
                Response::Attr(a) => made.push(a),
                other => refused = refused.or(Some(other)),
            }
        }
        if let Some(r) = refused {
            self.tell(mdt.clone(), id, false, prepared);
            return Err(r);
        }
        Ok((prepared, stripes, made))
    }

    /// Stripes the root, empty and not striped yet, over MDT 0 and the next
    /// `count - 1` MDTs (`braid mds --root-stripes N`, a choice made with the file
    /// system): `Ok(true)` once done, or once the root is found striped or not empty
    /// (then it stays as it is, with a warning); `Ok(false)` while too few MDTs are
    /// known.
    pub(crate) async fn stripe_root(&self, mdt: &Arc<Mdt>, count: u32) -> Result<bool, Response> {
        let read = mdt.view().and_then(|v| Ok((v.must_inode(Fid::ROOT)?, v.dir_is_empty(Fid::ROOT)?)));
        let (root, empty) = read.map_err(crate::target::op_error)?;
        if root.attr.stripes.is_some() {
            return Ok(true);
        }
        let mdts = self.mdt_indices(0).await?;
        if mdts.len() < count as usize {
            return Ok(false);
        }
        // Looked at once the MDTs are there: what was made in the root meanwhile
        // decides it (it stays on MDT 0 alone).
        if !empty {
            tracing::warn!("--root-stripes {count}: the root is not empty, it stays on MDT 0 alone");
            return Ok(true);
        }
        let to = DirPlacement { mdts: mdts[..count as usize].to_vec(), hash: Default::default(), explicit: true };
        let a = &root.attr;
        let creds = Creds { uid: a.uid, gid: a.gid, groups: vec![] };
        let dirs_default = mdt.view().ok().and_then(|v| v.dirs_default(Fid::ROOT).ok().flatten());
        let shard_op = UpdateOp::MkdirInode {
            creds,
            parent: Fid::ROOT,
            name: "/".into(),
            mode: a.mode,
            gid: a.gid,
            dir_default: None,
            dirs_default,
            shard: None,
        };
        let flight = self.begin(mdt.index);
        let (prepared, stripes, _) = self.make_shards(mdt, flight.id, Some(Fid::ROOT), &to, shard_op).await?;
        // As a request of this MDS's own, answered once (its reply is kept as any).
        let ctx = RequestCtx {
            client_id: self.identity.client_id,
            xid: flight.id.seq,
            peer: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
            conn_id: rpc::service::IN_PROCESS_CONN,
            from_server: true,
            job: None,
        };
        match self
            .commit(&ctx, mdt, "stripe-root", flight, CoordinatedOp::Stripe { fid: Fid::ROOT, stripes }, prepared)
            .await
        {
            Response::Error(e) => Err(Response::Error(e)),
            _ => {
                tracing::info!(count, "the root is striped over {count} MDTs");
                Ok(true)
            }
        }
    }

    /// The removal of striped directory `name` in `parent` (on this MDS): every shard
    /// checked empty and held (no new entries) on its MDT, then the entry goes.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn rmdir_striped(
        &self,
        callbacks: &Callbacks,
        ctx: &RequestCtx,
        mdt: &Arc<Mdt>,
        creds: Creds,
        (parent, name): (Fid, String),
        attr: Attr,
        stripes: DirStripes,
    ) -> Response {
        self.revoke_others(callbacks, mdt, parent, ctx).await;
        let hold = |&fid: &Fid| (fid.mdt(), fid, UpdateOp::RmdirInode { fid, parent, name: name.clone() });
        let halves = stripes.shards.iter().map(hold).collect();
        let (flight, prepared) = match self.prepare(mdt, "rmdir-striped", halves, || true).await {
            Ok(p) => p,
            Err(r) => return r,
        };
        let op = CoordinatedOp::Unlink { creds, parent, name, child: attr };
        self.commit(ctx, mdt, "rmdir-striped", flight, op, prepared).await
    }
}

impl Dne {
    /// Copies striped directory `fid`'s attributes (on this MDS) to its other shards
    /// if a change is noted in `shard_sync`, and forgets the note once all took it.
    /// One copy at a time per directory, each reading the directory when it starts,
    /// so an earlier state never lands after a later one.
    pub(crate) async fn sync_shards(&self, mdt: &Arc<Mdt>, fid: Fid) -> Result<(), Response> {
        let Ok(Some(_)) = mdt.view().and_then(|v| v.shard_sync_seq(fid)) else { return Ok(()) };
        let lock = self.syncing.lock().expect("shard syncs").entry(fid).or_default().clone();
        let held = lock.lock().await;
        let read = mdt.view().and_then(|v| Ok((v.shard_sync_note(fid)?, v.inode(fid)?, v.dirs_default(fid)?)));
        let r = match read {
            Ok((Some(note), Some(ino), dirs_default)) => self.push_shards(mdt, note, ino, dirs_default).await,
            // The directory went (removed with its shards): nothing to copy.
            Ok((Some((seq, _)), None, _)) => {
                mdt.submit_own(JobKind::ShardSynced { fid, seq }).await;
                Ok(())
            }
            Ok((None, ..)) => Ok(()),
            Err(e) => Err(crate::target::op_error(e)),
        };
        drop(held);
        let mut syncing = self.syncing.lock().expect("shard syncs");
        if syncing.get(&fid).is_some_and(|l| Arc::strong_count(l) == 2) {
            syncing.remove(&fid);
        }
        r
    }

    async fn push_shards(
        &self,
        mdt: &Arc<Mdt>,
        (seq, times): (u64, bool),
        ino: crate::inode::Inode,
        dirs_default: Option<DirSpec>,
    ) -> Result<(), Response> {
        let master = ino.attr.fid;
        let Some(stripes) = ino.attr.stripes.as_ref().filter(|s| s.master() == master) else { return Ok(()) };
        let mut pushes = Vec::new();
        for &fid in stripes.shards.iter().skip(1) {
            let a = &ino.attr;
            let sync = ShardSync {
                fid,
                master,
                mode: a.mode,
                uid: a.uid,
                gid: a.gid,
                times: times.then_some((a.atime, a.mtime)),
                dir_default: ino.dir_default.clone(),
                dirs_default,
            };
            pushes.push((self.peer(fid.mdt()).await?, fid.mdt(), Request::MdsShardSync(sync)));
        }
        if let Some(refused) = ask_all(pushes).await.into_iter().find(|r| *r != Response::Ok) {
            return Err(refused);
        }
        mdt.submit_own(JobKind::ShardSynced { fid: master, seq }).await;
        Ok(())
    }
}

/// Copies to their shards the attributes of striped directories whose change a
/// crash or a down MDT kept from them (see [`Dne::sync_shards`]).
pub struct ShardSyncRetry {
    pub mdt: Arc<Mdt>,
    pub dne: Arc<Dne>,
    pub every: Duration,
}

impl Worker for ShardSyncRetry {
    const NAME: &'static str = "shard-sync";

    fn period(&self) -> Duration {
        self.every
    }

    fn eager(&self) -> bool {
        true
    }

    async fn tick(&mut self) {
        let due = match self.mdt.view().and_then(|v| v.shard_syncs(RESOLVE_BATCH)) {
            Ok(d) => d,
            Err(e) => return tracing::warn!(mdt = self.mdt.index, "cannot list shard syncs: {e}"),
        };
        for fid in due {
            if let Err(e) = self.dne.sync_shards(&self.mdt, fid).await {
                tracing::debug!(mdt = self.mdt.index, %fid, "shards not updated yet: {e:?}");
            }
        }
    }
}

/// Stripes the root at the file system's start (see [`Dne::stripe_root`]), trying
/// until enough MDTs are up, then idle.
pub struct RootStripe {
    pub mdt: Arc<Mdt>,
    pub dne: Arc<Dne>,
    pub count: u32,
    pub done: bool,
}

impl Worker for RootStripe {
    const NAME: &'static str = "root-stripe";

    fn period(&self) -> Duration {
        Duration::from_millis(500)
    }

    fn eager(&self) -> bool {
        true
    }

    async fn tick(&mut self) {
        if self.done {
            return;
        }
        match self.dne.stripe_root(&self.mdt, self.count).await {
            Ok(done) => self.done = done,
            Err(e) => tracing::debug!("the root is not striped yet: {e:?}"),
        }
    }
}
