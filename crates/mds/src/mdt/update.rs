//! Both halves of a namespace operation that spans two MDTs: a directory entry on
//! one (the coordinator, which holds the parent directory) naming an inode on
//! another (the participant). Today: `mkdir -i K` (a remote directory) and the rmdir
//! of one, a hard link into a directory on another MDT, the unlink of such a link,
//! and the rename of a file between directories on different MDTs (the coordinator
//! makes the new entry, the participant removes the old one, keeping its half under
//! the FID of the file, which may be on a third MDT's sequence).
//!
//! The protocol is presumed abort, with the participant asking (see the MDS's `dne`
//! module for the coordinator's steps and `docs/design.md` for the argument):
//! 1. the participant applies its half and records it in `updates` as pending, in
//!    one batch (durable before it answers);
//! 2. the coordinator applies its half, the entry, in one batch with the client's
//!    reply (so a retried call gets the first answer) and a [`Decision`] record
//!    saying the operation committed;
//! 3. the coordinator tells the participant the verdict, which then keeps or takes
//!    back its half and forgets the pending record; once the participant has
//!    answered, the coordinator forgets its decision.
//!
//! A participant left with a pending update (the verdict was lost, or the
//! coordinator died) asks the coordinator ([`View::decision`]): no decision once
//! the operation is no longer under way means it aborted. A pending record also
//! keeps other operations spanning MDTs off its inode until it is settled.
use proto::msg::{
    Attr, Creds, DirSpec, DirStripes, FileKind, InodeCopy, Response, Timespec, UpdateId, UpdateOp, UpdateState,
};
use proto::{Errno, Fid};

use super::error::{fail, OpResult};
use super::schema::{
    check_name, decision_id, decision_key, dentry_key, dentry_value, Decision, Participant, PendingOp, PendingUpdate,
    Tbl,
};
use super::view::View;
use super::writer::{Placement, Writer};
use crate::commit::now_secs;
use crate::inode::{sticky_allows_attr, Inode};
use std::ops::Deref;
use store::memtable::MemTable;

impl<M: Deref<Target = MemTable>> View<M> {
    /// The operation spanning MDTs that `fid` is part of on this MDT, if undecided.
    pub fn pending(&self, fid: Fid) -> OpResult<Option<PendingUpdate>> {
        self.with(Tbl::Updates, &fid.to_key(), |v| Ok(store::decode_record::<PendingUpdate>(v)?))
    }

    /// Directory `fid`'s default for the directories made in it, if it has one (a
    /// value that does not parse is none: it was checked when set).
    pub fn dirs_default(&self, fid: Fid) -> OpResult<Option<DirSpec>> {
        let v = self.with(Tbl::Xattrs, &dentry_key(fid, DirSpec::XATTR), |v| Ok(v.to_vec()))?;
        Ok(v.and_then(|v| DirSpec::from_xattr(&v).ok()))
    }

    /// The change count of striped directory `fid`'s attributes not yet copied to
    /// its shards, if any.
    pub fn shard_sync_seq(&self, fid: Fid) -> OpResult<Option<u64>> {
        Ok(self.shard_sync_note(fid)?.map(|n| n.0))
    }

    /// The note of striped directory `fid`'s change not yet copied to its shards:
    /// its change count, and whether a change set its times (only then are they
    /// copied: a shard's own times are newer when it took entries since).
    pub fn shard_sync_note(&self, fid: Fid) -> OpResult<Option<(u64, bool)>> {
        Ok(self
            .with(Tbl::ShardSync, &fid.to_key(), |v| {
                let seq = v.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
                Ok(seq.map(|s| (s, v.get(8) == Some(&1))))
            })?
            .flatten())
    }

    /// Striped directories whose shards have not all taken their attributes yet, at
    /// most `max`.
    pub fn shard_syncs(&self, max: usize) -> OpResult<Vec<Fid>> {
        let mut out = Vec::new();
        for row in self.scan(Tbl::ShardSync, std::ops::Bound::Unbounded)?.take(max) {
            out.extend(Fid::from_key(&row?.0));
        }
        Ok(out)
    }

    /// The directories above `fid` (its `..`, that one's, ...) as far as they are on
    /// this MDT, then the first that is not (or the root), at most `max`.
    /// A directory whose move across MDTs is undecided has a `..` that may be about
    /// to change: the walk stops with `EAGAIN` (the caller asks again).
    pub fn ancestors(&self, fid: Fid, max: usize) -> OpResult<Vec<Fid>> {
        let mut out = Vec::new();
        let mut at = fid;
        while out.len() < max && at != Fid::ROOT && at.mdt() == fid.mdt() {
            self.check_not_moving(at)?;
            match self.inode(at)?.and_then(|i| i.parent) {
                Some(p) => {
                    out.push(p);
                    at = p;
                }
                None => break,
            }
        }
        Ok(out)
    }

