//! Renames across MDTs, the coordinator's side (the MDT of the new entry): when the
//! old entry is on another MDT (that MDT removes it, a participant's half), when the
//! inode a rename replaces is on another MDT (that MDT unlinks or removes it), and
//! when a directory moves between directories in a file system of several MDTs (its
//! own MDT moves its `..` when the inode is on neither of the others).
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
use tokio::sync::OwnedMutexGuard;

use super::{ask, kept, Dne, Peer};
use crate::commit::CoordinatedOp;
use crate::mdt::view::Found;
use crate::mdt::Victim;
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
    remote: Option<(Peer, u64)>,
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
                let _ = ask(&peer, 0, &Request::MdsRenameLock { hold: false, holder }).await;
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

    /// A rename to `new_name` in `new_parent` (on this MDS, the coordinator) that
    /// spans MDTs: the old entry on another MDT, a directory moving between
    /// directories in a file system of several MDTs (under the rename lock, checked
    /// not to go below itself), or an inode replaced that lives on another MDT. The
    /// participants: the old entry's MDT (it removes the entry, and a directory's
    /// `..` if the inode is there), a moving directory's own MDT when it is neither
    /// (its `..`), and the replaced inode's MDT when it is another (it unlinks or
    /// removes it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn rename_across(
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
            return self.exchange_across(callbacks, ctx, mdt, creds, (parent, name), (new_parent, new_name)).await;
        }
        let here = mdt.index;
        let child = match self.entry_attr(mdt, &creds, parent, &name).await {
            Ok(a) => a,
            Err(r) => return r,
        };
        if child.stripes.as_ref().is_some_and(|s| s.master() != child.fid) {
            return Response::error(Errno::Inval, format!("{name} is a shard"));
        }
        let is_dir = child.kind == FileKind::Dir;
        let moves_dir = is_dir && parent != new_parent;
        let lock = if moves_dir {
            match self.rename_lock().await {
                Ok(l) => Some(l),
                Err(r) => return r,
            }
        } else {
            None
        };
        if moves_dir {
            match self.is_above(mdt, child.fid, new_parent).await {
                Ok(true) => return Response::error(Errno::Inval, "cannot move a directory into itself"),
                Ok(false) => {}
                Err(r) => return r,
            }
        }
        // What the new name holds, checked here before any participant holds anything.
        let checked = mdt.view().and_then(|v| {
            crate::mdt::schema::check_name(&new_name)?;
            let dir = v.dir_for(&creds, new_parent, &new_name, true)?;
            let target = v.entry(new_parent, &new_name)?;
            let moving = (child.fid, child.kind);
            Ok((v.rename_victim(&creds, &dir, (&new_name, target), moving, flags.noreplace, None)?, dir))
        });
        // The inode the new name holds now: the commit finds it still there, or stops.
        let replaced = match &checked {
            Ok((Victim::Here(t, _) | Victim::Elsewhere(t, _) | Victim::Striped(t, _), _)) => Some(*t),
            _ => None,
        };
        // What the rename takes away on other MDTs: inodes, and their kinds.
        let victims: Vec<(Fid, FileKind)> = match checked {
            // Both names are links to the same inode: nothing to do (POSIX).
            Ok((Victim::Same, _)) => return Response::Ok,
            Ok((Victim::Elsewhere(t, kind), dir)) => match self.remote_victim(&creds, &dir, t).await {
                Ok(Some(s)) => s.shards.iter().map(|&f| (f, FileKind::Dir)).collect(),
                Ok(None) => vec![(t, kind)],
                Err(r) => return r,
            },
            // Every shard of a striped directory, shard 0 here too.
            Ok((Victim::Striped(_, s), _)) => s.shards.iter().map(|&f| (f, FileKind::Dir)).collect(),
            Ok(_) => vec![],
            Err(e) => return crate::target::op_error(e),
        };
        self.revoke_others(callbacks, mdt, new_parent, ctx).await;
        if parent.mdt() == here {
            self.revoke_others(callbacks, mdt, parent, ctx).await;
        }
        let (a, x) = (parent.mdt(), child.fid.mdt());
        let mut halves = Vec::new();
        if a != here {
            let dir_to = is_dir.then_some(new_parent);
            let op = UpdateOp::RemoveEntry {
                creds: creds.clone(),
                parent,
                name: name.clone(),
                child: child.clone(),
                dir_to,
            };
            halves.push((a, child.fid, op));
        }
        if x != a && x != here {
            // The inode's own MDT moves its ctime and a directory's `..`.
            halves.push((x, child.fid, UpdateOp::SetParent { fid: child.fid, from: parent, to: new_parent }));
        }
        for (t, kind) in victims {
            let (parent, name) = (new_parent, new_name.clone());
            let op = match kind {
                FileKind::Dir => UpdateOp::RmdirInode { fid: t, parent, name },
                _ => UpdateOp::UnlinkInode { fid: t, parent, name },
            };
            halves.push((t.mdt(), t, op));
        }
        let in_time = || lock.as_ref().is_none_or(|l| !l.expired());
        let (flight, prepared) = match self.prepare(mdt, "rename", halves, in_time).await {
            Ok(p) => p,
            Err(r) => return r,
        };
        let noreplace = flags.noreplace;
        let op = CoordinatedOp::Rename { creds, parent, name, new_parent, new_name, child, replaced, noreplace };
        let r = self.commit(ctx, mdt, "rename", flight, op, prepared).await;
        drop(lock);
        r
    }

    /// The attributes of the inode entry `name` in `parent` names (wherever the entry
    /// and the inode are).
    async fn entry_attr(&self, mdt: &Arc<Mdt>, creds: &Creds, parent: Fid, name: &str) -> Result<Attr, Response> {
        if parent.mdt() != mdt.index {
            let peer = self.peer(parent.mdt()).await?;
            let lookup = Request::MdsLookup { creds: creds.clone(), parent, name: name.to_string() };
            return match ask(&peer, parent.mdt(), &lookup).await {
                Response::Attr(a) => Ok(a),
                other => Err(other),
            };
        }
        match mdt.view().and_then(|v| v.lookup_entry(creds, parent, name)) {
            Ok(Found::Here(a)) => Ok(a),
            Ok(Found::Elsewhere(fid, _)) => match self.remote_attr(fid).await {
                Response::Attr(a) => Ok(a),
                other => Err(other),
            },
            Err(e) => Err(crate::target::op_error(e)),
        }
    }

    /// Checks what can be checked here of `t`, an inode on another MDT a rename
    /// replaces in `dir`: removable by the caller if the directory is sticky (its
    /// MDT checks the rest: a directory's emptiness). A striped directory's table.
    async fn remote_victim(
        &self,
        creds: &Creds,
        dir: &crate::inode::Inode,
        t: Fid,
    ) -> Result<Option<proto::msg::DirStripes>, Response> {
        let attr = match self.remote_attr(t).await {
            Response::Attr(a) => a,
            other => return Err(other),
        };
        if !crate::inode::sticky_allows_attr(dir, &attr, creds) {
            return Err(Response::error(Errno::Perm, "sticky directory: not the owner of the target"));
        }
        Ok(attr.stripes.map(|s| *s))
    }

    /// `renameat2(RENAME_EXCHANGE)` of `name` in `parent` and `new_name` in
    /// `new_parent` (on this MDS), across MDTs: the first entry's MDT swaps it (when it
    /// is another), the inodes' own MDTs move their ctimes and `..` (when they are
    /// neither), and directories changing directories are checked under the rename
    /// lock not to go below themselves.
    async fn exchange_across(
        &self,
        callbacks: &Callbacks,
        ctx: &RequestCtx,
        mdt: &Arc<Mdt>,
        creds: Creds,
        (parent, name): (Fid, String),
        (new_parent, new_name): (Fid, String),
    ) -> Response {
        let (a, b) = match (
            self.entry_attr(mdt, &creds, parent, &name).await,
            self.entry_attr(mdt, &creds, new_parent, &new_name).await,
        ) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(r), _) | (_, Err(r)) => return r,
        };
        if a.fid == b.fid {
            return Response::Ok;
        }
        let moves_dirs = parent != new_parent && (a.kind == FileKind::Dir || b.kind == FileKind::Dir);
        let lock = if moves_dirs {
            match self.rename_lock().await {
                Ok(l) => Some(l),
                Err(r) => return r,
            }
        } else {
            None
        };
        for (dir, into) in [(&a, new_parent), (&b, parent)] {
            if moves_dirs && dir.kind == FileKind::Dir {
                match self.is_above(mdt, dir.fid, into).await {
                    Ok(true) => return Response::error(Errno::Inval, "cannot move a directory into itself"),
                    Ok(false) => {}
                    Err(r) => return r,
                }
            }
        }
        // The owners a sticky directory asks for, of inodes on other MDTs, here.
        let (here, first) = (mdt.index, parent.mdt());
        let sides = [(new_parent, &b), (parent, &a)];
        for (dir, ino) in sides.into_iter().filter(|(d, i)| d.mdt() == here && i.fid.mdt() != here) {
            let sticky =
                mdt.view().and_then(|v| Ok(crate::inode::sticky_allows_attr(&v.must_inode(dir)?, ino, &creds)));
            match sticky {
                Ok(true) => {}
                Ok(false) => return Response::error(Errno::Perm, "sticky directory: not the owner"),
                Err(e) => return crate::target::op_error(e),
            }
        }
        self.revoke_others(callbacks, mdt, new_parent, ctx).await;
        if first == here {
            self.revoke_others(callbacks, mdt, parent, ctx).await;
        }
        let mut halves = Vec::new();
        if first != here {
            let op = UpdateOp::ExchangeEntry {
                creds: creds.clone(),
                parent,
                name: name.clone(),
                child: a.clone(),
                with: Box::new(b.clone()),
                to: new_parent,
            };
            halves.push((first, a.fid, op));
        }
        // The inodes' own MDTs move their ctimes and `..`, each held pending until the
        // verdict (the first entry's half holds `a`'s inode when it is on its MDT).
        for (ino, from, to) in [(&a, parent, new_parent), (&b, new_parent, parent)] {
            let k = ino.fid.mdt();
            if k != here && (k != first || ino.fid != a.fid) {
                halves.push((k, ino.fid, UpdateOp::SetParent { fid: ino.fid, from, to }));
            }
        }
        let in_time = || lock.as_ref().is_none_or(|l| !l.expired());
        let (flight, prepared) = match self.prepare(mdt, "exchange", halves, in_time).await {
            Ok(p) => p,
            Err(r) => return r,
        };
        let op = CoordinatedOp::Exchange { creds, a: (parent, name, a), b: (new_parent, new_name, b) };
        let r = self.commit(ctx, mdt, "exchange", flight, op, prepared).await;
        drop(lock);
        r
    }
}
