//! The MDT's tables, the encoding of their keys and records, and the format of a new
//! MDT or the upgrade of an older one.
//!
//! Format versions: the database records the format it was written in (`meta`
//! key `format`). Format 0 (braid before versioned records) had no version byte in
//! its values; opening one rewrites every record once ([`upgrade`]), after the
//! journal's records of that run were replayed. A database of a format newer than
//! [`FORMAT`] is refused, as is any record newer than its kind's version.

use layout::{Layout, LayoutSpec};
use proto::msg::{Creds, FileKind, Response, Timespec};
use proto::{Errno, Fid, ObjectId};
use serde::{Deserialize, Serialize};
use store::memtable::MemTable;
use store::{Record, Store, StoreError, Table};

use super::error::{fail, OpError, OpResult};
use crate::inode::Inode;

/// The database format this release writes (see the module note).
pub const FORMAT: u64 = 1;

/// The tables of an MDT (see [`super`] for their encodings). The order is part of
/// the journal's record format: append, never reorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tbl {
    Inodes,
    Dentries,
    Xattrs,
    Destroy,
    Replies,
    Meta,
    Orphans,
    Dom,
    Updates,
    Decisions,
    ShardSync,
    /// Inodes moved to another MDT (`braid migrate -m`): old FID → new FID and
    /// when, so requests naming the old one are sent on (kept [`MOVED_KEEP_SECS`]).
    Moved,
}

impl Tbl {
    pub const ALL: [Tbl; 12] = [
        Tbl::Inodes,
        Tbl::Dentries,
        Tbl::Xattrs,
        Tbl::Destroy,
        Tbl::Replies,
        Tbl::Meta,
        Tbl::Orphans,
        Tbl::Dom,
        Tbl::Updates,
        Tbl::Decisions,
        Tbl::ShardSync,
        Tbl::Moved,
    ];

    /// The store's table.
    pub const fn table(self) -> Table {
        Table::new(
            match self {
                Tbl::Inodes => "inodes",
                Tbl::Dentries => "dentries",
                Tbl::Xattrs => "xattrs",
                Tbl::Destroy => "destroy",
                Tbl::Replies => "replies",
                Tbl::Meta => "meta",
                Tbl::Orphans => "orphans",
                Tbl::Dom => "dom",
                Tbl::Updates => "updates",
                Tbl::Decisions => "decisions",
                Tbl::ShardSync => "shard_sync",
                Tbl::Moved => "moved",
            },
            self as usize,
        )
    }

    /// The table's index in a [`MemTable`].
    pub fn slot(self) -> usize {
        self as usize
    }
}

/// Every table of an MDT, as the store names them.
pub const TABLES: [Table; 12] = [
    Tbl::Inodes.table(),
    Tbl::Dentries.table(),
    Tbl::Xattrs.table(),
    Tbl::Destroy.table(),
    Tbl::Replies.table(),
    Tbl::Meta.table(),
    Tbl::Orphans.table(),
    Tbl::Dom.table(),
    Tbl::Updates.table(),
    Tbl::Decisions.table(),
    Tbl::ShardSync.table(),
    Tbl::Moved.table(),
];

/// How long an MDT sends requests naming an inode that moved away on to its new
/// FID: a day, longer than any kernel keeps a name it does not use, or a process
/// leaves a long job's working directory. Later such a request is answered `ESTALE`.
pub const MOVED_KEEP_SECS: u64 = 24 * 3600;

/// A [`Tbl::Moved`] value: the new FID and when it moved (seconds).
pub(crate) fn moved_value(to: Fid, at: u64) -> Vec<u8> {
    let mut v = to.to_key().to_vec();
    v.extend_from_slice(&at.to_be_bytes());
    v
}

/// The new FID and time of a [`Tbl::Moved`] value (`None` if it does not parse).
pub(crate) fn decode_moved(v: &[u8]) -> Option<(Fid, u64)> {
    let to = Fid::from_key(v.get(..16)?)?;
    let at = u64::from_be_bytes(v.get(16..24)?.try_into().ok()?);
    Some((to, at))
}

/// A memtable with a slot for every MDT table.
pub fn new_memtable() -> MemTable {
    MemTable::new(Tbl::ALL.len())
}

/// Inode records: version 2 added the pattern of each component of a directory's
/// default layout (Data-on-MDT); version 1 records are read as all-RAID-0. Version 3
/// added a striped directory's shard table (`Attr::stripes`); older records have none.
/// Version 4 added a file's data version (`Attr::data_version`); older records start
/// at 0. Version 5 added each layout component's mirror id and flags (FLR); older
/// layouts have no mirrors. Version 6 added the FID a layout's objects are named by
/// when it is not the file's (`Layout::objects`); older layouts name their own.
impl Record for Inode {
    const WHAT: &'static str = "inode";
    const VERSION: u8 = 6;

