//! Reading an MDT: the database as of the last checkpoint seen through the memtable
//! of the changes since, and the read-only namespace operations (lookup, readdir,
//! open, xattr reads) with their permission checks.

use proto::msg::{Attr, Creds, DirEntry, FileKind, OpenFlags};
use proto::{Errno, Fid};

use super::schema::{check_name, decode_dentry, dentry_key, Tbl, READDIR_MAX, XATTR_NAME_MAX};

use super::error::{fail, OpError, OpResult};
use crate::inode::{Inode, MAY_EXEC, MAY_READ, MAY_WRITE};
use std::ops::{Bound, Deref};
use store::memtable::{MemTable, Merge};
use store::Snapshot;

/// What a lookup found: the child here, or its FID on another MDT.
pub enum Found {
    Here(Attr),
    Elsewhere(Fid, FileKind),
}

/// Rows of a table in key order, the memtable's changes applied.
pub type Rows<'a> = Box<dyn Iterator<Item = OpResult<(Vec<u8>, Vec<u8>)>> + 'a>;

/// A consistent read of the MDT: the database seen through the memtable of changes
/// made since the last checkpoint. Readers hold the memtable's read lock; the
/// committer's [`Writer`] holds it for writing.
pub struct View<M> {
    base: Snapshot,
    pub(super) mem: M,
}

impl<M: Deref<Target = MemTable>> View<M> {
    pub fn new(base: Snapshot, mem: M) -> View<M> {
        View { base, mem }
    }

    /// Calls `f` with the value of `key` in table `t`, if there is one.
    pub fn with<T>(&self, t: Tbl, key: &[u8], f: impl FnOnce(&[u8]) -> OpResult<T>) -> OpResult<Option<T>> {
        match self.mem.get(t.slot(), key) {
            Some(Some(v)) => f(v).map(Some),
            Some(None) => Ok(None),
            None => self.base.get(t.table(), key, f),
        }
    }

    pub fn contains(&self, t: Tbl, key: &[u8]) -> OpResult<bool> {
        Ok(self.with(t, key, |_| Ok(()))?.is_some())
    }

