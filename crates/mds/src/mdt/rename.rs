//! Rename, in its POSIX form and renameat2's NOREPLACE and EXCHANGE, with the
//! checks that keep the tree a tree.
use proto::msg::{Attr, Creds, FileKind, RenameFlags, Response, Timespec};
use proto::{Errno, Fid};

use super::error::{fail, OpResult};
use super::schema::{check_name, dentry_key, dentry_value, Tbl};
use super::view::View;
use super::writer::{Placement, Writer};
use crate::inode::{sticky_allows, Inode, S_ISVTX};

impl Writer<'_> {
    /// Fails if `dir` is `ancestor` or below it (a directory moved under itself).
    pub(super) fn check_not_under(&self, dir: Fid, ancestor: Fid) -> OpResult<()> {
        let mut at = Some(ancestor);
        let mut steps = 0;
        while let Some(p) = at {
            if p == dir {
                return fail(Errno::Inval, "cannot move a directory into itself");
            }
            if p == Fid::ROOT || steps > 4096 {
                break;
            }
            // The walk cannot go on through a directory on another MDT: the move is
            // not checked, so it is not made.
            if p.mdt() != self.mdt_index {
                return fail(Errno::XDev, "cannot check a directory move through a directory on another MDT");
            }
            at = self.view.inode(p)?.and_then(|i| i.parent);
            steps += 1;
        }
        Ok(())
    }

    /// `renameat2(RENAME_EXCHANGE)`: the two entries swap what they name, atomically.
    /// Each side is `(directory, name, FID, kind)`; the caller checked that both exist
    /// and that the first is not a directory moved under itself.
    pub(super) fn exchange(
        &mut self,
        creds: &Creds,
        a: (Fid, &str, Fid, FileKind),
        b: (Fid, &str, Fid, FileKind),
        now: Timespec,
    ) -> OpResult<Response> {
        let (a_dir, a_name, a_fid, a_kind) = a;
        let (b_dir, b_name, b_fid, b_kind) = b;
        if b_kind == FileKind::Dir {
            self.check_not_under(b_fid, a_dir)?;
        }
        let mut a_ino = self.view.must_inode(a_fid)?;
        let mut b_ino = self.view.must_inode(b_fid)?;
        if !sticky_allows(&self.view.must_inode(a_dir)?, &a_ino, creds)
            || !sticky_allows(&self.view.must_inode(b_dir)?, &b_ino, creds)
        {
            return fail(Errno::Perm, "sticky directory: not the owner");
        }
        self.put(Tbl::Dentries, &dentry_key(a_dir, a_name), &dentry_value(b_fid, b_kind))?;
        self.put(Tbl::Dentries, &dentry_key(b_dir, b_name), &dentry_value(a_fid, a_kind))?;
        for (fid, ino, new_dir) in [(a_fid, &mut a_ino, b_dir), (b_fid, &mut b_ino, a_dir)] {
            ino.attr.ctime = now;
            if ino.attr.kind == FileKind::Dir {
                ino.parent = Some(new_dir);
            }
            self.put_inode(fid, ino)?;
        }
        // A directory that changes parent moves its `..` link with it.
        let links = |k: FileKind| i32::from(k == FileKind::Dir);
        let moved = links(b_kind) - links(a_kind);
        let mut d = self.view.must_inode(a_dir)?;
        self.touch_dir(a_dir, &mut d, now, if a_dir == b_dir { 0 } else { moved })?;
        if a_dir != b_dir {
            let mut d = self.view.must_inode(b_dir)?;
            self.touch_dir(b_dir, &mut d, now, -moved)?;
        }
        Ok(Response::Ok)
    }

    /// A rename of an entry whose inode is on another MDT: a remote directory
    /// within its directory (its `..` stays the same), or a link to a file there
    /// between any two directories here. Only entries change (the inode's ctime is
    /// not moved). A target, which the checks before allow only on this MDT, goes as
    /// a rename's target does.
    #[allow(clippy::too_many_arguments)]
    fn rename_remote_entry(
        &mut self,
        creds: &Creds,
        (parent, mut dir): (Fid, Inode),
        (new_parent, name, new_name): (Fid, &str, &str),
        (fid, kind): (Fid, FileKind),
        target: Option<(Fid, FileKind)>,
        flags: RenameFlags,
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        if dir.attr.mode & S_ISVTX != 0 && creds.uid != 0 && creds.uid != dir.attr.uid {
            return fail(Errno::XDev, "sticky directory: the owner of an inode on another MDT is not known here");
        }
        let mut new_dir =
            if new_parent == parent { None } else { Some(self.view.dir_for(creds, new_parent, new_name, true)?) };
        // A directory moving between directories (checked under the rename lock) takes
        // its `..` link along; its inode's `..` is its own MDT's to change.
        let moved = i32::from(kind == FileKind::Dir && new_dir.is_some());
        let mut nlink = 0;
        if let Some((tfid, tkind)) = target {
            if flags.noreplace {
                return fail(Errno::Exist, format!("{new_name} exists"));
            }
            match (kind == FileKind::Dir, tkind == FileKind::Dir) {
                (true, false) => return fail(Errno::NotDir, format!("{new_name} is not a directory")),
                (false, true) => return fail(Errno::IsDir, format!("{new_name} is a directory")),
                (true, true) if !self.view.dir_is_empty(tfid)? => {
                    return fail(Errno::NotEmpty, format!("{new_name} is not empty"))
                }
                _ => {}
            }
            let mut t = self.view.must_inode(tfid)?;
            if t.attr.stripes.is_some() {
                return fail(Errno::XDev, format!("{new_name} is a striped directory: remove it first"));
            }
            if !sticky_allows(new_dir.as_ref().unwrap_or(&dir), &t, creds) {
                return fail(Errno::Perm, "sticky directory: not the owner of the target");
            }
            if self.view.pending(tfid)?.is_some() {
                return fail(Errno::Again, format!("{new_name} is part of an operation across MDTs"));
            }
            if tkind == FileKind::Dir {
                self.drop_inode(tfid, &t)?;
                nlink = -1;
            } else {
                self.unlink_victim(tfid, &mut t, place, now)?;
            }
        }
        self.del(Tbl::Dentries, &dentry_key(parent, name))?;
        self.put(Tbl::Dentries, &dentry_key(new_parent, new_name), &dentry_value(fid, kind))?;
        match &mut new_dir {
            Some(d) => {
                self.touch_dir(parent, &mut dir, now, -moved)?;
                self.touch_dir(new_parent, d, now, nlink + moved)?;
            }
            None => self.touch_dir(parent, &mut dir, now, nlink)?,
        }
        Ok(Response::Ok)
    }

    /// Whether the entry `name` (`target`, of `kind`) in `dir` may be replaced by a
    /// rename of a `moving` inode that is not a directory: a file here, not part of
    /// an operation across MDTs, that the sticky bit lets the caller remove.
    pub(super) fn check_victim(
        &self,
        dir: &Inode,
        creds: &Creds,
        name: &str,
        (target, kind): (Fid, FileKind),
        moving: FileKind,
    ) -> OpResult<()> {
        debug_assert!(moving != FileKind::Dir);
        if kind == FileKind::Dir {
            return fail(Errno::IsDir, format!("{name} is a directory"));
        }
        if target.mdt() != self.mdt_index {
            return fail(Errno::XDev, "replacing a link to a file on another MDT is not supported yet");
        }
        if self.view.pending(target)?.is_some() {
            return fail(Errno::Again, format!("{name} is part of an operation across MDTs"));
        }
        if !sticky_allows(dir, &self.view.must_inode(target)?, creds) {
            return fail(Errno::Perm, "sticky directory: not the owner of the target");
        }
        Ok(())
    }

    /// A file a rename replaces loses that link; the last one makes it an orphan for
    /// a short grace (see [`Writer::release_last_link`]).
    pub(super) fn unlink_victim(
        &mut self,
        fid: Fid,
        t: &mut Inode,
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<()> {
        t.attr.nlink = t.attr.nlink.saturating_sub(1);
        if t.attr.nlink == 0 {
            self.release_last_link(fid, t, place, now, true)
        } else {
            t.attr.ctime = now;
            self.put_inode(fid, t)
        }
    }

    /// A rename of entries on this MDT. With `loop_checked`, a directory move was
    /// checked not to go below itself under the rename lock (see the MDS's
    /// `dne::rename`), as a walk that leaves this MDT cannot be here.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rename(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        new_parent: Fid,
        new_name: &str,
        flags: RenameFlags,
        place: &Placement<'_>,
        now: Timespec,
        loop_checked: bool,
    ) -> OpResult<Response> {
        check_name(name)?;
        check_name(new_name)?;
        let src_dir = self.view.dir_for(creds, parent, name, true)?;
        let dst_dir = self.view.dir_for(creds, new_parent, new_name, true)?;
        let Some((fid, kind)) = self.view.entry(parent, name)? else {
            return fail(Errno::NoEnt, format!("{name} not found"));
        };
        let target = self.view.entry(new_parent, new_name)?;
        // Renames that span MDTs (an inode on another MDT moved between directories,
        // or replaced) are not coordinated yet: EXDEV, so `mv` copies. Within one
        // directory, the rename of an entry naming an inode elsewhere changes entries
        // only.
        if target.is_some_and(|t| t.0 == fid) {
            return Ok(Response::Ok); // Both names are links to the same inode: no-op.
        }
        let remote = |f: Fid| f.mdt() != self.mdt_index;
        let moves_remote_dir = kind == FileKind::Dir && parent != new_parent && !loop_checked;
        if target.is_some_and(|t| remote(t.0)) || (remote(fid) && (flags.exchange || moves_remote_dir)) {
            return fail(Errno::XDev, "renaming an inode that lives on another MDT is not supported yet");
        }
        // An entry a rename between MDTs is removing waits for its verdict.
        if self.view.pending(fid)?.is_some() || target.map(|t| self.view.pending(t.0)).transpose()?.flatten().is_some()
        {
            return fail(Errno::Again, format!("{name} or {new_name} is part of an operation across MDTs"));
        }
        if remote(fid) {
            let names = (new_parent, name, new_name);
            let src = (parent, src_dir);
            return self.rename_remote_entry(creds, src, names, (fid, kind), target, flags, place, now);
        }
        let mut ino = self.view.must_inode(fid)?;
        if !sticky_allows(&src_dir, &ino, creds) {
            return fail(Errno::Perm, "sticky directory: not the owner");
        }
        if let Some((tfid, _)) = target {
            if tfid == fid {
                return Ok(Response::Ok); // Both names are links to the same inode: no-op.
            }
        }
        let is_dir = kind == FileKind::Dir;
        if is_dir && !loop_checked {
            self.check_not_under(fid, new_parent)?;
        }
        if flags.exchange {
            let Some((tfid, tkind)) = target else {
                return fail(Errno::NoEnt, format!("{new_name} not found"));
            };
            return self.exchange(creds, (parent, name, fid, kind), (new_parent, new_name, tfid, tkind), now);
        }
        let mut victim = None;
        if let Some((tfid, tkind)) = target {
            if flags.noreplace {
                return fail(Errno::Exist, format!("{new_name} exists"));
            }
            let t = self.view.must_inode(tfid)?;
            if t.attr.stripes.is_some() {
                // Its shards on other MDTs would go with it: not coordinated yet.
                return fail(Errno::XDev, format!("{new_name} is a striped directory: remove it first"));
            }
            match (is_dir, tkind == FileKind::Dir) {
                (true, false) => return fail(Errno::NotDir, format!("{new_name} is not a directory")),
                (false, true) => return fail(Errno::IsDir, format!("{new_name} is a directory")),
                (true, true) if !self.view.dir_is_empty(tfid)? => {
                    return fail(Errno::NotEmpty, format!("{new_name} is not empty"))
                }
                _ => {}
            }
            if !sticky_allows(&dst_dir, &t, creds) {
                return fail(Errno::Perm, "sticky directory: not the owner of the target");
            }
            victim = Some((tfid, t));
        }
        // All checks passed: write.
        let mut dst_nlink = 0;
        if let Some((tfid, mut t)) = victim {
            if t.attr.kind == FileKind::Dir {
                self.drop_inode(tfid, &t)?;
                dst_nlink -= 1;
            } else {
                self.unlink_victim(tfid, &mut t, place, now)?;
            }
        }
        self.del(Tbl::Dentries, &dentry_key(parent, name))?;
        self.put(Tbl::Dentries, &dentry_key(new_parent, new_name), &dentry_value(fid, kind))?;
        ino.attr.ctime = now;
        if is_dir {
            ino.parent = Some(new_parent);
        }
        self.put_inode(fid, &ino)?;
        if parent == new_parent {
            let mut d = self.view.must_inode(parent)?;
            self.touch_dir(parent, &mut d, now, dst_nlink)?;
        } else {
            let moved = if is_dir { 1 } else { 0 };
            let mut s = self.view.must_inode(parent)?;
            self.touch_dir(parent, &mut s, now, -moved)?;
            let mut d = self.view.must_inode(new_parent)?;
            self.touch_dir(new_parent, &mut d, now, dst_nlink + moved)?;
        }
        Ok(Response::Ok)
    }

    /// The coordinator's half of a directory's move between directories (step 2),
    /// checked under the rename lock: the whole move when the old entry is on this
    /// MDT too; else the new entry `new_name` in `new_parent` for `child`, replacing
    /// an empty directory here, and the directory's `..` if its inode is here.
    pub(crate) fn rename_dir_in(
        &mut self,
        creds: &Creds,
        ((parent, name), (new_parent, new_name)): ((Fid, &str), (Fid, &str)),
        child: &Attr,
        noreplace: bool,
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        if parent.mdt() == self.mdt_index {
            let flags = RenameFlags { noreplace, ..Default::default() };
            return self.rename(creds, parent, name, new_parent, new_name, flags, place, now, true);
        }
        let DirTarget { mut dir, victim, same } =
            self.view.dir_target(creds, new_parent, new_name, child.fid, noreplace)?;
        if same {
            // A second name of the directory cannot be: it changed meanwhile.
            return fail(Errno::Again, format!("{new_name} changed while it was renamed"));
        }
        let mut links = 1;
        if let Some((t, ino)) = victim {
            self.drop_inode(t, &ino)?;
            links -= 1;
        }
        self.put(Tbl::Dentries, &dentry_key(new_parent, new_name), &dentry_value(child.fid, FileKind::Dir))?;
        self.touch_dir(new_parent, &mut dir, now, links)?;
        self.set_parent(child.fid, parent, new_parent)?;
        Ok(Response::Ok)
    }
}