    /// Fails with `EAGAIN` if directory `dir` of this MDT is moving between
    /// directories across MDTs, undecided yet (its `..` may be about to change).
    pub fn check_not_moving(&self, dir: Fid) -> OpResult<()> {
        match self.pending(dir)? {
            Some(p)
                if matches!(
                    p.op,
                    PendingOp::MoveDir { .. }
                        | PendingOp::SetParent { .. }
                        | PendingOp::Exchange { .. }
                        | PendingOp::Adopted { .. }
                        | PendingOp::Released { .. }
                ) =>
            {
                fail(Errno::Again, format!("directory {dir} is moving between MDTs"))
            }
            _ => Ok(()),
        }
    }

    /// Every undecided update on this MDT: (inode, update).
    pub fn pending_all(&self, max: usize) -> OpResult<Vec<(Fid, PendingUpdate)>> {
        self.pending_after(None, max)
    }

    /// Undecided updates of inodes after `after` (from the first for `None`), in FID
    /// order, at most `max`.
    pub fn pending_after(&self, after: Option<Fid>, max: usize) -> OpResult<Vec<(Fid, PendingUpdate)>> {
        let key = after.map(|f| f.to_key());
        let from = key.as_ref().map_or(std::ops::Bound::Unbounded, |k| std::ops::Bound::Excluded(&k[..]));
        let mut out = Vec::new();
        for row in self.scan(Tbl::Updates, from)?.take(max) {
            let (k, v) = row?;
            if let Some(fid) = Fid::from_key(&k) {
                out.push((fid, store::decode_record::<PendingUpdate>(&v)?));
            }
        }
        Ok(out)
    }

    /// The coordinator's answer to a participant (the caller has checked that the
    /// operation is not under way): committed if its decision is kept.
    pub fn update_state(&self, id: UpdateId) -> OpResult<UpdateState> {
        Ok(match self.decision(id)? {
            Some(_) => UpdateState::Committed,
            None => UpdateState::Aborted,
        })
    }

    /// The decision kept for operation `id`, which this MDT coordinated.
    pub fn decision(&self, id: UpdateId) -> OpResult<Option<Decision>> {
        self.with(Tbl::Decisions, &decision_key(id), |v| Ok(store::decode_record::<Decision>(v)?))
    }

    /// Decisions whose participants have not all answered yet, at most `max`.
    pub fn decisions(&self, max: usize) -> OpResult<Vec<(UpdateId, Decision)>> {
        let mut out = Vec::new();
        for row in self.scan(Tbl::Decisions, std::ops::Bound::Unbounded)?.take(max) {
            let (k, v) = row?;
            if let Some(id) = decision_id(&k) {
                out.push((id, store::decode_record::<Decision>(&v)?));
            }
        }
        Ok(out)
    }
}