    fn upgrade(version: u8, body: &[u8]) -> Result<Inode, StoreError> {
        match version {
            1 => Inode::decode_v1(body),
            2 => Inode::decode_v2(body),
            3 => Inode::decode_v3(body),
            4 => Inode::decode_v4(body),
            5 => Inode::decode_v5(body),
            v => Err(StoreError::Corrupt { what: "inode", detail: format!("no upgrade from version {v}") }),
        }
    }
}

/// Objects of a deleted file, waiting to be destroyed on their OSTs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DestroyRecord {
    pub objects: Vec<(u32, ObjectId)>,
}

impl Record for DestroyRecord {
    const WHAT: &'static str = "destroy";
    const VERSION: u8 = 1;
}

/// An answer kept for reply reconstruction, with when it was given (seconds).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reply {
    pub at: u64,
    pub response: Response,
}

/// Version 2: answers carrying attributes gained `Attr::data_version`. Version 3: a
/// create's answer says whether its placement was free (`Response::Created::free`).
/// Version 4: layouts in answers carry mirror ids and flags. Version 5: layouts in
/// answers carry the FID their objects are named by.
/// Answers of earlier versions are not upgraded: only a client of a release before
/// could resend their requests, and the protocol version keeps it out (the pruner
/// drops them).
impl Record for Reply {
    const WHAT: &'static str = "reply";
    const VERSION: u8 = 5;
}

/// An inode this MDT changed for an operation that spans MDTs, until the coordinator
/// says whether the operation committed (see [`super::update`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingUpdate {
    pub id: proto::msg::UpdateId,
    pub op: PendingOp,
    /// The directory (on the coordinator) whose entry the operation adds or removes.
    pub parent: Fid,
    pub name: String,
    /// When it was applied (seconds): an update left pending long is asked about.
    pub at: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PendingOp {
    /// A new directory's inode, kept only if the coordinator made its entry.
    Mkdir,
    /// A directory's inode to remove, once the coordinator removed its entry; new
    /// entries in it wait meanwhile.
    Rmdir,
    /// A link added for the coordinator's new entry, taken back if it was not made.
    Link,
    /// A link to take away once the coordinator removed its entry.
    Unlink,
    /// An entry of this MDT to remove once the coordinator made the rename's new one
    /// (kept under the FID the entry names).
    RemoveEntry,
    /// A FID reserved for a shard of a striped directory being made; the shard's
    /// inode replaces it by [`PendingOp::Mkdir`], an abort frees it.
    Reserved,
    /// The entry of a directory moving to directory `to` on another MDT, to remove
    /// (its parent loses a link; the directory's `..` becomes `to` if it is here).
    MoveDir { to: Fid },
    /// An inode of this MDT renamed between directories on other MDTs: its ctime
    /// moves, and a directory's `..` becomes `to`, once the coordinator made the new
    /// entry.
    SetParent { to: Fid },
    /// The entry of this MDT's side of an exchange (naming an inode of kind `own`),
    /// to name `with` (of `kind`), whose entry is in `to`.
    Exchange { with: Fid, kind: proto::msg::FileKind, own: proto::msg::FileKind, to: Fid },
    /// A copy of directory `from` of the coordinator's MDT made here under a new FID
    /// (`braid migrate -m`), with its entries; this MDT's subdirectories among them
    /// name it as their `..` meanwhile. Kept if the coordinator committed, else taken
    /// back (the subdirectories name `from` again).
    Adopted { from: Fid },
    /// A directory of this MDT whose entry on the coordinator's MDT is about to name
    /// its copy on another MDT (`braid migrate -m` of a remote directory): it takes
    /// no change meanwhile (`EAGAIN`), and goes if the coordinator committed; then
    /// requests naming it are sent to its copy `to`, once the coordinator said it.
    Released { to: Option<Fid> },
}

impl Record for PendingUpdate {
    const WHAT: &'static str = "pending update";
    const VERSION: u8 = 1;
}

/// The coordinator's record that an operation spanning MDTs committed: written in
/// the batch that applies its own half, kept until every participant has learned
/// the verdict. No record (and the operation no longer under way) means aborted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Decision {
    /// Where the participants keep their halves.
    pub participants: Vec<Participant>,
    /// When it committed (seconds): a verdict not delivered then is sent again.
    pub at: u64,
}

