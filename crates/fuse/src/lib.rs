//! The FUSE front end: a POSIX mount over the native client.
//!
//! Inode numbers are a lossless packing of the FID ([`Fid::ino`]), so the mount keeps
//! no inode table: any inode number the kernel hands back turns into a FID by
//! arithmetic. The root is inode 1 as FUSE requires.
//!
//! What the mount keeps is small and bounded by what the kernel has open: file and
//! directory handles, and per open inode a shared size cell (so `stat` during a
//! write shows the writer's size before it closes) and the lock owners that hold
//! locks (so a close releases POSIX locks without a round trip when none are held).
//!
//! Permission checks happen on the MDS with the caller's uid, gid and groups (read
//! from `/proc/PID/status`). The kernel also checks (`default_permissions`) with the
//! attributes it caches: without it a dentry cached by one user's lookup lets another
//! user walk through a directory they may not search, since FUSE only asks the
//! daemon on a lookup, never for the search bit of a cached path.
//! Writes reach the OSTs as the exact bytes written (no writeback cache, so two
//! clients writing disjoint ranges of one file never overwrite each other's bytes).

mod handles;
pub mod mount;
mod nocaps;
mod serve;
mod stale;
mod stats;
mod told;

pub use mount::{mount, unmount, Mounted, Unmounted, Unmounter};

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use client::Fid;
use client::{
    Attr, Creds, FileKind, LockRequest, LockType, OpenFlags, RenameFlags, SetAttr, TimeSet, Timespec, XattrMode,
};
use client::{Client, ClientError, OpenFile};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags as FuseOpenFlags, RenameFlags as FuseRenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use handles::{DirHandle, Handles, InodeState, Passthrough};

/// Settings of one mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// How long the kernel may cache attributes.
    pub attr_ttl: Duration,
    /// How long the kernel may cache name lookups.
    pub entry_ttl: Duration,
    pub allow_other: bool,
    /// Every open bypasses the kernel's page cache, as if opened `O_DIRECT`.
    pub direct_io: bool,
    /// Read-only opens of a file the SSD cache holds whole pass through to its cache
    /// file (see [`State::io_mode`]).
    pub passthrough: bool,
    pub read_only: bool,
    /// Programs in the mount may not be executed (`noexec`, as on any file system).
    pub no_exec: bool,
    /// FUSE request threads.
    pub threads: usize,
    /// Largest write request the kernel sends.
    pub max_write_bytes: u32,
    /// Kernel read-ahead of the mount, in KiB (the bdi's `read_ahead_kb`; see
    /// [`mount::tune_readahead`]).
    pub readahead_kb: u32,
    pub fsname: String,
    /// What `braid trace on|off|status` reaches through the mount's root.
    pub trace: Option<TraceHook>,
    /// How the job id of a calling process is found (`jobid_var`): every request
    /// made for it carries it, and servers count by it.
    pub jobid_var: client::jobid::JobVar,
}

/// What `braid trace` asks of a mount. The mount process supplies it: turning tracing
/// on also starts the collector that drains the trace ring.
pub trait TraceControl: Send + Sync {
    /// Turns recording on or off.
    fn set(&self, on: bool) -> Result<(), String>;
    /// The tracer's state as JSON.
    fn status(&self) -> Vec<u8>;
}

#[derive(Clone)]
pub struct TraceHook(pub Arc<dyn TraceControl>);

impl std::fmt::Debug for TraceHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TraceHook")
    }
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            attr_ttl: Duration::from_secs(1),
            entry_ttl: Duration::from_secs(1),
            allow_other: false,
            direct_io: false,
            passthrough: false,
            read_only: false,
            no_exec: false,
            threads: 8,
            max_write_bytes: 1 << 20,
            readahead_kb: 4096,
            fsname: "braid".into(),
            trace: None,
            jobid_var: client::jobid::JobVar::Env(client::jobid::DEFAULT_JOBID_VAR.into()),
        }
    }
}

/// The file system the kernel talks to: the state its requests share, which a
/// request that waits takes along (see [`serve`]).
pub struct BraidFs {
    s: Arc<State>,
}

impl std::ops::Deref for BraidFs {
    type Target = State;
    fn deref(&self) -> &State {
        &self.s
    }
}

pub struct State {
    client: Client,
    rt: tokio::runtime::Handle,
    opts: MountOptions,
    handles: Handles,
    groups: Mutex<HashMap<u32, (Instant, Vec<u32>)>>,
    /// The job ids of calling processes.
    jobs: client::jobid::JobIds,
    /// Set once the session exists; used to drop the kernel's cached attributes.
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    /// The MDS's size and mtime of each file as last handed to the kernel.
    reported: Mutex<HashMap<Fid, (u64, Timespec)>>,
    /// Files known to have no capability xattr (asked before every write).
    nocaps: nocaps::NoCaps,
    /// The data version each file had when the kernel was last allowed to fill its
    /// page cache (see [`BraidFs::keep_cache`]).
    cached_versions: Mutex<HashMap<Fid, u64>>,
    /// The kernel passes reads through to backing files for this mount (it has an SSD
    /// cache, and the kernel agreed at `FUSE_INIT`); cleared if registering one fails.
    passthrough: AtomicBool,
    /// Opens of unlinked files answered ESTALE, for the kernel's retry of them.
    stale_opens: stale::StaleOpens,
    /// What the kernel was last told of each inode, for its re-asks (see [`told`]).
    told: told::Told,
}

/// How an open is answered (see [`State::io_mode`]).
enum Open {
    /// With these flags: its I/O comes to the mount (or the kernel's page cache).
    Here(FopenFlags),
    /// Naming the inode's backing file, with these flags.
    Through(Arc<Passthrough>, FopenFlags),
    /// Refused with ETXTBSY: opened for writing while reads pass through.
    Busy,
}

/// Entries one listing request asks the MDS for.
const READDIR_BATCH: u32 = 1024;

/// Most files whose reported size and mtime are remembered.
const REPORTED_MAX: usize = 65536;

/// How long an open for writing waits for the releases of handles passing through that
/// the kernel has sent and the mount not yet read (RELEASE is queued in the background,
/// behind read-ahead). A handle still passing through after it is one a process holds:
/// the open is refused.
const PASSTHROUGH_RELEASE_WAIT: Duration = Duration::from_secs(2);

/// Tests only: milliseconds the mount holds back the RELEASE of a handle passing
/// through before it counts as closed, so that an open for writing right after a
/// reader's close(2) meets that RELEASE in flight every time (see
/// [`PASSTHROUGH_RELEASE_WAIT`]), not only when the kernel happens to be slow.
pub const PASSTHROUGH_RELEASE_DELAY_ENV: &str = "BRAID_TEST_PASSTHROUGH_RELEASE_DELAY_MS";

fn passthrough_release_delay() -> Option<Duration> {
    static DELAY: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        let ms = std::env::var(PASSTHROUGH_RELEASE_DELAY_ENV).ok()?.parse().ok()?;
        Some(Duration::from_millis(ms))
    })
}

