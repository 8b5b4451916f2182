//! Control messages of every service. One [`Request`] enum and one [`Response`] enum,
//! postcard-encoded; variants are grouped by the service that answers them (MGS, MDS,
//! OSS). Bulk data (object reads and writes) is not a field here: it travels as the
//! raw payload of the frame.
//!
//! Compatibility: variants are only ever appended, so the postcard discriminants of
//! existing variants never change within protocol version 1.

use layout::{DirHash, Layout, LayoutChange, LayoutSpec};
use serde::{Deserialize, Serialize};

use crate::error::RemoteError;
use crate::fid::{Fid, ObjectId};

/// Who performs an operation: checked by the MDS for POSIX permissions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Creds {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (bounded by the message size limit).
    pub groups: Vec<u32>,
}

impl Creds {
    pub fn root() -> Creds {
        Creds { uid: 0, gid: 0, groups: vec![] }
    }

    /// Squashes these credentials of a request from `ip` by `rule`: root, unless
    /// exempt, becomes the squash user and group with no supplementary groups.
    /// Whether they changed.
    pub fn squash(&mut self, rule: &crate::squash::RootSquash, ip: std::net::IpAddr) -> bool {
        if !rule.squashes(self.uid, ip) {
            return false;
        }
        *self = Creds { uid: rule.uid, gid: rule.gid, groups: vec![] };
        true
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// The POSIX access check of `want` (4 read, 2 write, 1 execute or search) on an
    /// inode of `kind` with permission bits `mode`, owned by `uid`:`gid`. The one rule
    /// the MDS enforces and clients apply ahead of it.
    pub fn may(&self, kind: FileKind, mode: u32, uid: u32, gid: u32, want: u32) -> bool {
        if self.uid == 0 {
            // Root may do anything except execute a file nobody may execute.
            return want & 1 == 0 || kind == FileKind::Dir || mode & 0o111 != 0;
        }
        let bits = if self.uid == uid {
            mode >> 6
        } else if self.in_group(gid) {
            mode >> 3
        } else {
            mode
        };
        bits & 7 & want == want
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
pub enum TargetKind {
    Mdt,
    Ost,
}

impl TargetKind {
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Mdt => "MDT",
            TargetKind::Ost => "OST",
        }
    }
}

/// Space and inode usage of one target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub avail_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
}

/// One target as the MGS knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetInfo {
    pub kind: TargetKind,
    pub index: u32,
    pub uuid: String,
    /// Address of the server (MDS or OSS) that serves it.
    pub address: String,
    pub up: bool,
    pub usage: Usage,
    /// The medium an OST emulates, as its OSS last reported it.
    pub media: Option<Media>,
}

/// The medium an OST emulates (`braid oss --ost DIR:class=hdd,bw=150M,lat=4ms`): a
/// class to label it by, and the limits its OSS enforces on reads and writes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Media {
    /// A label: `hdd`, `ssd`, `nvme`, or what the admin calls it.
    pub class: String,
    /// Bandwidth of reads and writes together, in bytes per second.
    pub bw_bytes: Option<u64>,
    /// Added to each read and write, in microseconds.
    pub lat_us: Option<u64>,
}

impl std::fmt::Display for Media {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.class)?;
        if let Some(bw) = self.bw_bytes {
            write!(f, " {}MiB/s", bw as f64 / (1u64 << 20) as f64)?;
        }
        if let Some(us) = self.lat_us {
            write!(f, " {}ms", us as f64 / 1000.0)?;
        }
        write!(f, " emulated")
    }
}

/// A named set of OSTs (Lustre's OST pool): placement of a component that names it
/// stays on its OSTs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolInfo {
    pub name: String,
    /// OST indices, ascending.
    pub osts: Vec<u32>,
}

/// A change to a pool (`braid pool create|add|remove|destroy`, Lustre's
/// `lctl pool_new|pool_add|pool_remove|pool_destroy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolOp {
    Create,
    Add,
    Remove,
    Destroy,
}

/// Longest pool name (Lustre's `LOV_MAXPOOLNAME`).
pub const POOL_NAME_MAX: usize = 15;

/// The pool's own name in `FSNAME.POOL` (or `POOL` as it is).
pub fn pool_part(name: &str) -> &str {
    name.split_once('.').map_or(name, |(_, pool)| pool)
}

/// Why `name` cannot name a pool, if it cannot.
pub fn check_pool_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > POOL_NAME_MAX {
        return Err(format!("a pool name has 1 to {POOL_NAME_MAX} characters, not {}", name.len()));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-')) {
        return Err(format!("a pool name has letters, digits, '_' and '-' only, not {c:?}"));
    }
    Ok(())
}

/// What a client needs to know of the cluster; fetched from the MGS only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterConfig {
    pub fsname: String,
    /// Bumped whenever a target registers or changes state, or a pool changes.
    pub generation: u64,
    pub mdts: Vec<TargetInfo>,
    pub osts: Vec<TargetInfo>,
    /// The OST pools, by name.
    pub pools: Vec<PoolInfo>,
    /// Root squash, if the MGS was started with it (see [`crate::squash`]).
    pub root_squash: Option<crate::squash::RootSquash>,
}

impl ClusterConfig {
    pub fn target(&self, kind: TargetKind, index: u32) -> Option<&TargetInfo> {
        let list = match kind {
            TargetKind::Mdt => &self.mdts,
            TargetKind::Ost => &self.osts,
        };
        list.iter().find(|t| t.index == index)
    }

    pub fn pool(&self, name: &str) -> Option<&PoolInfo> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// What placement needs to know of each OST: whether it is up, its space, and
    /// the pools it is in.
    pub fn ost_states(&self) -> Vec<layout::OstState> {
        self.osts
            .iter()
            .map(|t| layout::OstState {
                index: t.index,
                up: t.up,
                free_bytes: t.usage.avail_bytes,
                total_bytes: t.usage.total_bytes,
                pools: self.pools.iter().filter(|p| p.osts.contains(&t.index)).map(|p| p.name.clone()).collect(),
            })
            .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// Special files: inodes in the namespace only, never on an OST (their I/O is the
    /// kernel's: a pipe, a device driver, a socket).
    Fifo,
    CharDevice,
    BlockDevice,
    Socket,
}

impl FileKind {
    /// Every kind, in the order of their one-byte codes ([`FileKind::code`]).
    pub const ALL: [FileKind; 7] = [
        FileKind::File,
        FileKind::Dir,
        FileKind::Symlink,
        FileKind::Fifo,
        FileKind::CharDevice,
        FileKind::BlockDevice,
        FileKind::Socket,
    ];

    /// A stable one-byte code (directory entries store it).
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<FileKind> {
        FileKind::ALL.get(code as usize).copied()
    }

    /// The kind of a special file from the `S_IFMT` bits of a mode (`mknod(2)`);
    /// `None` for regular files, directories, symlinks and nonsense.
    pub fn special_from_mode(mode: u32) -> Option<FileKind> {
        match mode & 0o170000 {
            0o010000 => Some(FileKind::Fifo),
            0o020000 => Some(FileKind::CharDevice),
            0o060000 => Some(FileKind::BlockDevice),
            0o140000 => Some(FileKind::Socket),
            _ => None,
        }
    }

    /// Whether the kind carries a device number.
    pub fn is_device(self) -> bool {
        matches!(self, FileKind::CharDevice | FileKind::BlockDevice)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

impl Timespec {
    pub fn now() -> Timespec {
        let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
    }
}

/// Attributes of an inode as the MDS stores them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub fid: Fid,
    pub kind: FileKind,
    /// Permission bits including setuid, setgid and sticky (no file type bits).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// Layout of a regular file; `None` for every other kind.
    pub layout: Option<Layout>,
    /// Device number of a character or block device (Linux's encoding); 0 otherwise.
    pub rdev: u64,
    /// Bumped by every truncate (a setattr of the size): a writer's idea of the size
    /// is trusted only under the epoch it opened or last truncated at.
    pub trunc_epoch: u64,
    /// Lustre's data version: moves with every change of a file's bytes that reaches
    /// the MDS (a writer's size and mtime report, a DoM write, a truncate, a layout
    /// change), so a client holding bytes cached under one version knows at open
    /// whether they still hold. 0 for every other kind.
    pub data_version: u64,
    /// A striped directory's shards (Lustre's LMV): on the directory itself (shard
    /// 0) and on each of its other shards; `None` for everything else. Boxed: every
    /// answer carries attributes, few carry a table.
    pub stripes: Option<Box<DirStripes>>,
}

/// How a striped directory's entries are spread over MDTs (Lustre's LMV): entry
/// `name` lives in shard `hash(name) % shards.len()`, a directory object on its own
/// MDT. Shard 0 is the directory itself (its FID is the one users see); the others
/// have no entry of their own. The table never changes once the directory is made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirStripes {
    pub hash: DirHash,
    pub shards: Vec<Fid>,
}

impl DirStripes {
    /// The directory as users see it (shard 0). A table is checked ([`DirStripes::
    /// validate`]) wherever one comes in; an empty one, which never does, answers a
    /// FID naming nothing rather than panic.
    pub fn master(&self) -> Fid {
        self.shards.first().copied().unwrap_or(Fid::new(0, 0, 0))
    }

