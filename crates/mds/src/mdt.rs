//! One MDT: its redb database and the namespace operations on it.
//!
//! Keys follow the 3FS style so the common operations are point reads and range scans.
//! Every table maps bytes to bytes; the encodings are these:
//!
//! | table      | key                               | value                          |
//! |------------|-----------------------------------|--------------------------------|
//! | `inodes`   | FID (16 bytes, big-endian)        | [`Inode`] (postcard)           |
//! | `dentries` | parent FID + name                 | child FID + kind               |
//! | `xattrs`   | FID + name                        | value                          |
//! | `destroy`  | sequence number (u64, big-endian) | objects to destroy on OSTs     |
//! | `replies`  | client id + xid                   | time + encoded response        |
//! | `meta`     | name (UTF-8)                      | counters (u64, little-endian), MDT index |
//! | `orphans`  | FID                               | time of unlink (u64, little-endian) |
//!
//! The database holds the MDT as of the last checkpoint; the changes since are in a
//! [`MemTable`] in front of it and in the redo log (see the crate root). A [`View`]
//! reads the two as one.
//!
//! Mutations are applied in batches: many client operations, one redo-log record, then
//! the replies (group commit; see the crate root). Every change goes through
//! [`Writer::put`] or [`Writer::del`], which record it for the log and for undoing the
//! batch. Every mutation first validates (returning an errno without writing anything)
//! and only then writes, so an errno reply never leaves a half-applied operation in the
//! batch. Its reply is stored in `replies` in the same batch, so a client that retries
//! after a lost reply or a server crash gets the original answer instead of a second
//! application (Lustre's reply reconstruction).

use std::ops::{Bound, Deref};
use std::sync::OnceLock;

use layout::{Layout, LayoutSpec, OstState};
use proto::msg::{
    Attr, Creds, DirEntry, FileKind, OpenFlags, RenameFlags, Request, Response, SetAttr, TimeSet, Timespec, XattrMode,
};
use proto::{Errno, Fid, ObjectId};
use redb::{ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use store::memtable::{MemTable, Merge, Prior};
use store::{encode, Store, StoreError};

use crate::inode::{sticky_allows, Inode, MAY_EXEC, MAY_READ, MAY_WRITE, S_ISGID, S_ISUID};
use crate::lease::DirLeases;

/// The tables of an MDT (see the module note for their encodings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tbl {
    Inodes,
    Dentries,
    Xattrs,
    Destroy,
    Replies,
    Meta,
    Orphans,
}

impl Tbl {
    pub const ALL: [Tbl; 7] =
        [Tbl::Inodes, Tbl::Dentries, Tbl::Xattrs, Tbl::Destroy, Tbl::Replies, Tbl::Meta, Tbl::Orphans];

    pub fn def(self) -> TableDefinition<'static, &'static [u8], &'static [u8]> {
        TableDefinition::new(match self {
            Tbl::Inodes => "inodes",
            Tbl::Dentries => "dentries",
            Tbl::Xattrs => "xattrs",
            Tbl::Destroy => "destroy",
            Tbl::Replies => "replies",
            Tbl::Meta => "meta",
            Tbl::Orphans => "orphans",
        })
    }

    /// The table's index in a [`MemTable`].
    fn slot(self) -> usize {
        self as usize
    }
}

/// A memtable with a slot for every MDT table.
pub fn new_memtable() -> MemTable {
    MemTable::new(Tbl::ALL.len())
}

/// Longest name of one directory entry (as Linux).
pub const NAME_MAX: usize = 255;
/// Largest symlink target (as Linux's PATH_MAX).
pub const SYMLINK_MAX: usize = 4096;
/// Largest xattr value and name.
pub const XATTR_VALUE_MAX: usize = 64 * 1024;
pub const XATTR_NAME_MAX: usize = 255;
/// Most entries one readdir answer carries.
pub const READDIR_MAX: u32 = 4096;

/// Objects of a deleted file, waiting to be destroyed on their OSTs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DestroyRecord {
    pub objects: Vec<(u32, ObjectId)>,
}

/// Either an errno answer (nothing written) or a storage failure (abort the batch).
#[derive(Debug)]
pub enum OpError {
    Errno(Errno, String),
    Store(StoreError),
    /// The operation changes the entries of a directory another client holds a lease
    /// on: nothing was written; revoke the lease and apply it again.
    Leased(Fid),
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpError::Errno(_, m) => f.write_str(m),
            OpError::Store(e) => e.fmt(f),
            OpError::Leased(dir) => write!(f, "directory {dir} is leased by another client"),
        }
    }
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        OpError::Store(e)
    }
}

macro_rules! engine_errors {
    ($($t:ty => $op:literal),*) => {$(
        impl From<$t> for OpError {
            fn from(e: $t) -> Self { OpError::Store(StoreError::engine($op, e)) }
        }
    )*};
}
engine_errors!(redb::StorageError => "storage", redb::TableError => "open table",
               redb::TransactionError => "transaction", redb::CommitError => "commit");

pub type OpResult<T> = Result<T, OpError>;

fn fail<T>(code: Errno, msg: impl Into<String>) -> OpResult<T> {
    Err(OpError::Errno(code, msg.into()))
}

fn dentry_key(parent: Fid, name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + name.len());
    k.extend_from_slice(&parent.to_key());
    k.extend_from_slice(name.as_bytes());
    k
}

fn dentry_value(fid: Fid, kind: FileKind) -> Vec<u8> {
    let mut v = fid.to_key().to_vec();
    v.push(kind.code());
    v
}

fn decode_dentry(v: &[u8]) -> OpResult<(Fid, FileKind)> {
    let fid = Fid::from_key(v)
        .ok_or_else(|| OpError::Store(StoreError::Corrupt { what: "dentry", detail: "short value".into() }))?;
    let Some(kind) = v.get(16).and_then(|&c| FileKind::from_code(c)) else {
        return Err(OpError::Store(StoreError::Corrupt { what: "dentry", detail: "bad kind".into() }));
    };
    Ok((fid, kind))
}

fn check_name(name: &str) -> OpResult<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return fail(Errno::Inval, format!("invalid name {name:?}"));
    }
    if name.len() > NAME_MAX {
        return fail(Errno::NameTooLong, format!("name of {} bytes exceeds {NAME_MAX}", name.len()));
    }
    Ok(())
}