const ROOT_INO: u64 = 1;
/// Read on the mount's root: the SSD cache's statistics as JSON (`braid cache status`).
pub const CACHE_STATUS_XATTR: &str = "braid.cache.status";
/// Set on the mount's root, by root: empties the SSD cache (`braid cache drop`).
pub const CACHE_DROP_XATTR: &str = "braid.cache.drop";
/// Read on the mount's root: the I/O tracer's state as JSON (`braid trace status`).
pub const TRACE_STATUS_XATTR: &str = "braid.trace.status";
/// Set on the mount's root, by root, to `on` or `off` (`braid trace on|off`).
pub const TRACE_XATTR: &str = "braid.trace";
/// Supplementary groups of a pid are re-read after this long.
const GROUPS_TTL: Duration = Duration::from_secs(1);
/// Most pids whose groups are remembered.
const GROUPS_CACHE_MAX: usize = 4096;

fn fid_of(ino: INodeNo) -> Fid {
    if ino.0 == ROOT_INO {
        Fid::ROOT
    } else {
        Fid::from_ino(ino.0)
    }
}

impl State {
    /// The FID of inode `ino` now: the kernel's inode numbers name FIDs, and an
    /// inode that moved to another MDT (`braid migrate -m`) has a new one, which
    /// this mount's handles and the client's state are kept under once it knows.
    fn fid(&self, ino: INodeNo) -> Fid {
        self.client.now_named(fid_of(ino))
    }
}

fn ino_of(fid: Fid) -> u64 {
    if fid == Fid::ROOT {
        ROOT_INO
    } else {
        fid.ino()
    }
}

/// The attributes of a listed entry the kernel is to keep nothing of (given with no
/// cache time): its inode number and type only.
fn placeholder_attr(ino: u64, kind: FileKind) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: file_type(kind),
        perm: 0,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// Answers an operation that returns nothing but success or an error.
fn reply_empty(reply: ReplyEmpty, r: client::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

fn errno(e: &ClientError) -> Errno {
    Errno::from_i32(e.errno().raw())
}

/// The errno for an operation on an inode the kernel named by number. A FID that no
/// longer exists means the kernel's cached dentry is stale (the name was unlinked or
/// renamed over, e.g. by another client): ESTALE makes the VFS look the path up again
/// (LOOKUP_REVAL) instead of failing with ENOENT a path that names a live file.
fn inode_errno(e: &ClientError) -> Errno {
    match e.errno().raw() {
        libc::ENOENT => Errno::from_i32(libc::ESTALE),
        n => Errno::from_i32(n),
    }
}

/// Whether thread `tid` (a FUSE request's caller) has a signal pending that will
/// run a handler or end the process (see [`interrupts`]), or is gone. A lock wait
/// then ends with `EINTR`, as `F_SETLKW` and `flock(2)` do on a local file system
/// when a handler is to run.
///
/// Why from `/proc`: the kernel tells a FUSE server with `FUSE_INTERRUPT`, but fuser
/// answers that itself with "not supported", after which the kernel stops sending it
/// and the caller, in a killable wait, sees only fatal signals. A process catching
/// SIGINT or SIGALRM in `F_SETLKW` (stress-ng's lock stressors, Python's Ctrl-C)
/// otherwise waited for the lock however long it took.
fn signal_pending(tid: u32) -> bool {
    let status = match std::fs::read_to_string(format!("/proc/{tid}/status")) {
        Ok(s) => s,
        // Gone (killed while it waited): nobody is left to take the lock. Without a
        // /proc to look in, the wait goes on as before.
        Err(e) => return e.kind() == std::io::ErrorKind::NotFound && Path::new("/proc/self/status").exists(),
    };
    let mask = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    interrupts(mask("SigPnd:") | mask("ShdPnd:"), mask("SigBlk:"), mask("SigIgn:"), mask("SigCgt:"))
}

/// Whether signals `pending` (bit n-1 for signal n), with those `blocked`, `ignored`
/// and `caught` (a handler installed), interrupt a wait: one that runs a handler, or
/// whose default action ends the process. A stop signal left to its default (Ctrl-Z)
/// or one whose default is to do nothing (SIGCHLD, SIGWINCH, ...) does not: Linux
/// restarts such a wait by itself after SIGCONT, and the caller never sees EINTR.
fn interrupts(pending: u64, blocked: u64, ignored: u64, caught: u64) -> bool {
    const fn bit(sig: i32) -> u64 {
        1 << (sig - 1)
    }
    const NO_EFFECT_BY_DEFAULT: u64 = bit(libc::SIGCHLD)
        | bit(libc::SIGCONT)
        | bit(libc::SIGSTOP)
        | bit(libc::SIGTSTP)
        | bit(libc::SIGTTIN)
        | bit(libc::SIGTTOU)
        | bit(libc::SIGURG)
        | bit(libc::SIGWINCH);
    let delivered = pending & !blocked & !ignored;
    delivered & (caught | !NO_EFFECT_BY_DEFAULT) != 0
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Socket => FileType::Socket,
    }
}

fn system_time(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
    }
}

fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
        Err(e) => Timespec { sec: -(e.duration().as_secs() as i64), nsec: 0 },
    }
}

fn name_str(name: &OsStr) -> Result<&str, Errno> {
    std::str::from_utf8(name.as_bytes()).map_err(|_| Errno::EINVAL)
}

impl BraidFs {
    pub fn new(client: Client, rt: tokio::runtime::Handle, opts: MountOptions) -> BraidFs {
        let s = State {
            client,
            rt,
            handles: Handles::default(),
            groups: Mutex::new(HashMap::new()),
            notifier: Arc::default(),
            reported: Mutex::new(HashMap::new()),
            told: told::Told::default(),
            stale_opens: stale::StaleOpens::default(),
            nocaps: nocaps::NoCaps::new(opts.attr_ttl),
            cached_versions: Mutex::new(HashMap::new()),
            passthrough: AtomicBool::new(false),
            jobs: client::jobid::JobIds::new(opts.jobid_var.clone()),
            opts,
        };
        let s = Arc::new(s);
        stats::watch_caches(Arc::downgrade(&s));
        BraidFs { s }
    }

    /// Serves a request of the caller of `req`: `op` gets the shared state, runs on
    /// this thread until it first waits, and answers the kernel itself (see [`serve`]).
    fn serve<F>(&self, name: &'static str, req: &Request, op: impl FnOnce(Arc<State>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.serve_as(name, (req.pid(), req.uid(), req.gid()), op)
    }

    /// [`BraidFs::serve`] for process `pid` of `uid` and `gid`.
    /// `name` is the FUSE operation's, for the metrics.
    fn serve_as<F>(&self, name: &'static str, caller: (u32, u32, u32), op: impl FnOnce(Arc<State>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let job = self.s.jobs.of(caller.0, caller.1);
        let op = stats::counted(name, op(self.s.clone()));
        serve::serve(&self.rt, caller, client::jobid::with_job(job, op));
    }
}