    /// The index of the shard holding `name`.
    pub fn index_of(&self, name: &str) -> usize {
        self.hash.shard_of(name.as_bytes(), self.shards.len() as u32) as usize
    }

    /// The shard holding `name`.
    pub fn shard_for(&self, name: &str) -> Fid {
        self.shards.get(self.index_of(name)).copied().unwrap_or_else(|| self.master())
    }

    /// Checks a table read from the wire or a disk: 2 to [`layout::DIR_STRIPES_MAX`]
    /// shards, each on its own MDT.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.shards.len();
        if n < 2 || n > layout::DIR_STRIPES_MAX as usize {
            return Err(format!("a striped directory has 2 to {} shards, not {n}", layout::DIR_STRIPES_MAX));
        }
        let mut mdts: Vec<u32> = self.shards.iter().map(Fid::mdt).collect();
        mdts.sort_unstable();
        if mdts.windows(2).any(|w| w[0] == w[1]) {
            return Err("two shards of a striped directory are on one MDT".into());
        }
        Ok(())
    }
}

impl Attr {
    /// The attributes of a new inode of `kind` made by `creds` at `now` with `mode`
    /// and group `gid`: the MDS stores these, and a client answering a create itself
    /// (the client's `async_create`) tells them before the MDS has.
    pub fn new_inode(fid: Fid, kind: FileKind, mode: u32, creds: &Creds, gid: u32, now: Timespec) -> Attr {
        Attr {
            fid,
            kind,
            mode: mode & 0o7777,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            uid: creds.uid,
            gid,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            layout: None,
            rdev: 0,
            trunc_epoch: 0,
            data_version: 0,
            stripes: None,
        }
    }

    /// [`Creds::may`] on these attributes.
    pub fn may(&self, creds: &Creds, want: u32) -> bool {
        creds.may(self.kind, self.mode, self.uid, self.gid, want)
    }
}

/// Attribute changes a client answered itself and sends behind (see
/// [`Request::MdsSizeUpdate`]), with whose they are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetBehind {
    pub creds: Creds,
    pub set: SetAttr,
}

/// Which attributes a setattr changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// The caller changes the size through a descriptor it opened for writing
    /// (`ftruncate`): write permission was checked at open and is not checked again.
    pub by_writer: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSet {
    Now,
    At(Timespec),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub fid: Fid,
    pub kind: FileKind,
}

/// A directory entry with the attributes a lookup of it returns, if the MDS gave them
/// (see [`Request::MdsReaddirPlus`]).
pub type DirEntryPlus = (DirEntry, Option<Attr>);

/// How an open file will be used (checked against permissions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenFlags {
    pub read: bool,
    pub write: bool,
    pub truncate: bool,
}

/// xattr set modes (`XATTR_CREATE`, `XATTR_REPLACE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum XattrMode {
    Any,
    Create,
    Replace,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameFlags {
    /// `RENAME_NOREPLACE`: fail with EEXIST if the target exists.
    pub noreplace: bool,
    /// `RENAME_EXCHANGE`: swap the two names atomically (both must exist).
    pub exchange: bool,
}