/// A participant's half of an operation: the MDT that holds it, and the inode it is
/// kept under there (in `updates`). The inode need not be on that MDT: the source
/// entry of a rename between MDTs is kept under the FID of the file it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Participant {
    pub mdt: u32,
    pub fid: Fid,
}

impl Record for Decision {
    const WHAT: &'static str = "decision";
    /// 2: each participant names its MDT (version 1 kept the inode only, whose FID
    /// named the MDT).
    const VERSION: u8 = 2;

    fn upgrade(version: u8, body: &[u8]) -> Result<Self, StoreError> {
        #[derive(Deserialize)]
        struct V1 {
            participants: Vec<Fid>,
            at: u64,
        }
        match version {
            1 => {
                let v1: V1 = store::decode_exact(body, Self::WHAT)?;
                let participants = v1.participants.into_iter().map(|fid| Participant { mdt: fid.mdt(), fid }).collect();
                Ok(Decision { participants, at: v1.at })
            }
            v => Err(StoreError::Corrupt { what: Self::WHAT, detail: format!("no upgrade from version {v}") }),
        }
    }
}

/// The key of an operation's [`Decision`]: the coordinator MDT and its number.
pub fn decision_key(id: proto::msg::UpdateId) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&id.mdt.to_be_bytes());
    k[4..].copy_from_slice(&id.seq.to_be_bytes());
    k
}

/// The operation a [`decision_key`] names.
pub fn decision_id(key: &[u8]) -> Option<proto::msg::UpdateId> {
    let mdt = u32::from_be_bytes(key.get(..4)?.try_into().ok()?);
    let seq = u64::from_be_bytes(key.get(4..12)?.try_into().ok()?);
    Some(proto::msg::UpdateId { mdt, seq })
}

/// The version of a directory entry's record (child FID + kind code, not postcard:
/// read on every lookup).
pub const DENTRY_VERSION: u8 = 1;

pub(crate) fn dentry_key(parent: Fid, name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + name.len());
    k.extend_from_slice(&parent.to_key());
    k.extend_from_slice(name.as_bytes());
    k
}

pub(crate) fn dentry_value(fid: Fid, kind: FileKind) -> Vec<u8> {
    let mut v = Vec::with_capacity(18);
    v.push(DENTRY_VERSION);
    v.extend_from_slice(&fid.to_key());
    v.push(kind.code());
    v
}

pub(crate) fn decode_dentry(v: &[u8]) -> OpResult<(Fid, FileKind)> {
    let (_, body) = store::open_record("dentry", DENTRY_VERSION, v)?;
    let corrupt = |detail: &str| OpError::Store(StoreError::Corrupt { what: "dentry", detail: detail.into() });
    let fid = Fid::from_key(body).ok_or_else(|| corrupt("short value"))?;
    let kind = body.get(16).and_then(|&c| FileKind::from_code(c)).ok_or_else(|| corrupt("bad kind"))?;
    Ok((fid, kind))
}

/// One change to one table, as the journal carries it (keys and values in the
/// tables' own encodings).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Redo {
    Put(Tbl, #[serde(with = "proto::bytes_field")] Vec<u8>, #[serde(with = "proto::bytes_field")] Vec<u8>),
    Del(Tbl, #[serde(with = "proto::bytes_field")] Vec<u8>),
}

/// The changes of one batch: one record of the journal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedoBatch(pub Vec<Redo>);

impl Record for RedoBatch {
    const WHAT: &'static str = "journal";
    const VERSION: u8 = 1;
}

impl RedoBatch {
    /// Decodes a journal record written in database format `format`.
    pub fn decode(format: u64, payload: &[u8]) -> Result<RedoBatch, StoreError> {
        match format {
            0 => store::decode_exact(payload, "journal record of format 0").map(RedoBatch),
            _ => store::decode_record(payload),
        }
    }
}

/// Every OST object file `fid`'s layout names.
pub fn layout_objects(fid: Fid, layout: &Layout) -> Vec<(u32, ObjectId)> {
    let mut out = Vec::new();
    for c in &layout.components {
        for (stripe, &ost) in c.osts.iter().enumerate() {
            out.push((ost, ObjectId::of(fid, layout, c.id, stripe as u32)));
        }
    }
    out
}

const META_INDEX: &[u8] = b"mdt_index";
const META_FORMAT: &[u8] = b"format";

fn meta_u64(v: &[u8]) -> Option<u64> {
    v.try_into().ok().map(u64::from_le_bytes)
}

/// What [`format`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Formatted {
    /// The database was created now.
    pub fresh: bool,
    /// The format its records are in (below [`FORMAT`]: [`upgrade`] is due, after
    /// the journal is replayed).
    pub format: u64,
}