/// The database as one read transaction saw it; tables are opened on first use.
pub struct Base {
    txn: redb::ReadTransaction,
    tables: [OnceLock<redb::ReadOnlyTable<&'static [u8], &'static [u8]>>; 7],
}

impl Base {
    pub fn new(store: &Store) -> OpResult<Base> {
        Ok(Base { txn: store.begin_read()?, tables: Default::default() })
    }

    fn table(&self, t: Tbl) -> OpResult<&redb::ReadOnlyTable<&'static [u8], &'static [u8]>> {
        let cell = &self.tables[t.slot()];
        if let Some(table) = cell.get() {
            return Ok(table);
        }
        let _ = cell.set(self.txn.open_table(t.def())?);
        Ok(cell.get().expect("just set"))
    }
}

/// Rows of a table in key order, the memtable's changes applied.
pub type Rows<'a> = Box<dyn Iterator<Item = OpResult<(Vec<u8>, Vec<u8>)>> + 'a>;

/// A consistent read of the MDT: the database seen through the memtable of changes
/// made since the last checkpoint. Readers hold the memtable's read lock; the
/// committer's [`Writer`] holds it for writing.
pub struct View<M> {
    base: Base,
    mem: M,
}

impl<M: Deref<Target = MemTable>> View<M> {
    pub fn new(base: Base, mem: M) -> View<M> {
        View { base, mem }
    }

    /// Calls `f` with the value of `key` in table `t`, if there is one.
    pub fn with<T>(&self, t: Tbl, key: &[u8], f: impl FnOnce(&[u8]) -> OpResult<T>) -> OpResult<Option<T>> {
        match self.mem.get(t.slot(), key) {
            Some(Some(v)) => f(v).map(Some),
            Some(None) => Ok(None),
            None => match self.base.table(t)?.get(key)? {
                Some(v) => f(v.value()).map(Some),
                None => Ok(None),
            },
        }
    }

    pub fn contains(&self, t: Tbl, key: &[u8]) -> OpResult<bool> {
        Ok(self.with(t, key, |_| Ok(()))?.is_some())
    }

    /// The rows of table `t` from `from` on, in key order.
    pub fn scan(&self, t: Tbl, from: Bound<&[u8]>) -> OpResult<Rows<'_>> {
        let base = self.base.table(t)?.range::<&[u8]>((from, Bound::Unbounded))?.map(|row| {
            let (k, v) = row?;
            Ok((k.value().to_vec(), v.value().to_vec()))
        });
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

    pub fn inode(&self, fid: Fid) -> OpResult<Option<Inode>> {
        self.with(Tbl::Inodes, &fid.to_key(), |v| Ok(Inode::decode(v)?))
    }

    pub fn must_inode(&self, fid: Fid) -> OpResult<Inode> {
        self.inode(fid)?.map_or_else(|| fail(Errno::NoEnt, format!("no inode {fid}")), Ok)
    }

    /// The inode of a directory the caller may search (and, with `write`, modify).
    pub fn dir_for(&self, creds: &Creds, fid: Fid, write: bool) -> OpResult<Inode> {
        let dir = self.must_inode(fid)?;
        if dir.kind != FileKind::Dir {
            return fail(Errno::NotDir, format!("{fid} is not a directory"));
        }
        let want = if write { MAY_WRITE | MAY_EXEC } else { MAY_EXEC };
        if !dir.may(creds, want) {
            return fail(Errno::Access, format!("permission denied on directory {fid}"));
        }
        Ok(dir)
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
        check_name(name)?;
        self.dir_for(creds, parent, false)?;
        let Some((fid, _)) = self.entry(parent, name)? else {
            return fail(Errno::NoEnt, format!("{name} not found"));
        };
        Ok(self.must_inode(fid)?.attr(fid))
    }