    /// The rows of table `t` from `from` on, in key order.
    pub fn scan(&self, t: Tbl, from: Bound<&[u8]>) -> OpResult<Rows<'_>> {
        let base = self.base.range(t.table(), from)?.map(|row| row.map_err(OpError::from));
        Ok(Box::new(Merge::new(base, self.mem.range(t.slot(), from))))
    }

    /// The rows of table `t` whose keys start with `prefix`.
    pub fn scan_prefix<'a>(&'a self, t: Tbl, prefix: &'a [u8]) -> OpResult<Rows<'a>> {
        let rows = self.scan(t, Bound::Included(prefix))?;
        Ok(Box::new(rows.take_while(move |r| r.as_ref().map_or(true, |(k, _)| k.starts_with(prefix)))))
    }

    pub fn meta_u64(&self, key: &str) -> OpResult<Option<u64>> {
        Ok(self.with(Tbl::Meta, key.as_bytes(), |v| Ok(v.try_into().ok().map(u64::from_le_bytes)))?.flatten())
    }

    /// Inode `fid`. A shard table that does not hold (a damaged record) makes the
    /// inode unreadable, with an error naming it, rather than send a name astray.
    pub fn inode(&self, fid: Fid) -> OpResult<Option<Inode>> {
        self.with(Tbl::Inodes, &fid.to_key(), |v| {
            let ino = store::decode_record::<Inode>(v)?;
            if let Some(s) = &ino.attr.stripes {
                if let Err(e) = s.validate().and_then(|()| match s.shards.contains(&fid) {
                    true => Ok(()),
                    false => Err(format!("{fid} is not among its shards")),
                }) {
                    let detail = format!("{fid}: a damaged shard table ({e})");
                    return Err(OpError::Store(store::StoreError::Corrupt { what: "inode", detail }));
                }
            }
            Ok(ino)
        })
    }

    pub fn must_inode(&self, fid: Fid) -> OpResult<Inode> {
        self.inode(fid)?.map_or_else(|| fail(Errno::NoEnt, format!("no inode {fid}")), Ok)
    }

    /// Inode `fid`, named by a request by its FID (a client's handle of it, or the
    /// directory of an entry): an inode that moved to another MDT under a new FID
    /// (`braid migrate -m`) is answered with where it went ([`OpError::Moved`]: the
    /// client sends the request there), one that is gone as [`View::must_inode`]
    /// answers.
    pub fn handle_inode(&self, fid: Fid) -> OpResult<Inode> {
        if let Some(ino) = self.inode(fid)? {
            return Ok(ino);
        }
        match self.moved(fid)? {
            Some(to) => Err(OpError::Moved(fid, to)),
            None => fail(Errno::NoEnt, format!("no inode {fid}")),
        }
    }

    /// Where inode `fid` went, if it moved to another MDT lately (`braid migrate -m`).
    pub fn moved(&self, fid: Fid) -> OpResult<Option<Fid>> {
        let moved = self.with(Tbl::Moved, &fid.to_key(), |v| Ok(super::schema::decode_moved(v)))?.flatten();
        Ok(moved.map(|(to, _)| to))
    }

    /// What inode `fid` takes along when it moves to another MDT: its attributes,
    /// extended attributes and, by kind, a directory's default layout and entries (in
    /// key order), a symlink's target, a file's Data-on-MDT blocks.
    pub fn inode_copy(&self, fid: Fid) -> OpResult<proto::msg::InodeCopy> {
        let ino = self.must_inode(fid)?;
        let prefix = fid.to_key();
        let mut xattrs = Vec::new();
        for row in self.scan_prefix(Tbl::Xattrs, &prefix)? {
            let (k, v) = row?;
            xattrs.push((String::from_utf8_lossy(&k[prefix.len()..]).into_owned(), v.to_vec()));
        }
        let mut entries = Vec::new();
        for row in self.scan_prefix(Tbl::Dentries, &prefix)? {
            let (k, v) = row?;
            let (child, kind) = decode_dentry(&v)?;
            entries.push((String::from_utf8_lossy(&k[prefix.len()..]).into_owned(), child, kind));
        }
        let dom = match ino.attr.layout.as_ref().and_then(|l| l.dom_end()) {
            Some(_) => self.dom_blocks(fid)?,
            None => Vec::new(),
        };
        let Inode { attr, symlink, dir_default, .. } = ino;
        Ok(proto::msg::InodeCopy { attr, dir_default, xattrs, entries, symlink, dom })
    }

    /// The inode of a directory the caller may search (and, with `write`, modify),
    /// to find or change its entry `name`, which must belong to it if the directory
    /// is a shard of a striped one.
    pub fn dir_for(&self, creds: &Creds, fid: Fid, name: &str, write: bool) -> OpResult<Inode> {
        let dir = self.handle_inode(fid)?;
        if dir.attr.kind != FileKind::Dir {
            return fail(Errno::NotDir, format!("{fid} is not a directory"));
        }
        if let Some(s) = dir.attr.stripes.as_ref().filter(|s| s.shard_for(name) != fid) {
            return Err(OpError::WrongShard(s.clone()));
        }
        let want = if write { MAY_WRITE | MAY_EXEC } else { MAY_EXEC };
        if !dir.may(creds, want) {
            return fail(Errno::Access, format!("permission denied on directory {fid}"));
        }
        if write {
            self.takes_entries(fid)?;
        }
        Ok(dir)
    }

    /// A directory being removed across MDTs takes no new entries until the
    /// coordinator decided, and one moving to another MDT no change at all (the
    /// client asks again meanwhile).
    pub fn takes_entries(&self, dir: Fid) -> OpResult<()> {
        match self.pending(dir)?.map(|p| p.op) {
            Some(super::schema::PendingOp::Rmdir) => fail(Errno::Again, format!("directory {dir} is being removed")),
            Some(super::schema::PendingOp::Released { .. }) => {
                fail(Errno::Again, format!("directory {dir} is moving to another MDT"))
            }
            _ => Ok(()),
        }
    }

    /// A change of `ino` (its attributes, a file's size or bytes on this MDT, an
    /// open): an inode moving to another MDT takes none until the move is decided
    /// (`EAGAIN`: the client asks again).
    pub fn takes_changes(&self, ino: &Inode) -> OpResult<()> {
        match self.pending(ino.attr.fid)?.map(|p| p.op) {
            Some(super::schema::PendingOp::Released { .. }) => {
                fail(Errno::Again, format!("{} is moving to another MDT", ino.attr.fid))
            }
            _ => Ok(()),
        }
    }

    pub fn entry(&self, parent: Fid, name: &str) -> OpResult<Option<(Fid, FileKind)>> {
        self.with(Tbl::Dentries, &dentry_key(parent, name), decode_dentry)
    }

    pub fn dir_is_empty(&self, fid: Fid) -> OpResult<bool> {
        let prefix = fid.to_key();
        let first = self.scan_prefix(Tbl::Dentries, &prefix)?.next();
        match first {
            Some(row) => row.map(|_| false),
            None => Ok(true),
        }
    }

    pub fn lookup(&self, creds: &Creds, parent: Fid, name: &str) -> OpResult<Attr> {
        match self.lookup_entry(creds, parent, name)? {
            Found::Here(attr) => Ok(attr),
            Found::Elsewhere(fid, FileKind::Dir) => {
                fail(Errno::IsDir, format!("{name} is a directory on MDT {}", fid.mdt()))
            }
            Found::Elsewhere(fid, _) => fail(Errno::XDev, format!("{name} lives on MDT {}", fid.mdt())),
        }
    }

    /// Looks `name` up in `parent` (on this MDT): the child's attributes, or its FID
    /// when its inode lives on another MDT (a remote directory).
    pub fn lookup_entry(&self, creds: &Creds, parent: Fid, name: &str) -> OpResult<Found> {
        check_name(name)?;
        self.dir_for(creds, parent, name, false)?;
        let Some((fid, kind)) = self.entry(parent, name)? else {
            return fail(Errno::NoEnt, format!("{name} not found"));
        };
        if fid.mdt() != parent.mdt() {
            return Ok(Found::Elsewhere(fid, kind));
        }
        Ok(Found::Here(self.must_inode(fid)?.attr))
    }

    /// Entries of directory `fid` after `after`, in name order, at most `max`; of a
    /// striped directory, this `shard`'s alone (or its table, see [`OpError::WrongShard`]).
    pub fn readdir(
        &self,
        creds: &Creds,
        fid: Fid,
        after: Option<&str>,
        max: u32,
        shard: bool,
    ) -> OpResult<(Vec<DirEntry>, bool)> {
        let dir = self.handle_inode(fid)?;
        if dir.attr.kind != FileKind::Dir {
            return fail(Errno::NotDir, format!("{fid} is not a directory"));
        }
        if let Some(s) = dir.attr.stripes.as_ref().filter(|_| !shard) {
            return Err(OpError::WrongShard(s.clone()));
        }
        if !dir.may(creds, MAY_READ) {
            return fail(Errno::Access, format!("permission denied reading directory {fid}"));
        }
        let prefix = fid.to_key();
        let resume = after.map(|a| dentry_key(fid, a));
        let from = match &resume {
            Some(k) => Bound::Excluded(k.as_slice()),
            None => Bound::Included(prefix.as_slice()),
        };
        let max = max.clamp(1, READDIR_MAX) as usize;
        let mut out = Vec::new();
        let mut eof = true;
        for row in self.scan(Tbl::Dentries, from)? {
            let (k, v) = row?;
            if !k.starts_with(&prefix) {
                break;
            }
            if out.len() == max {
                eof = false;
                break;
            }
            let name = String::from_utf8_lossy(&k[16..]).into_owned();
            let (child, kind) = decode_dentry(&v)?;
            out.push(DirEntry { name, fid: child, kind });
        }
        Ok((out, eof))
    }

    /// Statahead: the attributes of up to `max` entries of directory `fid` after
    /// `after`, as lookups of them would answer, for a caller who may list and search
    /// it. Subdirectories and entries whose inode is on another MDT are left out.
    /// Returns them, the last name listed and whether that was the directory's end.
    #[allow(clippy::type_complexity)]
    pub fn statahead(
        &self,
        creds: &Creds,
        fid: Fid,
        after: Option<&str>,
        max: u32,
    ) -> OpResult<(Vec<(String, Attr)>, Option<String>, bool)> {
        let dir = self.handle_inode(fid)?;
        if !dir.may(creds, MAY_READ | MAY_EXEC) {
            return fail(Errno::Access, format!("permission denied listing directory {fid}"));
        }
        // A striped directory answers with its table (`WrongShard`): no statahead.
        let (entries, eof) = self.readdir(creds, fid, after, max, false)?;
        let last = entries.last().map(|e| e.name.clone());
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            if e.kind == FileKind::Dir || e.fid.mdt() != fid.mdt() {
                continue;
            }
            if let Some(ino) = self.inode(e.fid)? {
                out.push((e.name, ino.attr));
            }
        }
        Ok((out, last, eof))
    }

    /// [`View::readdir`] with each entry's attributes, as a lookup of it returns
    /// them, for a caller who may also search the directory; none for an entry whose
    /// inode is on another MDT or is a striped directory (its lookup merges shards).
    pub fn readdir_plus(
        &self,
        creds: &Creds,
        fid: Fid,
        after: Option<&str>,
        max: u32,
    ) -> OpResult<(Vec<proto::msg::DirEntryPlus>, bool)> {
        let (entries, eof) = self.readdir(creds, fid, after, max, false)?;
        let search = self.must_inode(fid)?.may(creds, MAY_EXEC);
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let attr = match search && e.fid.mdt() == fid.mdt() {
                true => self.inode(e.fid)?.map(|ino| ino.attr).filter(|a| a.stripes.is_none()),
                false => None,
            };
            out.push((e, attr));
        }
        Ok((out, eof))
    }

    pub fn getxattr(&self, creds: &Creds, fid: Fid, name: &str) -> OpResult<Vec<u8>> {
        let ino = self.must_inode(fid)?;
        xattr_access(&ino, creds, name, false)?;
        match self.with(Tbl::Xattrs, &dentry_key(fid, name), |v| Ok(v.to_vec()))? {
            Some(v) => Ok(v),
            None => fail(Errno::NoData, format!("no attribute {name}")),
        }
    }

    /// Whether inode `fid` has any extended attribute.
    pub fn has_xattrs(&self, fid: Fid) -> OpResult<bool> {
        let prefix = fid.to_key();
        let first = self.scan_prefix(Tbl::Xattrs, &prefix)?.next().transpose()?;
        Ok(first.is_some())
    }

    pub fn listxattr(&self, creds: &Creds, fid: Fid) -> OpResult<Vec<String>> {
        self.must_inode(fid)?;
        let prefix = fid.to_key();
        let mut out = Vec::new();
        for row in self.scan_prefix(Tbl::Xattrs, &prefix)? {
            let (k, _) = row?;
            let name = String::from_utf8_lossy(&k[16..]).into_owned();
            if name.starts_with("trusted.") && creds.uid != 0 {
                continue;
            }
            out.push(name);
        }
        Ok(out)
    }

    pub fn open(&self, creds: &Creds, fid: Fid, flags: OpenFlags) -> OpResult<Attr> {
        let ino = self.handle_inode(fid)?;
        check_open(&ino, creds, flags)?;
        if ino.attr.kind != FileKind::Dir {
            // Not a file that is leaving this MDT: its handle would name it here.
            self.takes_changes(&ino)?;
        }
        Ok(ino.attr.clone())
    }
}