/// Every request of every service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Liveness check, answered by every server with [`Response::Ok`].
    Ping,

    // ---- MGS ----
    /// A target announces itself. `index` is the index it already holds, if any.
    MgsRegister {
        kind: TargetKind,
        uuid: String,
        index: Option<u32>,
        address: String,
        fsname: String,
        /// A replicated MDT's leader registers with its Raft term: the MGS refuses a
        /// registration older than the last it took (a deposed leader's, delayed).
        /// 0 for every other target.
        epoch: u64,
    },
    MgsHeartbeat {
        kind: TargetKind,
        index: u32,
        uuid: String,
        usage: Usage,
        /// The medium the target emulates, if any (OSTs).
        media: Option<Media>,
    },
    MgsGetConfig,

    // ---- MDS (the MDT is the FID's, or `mdt` where no FID is given) ----
    /// Lookup with attributes (Lustre's lookup+getattr intent).
    MdsLookup {
        creds: Creds,
        parent: Fid,
        name: String,
    },
    MdsGetattr {
        fid: Fid,
    },
    /// Create-and-open: attributes and layout come back in one round trip.
    MdsCreate {
        creds: Creds,
        parent: Fid,
        name: String,
        mode: u32,
        exclusive: bool,
        flags: OpenFlags,
        layout: Option<LayoutSpec>,
    },
    MdsOpen {
        creds: Creds,
        fid: Fid,
        flags: OpenFlags,
    },
    MdsMkdir {
        creds: Creds,
        parent: Fid,
        name: String,
        mode: u32,
        /// Ask for a lease on the new directory (see [`Response::DirMade`]).
        lease: bool,
        /// Where the directory goes over MDTs, as asked (`braid mkdir -i K -c N`: a
        /// remote or striped directory; root only): `None` for the parent's default
        /// for new directories, or the parent's own MDT.
        spec: Option<DirSpec>,
    },
    MdsSymlink {
        creds: Creds,
        parent: Fid,
        name: String,
        target: String,
    },
    /// Make a special file (FIFO, device, socket): `mknod(2)`. Answered with its
    /// [`Response::Attr`].
    MdsMknod {
        creds: Creds,
        parent: Fid,
        name: String,
        kind: FileKind,
        /// Permission bits (umask applied).
        mode: u32,
        rdev: u64,
    },
    MdsLink {
        creds: Creds,
        fid: Fid,
        parent: Fid,
        name: String,
    },
    MdsUnlink {
        creds: Creds,
        parent: Fid,
        name: String,
    },
    MdsRmdir {
        creds: Creds,
        parent: Fid,
        name: String,
    },
    MdsRename {
        creds: Creds,
        parent: Fid,
        name: String,
        new_parent: Fid,
        new_name: String,
        flags: RenameFlags,
    },
    /// Entries after `after` (name order), at most `max`.
    MdsReaddir {
        creds: Creds,
        fid: Fid,
        after: Option<String>,
        max: u32,
        /// The entries of this shard of a striped directory only (a client merging
        /// the shards); without it, a striped directory answers with its table
        /// ([`Response::Striped`]).
        shard: bool,
    },
    MdsSetattr {
        creds: Creds,
        fid: Fid,
        set: SetAttr,
    },
    MdsReadlink {
        fid: Fid,
    },
    MdsSetxattr {
        creds: Creds,
        fid: Fid,
        name: String,
        value: Vec<u8>,
        mode: XattrMode,
    },
    MdsGetxattr {
        creds: Creds,
        fid: Fid,
        name: String,
    },
    MdsListxattr {
        creds: Creds,
        fid: Fid,
    },
    MdsRemovexattr {
        creds: Creds,
        fid: Fid,
        name: String,
    },
    MdsStatfs {
        mdt: u32,
    },
    /// Set (or clear with `None`) a directory's default layout.
    MdsSetDirLayout {
        creds: Creds,
        fid: Fid,
        spec: Option<LayoutSpec>,
    },
    MdsGetDirLayout {
        fid: Fid,
    },
    /// A writer reports growth and modification at close/fsync: size becomes
    /// `max(size, new)` and mtime is set, unless `mtime` is `None`: the writer set the
    /// file's times explicitly since its last write (`utimensat` after the writes, as
    /// `tar` and `cp -p` do), and they stay. Only if the file's `trunc_epoch` is still
    /// the one the writer knows: otherwise nothing changes and the answer is
    /// [`Response::EpochMoved`] (a truncate came from elsewhere; the size the writer
    /// holds may predate it, and it must report what the objects say).
    ///
    /// `behind`: attribute changes the client answered itself since the file's
    /// create (its owner, mode and times, as `tar x` and `cp -a` set them before the
    /// close), applied first, as a setattr of their caller, in the same transaction:
    /// one request for a small file's close where two were. A change the MDS refuses
    /// is left out, and the report still applies (the answer's attributes show the
    /// change missing, as a setattr sent alone would have failed).
    MdsSizeUpdate {
        fid: Fid,
        size: u64,
        mtime: Option<Timespec>,
        trunc_epoch: u64,
        behind: Option<Box<SetBehind>>,
    },

    /// A handle is closed: the open count drops, a writer's size and mtime are
    /// recorded (under the same `trunc_epoch` and `mtime` rules as
    /// [`Request::MdsSizeUpdate`]), and an unlinked file whose last handle this was
    /// is destroyed.
    MdsClose {
        fid: Fid,
        size: Option<u64>,
        mtime: Option<Timespec>,
        trunc_epoch: u64,
    },
    /// Take, change or release a byte-range lock (`F_SETLK`/`F_SETLKW`, `flock`).
    /// `end` is inclusive. With `wait`, the MDS holds the request until the lock is
    /// granted or a while passes (then answers `Again` and the client asks again).
    MdsSetLock {
        fid: Fid,
        lock: LockRequest,
        wait: bool,
        /// A lock the client held before it reconnected, asked for again (Lustre's
        /// lock replay): granted during a restarted MDS's recovery window, while other
        /// lock requests wait for the window's end; never waits.
        reclaim: bool,
    },
    /// `F_GETLK`: the first lock that would conflict, if any.
    MdsGetLock {
        fid: Fid,
        lock: LockRequest,
    },
    /// Handles closed with nothing to report (no size, no mtime), sent together: the
    /// open counts drop. All FIDs are on one MDT.
    MdsCloseMany {
        fids: Vec<Fid>,
    },
    /// Directory leases (directory, lease id) this client stopped relying on without
    /// being asked (its table was full): the MDS may drop them. All directories are on
    /// one MDT.
    MdsLeaseCancel {
        leases: Vec<(Fid, u64)>,
    },
    /// MDS to MDS, the participant's half of an operation that spans MDTs (see the
    /// MDS's `dne` module): the MDT of the operation's directory entry (the
    /// coordinator, named by `id`) asks the MDT of the inode to apply `op`, which it
    /// records as pending until the coordinator says whether the operation committed.
    MdsUpdate {
        /// The participant MDT (one MDS may serve several).
        mdt: u32,
        id: UpdateId,
        /// Boxed: the largest request by far, and a rare one.
        op: Box<UpdateOp>,
    },
    /// MDS to MDS: the coordinator's verdict on the update participant MDT `mdt`
    /// keeps pending under inode `fid`.
    MdsUpdateDone {
        mdt: u32,
        fid: Fid,
        id: UpdateId,
        committed: bool,
    },
    /// MDS to MDS: the MDT of a striped directory copies its attributes to one of its
    /// other shards (their permissions decide creates there).
    MdsShardSync(ShardSync),
    /// MDS to MDS: the directories above `fid` (its `..`, then that one's, ...) as far
    /// as they are on the MDT holding `fid`, and the first one that is not; answered
    /// with [`Response::Ancestors`]. A directory move's loop check walks up with it.
    MdsAncestors {
        fid: Fid,
    },
    /// MDS to the MDS of MDT 0: take (`hold`) or give back the file system's rename
    /// lock (Lustre's BFL) for `holder`, which a directory move between directories
    /// holds from its loop check to its commit (see the MDS's `dne` module).
    MdsRenameLock {
        hold: bool,
        holder: u64,
    },
    /// MDS to MDS: a participant asks the coordinator about a pending update it was
    /// never told the verdict of (the coordinator restarted, or the message was
    /// lost): is the operation still under way, and did it commit? Answered with
    /// [`Response::Update`].
    MdsUpdateQuery {
        id: UpdateId,
    },
    /// fsync/fsyncdir: make every operation the MDT holding `fid` has acknowledged
    /// durable (it forces its redo log to disk; see `store::wal`).
    MdsSync {
        fid: Fid,
    },
    /// Changes an existing file's layout: instantiates the components a write or
    /// truncate reaches, or adds or deletes trailing components. Answered with the
    /// file's attributes and the layout as it now is (unchanged when another client
    /// instantiated first).
    MdsLayoutChange {
        creds: Creds,
        fid: Fid,
        change: LayoutChange,
    },
    /// Data-on-MDT: the bytes of file `fid`'s DoM component, served by its MDT as an
    /// OST serves an object (at the file's own offsets). Answered with
    /// [`Response::Data`] and the bytes as payload, fewer at the object's end.
    MdsDomRead {
        fid: Fid,
        offset: u64,
        len: u32,
    },
    /// Writes `data` at `offset` of the DoM object; it must lie inside the DoM
    /// component. Inline, not a payload: the MDT journals it with the metadata. A
    /// client sends at most [`DOM_WRITE_MAX`] bytes at a time. With `publish`, the
    /// file's size becomes `max(size, offset + len)` and its mtime now, in the same
    /// batch, if the file's truncate epoch is still that one (as
    /// [`Request::MdsSizeUpdate`]): a small file's writer then has no size to report at
    /// close. Answered with [`Response::DomWritten`].
    MdsDomWrite {
        fid: Fid,
        offset: u64,
        #[serde(with = "crate::bytes_field")]
        data: Vec<u8>,
        publish: Option<u64>,
    },
    /// Deallocates `[offset, offset+len)` of the DoM object (reads back as zeros; the
    /// object keeps its size).
    MdsDomTrim {
        fid: Fid,
        offset: u64,
        len: u64,
    },
    /// Cuts the DoM object to at most `size` bytes.
    MdsDomPunch {
        fid: Fid,
        size: u64,
    },
    /// The DoM object's size, as [`Response::ObjectAttr`].
    MdsDomGetattr {
        fid: Fid,
    },
    /// Looks `name` up in `parent` and opens it, in one round trip (Lustre's intent
    /// open): answered as [`Request::MdsOpen`] is.
    MdsOpenAt {
        creds: Creds,
        parent: Fid,
        name: String,
        flags: OpenFlags,
    },

    // ---- OSS (payload: data for writes) ----
    OstWrite {
        ost: u32,
        object: ObjectId,
        offset: u64,
        sync: bool,
    },
    OstRead {
        ost: u32,
        object: ObjectId,
        offset: u64,
        len: u32,
    },
    /// Truncate the object to at most `size` bytes.
    OstPunch {
        ost: u32,
        object: ObjectId,
        size: u64,
    },
    OstDestroy {
        ost: u32,
        object: ObjectId,
    },
    OstGetattr {
        ost: u32,
        object: ObjectId,
    },
    OstSync {
        ost: u32,
        objects: Vec<ObjectId>,
    },
    OstStatfs {
        ost: u32,
    },
    /// Deallocate `[offset, offset+len)` of an object; it reads back as zeros and the
    /// object's size is kept (`fallocate(PUNCH_HOLE)`).
    OstTrim {
        ost: u32,
        object: ObjectId,
        offset: u64,
        len: u64,
    },

    // ---- trace collection server (payload: one encoded batch of trace records) ----
    /// A collector ships the records it took from one client's trace ring.
    TraceBatch,

    // ---- MDS, continued (appended: earlier variants keep their wire numbers) ----
    /// Statahead (Lustre's `statahead`): the attributes of up to `max` entries of
    /// directory `fid` after `after`, in name order, for a client that sees lookups
    /// walking the directory. Needs read and search permission on the directory.
    /// Answered with [`Response::EntryAttrs`]; subdirectories and entries whose inode
    /// is on another MDT are left out (their lookups go to the MDS as usual).
    MdsStatahead {
        creds: Creds,
        fid: Fid,
        after: Option<String>,
        max: u32,
    },
    /// FIDs for creates the client answers itself (see [`Request::MdsCreateGranted`]):
    /// `count` FIDs of MDT `mdt` no one else will be given, answered with
    /// [`Response::FidGrant`]. The grant is durable before the answer.
    MdsFidGrant {
        mdt: u32,
        count: u32,
    },
    /// A create the client already answered (CephFS's asynchronous create): `name`
    /// in `parent`, which the client holds the lease on and knows to have no such
    /// name, made as file `fid` (from a grant) with exactly `layout`: one whose
    /// instantiated components are all Data-on-MDT, or one the MDS could have given a
    /// new file there itself (the directory's default, placed on OSTs that are up, and
    /// on those the default names if it names any; the MDS does not create OST
    /// objects, their first write does). Answered as [`Request::MdsCreate`]; a retry
    /// of one that was applied answers it again. `data`, when not empty, is the file's first bytes: written at offset
    /// 0 of its DoM component (at most [`DOM_WRITE_MAX`] and within the component)
    /// and its size published, in the create's own transaction, so a small file
    /// written after its create costs one request. `lease`: the id of the lease on
    /// `parent` it was answered under; once that lease is gone (its holder did not
    /// answer a revocation and was evicted) the create is refused, as a late change
    /// of a client cut off, unless the lease is of the MDS's previous run and its
    /// recovery still waits for this client (see the MDS's `recovery`).
    MdsCreateGranted {
        creds: Creds,
        parent: Fid,
        name: String,
        mode: u32,
        flags: OpenFlags,
        fid: Fid,
        layout: Layout,
        #[serde(with = "crate::bytes_field")]
        data: Vec<u8>,
        lease: u64,
    },

    // ---- OSS, continued ----
    /// Short-circuit local I/O (`rpc::short_circuit`), served only on an OST's local
    /// socket: a descriptor of object `object` of OST `ost`, passed with the answer
    /// ([`Response::ObjectOpened`]), for a client on the OSS's machine to read and
    /// write itself. `create`: make the object if it does not exist (a write), else
    /// answer that it does not (a read of a hole).
    OstOpen {
        ost: u32,
        object: ObjectId,
        create: bool,
    },

    // ---- MDS, continued ----
    /// A listing with the attributes a lookup of each entry would return (FUSE's
    /// `READDIRPLUS`: `ls -l`, `du`, `find`, `cp -a` and `rm -rf` without a lookup per
    /// entry): entries after `after` (name order), at most `max`. Needs read and
    /// search permission on the directory. Answered with [`Response::DirentsPlus`];
    /// an entry whose inode is on another MDT, or is a striped directory, comes
    /// without attributes (a lookup gives them). A striped directory answers with
    /// its table ([`Response::Striped`]), as [`Request::MdsReaddir`] does.
    MdsReaddirPlus {
        creds: Creds,
        fid: Fid,
        after: Option<String>,
        max: u32,
    },
    /// [`Request::MdsUnlink`] answered by the client before it was sent (under its
    /// lease on `parent`), at time `at` by the client's clock: the directory's mtime
    /// and ctime, and the file's ctime, take `at` (as Lustre's MDT takes the times a
    /// client's request carries), so they are what the client already told its
    /// kernel. `lease`: as [`Request::MdsCreateGranted`]'s.
    MdsUnlinkAt {
        creds: Creds,
        parent: Fid,
        name: String,
        at: Timespec,
        lease: u64,
    },
    // ---- Added in protocol 8 (at the end, so earlier variants keep their codes) ----
    /// Changes pool `pool` of file system `fsname`: `osts` are the OSTs added or
    /// removed (empty for create and destroy).
    MgsPool {
        fsname: String,
        pool: String,
        op: PoolOp,
        osts: Vec<u32>,
    },
    /// Has the MDS fetch the configuration from the MGS now (after a pool change, so
    /// that it places files by the new pools at once). Answered with `Ok`.
    MdsRefreshConfig,
    /// Gives file `fid` the layout `layout` in place of its own (the end of `braid
    /// migrate`): `layout`'s components, with ids above every id `fid`'s layout has,
    /// hold a copy of its bytes written while it stayed at `data_version`; the objects
    /// of its old components are destroyed. Refused if `fid` changed since (`Again`)
    /// or another client holds it open (`Busy`). Answered with `fid`'s attributes.
    MdsReplaceLayout {
        creds: Creds,
        fid: Fid,
        layout: Layout,
        data_version: u64,
    },
    /// The opens MDT `mdt` logged after number `after` (Lustre's changelog `OPEN`
    /// records, kept in memory and bounded: a tiering service learns from them which
    /// files are read). Answered with [`Response::OpenLog`].
    MdsOpenLog {
        mdt: u32,
        after: u64,
    },
    // ---- Added in protocol 9 ----
    /// The client holds `handles` handles of `fid` open (for writing with `write`),
    /// as it did before it reconnected (Lustre's open replay): the MDS counts them
    /// again, so a file unlinked while open outlives a restart of its MDS. Granted
    /// during a restarted MDS's recovery window, before orphans are destroyed.
    MdsReclaimOpen {
        fid: Fid,
        handles: u32,
        write: bool,
    },
    /// A Raft message between the replicas of one MDT (see `mds::replica`); the
    /// message itself is the payload, answered with [`Response::Data`] and the
    /// answer as payload. `group` names the replica group (file system and MDT group
    /// uuid), so that a replica of another group is refused.
    MdtRaft {
        fsname: String,
        group: String,
        kind: RaftRpc,
    },
    // ---- Added in protocol 10 ----
    /// Every server answers with its process's metrics in the Prometheus text format,
    /// as the payload of [`Response::Data`] (what `braid stats` and `braid top` read).
    Metrics,
    /// fsck: the rows of one of MDT `mdt`'s tables after key `after`, at most `max`,
    /// as the payload of [`Response::Data`] (an encoded [`FsckRows`]).
    MdsFsckScan {
        mdt: u32,
        table: FsckTable,
        after: Option<Vec<u8>>,
        max: u32,
    },
    /// fsck: a repair of the namespace, applied as any change is (journaled, kept
    /// in the reply cache, replicated). Root only.
    MdsFsckRepair {
        creds: Creds,
        fix: FsckFix,
    },
    /// fsck: OST `ost`'s objects after `after` (in the order of their fan-out
    /// directory, then name), at most `max`, as the payload of [`Response::Data`]
    /// (an encoded [`FsckObjects`]).
    OstFsckList {
        ost: u32,
        after: Option<ObjectId>,
        max: u32,
    },
    /// fsck: moves an object no layout names into the OST's `lost+found/`
    /// directory, where an admin can still read it.
    OstFsckLostFound {
        ost: u32,
        object: ObjectId,
    },
    /// `braid migrate -m`: the inode of entry `name` in `parent` moves to MDT `mdt`
    /// under a new FID (Lustre's `lfs migrate -m`): a directory with its entries, a
    /// file with its Data-on-MDT bytes (its OST objects stay, see
    /// `Layout::objects`), each with its extended attributes. Sent to the parent's
    /// MDT, which coordinates. Root only. Answered with the attributes where it
    /// now is.
    MdsMigrate {
        creds: Creds,
        parent: Fid,
        name: String,
        mdt: u32,
    },
}

