//! Namespace operations that take a name away (unlink, rmdir), and what happens to an
//! inode that lost its last name: destroyed with its objects queued for the OSTs, or
//! kept as an orphan while a client holds it open.
use proto::msg::{Creds, FileKind, Response, Timespec};
use proto::{Errno, Fid};

use super::error::{fail, OpError, OpResult};
use super::schema::{check_name, dentry_key, layout_objects, DestroyRecord, Tbl};
use super::writer::{Placement, Writer};
use crate::inode::{sticky_allows, Inode};

impl Writer<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn remove(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        is_rmdir: bool,
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        let mut dir = self.view.dir_for(creds, parent, name, true)?;
        let Some((fid, kind)) = self.view.entry(parent, name)? else {
            return fail(Errno::NoEnt, format!("{name} not found"));
        };
        if self.view.pending(fid)?.is_some() {
            // A rename between MDTs is removing this entry, or the inode is part of
            // another operation across MDTs: it waits for the verdict.
            return fail(Errno::Again, format!("{name} is part of an operation across MDTs"));
        }
        if fid.mdt() != self.mdt_index {
            // The MDS coordinates the removal of an entry naming an inode on another
            // MDT (see `crate::dne`).
            return match (is_rmdir, kind == FileKind::Dir) {
                (false, true) => fail(Errno::IsDir, format!("{name} is a directory")),
                (true, false) => fail(Errno::NotDir, format!("{name} is not a directory")),
                _ => Err(OpError::Elsewhere(fid, kind)),
            };
        }
        let mut ino = self.view.must_inode(fid)?;
        if is_rmdir && ino.attr.stripes.is_some() {
            // A striped directory's shards are on several MDTs: the MDS coordinates.
            return Err(OpError::Elsewhere(fid, kind));
        }
        match (is_rmdir, kind == FileKind::Dir) {
            (true, false) => return fail(Errno::NotDir, format!("{name} is not a directory")),
            (false, true) => return fail(Errno::IsDir, format!("{name} is a directory")),
            (true, true) if !self.view.dir_is_empty(fid)? => {
                return fail(Errno::NotEmpty, format!("{name} is not empty"))
            }
            _ => {}
        }
        if !sticky_allows(&dir, &ino, creds) {
            return fail(Errno::Perm, "sticky directory: not the owner");
        }
        self.del(Tbl::Dentries, &dentry_key(parent, name))?;
        if is_rmdir {
            self.drop_inode(fid, &ino)?;
            self.touch_dir(parent, &mut dir, now, -1)?;
        } else {
            ino.attr.nlink = ino.attr.nlink.saturating_sub(1);
            if ino.attr.nlink == 0 {
                self.release_last_link(fid, &mut ino, place, now, false)?;
            } else {
                ino.attr.ctime = now;
                self.put_inode(fid, &ino)?;
            }
            self.touch_dir(parent, &mut dir, now, 0)?;
        }
        Ok(Response::DirChanged { dir: dir.attr.clone() })
    }

    /// A file lost its last name: destroy it, or keep it as an orphan while open.
    /// With `grace`, the inode is kept as an orphan even when nobody has it open: a
    /// rename that replaces a file must not make an `open` fail that looked the name
    /// up an instant before (the reaper destroys it after a short grace).
    pub(super) fn release_last_link(
        &mut self,
        fid: Fid,
        ino: &mut Inode,
        place: &Placement<'_>,
        now: Timespec,
        grace: bool,
    ) -> OpResult<()> {
        if grace || (place.is_open)(fid, None) {
            ino.attr.nlink = 0;
            ino.attr.ctime = now;
            self.put_inode(fid, ino)?;
            self.put(Tbl::Orphans, &fid.to_key(), &(now.sec.max(0) as u64).to_le_bytes())?;
            Ok(())
        } else {
            self.drop_inode(fid, ino)
        }
    }

    /// Destroys an orphan nobody holds open any more; a no-op for a linked inode.
    pub fn reap_orphan(&mut self, fid: Fid, place: &Placement<'_>) -> OpResult<()> {
        if (place.is_open)(fid, None) {
            return Ok(());
        }
        if let Some(ino) = self.view.inode(fid)? {
            if ino.attr.nlink == 0 {
                self.drop_inode(fid, &ino)?;
            }
        }
        self.del(Tbl::Orphans, &fid.to_key())?;
        Ok(())
    }

    /// Removes an inode whose last name is gone; queues its objects for destruction.
    pub(super) fn drop_inode(&mut self, fid: Fid, ino: &Inode) -> OpResult<()> {
        self.forget_inode(fid, ino)?;
        if let Some(layout) = &ino.attr.layout {
            self.discard_objects(fid, layout)?;
        }
        Ok(())
    }

    /// Removes inode `fid` from this MDT with its extended attributes and DoM bytes,
    /// and leaves its OST objects alone: a copy of it elsewhere names them (an inode
    /// that moved to another MDT, or such a copy given up).
    pub(super) fn forget_inode(&mut self, fid: Fid, ino: &Inode) -> OpResult<()> {
        self.del(Tbl::Inodes, &fid.to_key())?;
        self.inodes_delta -= 1;
        if ino.attr.kind == FileKind::Dir {
            self.removed_dirs.push(fid);
        }
        let prefix = fid.to_key();
        let keys =
            self.view.scan_prefix(Tbl::Xattrs, &prefix)?.map(|r| r.map(|(k, _)| k)).collect::<OpResult<Vec<_>>>()?;
        for k in keys {
            self.del(Tbl::Xattrs, &k)?;
        }
        if ino.attr.layout.as_ref().is_some_and(|l| l.dom_end().is_some()) {
            self.drop_dom_from(fid, 0)?;
        }
        Ok(())
    }

    /// Lets go of the bytes `layout` holds for file `fid` (an inode removed, or a
    /// layout replaced): those on this MDT (a DoM component) now, its OST objects
    /// through the destroy queue.
    pub(super) fn discard_bytes(&mut self, fid: Fid, layout: &layout::Layout) -> OpResult<()> {
        if layout.dom_end().is_some() {
            self.drop_dom_from(fid, 0)?;
        }
        self.discard_objects(fid, layout)
    }

    /// Queues the OST objects `layout` names for file `fid` for destruction.
    fn discard_objects(&mut self, fid: Fid, layout: &layout::Layout) -> OpResult<()> {
        let objects = layout_objects(fid, layout);
        if !objects.is_empty() {
            let seq = self.meta_u64("destroy_seq")?.unwrap_or(0) + 1;
            self.set_meta_u64("destroy_seq", seq)?;
            self.put(Tbl::Destroy, &seq.to_be_bytes(), &store::encode_record(&DestroyRecord { objects }))?;
        }
        Ok(())
    }
}