    pub fn readdir(&self, creds: &Creds, fid: Fid, after: Option<&str>, max: u32) -> OpResult<(Vec<DirEntry>, bool)> {
        let dir = self.must_inode(fid)?;
        if dir.kind != FileKind::Dir {
            return fail(Errno::NotDir, format!("{fid} is not a directory"));
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

    pub fn getxattr(&self, creds: &Creds, fid: Fid, name: &str) -> OpResult<Vec<u8>> {
        let ino = self.must_inode(fid)?;
        xattr_access(&ino, creds, name, false)?;
        match self.with(Tbl::Xattrs, &dentry_key(fid, name), |v| Ok(v.to_vec()))? {
            Some(v) => Ok(v),
            None => fail(Errno::NoData, format!("no attribute {name}")),
        }
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
        let ino = self.must_inode(fid)?;
        check_open(&ino, creds, flags)?;
        Ok(ino.attr(fid))
    }
}

fn check_open(ino: &Inode, creds: &Creds, flags: OpenFlags) -> OpResult<()> {
    if ino.kind == FileKind::Dir && (flags.write || flags.truncate) {
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

fn xattr_access(ino: &Inode, creds: &Creds, name: &str, write: bool) -> OpResult<()> {
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
        if ino.kind == FileKind::Symlink {
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

/// Context the committer passes to a mutation.
pub struct Placement<'a> {
    pub osts: &'a [OstState],
    pub cursor: u64,
    pub default_layout: &'a LayoutSpec,
    /// Whether any client holds the FID open (an unlinked open file becomes an orphan
    /// instead of being destroyed).
    pub is_open: &'a dyn Fn(Fid) -> bool,
}

/// One change to one table, as the redo log carries it (keys and values in the
/// tables' own encodings).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Redo {
    Put(Tbl, Vec<u8>, Vec<u8>),
    Del(Tbl, Vec<u8>),
}

/// The committer's write view of one batch. Every change goes through
/// [`Writer::put`] or [`Writer::del`]: into the memtable (where the batch's later
/// reads see it), into `redo` (the batch's record in the redo log), and into an undo
/// list that takes the batch back if it cannot be logged.
pub struct Writer<'a> {
    pub view: View<&'a mut MemTable>,
    pub mdt_index: u32,
    pub redo: Vec<Redo>,
    undo: Vec<(Tbl, Vec<u8>, Prior)>,
    /// Where new FIDs come from; the committer keeps it between batches.
    pub fids: FidBlock,
    /// The MDT's directory leases (none while replaying the log): a change to the
    /// entries of a directory another client leases is refused.
    leases: Option<&'a mut DirLeases>,
    /// Who the operation being applied comes from, and on which connection.
    pub client: u64,
    pub conn: u64,
    /// Leases granted in this batch (taken back with it).
    granted: Vec<Fid>,
    /// Directories removed in this batch (their leases end with it).
    removed_dirs: Vec<Fid>,
}

/// Where one operation of a batch began, to take back just that operation.
#[derive(Debug, Clone, Copy)]
pub struct Savepoint {
    undo: usize,
    redo: usize,
    granted: usize,
    removed_dirs: usize,
}

/// A batch dropped unfinished (it failed, could not be logged, or panicked) is taken
/// back, so readers never see a change the redo log does not hold.
impl Drop for Writer<'_> {
    fn drop(&mut self) {
        self.undo();
    }
}

/// FIDs reserved in `meta` and not handed out yet: `meta` is written once per
/// [`FID_BLOCK`] creates instead of on every one (Lustre grants FID sequences in
/// ranges for the same reason). A restart skips what remained of the block, so a FID
/// is never handed out twice. After a failed batch the committer drops its block,
/// since the reservation may not have been logged.
#[derive(Debug, Default)]
pub struct FidBlock {
    seq: u64,
    next: u64,
    end: u64,
}

/// FIDs reserved at a time.
const FID_BLOCK: u64 = 1024;

impl<'a> Writer<'a> {
    pub fn new(base: Base, mem: &'a mut MemTable, mdt_index: u32) -> Writer<'a> {
        Writer {
            view: View::new(base, mem),
            mdt_index,
            redo: Vec::new(),
            undo: Vec::new(),
            fids: FidBlock::default(),
            leases: None,
            client: 0,
            conn: 0,
            granted: Vec::new(),
            removed_dirs: Vec::new(),
        }
    }

    /// Has this batch respect (and grant) the MDT's directory leases.
    pub fn with_leases(mut self, leases: &'a mut DirLeases) -> Writer<'a> {
        self.leases = Some(leases);
        self
    }

    /// Writes `key` → `value` in `table` and records the change.
    pub fn put(&mut self, table: Tbl, key: &[u8], value: &[u8]) -> OpResult<()> {
        self.check_lease(table, key)?;
        self.set(table, key, Some(value));
        self.redo.push(Redo::Put(table, key.to_vec(), value.to_vec()));
        Ok(())
    }

    /// Removes `key` from `table` and records the change.
    pub fn del(&mut self, table: Tbl, key: &[u8]) -> OpResult<()> {
        self.check_lease(table, key)?;
        self.set(table, key, None);
        self.redo.push(Redo::Del(table, key.to_vec()));
        Ok(())
    }

    /// Applies one recorded change without recording it again (the redo log's replay).
    pub fn replay(&mut self, op: &Redo) {
        match op {
            Redo::Put(t, k, v) => self.set(*t, k, Some(v)),
            Redo::Del(t, k) => self.set(*t, k, None),
        }
    }

    /// Every change to a directory's entries passes here: one another client holds a
    /// lease on must be revoked first.
    fn check_lease(&self, table: Tbl, key: &[u8]) -> OpResult<()> {
        if table != Tbl::Dentries {
            return Ok(());
        }
        let (Some(leases), Some(dir)) = (self.leases.as_deref(), Fid::from_key(key)) else { return Ok(()) };
        match leases.get(dir) {
            Some(l) if l.holder != self.client || l.conn != self.conn => Err(OpError::Leased(dir)),
            _ => Ok(()),
        }
    }

    fn set(&mut self, table: Tbl, key: &[u8], value: Option<&[u8]>) {
        let prior = self.view.mem.set(table.slot(), key, value);
        self.undo.push((table, key.to_vec(), prior));
    }

    /// A lease on `dir`, just made by this batch, for the current client.
    fn grant_lease(&mut self, dir: Fid) -> Option<u64> {
        let id = self.leases.as_deref_mut()?.grant(dir, self.client, self.conn)?;
        self.granted.push(dir);
        Some(id)
    }

    /// Where the next operation begins.
    pub fn savepoint(&self) -> Savepoint {
        Savepoint {
            undo: self.undo.len(),
            redo: self.redo.len(),
            granted: self.granted.len(),
            removed_dirs: self.removed_dirs.len(),
        }
    }

    /// Takes back everything since `sp` (one operation that could not be applied).
    /// The FID block is dropped too: the operation may have reserved it.
    pub fn rollback(&mut self, sp: Savepoint) {
        self.undo_to(sp);
        self.fids = FidBlock::default();
    }

    fn undo_to(&mut self, sp: Savepoint) {
        for (t, k, prior) in self.undo.drain(sp.undo..).rev() {
            self.view.mem.restore(t.slot(), &k, prior);
        }
        self.redo.truncate(sp.redo);
        for dir in self.granted.drain(sp.granted..) {
            if let Some(l) = self.leases.as_deref_mut() {
                l.forget(dir);
            }
        }
        self.removed_dirs.truncate(sp.removed_dirs);
    }

    /// Keeps the batch's changes: the redo log holds them now.
    pub fn finish(mut self) {
        self.undo.clear();
        self.granted.clear();
        if let Some(l) = self.leases.as_deref_mut() {
            for dir in self.removed_dirs.drain(..) {
                l.forget(dir);
            }
        }
    }

    /// Takes back every change of this batch.
    fn undo(&mut self) {
        self.undo_to(Savepoint { undo: 0, redo: 0, granted: 0, removed_dirs: 0 });
    }

    fn put_inode(&mut self, fid: Fid, ino: &Inode) -> OpResult<()> {
        self.put(Tbl::Inodes, &fid.to_key(), &encode(ino))
    }

    fn meta_u64(&self, key: &str) -> OpResult<Option<u64>> {
        self.view.meta_u64(key)
    }

    fn set_meta_u64(&mut self, key: &str, v: u64) -> OpResult<()> {
        self.put(Tbl::Meta, key.as_bytes(), &v.to_le_bytes())
    }

    /// Allocates a new FID on this MDT: a sequence holds 2^32 - 1 object ids. They
    /// come from the block in `fids`; an exhausted block reserves the next one in
    /// `meta` (in this batch's transaction and redo record).
    fn new_fid(&mut self) -> OpResult<Fid> {
        if self.fids.next >= self.fids.end {
            let mut seq = self.meta_u64("seq")?.unwrap_or(proto::fid::FIRST_SEQ as u64);
            let mut oid = self.meta_u64("next_oid")?.unwrap_or(2);
            if oid > u32::MAX as u64 {
                seq += 1;
                oid = 1;
            }
            if seq > 0xffff {
                return fail(Errno::NoSpc, "this MDT has used all of its FID sequences");
            }
            let end = (oid + FID_BLOCK).min(u32::MAX as u64 + 1);
            self.set_meta_u64("seq", seq)?;
            self.set_meta_u64("next_oid", end)?;
            self.fids = FidBlock { seq, next: oid, end };
        }
        let oid = self.fids.next;
        self.fids.next += 1;
        Ok(Fid::new(self.mdt_index, self.fids.seq as u32, oid as u32))
    }

    fn touch_dir(&mut self, fid: Fid, dir: &mut Inode, now: Timespec, nlink_delta: i32) -> OpResult<()> {
        dir.mtime = now;
        dir.ctime = now;
        dir.nlink = (dir.nlink as i64 + nlink_delta as i64).max(0) as u32;
        self.put_inode(fid, dir)
    }

    /// A file lost its last name: destroy it, or keep it as an orphan while open.
    /// With `grace`, the inode is kept as an orphan even when nobody has it open: a
    /// rename that replaces a file must not make an `open` fail that looked the name
    /// up an instant before (the reaper destroys it after a short grace).
    fn release_last_link(
        &mut self,
        fid: Fid,
        ino: &mut Inode,
        place: &Placement<'_>,
        now: Timespec,
        grace: bool,
    ) -> OpResult<()> {
        if grace || (place.is_open)(fid) {
            ino.nlink = 0;
            ino.ctime = now;
            self.put_inode(fid, ino)?;
            self.put(Tbl::Orphans, &fid.to_key(), &(now.sec.max(0) as u64).to_le_bytes())?;
            Ok(())
        } else {
            self.drop_inode(fid, ino)
        }
    }

    /// Destroys an orphan nobody holds open any more; a no-op for a linked inode.
    pub fn reap_orphan(&mut self, fid: Fid, place: &Placement<'_>) -> OpResult<()> {
        if (place.is_open)(fid) {
            return Ok(());
        }
        if let Some(ino) = self.view.inode(fid)? {
            if ino.nlink == 0 {
                self.drop_inode(fid, &ino)?;
            }
        }
        self.del(Tbl::Orphans, &fid.to_key())?;
        Ok(())
    }

    /// Removes an inode whose last name is gone; queues its objects for destruction.
    fn drop_inode(&mut self, fid: Fid, ino: &Inode) -> OpResult<()> {
        self.del(Tbl::Inodes, &fid.to_key())?;
        if ino.kind == FileKind::Dir {
            self.removed_dirs.push(fid);
        }
        let prefix = fid.to_key();
        let keys =
            self.view.scan_prefix(Tbl::Xattrs, &prefix)?.map(|r| r.map(|(k, _)| k)).collect::<OpResult<Vec<_>>>()?;
        for k in keys {
            self.del(Tbl::Xattrs, &k)?;
        }
        if let Some(layout) = &ino.layout {
            let objects = layout_objects(fid, layout);
            if !objects.is_empty() {
                let seq = self.meta_u64("destroy_seq")?.unwrap_or(0) + 1;
                self.set_meta_u64("destroy_seq", seq)?;
                self.put(Tbl::Destroy, &seq.to_be_bytes(), &encode(&DestroyRecord { objects }))?;
            }
        }
        Ok(())
    }

    /// Applies one mutation. Errno errors are returned before anything is written.
    pub fn apply(&mut self, req: &Request, place: &mut Placement<'_>) -> OpResult<Response> {
        let now = Timespec::now();
        match req {
            Request::MdsCreate { creds, parent, name, mode, exclusive, flags, layout } => {
                self.create(creds, *parent, name, *mode, *exclusive, *flags, layout.clone(), place, now)
            }
            Request::MdsMkdir { creds, parent, name, mode, lease } => {
                self.mkdir(creds, *parent, name, *mode, *lease, now)
            }
            Request::MdsSymlink { creds, parent, name, target } => self.symlink(creds, *parent, name, target, now),
            Request::MdsMknod { creds, parent, name, kind, mode, rdev } => {
                self.mknod(creds, *parent, name, *kind, *mode, *rdev, now)
            }
            Request::MdsLink { creds, fid, parent, name } => self.link(creds, *fid, *parent, name, now),
            Request::MdsUnlink { creds, parent, name } => self.remove(creds, *parent, name, false, place, now),
            Request::MdsRmdir { creds, parent, name } => self.remove(creds, *parent, name, true, place, now),
            Request::MdsRename { creds, parent, name, new_parent, new_name, flags } => {
                self.rename(creds, *parent, name, *new_parent, new_name, *flags, place, now)
            }
            &Request::MdsClose { fid, size, mtime, trunc_epoch } => {
                let Some(mut ino) = self.view.inode(fid)? else { return Ok(Response::Ok) };
                if let Some(size) = size {
                    if trunc_epoch != ino.trunc_epoch {
                        return Ok(Response::EpochMoved { trunc_epoch: ino.trunc_epoch });
                    }
                    ino.size = ino.size.max(size);
                    let m = mtime.unwrap_or(now);
                    ino.mtime = m;
                    ino.ctime = now.max(m);
                    self.put_inode(fid, &ino)?;
                }
                // An orphan is left to the reaper (see `reap_replaced`).
                Ok(Response::Ok)
            }
            Request::MdsSetattr { creds, fid, set } => self.setattr(creds, *fid, set.clone(), now),
            Request::MdsSetxattr { creds, fid, name, value, mode } => {
                self.setxattr(creds, *fid, name, value.clone(), *mode, now)
            }
            Request::MdsRemovexattr { creds, fid, name } => self.removexattr(creds, *fid, name, now),
            Request::MdsSetDirLayout { creds, fid, spec } => self.set_dir_layout(creds, *fid, spec.clone(), now),
            &Request::MdsSizeUpdate { fid, size, mtime, trunc_epoch } => {
                let mut ino = self.view.must_inode(fid)?;
                if ino.kind != FileKind::File {
                    return fail(Errno::IsDir, "size update of a non-file");
                }
                if trunc_epoch != ino.trunc_epoch {
                    return Ok(Response::EpochMoved { trunc_epoch: ino.trunc_epoch });
                }
                ino.size = ino.size.max(size);
                ino.mtime = mtime;
                ino.ctime = now.max(mtime);
                self.put_inode(fid, &ino)?;
                Ok(Response::Attr(ino.attr(fid)))
            }
            other => fail(Errno::Proto, format!("{} is not a mutation", other.op_name())),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        mode: u32,
        exclusive: bool,
        flags: OpenFlags,
        spec: Option<LayoutSpec>,
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        let mut dir = self.view.dir_for(creds, parent, false)?;
        if let Some((fid, _)) = self.view.entry(parent, name)? {
            if exclusive {
                return fail(Errno::Exist, format!("{name} exists"));
            }
            let ino = self.view.must_inode(fid)?;
            if ino.kind == FileKind::Dir {
                return fail(Errno::IsDir, format!("{name} is a directory"));
            }
            check_open(&ino, creds, flags)?;
            return Ok(Response::Created { attr: ino.attr(fid), existed: true, dir: None });
        }
        if !dir.may(creds, MAY_WRITE | MAY_EXEC) {
            return fail(Errno::Access, "permission denied creating in this directory");
        }
        let layout = self.choose_layout(&dir, spec, place)?;
        let fid = self.new_fid()?;
        let gid = if dir.mode & S_ISGID != 0 { dir.gid } else { creds.gid };
        let mut ino = Inode::new(FileKind::File, mode, creds, gid, now);
        ino.layout = Some(layout);
        self.put_inode(fid, &ino)?;
        self.put(Tbl::Dentries, &dentry_key(parent, name), &dentry_value(fid, FileKind::File))?;
        self.touch_dir(parent, &mut dir, now, 0)?;
        Ok(Response::Created { attr: ino.attr(fid), existed: false, dir: Some(dir.attr(parent)) })
    }

    /// The layout of a new file: the request, filled from the parent directory's
    /// default, then from the file system default.
    fn choose_layout(&self, dir: &Inode, spec: Option<LayoutSpec>, place: &Placement<'_>) -> OpResult<Layout> {
        let root_default =
            if dir.dir_default.is_none() { self.view.inode(Fid::ROOT)?.and_then(|r| r.dir_default) } else { None };
        let mut fallback = dir.dir_default.clone().or(root_default).unwrap_or_else(|| place.default_layout.clone());
        fallback = fallback.inherit(place.default_layout);
        let wanted = spec.unwrap_or_else(|| fallback.clone()).inherit(&fallback);
        if place.osts.is_empty() {
            return fail(Errno::Again, "the MDS has not learned the OST list from the MGS yet");
        }
        wanted.instantiate(place.osts, place.cursor).map_err(|e| {
            let code = match e {
                layout::PlacementError::NoOstUp => Errno::NoSpc,
                _ => Errno::Inval,
            };
            OpError::Errno(code, format!("cannot place file: {e}"))
        })
    }

    fn mkdir(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        mode: u32,
        want_lease: bool,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        let mut dir = self.view.dir_for(creds, parent, true)?;
        if self.view.entry(parent, name)?.is_some() {
            return fail(Errno::Exist, format!("{name} exists"));
        }
        let fid = self.new_fid()?;
        let setgid = dir.mode & S_ISGID != 0;
        let gid = if setgid { dir.gid } else { creds.gid };
        let mut ino = Inode::new(FileKind::Dir, mode | if setgid { S_ISGID } else { 0 }, creds, gid, now);
        ino.parent = Some(parent);
        // Subdirectories inherit their parent's default layout (the root's default is
        // the file system default and is not copied).
        if parent != Fid::ROOT {
            ino.dir_default = dir.dir_default.clone();
        }
        self.put_inode(fid, &ino)?;
        self.put(Tbl::Dentries, &dentry_key(parent, name), &dentry_value(fid, FileKind::Dir))?;
        self.touch_dir(parent, &mut dir, now, 1)?;
        let lease = if want_lease { self.grant_lease(fid) } else { None };
        Ok(Response::DirMade { attr: ino.attr(fid), parent: dir.attr(parent), lease })
    }

    fn symlink(&mut self, creds: &Creds, parent: Fid, name: &str, target: &str, now: Timespec) -> OpResult<Response> {
        check_name(name)?;
        if target.is_empty() || target.len() > SYMLINK_MAX {
            return fail(Errno::NameTooLong, "symlink target empty or too long");
        }
        self.make_leaf(creds, parent, name, FileKind::Symlink, 0o777, now, |ino| {
            ino.size = target.len() as u64;
            ino.symlink = Some(target.to_string());
        })
    }

    /// A special file: an inode and its entry, nothing on any OST.
    #[allow(clippy::too_many_arguments)]
    fn mknod(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        kind: FileKind,
        mode: u32,
        rdev: u64,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        if !matches!(kind, FileKind::Fifo | FileKind::CharDevice | FileKind::BlockDevice | FileKind::Socket) {
            return fail(Errno::Inval, format!("mknod makes special files, not a {kind:?}"));
        }
        if kind.is_device() && creds.uid != 0 {
            return fail(Errno::Perm, "only root may make device files");
        }
        self.make_leaf(creds, parent, name, kind, mode, now, |ino| {
            ino.rdev = if kind.is_device() { rdev } else { 0 };
        })
    }

    /// A new inode without data on any OST (a symlink or a special file), filled in by
    /// `fill`, and its entry `name` in `parent`.
    #[allow(clippy::too_many_arguments)]
    fn make_leaf(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        kind: FileKind,
        mode: u32,
        now: Timespec,
        fill: impl FnOnce(&mut Inode),
    ) -> OpResult<Response> {
        let mut dir = self.view.dir_for(creds, parent, true)?;
        if self.view.entry(parent, name)?.is_some() {
            return fail(Errno::Exist, format!("{name} exists"));
        }
        let fid = self.new_fid()?;
        let gid = if dir.mode & S_ISGID != 0 { dir.gid } else { creds.gid };
        let mut ino = Inode::new(kind, mode, creds, gid, now);
        fill(&mut ino);
        self.put_inode(fid, &ino)?;
        self.put(Tbl::Dentries, &dentry_key(parent, name), &dentry_value(fid, kind))?;
        self.touch_dir(parent, &mut dir, now, 0)?;
        Ok(Response::Attr(ino.attr(fid)))
    }

    fn link(&mut self, creds: &Creds, fid: Fid, parent: Fid, name: &str, now: Timespec) -> OpResult<Response> {
        check_name(name)?;
        let mut ino = self.view.must_inode(fid)?;
        if ino.kind == FileKind::Dir {
            return fail(Errno::Perm, "hard links to directories are not allowed");
        }
        let mut dir = self.view.dir_for(creds, parent, true)?;
        if self.view.entry(parent, name)?.is_some() {
            return fail(Errno::Exist, format!("{name} exists"));
        }
        if ino.nlink >= 65000 {
            return fail(Errno::Range, "too many links");
        }
        ino.nlink += 1;
        ino.ctime = now;
        self.put_inode(fid, &ino)?;
        self.put(Tbl::Dentries, &dentry_key(parent, name), &dentry_value(fid, ino.kind))?;
        self.touch_dir(parent, &mut dir, now, 0)?;
        Ok(Response::Attr(ino.attr(fid)))
    }

    #[allow(clippy::too_many_arguments)]
    fn remove(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        is_rmdir: bool,
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        let mut dir = self.view.dir_for(creds, parent, true)?;
        let Some((fid, kind)) = self.view.entry(parent, name)? else {
            return fail(Errno::NoEnt, format!("{name} not found"));
        };
        let mut ino = self.view.must_inode(fid)?;
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
            ino.nlink = ino.nlink.saturating_sub(1);
            if ino.nlink == 0 {
                self.release_last_link(fid, &mut ino, place, now, false)?;
            } else {
                ino.ctime = now;
                self.put_inode(fid, &ino)?;
            }
            self.touch_dir(parent, &mut dir, now, 0)?;
        }
        Ok(Response::DirChanged { dir: dir.attr(parent) })
    }

    /// Fails if `dir` is `ancestor` or below it (a directory moved under itself).
    fn check_not_under(&self, dir: Fid, ancestor: Fid) -> OpResult<()> {
        let mut at = Some(ancestor);
        let mut steps = 0;
        while let Some(p) = at {
            if p == dir {
                return fail(Errno::Inval, "cannot move a directory into itself");
            }
            if p == Fid::ROOT || steps > 4096 {
                break;
            }
            at = self.view.inode(p)?.and_then(|i| i.parent);
            steps += 1;
        }
        Ok(())
    }

    /// `renameat2(RENAME_EXCHANGE)`: the two entries swap what they name, atomically.
    /// Each side is `(directory, name, FID, kind)`; the caller checked that both exist
    /// and that the first is not a directory moved under itself.
    fn exchange(
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
            ino.ctime = now;
            if ino.kind == FileKind::Dir {
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

    #[allow(clippy::too_many_arguments)]
    fn rename(
        &mut self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        new_parent: Fid,
        new_name: &str,
        flags: RenameFlags,
        place: &Placement<'_>,
        now: Timespec,
    ) -> OpResult<Response> {
        check_name(name)?;
        check_name(new_name)?;
        let src_dir = self.view.dir_for(creds, parent, true)?;
        let dst_dir = self.view.dir_for(creds, new_parent, true)?;
        let Some((fid, kind)) = self.view.entry(parent, name)? else {
            return fail(Errno::NoEnt, format!("{name} not found"));
        };
        let mut ino = self.view.must_inode(fid)?;
        if !sticky_allows(&src_dir, &ino, creds) {
            return fail(Errno::Perm, "sticky directory: not the owner");
        }
        let target = self.view.entry(new_parent, new_name)?;
        if let Some((tfid, _)) = target {
            if tfid == fid {
                return Ok(Response::Ok); // Both names are links to the same inode: no-op.
            }
        }
        let is_dir = kind == FileKind::Dir;
        if is_dir {
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
            if t.kind == FileKind::Dir {
                self.drop_inode(tfid, &t)?;
                dst_nlink -= 1;
            } else {
                t.nlink = t.nlink.saturating_sub(1);
                if t.nlink == 0 {
                    self.release_last_link(tfid, &mut t, place, now, true)?;
                } else {
                    t.ctime = now;
                    self.put_inode(tfid, &t)?;
                }
            }
        }
        self.del(Tbl::Dentries, &dentry_key(parent, name))?;
        self.put(Tbl::Dentries, &dentry_key(new_parent, new_name), &dentry_value(fid, kind))?;
        ino.ctime = now;
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

    fn setattr(&mut self, creds: &Creds, fid: Fid, set: SetAttr, now: Timespec) -> OpResult<Response> {
        let mut ino = self.view.must_inode(fid)?;
        let owner = ino.is_owner_or_root(creds);
        if let Some(mode) = set.mode {
            let mut m = mode & 0o7777;
            let privs = S_ISUID | S_ISGID;
            // Anyone who may write a file clears its set-id bits by writing or
            // truncating it (the kernel asks with a mode change): dropping privilege
            // is allowed, any other change is the owner's.
            let only_drops_privs = m & !privs == ino.mode & !privs && m & privs & !ino.mode == 0;
            if !owner && !only_drops_privs {
                return fail(Errno::Perm, "only the owner may change the mode");
            }
            if creds.uid != 0 && !creds.in_group(set.gid.unwrap_or(ino.gid)) {
                m &= !S_ISGID;
            }
            ino.mode = m;
        }
        if set.uid.is_some() || set.gid.is_some() {
            let uid_change = set.uid.is_some_and(|u| u != ino.uid);
            if uid_change && creds.uid != 0 {
                return fail(Errno::Perm, "only root may change the owner");
            }
            if let Some(g) = set.gid {
                if g != ino.gid && creds.uid != 0 && !(creds.uid == ino.uid && creds.in_group(g)) {
                    return fail(Errno::Perm, "only root or the owner (to one of their groups) may change the group");
                }
            }
            if ino.kind == FileKind::File {
                // As Linux: a change of owner drops set-user-id and set-group-id.
                ino.mode &= !S_ISUID;
                if ino.mode & 0o010 != 0 {
                    ino.mode &= !S_ISGID;
                }
            }
            if let Some(u) = set.uid {
                ino.uid = u;
            }
            if let Some(g) = set.gid {
                ino.gid = g;
            }
        }
        if let Some(size) = set.size {
            match ino.kind {
                FileKind::File => {}
                FileKind::Dir => return fail(Errno::IsDir, "cannot truncate a directory"),
                _ => return fail(Errno::Inval, "only regular files can be truncated"),
            }
            if !set.by_writer && !ino.may(creds, MAY_WRITE) {
                return fail(Errno::Access, "permission denied");
            }
            if size != ino.size {
                ino.mtime = now;
            }
            ino.size = size;
            ino.trunc_epoch += 1;
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
                ino.atime = t;
            } else {
                ino.mtime = t;
            }
        }
        ino.ctime = now;
        self.put_inode(fid, &ino)?;
        Ok(Response::Attr(ino.attr(fid)))
    }

    fn setxattr(
        &mut self,
        creds: &Creds,
        fid: Fid,
        name: &str,
        value: Vec<u8>,
        mode: XattrMode,
        now: Timespec,
    ) -> OpResult<Response> {
        let mut ino = self.view.must_inode(fid)?;
        xattr_access(&ino, creds, name, true)?;
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
        ino.ctime = now;
        self.put_inode(fid, &ino)?;
        Ok(Response::Ok)
    }

    fn removexattr(&mut self, creds: &Creds, fid: Fid, name: &str, now: Timespec) -> OpResult<Response> {
        let mut ino = self.view.must_inode(fid)?;
        xattr_access(&ino, creds, name, true)?;
        let key = dentry_key(fid, name);
        if !self.view.contains(Tbl::Xattrs, &key)? {
            return fail(Errno::NoData, format!("no attribute {name}"));
        }
        self.del(Tbl::Xattrs, &key)?;
        ino.ctime = now;
        self.put_inode(fid, &ino)?;
        Ok(Response::Ok)
    }

    fn set_dir_layout(
        &mut self,
        creds: &Creds,
        fid: Fid,
        spec: Option<LayoutSpec>,
        now: Timespec,
    ) -> OpResult<Response> {
        let mut ino = self.view.must_inode(fid)?;
        if ino.kind != FileKind::Dir {
            return fail(Errno::NotDir, "a default layout belongs to a directory");
        }
        if !ino.is_owner_or_root(creds) {
            return fail(Errno::Perm, "only the owner may set a directory's default layout");
        }
        if let Some(s) = &spec {
            s.validate().map_err(|e| OpError::Errno(Errno::Inval, format!("invalid layout: {e}")))?;
        }
        ino.dir_default = spec;
        ino.ctime = now;
        self.put_inode(fid, &ino)?;
        Ok(Response::Ok)
    }
}

/// Every OST object a layout names.
pub fn layout_objects(fid: Fid, layout: &Layout) -> Vec<(u32, ObjectId)> {
    let mut out = Vec::new();
    for c in &layout.components {
        for (stripe, &ost) in c.osts.iter().enumerate() {
            out.push((ost, ObjectId { fid, component: c.id, stripe: stripe as u32 }));
        }
    }
    out
}

/// Writes everything `mem` holds into the database within `txn` (a checkpoint).
pub fn write_back(txn: &redb::WriteTransaction, mem: &MemTable) -> OpResult<()> {
    let mut tables = Vec::with_capacity(Tbl::ALL.len());
    for t in Tbl::ALL {
        tables.push(txn.open_table(t.def())?);
    }
    for (slot, key, value) in mem.iter() {
        match value {
            Some(v) => {
                tables[slot].insert(key, v)?;
            }
            None => {
                tables[slot].remove(key)?;
            }
        }
    }
    Ok(())
}

/// Formats a new MDT database (every table, the MDT index and, on MDT 0, the root
/// directory) or checks that an existing one belongs to this MDT. True when it was
/// new.
pub fn format(store: &Store, mdt_index: u32, default_layout: &LayoutSpec) -> OpResult<bool> {
    let txn = store.begin_write()?;
    let fresh;
    {
        let mut tables = Vec::with_capacity(Tbl::ALL.len());
        for t in Tbl::ALL {
            let table = txn.open_table(t.def()).map_err(|e| match e {
                redb::TableError::TableTypeMismatch { .. } => OpError::Errno(
                    Errno::Inval,
                    format!("table {}: {e}: the database was written by an earlier braid format", t.def()),
                ),
                e => e.into(),
            })?;
            tables.push(table);
        }
        let meta = &mut tables[Tbl::Meta.slot()];
        let stored = meta.get(b"mdt_index".as_slice())?.map(|v| v.value().to_vec());
        fresh = stored.is_none();
        match stored {
            Some(v) => {
                let stored = u32::from_le_bytes(v.as_slice().try_into().unwrap_or([0xff; 4]));
                if stored != mdt_index {
                    return fail(Errno::Inval, format!("database belongs to MDT {stored}, not MDT {mdt_index}"));
                }
            }
            None => {
                meta.insert(b"mdt_index".as_slice(), mdt_index.to_le_bytes().as_slice())?;
            }
        }
        let inodes = &mut tables[Tbl::Inodes.slot()];
        let root_key = Fid::ROOT.to_key();
        if mdt_index == 0 && inodes.get(root_key.as_slice())?.is_none() {
            let now = Timespec::now();
            let mut root = Inode::new(FileKind::Dir, 0o755, &Creds::root(), 0, now);
            root.dir_default = Some(default_layout.clone());
            root.parent = Some(Fid::ROOT);
            inodes.insert(root_key.as_slice(), encode(&root).as_slice())?;
        }
    }
    txn.commit()?;
    Ok(fresh)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn fresh(tag: &str) -> (Dir, Store) {
        let d = std::env::temp_dir().join(format!("braid-mdt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let store = Store::open(&d.join("mdt.redb")).unwrap();
        (Dir(d), store)
    }

    fn mkdir(name: &str) -> Request {
        Request::MdsMkdir { creds: Creds::root(), parent: Fid::ROOT, name: name.into(), mode: 0o755, lease: false }
    }

    fn no_placement() -> (Vec<OstState>, LayoutSpec) {
        (vec![], LayoutSpec::raid0(Some(1), Some(1 << 20)))
    }

    #[test]
    fn a_writer_dropped_unfinished_takes_its_batch_back_and_a_finished_one_is_written_back() {
        let (_d, store) = fresh("undo");
        format(&store, 0, &LayoutSpec::raid0(Some(1), Some(1 << 20))).unwrap();
        let (osts, default_layout) = no_placement();
        let is_open = |_: Fid| false;
        let mut place = Placement { osts: &osts, cursor: 0, default_layout: &default_layout, is_open: &is_open };
        let mut mem = new_memtable();

        // A batch that made a directory and was never logged leaves nothing behind.
        {
            let mut w = Writer::new(Base::new(&store).unwrap(), &mut mem, 0);
            w.apply(&mkdir("lost"), &mut place).unwrap();
            assert!(w.view.entry(Fid::ROOT, "lost").unwrap().is_some(), "the batch sees its own change");
        }
        assert!(mem.is_empty(), "an unfinished batch is undone");

        let mut w = Writer::new(Base::new(&store).unwrap(), &mut mem, 0);
        w.apply(&mkdir("kept"), &mut place).unwrap();
        w.finish();
        let view = View::new(Base::new(&store).unwrap(), &mem);
        let (fid, kind) = view.entry(Fid::ROOT, "kept").unwrap().expect("kept is visible through the memtable");
        assert_eq!(kind, FileKind::Dir);
        assert!(view.entry(Fid::ROOT, "lost").unwrap().is_none());
        let (names, eof) = view.readdir(&Creds::root(), Fid::ROOT, None, 100).unwrap();
        assert_eq!(names.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["kept"]);
        assert!(eof);
        drop(view);

        // Written back, the database alone answers the same.
        let txn = store.begin_write().unwrap();
        write_back(&txn, &mem).unwrap();
        txn.commit().unwrap();
        let empty = new_memtable();
        let view = View::new(Base::new(&store).unwrap(), &empty);
        assert_eq!(view.entry(Fid::ROOT, "kept").unwrap(), Some((fid, FileKind::Dir)));
        assert_eq!(view.must_inode(Fid::ROOT).unwrap().nlink, 3);
    }

    fn create(parent: Fid, name: &str) -> Request {
        Request::MdsCreate {
            creds: Creds::root(),
            parent,
            name: name.into(),
            mode: 0o644,
            exclusive: true,
            flags: OpenFlags { read: false, write: true, truncate: false },
            layout: None,
        }
    }

    #[test]
    fn an_entry_change_in_a_directory_leased_by_another_client_is_refused_and_taken_back() {
        let (_d, store) = fresh("lease");
        format(&store, 0, &LayoutSpec::raid0(Some(1), Some(1 << 20))).unwrap();
        let (_, default_layout) = no_placement();
        let osts = [OstState { index: 0, up: true, free_bytes: 1 << 30, total_bytes: 1 << 30 }];
        let is_open = |_: Fid| false;
        let mut place = Placement { osts: &osts, cursor: 0, default_layout: &default_layout, is_open: &is_open };
        let mut mem = new_memtable();
        let mut leases = DirLeases::default();

        // A lease granted in a batch that is dropped unfinished goes with it.
        {
            let mut w = Writer::new(Base::new(&store).unwrap(), &mut mem, 0).with_leases(&mut leases);
            (w.client, w.conn) = (1, 10);
            let req = Request::MdsMkdir {
                creds: Creds::root(),
                parent: Fid::ROOT,
                name: "lost".into(),
                mode: 0o755,
                lease: true,
            };
            assert!(matches!(w.apply(&req, &mut place).unwrap(), Response::DirMade { lease: Some(_), .. }));
        }
        assert!(leases.is_empty(), "an unfinished batch takes its grants back");

        let mut w = Writer::new(Base::new(&store).unwrap(), &mut mem, 0).with_leases(&mut leases);
        (w.client, w.conn) = (1, 10);
        let req =
            Request::MdsMkdir { creds: Creds::root(), parent: Fid::ROOT, name: "job".into(), mode: 0o755, lease: true };
        let Response::DirMade { attr: job, lease: Some(_), .. } = w.apply(&req, &mut place).unwrap() else {
            panic!("mkdir with a lease asked for grants one")
        };
        w.apply(&create(job.fid, "mine"), &mut place).expect("the holder changes its own directory");

        // Another client, and the holder on another connection, are refused; nothing
        // of the refused operation stays.
        for (client, conn) in [(2, 11), (1, 12)] {
            (w.client, w.conn) = (client, conn);
            let sp = w.savepoint();
            match w.apply(&create(job.fid, "theirs"), &mut place) {
                Err(OpError::Leased(dir)) => assert_eq!(dir, job.fid),
                other => panic!("client {client} conn {conn}: expected Leased, got {other:?}"),
            }
            w.rollback(sp);
            assert!(w.view.entry(job.fid, "theirs").unwrap().is_none());
            assert_eq!(w.view.must_inode(job.fid).unwrap().nlink, 2, "the parent's link count is untouched");
        }
        // What does not change the directory's entries is not stopped by the lease.
        (w.client, w.conn) = (2, 11);
        w.apply(&create(Fid::ROOT, "elsewhere"), &mut place).expect("another directory");
        let set = SetAttr { mode: Some(0o700), ..Default::default() };
        w.apply(&Request::MdsSetattr { creds: Creds::root(), fid: job.fid, set }, &mut place).expect("a chmod");
        w.finish();
        assert_eq!(leases.get(job.fid).map(|l| (l.holder, l.conn)), Some((1, 10)));

        // Removing the directory ends its lease.
        let mut w = Writer::new(Base::new(&store).unwrap(), &mut mem, 0).with_leases(&mut leases);
        (w.client, w.conn) = (1, 10);
        let unlink = Request::MdsUnlink { creds: Creds::root(), parent: job.fid, name: "mine".into() };
        w.apply(&unlink, &mut place).unwrap();
        w.apply(&Request::MdsRmdir { creds: Creds::root(), parent: Fid::ROOT, name: "job".into() }, &mut place)
            .unwrap();
        w.finish();
        assert!(leases.is_empty());
    }

    #[test]
    fn a_database_of_an_earlier_format_is_refused_with_a_clear_error() {
        let (_d, store) = fresh("format");
        let txn = store.begin_write().unwrap();
        let old: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
        txn.open_table(old).unwrap().insert("mdt_index", [0u8; 4].as_slice()).unwrap();
        txn.commit().unwrap();
        let err = format(&store, 0, &LayoutSpec::raid0(Some(1), Some(1 << 20))).unwrap_err().to_string();
        assert!(err.contains("earlier braid format") && err.contains("meta"), "{err}");
    }
}