/// The MDT tables fsck reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsckTable {
    Inodes,
    Dentries,
    /// Files unlinked while open.
    Orphans,
    /// The queue of objects to destroy.
    Destroy,
}

/// A page of an MDT table's rows (keys and values as stored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckRows {
    pub rows: Vec<(Vec<u8>, Vec<u8>)>,
    pub done: bool,
}

/// A page of an OST's objects, with their sizes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckObjects {
    pub objects: Vec<(ObjectId, u64)>,
    pub done: bool,
}

/// What fsck may change in a namespace. Each is applied only if what it corrects
/// is still so when it arrives (the namespace is in use meanwhile).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsckFix {
    /// The inode's link count was `was`: set it to `nlink`.
    LinkCount { fid: Fid, was: u32, nlink: u32 },
    /// The entry `parent/name` names `child`, which does not exist: remove it.
    DropEntry { parent: Fid, name: String, child: Fid },
    /// A directory's `..` was `was`: set it to `parent`.
    Parent { fid: Fid, was: Option<Fid>, parent: Fid },
}

impl FsckFix {
    /// The inode the fix changes (its MDT applies it).
    pub fn fid(&self) -> Fid {
        match self {
            FsckFix::LinkCount { fid, .. } | FsckFix::Parent { fid, .. } => *fid,
            FsckFix::DropEntry { parent, .. } => *parent,
        }
    }
}