impl State {
    /// The caller's credentials, with supplementary groups for non-root callers;
    /// root squashed where the file system's configuration says so.
    fn creds(&self, req: &Request) -> Creds {
        let (uid, gid, pid) = (req.uid(), req.gid(), req.pid());
        if uid == 0 {
            return self.client.squash(Creds { uid, gid, groups: vec![] });
        }
        let mut cache = self.groups.lock().expect("groups cache");
        if let Some((at, g)) = cache.get(&pid) {
            if at.elapsed() < GROUPS_TTL {
                return Creds { uid, gid, groups: g.clone() };
            }
        }
        let groups = read_groups(pid);
        if cache.len() >= GROUPS_CACHE_MAX {
            cache.clear();
        }
        cache.insert(pid, (Instant::now(), groups.clone()));
        Creds { uid, gid, groups }
    }

    /// When attributes are asked for now (see [`told`]).
    fn asked(&self) -> told::Asked {
        told::Asked { epoch: self.client.metadata_epoch(), at: Instant::now() }
    }

    /// `a` as the answer about the kernel's inode `ino`: under that number, which is
    /// not `a`'s own once the inode moved to another MDT (`braid migrate -m`) under a
    /// new FID. The kernel keeps the old inode for names and descriptors it had, and
    /// tools that walk a tree compare the numbers they see as they go (fts checks a
    /// directory's `..` against the number it had on the way down).
    fn attr_of(&self, ino: INodeNo, a: &Attr) -> FileAttr {
        FileAttr { ino, ..self.file_attr(a) }
    }

    fn file_attr(&self, a: &Attr) -> FileAttr {
        if a.kind == FileKind::File {
            let mut r = self.reported.lock().expect("reported attributes");
            if r.len() >= REPORTED_MAX {
                r.clear();
            }
            r.insert(a.fid, (a.size, a.mtime));
        }
        let size = match a.kind {
            FileKind::File => self.handles.local_size(a.fid).map_or(a.size, |s| s.max(a.size)),
            _ => a.size,
        };
        let blksize = a.layout.as_ref().map_or(4096, |l| l.components[0].stripe_size.min(4 << 20) as u32);
        FileAttr {
            ino: INodeNo(ino_of(a.fid)),
            size,
            blocks: size.div_ceil(512),
            atime: system_time(a.atime),
            mtime: system_time(a.mtime),
            ctime: system_time(a.ctime),
            crtime: system_time(a.ctime),
            kind: file_type(a.kind),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            // FUSE carries 32 bits: the kernel's new_encode_dev() form.
            rdev: a.rdev as u32,
            blksize,
            flags: 0,
        }
    }

    fn entry(&self, reply: ReplyEntry, r: client::Result<Attr>) {
        match r {
            Ok(a) => {
                reply.entry_with_ttls(&self.opts.entry_ttl, &self.opts.attr_ttl, &self.file_attr(&a), Generation(0))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn writable(&self) -> Result<(), Errno> {
        if self.opts.read_only {
            Err(Errno::from_i32(libc::EROFS))
        } else {
            Ok(())
        }
    }

    fn open_flags(flags: i32) -> OpenFlags {
        let acc = flags & libc::O_ACCMODE;
        OpenFlags {
            read: acc == libc::O_RDONLY || acc == libc::O_RDWR,
            write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
            truncate: flags & libc::O_TRUNC != 0,
        }
    }

    fn fopen_flags(&self, flags: i32, keep_cache: bool) -> FopenFlags {
        if self.opts.direct_io || flags & libc::O_DIRECT != 0 {
            FopenFlags::FOPEN_DIRECT_IO
        } else if keep_cache {
            FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        }
    }

    /// Whether an open of a file whose data version is now `version` may keep the
    /// pages the kernel cached of it (`FOPEN_KEEP_CACHE`): only if they were filled
    /// under that same version, so nobody changed the bytes since, here or on
    /// another client (every change moves the version once it reaches the MDS: a
    /// writer's close, a truncate, a DoM write). Otherwise the kernel drops them at
    /// this open, and the version is remembered for the next one. A reread of an
    /// unchanged file is then served from memory, as on Lustre's and MooseFS's clients.
    /// While a handle opened before this one is still open, nothing is remembered: it
    /// may read bytes of the older version into the pages after this open dropped them.
    fn keep_cache(&self, fid: Fid, version: u64) -> bool {
        let mut v = self.cached_versions.lock().expect("cached versions");
        if v.get(&fid) == Some(&version) {
            return true;
        }
        if self.handles.inode_open(fid) {
            v.remove(&fid);
            return false;
        }
        // Forgetting is safe: a file not in the table has its pages dropped at open.
        if v.len() >= REPORTED_MAX {
            v.clear();
        }
        v.insert(fid, version);
        false
    }

    /// How handle `fh` of `fid`, just opened with `flags`, is answered.
    ///
    /// A read-only open of a file the SSD cache holds whole at its current version,
    /// with no other handle of it open here, passes through: the kernel reads the
    /// cache file itself, with no request to the mount (a FUSE round trip per read
    /// costs a 4 KiB reread from the cache as much as the disk read). Later read-only
    /// opens of the same version share it; one of a newer version names it too, as the
    /// kernel requires, but reads here (direct). An open for writing meanwhile is
    /// refused (ETXTBSY, as for a running executable) once the releases in flight are
    /// in (a reader's close(2) returns before its RELEASE arrives): through a handle
    /// naming the backing file, a shared writable mapping would write the cache file
    /// and never the OSTs. Another client's change is seen at the next open after the
    /// last of them closes (close-to-open). A truncate through this mount is applied
    /// to the backing file too (see `setattr`).
    fn io_mode(&self, fh: u64, fid: Fid, flags: FopenFlags, read_only: bool, a: &Attr, reply: &ReplyOpen) -> Open {
        let pt = self.passthrough.load(Ordering::Acquire);
        let open = self.handles.with_inode(fid, |st| {
            if let Some((p, n)) = st.passthrough.as_mut() {
                if !read_only {
                    return Open::Busy;
                }
                *n += 1;
                if p.version == a.data_version {
                    return Open::Through(p.clone(), FopenFlags::empty());
                }
                // A newer version: its reads come here (direct I/O overrides the backing
                // file, which the kernel wants every open of the inode to name).
                return Open::Through(p.clone(), FopenFlags::FOPEN_DIRECT_IO);
            }
            // An O_DIRECT open passes through too (the kernel reads the backing file
            // O_DIRECT for it); a mount of direct I/O only does not.
            if !pt || !read_only || self.opts.direct_io || st.open_handles() != 1 {
                return Open::Here(flags);
            }
            let Some(backing) = self.client.cache_backing(fid, a.data_version, a.size) else {
                return Open::Here(flags);
            };
            match reply.open_backing(&backing.reader) {
                Ok(id) => {
                    let p = Arc::new(Passthrough { id, backing, version: a.data_version });
                    st.passthrough = Some((p.clone(), 1));
                    Open::Through(p, FopenFlags::empty())
                }
                Err(e) => {
                    tracing::warn!("FUSE passthrough refused by the kernel, reads stay through the mount: {e}");
                    self.passthrough.store(false, Ordering::Release);
                    Open::Here(flags)
                }
            }
        });
        let open = open.unwrap_or(Open::Here(flags));
        if let (Open::Through(..), Some(f)) = (&open, self.handles.file(fh)) {
            f.passes_through.store(true, Ordering::Release);
        }
        open
    }

    /// Whether no handle of `fid` passes through, once the releases the kernel has
    /// sent for them are in (see [`Handles::passthrough_released`]).
    async fn passthrough_released(&self, fid: Fid) -> bool {
        let deadline = tokio::time::Instant::now() + PASSTHROUGH_RELEASE_WAIT;
        self.handles.passthrough_released(fid, deadline).await
    }

    /// Undoes the open of handle `fh` that [`State::io_mode`] refused.
    async fn refuse_open(&self, fh: u64, fid: Fid) {
        if let Some(state) = self.handles.remove_file(fh) {
            let _ = self.client.close_shared(&state.file).await;
            self.handles.inode_closed(fid, false);
        }
    }

    /// Registers an opened file and returns its handle number.
    fn add_file(&self, opener: (u32, u32, u32), mut file: OpenFile) -> u64 {
        let cell = self.handles.inode_opened(file.fid, file.size_cell());
        file.share_size(cell);
        self.handles.insert_file(file, opener)
    }
}

/// Supplementary groups of `pid`, from `/proc/PID/status`.
fn read_groups(pid: u32) -> Vec<u32> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return vec![] };
    text.lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()).take(256).collect())
        .unwrap_or_default()
}