pub(super) fn check_open(ino: &Inode, creds: &Creds, flags: OpenFlags) -> OpResult<()> {
    if ino.attr.kind == FileKind::Dir && (flags.write || flags.truncate) {
        return fail(Errno::IsDir, "cannot open a directory for writing");
    }
    let mut want = 0;
    if flags.read {
        want |= MAY_READ;
    }
    if flags.write || flags.truncate {
        want |= MAY_WRITE;
    }
    if !ino.may(creds, want) {
        return fail(Errno::Access, "permission denied");
    }
    Ok(())
}

pub(super) fn xattr_access(ino: &Inode, creds: &Creds, name: &str, write: bool) -> OpResult<()> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return fail(Errno::Range, "xattr name empty or too long");
    }
    if name.starts_with("trusted.") || name.starts_with("security.") {
        if creds.uid != 0 {
            return if write {
                fail(Errno::Perm, "only root may set trusted.* attributes")
            } else {
                fail(Errno::NoData, "no such attribute")
            };
        }
        return Ok(());
    }
    if name.starts_with("user.") {
        if ino.attr.kind == FileKind::Symlink {
            return fail(Errno::Perm, "user.* attributes are not allowed on symlinks");
        }
        let want = if write { MAY_WRITE } else { MAY_READ };
        if !ino.may(creds, want) {
            return fail(Errno::Access, "permission denied");
        }
        return Ok(());
    }
    fail(Errno::NotSup, format!("unsupported xattr namespace in {name:?} (user., trusted., security.)"))
}