/// The Raft messages replicas exchange ([`Request::MdtRaft`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaftRpc {
    Vote,
    AppendEntries,
    InstallSnapshot,
}

impl Request {
    /// The caller's credentials a request carries, for the MDS to check (and squash,
    /// [`crate::squash`]). A new request with credentials must be listed here.
    /// The target a request is for: the OST it names, or the MDT of its FID (or of
    /// its `mdt`); `None` for requests of a whole server (ping, the MGS's, Raft,
    /// metrics).
    pub fn target(&self) -> Option<(TargetKind, u32)> {
        use Request::*;
        let mdt = |fid: &Fid| Some((TargetKind::Mdt, fid.mdt()));
        match self {
            OstWrite { ost, .. }
            | OstRead { ost, .. }
            | OstPunch { ost, .. }
            | OstDestroy { ost, .. }
            | OstGetattr { ost, .. }
            | OstSync { ost, .. }
            | OstStatfs { ost }
            | OstTrim { ost, .. }
            | OstOpen { ost, .. }
            | OstFsckList { ost, .. }
            | OstFsckLostFound { ost, .. } => Some((TargetKind::Ost, *ost)),
            MdsStatfs { mdt }
            | MdsUpdate { mdt, .. }
            | MdsUpdateDone { mdt, .. }
            | MdsFidGrant { mdt, .. }
            | MdsOpenLog { mdt, .. }
            | MdsFsckScan { mdt, .. } => Some((TargetKind::Mdt, *mdt)),
            MdsFsckRepair { fix, .. } => mdt(&fix.fid()),
            MdsLookup { parent, .. }
            | MdsCreate { parent, .. }
            | MdsMkdir { parent, .. }
            | MdsSymlink { parent, .. }
            | MdsMknod { parent, .. }
            | MdsLink { parent, .. }
            | MdsUnlink { parent, .. }
            | MdsRmdir { parent, .. }
            | MdsRename { parent, .. }
            | MdsOpenAt { parent, .. }
            | MdsCreateGranted { parent, .. }
            | MdsUnlinkAt { parent, .. }
            | MdsMigrate { parent, .. } => mdt(parent),
            MdsGetattr { fid }
            | MdsOpen { fid, .. }
            | MdsReaddir { fid, .. }
            | MdsSetattr { fid, .. }
            | MdsReadlink { fid }
            | MdsSetxattr { fid, .. }
            | MdsGetxattr { fid, .. }
            | MdsListxattr { fid, .. }
            | MdsRemovexattr { fid, .. }
            | MdsSetDirLayout { fid, .. }
            | MdsGetDirLayout { fid }
            | MdsSizeUpdate { fid, .. }
            | MdsClose { fid, .. }
            | MdsSetLock { fid, .. }
            | MdsGetLock { fid, .. }
            | MdsAncestors { fid }
            | MdsSync { fid }
            | MdsLayoutChange { fid, .. }
            | MdsDomRead { fid, .. }
            | MdsDomWrite { fid, .. }
            | MdsDomTrim { fid, .. }
            | MdsDomPunch { fid, .. }
            | MdsDomGetattr { fid }
            | MdsStatahead { fid, .. }
            | MdsReaddirPlus { fid, .. }
            | MdsReplaceLayout { fid, .. }
            | MdsReclaimOpen { fid, .. } => mdt(fid),
            MdsCloseMany { fids } => fids.first().and_then(mdt),
            MdsLeaseCancel { leases } => leases.first().and_then(|(fid, _)| mdt(fid)),
            MdsShardSync(_) | MdsRenameLock { .. } | MdsUpdateQuery { .. } | MdsRefreshConfig => None,
            Ping | MgsRegister { .. } | MgsHeartbeat { .. } | MgsGetConfig | MgsPool { .. } => None,
            TraceBatch | MdtRaft { .. } | Metrics => None,
        }
    }

    /// File bytes the message carries inline rather than as a payload (a DoM write,
    /// a small file's bytes with its create): what job stats count besides payloads.
    pub fn inline_bytes(&self) -> usize {
        match self {
            Request::MdsDomWrite { data, .. } | Request::MdsCreateGranted { data, .. } => data.len(),
            _ => 0,
        }
    }

    /// Makes the request name inode `to` where it names `from` (which moved there,
    /// see [`Response::Moved`]); false if it names `from` nowhere it can be
    /// changed.
    pub fn retarget(&mut self, from: Fid, to: Fid) -> bool {
        use Request::*;
        let mut changed = false;
        let mut swap = |f: &mut Fid| {
            if *f == from {
                *f = to;
                changed = true;
            }
        };
        match self {
            MdsRename { parent, new_parent, .. } => {
                swap(parent);
                swap(new_parent);
            }
            MdsLink { fid, parent, .. } => {
                swap(fid);
                swap(parent);
            }
            MdsLookup { parent, .. }
            | MdsCreate { parent, .. }
            | MdsMkdir { parent, .. }
            | MdsSymlink { parent, .. }
            | MdsMknod { parent, .. }
            | MdsUnlink { parent, .. }
            | MdsRmdir { parent, .. }
            | MdsOpenAt { parent, .. }
            | MdsUnlinkAt { parent, .. }
            | MdsMigrate { parent, .. } => swap(parent),
            MdsGetattr { fid }
            | MdsOpen { fid, .. }
            | MdsReaddir { fid, .. }
            | MdsReaddirPlus { fid, .. }
            | MdsStatahead { fid, .. }
            | MdsSetattr { fid, .. }
            | MdsSetxattr { fid, .. }
            | MdsGetxattr { fid, .. }
            | MdsListxattr { fid, .. }
            | MdsRemovexattr { fid, .. }
            | MdsSetDirLayout { fid, .. }
            | MdsGetDirLayout { fid }
            | MdsAncestors { fid }
            | MdsReadlink { fid }
            | MdsLayoutChange { fid, .. }
            | MdsReplaceLayout { fid, .. }
            | MdsDomRead { fid, .. }
            | MdsDomWrite { fid, .. }
            | MdsDomTrim { fid, .. }
            | MdsDomPunch { fid, .. }
            | MdsDomGetattr { fid }
            | MdsSizeUpdate { fid, .. }
            | MdsClose { fid, .. }
            | MdsSetLock { fid, .. }
            | MdsGetLock { fid, .. }
            | MdsReclaimOpen { fid, .. }
            | MdsSync { fid } => swap(fid),
            _ => {}
        }
        changed
    }

    pub fn creds_mut(&mut self) -> Option<&mut Creds> {
        match self {
            Request::MdsLookup { creds, .. }
            | Request::MdsCreate { creds, .. }
            | Request::MdsOpen { creds, .. }
            | Request::MdsMkdir { creds, .. }
            | Request::MdsSymlink { creds, .. }
            | Request::MdsMknod { creds, .. }
            | Request::MdsLink { creds, .. }
            | Request::MdsUnlink { creds, .. }
            | Request::MdsRmdir { creds, .. }
            | Request::MdsRename { creds, .. }
            | Request::MdsReaddir { creds, .. }
            | Request::MdsSetattr { creds, .. }
            | Request::MdsSetxattr { creds, .. }
            | Request::MdsGetxattr { creds, .. }
            | Request::MdsListxattr { creds, .. }
            | Request::MdsRemovexattr { creds, .. }
            | Request::MdsSetDirLayout { creds, .. }
            | Request::MdsLayoutChange { creds, .. }
            | Request::MdsOpenAt { creds, .. }
            | Request::MdsStatahead { creds, .. }
            | Request::MdsCreateGranted { creds, .. }
            | Request::MdsReaddirPlus { creds, .. }
            | Request::MdsUnlinkAt { creds, .. }
            | Request::MdsReplaceLayout { creds, .. }
            | Request::MdsFsckRepair { creds, .. }
            | Request::MdsMigrate { creds, .. } => Some(creds),
            _ => None,
        }
    }