/// Where a directory moving to `new_name` in `new_parent` lands: the new parent, the
/// empty directory it replaces, and whether `new_name` already names it.
pub struct DirTarget {
    pub dir: Inode,
    pub victim: Option<(Fid, Inode)>,
    pub same: bool,
}

impl<M: std::ops::Deref<Target = store::memtable::MemTable>> View<M> {
    /// Checks `new_name` in `new_parent` (on this MDT) as the target of directory
    /// `moving`'s move: absent, the directory itself, or an empty directory of this
    /// MDT that is not striped and the caller may replace.
    pub fn dir_target(
        &self,
        creds: &Creds,
        new_parent: Fid,
        new_name: &str,
        moving: Fid,
        noreplace: bool,
    ) -> OpResult<DirTarget> {
        check_name(new_name)?;
        let dir = self.dir_for(creds, new_parent, new_name, true)?;
        let Some((t, kind)) = self.entry(new_parent, new_name)? else {
            return Ok(DirTarget { dir, victim: None, same: false });
        };
        if t == moving {
            return Ok(DirTarget { dir, victim: None, same: true });
        }
        if noreplace {
            return fail(Errno::Exist, format!("{new_name} exists"));
        }
        if kind != FileKind::Dir {
            return fail(Errno::NotDir, format!("{new_name} is not a directory"));
        }
        if t.mdt() != new_parent.mdt() {
            return fail(Errno::XDev, format!("{new_name} is a directory on another MDT: remove it first"));
        }
        let ino = self.must_inode(t)?;
        if ino.attr.stripes.is_some() {
            return fail(Errno::XDev, format!("{new_name} is a striped directory: remove it first"));
        }
        if !self.dir_is_empty(t)? {
            return fail(Errno::NotEmpty, format!("{new_name} is not empty"));
        }
        if self.pending(t)?.is_some() {
            return fail(Errno::Again, format!("{new_name} is part of an operation across MDTs"));
        }
        if !sticky_allows(&dir, &ino, creds) {
            return fail(Errno::Perm, "sticky directory: not the owner of the target");
        }
        Ok(DirTarget { dir, victim: Some((t, ino)), same: false })
    }

    /// [`View::dir_target`] as the coordinator checks it before any participant
    /// holds anything: the parent's attributes to go on, `Ok` for nothing to do.
    pub fn check_dir_target(
        &self,
        creds: &Creds,
        new_parent: Fid,
        new_name: &str,
        moving: Fid,
        noreplace: bool,
    ) -> OpResult<Response> {
        let t = self.dir_target(creds, new_parent, new_name, moving, noreplace)?;
        Ok(if t.same { Response::Ok } else { Response::Attr(t.dir.attr) })
    }
}
