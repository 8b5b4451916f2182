//! Rename, in its POSIX form and renameat2's NOREPLACE and EXCHANGE, with the
//! checks that keep the tree a tree.
use proto::msg::{Attr, Creds, FileKind, RenameFlags, Response, Timespec};
use proto::{Errno, Fid};

use super::error::{fail, OpError, OpResult};
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
            // The walk cannot go on through a directory on another MDT here: the MDS
            // checks the move across MDTs (under the rename lock) instead.
            if p.mdt() != self.mdt_index {
                return Err(OpError::Elsewhere(p, FileKind::Dir));
            }
            self.view.check_not_moving(p)?;
            at = self.view.inode(p)?.and_then(|i| i.parent);
            steps += 1;
        }
        Ok(())
    }

    /// `renameat2(RENAME_EXCHANGE)`: the two entries swap what they name, atomically.
    /// Each side is `(directory, name, FID, kind)`; the caller checked that both exist
    /// and that the first is not a directory moved under itself. `coordinated`: the
    /// MDS checked the second side's move under the rename lock too, and an inode on
    /// another MDT has its MDT move its ctime and `..` (and was checked against a
    /// sticky directory by the MDS).
    pub(super) fn exchange(
        &mut self,
        creds: &Creds,
        a: (Fid, &str, Fid, FileKind),
        b: (Fid, &str, Fid, FileKind),
        now: Timespec,
        coordinated: bool,
    ) -> OpResult<Response> {
        let (a_dir, a_name, a_fid, a_kind) = a;
        let (b_dir, b_name, b_fid, b_kind) = b;
        if b_kind == FileKind::Dir && !coordinated {
            self.check_not_under(b_fid, a_dir)?;
        }
        let local = |f: Fid| f.mdt() == self.mdt_index;
        let mut a_ino = if local(a_fid) { Some(self.view.must_inode(a_fid)?) } else { None };
        let mut b_ino = if local(b_fid) { Some(self.view.must_inode(b_fid)?) } else { None };
        let sticky = |dir: Fid, ino: &Option<Inode>| -> OpResult<bool> {
            Ok(match ino {
                Some(i) => sticky_allows(&self.view.must_inode(dir)?, i, creds),
                None => true,
            })
        };
        if !sticky(a_dir, &a_ino)? || !sticky(b_dir, &b_ino)? {
            return fail(Errno::Perm, "sticky directory: not the owner");
        }
        self.put(Tbl::Dentries, &dentry_key(a_dir, a_name), &dentry_value(b_fid, b_kind))?;
        self.put(Tbl::Dentries, &dentry_key(b_dir, b_name), &dentry_value(a_fid, a_kind))?;
        for (fid, ino, new_dir) in [(a_fid, &mut a_ino, b_dir), (b_fid, &mut b_ino, a_dir)] {
            let Some(ino) = ino else { continue };
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

    /// Takes away what a rename replaces (checked by [`View::rename_victim`]); the
    /// link count change of its directory. An inode on another MDT is its MDT's to
    /// change (a participant's half of the rename).
    fn drop_victim(&mut self, victim: Victim, place: &Placement<'_>, now: Timespec) -> OpResult<i32> {
        Ok(match victim {
            Victim::None | Victim::Same => 0,
            Victim::Here(t, ino) if ino.attr.kind == FileKind::Dir => {
                self.drop_inode(t, &ino)?;
                -1
            }
            Victim::Here(t, mut ino) => {
                self.unlink_victim(t, &mut ino, place, now)?;
                0
            }
            Victim::Elsewhere(_, kind) => -i32::from(kind == FileKind::Dir),
            Victim::Striped(..) => -1,
        })
    }

    /// A rename of entries on this MDT. `coordinated`: the MDS coordinates it across
    /// MDTs (see its `dne::rename`): a directory move was checked not to go below
    /// itself under the rename lock (a walk that leaves this MDT cannot be made here),
    /// and a replaced inode on another MDT is taken away by its own MDT. Without it,
    /// such a replaced inode stops the rename with [`OpError::Elsewhere`] for the MDS.
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
        coordinated: bool,
    ) -> OpResult<Response> {
        check_name(name)?;
        check_name(new_name)?;
        let mut src_dir = self.view.dir_for(creds, parent, name, true)?;
        let dst_dir = self.view.dir_for(creds, new_parent, new_name, true)?;
        let Some((fid, kind)) = self.view.entry(parent, name)? else {
            return fail(Errno::NoEnt, format!("{name} not found"));
        };
        let target = self.view.entry(new_parent, new_name)?;
        if target.is_some_and(|t| t.0 == fid) {
            return Ok(Response::Ok); // Both names are links to the same inode: no-op.
        }
        let remote = |f: Fid| f.mdt() != self.mdt_index;
        let is_dir = kind == FileKind::Dir;

        if remote(fid) && !coordinated {
            // Its ctime (and a directory's `..`) are another MDT's to move: the MDS
            // coordinates.
            return Err(OpError::Elsewhere(fid, kind));
        }
        if let (Some((t, tkind)), false) = (target, coordinated) {
            if remote(t) {
                return Err(OpError::Elsewhere(t, tkind));
            }
        }
        // An entry a rename between MDTs is removing waits for its verdict.
        if self.held_by_another(fid)? {
            return fail(Errno::Again, format!("{name} is part of an operation across MDTs"));
        }
        if is_dir && !coordinated {
            self.check_not_under(fid, new_parent)?;
        }
        if flags.exchange {
            let Some((tfid, tkind)) = target else {
                return fail(Errno::NoEnt, format!("{new_name} not found"));
            };
            if self.held_by_another(tfid)? {
                return fail(Errno::Again, format!("{new_name} is part of an operation across MDTs"));
            }
            let (a, b) = ((parent, name, fid, kind), (new_parent, new_name, tfid, tkind));
            return self.exchange(creds, a, b, now, coordinated);
        }
        let mut ino = if remote(fid) { None } else { Some(self.view.must_inode(fid)?) };
        match &ino {
            Some(i) if !sticky_allows(&src_dir, i, creds) => {
                return fail(Errno::Perm, "sticky directory: not the owner")
            }
            None if src_dir.attr.mode & S_ISVTX != 0 && creds.uid != 0 && creds.uid != src_dir.attr.uid => {
                return fail(Errno::XDev, "sticky directory: the owner of an inode on another MDT is not known here");
            }
            _ => {}
        }
        let moving = (fid, kind);
        let victim =
            self.view.rename_victim(creds, &dst_dir, (new_name, target), moving, flags.noreplace, self.coordinating)?;
        if let (Victim::Striped(t, _), false) = (&victim, coordinated) {
            // Its shards on other MDTs go with it: the MDS coordinates.
            return Err(OpError::Elsewhere(*t, FileKind::Dir));
        }
        // All checks passed: write.
        let dst_nlink = self.drop_victim(victim, place, now)?;
        self.del(Tbl::Dentries, &dentry_key(parent, name))?;
        self.put(Tbl::Dentries, &dentry_key(new_parent, new_name), &dentry_value(fid, kind))?;
        if let Some(ino) = &mut ino {
            // The inode's ctime moves and a directory's `..` follows; an inode on
            // another MDT has its MDT do both (a participant's half).
            ino.attr.ctime = now;
            if is_dir {
                ino.parent = Some(new_parent);
            }
            self.put_inode(fid, ino)?;
        }
        if parent == new_parent {
            self.touch_dir(parent, &mut src_dir, now, dst_nlink)?;
        } else {
            // A directory takes its `..` link along.
            let moved = i32::from(is_dir);
            self.touch_dir(parent, &mut src_dir, now, -moved)?;
            let mut d = self.view.must_inode(new_parent)?;
            self.touch_dir(new_parent, &mut d, now, dst_nlink + moved)?;
        }
        Ok(Response::Ok)
    }

    /// The coordinator's half of an exchange across MDTs (step 2): the whole exchange
    /// when both entries are here; else entry `b` (here) names `a`'s inode, and `a`'s
    /// MDT swaps its entry.
    pub(crate) fn exchange_coordinated(
        &mut self,
        creds: &Creds,
        (a_dir, a_name, a): (Fid, &str, &Attr),
        (b_dir, b_name, b): (Fid, &str, &Attr),
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        if a_dir.mdt() == self.mdt_index {
            // Both entries here: they must still name what the walk and the
            // participants were for.
            if self.view.entry(a_dir, a_name)?.map(|e| e.0) != Some(a.fid)
                || self.view.entry(b_dir, b_name)?.map(|e| e.0) != Some(b.fid)
            {
                return fail(Errno::Again, format!("{a_name} or {b_name} changed while it was exchanged"));
            }
            let flags = RenameFlags { exchange: true, ..Default::default() };
            return self.rename(creds, a_dir, a_name, b_dir, b_name, flags, place, now, true);
        }
        self.exchange_in(creds, (a_dir, a), (b_dir, b_name, b), now)
    }

    /// The coordinator's side of an exchange whose first entry is on another MDT:
    /// entry `b` here now names `a`'s inode, and the inodes here take their new
    /// directories.
    fn exchange_in(
        &mut self,
        creds: &Creds,
        (a_dir, a): (Fid, &Attr),
        (b_dir, b_name, b): (Fid, &str, &Attr),
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(b_name)?;
        let mut dir = self.view.dir_for(creds, b_dir, b_name, true)?;
        if self.view.entry(b_dir, b_name)? != Some((b.fid, b.kind)) {
            return fail(Errno::Again, format!("{b_name} changed while it was exchanged"));
        }
        if self.held_by_another(b.fid)? {
            return fail(Errno::Again, format!("{b_name} is part of another operation across MDTs"));
        }
        if b.fid.mdt() == self.mdt_index && !sticky_allows(&dir, &self.view.must_inode(b.fid)?, creds) {
            return fail(Errno::Perm, "sticky directory: not the owner");
        }
        let links = |k: FileKind| i32::from(k == FileKind::Dir);
        self.put(Tbl::Dentries, &dentry_key(b_dir, b_name), &dentry_value(a.fid, a.kind))?;
        self.touch_dir(b_dir, &mut dir, now, links(a.kind) - links(b.kind))?;
        self.renamed(a.fid, a_dir, b_dir)?;
        self.renamed(b.fid, b_dir, a_dir)?;
        Ok(Response::Ok)
    }

    /// The coordinator's half of a rename (step 2, see the MDS's `dne::rename`): the
    /// whole rename when the old entry is on this MDT too; else the new entry
    /// `new_name` in `new_parent` for `child`, whose old entry another MDT removes,
    /// replacing what is there (its inode taken away here, or by its own MDT), and a
    /// directory's `..` if its inode is here. It stops (`EAGAIN`, the client asks
    /// again) unless the names still hold what the participants were prepared for:
    /// the old entry `child` (when it is here), the new one `replaced`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rename_coordinated(
        &mut self,
        creds: &Creds,
        ((parent, name), (new_parent, new_name)): ((Fid, &str), (Fid, &str)),
        (child, replaced): (&Attr, Option<Fid>),
        noreplace: bool,
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        let here = parent.mdt() == self.mdt_index;
        if self.view.entry(new_parent, new_name)?.map(|e| e.0) != replaced
            || (here && self.view.entry(parent, name)?.map(|e| e.0) != Some(child.fid))
        {
            return fail(Errno::Again, format!("{name} or {new_name} changed while it was renamed"));
        }
        let flags = RenameFlags { noreplace, ..Default::default() };
        if parent.mdt() == self.mdt_index {
            return self.rename(creds, parent, name, new_parent, new_name, flags, place, now, true);
        }
        check_name(new_name)?;
        let mut dir = self.view.dir_for(creds, new_parent, new_name, true)?;
        let target = self.view.entry(new_parent, new_name)?;
        let moving = (child.fid, child.kind);
        let victim = self.view.rename_victim(creds, &dir, (new_name, target), moving, noreplace, self.coordinating)?;
        if matches!(victim, Victim::Same) {
            // A second name of the same inode appeared meanwhile: the client asks again.
            return fail(Errno::Again, format!("{new_name} changed while it was renamed"));
        }
        let is_dir = child.kind == FileKind::Dir;
        let links = self.drop_victim(victim, place, now)? + i32::from(is_dir);
        self.put(Tbl::Dentries, &dentry_key(new_parent, new_name), &dentry_value(child.fid, child.kind))?;
        self.touch_dir(new_parent, &mut dir, now, links)?;
        self.renamed(child.fid, parent, new_parent)?;
        Ok(Response::Ok)
    }
}