    /// A short name for logs and metrics.
    pub fn op_name(&self) -> &'static str {
        match self {
            Request::Ping => "ping",
            Request::MgsRegister { .. } => "mgs_register",
            Request::MgsHeartbeat { .. } => "mgs_heartbeat",
            Request::MgsGetConfig => "mgs_get_config",
            Request::MgsPool { .. } => "mgs_pool",
            Request::MdsLookup { .. } => "lookup",
            Request::MdsGetattr { .. } => "getattr",
            Request::MdsCreate { .. } => "create",
            Request::MdsOpen { .. } => "open",
            Request::MdsMkdir { .. } => "mkdir",
            Request::MdsSymlink { .. } => "symlink",
            Request::MdsMknod { .. } => "mknod",
            Request::MdsLink { .. } => "link",
            Request::MdsUnlink { .. } => "unlink",
            Request::MdsRmdir { .. } => "rmdir",
            Request::MdsRename { .. } => "rename",
            Request::MdsReaddir { .. } => "readdir",
            Request::MdsSetattr { .. } => "setattr",
            Request::MdsReadlink { .. } => "readlink",
            Request::MdsSetxattr { .. } => "setxattr",
            Request::MdsGetxattr { .. } => "getxattr",
            Request::MdsListxattr { .. } => "listxattr",
            Request::MdsRemovexattr { .. } => "removexattr",
            Request::MdsStatfs { .. } => "statfs",
            Request::MdsSetDirLayout { .. } => "set_dir_layout",
            Request::MdsGetDirLayout { .. } => "get_dir_layout",
            Request::MdsSizeUpdate { .. } => "size_update",
            Request::MdsClose { .. } => "close",
            Request::MdsSetLock { .. } => "setlk",
            Request::MdsGetLock { .. } => "getlk",
            Request::MdsSync { .. } => "md_sync",
            Request::MdsLayoutChange { .. } => "layout_change",
            Request::MdsReplaceLayout { .. } => "replace_layout",
            Request::MdsOpenLog { .. } => "open_log",
            Request::MdsReclaimOpen { .. } => "reclaim_open",
            Request::MdtRaft { .. } => "mdt_raft",
            Request::Metrics => "metrics",
            Request::MdsFsckScan { .. } => "fsck_scan",
            Request::MdsFsckRepair { .. } => "fsck_repair",
            Request::MdsMigrate { .. } => "migrate_mdt",
            Request::OstFsckList { .. } => "ost_fsck_list",
            Request::OstFsckLostFound { .. } => "ost_fsck_lost_found",
            Request::MdsRefreshConfig => "refresh_config",
            Request::MdsDomRead { .. } => "dom_read",
            Request::MdsDomWrite { .. } => "dom_write",
            Request::MdsDomTrim { .. } => "dom_trim",
            Request::MdsDomPunch { .. } => "dom_punch",
            Request::MdsDomGetattr { .. } => "dom_getattr",
            Request::MdsOpenAt { .. } => "open_at",
            Request::MdsCloseMany { .. } => "close_many",
            Request::MdsUpdate { .. } => "update",
            Request::MdsUpdateDone { .. } => "update_done",
            Request::MdsUpdateQuery { .. } => "update_query",
            Request::MdsShardSync(_) => "shard_sync",
            Request::MdsAncestors { .. } => "ancestors",
            Request::MdsRenameLock { .. } => "rename_lock",
            Request::MdsLeaseCancel { .. } => "lease_cancel",
            Request::OstWrite { .. } => "ost_write",
            Request::OstRead { .. } => "ost_read",
            Request::OstPunch { .. } => "ost_punch",
            Request::OstDestroy { .. } => "ost_destroy",
            Request::OstGetattr { .. } => "ost_getattr",
            Request::OstSync { .. } => "ost_sync",
            Request::OstStatfs { .. } => "ost_statfs",
            Request::OstTrim { .. } => "ost_trim",
            Request::TraceBatch => "trace_batch",
            Request::MdsStatahead { .. } => "statahead",
            Request::MdsFidGrant { .. } => "fid_grant",
            Request::MdsCreateGranted { .. } => "create_granted",
            Request::OstOpen { .. } => "ost_open",
            Request::MdsReaddirPlus { .. } => "readdirplus",
            Request::MdsUnlinkAt { .. } => "unlink",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Ok,
    Error(RemoteError),
    /// A size report made under an older truncate epoch was not applied (see
    /// [`Request::MdsSizeUpdate`]); the file's epoch is now `trunc_epoch`.
    EpochMoved {
        trunc_epoch: u64,
    },
    Registered {
        index: u32,
    },
    Config(ClusterConfig),
    Attr(Attr),
    Created {
        attr: Attr,
        existed: bool,
        /// The parent directory's attributes after the create (`None` if it existed).
        dir: Option<Attr>,
        /// Whether the new file's OSTs were the MDS's free choice (no `-o` or `-i` in
        /// the layout it asked for): a client answering creates in the directory
        /// itself may then place them on other OSTs up (in the same pools), as the
        /// MDS's round robin would (see `client::async_create`).
        free: bool,
    },
    Dirents {
        entries: Vec<DirEntry>,
        eof: bool,
    },
    Link(String),
    Xattr(Vec<u8>),
    XattrNames(Vec<String>),
    Usage(Usage),
    DirLayout(Option<LayoutSpec>),
    /// Object data follows as the payload (shorter than asked at the object's end).
    Data,
    Written {
        bytes: u64,
    },
    ObjectAttr {
        size: u64,
        exists: bool,
    },
    /// Answer to [`Request::MdsGetLock`]: the conflicting lock, if any.
    Lock(Option<LockInfo>),
    /// An entry was removed (unlink, rmdir): the parent directory's new attributes.
    DirChanged {
        dir: Attr,
    },
    /// Answer to [`Request::MdsMkdir`]: the new directory, its parent's new
    /// attributes, and the id of the lease granted on the new directory, if one was
    /// asked for. While a client holds a directory lease, every change to the
    /// directory's entries is its own: the MDS revokes the lease
    /// ([`Callback::RevokeLease`]) before another client may change them, so the
    /// holder knows every name in it and answers lookups of absent names itself.
    DirMade {
        attr: Attr,
        parent: Attr,
        lease: Option<u64>,
    },
    /// Answer to [`Request::MdsOpen`] of a small Data-on-MDT file: its attributes,
    /// and its bytes from offset 0 as the payload (the whole file as of the open), so
    /// reading it needs no further round trip.
    OpenedWithData {
        attr: Attr,
    },
    /// Answer to [`Request::MdsDomWrite`]: the bytes written, and whether the size was
    /// published with them.
    DomWritten {
        bytes: u64,
        size_published: bool,
    },
    /// Answer to [`Request::MdsUpdateQuery`].
    Update(UpdateState),
    /// The request named an entry in a striped directory, whose name lives in
    /// another shard: the directory's shards, for the client to send it there.
    Striped(DirStripes),
    /// Answer to [`UpdateOp::ReserveFid`]: the FID reserved for the operation.
    Reserved(Fid),
    /// Answer to [`Request::MdsAncestors`].
    Ancestors(Vec<Fid>),
    /// Answer to [`Request::MdsStatahead`]: entries after the one asked for, with the
    /// attributes a lookup of each would have returned; `eof` when the directory has
    /// no entry after the last one listed (left-out entries count as listed).
    EntryAttrs {
        entries: Vec<(String, Attr)>,
        /// The last name the MDT listed (the next request's `after`).
        last: Option<String>,
        eof: bool,
    },
    /// Answer to [`Request::MdsFidGrant`]: FIDs `first` up to (not including) object
    /// id `first.oid + count`, in `first`'s sequence.
    FidGrant {
        first: Fid,
        count: u32,
    },
    /// Answer to [`Request::OstOpen`]: when `exists`, the object's descriptor came
    /// with this frame (`SCM_RIGHTS`); otherwise the object does not exist.
    ObjectOpened {
        exists: bool,
    },
    /// Answer to [`Request::MdsReaddirPlus`].
    DirentsPlus {
        entries: Vec<DirEntryPlus>,
        eof: bool,
    },
    /// Answer to [`Request::MdsOpen`] and [`Request::MdsOpenAt`] of a file with no
    /// extended attributes at all (other than a small Data-on-MDT file, answered
    /// [`Response::OpenedWithData`]): its attributes. A copy that keeps attributes
    /// (`cp -a`) lists them right after the open; the client answers that itself.
    OpenedWithoutXattrs {
        attr: Attr,
    },
    /// Answer to [`Request::MdsOpenLog`]: the opens numbered `after + 1` up to
    /// `next - 1` that the log still holds, oldest first, at most [`OPEN_LOG_BATCH`].
    /// `first` is the oldest number the log holds: opens between `after` and it were
    /// dropped (a reader that fell behind, or an MDS restart, which starts the log
    /// again).
    OpenLog {
        first: u64,
        next: u64,
        opens: Vec<LoggedOpen>,
    },
    /// Answer to [`UpdateOp::Release`]: what the inode takes along.
    InodeCopy(Box<InodeCopy>),
    /// In place of the answer: inode `from`, which the request names, moved to
    /// another MDT as `to` (`braid migrate -m`); nothing was done. The client sends
    /// the request again naming `to`.
    Moved {
        from: Fid,
        to: Fid,
    },
}

/// Most opens one [`Response::OpenLog`] carries.
pub const OPEN_LOG_BATCH: usize = 4096;

/// One open an MDT logged (see [`Request::MdsOpenLog`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedOpen {
    pub fid: Fid,
    pub at: Timespec,
    /// The client that opened it.
    pub client: u64,
}