/// The MDT index an existing database was formatted for, if it was.
pub fn stored_index(store: &Store) -> OpResult<Option<u32>> {
    let mem = new_memtable();
    let view = super::View::new(store.snapshot()?, &mem);
    Ok(view.with(Tbl::Meta, META_INDEX, |v| Ok(v.try_into().ok().map(u32::from_le_bytes)))?.flatten())
}

/// Formats a new MDT database (every table, the MDT index, the format and, on MDT 0,
/// the root directory) or checks that an existing one belongs to this MDT and is of
/// a format this release reads.
pub fn format(store: &Store, mdt_index: u32, default_layout: &LayoutSpec) -> OpResult<Formatted> {
    let mut b = store.batch(true)?;
    b.create(&TABLES)?;
    let meta = Tbl::Meta.table();
    let stored = b.get(meta, META_INDEX)?;
    let fresh = stored.is_none();
    match stored {
        Some(v) => {
            let stored = u32::from_le_bytes(v.as_slice().try_into().unwrap_or([0xff; 4]));
            if stored != mdt_index {
                return fail(Errno::Inval, format!("database belongs to MDT {stored}, not MDT {mdt_index}"));
            }
        }
        None => b.put(meta, META_INDEX, &mdt_index.to_le_bytes())?,
    }
    let format = match b.get(meta, META_FORMAT)? {
        Some(v) => meta_u64(&v).ok_or_else(|| StoreError::Corrupt { what: "format", detail: "not 8 bytes".into() })?,
        None if fresh => {
            b.put(meta, META_FORMAT, &FORMAT.to_le_bytes())?;
            FORMAT
        }
        None => 0,
    };
    if format > FORMAT {
        return Err(StoreError::Format(format!(
            "MDT {mdt_index} is in format {format}, written by a later braid; this one reads formats up to {FORMAT}"
        ))
        .into());
    }
    let root_key = Fid::ROOT.to_key();
    if mdt_index == 0 && b.get(Tbl::Inodes.table(), &root_key)?.is_none() {
        let now = Timespec::now();
        let mut root = Inode::new(Fid::ROOT, FileKind::Dir, 0o755, &Creds::root(), 0, now);
        root.dir_default = Some(default_layout.clone());
        root.parent = Some(Fid::ROOT);
        b.put(Tbl::Inodes.table(), &root_key, &store::encode_record(&root))?;
    }
    b.commit()?;
    Ok(Formatted { fresh, format })
}

/// Rewrites every record of a database in format `from` in today's format, in one
/// durable transaction. The journal must be empty (replayed and checkpointed).
pub fn upgrade(store: &Store, mdt_index: u32, from: u64) -> OpResult<()> {
    if from != 0 {
        return fail(Errno::Inval, format!("MDT {mdt_index}: no upgrade from format {from}"));
    }
    let mut b = store.batch(true)?;
    let mut n = 0usize;
    for (k, v) in b.rows(Tbl::Inodes.table())? {
        let fid = Fid::from_key(&k)
            .ok_or_else(|| StoreError::Corrupt { what: "inode", detail: "key is not a FID".into() })?;
        let ino = Inode::decode_format0(fid, &v)?;
        b.put(Tbl::Inodes.table(), &k, &store::encode_record(&ino))?;
        n += 1;
    }
    // The other records kept their bodies: they gain the version byte.
    for t in [Tbl::Dentries, Tbl::Destroy, Tbl::Replies] {
        for (k, v) in b.rows(t.table())? {
            b.put(t.table(), &k, &store::seal(1, &v))?;
            n += 1;
        }
    }
    b.put(Tbl::Meta.table(), META_FORMAT, &FORMAT.to_le_bytes())?;
    b.commit()?;
    tracing::info!(mdt = mdt_index, records = n, "upgraded the MDT from format {from} to {FORMAT}");
    Ok(())
}

/// Longest name of one directory entry (as Linux).
pub const NAME_MAX: usize = 255;
/// Largest symlink target (as Linux's PATH_MAX).
pub const SYMLINK_MAX: usize = 4096;
/// Largest xattr value (the name's limit is the wire's).
pub const XATTR_VALUE_MAX: usize = 64 * 1024;
/// Most entries one readdir answer carries (the wire's limit).
pub use proto::msg::READDIR_MAX;
pub use proto::msg::XATTR_NAME_MAX;

/// Refuses a name no directory entry may have.
pub(crate) fn check_name(name: &str) -> OpResult<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return fail(Errno::Inval, format!("invalid name {name:?}"));
    }
    if name.len() > NAME_MAX {
        return fail(Errno::NameTooLong, format!("name of {} bytes exceeds {NAME_MAX}", name.len()));
    }
    Ok(())
}