/// Releases every lock of `owner` on a file (close and flock release).
fn unlock_all(owner: u64) -> LockRequest {
    LockRequest { owner, pid: 0, lock: LockType::Unlock, start: 0, end: u64::MAX }
}

fn lock_type(typ: i32) -> Result<LockType, Errno> {
    match typ {
        libc::F_RDLCK => Ok(LockType::Read),
        libc::F_WRLCK => Ok(LockType::Write),
        libc::F_UNLCK => Ok(LockType::Unlock),
        _ => Err(Errno::EINVAL),
    }
}

impl fuser::Filesystem for BraidFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(self.opts.max_write_bytes);
        let _ = config.set_max_readahead(4 << 20);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        let wanted = InitFlags::FUSE_POSIX_LOCKS
            | InitFlags::FUSE_FLOCK_LOCKS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_AUTO_INVAL_DATA
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_DONT_MASK
            // mmap of a file opened O_DIRECT works as on a local file system (Linux 6.6+;
            // without it such an mmap fails with ENODEV).
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
            // Listings carry attributes (see `readdirplus`); the kernel picks plain
            // listings where it sees no lookups follow.
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO;
        let _ = config.add_capabilities(wanted & config.capabilities());
        // With an SSD cache, a file it holds whole is read by the kernel straight from
        // its cache file (see `State::io_mode`). Backing files are on a local file
        // system, not stacked: depth 1.
        if self.opts.passthrough
            && self.client.cache_stats().is_some()
            && config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH)
        {
            let agreed =
                config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok() && config.set_max_stack_depth(1).is_ok();
            self.passthrough.store(agreed, Ordering::Release);
        }
        if self.opts.passthrough {
            tracing::info!(on = self.passthrough.load(Ordering::Acquire), "FUSE passthrough to the SSD cache");
        }
        Ok(())
    }

    fn destroy(&mut self) {
        // Closes already returned whose flushes are still on their way (see the
        // client's `deferred`) finish before the mount goes.
        self.rt.block_on(self.client.deferred_idle());
    }

    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        // The kernel dropped the inode, and its pages with it: the next open finds
        // none cached (see `BraidFs::keep_cache`).
        self.cached_versions.lock().expect("cached versions").remove(&self.fid(ino));
        self.told.forget(self.fid(ino));
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Ok(name) = name_str(name) else { return reply.error(Errno::ENOENT) };
        let (c, name) = (self.creds(req), name.to_owned());
        self.serve("lookup", req, move |s| async move {
            let asked = s.asked();
            let r = s.client.lookup(&c, s.fid(parent), &name).await;
            if let Ok(a) = &r {
                s.told.note(a, asked);
            }
            s.entry(reply, r)
        });
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        // The kernel drops a directory's cached attributes after every create or
        // unlink in it and asks again at the next path walk; this client's own change
        // already brought them back, valid for what remains of the cache time.
        if let Some((a, ttl)) = self.client.recent_dir_attr(self.fid(ino), self.opts.attr_ttl) {
            return reply.attr(&ttl, &self.attr_of(ino, &a));
        }
        // A file this mount created and holds where no one else can find it (the
        // kernel asks before a chown, to clear set-ID bits): as this mount knows it.
        if let Some(a) = self.client.attr_behind(self.fid(ino)) {
            return reply.attr(&self.opts.attr_ttl, &self.attr_of(ino, &a));
        }
        // The kernel dropped only a file's atime (after a read of it): what it was
        // told moments ago holds (see `told`).
        if let Some((a, ttl)) = self.told.recent(self.fid(ino), self.opts.attr_ttl, self.client.metadata_epoch()) {
            return reply.attr(&ttl, &self.attr_of(ino, &a));
        }
        self.serve("getattr", req, move |s| async move {
            let asked = s.asked();
            match s.client.getattr(s.fid(ino)).await {
                Ok(a) => {
                    s.told.note(&a, asked);
                    reply.attr(&s.opts.attr_ttl, &s.attr_of(ino, &a))
                }
                Err(e) => reply.error(inode_errno(&e)),
            }
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let fid = self.fid(ino);
        let c = self.creds(req);
        let time = |t: Option<TimeOrNow>| {
            t.map(|t| match t {
                TimeOrNow::Now => TimeSet::Now,
                TimeOrNow::SpecificTime(s) => TimeSet::At(timespec(s)),
            })
        };
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: time(atime),
            mtime: time(mtime),
            by_writer: false,
        };
        // ftruncate(2) comes with the handle: the change goes through it (permission
        // to write was checked at open, whatever the mode says now). A truncate(2),
        // and the truncate the kernel sends after an O_TRUNC open, come without one.
        let writer = fh.and_then(|fh| self.handles.file(fh.0)).filter(|f| f.file.flags.write);
        self.serve("setattr", req, move |s| async move {
            // A file this mount created and holds, in a directory it holds the lease
            // on: tar's and cp -a's fchown, fchmod and futimens after the create are
            // answered here and sent behind, merged (see the client's `set_behind`).
            if size.is_none() {
                if let Some(a) = s.client.setattr_behind(&c, fid, &set).await {
                    return reply.attr(&s.opts.attr_ttl, &s.attr_of(ino, &a));
                }
            }
            let r = async {
                let a = match &writer {
                    Some(f) if size.is_some() => s.client.fsetattr(&c, &f.file, set).await?,
                    _ => s.client.setattr(&c, fid, set).await?,
                };
                if let Some(size) = size {
                    // Every handle of the file here shares the new size, and so can take
                    // the new truncate epoch (their closes then need no glimpse).
                    s.handles.truncated(fid, size);
                    s.client.adopt_truncate(fid, a.trunc_epoch);
                    // A truncate(2) while reads pass through (no handle can write
                    // meanwhile): they read the new size from the backing file.
                    if let Some(p) = s.handles.passthrough(fid) {
                        if let Err(e) = p.backing.file.set_len(size) {
                            tracing::error!(%fid, "applying a truncate to the backing file failed: {e}");
                        }
                    }
                }
                Ok::<_, ClientError>(a)
            };
            match r.await {
                Ok(a) => reply.attr(&s.opts.attr_ttl, &s.attr_of(ino, &a)),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.serve("readlink", req, move |s| async move {
            match s.client.readlink(s.fid(ino)).await {
                Ok(t) => reply.data(t.as_bytes()),
                Err(e) => reply.error(inode_errno(&e)),
            }
        });
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let Ok(name) = name_str(name) else { return reply.error(Errno::EINVAL) };
        let c = self.creds(req);
        let perm = mode & !umask & 0o7777;
        let name = name.to_owned();
        if let Some(kind) = FileKind::special_from_mode(mode) {
            return self.serve("mknod", req, move |s| async move {
                let r = s.client.mknod(&c, s.fid(parent), &name, kind, perm, u64::from(rdev)).await;
                s.entry(reply, r)
            });
        }
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EINVAL);
        }
        let flags = OpenFlags { read: false, write: false, truncate: false };
        self.serve("mknod", req, move |s| async move {
            let r = async {
                let (f, attr, _) = s.client.create(&c, s.fid(parent), &name, perm, true, flags, None).await?;
                s.client.close(f).await?;
                Ok(attr)
            };
            s.entry(reply, r.await)
        });
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let Ok(name) = name_str(name) else { return reply.error(Errno::EINVAL) };
        let c = self.creds(req);
        let name = name.to_owned();
        self.serve("mkdir", req, move |s| async move {
            let r = s.client.mkdir(&c, s.fid(parent), &name, mode & !umask & 0o7777).await;
            s.entry(reply, r)
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let Ok(name) = name_str(name) else { return reply.error(Errno::ENOENT) };
        let c = self.creds(req);
        let name = name.to_owned();
        // The kernel looked the name up and checked the caller may remove it
        // (`default_permissions`) before it asked: the client may answer it itself.
        // Not so for a squashed root, whom the kernel lets do anything.
        let vetted = req.uid() != 0 || !self.client.root_squashed();
        self.serve("unlink", req, move |s| async move {
            let r = if vetted {
                s.client.unlink_vetted(&c, s.fid(parent), &name).await
            } else {
                s.client.unlink(&c, s.fid(parent), &name).await
            };
            reply_empty(reply, r)
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let Ok(name) = name_str(name) else { return reply.error(Errno::ENOENT) };
        let c = self.creds(req);
        let name = name.to_owned();
        self.serve(
            "rmdir",
            req,
            move |s| async move { reply_empty(reply, s.client.rmdir(&c, s.fid(parent), &name).await) },
        );
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let (Ok(name), Some(target)) = (name_str(link_name), target.to_str()) else {
            return reply.error(Errno::EINVAL);
        };
        let c = self.creds(req);
        let (name, target) = (name.to_owned(), target.to_owned());
        self.serve("symlink", req, move |s| async move {
            let r = s.client.symlink(&c, s.fid(parent), &name, &target).await;
            s.entry(reply, r)
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: FuseRenameFlags,
        reply: ReplyEmpty,
    ) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        if flags.contains(FuseRenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let (Ok(name), Ok(newname)) = (name_str(name), name_str(newname)) else { return reply.error(Errno::EINVAL) };
        let c = self.creds(req);
        let rf = RenameFlags {
            noreplace: flags.contains(FuseRenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(FuseRenameFlags::RENAME_EXCHANGE),
        };
        let (name, newname) = (name.to_owned(), newname.to_owned());
        self.serve("rename", req, move |s| async move {
            reply_empty(reply, s.client.rename(&c, s.fid(parent), &name, s.fid(newparent), &newname, rf).await)
        });
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let Ok(name) = name_str(newname) else { return reply.error(Errno::EINVAL) };
        let c = self.creds(req);
        let name = name.to_owned();
        self.serve("link", req, move |s| async move {
            let r = s.client.link(&c, s.fid(ino), s.fid(newparent), &name).await;
            s.entry(reply, r)
        });
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: FuseOpenFlags, reply: ReplyOpen) {
        let of = State::open_flags(flags.0);
        if (of.write || of.truncate) && self.opts.read_only {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        let (c, opener) = (self.creds(req), (req.pid(), req.uid(), req.gid()));
        let read_only = of.read && !of.write && !of.truncate;
        // A reader of a file whose pages the kernel does not hold at the version the
        // open will find (it forgot the inode, never had it, or filled them before a
        // write) will ask for its bytes: a small file's are read beside the open (see
        // the client's `first_bytes`).
        let held = self.cached_versions.lock().expect("cached versions").get(&self.fid(ino)).copied();
        self.serve("open", req, move |s| async move {
            let asked = s.asked();
            let opened = match read_only {
                true => s.client.open_to_read(&c, s.fid(ino), of, held).await,
                false => s.client.open(&c, s.fid(ino), of).await,
            };
            match opened {
                Ok((f, a))
                    if a.nlink == 0 && a.kind == FileKind::File && s.stale_opens.answer_stale(a.fid, opener.0) =>
                {
                    // A name the kernel cached for a file another client has since
                    // unlinked or renamed another file over (an editor's save), or a
                    // reopen through `/proc/PID/fd`. ESTALE has the kernel walk the
                    // path again with LOOKUP_REVAL: a name is looked up afresh and
                    // the file it names now is opened, as NFS's close-to-open does,
                    // while a reopen comes back here and is served (see `stale`).
                    let _ = s.client.close(f).await;
                    reply.error(Errno::from_i32(libc::ESTALE));
                }
                Ok((f, a)) => {
                    s.stale_opens.opened(opener.0);
                    if read_only {
                        s.told.note(&a, asked);
                    }
                    // Close-to-open: the kernel may still hold the size and mtime it
                    // cached before another client rewrote the file, and would read only
                    // up to that old size. Dropping its cached attributes (offset -1: the
                    // page cache is already dropped on open) makes the next read fetch
                    // them afresh, unless what the MDS says now is what the kernel was
                    // last told (the common case, which then saves a GETATTR round trip
                    // per open).
                    let current =
                        s.reported.lock().expect("reported attributes").get(&a.fid) == Some(&(a.size, a.mtime));
                    if !current {
                        if let Some(n) = s.notifier.get() {
                            let _ = n.inval_inode(ino, -1, 0);
                        }
                    }
                    let keep = s.keep_cache(a.fid, a.data_version);
                    let fh = s.add_file(opener, f);
                    let fopen = s.fopen_flags(flags.0, keep);
                    let mut open = s.io_mode(fh, a.fid, fopen, read_only, &a, &reply);
                    if matches!(open, Open::Busy) && s.passthrough_released(a.fid).await {
                        open = s.io_mode(fh, a.fid, fopen, read_only, &a, &reply);
                    }
                    match open {
                        Open::Here(fl) => reply.opened(FileHandle(fh), fl),
                        Open::Through(p, fl) => reply.opened_passthrough(FileHandle(fh), fl, &p.id),
                        Open::Busy => {
                            s.refuse_open(fh, a.fid).await;
                            reply.error(Errno::from_i32(libc::ETXTBSY));
                        }
                    }
                }
                Err(e) => reply.error(inode_errno(&e)),
            }
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let Ok(name) = name_str(name) else { return reply.error(Errno::EINVAL) };
        let c = self.creds(req);
        let of = State::open_flags(flags);
        let exclusive = flags & libc::O_EXCL != 0;
        let (name, opener) = (name.to_owned(), (req.pid(), req.uid(), req.gid()));
        self.serve("create", req, move |s| async move {
            match s.client.create(&c, s.fid(parent), &name, mode & !umask & 0o7777, exclusive, of, None).await {
                Ok((f, attr, existed)) => {
                    if !existed {
                        s.nocaps.note_none(attr.fid);
                    }
                    // A file this call made has nothing cached: its version is remembered.
                    let keep = s.keep_cache(attr.fid, attr.data_version);
                    let fh = s.add_file(opener, f);
                    let fa = s.file_attr(&attr);
                    if !s.passthrough_released(attr.fid).await {
                        // Open for writing while reads pass through: see `State::io_mode`.
                        s.refuse_open(fh, attr.fid).await;
                        return reply.error(Errno::from_i32(libc::ETXTBSY));
                    }
                    reply.created(&s.opts.entry_ttl, &fa, Generation(0), FileHandle(fh), s.fopen_flags(flags, keep));
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(f) = self.handles.file(fh.0) else { return reply.error(Errno::EBADF) };
        self.serve("read", req, move |s| async move {
            match s.client.read(&f.file, offset, size as u64).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(f) = self.handles.file(fh.0) else { return reply.error(Errno::EBADF) };
        let data = Bytes::copy_from_slice(data);
        self.serve("write", req, move |s| async move {
            match s.client.write(&f.file, offset, data).await {
                Ok(n) => {
                    s.handles.mark_dirty(f.file.fid);
                    reply.written(n as u32)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn flush(&self, req: &Request, ino: INodeNo, fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        // close(2) waits for FLUSH but not for RELEASE, which the kernel sends later. For
        // close-to-open consistency the handle's writes must be on the OSTs and its size
        // on the MDS before close(2) returns, or an open right after it (in this mount
        // or another) sees the old size and reads short. This also reports a failed
        // write-behind to close(2) instead of losing it in RELEASE. Nothing is forced to
        // disk here: that is fsync's job. A file nobody else can find yet (this mount
        // made it in a directory it holds the lease on) is flushed after close(2)
        // returns instead: see the client's `deferred`.
        let mut flush = None;
        if let Some(f) = self.handles.file(fh.0) {
            if f.file.was_written() {
                if let Some(ticket) = self.client.defer_flush(&f.file) {
                    let (client, state) = (self.client.clone(), f.clone());
                    let mut slot = f.deferred.lock().expect("deferred flush");
                    let earlier = slot.take();
                    *slot = Some(self.rt.spawn(async move {
                        if let Some(earlier) = earlier {
                            let _ = earlier.await;
                        }
                        client.finish_deferred(&state.file, ticket).await
                    }));
                } else {
                    flush = Some(f);
                }
            }
        }
        // close(2) of any descriptor drops the process's POSIX locks on the file.
        let fid = self.fid(ino);
        let unlock = self.handles.take_lock_owner(fid, lock_owner.0);
        if flush.is_none() && !unlock {
            return reply.ok();
        }
        self.serve("flush", req, move |s| async move {
            let flushed = match flush {
                Some(f) => s.client.flush(&f.file).await,
                None => Ok(()),
            };
            if let Err(e) = &flushed {
                // Many programs never look at close(2)'s result: the log says it.
                tracing::warn!(%fid, "the flush of a close failed: {e}");
            }
            // The owner is no longer listed: its locks go now, even if the flush failed.
            let unlocked = match unlock {
                true => s.client.set_lock(fid, unlock_all(lock_owner.0), false).await.map(|_| ()),
                false => Ok(()),
            };
            reply_empty(reply, flushed.and(unlocked))
        });
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: FuseOpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let fid = self.fid(ino);
        let Some(state) = self.handles.remove_file(fh.0) else { return reply.error(Errno::EBADF) };
        // The kernel sends RELEASE as no process (pid 0): the close is the opener's.
        let caller = if req.pid() == 0 { state.opener } else { (req.pid(), req.uid(), req.gid()) };
        let deferred = state.deferred.lock().expect("deferred flush").take();
        let unlock = lock_owner.filter(|o| self.handles.take_lock_owner(fid, o.0));
        self.serve_as("release", caller, move |s| async move {
            if let Some(flush) = deferred {
                // Its failure is the client's to report (the next fsync); the close goes on.
                let _ = flush.await;
            }
            let mut result = Ok(());
            if let Some(owner) = unlock {
                result = s.client.set_lock(fid, unlock_all(owner.0), false).await.map(|_| ());
            }
            let passed_through = state.passes_through.load(Ordering::Acquire);
            if let Some(delay) = passthrough_release_delay().filter(|_| passed_through) {
                tokio::time::sleep(delay).await;
            }
            // The kernel let go of the handle before sending RELEASE: it no longer counts
            // as open here while its close goes to the MDS. An open meanwhile of a file
            // renamed over (see `open`) must not take it for one a process holds.
            s.handles.inode_closed(fid, passed_through);
            // A reader may still hold the handle for an instant after answering the
            // kernel (which sends RELEASE once every request on the file is answered):
            // close it through the shared state, or the MDS would count it open until
            // unmount and an unlinked file would never be destroyed.
            let closed = s.client.close_shared(&state.file).await;
            match result.and(closed) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn fsync(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let Some(f) = self.handles.file(fh.0) else { return reply.error(Errno::EBADF) };
        self.serve("fsync", req, move |s| async move { reply_empty(reply, s.client.fsync(&f.file).await) });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: FuseOpenFlags, reply: ReplyOpen) {
        let c = self.creds(req);
        let fid = self.fid(ino);
        // Opened again right after a listing of it that still holds: no other client
        // may have changed its entries (this mount holds its lease), nor this one.
        if self.client.trusts_dir_lease(fid) {
            if let Some(d) = self.handles.dir_reopened(fid, &c, self.client.metadata_epoch()) {
                let fh = self.handles.insert_dir(d);
                return reply.opened(FileHandle(fh), FopenFlags::empty());
            }
        }
        // Check read permission and that it is a directory now, as opendir(2) does,
        // by fetching the first batch of the listing that nearly always follows: one
        // round trip where there were two. (Entries made or removed after opendir(2)
        // may or may not be listed, as POSIX has it.)
        self.serve("opendir", req, move |s| async move {
            let epoch = s.client.metadata_epoch();
            match s.client.readdir_plus(&c, fid, None, READDIR_BATCH).await {
                Ok((batch, eof)) => {
                    let d = DirHandle::new(fid, c);
                    d.extend(None, batch, eof, epoch);
                    let fh = s.handles.insert_dir(d);
                    reply.opened(FileHandle(fh), FopenFlags::empty());
                }
                Err(e) => reply.error(inode_errno(&e)),
            }
        });
    }

    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(d) = self.handles.dir(fh.0) else { return reply.error(Errno::EBADF) };
        let fid = d.fid;
        self.serve("readdir", req, move |s| async move {
            let mut next = offset;
            loop {
                // Offsets: 1 = ".", 2 = "..", 3.. = entries in name order.
                let item = match next {
                    0 => Some((ino.0, FileType::Directory, ".".to_string())),
                    1 => Some((ino.0, FileType::Directory, "..".to_string())),
                    n => match d.entry((n - 2) as usize) {
                        Ok(Some(e)) => Some((ino_of(e.fid), file_type(e.kind), e.name)),
                        Ok(None) => None,
                        Err(after) => match s.client.readdir(&d.creds, fid, after.as_deref(), READDIR_BATCH).await {
                            Ok((batch, eof)) => {
                                d.extend(after, batch.into_iter().map(|e| (e, None)).collect(), eof, 0);
                                continue;
                            }
                            Err(e) => return reply.error(errno(&e)),
                        },
                    },
                };
                let Some((entry_ino, kind, name)) = item else { break };
                next += 1;
                if reply.add(INodeNo(entry_ino), next, kind, name) {
                    break;
                }
            }
            reply.ok();
        });
    }

    /// The listing with each entry's attributes (`FUSE_DO_READDIRPLUS`): the kernel
    /// caches them as a lookup's answers, so `ls -l`, `du`, `find`, `cp -a` and
    /// `rm -rf` look nothing up after it. One MDS request per batch of entries; an
    /// entry it leaves without attributes (another MDT's, a striped directory) is
    /// looked up.
    fn readdirplus(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let Some(d) = self.handles.dir(fh.0) else { return reply.error(Errno::EBADF) };
        let fid = d.fid;
        self.serve("readdirplus", req, move |s| async move {
            let ttl = s.opts.entry_ttl.min(s.opts.attr_ttl);
            if offset == 0 {
                d.refresh_if_stale(s.client.metadata_epoch());
            }
            let mut next = offset;
            loop {
                // Offsets: 1 = ".", 2 = "..", 3.. = entries in name order. The kernel
                // links no entry for the dots, and takes no attributes from them.
                let (name, attr, ttl) = match next {
                    0 => (".".to_string(), placeholder_attr(ino.0, FileKind::Dir), Duration::ZERO),
                    1 => ("..".to_string(), placeholder_attr(ino.0, FileKind::Dir), Duration::ZERO),
                    n => match d.entry_plus((n - 2) as usize, s.client.metadata_epoch()) {
                        Ok(Some((e, Some(a)))) => {
                            // Fresh at the current epoch (see `entry_plus`).
                            s.told.note(&a, s.asked());
                            (e.name, s.file_attr(&a), ttl)
                        }
                        Ok(Some((e, None))) => match s.client.lookup(&d.creds, fid, &e.name).await {
                            Ok(a) => (e.name, s.file_attr(&a), ttl),
                            // Gone meanwhile, or not to be looked up by the caller (a
                            // directory it may read but not search): listed with no
                            // attributes to keep, the kernel asks again at first use.
                            Err(_) => (e.name, placeholder_attr(ino_of(e.fid), e.kind), Duration::ZERO),
                        },
                        Ok(None) => break,
                        Err(after) => {
                            let epoch = s.client.metadata_epoch();
                            match s.client.readdir_plus(&d.creds, fid, after.as_deref(), READDIR_BATCH).await {
                                Ok((batch, eof)) => {
                                    d.extend(after, batch, eof, epoch);
                                    continue;
                                }
                                Err(e) => return reply.error(errno(&e)),
                            }
                        }
                    },
                };
                next += 1;
                if reply.add(attr.ino, next, name, &ttl, &attr, Generation(0)) {
                    break;
                }
            }
            reply.ok();
        });
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: FuseOpenFlags, reply: ReplyEmpty) {
        self.handles.remove_dir(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // The entries of the directory live on its MDT: force that MDT's log to disk.
        self.serve(
            "fsyncdir",
            req,
            move |s| async move { reply_empty(reply, s.client.sync_metadata(s.fid(ino)).await) },
        );
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.serve("statfs", req, move |s| async move {
            match s.client.statfs().await {
                Ok(u) => {
                    const BSIZE: u64 = 4096;
                    reply.statfs(
                        u.total_bytes / BSIZE,
                        u.free_bytes / BSIZE,
                        u.avail_bytes / BSIZE,
                        u.total_inodes,
                        u.free_inodes,
                        BSIZE as u32,
                        255,
                        BSIZE as u32,
                    )
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let Ok(name) = name_str(name) else { return reply.error(Errno::EINVAL) };
        if ino.0 == ROOT_INO && name == CACHE_DROP_XATTR {
            // `braid cache drop`: root only, as `echo 3 > drop_caches`.
            if req.uid() != 0 {
                return reply.error(Errno::EPERM);
            }
            return match self.client.cache_clear() {
                Ok(true) => reply.ok(),
                Ok(false) => reply.error(Errno::NO_XATTR),
                Err(e) => reply.error(errno(&e)),
            };
        }
        if ino.0 == ROOT_INO && name == TRACE_XATTR {
            // `braid trace on|off`: root only, as Lustre's set_param.
            if req.uid() != 0 {
                return reply.error(Errno::EPERM);
            }
            let Some(hook) = &self.opts.trace else { return reply.error(Errno::NO_XATTR) };
            let on = match value {
                b"on" | b"1" => true,
                b"off" | b"0" => false,
                _ => return reply.error(Errno::EINVAL),
            };
            return match hook.0.set(on) {
                Ok(()) => reply.ok(),
                Err(e) => {
                    tracing::warn!("braid trace {}: {e}", if on { "on" } else { "off" });
                    reply.error(Errno::EIO)
                }
            };
        }
        let mode = match flags {
            0 => XattrMode::Any,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        let c = self.creds(req);
        // Before and after: a getxattr answered meanwhile may predate the change.
        self.nocaps.forget(self.fid(ino));
        let (name, value) = (name.to_owned(), value.to_vec());
        self.serve("setxattr", req, move |s| async move {
            let r = s.client.setxattr(&c, s.fid(ino), &name, &value, mode).await;
            s.nocaps.forget(s.fid(ino));
            reply_empty(reply, r)
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let Ok(name) = name_str(name) else { return reply.error(Errno::NO_XATTR) };
        if ino.0 == ROOT_INO && name == CACHE_STATUS_XATTR {
            // `braid cache status`: the SSD cache's numbers, as JSON.
            let Some(stats) = self.client.cache_stats() else { return reply.error(Errno::NO_XATTR) };
            let v = serde_json::to_vec(&stats).expect("encoding cache statistics cannot fail");
            return match size {
                0 => reply.size(v.len() as u32),
                s if v.len() > s as usize => reply.error(Errno::from_i32(libc::ERANGE)),
                _ => reply.data(&v),
            };
        }
        if ino.0 == ROOT_INO && name == TRACE_STATUS_XATTR {
            let Some(hook) = &self.opts.trace else { return reply.error(Errno::NO_XATTR) };
            let v = hook.0.status();
            return match size {
                0 => reply.size(v.len() as u32),
                s if v.len() > s as usize => reply.error(Errno::from_i32(libc::ERANGE)),
                _ => reply.data(&v),
            };
        }
        let fid = self.fid(ino);
        let caps = name == nocaps::CAPS_XATTR;
        if caps && self.nocaps.knows_none(fid) {
            return reply.error(Errno::NO_XATTR);
        }
        let c = self.creds(req);
        let asked = self.nocaps.asked();
        let name = name.to_owned();
        self.serve("getxattr", req, move |s| async move {
            match s.client.getxattr(&c, fid, &name).await {
                Ok(v) if size == 0 => reply.size(v.len() as u32),
                Ok(v) if v.len() > size as usize => reply.error(Errno::from_i32(libc::ERANGE)),
                Ok(v) => reply.data(&v),
                Err(e) => {
                    // Only root's answer says there is none: the MDS shows security.*
                    // attributes to root alone.
                    if caps && c.uid == 0 && e.errno() == client::Errno::NoData {
                        s.nocaps.note_none_asked_at(fid, asked);
                    }
                    reply.error(errno(&e))
                }
            }
        });
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let c = self.creds(req);
        self.serve("listxattr", req, move |s| async move {
            match s.client.listxattr(&c, s.fid(ino)).await {
                Ok(names) => {
                    let mut buf = Vec::new();
                    for n in names {
                        buf.extend_from_slice(n.as_bytes());
                        buf.push(0);
                    }
                    if size == 0 {
                        reply.size(buf.len() as u32)
                    } else if buf.len() > size as usize {
                        reply.error(Errno::from_i32(libc::ERANGE))
                    } else {
                        reply.data(&buf)
                    }
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let Ok(name) = name_str(name) else { return reply.error(Errno::NO_XATTR) };
        let c = self.creds(req);
        self.nocaps.forget(self.fid(ino));
        let name = name.to_owned();
        self.serve("removexattr", req, move |s| async move {
            let r = s.client.removexattr(&c, s.fid(ino), &name).await;
            s.nocaps.forget(s.fid(ino));
            reply_empty(reply, r)
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let c = self.creds(req);
        let want = mask.bits() as u32 & 7;
        let read_only = self.opts.read_only;
        self.serve("access", req, move |s| async move {
            let a = match s.client.getattr(s.fid(ino)).await {
                Ok(a) => a,
                Err(e) => return reply.error(errno(&e)),
            };
            if want & 2 != 0 && read_only {
                return reply.error(Errno::from_i32(libc::EROFS));
            }
            if a.may(&c, want) {
                reply.ok()
            } else {
                reply.error(Errno::EACCES)
            }
        });
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        let lock = match lock_type(typ) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let asked = LockRequest { owner: lock_owner.0, pid: 0, lock, start, end };
        self.serve("getlk", req, move |s| async move {
            match s.client.get_lock(s.fid(ino), asked).await {
                Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
                Ok(Some(c)) => {
                    let t = if c.lock == LockType::Write { libc::F_WRLCK } else { libc::F_RDLCK };
                    reply.locked(c.start, c.end, t, c.pid)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let lock = match lock_type(typ) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let fid = self.fid(ino);
        let asked = LockRequest { owner: lock_owner.0, pid, lock, start, end };
        let caller = req.pid();
        self.serve("setlk", req, move |s| async move {
            match s.client.set_lock_until(fid, asked, sleep, || signal_pending(caller)).await {
                Ok(None) => {
                    if lock != LockType::Unlock {
                        s.handles.add_lock_owner(fid, lock_owner.0);
                    }
                    reply.ok()
                }
                Ok(Some(_)) => reply.error(Errno::EAGAIN),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if let Err(e) = self.writable() {
            return reply.error(e);
        }
        let Some(f) = self.handles.file(fh.0) else { return reply.error(Errno::EBADF) };
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
        let zero = mode & libc::FALLOC_FL_ZERO_RANGE != 0;
        let known = libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 || (punch && (!keep_size || zero)) {
            // COLLAPSE_RANGE, INSERT_RANGE, UNSHARE_RANGE: not supported (README).
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let Some(end) = offset.checked_add(length) else { return reply.error(Errno::from_i32(libc::EFBIG)) };
        let c = self.creds(req);
        self.serve("fallocate", req, move |s| async move {
            let r = async {
                if punch || zero {
                    // Objects are sparse: a punched range reads back as zeros.
                    let size = f.file.size();
                    if offset < size {
                        s.client.punch_hole(&f.file, offset, end.min(size) - offset).await?;
                    }
                }
                if !keep_size && end > f.file.size() {
                    // Allocation extends the size; the space is not reserved on the OSTs.
                    s.client.ftruncate(&c, &f.file, end).await?;
                    s.handles.truncated(f.file.fid, end);
                }
                Ok::<_, ClientError>(())
            };
            reply_empty(reply, r.await)
        });
    }
}

/// The size cell shared by one inode's handles in this mount.
pub(crate) type SizeCell = Arc<AtomicU64>;

impl InodeState {
    pub(crate) fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::{interrupts, signal_pending};

    #[test]
    fn handlers_and_fatal_signals_interrupt_a_wait_and_a_default_stop_does_not() {
        let bit = |s: i32| 1u64 << (s - 1);
        let (int, tstp, chld) = (bit(libc::SIGINT), bit(libc::SIGTSTP), bit(libc::SIGCHLD));
        assert!(interrupts(int, 0, 0, int), "a caught SIGINT runs its handler");
        assert!(interrupts(int, 0, 0, 0), "a default SIGINT ends the process");
        assert!(!interrupts(int, int, 0, int), "blocked");
        assert!(!interrupts(int, 0, int, 0), "ignored");
        assert!(!interrupts(tstp, 0, 0, 0), "Ctrl-Z stops the process; the wait goes on after SIGCONT");
        assert!(interrupts(tstp, 0, 0, tstp), "a SIGTSTP handler runs");
        assert!(!interrupts(chld, 0, 0, 0), "SIGCHLD does nothing by default");
        assert!(!interrupts(0, 0, 0, int), "nothing pending");
    }

    #[test]
    fn a_running_thread_has_no_signal_pending_and_a_gone_one_counts_as_interrupted() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        assert!(!signal_pending(me));
        // Beyond the kernel's largest pid (4194304): no such thread.
        assert!(signal_pending(u32::MAX - 1));
    }
}
