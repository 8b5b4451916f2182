//! Renames across MDTs, the coordinator's side (the MDT of the new entry):
//! - a file between directories on different MDTs: the old entry's MDT removes it
//!   (a participant's half), this MDT makes the new one;
//! - a directory between directories, in a file system of several MDTs: its old
//!   entry's MDT and its own MDT (its `..`) participate where they are not this one.
//!
//! A directory move must not put a directory below itself. On one MDT the check and
//! the move are one batch; across MDTs the walk up from the new parent crosses MDTs
//! ([`Request::MdsAncestors`]), and two moves checked at once could each pass and
//! together cut a cycle off the root. So every directory move between directories in
//! a file system of several MDTs holds the file system's rename lock (Lustre's BFL,
//! kept by the MDS of MDT 0) from its walk to its commit. A holder keeps it at most
//! [`RENAME_LOCK_LEASE`] (then the MDS of MDT 0 takes it back, and a holder that is
//! that late gives up before committing); a restarted MDS of MDT 0 grants it to
//! nobody for that long, so a holder from before the restart has finished or given
//! up. Files and renames within one directory need no lock: they cannot make a cycle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::msg::{Attr, Creds, FileKind, RenameFlags, Request, Response, UpdateOp};
use proto::{Errno, Fid};
use rpc::server::{Callbacks, RequestCtx};
use rpc::RpcClient;
use tokio::sync::OwnedMutexGuard;

use super::{ask, ask_all, fault_point, kept, Dne};
use crate::commit::CoordinatedOp;
use crate::mdt::{OpError, Participant};
use crate::target::Mdt;

/// Longest a directory move holds the rename lock: well within a peer's timeout
/// ([`super::PEER_TIMEOUT`]), so a request for it that waits out a restarted MDS of
/// MDT 0 (it grants nothing for this long) is still answered; a move takes
/// milliseconds.
pub const RENAME_LOCK_LEASE: Duration = Duration::from_secs(5);

/// How long the MDS of MDT 0 lets a request for the rename lock wait before it
/// answers EAGAIN (the holder's RPC layer asks again).
const RENAME_LOCK_WAIT: Duration = Duration::from_secs(3);

/// Most directories a loop check walks up through.
pub const WALK_MAX: usize = 4096;

/// The rename lock as the MDS of MDT 0 keeps it: one mutex, held by a local
/// coordinator's guard or, for a coordinator on another MDS, by the guard kept here
/// under its holder id until given back or its lease ends.
pub(super) struct Bfl {
    lock: Arc<tokio::sync::Mutex<()>>,
    remote: Mutex<HashMap<u64, OwnedMutexGuard<()>>>,
    /// No grant before then: a restarted MDS of MDT 0 waits out a lease a holder
    /// of its previous run may still be in (a freshly formatted one need not).
    from: Instant,
}

impl Bfl {
    pub(super) fn new(restarted: bool) -> Bfl {
        let from = Instant::now() + if restarted { RENAME_LOCK_LEASE } else { Duration::ZERO };
        Bfl { lock: Arc::default(), remote: Mutex::default(), from }
    }

    async fn take(&self) -> Result<OwnedMutexGuard<()>, Response> {
        tokio::time::sleep_until(self.from.into()).await;
        tokio::time::timeout(RENAME_LOCK_WAIT, self.lock.clone().lock_owned())
            .await
            .map_err(|_| Response::error(Errno::Again, "the rename lock is busy"))
    }
}

/// A held rename lock; given back when dropped.
pub(crate) struct RenameLock {
    _local: Option<OwnedMutexGuard<()>>,
    remote: Option<(Arc<RpcClient>, u64)>,
    since: Instant,
}

impl RenameLock {
    /// Whether the lease may have ended: too late to commit under it.
    fn expired(&self) -> bool {
        self.since.elapsed() + Duration::from_secs(1) > RENAME_LOCK_LEASE
    }
}

impl Drop for RenameLock {
    fn drop(&mut self) {
        if let Some((peer, holder)) = self.remote.take() {
            tokio::spawn(async move {
                let _ = peer.call(&Request::MdsRenameLock { hold: false, holder }, vec![]).await;
            });
        }
    }
}

impl Dne {
    /// Whether the file system has several MDTs, as this MDS knows it.
    pub(crate) fn several_mdts(&self) -> bool {
        self.cluster.read().expect("cluster view").config.as_ref().is_some_and(|c| c.mdts.len() > 1)
    }