impl Writer<'_> {
    /// The participant's half: applies `op` and records it as pending (step 1).
    pub(super) fn update(
        &mut self,
        id: UpdateId,
        op: &UpdateOp,
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        // The shards of a striped directory are halves on every MDT they go on, the
        // coordinator's own included.
        // So is the copy of a directory migrating to the coordinator's own MDT.
        let shard_op = matches!(
            op,
            UpdateOp::ReserveFid
                | UpdateOp::MkdirInode { shard: Some(_), .. }
                | UpdateOp::RmdirInode { .. }
                | UpdateOp::Adopt { .. }
        );
        if id.mdt == self.mdt_index && !shard_op {
            return fail(Errno::Inval, "an update names this MDT as its own coordinator");
        }
        match op {
            UpdateOp::ReserveFid => {
                let fid = self.new_fid()?;
                self.put_pending(fid, id, PendingOp::Reserved, fid, "")?;
                Ok(Response::Reserved(fid))
            }
            UpdateOp::MkdirInode { creds, parent, name, mode, gid, dir_default, dirs_default, shard } => {
                // A shard has no entry of its own: the name only says what it is for
                // (the root's, striped at the file system's start, has none).
                if shard.is_none() {
                    check_name(name)?;
                }
                if parent.mdt() != id.mdt {
                    return fail(Errno::Inval, format!("directory {parent} is not on the coordinator MDT {}", id.mdt));
                }
                if let Some(spec) = dir_default {
                    spec.validate().map_err(|e| super::error::OpError::Errno(Errno::Inval, e.to_string()))?;
                }
                let (fid, stripes) = match shard {
                    Some((fid, stripes)) => {
                        self.check_reserved(*fid, id, stripes)?;
                        (*fid, Some(stripes.clone()))
                    }
                    None => (self.new_fid()?, None),
                };
                let mut ino = Inode::new(fid, FileKind::Dir, *mode, creds, *gid, now);
                // A shard's `..` is the directory users see (shard 0), so a walk up
                // from an entry of any shard meets it.
                ino.parent = match &stripes {
                    Some(s) if s.master() != fid => Some(s.master()),
                    _ => Some(*parent),
                };
                ino.dir_default = dir_default.clone();
                ino.attr.stripes = stripes.map(Box::new);
                self.put_inode(fid, &ino)?;
                if let Some(d) = dirs_default {
                    self.put(Tbl::Xattrs, &dentry_key(fid, DirSpec::XATTR), &d.to_xattr())?;
                }
                self.put_pending(fid, id, PendingOp::Mkdir, *parent, name)?;
                Ok(Response::Attr(ino.attr))
            }
            UpdateOp::RmdirInode { fid, parent, name } => {
                if parent.mdt() != id.mdt {
                    return fail(Errno::Inval, format!("directory {parent} is not on the coordinator MDT {}", id.mdt));
                }
                let ino = self.must_local_inode(*fid)?;
                if ino.attr.kind != FileKind::Dir {
                    return fail(Errno::NotDir, format!("{fid} is not a directory"));
                }
                // A shard other than 0 hangs below shard 0, whose entry is in `parent`.
                let shard_of = ino.attr.stripes.as_ref().map(|s| s.master()).filter(|&m| m != *fid);
                if ino.parent != Some(*parent) && (shard_of.is_none() || ino.parent != shard_of) {
                    return fail(Errno::Inval, format!("{fid} is not a subdirectory of {parent}"));
                }
                if self.view.pending(*fid)?.is_some() {
                    return fail(Errno::Again, format!("{fid} is part of another operation across MDTs"));
                }
                if !self.view.dir_is_empty(*fid)? {
                    return fail(Errno::NotEmpty, format!("{name} is not empty"));
                }
                self.put_pending(*fid, id, PendingOp::Rmdir, *parent, name)?;
                Ok(Response::Ok)
            }
            UpdateOp::LinkInode { fid, parent, name } | UpdateOp::UnlinkInode { fid, parent, name } => {
                check_name(name)?;
                if parent.mdt() != id.mdt {
                    return fail(Errno::Inval, format!("directory {parent} is not on the coordinator MDT {}", id.mdt));
                }
                let mut ino = self.must_local_inode(*fid)?;
                if ino.attr.kind == FileKind::Dir {
                    return fail(
                        Errno::Perm,
                        format!("{fid} is a directory: hard links to directories are not allowed"),
                    );
                }
                if self.view.pending(*fid)?.is_some() {
                    return fail(Errno::Again, format!("{fid} is part of another operation across MDTs"));
                }
                let link = matches!(op, UpdateOp::LinkInode { .. });
                if link {
                    if ino.attr.nlink == 0 {
                        return fail(Errno::NoEnt, format!("{fid} has no name left"));
                    }
                    if ino.attr.nlink >= super::create::LINK_MAX {
                        return fail(Errno::Range, "too many links");
                    }
                    // Counted now, so the inode cannot lose its last link meanwhile.
                    ino.attr.nlink += 1;
                    ino.attr.ctime = now;
                    self.put_inode(*fid, &ino)?;
                }
                let pending = if link { PendingOp::Link } else { PendingOp::Unlink };
                self.put_pending(*fid, id, pending, *parent, name)?;
                Ok(Response::Attr(ino.attr))
            }
            UpdateOp::RemoveEntry { creds, parent, name, child, dir_to } => {
                check_name(name)?;
                if parent.mdt() != self.mdt_index {
                    return fail(Errno::Inval, format!("directory {parent} is not on MDT {}", self.mdt_index));
                }
                let dir = self.view.dir_for(creds, *parent, name, true)?;
                if self.view.entry(*parent, name)? != Some((child.fid, child.kind)) {
                    return fail(Errno::NoEnt, format!("{name} changed while it was renamed"));
                }
                if (child.kind == FileKind::Dir) != dir_to.is_some() {
                    return fail(Errno::Inval, "a directory moves to a directory, anything else does not");
                }
                if !sticky_allows_attr(&dir, child, creds) {
                    return fail(Errno::Perm, "sticky directory: not the owner");
                }
                // Another client's lease on the directory goes now: none is granted
                // again, so the verdict's removal meets none.
                self.check_lease(Tbl::Dentries, &dentry_key(*parent, name))?;
                if self.view.pending(child.fid)?.is_some() {
                    return fail(Errno::Again, format!("{} is part of another operation across MDTs", child.fid));
                }
                let op = dir_to.map_or(PendingOp::RemoveEntry, |to| PendingOp::MoveDir { to });
                self.put_pending(child.fid, id, op, *parent, name)?;
                Ok(Response::Ok)
            }
            UpdateOp::ExchangeEntry { creds, parent, name, child, with, to } => {
                check_name(name)?;
                if parent.mdt() != self.mdt_index || to.mdt() != id.mdt {
                    return fail(
                        Errno::Inval,
                        format!("{parent} is not on MDT {} or {to} on {}", self.mdt_index, id.mdt),
                    );
                }
                let dir = self.view.dir_for(creds, *parent, name, true)?;
                if self.view.entry(*parent, name)? != Some((child.fid, child.kind)) {
                    return fail(Errno::NoEnt, format!("{name} changed while it was exchanged"));
                }
                if !sticky_allows_attr(&dir, child, creds) {
                    return fail(Errno::Perm, "sticky directory: not the owner");
                }
                self.check_lease(Tbl::Dentries, &dentry_key(*parent, name))?;
                if self.view.pending(child.fid)?.is_some() {
                    return fail(Errno::Again, format!("{} is part of another operation across MDTs", child.fid));
                }
                let op = PendingOp::Exchange { with: with.fid, kind: with.kind, own: child.kind, to: *to };
                self.put_pending(child.fid, id, op, *parent, name)?;
                Ok(Response::Ok)
            }
            UpdateOp::Adopt { parent, name, from, copy } => self.adopt(id, *parent, name, *from, copy),
            UpdateOp::Release { fid, parent, name, to } => self.release(id, (*fid, *parent, name), *to, place),
            UpdateOp::ReleasedTo { fid, to } => self.released_to(id, *fid, *to),
            UpdateOp::SetParent { fid, from, to } => {
                let ino = self.must_local_inode(*fid)?;
                if ino.attr.kind == FileKind::Dir && ino.parent != Some(*from) {
                    return fail(Errno::Inval, format!("{fid} is not a subdirectory of {from}"));
                }
                if self.view.pending(*fid)?.is_some() {
                    return fail(Errno::Again, format!("{fid} is part of another operation across MDTs"));
                }
                self.put_pending(*fid, id, PendingOp::SetParent { to: *to }, *from, "")?;
                Ok(Response::Ok)
            }
        }
    }

    /// The participant's half of `braid migrate -m`: inode `from` (entry `name` in
    /// `parent`, on the coordinator) made again here under a new FID from `copy`:
    /// extended attributes included, a directory's entries (this MDT's
    /// subdirectories among them name the copy as their `..`, and `from` again if
    /// the coordinator does not commit), a file's DoM bytes; a file's layout names
    /// its OST objects by the FID they have (`Layout::objects`).
    fn adopt(&mut self, id: UpdateId, parent: Fid, name: &str, from: Fid, copy: &InodeCopy) -> OpResult<Response> {
        check_name(name)?;
        if parent.mdt() != id.mdt || from.mdt() == self.mdt_index {
            return fail(Errno::Inval, format!("{parent} is not on the coordinator MDT {} or {from} is here", id.mdt));
        }
        let dir = copy.attr.kind == FileKind::Dir;
        let plain = match dir {
            true => copy.symlink.is_none() && copy.dom.is_empty(),
            false => copy.attr.nlink == 1 && copy.entries.is_empty() && copy.dir_default.is_none(),
        };
        if !plain || copy.attr.stripes.is_some() || copy.attr.fid != from {
            return fail(Errno::Inval, format!("not a copy of plain directory or single-link inode {from}"));
        }
        if let Some(spec) = &copy.dir_default {
            spec.validate().map_err(|e| super::error::OpError::Errno(Errno::Inval, e.to_string()))?;
        }
        let mut attr = copy.attr.clone();
        let dom_end = attr.layout.as_ref().and_then(|l| l.dom_end()).unwrap_or(0);
        let block = super::dom::DOM_BLOCK;
        if copy.dom.iter().any(|(i, b)| b.len() as u64 > block || i.saturating_add(1).saturating_mul(block) > dom_end) {
            return fail(Errno::Inval, format!("the DoM bytes of the copy of {from} pass its DoM component"));
        }
        if let Some(layout) = &mut attr.layout {
            layout.validate().map_err(|e| super::error::OpError::Errno(Errno::Inval, e.to_string()))?;
            layout.objects = layout.objects.or(Some(from.into()));
        }
        // Everything checked before anything is written.
        let mut subdirs = Vec::new();
        for (entry, child, kind) in &copy.entries {
            check_name(entry)?;
            if *kind == FileKind::Dir && child.mdt() == self.mdt_index {
                let sub = self.must_local_inode(*child)?;
                if sub.parent != Some(from) {
                    return fail(Errno::Again, format!("{entry} ({child}) moved while {name} was copied"));
                }
                if self.view.pending(*child)?.is_some() {
                    return fail(Errno::Again, format!("{child} is part of another operation across MDTs"));
                }
                subdirs.push((*child, sub));
            }
        }
        let fid = self.new_fid()?;
        attr.fid = fid;
        let ino = Inode {
            attr,
            symlink: copy.symlink.clone(),
            dir_default: copy.dir_default.clone(),
            parent: dir.then_some(parent),
        };
        self.put_inode(fid, &ino)?;
        for (x, value) in &copy.xattrs {
            self.put(Tbl::Xattrs, &dentry_key(fid, x), value)?;
        }
        for (entry, child, kind) in &copy.entries {
            self.put(Tbl::Dentries, &dentry_key(fid, entry), &dentry_value(*child, *kind))?;
        }
        for (block, bytes) in &copy.dom {
            self.put_block(fid, *block, bytes)?;
        }
        for (child, mut sub) in subdirs {
            sub.parent = Some(fid);
            self.put_inode(child, &sub)?;
        }
        self.put_pending(fid, id, PendingOp::Adopted { from }, parent, name)?;
        Ok(Response::Attr(ino.attr))
    }

    /// The participant's half of `braid migrate -m` of a remote inode: `fid` (here;
    /// its entry `name` in `parent` on the coordinator) takes no change until the
    /// verdict, and what it takes along is the answer. A directory's subdirectories
    /// must all be on MDT `to` already (their `..` moves there), and other clients'
    /// leases on it go first; a file must have one link and be open nowhere.
    fn release(
        &mut self,
        id: UpdateId,
        (fid, parent, name): (Fid, Fid, &str),
        to: u32,
        place: &Placement<'_>,
    ) -> OpResult<Response> {
        check_name(name)?;
        if parent.mdt() != id.mdt || to == self.mdt_index {
            return fail(
                Errno::Inval,
                format!("{parent} is not on the coordinator MDT {} or MDT {to} is this one", id.mdt),
            );
        }
        let ino = self.must_local_inode(fid)?;
        if ino.attr.stripes.is_some() {
            return fail(Errno::Inval, format!("{fid} is a striped directory"));
        }
        let dir = ino.attr.kind == FileKind::Dir;
        if dir && ino.parent != Some(parent) {
            return fail(Errno::Again, format!("{fid} is no longer a subdirectory of {parent}"));
        }
        if !dir {
            check_movable(&ino, place)?;
        }
        if self.view.pending(fid)?.is_some() {
            return fail(Errno::Again, format!("{fid} is part of another operation across MDTs"));
        }
        if dir {
            self.check_lease(Tbl::Dentries, &dentry_key(fid, ""))?;
        }
        let copy = self.view.inode_copy(fid)?;
        if let Some((entry, child, _)) = copy.entries.iter().find(|(_, c, k)| *k == FileKind::Dir && c.mdt() != to) {
            return fail(
                Errno::XDev,
                format!("{name}/{entry} is a directory on MDT {}, not on MDT {to}: migrate it first", child.mdt()),
            );
        }
        for (_, child, _) in &copy.entries {
            if self.view.pending(*child)?.is_some_and(|p| p.parent == fid) {
                return fail(Errno::Again, format!("an entry of {name} is part of another operation across MDTs"));
            }
        }
        self.put_pending(fid, id, PendingOp::Released { to: None }, parent, name)?;
        Ok(Response::InodeCopy(Box::new(copy)))
    }

    /// The coordinator tells where the copy of released directory `fid` is.
    fn released_to(&mut self, id: UpdateId, fid: Fid, to: Fid) -> OpResult<Response> {
        match self.view.pending(fid)? {
            Some(p) if p.id == id && matches!(p.op, PendingOp::Released { .. }) => {
                self.put_pending(fid, id, PendingOp::Released { to: Some(to) }, p.parent, &p.name)?;
                Ok(Response::Ok)
            }
            _ => fail(Errno::Inval, format!("{fid} was not released by this operation")),
        }
    }

    /// An inode moved away as `to`: requests naming `fid` are sent there, for
    /// [`MOVED_KEEP_SECS`].
    pub(crate) fn note_moved(&mut self, fid: Fid, to: Fid) -> OpResult<()> {
        self.put(Tbl::Moved, &fid.to_key(), &super::schema::moved_value(to, now_secs()))
    }

    /// Drops inode `fid` of this MDT with a directory's entries (their inodes stay: a
    /// copy's entries name them) and without a file's OST objects (a copy's layout
    /// names them): a released inode once its copy committed, or an adopted copy
    /// once it aborted. With `restore`, this MDT's subdirectories that name `fid` as
    /// their `..` name `restore` again.
    fn drop_with_entries(&mut self, fid: Fid, restore: Option<Fid>) -> OpResult<()> {
        let prefix = fid.to_key();
        let entries = self
            .view
            .scan_prefix(Tbl::Dentries, &prefix)?
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())))
            .collect::<OpResult<Vec<_>>>()?;
        for (k, v) in entries {
            let (child, kind) = super::schema::decode_dentry(&v)?;
            if let Some(from) = restore.filter(|_| kind == FileKind::Dir && child.mdt() == self.mdt_index) {
                if let Some(mut sub) = self.view.inode(child)?.filter(|s| s.parent == Some(fid)) {
                    sub.parent = Some(from);
                    self.put_inode(child, &sub)?;
                }
            }
            self.del(Tbl::Dentries, &k)?;
        }
        if let Some(ino) = self.view.inode(fid)? {
            self.forget_inode(fid, &ino)?;
        }
        Ok(())
    }

    /// Checks that `fid`, a shard of the table `stripes`, was reserved on this MDT by
    /// operation `id` and has no inode yet.
    fn check_reserved(&self, fid: Fid, id: UpdateId, stripes: &DirStripes) -> OpResult<()> {
        stripes.validate().map_err(|e| super::error::OpError::Errno(Errno::Inval, e))?;
        if !stripes.shards.contains(&fid) || fid.mdt() != self.mdt_index {
            return fail(Errno::Inval, format!("{fid} is not a shard of this MDT in the table"));
        }
        match self.view.pending(fid)? {
            Some(p) if p.id == id && p.op == PendingOp::Reserved && self.view.inode(fid)?.is_none() => Ok(()),
            _ => fail(Errno::Inval, format!("{fid} was not reserved by this operation")),
        }
    }

    /// An inode of this MDT was renamed from directory `from` to `to`: its ctime
    /// moves (as a local rename's), a directory's `..` follows (unless it moved again
    /// meanwhile). An inode elsewhere is left to its MDT.
    pub(crate) fn renamed(&mut self, fid: Fid, from: Fid, to: Fid) -> OpResult<()> {
        if fid.mdt() != self.mdt_index {
            return Ok(());
        }
        if let Some(mut ino) = self.view.inode(fid)? {
            if ino.attr.kind == FileKind::Dir && ino.parent == Some(from) {
                ino.parent = Some(to);
            }
            ino.attr.ctime = Timespec::now();
            self.put_inode(fid, &ino)?;
        }
        Ok(())
    }

    /// Inode `fid`, which must be on this MDT.
    fn must_local_inode(&self, fid: Fid) -> OpResult<Inode> {
        if fid.mdt() != self.mdt_index {
            return fail(Errno::Inval, format!("{fid} is not on MDT {}", self.mdt_index));
        }
        self.view.must_inode(fid)
    }

    fn put_pending(&mut self, fid: Fid, id: UpdateId, op: PendingOp, parent: Fid, name: &str) -> OpResult<()> {
        let p = PendingUpdate { id, op, parent, name: name.to_string(), at: now_secs() };
        self.put(Tbl::Updates, &fid.to_key(), &store::encode_record(&p))
    }

    /// The participant learns the verdict (step 3): a committed mkdir keeps its inode,
    /// an aborted one loses it; a committed rmdir removes the inode, an aborted one
    /// lets new entries in again; an aborted link and a committed unlink take a link
    /// away (the last one as an unlink does). A verdict on an update already settled
    /// (or on another one) changes nothing.
    pub(crate) fn update_done(
        &mut self,
        fid: Fid,
        id: UpdateId,
        committed: bool,
        place: &Placement<'_>,
    ) -> OpResult<Response> {
        let Some(p) = self.view.pending(fid)? else { return Ok(Response::Ok) };
        if p.id != id {
            return Ok(Response::Ok);
        }
        self.del(Tbl::Updates, &fid.to_key())?;
        if p.op == PendingOp::Reserved {
            // Never used: the FID is not handed out again, the inode count goes back.
            self.inodes_delta -= 1;
            return Ok(Response::Ok);
        }
        if let PendingOp::RemoveEntry | PendingOp::MoveDir { .. } = p.op {
            if committed && self.view.entry(p.parent, &p.name)?.is_some_and(|(f, _)| f == fid) {
                self.del(Tbl::Dentries, &dentry_key(p.parent, &p.name))?;
                let moved_dir = matches!(p.op, PendingOp::MoveDir { .. });
                if let Some(mut dir) = self.view.inode(p.parent)? {
                    self.touch_dir(p.parent, &mut dir, Timespec::now(), -i32::from(moved_dir))?;
                }
            }
            if committed {
                let to = match p.op {
                    PendingOp::MoveDir { to } => to,
                    _ => p.parent,
                };
                self.renamed(fid, p.parent, to)?;
            }
            return Ok(Response::Ok);
        }
        if let PendingOp::Exchange { with, kind, own, to } = p.op {
            if committed && self.view.entry(p.parent, &p.name)?.is_some_and(|(f, _)| f == fid) {
                self.put(Tbl::Dentries, &dentry_key(p.parent, &p.name), &dentry_value(with, kind))?;
                let links = |k: FileKind| i32::from(k == FileKind::Dir);
                let delta = links(kind) - links(own);
                if let Some(mut dir) = self.view.inode(p.parent)? {
                    self.touch_dir(p.parent, &mut dir, Timespec::now(), delta)?;
                }
                self.renamed(fid, p.parent, to)?;
                self.renamed(with, to, p.parent)?;
            }
            return Ok(Response::Ok);
        }
        if let PendingOp::Adopted { from } = p.op {
            if !committed {
                self.drop_with_entries(fid, Some(from))?;
            }
            return Ok(Response::Ok);
        }
        if let PendingOp::Released { to } = p.op {
            if committed {
                self.drop_with_entries(fid, None)?;
                if let Some(to) = to {
                    self.note_moved(fid, to)?;
                }
            }
            return Ok(Response::Ok);
        }
        if let PendingOp::SetParent { to } = p.op {
            if committed {
                self.renamed(fid, p.parent, to)?;
            }
            return Ok(Response::Ok);
        }
        let Some(mut ino) = self.view.inode(fid)? else { return Ok(Response::Ok) };
        match (p.op, committed) {
            (PendingOp::Mkdir, false) | (PendingOp::Rmdir, true) => self.drop_inode(fid, &ino)?,
            (PendingOp::Link, false) | (PendingOp::Unlink, true) => {
                let now = Timespec::now();
                ino.attr.nlink = ino.attr.nlink.saturating_sub(1);
                if ino.attr.nlink == 0 {
                    // With the grace of a rename's victim (it may be one): a reader
                    // that found the name an instant before still opens it.
                    self.release_last_link(fid, &mut ino, place, now, true)?;
                } else {
                    ino.attr.ctime = now;
                    self.put_inode(fid, &ino)?;
                }
            }
            _ => {}
        }
        Ok(Response::Ok)
    }

    /// The coordinator records that operation `id` committed (step 2, in the batch
    /// of its half).
    pub(crate) fn decide(&mut self, id: UpdateId, participants: Vec<Participant>) -> OpResult<()> {
        let d = Decision { participants, at: now_secs() };
        self.put(Tbl::Decisions, &decision_key(id), &store::encode_record(&d))
    }

    /// Every participant of `id` knows the verdict: the decision goes.
    pub(crate) fn forget_decision(&mut self, id: UpdateId) -> OpResult<()> {
        self.del(Tbl::Decisions, &decision_key(id))
    }

    /// The coordinator's half of a remote mkdir or link (step 2): the entry for the
    /// inode the participant made or linked, checked again (the name may have been
    /// taken meanwhile).
    pub(crate) fn link_remote_entry(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        child: &Attr,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        let mut dir = self.view.dir_for(creds, parent, name, true)?;
        if self.view.entry(parent, name)?.is_some() {
            return fail(Errno::Exist, format!("{name} exists"));
        }
        self.put(Tbl::Dentries, &dentry_key(parent, name), &dentry_value(child.fid, child.kind))?;
        if child.kind == FileKind::Dir {
            self.touch_dir(parent, &mut dir, now, 1)?;
            return Ok(Response::DirMade { attr: child.clone(), parent: dir.attr.clone(), lease: None });
        }
        self.touch_dir(parent, &mut dir, now, 0)?;
        Ok(Response::Attr(child.clone()))
    }

    /// The coordinator's half of `braid migrate -m` (step 2): if inode `old`, entry
    /// `name` in `parent`, is still as `copy` says, is open nowhere and no entry of it
    /// is part of an operation across MDTs, the entry names `moved` (the
    /// participant's copy), this MDT's subdirectories of `old` name it as their `..`,
    /// and `old` goes with its entries (a file's OST objects stay: the copy names
    /// them). The parent's link count and times do not change: nothing moved in the
    /// namespace. Anything changed answers `EAGAIN` (the caller copies again).
    pub(crate) fn migrate_entry(
        &mut self,
        (parent, name): (Fid, &str),
        old: Fid,
        copy: &InodeCopy,
        moved: &Attr,
        place: &Placement<'_>,
    ) -> OpResult<Response> {
        let again = |why: &str| fail(Errno::Again, format!("{name}: {why} while it was migrated; try again"));
        let kind = copy.attr.kind;
        if self.view.entry(parent, name)? != Some((old, kind)) {
            return again("its entry changed");
        }
        if moved.kind != kind || moved.fid.mdt() == self.mdt_index {
            return fail(Errno::Inval, format!("{} is not a copy on another MDT", moved.fid));
        }
        if self.held_by_another(old)? {
            return again("it was part of another operation across MDTs");
        }
        if self.view.inode_copy(old)? != *copy {
            return again("it changed");
        }
        let ino = self.view.must_inode(old)?;
        if kind != FileKind::Dir {
            check_movable(&ino, place)?;
        }
        for (entry, child, _) in &copy.entries {
            // A rename's source half, say, holds the entry under the child's FID:
            // its verdict would look for the entry here.
            if self.view.pending(*child)?.is_some_and(|p| p.parent == old) {
                return again(&format!("its entry {entry} was part of another operation across MDTs"));
            }
        }
        for (entry, child, kind) in &copy.entries {
            if *kind == FileKind::Dir && child.mdt() == self.mdt_index {
                if let Some(mut sub) = self.view.inode(*child)?.filter(|s| s.parent == Some(old)) {
                    sub.parent = Some(moved.fid);
                    self.put_inode(*child, &sub)?;
                }
            }
            self.del(Tbl::Dentries, &dentry_key(old, entry))?;
        }
        self.forget_inode(old, &ino)?;
        self.note_moved(old, moved.fid)?;
        self.put(Tbl::Dentries, &dentry_key(parent, name), &dentry_value(moved.fid, kind))?;
        Ok(Response::Attr(moved.clone()))
    }

    /// The coordinator's half of `braid migrate -m` of a remote inode (step 2): entry
    /// `name` in `parent`, if it still names `old`, names `moved` (the copy the
    /// participant made; `old`'s MDT holds it unchanged until the verdict).
    pub(crate) fn migrate_remote_entry(
        &mut self,
        (parent, name): (Fid, &str),
        old: Fid,
        moved: &Attr,
    ) -> OpResult<Response> {
        if self.view.entry(parent, name)? != Some((old, moved.kind)) {
            return fail(Errno::Again, format!("{name}: its entry changed while it was migrated; try again"));
        }
        if moved.fid == old {
            return fail(Errno::Inval, format!("{} is not a copy of {old}", moved.fid));
        }
        self.put(Tbl::Dentries, &dentry_key(parent, name), &dentry_value(moved.fid, moved.kind))?;
        Ok(Response::Attr(moved.clone()))
    }

    /// The coordinator's half of striping directory `fid` where it is (step 2): it
    /// must be empty, not striped yet, and shard 0 of the table.
    pub(crate) fn stripe_empty_dir(&mut self, fid: Fid, stripes: &DirStripes) -> OpResult<Response> {
        stripes.validate().map_err(|e| super::error::OpError::Errno(Errno::Inval, e))?;
        let mut ino = self.view.must_inode(fid)?;
        if ino.attr.kind != FileKind::Dir || stripes.master() != fid || ino.attr.stripes.is_some() {
            return fail(Errno::Inval, format!("{fid} cannot become shard 0 of this table"));
        }
        if !self.view.dir_is_empty(fid)? {
            return fail(Errno::NotEmpty, format!("{fid} is not empty"));
        }
        ino.attr.stripes = Some(Box::new(stripes.clone()));
        self.put_inode(fid, &ino)?;
        Ok(Response::Attr(ino.attr))
    }

    /// The coordinator's half of the removal of an entry naming an inode on another
    /// MDT (step 2): the entry goes, if it still names `child`.
    pub(crate) fn unlink_remote_entry(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        child: &Attr,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        let mut dir = self.view.dir_for(creds, parent, name, true)?;
        match self.view.entry(parent, name)? {
            Some((fid, kind)) if fid == child.fid && kind == child.kind => {}
            _ => return fail(Errno::NoEnt, format!("{name} changed while it was removed")),
        }
        if self.held_by_another(child.fid)? {
            // A rename across MDTs holds this entry: it waits for the verdict.
            return fail(Errno::Again, format!("{name} is part of another operation across MDTs"));
        }
        if !sticky_allows_attr(&dir, child, creds) {
            return fail(Errno::Perm, "sticky directory: not the owner");
        }
        self.del(Tbl::Dentries, &dentry_key(parent, name))?;
        let links = if child.kind == FileKind::Dir { -1 } else { 0 };
        self.touch_dir(parent, &mut dir, now, links)?;
        Ok(Response::DirChanged { dir: dir.attr.clone() })
    }
}

/// Whether file (or symlink, or special file) `ino` may move to another MDT: one
/// link (`EMLINK`: the other names would still name it here) and open on no client
/// (`EBUSY`: its handles name it here); it is then marked leaving, so no client
/// opens it until the batch is applied.
fn check_movable(ino: &Inode, place: &Placement<'_>) -> OpResult<()> {
    let fid = ino.attr.fid;
    if ino.attr.nlink != 1 {
        return fail(Errno::MLink, format!("{fid} has {} links: it stays on its MDT", ino.attr.nlink));
    }
    if !(place.leave)(fid) {
        return fail(Errno::Busy, format!("{fid} is open: it stays on its MDT until it is closed"));
    }
    Ok(())
}