/// What a rename's new name holds now.
pub enum Victim {
    /// Nothing: the name is free.
    None,
    /// The inode being renamed (a second link to it): nothing to do.
    Same,
    /// An inode of this MDT, which the rename takes away.
    Here(Fid, Box<Inode>),
    /// An inode of another MDT (and its kind), which its MDT takes away.
    Elsewhere(Fid, FileKind),
    /// A striped directory (its shard 0 empty here): each shard's MDT takes its
    /// shard away.
    Striped(Fid, Box<proto::msg::DirStripes>),
}

impl<M: std::ops::Deref<Target = store::memtable::MemTable>> View<M> {
    /// Checks what `target` (the entry `new_name` of directory `dir`, on this MDT)
    /// is, as the target of a rename of an inode of kind `moving`: of a kind it may
    /// replace (a directory only by a directory, and only an empty one), not striped,
    /// not part of an operation across MDTs, removable by the caller in a sticky
    /// directory. An inode on another MDT is checked by its kind here: its emptiness
    /// is its MDT's to check, its owner the coordinator's.
    pub fn rename_victim(
        &self,
        creds: &Creds,
        dir: &Inode,
        (new_name, target): (&str, Option<(Fid, FileKind)>),
        (moving_fid, moving): (Fid, FileKind),
        noreplace: bool,
        ours: Option<proto::msg::UpdateId>,
    ) -> OpResult<Victim> {
        let Some((t, kind)) = target else { return Ok(Victim::None) };
        if t == moving_fid {
            return Ok(Victim::Same);
        }
        if noreplace {
            return fail(Errno::Exist, format!("{new_name} exists"));
        }
        match (moving == FileKind::Dir, kind == FileKind::Dir) {
            (true, false) => return fail(Errno::NotDir, format!("{new_name} is not a directory")),
            (false, true) => return fail(Errno::IsDir, format!("{new_name} is a directory")),
            _ => {}
        }
        if self.pending(t)?.is_some_and(|p| Some(p.id) != ours) {
            // Held by another operation across MDTs (its entry here, or its inode).
            return fail(Errno::Again, format!("{new_name} is part of an operation across MDTs"));
        }
        if t.mdt() != dir.attr.fid.mdt() {
            return Ok(Victim::Elsewhere(t, kind));
        }
        let ino = self.must_inode(t)?;
        if kind == FileKind::Dir && !self.dir_is_empty(t)? {
            return fail(Errno::NotEmpty, format!("{new_name} is not empty"));
        }
        if let Some(s) = &ino.attr.stripes {
            if !sticky_allows(dir, &ino, creds) {
                return fail(Errno::Perm, "sticky directory: not the owner of the target");
            }
            return Ok(Victim::Striped(t, s.clone()));
        }
        if !sticky_allows(dir, &ino, creds) {
            return fail(Errno::Perm, "sticky directory: not the owner of the target");
        }
        Ok(Victim::Here(t, Box::new(ino)))
    }
}