    /// Takes the file system's rename lock, here or from the MDS of MDT 0.
    async fn rename_lock(&self) -> Result<RenameLock, Response> {
        if self.serves_mdt0 {
            let g = self.bfl.take().await?;
            return Ok(RenameLock { _local: Some(g), remote: None, since: Instant::now() });
        }
        let peer = self.peer(0).await?;
        let holder = self.next_seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match ask(&peer, 0, &Request::MdsRenameLock { hold: true, holder }).await {
            Response::Ok => Ok(RenameLock { _local: None, remote: Some((peer, holder)), since: Instant::now() }),
            other => Err(other),
        }
    }

    /// The MDS of MDT 0 takes the rename lock for `holder` on another MDS, or takes
    /// it back.
    pub(crate) async fn rename_lock_for(&self, hold: bool, holder: u64) -> Response {
        if !self.serves_mdt0 {
            return Response::error(Errno::Inval, "the rename lock is kept by the MDS of MDT 0");
        }
        if !hold {
            self.bfl.remote.lock().expect("rename lock").remove(&holder);
            return Response::Ok;
        }
        let g = match self.bfl.take().await {
            Ok(g) => g,
            Err(r) => return r,
        };
        self.bfl.remote.lock().expect("rename lock").insert(holder, g);
        let bfl = Arc::downgrade(&self.bfl);
        tokio::spawn(async move {
            tokio::time::sleep(RENAME_LOCK_LEASE).await;
            if let Some(b) = bfl.upgrade() {
                if b.remote.lock().expect("rename lock").remove(&holder).is_some() {
                    tracing::warn!(holder, "a rename lock holder did not give it back in time");
                }
            }
        });
        Response::Ok
    }

    /// Whether `dir` is `start` or one of the directories above it (walking `..` up
    /// to the root, across MDTs).
    async fn is_above(&self, mdt: &Arc<Mdt>, dir: Fid, start: Fid) -> Result<bool, Response> {
        let mut at = start;
        let mut steps = 0;
        loop {
            if at == dir {
                return Ok(true);
            }
            if at == Fid::ROOT || steps > WALK_MAX {
                return Ok(false);
            }
            let chain = if at.mdt() == mdt.index {
                match mdt.view().and_then(|v| v.ancestors(at, WALK_MAX)) {
                    Ok(c) => c,
                    Err(e) => return Err(crate::target::op_error(e)),
                }
            } else {
                let peer = self.peer(at.mdt()).await?;
                match ask(&peer, at.mdt(), &Request::MdsAncestors { fid: at }).await {
                    Response::Ancestors(c) => c,
                    other => return Err(other),
                }
            };
            let Some(&last) = chain.last() else {
                return Err(Response::error(Errno::Io, format!("directory {at} has no `..`")));
            };
            if chain.contains(&dir) {
                return Ok(true);
            }
            steps += chain.len();
            at = last;
        }
    }