/// `braid mkdir -i -1`: the MDS chooses the MDT (Lustre's `-1` as an unsigned index).
pub const MDT_BALANCED: u32 = u32::MAX;

/// Most entries one [`Response::Dirents`] carries: an MDT answers a larger `max`
/// with this many.
pub const READDIR_MAX: u32 = 4096;

/// Longest xattr name the MDS takes (Linux's `XATTR_NAME_MAX`).
pub const XATTR_NAME_MAX: usize = 255;

/// `braid mkdir -c -1` / `setdirstripe -c -1`: a directory striped over every MDT.
pub const DIR_STRIPES_ALL: u32 = u32::MAX;

/// Where a directory goes over MDTs, as `lfs setdirstripe` asks (Lustre's LMV user
/// descriptor): `count` shards ([`DIR_STRIPES_ALL`] for every MDT; 1 for a plain
/// directory) from MDT `mdt` ([`MDT_BALANCED`]: the MDS chooses, round-robin over the
/// MDTs that are up), names spread by `hash`. Also a directory's default for the
/// directories made in it (`setdirstripe -D`, Lustre's default LMV), inherited by
/// them, kept as the directory's xattr [`DirSpec::XATTR`] in a text form a user can
/// read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirSpec {
    pub mdt: u32,
    pub count: u32,
    pub hash: DirHash,
}

impl DirSpec {
    /// Where Lustre keeps its default LMV.
    pub const XATTR: &'static str = "trusted.dmv";

    /// A plain directory on MDT `mdt`.
    pub fn on(mdt: u32) -> DirSpec {
        DirSpec { mdt, count: 1, hash: DirHash::default() }
    }

    /// `stripe_count=N stripe_offset=K hash_type=H` (`-1` for every MDT and for
    /// balanced).
    pub fn to_xattr(&self) -> Vec<u8> {
        let signed = |v: u32| if v == u32::MAX { -1 } else { v as i64 };
        let (count, offset) = (signed(self.count), signed(self.mdt));
        format!("stripe_count={count} stripe_offset={offset} hash_type={}", self.hash.name()).into_bytes()
    }

    pub fn from_xattr(v: &[u8]) -> Result<DirSpec, String> {
        let text = std::str::from_utf8(v).map_err(|_| "a default directory layout is text".to_string())?;
        let (mut count, mut offset, mut hash) = (None, None, DirHash::default());
        let index = |n: &str| match n.parse::<i64>() {
            Ok(-1) => Some(u32::MAX),
            Ok(k) if (0..u32::MAX as i64).contains(&k) => Some(k as u32),
            _ => None,
        };
        for field in text.split_whitespace() {
            match field.split_once('=') {
                Some(("stripe_count", n)) => count = index(n),
                Some(("stripe_offset", n)) => offset = index(n),
                Some(("hash_type", h)) => hash = DirHash::parse(h)?,
                _ => return Err(format!("unknown field {field:?} in a default directory layout")),
            }
        }
        let bad = || format!("invalid default directory layout {text:?}: want stripe_count=N stripe_offset=K|-1");
        match (count, offset) {
            (Some(count), Some(mdt)) if count != 0 => {
                let spec = DirSpec { mdt, count, hash };
                spec.check()?;
                Ok(spec)
            }
            _ => Err(bad()),
        }
    }

    /// Checks what can be checked without the cluster's MDT count.
    pub fn check(&self) -> Result<(), String> {
        if self.count == 0 || (self.count > layout::DIR_STRIPES_MAX && self.count != DIR_STRIPES_ALL) {
            return Err(format!(
                "stripe count {} is out of range (1 to {}, or -1)",
                self.count,
                layout::DIR_STRIPES_MAX
            ));
        }
        Ok(())
    }
}

/// Names one operation that spans MDTs: the coordinator MDT and a number unique on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UpdateId {
    pub mdt: u32,
    pub seq: u64,
}

/// What a coordinator asks of the MDT holding an inode (see [`Request::MdsUpdate`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum UpdateOp {
    /// Make the inode of a new directory `name` in `parent` (on the coordinator):
    /// answered with its attributes ([`Response::Attr`]).
    MkdirInode {
        creds: Creds,
        parent: Fid,
        name: String,
        mode: u32,
        gid: u32,
        dir_default: Option<LayoutSpec>,
        /// The parent's default for new directories, inherited.
        dirs_default: Option<DirSpec>,
        /// A shard of a striped directory: the FID reserved for it
        /// ([`UpdateOp::ReserveFid`], on this participant, by this operation) and the
        /// whole shard table.
        shard: Option<(Fid, DirStripes)>,
    },
    /// Reserve a FID for a shard of a striped directory this operation makes
    /// (answered [`Response::Reserved`]); an aborted operation frees it.
    ReserveFid,
    /// Remove the inode of directory `fid`, entry `name` in `parent`, if it is empty.
    RmdirInode { fid: Fid, parent: Fid, name: String },
    /// One more link to file `fid` (not a directory), for a new entry `name` in
    /// `parent` (a hard link across MDTs): answered with its attributes.
    LinkInode { fid: Fid, parent: Fid, name: String },
    /// One link less to file `fid` (not a directory), whose entry `name` in `parent`
    /// the coordinator removes; the last one makes it an orphan or destroys it.
    UnlinkInode { fid: Fid, parent: Fid, name: String },
    /// The source half of a rename between MDTs: entry `name` in `parent` (on the
    /// participant), which names `child`, goes once the coordinator made the new one.
    /// A directory moves to `dir_to`: `parent` loses its link, and the directory's
    /// `..` names `dir_to` if its inode is on the participant.
    RemoveEntry { creds: Creds, parent: Fid, name: String, child: Attr, dir_to: Option<Fid> },
    /// The first side of an exchange across MDTs (`renameat2(RENAME_EXCHANGE)`): entry
    /// `name` in `parent` (on the participant), which names `child`, names `with`
    /// (whose entry is in `to`, on the coordinator) once the coordinator swapped its
    /// side.
    ExchangeEntry { creds: Creds, parent: Fid, name: String, child: Attr, with: Box<Attr>, to: Fid },
    /// Inode `fid` (on the participant) is renamed from directory `from` to `to`,
    /// both on other MDTs: once the coordinator made the new entry its ctime moves,
    /// and a directory's `..` names `to`.
    SetParent { fid: Fid, from: Fid, to: Fid },
    /// `braid migrate -m`: inode `from`, entry `name` in `parent` (on the
    /// coordinator), made again here under a new FID from `copy`; for a directory,
    /// this MDT's subdirectories among its entries take it as their `..`. Kept if the
    /// coordinator's batch found `from` still as copied. Answered with its attributes.
    Adopt { parent: Fid, name: String, from: Fid, copy: Box<InodeCopy> },
    /// `braid migrate -m` of a remote inode (its entry `name` in `parent` on the
    /// coordinator, its inode `fid` here), to MDT `to`, where all of a directory's
    /// subdirectories must be already: the inode takes no change until the
    /// verdict, which drops it if committed. Answered with [`Response::InodeCopy`].
    Release { fid: Fid, parent: Fid, name: String, to: u32 },
    /// The FID of the copy of directory `fid`, released by this operation: where
    /// requests naming `fid` are sent once it is gone.
    ReleasedTo { fid: Fid, to: Fid },
}

