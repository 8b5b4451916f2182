//! Both halves of a namespace operation that spans two MDTs: a directory entry on
//! one (the coordinator, which holds the parent directory) naming an inode on
//! another (the participant). Today: `mkdir -i K` (a remote directory) and the rmdir
//! of one.
//!
//! The protocol is presumed abort, with the participant asking (see the MDS's `dne`
//! module for the coordinator's steps and `docs/design.md` for the argument):
//! 1. the participant applies its half and records it in `updates` as pending, in
//!    one batch (durable before it answers);
//! 2. the coordinator applies its half, the entry, in one batch with the client's
//!    reply (so a retried call gets the first answer);
//! 3. the coordinator tells the participant the verdict, which then keeps or takes
//!    back its half and forgets the pending record.
//!
//! The entry is the commit record: an update is committed exactly when the
//! coordinator's directory holds (mkdir) or no longer holds (rmdir) an entry for
//! the inode once the operation is no longer under way. So the coordinator logs
//! nothing of its own; a participant left with a pending update (the verdict was
//! lost, or the coordinator died) asks the coordinator
//! ([`View::update_state`]) and settles it the same way.
use proto::msg::{Creds, DirDefault, FileKind, Response, Timespec, UpdateId, UpdateOp, UpdateState};
use proto::{Errno, Fid};

use super::error::{fail, OpResult};
use super::schema::{check_name, decode_dentry, dentry_key, dentry_value, PendingOp, PendingUpdate, Tbl};
use super::view::View;
use super::writer::Writer;
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
    pub fn dirs_default(&self, fid: Fid) -> OpResult<Option<DirDefault>> {
        let v = self.with(Tbl::Xattrs, &dentry_key(fid, DirDefault::XATTR), |v| Ok(v.to_vec()))?;
        Ok(v.and_then(|v| DirDefault::from_xattr(&v).ok()))
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

    /// The coordinator's answer to a participant: whether directory `parent` holds an
    /// entry for inode `fid` (the caller has checked that the operation is not under
    /// way). A directory that is gone holds nothing.
    pub fn update_state(&self, parent: Fid, fid: Fid) -> OpResult<UpdateState> {
        let prefix = parent.to_key();
        for row in self.scan_prefix(Tbl::Dentries, &prefix)? {
            let (_, v) = row?;
            if decode_dentry(&v)?.0 == fid {
                return Ok(UpdateState::Present);
            }
        }
        Ok(UpdateState::Absent)
    }
}

impl Writer<'_> {
    /// The participant's half: applies `op` and records it as pending (step 1).
    pub(super) fn update(&mut self, id: UpdateId, op: &UpdateOp, now: Timespec) -> OpResult<Response> {
        if id.mdt == self.mdt_index {
            return fail(Errno::Inval, "an update names this MDT as its own coordinator");
        }
        match op {
            UpdateOp::MkdirInode { creds, parent, name, mode, gid, dir_default, dirs_default } => {
                check_name(name)?;
                if parent.mdt() != id.mdt {
                    return fail(Errno::Inval, format!("directory {parent} is not on the coordinator MDT {}", id.mdt));
                }
                if let Some(spec) = dir_default {
                    spec.validate().map_err(|e| super::error::OpError::Errno(Errno::Inval, e.to_string()))?;
                }
                let fid = self.new_fid()?;
                let mut ino = Inode::new(fid, FileKind::Dir, *mode, creds, *gid, now);
                ino.parent = Some(*parent);
                ino.dir_default = dir_default.clone();
                self.put_inode(fid, &ino)?;
                if let Some(d) = dirs_default {
                    self.put(Tbl::Xattrs, &dentry_key(fid, DirDefault::XATTR), &d.to_xattr())?;
                }
                self.put_pending(fid, id, PendingOp::Mkdir, *parent, name)?;
                Ok(Response::Attr(ino.attr))
            }
            UpdateOp::RmdirInode { fid, parent, name } => {
                if parent.mdt() != id.mdt {
                    return fail(Errno::Inval, format!("directory {parent} is not on the coordinator MDT {}", id.mdt));
                }
                let ino = self.view.must_inode(*fid)?;
                if ino.attr.kind != FileKind::Dir {
                    return fail(Errno::NotDir, format!("{fid} is not a directory"));
                }
                if ino.parent != Some(*parent) {
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
        }
    }

    fn put_pending(&mut self, fid: Fid, id: UpdateId, op: PendingOp, parent: Fid, name: &str) -> OpResult<()> {
        let p = PendingUpdate { id, op, parent, name: name.to_string(), at: now_secs() };
        self.put(Tbl::Updates, &fid.to_key(), &store::encode_record(&p))
    }

    /// The participant learns the verdict (step 3): a committed mkdir keeps its inode,
    /// an aborted one loses it; a committed rmdir removes the inode, an aborted one
    /// lets new entries in again. A verdict on an update already settled (or on
    /// another one) changes nothing.
    pub(crate) fn update_done(&mut self, fid: Fid, id: UpdateId, committed: bool) -> OpResult<Response> {
        let Some(p) = self.view.pending(fid)? else { return Ok(Response::Ok) };
        if p.id != id {
            return Ok(Response::Ok);
        }
        self.del(Tbl::Updates, &fid.to_key())?;
        let drop = match p.op {
            PendingOp::Mkdir => !committed,
            PendingOp::Rmdir => committed,
        };
        if drop {
            if let Some(ino) = self.view.inode(fid)? {
                self.drop_inode(fid, &ino)?;
            }
        }
        Ok(Response::Ok)
    }

    /// The coordinator's half of a remote mkdir (step 2): the entry for the inode the
    /// participant made, checked again (the name may have been taken meanwhile).
    pub(crate) fn link_remote_dir(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        child: &proto::msg::Attr,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        let mut dir = self.view.dir_for(creds, parent, true)?;
        if self.view.entry(parent, name)?.is_some() {
            return fail(Errno::Exist, format!("{name} exists"));
        }
        self.put(Tbl::Dentries, &dentry_key(parent, name), &dentry_value(child.fid, FileKind::Dir))?;
        self.touch_dir(parent, &mut dir, now, 1)?;
        Ok(Response::DirMade { attr: child.clone(), parent: dir.attr.clone(), lease: None })
    }

    /// The coordinator's half of the rmdir of a remote directory (step 2): the entry
    /// goes, if it still names `child`.
    pub(crate) fn unlink_remote_dir(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        child: &proto::msg::Attr,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        let mut dir = self.view.dir_for(creds, parent, true)?;
        match self.view.entry(parent, name)? {
            Some((fid, FileKind::Dir)) if fid == child.fid => {}
            _ => return fail(Errno::NoEnt, format!("{name} changed while it was removed")),
        }
        if !sticky_allows_attr(&dir, child, creds) {
            return fail(Errno::Perm, "sticky directory: not the owner");
        }
        self.del(Tbl::Dentries, &dentry_key(parent, name))?;
        self.touch_dir(parent, &mut dir, now, -1)?;
        Ok(Response::DirChanged { dir: dir.attr.clone() })
    }
}
