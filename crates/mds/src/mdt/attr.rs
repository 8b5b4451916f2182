//! Operations on one inode's attributes: setattr (mode, owner, times, size and the
//! truncate epoch), xattrs, and a directory's default layout.
use layout::LayoutSpec;
use proto::msg::{Creds, DirSpec, FileKind, Response, SetAttr, ShardSync, TimeSet, Timespec, XattrMode};
use proto::{Errno, Fid};

use super::error::{fail, OpError, OpResult};
use super::schema::{dentry_key, Tbl, XATTR_VALUE_MAX};
use super::view::xattr_access;
use super::writer::Writer;
use crate::inode::{Inode, MAY_WRITE, S_ISGID, S_ISUID};

impl Writer<'_> {
    pub(super) fn setattr(&mut self, creds: &Creds, fid: Fid, set: SetAttr, now: Timespec) -> OpResult<Response> {
        let mut ino = self.view.handle_inode(fid)?;
        self.view.takes_changes(&ino)?;
        check_not_shard(&ino)?;
        let owner = ino.is_owner_or_root(creds);
        if let Some(mode) = set.mode {
            let mut m = mode & 0o7777;
            let privs = S_ISUID | S_ISGID;
            // Anyone who may write a file clears its set-id bits by writing or
            // truncating it (the kernel asks with a mode change): dropping privilege
            // is allowed, any other change is the owner's.
            let only_drops_privs = m & !privs == ino.attr.mode & !privs && m & privs & !ino.attr.mode == 0;
            if !owner && !only_drops_privs {
                return fail(Errno::Perm, "only the owner may change the mode");
            }
            if creds.uid != 0 && !creds.in_group(set.gid.unwrap_or(ino.attr.gid)) {
                m &= !S_ISGID;
            }
            ino.attr.mode = m;
        }
        if set.uid.is_some() || set.gid.is_some() {
            // As Linux's chown_ok and chgrp_ok: even a "change" to the same owner or
            // group is the owner's (or root's) to make.
            let owner = creds.uid == ino.attr.uid;
            if set.uid.is_some_and(|u| creds.uid != 0 && !(owner && u == ino.attr.uid)) {
                return fail(Errno::Perm, "only root may change the owner");
            }
            if let Some(g) = set.gid {
                if creds.uid != 0 && !(owner && (g == ino.attr.gid || creds.in_group(g))) {
                    return fail(Errno::Perm, "only root or the owner (to one of their groups) may change the group");
                }
            }
            if ino.attr.kind == FileKind::File {
                // As Linux: a change of owner drops set-user-id and set-group-id.
                ino.attr.mode &= !S_ISUID;
                if ino.attr.mode & 0o010 != 0 {
                    ino.attr.mode &= !S_ISGID;
                }
            }
            if let Some(u) = set.uid {
                ino.attr.uid = u;
            }
            if let Some(g) = set.gid {
                ino.attr.gid = g;
            }
        }
        if let Some(size) = set.size {
            match ino.attr.kind {
                FileKind::File => {}
                FileKind::Dir => return fail(Errno::IsDir, "cannot truncate a directory"),
                _ => return fail(Errno::Inval, "only regular files can be truncated"),
            }
            if !set.by_writer && !ino.may(creds, MAY_WRITE) {
                return fail(Errno::Access, "permission denied");
            }
            if size != ino.attr.size {
                ino.attr.mtime = now;
            }
            ino.attr.size = size;
            ino.attr.trunc_epoch += 1;
            ino.attr.data_version += 1;
        }
        for (which, value) in [(0, set.atime), (1, set.mtime)] {
            let Some(value) = value else { continue };
            let t = match value {
                TimeSet::Now => {
                    if !owner && !ino.may(creds, MAY_WRITE) {
                        return fail(Errno::Access, "permission denied");
                    }
                    now
                }
                TimeSet::At(t) => {
                    if !owner {
                        return fail(Errno::Perm, "only the owner may set times");
                    }
                    t
                }
            };
            if which == 0 {
                ino.attr.atime = t;
            } else {
                ino.attr.mtime = t;
            }
        }
        ino.attr.ctime = now;
        self.put_inode(fid, &ino)?;
        self.shards_changed(&ino, set.atime.is_some() || set.mtime.is_some())?;
        Ok(Response::Attr(ino.attr.clone()))
    }

    pub(super) fn setxattr(
        &mut self,
        creds: &Creds,
        fid: Fid,
        name: &str,
        value: Vec<u8>,
        mode: XattrMode,
        now: Timespec,
    ) -> OpResult<Response> {
        let mut ino = self.view.handle_inode(fid)?;
        self.view.takes_changes(&ino)?;
        check_not_shard(&ino)?;
        xattr_access(&ino, creds, name, true)?;
        if name == DirSpec::XATTR {
            if ino.attr.kind != FileKind::Dir {
                return fail(Errno::NotDir, "a default for new directories belongs to a directory");
            }
            DirSpec::from_xattr(&value).map_err(|e| OpError::Errno(Errno::Inval, e))?;
        }
        if value.len() > XATTR_VALUE_MAX {
            return fail(Errno::Range, format!("xattr value of {} bytes exceeds {XATTR_VALUE_MAX}", value.len()));
        }
        let key = dentry_key(fid, name);
        let exists = self.view.contains(Tbl::Xattrs, &key)?;
        match mode {
            XattrMode::Create if exists => return fail(Errno::Exist, format!("{name} exists")),
            XattrMode::Replace if !exists => return fail(Errno::NoData, format!("no attribute {name}")),
            _ => {}
        }
        self.put(Tbl::Xattrs, &key, &value)?;
        ino.attr.ctime = now;
        self.put_inode(fid, &ino)?;
        self.shards_changed(&ino, false)?;
        Ok(Response::Ok)
    }

    pub(super) fn removexattr(&mut self, creds: &Creds, fid: Fid, name: &str, now: Timespec) -> OpResult<Response> {
        let mut ino = self.view.handle_inode(fid)?;
        self.view.takes_changes(&ino)?;
        check_not_shard(&ino)?;
        xattr_access(&ino, creds, name, true)?;
        let key = dentry_key(fid, name);
        if !self.view.contains(Tbl::Xattrs, &key)? {
            return fail(Errno::NoData, format!("no attribute {name}"));
        }
        self.del(Tbl::Xattrs, &key)?;
        ino.attr.ctime = now;
        self.put_inode(fid, &ino)?;
        self.shards_changed(&ino, false)?;
        Ok(Response::Ok)
    }

    pub(super) fn set_dir_layout(
        &mut self,
        creds: &Creds,
        fid: Fid,
        spec: Option<LayoutSpec>,
        dom_max: u64,
        now: Timespec,
    ) -> OpResult<Response> {
        let mut ino = self.view.handle_inode(fid)?;
        self.view.takes_changes(&ino)?;
        check_not_shard(&ino)?;
        if ino.attr.kind != FileKind::Dir {
            return fail(Errno::NotDir, "a default layout belongs to a directory");
        }
        if !ino.is_owner_or_root(creds) {
            return fail(Errno::Perm, "only the owner may set a directory's default layout");
        }
        if let Some(s) = &spec {
            s.validate().map_err(|e| OpError::Errno(Errno::Inval, format!("invalid layout: {e}")))?;
            super::create::cap_dom(s.clone(), dom_max, true)?;
        }
        ino.dir_default = spec;
        ino.attr.ctime = now;
        self.put_inode(fid, &ino)?;
        self.shards_changed(&ino, false)?;
        Ok(Response::Ok)
    }

    /// A striped directory's attributes that its shards keep a copy of (permissions,
    /// times, defaults) changed: the change is noted in `shard_sync` in this batch,
    /// and the MDS copies it to the shards (see `crate::dne::Dne::sync_shards`).
    fn shards_changed(&mut self, ino: &Inode, times: bool) -> OpResult<()> {
        let fid = ino.attr.fid;
        if ino.attr.stripes.as_ref().is_some_and(|s| s.master() == fid) {
            let (seq, had_times) = self.view.shard_sync_note(fid)?.unwrap_or((0, false));
            let mut note = (seq + 1).to_le_bytes().to_vec();
            note.push(u8::from(times || had_times));
            self.put(Tbl::ShardSync, &fid.to_key(), &note)?;
        }
        Ok(())
    }

    /// A shard (other than 0) of a striped directory takes its directory's attributes
    /// from it (`MdsShardSync`): the MDT of shard 0 copies them.
    pub(super) fn shard_sync(&mut self, sync: &ShardSync, now: Timespec) -> OpResult<Response> {
        let mut ino = self.view.must_inode(sync.fid)?;
        match &ino.attr.stripes {
            Some(s) if s.master() == sync.master && sync.fid != sync.master => {}
            _ => return fail(Errno::Inval, format!("{} is not a shard of directory {}", sync.fid, sync.master)),
        }
        let a = &mut ino.attr;
        (a.mode, a.uid, a.gid) = (sync.mode, sync.uid, sync.gid);
        if let Some((atime, mtime)) = sync.times {
            (a.atime, a.mtime) = (atime, mtime);
        }
        a.ctime = now;
        ino.dir_default = sync.dir_default.clone();
        self.put_inode(sync.fid, &ino)?;
        let key = dentry_key(sync.fid, DirSpec::XATTR);
        match &sync.dirs_default {
            Some(d) => self.put(Tbl::Xattrs, &key, &d.to_xattr())?,
            None if self.view.contains(Tbl::Xattrs, &key)? => self.del(Tbl::Xattrs, &key)?,
            None => {}
        }
        Ok(Response::Ok)
    }
}

/// A shard other than 0 of a striped directory changes with its directory, never on
/// its own.
fn check_not_shard(ino: &Inode) -> OpResult<()> {
    match &ino.attr.stripes {
        Some(s) if s.master() != ino.attr.fid => {
            fail(Errno::Perm, format!("{} is a shard of directory {}: change the directory", ino.attr.fid, s.master()))
        }
        _ => Ok(()),
    }
}