    /// A rename of `name` in `parent` (on another MDT, the participant, which removes
    /// the entry) to `new_name` in `new_parent` (on this MDS, which makes the new
    /// one). A directory goes to [`Dne::rename_dir`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn rename_remote(
        &self,
        callbacks: &Callbacks,
        ctx: &RequestCtx,
        mdt: &Arc<Mdt>,
        creds: Creds,
        (parent, name): (Fid, String),
        (new_parent, new_name): (Fid, String),
        flags: RenameFlags,
    ) -> Response {
        if let Some(r) = kept(mdt, ctx) {
            return r;
        }
        if flags.exchange {
            return Response::error(
                Errno::XDev,
                "exchanging entries of directories on different MDTs is not supported yet",
            );
        }
        let k = parent.mdt();
        let peer = match self.peer(k).await {
            Ok(p) => p,
            Err(r) => return r,
        };
        let lookup = Request::MdsLookup { creds: creds.clone(), parent, name: name.clone() };
        let child = match ask(&peer, k, &lookup).await {
            Response::Attr(a) => a,
            other => return other,
        };
        if child.kind == FileKind::Dir {
            return self
                .rename_dir(callbacks, ctx, mdt, creds, (parent, name), (new_parent, new_name), flags, child)
                .await;
        }
        let (c, n, moving, here) = (creds.clone(), new_name.clone(), child.fid, mdt.index);
        let checked = mdt
            .read(move |v| {
                crate::mdt::schema::check_name(&n)?;
                let dir = v.dir_for(&c, new_parent, &n, true)?;
                let refused = |code, why: String| Err(OpError::Errno(code, why));
                match v.entry(new_parent, &n)? {
                    Some((t, _)) if t == moving => Ok(Response::Ok),
                    Some((_, FileKind::Dir)) => refused(Errno::IsDir, format!("{n} is a directory")),
                    Some(_) if flags.noreplace => refused(Errno::Exist, format!("{n} exists")),
                    Some((t, _)) if t.mdt() != here => {
                        refused(Errno::XDev, "replacing a link to a file on another MDT is not supported yet".into())
                    }
                    _ => Ok(Response::Attr(dir.attr)),
                }
            })
            .await;
        match checked {
            // Both names are links to the same file: nothing to do (POSIX).
            Response::Ok => return Response::Ok,
            Response::Attr(_) => {}
            other => return other,
        }
        let op = UpdateOp::RemoveEntry { creds: creds.clone(), parent, name, child: child.clone(), dir_to: None };
        let fid = child.fid;
        let entry = move |half: &Response| match half {
            Response::Ok => Some((
                CoordinatedOp::RenameIn {
                    creds,
                    parent: new_parent,
                    name: new_name,
                    child,
                    noreplace: flags.noreplace,
                },
                fid,
            )),
            _ => None,
        };
        self.coordinate(callbacks, ctx, mdt, ("rename-remote", new_parent, k), op, entry).await
    }

    /// Directory `child` moving from `name` in `parent` to `new_name` in `new_parent`
    /// (on this MDS), in a file system of several MDTs: under the rename lock, checked
    /// not to go below itself, then applied here with the MDT of the old entry and the
    /// directory's own MDT as participants where they are others.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn rename_dir(
        &self,
        callbacks: &Callbacks,
        ctx: &RequestCtx,
        mdt: &Arc<Mdt>,
        creds: Creds,
        (parent, name): (Fid, String),
        (new_parent, new_name): (Fid, String),
        flags: RenameFlags,
        child: Attr,
    ) -> Response {
        if let Some(r) = kept(mdt, ctx) {
            return r;
        }
        if flags.exchange {
            return Response::error(Errno::XDev, "exchanging directories between directories is not supported yet");
        }
        if child.stripes.as_ref().is_some_and(|s| s.master() != child.fid) {
            return Response::error(Errno::Inval, format!("{name} is a shard"));
        }
        let lock = match self.rename_lock().await {
            Ok(l) => l,
            Err(r) => return r,
        };
        match self.is_above(mdt, child.fid, new_parent).await {
            Ok(true) => return Response::error(Errno::Inval, "cannot move a directory into itself"),
            Ok(false) => {}
            Err(r) => return r,
        }
        let (c, n, moving, noreplace) = (creds.clone(), new_name.clone(), child.fid, flags.noreplace);
        let checked = mdt.read(move |v| v.check_dir_target(&c, new_parent, &n, moving, noreplace)).await;
        match checked {
            // The same directory under both names cannot be: nothing to do.
            Response::Ok => return Response::Ok,
            Response::Attr(_) => {}
            other => return other,
        }
        self.revoke_others(callbacks, mdt, new_parent, ctx).await;
        let (a, x, here) = (parent.mdt(), child.fid.mdt(), mdt.index);
        let mut halves = Vec::new();
        if a != here {
            let op = UpdateOp::RemoveEntry {
                creds: creds.clone(),
                parent,
                name: name.clone(),
                child: child.clone(),
                dir_to: Some(new_parent),
            };
            halves.push((a, op));
        }
        if x != a && x != here {
            halves.push((x, UpdateOp::SetParent { fid: child.fid, from: parent, to: new_parent }));
        }
        let mut peers = Vec::with_capacity(halves.len());
        for (k, _) in &halves {
            match self.peer(*k).await {
                Ok(p) => peers.push(p),
                Err(r) => return r,
            }
        }
        let flight = self.begin(here);
        let id = flight.id;
        fault_point("rename-dir:before-update");
        let sends = halves
            .iter()
            .zip(&peers)
            .map(|((k, op), p)| (p.clone(), *k, Request::MdsUpdate { mdt: *k, id, op: op.clone() }));
        let mut prepared = Vec::new();
        let mut refused = None;
        for (((k, _), peer), r) in halves.iter().zip(&peers).zip(ask_all(sends.collect()).await) {
            match r {
                Response::Ok => prepared.push((peer.clone(), Participant { mdt: *k, fid: child.fid })),
                other => refused = refused.or(Some(other)),
            }
        }
        if refused.is_none() && lock.expired() {
            refused = Some(Response::error(Errno::Again, "the rename lock's lease ran out"));
        }
        if let Some(r) = refused {
            self.tell(mdt.clone(), id, false, prepared);
            return r;
        }
        let op =
            CoordinatedOp::RenameDir { creds, parent, name, new_parent, new_name, child, noreplace: flags.noreplace };
        let r = self.commit(ctx, mdt, "rename-dir", flight, op, prepared).await;
        drop(lock);
        r
    }
}