/// What an inode moving to another MDT takes along (see [`UpdateOp::Adopt`]):
/// its attributes, extended attributes (a directory's default for new directories
/// among them) and, by kind, a directory's default layout and entries (in key
/// order), a symlink's target, a file's Data-on-MDT blocks (index, bytes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InodeCopy {
    pub attr: Attr,
    pub dir_default: Option<LayoutSpec>,
    pub xattrs: Vec<(String, Vec<u8>)>,
    pub entries: Vec<(String, Fid, FileKind)>,
    pub symlink: Option<String>,
    pub dom: Vec<(u64, Vec<u8>)>,
}

/// What a shard of a striped directory keeps of the directory's attributes (see
/// [`Request::MdsShardSync`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardSync {
    /// The shard, and its directory (shard 0).
    pub fid: Fid,
    pub master: Fid,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Times set on the directory (`utimes`), to set on the shard too; `None` when
    /// no change set them (a shard's own times are newer once it took entries).
    pub times: Option<(Timespec, Timespec)>,
    /// The default layout of new files, and of new directories.
    pub dir_default: Option<LayoutSpec>,
    pub dirs_default: Option<DirSpec>,
}

/// A coordinator's answer about an operation a participant holds pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpdateState {
    /// Still under way: ask again later.
    InFlight,
    /// The coordinator applied its half: keep the participant's.
    Committed,
    /// The coordinator never applied its half, and no longer will: take the
    /// participant's back.
    Aborted,
}

/// Most bytes one [`Request::MdsDomWrite`] carries (a message is at most 1 MiB).
pub const DOM_WRITE_MAX: u64 = 512 << 10;

/// What a server asks of a client on the client's own connection (a callback frame);
/// the client carries it out and acks it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Callback {
    /// Stop relying on lease `lease` of directory `dir`: another client is about to
    /// change its entries.
    RevokeLease { dir: Fid, lease: u64 },
    /// Object `object` of OST `ost` was destroyed (unlinked): a descriptor of it a
    /// short-circuit client holds names a file no one will find again, and goes.
    /// Sent on an OST's local socket, never acknowledged.
    ObjectDestroyed { ost: u32, object: ObjectId },
    /// The MDS restarted, and leases of its previous run are gone: ack once the
    /// creates, flushes and unlinks deferred under them have landed, before other
    /// clients read or change directory entries again (see the MDS's `recovery`).
    Recovered,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockType {
    Read,
    Write,
    Unlock,
}

/// A byte-range lock as one lock owner asks for it (`fcntl`'s `struct flock`):
/// `[start, end]`, `end` inclusive; [`LockType::Unlock`] releases the range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRequest {
    /// The client's lock owner (the kernel's `lock_owner`): locks of one owner never
    /// conflict with each other.
    pub owner: u64,
    /// The process, reported to `F_GETLK` callers of other owners.
    pub pid: u32,
    pub lock: LockType,
    pub start: u64,
    pub end: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    pub lock: LockType,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

impl Response {
    pub fn error(code: crate::Errno, message: impl Into<String>) -> Response {
        Response::Error(RemoteError::new(code, message))
    }
}

/// First message of a connection, from the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    pub client_nonce: [u8; 32],
    /// Stable for the life of a client instance: keys the MDS reply cache.
    pub client_id: u64,
    /// What connects (for logs): "client", "mds", "oss".
    pub role: String,
}

/// The server's answer to [`Hello`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Challenge {
    pub server_nonce: [u8; 32],
    /// False when the server runs with `--insecure`.
    pub secured: bool,
    /// HMAC proving the server knows the secret (empty when not secured).
    pub server_proof: Vec<u8>,
}

/// The client's proof.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuthProof {
    pub client_proof: Vec<u8>,
}

/// Outcome of the handshake.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AuthResult {
    Welcome,
    Denied(String),
}

/// A message that does not encode or decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(String);

/// Encodes a message ([`Request`], [`Response`], [`Callback`]) as the frame carries it.
pub fn encode<T: Serialize + ?Sized>(m: &T) -> Result<Vec<u8>, CodecError> {
    postcard::to_stdvec(m).map_err(|e| CodecError(e.to_string()))
}

/// Longest job id a request carries; a longer one is cut at a character boundary.
pub const JOB_ID_MAX_BYTES: usize = 64;

/// Encodes a request, followed by the job id it is made for, if any: the id of the
/// batch job of the calling process (Lustre's jobid, from `SLURM_JOB_ID` or the
/// variable the admin names), by which servers count operations and bytes per job.
pub fn encode_request(req: &Request, job: Option<&str>) -> Result<Vec<u8>, CodecError> {
    let mut out = encode(req)?;
    if let Some(job) = job {
        let mut end = job.len().min(JOB_ID_MAX_BYTES);
        while !job.is_char_boundary(end) {
            end -= 1;
        }
        out.extend_from_slice(&encode(&job[..end])?);
    }
    Ok(out)
}

/// Decodes what [`encode_request`] made: the request and its job id.
pub fn decode_request(bytes: &[u8]) -> Result<(Request, Option<String>), CodecError> {
    let (req, rest) = postcard::take_from_bytes::<Request>(bytes).map_err(|e| CodecError(e.to_string()))?;
    if rest.is_empty() {
        return Ok((req, None));
    }
    let (job, rest) =
        postcard::take_from_bytes::<&str>(rest).map_err(|e| CodecError(format!("malformed job id: {e}")))?;
    if !rest.is_empty() || job.len() > JOB_ID_MAX_BYTES || job.chars().any(char::is_control) {
        return Err(CodecError("malformed job id: too long, trailing bytes or control characters".into()));
    }
    Ok((req, Some(job.to_string())))
}

/// Decodes a message a frame carried.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, CodecError> {
    postcard::from_bytes(bytes).map_err(|e| CodecError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_squashed_becomes_the_squash_user_with_no_groups() {
        let rule = crate::squash::RootSquash::parse("65534:65533", "10.0.0.0/24").unwrap().unwrap();
        let far: std::net::IpAddr = "10.0.1.5".parse().unwrap();
        let mut c = Creds { uid: 0, gid: 0, groups: vec![0, 4] };
        assert!(c.squash(&rule, far));
        assert_eq!(c, Creds { uid: 65534, gid: 65533, groups: vec![] });
        let mut exempt = Creds::root();
        assert!(!exempt.squash(&rule, "10.0.0.9".parse().unwrap()));
        assert_eq!(exempt, Creds::root());
        let mut user = Creds { uid: 1000, gid: 0, groups: vec![0] };
        assert!(!user.squash(&rule, far), "only root is squashed");
        assert_eq!(user.gid, 0);
    }

    #[test]
    fn a_job_id_rides_after_its_request_and_a_bad_one_is_refused() {
        let req = Request::OstStatfs { ost: 3 };
        assert_eq!(decode_request(&encode_request(&req, None).unwrap()).unwrap(), (req.clone(), None));
        let with = encode_request(&req, Some("4711")).unwrap();
        assert_eq!(decode_request(&with).unwrap(), (req.clone(), Some("4711".to_string())));
        // Cut at the bound, on a character boundary.
        let long = "\u{e9}".repeat(40);
        let (_, job) = decode_request(&encode_request(&req, Some(&long)).unwrap()).unwrap();
        assert_eq!(job.unwrap(), "\u{e9}".repeat(JOB_ID_MAX_BYTES / 2));
        let mut trailing = with.clone();
        trailing.push(0);
        assert!(decode_request(&trailing).is_err());
        let mut control = encode(&req).unwrap();
        control.extend_from_slice(&encode("a\nb").unwrap());
        assert!(decode_request(&control).is_err());
        let mut oversized = encode(&req).unwrap();
        oversized.extend_from_slice(&encode(&"x".repeat(200)).unwrap());
        assert!(decode_request(&oversized).is_err());
        assert_eq!(Request::OstStatfs { ost: 3 }.target(), Some((TargetKind::Ost, 3)));
        assert_eq!(Request::MdsGetattr { fid: Fid::new(2, 1, 1) }.target(), Some((TargetKind::Mdt, 2)));
        assert_eq!(Request::Ping.target(), None);
    }
}
