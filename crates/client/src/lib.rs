//! The braid native client.
//!
//! A client knows only the MGS address; everything else (MDTs, OSTs, their addresses
//! and state) comes from the MGS configuration. Metadata operations go to the MDT
//! that owns the FID; file data goes straight to the OSTs named by the file's layout,
//! all stripes of a request in parallel. The MDS is never on the data path.
//!
//! Structure:
//! - [`Client`]: connections, configuration, and every operation. Each public
//!   operation passes through [`Client::observe`] — the one place a tracer hooks in.
//! - [`io`]: the data path (striped reads and writes, truncates, hole punches).
//! - [`objio`]: where each piece of a file lives and the I/O on one piece: the one
//!   place DoM, mirrors and a read cache plug in.
//! - `lease`: directory leases, which answer lookups of absent names locally.
//! - [`deferred`]: closes whose flush finishes after close(2) returned.
//! - [`async_create`]: creates answered here under a lease, sent in the background.
//! - [`statahead`]: entries' attributes fetched in bulk ahead of lookups.
//! - [`path`]: path resolution over lookups, symlinks included.
//! - `striped`: striped directories (which shard holds a name, merged listings).
//! - `short_circuit`: reads and writes of objects whose OSS runs on this machine
//!   through descriptors it hands over.
//! - [`OpenFile`]: an open file's layout (replaceable) and the size it knows.

pub mod async_create;
pub mod deferred;
pub mod io;
mod lease;
pub mod objio;
pub mod path;
mod short_circuit;
pub mod statahead;
mod striped;
mod throttle;
pub mod tracer;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use layout::{Layout, LayoutChange, LayoutError, LayoutSpec};
use proto::msg::{Request, Response};
use proto::RpcError;
use rpc::{Identity, RpcClient, RpcOptions};

// What front ends (the FUSE mount, the CLI tools, the coming NBD server) need of the
// wire's types, so that they depend on this crate alone and never on messages.
pub use cache::Backing as CacheBacking;
pub use layout::DirHash;
pub use proto::auth::Secret;
pub use proto::msg::{
    Attr, ClusterConfig, Creds, DirEntry, DirSpec, DirStripes, FileKind, LockInfo, LockRequest, LockType, OpenFlags,
    RenameFlags, SetAttr, TargetInfo, TargetKind, TimeSet, Timespec, Usage, XattrMode, DIR_STRIPES_ALL, MDT_BALANCED,
};
pub use proto::{Errno, Fid, ObjectId};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Rpc(#[from] RpcError),
    #[error("{1}")]
    Errno(Errno, String),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Not a `source` of the error: its text is in this one's already, and printed
    /// again by a caller that prints the chain.
    #[error("{path}: {error}")]
    Path { path: String, error: Box<ClientError> },
}

impl ClientError {
    pub fn errno(&self) -> Errno {
        match self {
            ClientError::Rpc(e) => e.errno(),
            ClientError::Errno(e, _) => *e,
            // A write past the last component (Lustre answers the same).
            ClientError::Layout(LayoutError::BeyondLayout(_)) => Errno::NoData,
            ClientError::Layout(_) => Errno::Inval,
            ClientError::Path { error, .. } => error.errno(),
        }
    }

    pub fn at(self, path: &str) -> ClientError {
        ClientError::Path { path: path.to_string(), error: Box::new(self) }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

fn unexpected(op: &str, r: &Response) -> ClientError {
    ClientError::Errno(Errno::Proto, format!("unexpected answer to {op}: {r:?}"))
}

/// Takes the one expected answer to request `op` apart: `answer!(op, response,
/// Response::Attr(a) => a)`. Any other answer is a protocol error.
macro_rules! answer {
    ($op:expr, $response:expr, $expected:pat => $value:expr) => {
        match $response {
            $expected => Ok($value),
            r => Err(unexpected($op, &r)),
        }
    };
}

/// The whole of a metadata operation made of one request: sends `req` to the MDT of
/// `fid`, observed as `op`, and takes the expected answer apart as [`answer!`] does.
macro_rules! md_op {
    ($client:expr, $op:expr, $fid:expr, $req:expr, $expected:pat => $value:expr) => {
        $client
            .observe($op, Some($fid), 0, 0, async { answer!($op, $client.md($fid, $req).await?, $expected => $value) })
            .await
    };
}

#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `HOST:PORT` of the MGS.
    pub mgs: String,
    pub secret: Secret,
    pub rpc: RpcOptions,
    /// Largest bulk RPC to an OST (Lustre's 4 MiB BRW).
    pub max_rpc_bytes: u64,
    /// Bytes of one file that may be written but not yet acknowledged by the OSTs
    /// (write-behind; Lustre's `max_dirty_mb`). 0 makes every write synchronous.
    pub max_dirty_bytes: u64,
    /// Ask for a lease on each directory this client makes, and answer lookups of
    /// names absent from it without the MDS (see the `lease` module). Worth it for a
    /// client that lives on (a mount), not for a one-shot command. Such an answer
    /// skips the MDS's check of search permission on the directory: the mount has the
    /// kernel check it (`default_permissions`).
    pub dir_leases: bool,
    /// Fetch the attributes of a directory's entries in bulk once lookups are seen
    /// walking it (see the `statahead` module). Like leases, worth it for a client
    /// that lives on; lookups of the same credentials only.
    pub statahead: bool,
    /// A local directory caching file data this client read (see the `cache` crate);
    /// a cache that cannot be opened is logged and the client runs without it.
    pub cache: Option<cache::CacheConfig>,
    /// Bytes of file data this client read that it keeps in its own memory for
    /// rereads (see `cache::mem`); 0 keeps none. For native clients that live on (the
    /// NBD export); a mount has the kernel's page cache.
    pub page_cache: u64,
    /// Most bytes per second this client moves to and from OSTs, and the least time an
    /// OST transfer takes (see the `throttle` module); `None` and zero: as fast as they go.
    pub ost_limit: Option<u64>,
    pub ost_latency: Duration,
    /// The I/O trace ring this client records its operations into (see the `tracer`
    /// module); a ring that cannot be made is logged and the client runs without it.
    pub trace: Option<tracer::TraceConfig>,
    /// Read and write the objects of OSTs whose OSS runs on this machine through
    /// descriptors it hands over, instead of requests (see the `short_circuit` module).
    pub short_circuit: bool,
}

impl ClientConfig {
    pub fn new(mgs: impl Into<String>, secret: Secret) -> ClientConfig {
        ClientConfig {
            mgs: mgs.into(),
            secret,
            rpc: RpcOptions::default(),
            max_rpc_bytes: 4 << 20,
            max_dirty_bytes: 32 << 20,
            dir_leases: false,
            statahead: false,
            cache: None,
            page_cache: 0,
            ost_limit: None,
            ost_latency: Duration::ZERO,
            trace: None,
            short_circuit: false,
        }
    }
}

/// One completed operation, as the tracer sees it.
#[derive(Debug, Clone)]
pub struct OpRecord {
    pub op: &'static str,
    pub fid: Option<Fid>,
    pub offset: u64,
    pub len: u64,
    pub start: SystemTime,
    pub duration: Duration,
    pub result: std::result::Result<(), Errno>,
    /// Where the bytes at `offset` live, for a data operation (a metadata operation
    /// went to the MDT of `fid`).
    pub target: Option<trace::Target>,
}

/// The name each public operation of [`Client`] reports to the observer, each once. Two
/// forms of one operation share a name: `close` and `close_shared` report `close`,
/// `setattr` and `fsetattr` report `setattr`. `Client::connect` reports nothing (no
/// observer can be set before it).
pub const OPS: &[&str] = &[
    "refresh_config",
    "resolve",
    "resolve_parent",
    "lookup",
    "getattr",
    "create",
    "open",
    "mkdir",
    "symlink",
    "mknod",
    "readlink",
    "link",
    "unlink",
    "rmdir",
    "rename",
    "readdir",
    "readdir_all",
    "setattr",
    "truncate",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "setstripe",
    "layout_change",
    "getstripe",
    "read",
    "write",
    "punch",
    "flush",
    "fsync",
    "sync_metadata",
    "close",
    "setlk",
    "getlk",
    "glimpse_size",
    "target_usage",
    "statfs",
];

tokio::task_local! {
    /// Set in a task while an observed operation runs in it (see [`Client::observe`]).
    static OBSERVING: ();
}

/// Receives every operation of a client (the I/O tracer implements it). Must be cheap:
/// it runs on the I/O path.
pub trait OpObserver: Send + Sync {
    fn record(&self, r: &OpRecord);

    /// Whether it records now (when not, operations skip taking their times).
    fn active(&self) -> bool {
        true
    }
}

struct Inner {
    cfg: ClientConfig,
    identity: Arc<Identity>,
    mgs: RpcClient,
    config: RwLock<ClusterConfig>,
    servers: Mutex<HashMap<String, Arc<RpcClient>>>,
    observer: RwLock<Option<Arc<dyn OpObserver>>>,
    last_refresh: Mutex<Instant>,
    /// In-flight write state of every open handle, by file: a truncate or hole punch
    /// waits for them first.
    open_files: Mutex<HashMap<Fid, Vec<std::sync::Weak<io::Inflight>>>>,
    /// Closes with nothing to report, not yet sent (see [`Client::close`]).
    closes: Mutex<Vec<Fid>>,
    /// Turns to wait on an MDS for a lock (see [`LOCK_WAITS_MAX`]).
    lock_waits: tokio::sync::Semaphore,
    /// Directories' attributes as this client's own create or unlink in them left
    /// them, and when (see [`Client::recent_dir_attr`]).
    recent_dirs: Mutex<HashMap<Fid, (Attr, Instant)>>,
    /// Directory leases held; also what carries out the MDS's callbacks.
    leases: Arc<lease::DirLeases>,
    /// Whether every server's callbacks can reach `leases` (false: ask for none).
    leases_reachable: AtomicBool,
    /// Flushes finished after their close returned (see [`deferred`]).
    deferred: Arc<deferred::Deferred>,
    /// What carries out the MDS's callbacks: the leases, then the deferred flushes.
    revocations: Arc<Revocations>,
    /// Renames and links sent: a file created before one may have a name others can
    /// read, so its close is not deferred.
    moves: AtomicU64,
    /// Requests sent, by kind of target.
    rpcs: Arc<RpcCounters>,
    /// Creates answered here (see [`async_create`]): templates and FID grants.
    creates: async_create::AsyncCreates,
    /// Entries' attributes fetched ahead of lookups (see [`statahead`]); every request
    /// that may change metadata moves its epoch, whether statahead is on or not.
    statahead: Arc<statahead::Statahead>,
    /// The shard tables of striped directories met so far.
    stripes: striped::StripeTables,
    /// The SSD read cache, if configured and usable.
    pub(crate) cache: Option<cache::Cache>,
    pub(crate) pages: Option<cache::mem::MemCache>,
    ost_throttle: Option<Arc<throttle::Throttle>>,
    tracer: Option<Arc<tracer::Tracer>>,
    /// Connections to the local sockets of OSTs on this machine, if short-circuit I/O
    /// is on.
    local_osts: Option<Arc<short_circuit::LocalOsts>>,
}

/// How many requests a client sent to MDTs and to OSTs (Data-on-MDT I/O counts as
/// MDT requests), and how many OST reads and writes it made itself through local
/// descriptors instead (short-circuit I/O): what a benchmark prints to show an
/// operation's round trips.
#[derive(Debug, Default)]
pub struct RpcCounters {
    mds: AtomicU64,
    ost: AtomicU64,
    local: AtomicU64,
}

impl RpcCounters {
    pub(crate) fn count(&self, target: &objio::Target) {
        match target {
            objio::Target::Ost { .. } => self.ost.fetch_add(1, Ordering::Relaxed),
            objio::Target::Mdt { .. } => self.mds.fetch_add(1, Ordering::Relaxed),
        };
    }

    fn count_mds(&self) {
        self.mds.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_local(&self) {
        self.local.fetch_add(1, Ordering::Relaxed);
    }
}

/// What [`Client::read_for_send`] hands back.
#[derive(Debug)]
pub enum ReadOut {
    /// The bytes, as [`Client::read`] returns them (short past the file's end).
    Bytes(Bytes),
    /// Ranges of local object files that make up the bytes, in order.
    Local(Vec<LocalRange>),
}

/// A piece of a read that a local object file holds (short-circuit I/O): `len` bytes
/// of `file` from `offset`, zeros past its end; zeros throughout without a file.
#[derive(Debug, Clone)]
pub struct LocalRange {
    pub file: Option<Arc<std::fs::File>>,
    pub offset: u64,
    pub len: u64,
}

/// A reading of [`RpcCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RpcCounts {
    pub mds: u64,
    pub ost: u64,
    /// OST reads and writes made through local descriptors (no request).
    pub local: u64,
}

/// Most directories [`Inner::recent_dirs`] remembers.
const RECENT_DIRS_MAX: usize = 4096;

/// Most size reports one close or fsync makes while truncates from elsewhere keep
/// moving the file's epoch.
const EPOCH_RETRIES_MAX: usize = 8;

/// How long a close with nothing to report may wait to share an RPC with others.
const CLOSE_DELAY: Duration = Duration::from_millis(5);
/// Most `F_SETLKW` requests of this client waiting on MDSs at once; more waiters take
/// turns here. An MDS holds a waiting request for up to a few seconds, and it holds
/// one of the connection's request slots all that time (32 on the client's side). With
/// 40 processes of one mount waiting, the holder's unlock found no slot until the waits
/// timed out: 19 s for the lock to pass through them all, 0.03 s with 30.
const LOCK_WAITS_MAX: usize = 16;
/// How often a lock waiting for its turn checks whether its caller was interrupted.
const INTERRUPT_POLL: Duration = Duration::from_millis(100);
/// How long `statfs` and `df` wait for a target's usage before showing it as not
/// answering (a down target must not hold `df` for the whole recovery timeout).
const USAGE_WAIT: Duration = Duration::from_secs(2);
/// Most closes one RPC carries; a full queue is sent at once.
const CLOSE_BATCH_MAX: usize = 512;

/// What carries out the MDS's callbacks for a client: a revoked lease is dropped at
/// once, and acked once every deferred flush is done (see [`deferred`]).
struct Revocations {
    leases: Arc<lease::DirLeases>,
    deferred: Arc<deferred::Deferred>,
}

impl rpc::CallbackHandler for Revocations {
    fn callback(&self, cb: &proto::msg::Callback) -> Option<rpc::AckAfter> {
        self.leases.revoked(cb);
        if self.deferred.running() == 0 {
            return None;
        }
        let deferred = self.deferred.clone();
        Some(Box::pin(async move { deferred.idle().await }))
    }
}

/// After a setattr set a file's mtime: the handles [`Client::before_times_set`]
/// returned whose data generation has not moved since (no write) leave the mtime
/// alone in their next size reports.
fn times_set(handles: Vec<(Arc<io::Inflight>, u64)>) {
    for (i, gen) in handles {
        i.mtime_set_at.store(gen.wrapping_add(1), Ordering::Release);
    }
}

/// A connected client. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// An open file: what the client needs to do I/O without asking the MDS again.
pub struct OpenFile {
    pub fid: Fid,
    /// The file's layout as this handle knows it. Each request takes it once (see
    /// [`OpenFile::layout`]); [`OpenFile::replace_layout`] swaps in a newer generation.
    layout: RwLock<Arc<Layout>>,
    size: Arc<AtomicU64>,
    written: AtomicBool,
    /// Objects this handle wrote to (fsync syncs only those). At most the objects of
    /// the file, whatever the number of writes.
    dirty: Mutex<HashSet<objio::Target>>,
    /// Writes sent but not yet acknowledged by their OSTs (write-behind).
    pub(crate) inflight: Arc<io::Inflight>,
    /// Sequential read-ahead state.
    pub(crate) readahead: tokio::sync::Mutex<io::Readahead>,
    /// `data_gen` when the size was last published to the MDS (`u64::MAX`: never).
    published_gen: AtomicU64,
    /// Whether a write since the size was last published left the size to report:
    /// every OST write does; a DoM write publishes the size itself unless the file's
    /// truncate epoch moved.
    pub(crate) needs_publish: Arc<AtomicBool>,
    pub flags: OpenFlags,
    /// Who opened the handle: a layout change it needs (an instantiation) is asked
    /// in their name.
    creds: Creds,
    /// A small DoM file's bytes as the open returned them, with the handle's data
    /// generation then: reads are served from them until anything of this client
    /// changes the file.
    data_at_open: Mutex<Option<(u64, Bytes)>>,
    /// The file's data version at open: the SSD cache serves this handle only bytes
    /// cached under it.
    pub(crate) data_version: u64,
    /// The leased directory this handle created the file in, and [`Inner::moves`]
    /// then: its close may be deferred (see [`deferred`]).
    created_in: Option<(Fid, u64)>,
    /// The answer to this file's create, when this client answered it itself and
    /// sent it in the background (see [`async_create`]): the handle's I/O, flush and
    /// close wait for it.
    created: Option<Arc<async_create::Gate>>,
}

impl OpenFile {
    fn new(attr: &Attr, flags: OpenFlags, creds: &Creds) -> Result<OpenFile> {
        let layout = attr.layout.clone().ok_or_else(|| match attr.kind {
            FileKind::Dir => ClientError::Errno(Errno::IsDir, format!("{} is a directory", attr.fid)),
            kind => ClientError::Errno(Errno::NotSup, format!("{} is a {kind:?}: no I/O through braid", attr.fid)),
        })?;
        let inflight = io::Inflight::default();
        inflight.trunc_epoch.store(attr.trunc_epoch, Ordering::Release);
        Ok(OpenFile {
            fid: attr.fid,
            layout: RwLock::new(Arc::new(layout)),
            size: Arc::new(AtomicU64::new(attr.size)),
            written: AtomicBool::new(false),
            dirty: Mutex::new(HashSet::new()),
            inflight: Arc::new(inflight),
            readahead: tokio::sync::Mutex::new(io::Readahead::default()),
            published_gen: AtomicU64::new(u64::MAX),
            needs_publish: Arc::new(AtomicBool::new(false)),
            flags,
            creds: creds.clone(),
            data_at_open: Mutex::new(None),
            data_version: attr.data_version,
            created_in: None,
            created: None,
        })
    }

    /// Waits until the file exists on its MDT (see [`async_create`]); the create's
    /// error if it failed.
    pub(crate) async fn created(&self) -> Result<()> {
        match &self.created {
            Some(gate) => gate.wait().await,
            None => Ok(()),
        }
    }

    /// The mtime a report of this handle's writes gives the file: now, unless this
    /// client set the file's mtime explicitly after the handle's last write (`tar`
    /// and `cp -p` set it through the descriptor before closing), which stays.
    fn report_mtime(&self) -> Option<Timespec> {
        let set_at = self.inflight.mtime_set_at.load(Ordering::Acquire);
        (set_at != self.inflight.data_gen.load(Ordering::Acquire).wrapping_add(1)).then(Timespec::now)
    }

    /// The gate of this file's create, if it was sent in the background.
    pub(crate) fn create_gate(&self) -> Option<Arc<async_create::Gate>> {
        self.created.clone()
    }

    fn keep_data(&self, data: Bytes) {
        let gen = self.inflight.data_gen.load(Ordering::Acquire);
        *self.data_at_open.lock().expect("data at open") = Some((gen, data));
    }

    /// `[offset, offset+len)` from the bytes the open returned, if they still hold
    /// (nothing of this client changed the file since) and cover it; bytes past them
    /// and below the size are zeros (the open read the whole file).
    pub(crate) fn data_from_open(&self, offset: u64, len: u64) -> Option<Bytes> {
        let kept = self.data_at_open.lock().expect("data at open");
        let (gen, data) = kept.as_ref()?;
        if *gen != self.inflight.data_gen.load(Ordering::Acquire) || offset + len > self.size() {
            return None;
        }
        let have = data.len() as u64;
        if offset + len <= have {
            return Some(data.slice(offset as usize..(offset + len) as usize));
        }
        let mut out = vec![0u8; len as usize];
        if offset < have {
            out[..(have - offset) as usize].copy_from_slice(&data[offset as usize..]);
        }
        Some(Bytes::from(out))
    }

    /// The file's layout now. A request takes it once and cuts all of its range by it.
    pub fn layout(&self) -> Arc<Layout> {
        self.layout.read().expect("layout").clone()
    }

    /// Takes `layout` if its generation is newer than the handle's (an older or equal
    /// one is a stale answer and is ignored); returns whether it was taken. Read-ahead
    /// cut by the old layout is dropped. Where a PFL instantiation or a mirror change
    /// reaches the handle: an MDS answer carrying the file's layout (an open, a getattr,
    /// an instantiation after `LayoutError::NotInstantiated`) passes it here.
    pub fn replace_layout(&self, layout: Layout) -> bool {
        let mut current = self.layout.write().expect("layout");
        if layout.generation <= current.generation {
            return false;
        }
        *current = Arc::new(layout);
        self.inflight.data_gen.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// The file size as this handle knows it: the size at open, grown by its writes.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn grow(&self, end: u64) {
        self.size.fetch_max(end, Ordering::AcqRel);
    }

    pub fn was_written(&self) -> bool {
        self.written.load(Ordering::Acquire)
    }

    /// The cell holding this handle's idea of the size, to share between handles of
    /// one file in one client (so a size change through one is seen by all).
    pub fn size_cell(&self) -> Arc<AtomicU64> {
        self.size.clone()
    }

    /// Makes this handle use a shared size cell (which grows to at least our size).
    pub fn share_size(&mut self, cell: Arc<AtomicU64>) {
        cell.fetch_max(self.size(), Ordering::AcqRel);
        self.size = cell;
    }

    /// Sets the size after a truncate done elsewhere in this client.
    pub fn set_size(&self, size: u64) {
        self.inflight.data_gen.fetch_add(1, Ordering::AcqRel);
        self.size.store(size, Ordering::Release);
    }
}

/// Whether `creds` may truncate the inode `attr` describes, as the MDS will decide:
/// checked before the objects are cut, so a refused truncate loses no data.
fn check_truncate(attr: &Attr, creds: &Creds, by_writer: bool) -> Result<()> {
    let refuse = |code, what: &str| Err(ClientError::Errno(code, format!("cannot truncate {}: {what}", attr.fid)));
    match attr.kind {
        FileKind::File => {}
        FileKind::Dir => return refuse(Errno::IsDir, "a directory"),
        _ => return refuse(Errno::Inval, "not a regular file"),
    }
    if by_writer || attr.may(creds, 2) {
        return Ok(());
    }
    refuse(Errno::Access, "permission denied")
}

/// The credentials of this process (uid, gid, supplementary groups).
pub fn process_creds() -> Creds {
    // SAFETY: getuid/getgid cannot fail; getgroups writes at most `n` entries.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut groups = vec![0 as libc::gid_t; 256];
    let n = unsafe { libc::getgroups(groups.len() as i32, groups.as_mut_ptr()) };
    groups.truncate(n.max(0) as usize);
    Creds { uid, gid, groups }
}

impl Client {
    /// Connects: fetches the configuration from the MGS.
    pub async fn connect(cfg: ClientConfig) -> Result<Client> {
        let identity = Identity::new("client", cfg.secret.clone());
        let mgs = RpcClient::new(cfg.mgs.clone(), identity.clone(), cfg.rpc.clone());
        let config = fetch_config(&mgs).await?;
        let leases = Arc::new(lease::DirLeases::new(cfg.rpc.request_timeout));
        let deferred: Arc<deferred::Deferred> = Arc::default();
        let throttle = (cfg.ost_limit.is_some() || !cfg.ost_latency.is_zero())
            .then(|| Arc::new(throttle::Throttle::new(cfg.ost_limit, cfg.ost_latency)));
        let cluster = proto::auth::cluster_identity(&cfg.secret, &config.fsname, &cfg.mgs);
        let cache = cfg.cache.as_ref().and_then(|c| match cache::Cache::open(c, cluster) {
            Ok(cache) => Some(cache),
            Err(e) => {
                tracing::warn!("running without the SSD cache: {e}");
                None
            }
        });
        let pages = (cfg.page_cache > 0).then(|| cache::mem::MemCache::new(cfg.page_cache));
        let local_osts =
            cfg.short_circuit.then(|| short_circuit::LocalOsts::new(cfg.secret.clone(), identity.client_id));
        let tracer = cfg.trace.as_ref().and_then(|t| match tracer::Tracer::create(t) {
            Ok(tr) => Some(Arc::new(tr)),
            Err(e) => {
                tracing::warn!("running without the I/O tracer: {e}");
                None
            }
        });
        Ok(Client {
            inner: Arc::new(Inner {
                cfg,
                identity,
                mgs,
                config: RwLock::new(config),
                servers: Mutex::new(HashMap::new()),
                observer: RwLock::new(None),
                last_refresh: Mutex::new(Instant::now()),
                open_files: Mutex::new(HashMap::new()),
                closes: Mutex::new(Vec::new()),
                lock_waits: tokio::sync::Semaphore::new(LOCK_WAITS_MAX),
                recent_dirs: Mutex::new(HashMap::new()),
                revocations: Arc::new(Revocations { leases: leases.clone(), deferred: deferred.clone() }),
                leases,
                leases_reachable: AtomicBool::new(true),
                deferred,
                moves: AtomicU64::new(0),
                rpcs: Arc::default(),
                statahead: Arc::default(),
                creates: Default::default(),
                stripes: Default::default(),
                cache,
                pages,
                ost_throttle: throttle,
                tracer,
                local_osts,
            }),
        })
    }

    /// The I/O tracer, if this client has a trace ring.
    pub fn tracer(&self) -> Option<&Arc<tracer::Tracer>> {
        self.inner.tracer.as_ref()
    }

    /// What the SSD cache holds and did, if this client has one.
    pub fn cache_stats(&self) -> Option<cache::Stats> {
        self.inner.cache.as_ref().map(|c| c.stats())
    }

    /// File `fid` as a backing file for a passthrough open, if the SSD cache holds all
    /// `size` bytes of it at data `version`, checked (see [`cache::Cache::backing`]).
    pub fn cache_backing(&self, fid: Fid, version: u64, size: u64) -> Option<cache::Backing> {
        match self.inner.cache.as_ref()?.backing(cache_key(fid), version, size) {
            Ok(b) => Some(b),
            Err(why) => {
                tracing::debug!(%fid, version, size, ?why, "SSD cache: not a backing file");
                None
            }
        }
    }

    /// Empties the SSD cache; false if this client has none.
    pub fn cache_clear(&self) -> Result<bool> {
        let Some(c) = self.inner.cache.as_ref() else { return Ok(false) };
        c.clear().map_err(|e| ClientError::Errno(Errno::Io, format!("emptying the SSD cache: {e}")))?;
        Ok(true)
    }

    /// The OSTs this client reads and writes through local descriptors now
    /// (short-circuit I/O; empty when it is off).
    pub fn short_circuit_osts(&self) -> Vec<u32> {
        self.inner.local_osts.as_ref().map_or_else(Vec::new, |l| l.up())
    }

    /// The memory cache's counters; `None` if this client keeps none.
    pub fn page_cache_stats(&self) -> Option<cache::mem::MemStats> {
        self.inner.pages.as_ref().map(|p| p.stats())
    }

    /// This client changed `[off, off + len)` of `fid`: the SSD and memory caches drop
    /// those bytes.
    pub(crate) fn cache_invalidate(&self, fid: Fid, off: u64, len: u64) {
        if let Some(c) = self.inner.cache.as_ref() {
            c.invalidate(cache_key(fid), off, len);
        }
        if let Some(p) = self.inner.pages.as_ref() {
            p.invalidate(cache_key(fid), off, len);
        }
    }

    /// Claims of a read of `fid` at `version` beginning now to fill the caches with
    /// what it brings back (taken before the read waits for this client's writes).
    pub(crate) fn fill_tickets(&self, fid: Fid, version: u64) -> FillTickets {
        FillTickets {
            ssd: self.inner.cache.as_ref().map(|c| c.ticket(cache_key(fid), version)),
            mem: self.inner.pages.as_ref().map(|p| p.ticket(cache_key(fid), version)),
        }
    }

    /// Hands what a read brought back from `offset` to the caches.
    ///
    /// Bytes read through local descriptors (`local`, short-circuit I/O) are in the
    /// kernel's page cache already and stay out of the memory cache, whose copy would
    /// cost more than a reread from there.
    pub(crate) fn fill_caches(&self, tickets: FillTickets, offset: u64, data: &Bytes, local: bool) {
        if let (Some(cache), Some(t)) = (self.inner.cache.as_ref(), tickets.ssd) {
            cache.fill(t, offset, data.clone());
        }
        if let (Some(pages), Some(t), false) = (self.inner.pages.as_ref(), tickets.mem, local) {
            pages.fill(t, offset, data.clone());
        }
    }

    /// How many requests this client has sent to MDTs and OSTs so far.
    pub fn rpc_counts(&self) -> RpcCounts {
        let r = &self.inner.rpcs;
        RpcCounts {
            mds: r.mds.load(Ordering::Relaxed),
            ost: r.ost.load(Ordering::Relaxed),
            local: r.local.load(Ordering::Relaxed),
        }
    }

    pub fn config(&self) -> ClusterConfig {
        self.inner.config.read().expect("config").clone()
    }

    pub fn client_config(&self) -> &ClientConfig {
        &self.inner.cfg
    }

    pub fn set_observer(&self, o: Option<Arc<dyn OpObserver>>) {
        *self.inner.observer.write().expect("observer") = o;
    }

    /// Fetches the configuration from the MGS again.
    pub async fn refresh_config(&self) -> Result<ClusterConfig> {
        self.observe("refresh_config", None, 0, 0, self.load_config()).await
    }

    async fn load_config(&self) -> Result<ClusterConfig> {
        let c = fetch_config(&self.inner.mgs).await?;
        *self.inner.config.write().expect("config") = c.clone();
        *self.inner.last_refresh.lock().expect("refresh") = Instant::now();
        Ok(c)
    }

    /// Runs `f` as operation `op`, reporting it to the observer if one is set. Every
    /// public operation goes through here, and reports once: the operations it is
    /// made of (setattr's getattr, resolve's lookups, statfs's target_usage) are part
    /// of it and are not reported again.
    pub async fn observe<T, F>(&self, op: &'static str, fid: Option<Fid>, offset: u64, len: u64, f: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        self.observe_at(op, fid, offset, len, || None, f).await
    }

    /// As [`Client::observe`], for an operation on file data that lives at `target`.
    async fn observe_at<T, F>(
        &self,
        op: &'static str,
        fid: Option<Fid>,
        offset: u64,
        len: u64,
        target: impl FnOnce() -> Option<trace::Target>,
        f: F,
    ) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        let observer = self.inner.observer.read().expect("observer").clone();
        let Some(obs) = observer.filter(|o| o.active()) else { return f.await };
        if OBSERVING.try_with(|_| ()).is_ok() {
            return f.await;
        }
        let target = target();
        let start = SystemTime::now();
        let t0 = Instant::now();
        let r = OBSERVING.scope((), f).await;
        obs.record(&OpRecord {
            op,
            fid,
            offset,
            len,
            start,
            duration: t0.elapsed(),
            result: r.as_ref().map(|_| ()).map_err(|e| e.errno()),
            target,
        });
        r
    }

    fn register_open(&self, f: &OpenFile) {
        if let Some(c) = self.inner.cache.as_ref() {
            c.opened(cache_key(f.fid), f.data_version);
        }
        if let Some(p) = self.inner.pages.as_ref() {
            p.opened(cache_key(f.fid), f.data_version);
        }
        let mut m = self.inner.open_files.lock().expect("open files");
        let list = m.entry(f.fid).or_default();
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&f.inflight));
        if m.len() > 4096 {
            m.retain(|_, l| l.iter().any(|w| w.strong_count() > 0));
        }
    }

    /// Before a size change or hole punch of `fid`: waits for the in-flight writes of
    /// every handle of the file in this client and drops their read-ahead.
    async fn drain_file(&self, fid: Fid) -> Result<()> {
        for i in self.file_inflights(fid) {
            i.drain().await?;
            i.data_gen.fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }

    /// The in-flight write state of every handle of `fid` open in this client.
    pub(crate) fn file_inflights(&self, fid: Fid) -> Vec<Arc<io::Inflight>> {
        let m = self.inner.open_files.lock().expect("open files");
        m.get(&fid).map(|l| l.iter().filter_map(|w| w.upgrade()).collect()).unwrap_or_default()
    }

    fn server(&self, address: &str) -> Arc<RpcClient> {
        let mut s = self.inner.servers.lock().expect("servers");
        s.entry(address.to_string())
            .or_insert_with(|| {
                let c = RpcClient::new(address.to_string(), self.inner.identity.clone(), self.inner.cfg.rpc.clone());
                if !c.set_callback_handler(self.inner.revocations.clone()) {
                    self.inner.leases_reachable.store(false, Ordering::Release);
                }
                Arc::new(c)
            })
            .clone()
    }

    /// The connection serving target `index` of `kind`; refreshes the configuration
    /// when the target is not known yet (e.g. an OST added since we connected).
    async fn target(&self, kind: TargetKind, index: u32) -> Result<Arc<RpcClient>> {
        let known = self.inner.config.read().expect("config").target(kind, index).map(|t| t.address.clone());
        let address = match known {
            Some(a) => a,
            // Boxed: a rare wait, kept out of every target lookup's future (which every
            // I/O of the client holds and moves).
            None => {
                Box::pin(self.load_config()).await?.target(kind, index).map(|t| t.address.clone()).ok_or_else(|| {
                    ClientError::Errno(Errno::NoEnt, format!("{}{index:04x} is not in the configuration", kind.name()))
                })?
            }
        };
        Ok(self.server(&address))
    }

    pub(crate) async fn ost(&self, index: u32) -> Result<Arc<RpcClient>> {
        self.target(TargetKind::Ost, index).await
    }

    pub(crate) async fn mdt(&self, fid: Fid) -> Result<Arc<RpcClient>> {
        self.target(TargetKind::Mdt, fid.mdt()).await
    }

    /// Sends a metadata request to the MDT of `fid`.
    async fn md(&self, fid: Fid, req: Request) -> Result<Response> {
        Ok(self.md_reply(fid, req).await?.response)
    }

    /// As [`Client::md`], with the answer's payload.
    async fn md_reply(&self, fid: Fid, req: Request) -> Result<rpc::Reply> {
        let sees_files =
            !matches!(req, Request::MdsSizeUpdate { .. } | Request::MdsClose { .. } | Request::MdsCloseMany { .. });
        if sees_files && self.inner.deferred.running() > 0 && !deferred::is_exempt() {
            // It may observe a file whose flush is still on its way (see `deferred`).
            self.inner.deferred.idle().await;
        }
        let c = self.mdt(fid).await?;
        self.inner.rpcs.count_mds();
        if !statahead::changes_nothing(&req) {
            self.inner.statahead.changed();
        }
        Ok(c.call(&req, vec![]).await?)
    }

    /// Sends the request `build(shard)` makes, which changes entry `name` of `dir`
    /// (to the shard holding it, see [`Client::md_entry`]), and keeps the directory
    /// leases true to it (see [`Client::track_entries`]).
    async fn md_change(&self, dir: Fid, name: &str, build: impl Fn(Fid) -> Request) -> Result<Response> {
        let r = self.md_entry(dir, name, build).await.map(|r| r.response);
        self.track_entries(&r, &[self.shard(dir, name)]);
        r
    }

    /// Keeps this client's directory leases true to an operation that changed (or
    /// tried to change) entries of `dirs`, whose names went into the leases before it
    /// was sent: on any failure the leases of `dirs` are dropped (the outcome is
    /// unknown, or the MDS's answer contradicts what the lease said).
    fn track_entries<T>(&self, r: &Result<T>, dirs: &[Fid]) {
        if r.is_err() {
            dirs.iter().for_each(|d| self.inner.leases.forget(*d));
        }
    }

    /// Gives the MDS back the leases this client stopped relying on, once a batch of
    /// them is ready, in the background (a lost cancel only leaves the MDS a lease
    /// until it revokes it or the connection ends).
    fn give_back_leases(&self) {
        let cancels = self.inner.leases.take_cancels(false);
        if cancels.is_empty() {
            return;
        }
        let mut by_mdt: HashMap<u32, Vec<(Fid, u64)>> = HashMap::new();
        for c in cancels {
            by_mdt.entry(c.0.mdt()).or_default().push(c);
        }
        for leases in by_mdt.into_values() {
            let this = self.clone();
            tokio::spawn(async move {
                let n = leases.len();
                if let Err(e) = this.md(leases[0].0, Request::MdsLeaseCancel { leases }).await {
                    tracing::debug!("{n} lease cancel(s) not delivered: {e}");
                }
            });
        }
    }

    /// Directory leases this client holds now.
    pub fn dir_leases_held(&self) -> usize {
        self.inner.leases.len()
    }

    /// Creates this client answered itself so far (see [`async_create`]).
    pub fn creates_answered_here(&self) -> u64 {
        self.inner.creates.answered.load(Ordering::Relaxed)
    }

    /// Entries' attributes statahead holds now (see [`statahead`]).
    pub fn statahead_entries(&self) -> usize {
        self.inner.statahead.entries()
    }

    /// Whether this client holds a lease on directory `dir` now.
    pub fn holds_dir_lease(&self, dir: Fid) -> bool {
        self.inner.leases.holds(dir)
    }

    // ---- namespace ----

    pub async fn lookup(&self, creds: &Creds, parent: Fid, name: &str) -> Result<Attr> {
        self.observe("lookup", Some(parent), 0, 0, async {
            let dir = self.shard(parent, name);
            if self.inner.leases.absent(dir, name) {
                return Err(ClientError::Errno(Errno::NoEnt, format!("{name} not found")));
            }
            if self.inner.cfg.statahead && dir == parent {
                if let Some(attr) = self.inner.statahead.take(dir, name, creds) {
                    return Ok(attr);
                }
                if let Some(fetch) = self.inner.statahead.missed(dir, name) {
                    self.spawn_statahead(creds.clone(), fetch);
                }
            }
            let req = |dir| Request::MdsLookup { creds: creds.clone(), parent: dir, name: name.to_string() };
            let attr = answer!("lookup", self.md_entry(parent, name, req).await?.response, Response::Attr(a) => a)?;
            self.dir_attr_merged(attr).await
        })
        .await
    }

    /// Fetches the attributes of the entries after `fetch.after` for the lookups
    /// that follow, in the background (see [`statahead`]).
    fn spawn_statahead(&self, creds: Creds, fetch: statahead::Fetch) {
        let c = self.clone();
        tokio::spawn(async move {
            let req = Request::MdsStatahead {
                creds: creds.clone(),
                fid: fetch.dir,
                after: Some(fetch.after.clone()),
                max: statahead::CHUNK,
            };
            match c.md(fetch.dir, req).await {
                Ok(Response::EntryAttrs { entries, .. }) => c.inner.statahead.fill(&fetch, &creds, entries),
                Ok(r) => {
                    tracing::debug!(dir = %fetch.dir, "statahead: {}", unexpected("statahead", &r));
                    c.inner.statahead.failed(&fetch);
                }
                Err(e) => {
                    tracing::debug!(dir = %fetch.dir, "statahead: {e}");
                    c.inner.statahead.failed(&fetch);
                }
            }
        });
    }

    /// Attributes of `fid` (of a striped directory, summed over its shards).
    pub async fn getattr(&self, fid: Fid) -> Result<Attr> {
        self.observe("getattr", Some(fid), 0, 0, async {
            let attr = answer!("getattr", self.md(fid, Request::MdsGetattr { fid }).await?, Response::Attr(a) => a)?;
            self.dir_attr_merged(attr).await
        })
        .await
    }

    /// Creates (or, without `exclusive`, opens an existing) file: one MDS round trip
    /// returning attributes and layout. Returns the handle and whether it existed.
    #[allow(clippy::too_many_arguments)]
    pub async fn create(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        mode: u32,
        exclusive: bool,
        flags: OpenFlags,
        layout: Option<LayoutSpec>,
    ) -> Result<(OpenFile, Attr, bool)> {
        self.observe("create", Some(parent), 0, 0, async {
            if let Some(l) = &layout {
                l.validate()?;
            }
            let req = |dir| Request::MdsCreate {
                creds: creds.clone(),
                parent: dir,
                name: name.to_string(),
                mode,
                exclusive,
                flags,
                layout: layout.clone(),
            };
            let dir = self.shard(parent, name);
            if layout.is_none() && dir == parent {
                if let Some(made) = self.create_here(creds, dir, name, mode, flags) {
                    let (f, attr) = made?;
                    return Ok((f, attr, false));
                }
            }
            let unknown = self.inner.leases.add(dir, name);
            let created_in = unknown.then_some((dir, self.inner.moves.load(Ordering::Acquire)));
            let r = if unknown {
                // A name the lease says is new cannot be a file whose flush is deferred.
                deferred::exempt(self.md_change(parent, name, req)).await
            } else {
                self.md_change(parent, name, req).await
            };
            if !exclusive && r.as_ref().is_err_and(|e| e.errno() == Errno::XDev) {
                // An existing link to a file on another MDT: opened there.
                let (f, attr) = self.open_link_elsewhere(creds, parent, name, flags).await?;
                return Ok((f, attr, true));
            }
            if unknown && matches!(r, Ok(Response::Created { existed: true, .. })) {
                // An existing name the lease did not know of: the lease was wrong.
                self.inner.leases.forget(dir);
            }
            match r? {
                Response::Created { attr, existed, dir } => {
                    match dir {
                        Some(d) => {
                            if !existed && unknown && self.inner.cfg.dir_leases {
                                self.inner.creates.learn(self.shard(parent, name), &attr, &d);
                            }
                            self.note_dir(d)
                        }
                        None => self.forget_dir(self.shard(parent, name)),
                    }
                    let mut attr = attr;
                    let mut f = OpenFile::new(&attr, flags, creds)?;
                    if !existed {
                        f.created_in = created_in;
                    }
                    self.register_open(&f);
                    if existed && flags.truncate {
                        self.truncate_open(creds, &f, 0).await?;
                        attr.size = 0;
                    }
                    Ok((f, attr, existed))
                }
                r => Err(unexpected("create", &r)),
            }
        })
        .await
    }

    /// The create of `name` in `dir`, answered here and sent in the background, if it
    /// may be (see [`async_create`]): `None` when it must go to the MDS as usual.
    fn create_here(
        &self,
        creds: &Creds,
        dir: Fid,
        name: &str,
        mode: u32,
        flags: OpenFlags,
    ) -> Option<Result<(OpenFile, Attr)>> {
        if !self.inner.cfg.dir_leases || name.len() > async_create::NAME_MAX || name.contains('/') {
            return None;
        }
        let tpl = self.inner.creates.template(dir, creds)?;
        let (fid, ask) = self.inner.creates.take_fid(dir.mdt());
        if ask {
            self.spawn_fid_grant(dir.mdt());
        }
        let fid = fid?;
        // Counted before the lease is checked: a revocation after the check waits for
        // the create.
        let Some(ticket) = self.inner.deferred.begin(0) else {
            self.inner.creates.put_back(fid);
            return None;
        };
        if !self.inner.leases.claim(dir, name) {
            self.inner.creates.put_back(fid);
            return None;
        }
        let attr = async_create::new_file_attr(fid, creds, mode, &tpl);
        self.inner.creates.answered.fetch_add(1, Ordering::Relaxed);
        let mut f = match OpenFile::new(&attr, flags, creds) {
            Ok(f) => f,
            Err(e) => return Some(Err(e)),
        };
        // The directory's times as the MDS will set them, for the kernel's re-read of
        // its attributes after the create (see `recent_dir_attr`).
        self.touch_recent_dir(dir, attr.ctime);
        let (gate, held) = async_create::gate();
        f.created = Some(gate.clone());
        f.created_in = Some((dir, self.inner.moves.load(Ordering::Acquire)));
        self.register_open(&f);
        let (creds, name, layout) = (creds.clone(), name.to_string(), tpl.layout);
        let hurry = self.inner.deferred.hurried();
        let c = self.clone();
        tokio::spawn(async move {
            // Held back for the file's first bytes (see `async_create`).
            let data = async_create::first_bytes(held, hurry).await;
            let req = Request::MdsCreateGranted { creds, parent: dir, name, mode, flags, fid, layout, data };
            let r = deferred::exempt(c.md(dir, req)).await;
            let outcome = match r {
                Ok(Response::Created { attr, dir: Some(d), .. }) if attr.fid == fid => {
                    c.note_dir(d);
                    Ok(())
                }
                Ok(r) => Err(unexpected("create", &r)),
                Err(e) => Err(e),
            };
            if let Err(e) = &outcome {
                // The lease's idea of the directory is in doubt (see `track_entries`).
                c.inner.leases.forget(dir);
                c.inner.creates.forget(dir);
                c.inner.deferred.failed(fid, e.to_string());
            }
            gate.open(outcome.map_err(|e| (e.errno(), e.to_string())));
            drop(ticket);
        });
        Some(Ok((f, attr)))
    }

    /// Asks MDT `mdt` for FIDs to give files created here, in the background.
    fn spawn_fid_grant(&self, mdt: u32) {
        let c = self.clone();
        tokio::spawn(async move {
            let req = Request::MdsFidGrant { mdt, count: async_create::GRANT_COUNT };
            let grant = match deferred::exempt(c.md(Fid::new(mdt, 0, 0), req)).await {
                Ok(Response::FidGrant { first, count }) if first.mdt() == mdt => Some((first, count)),
                Ok(r) => {
                    tracing::info!(
                        mdt,
                        "no FID grant ({}): creates go to the MDS for now",
                        unexpected("fid grant", &r)
                    );
                    None
                }
                Err(e) => {
                    tracing::info!(mdt, "no FID grant ({e}): creates go to the MDS for now");
                    None
                }
            };
            c.inner.creates.granted(mdt, grant);
        });
    }

    /// Opens an existing file (permissions checked by the MDS). With `truncate`, the
    /// file is emptied.
    pub async fn open(&self, creds: &Creds, fid: Fid, flags: OpenFlags) -> Result<(OpenFile, Attr)> {
        let req = Request::MdsOpen { creds: creds.clone(), fid, flags };
        self.observe("open", Some(fid), 0, 0, async {
            let sent_at = io::write_seq();
            let reply = self.md_reply(fid, req).await?;
            self.opened(creds, sent_at, reply, flags).await
        })
        .await
    }

    /// Opens `name` in `parent`: the lookup and the open in one MDS round trip
    /// (Lustre's intent open), and for a small Data-on-MDT file its bytes too, so
    /// reading it needs nothing more.
    pub async fn open_at(&self, creds: &Creds, parent: Fid, name: &str, flags: OpenFlags) -> Result<(OpenFile, Attr)> {
        self.observe("open", Some(parent), 0, 0, async {
            if self.inner.leases.absent(self.shard(parent, name), name) {
                return Err(ClientError::Errno(Errno::NoEnt, format!("{name} not found")));
            }
            let req = |dir| Request::MdsOpenAt { creds: creds.clone(), parent: dir, name: name.to_string(), flags };
            let sent_at = io::write_seq();
            match self.md_entry(parent, name, req).await {
                Err(e) if e.errno() == Errno::XDev => self.open_link_elsewhere(creds, parent, name, flags).await,
                Err(e) => Err(e),
                Ok(reply) => self.opened(creds, sent_at, reply, flags).await,
            }
        })
        .await
    }

    /// Opens `name` in `parent`, an entry naming a file whose inode is on another MDT
    /// (the parent's MDT answered EXDEV): looked up, then opened on its own MDT.
    async fn open_link_elsewhere(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        flags: OpenFlags,
    ) -> Result<(OpenFile, Attr)> {
        let fid = self.lookup(creds, parent, name).await?.fid;
        let req = Request::MdsOpen { creds: creds.clone(), fid, flags };
        let sent_at = io::write_seq();
        let reply = self.md_reply(fid, req).await?;
        self.opened(creds, sent_at, reply, flags).await
    }

    /// Makes the handle an open (`MdsOpen` or `MdsOpenAt`, sent when this client's
    /// write clock was at `sent_at`) answered.
    async fn opened(
        &self,
        creds: &Creds,
        sent_at: u64,
        reply: rpc::Reply,
        flags: OpenFlags,
    ) -> Result<(OpenFile, Attr)> {
        {
            let (mut attr, data) = match reply.response {
                Response::Attr(a) => (a, None),
                // A small Data-on-MDT file: its bytes came with the open.
                Response::OpenedWithData { attr } => (attr, Some(reply.payload)),
                r => return Err(unexpected("open", &r)),
            };
            let f = OpenFile::new(&attr, flags, creds)?;
            // Bytes the open returned predate a write of this client still on its way
            // to the MDT when the open was sent: such an open reads like any other.
            let quiet = || self.file_inflights(attr.fid).iter().all(|i| !i.wrote_since(sent_at));
            if let Some(data) = data.filter(|_| quiet()) {
                f.keep_data(data);
            }
            self.register_open(&f);
            // Whatever the MDS's size says: it lags unpublished writes.
            if flags.truncate {
                self.truncate_open(creds, &f, 0).await?;
                attr.size = 0;
            }
            Ok((f, attr))
        }
    }

    pub async fn mkdir(&self, creds: &Creds, parent: Fid, name: &str, mode: u32) -> Result<Attr> {
        self.mkdir_on(creds, parent, name, mode, None).await
    }

    /// Makes a directory whose inode is on MDT `on` (`braid mkdir -i K`, a remote
    /// directory; its entry stays on the parent's MDT), or as the parent's default
    /// for new directories says (on the parent's MDT without one) for `None`.
    pub async fn mkdir_on(&self, creds: &Creds, parent: Fid, name: &str, mode: u32, on: Option<u32>) -> Result<Attr> {
        self.mkdir_with(creds, parent, name, mode, on.map(DirSpec::on)).await
    }

    /// Makes a directory placed over MDTs as `spec` asks (`braid mkdir -i K -c N`: a
    /// remote or striped directory), or as the parent's default says for `None`.
    pub async fn mkdir_with(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        mode: u32,
        spec: Option<DirSpec>,
    ) -> Result<Attr> {
        self.observe("mkdir", Some(parent), 0, 0, async {
            self.forget_dir(self.shard(parent, name));
            let dir = self.shard(parent, name);
            // The server first: making its connection is what tells whether its
            // callbacks can reach this client.
            self.mdt(dir).await?;
            // A lease comes from the MDT holding the directory's entries: only its own.
            let here = spec.is_none_or(|s| s.count == 1 && s.mdt == dir.mdt());
            let lease = here && self.inner.cfg.dir_leases && self.inner.leases_reachable.load(Ordering::Acquire);
            let req =
                |d| Request::MdsMkdir { creds: creds.clone(), parent: d, name: name.to_string(), mode, lease, spec };
            self.inner.leases.add(dir, name);
            let r = self.md_entry(parent, name, req).await;
            self.track_entries(&r, &[dir]);
            let reply = r?;
            match reply.response {
                Response::DirMade { attr, parent: dir, lease } => {
                    self.note_dir(dir);
                    self.learn_stripes(&attr);
                    // An answer to a request sent again may be the reply cache's, for a
                    // lease the MDS dropped with the connection the first try was on.
                    if let (Some(id), false) = (lease, reply.resent) {
                        self.inner.leases.install(attr.fid, id, reply.session);
                        self.give_back_leases();
                    }
                    Ok(attr)
                }
                r => Err(unexpected("mkdir", &r)),
            }
        })
        .await
    }

    pub async fn symlink(&self, creds: &Creds, parent: Fid, name: &str, target: &str) -> Result<Attr> {
        let req = |dir| Request::MdsSymlink {
            creds: creds.clone(),
            parent: dir,
            name: name.to_string(),
            target: target.to_string(),
        };
        self.observe("symlink", Some(parent), 0, 0, self.make_leaf(parent, name, req)).await
    }

    /// Makes a special file (FIFO, character or block device, socket): an inode in
    /// the namespace that never touches an OST.
    pub async fn mknod(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        kind: FileKind,
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
        let req =
            |dir| Request::MdsMknod { creds: creds.clone(), parent: dir, name: name.to_string(), kind, mode, rdev };
        self.observe("mknod", Some(parent), 0, 0, self.make_leaf(parent, name, req)).await
    }

    /// Sends the request `build(shard)` makes, which makes the entry `name` in
    /// `parent` for a new inode without data (a symlink or a special file), and
    /// returns the inode's attributes.
    async fn make_leaf(&self, parent: Fid, name: &str, build: impl Fn(Fid) -> Request) -> Result<Attr> {
        self.forget_dir(self.shard(parent, name));
        self.inner.leases.add(self.shard(parent, name), name);
        let op = build(parent).op_name();
        answer!(op, self.md_change(parent, name, build).await?, Response::Attr(a) => a)
    }

    pub async fn readlink(&self, fid: Fid) -> Result<String> {
        md_op!(self, "readlink", fid, Request::MdsReadlink { fid }, Response::Link(t) => t)
    }

    pub async fn link(&self, creds: &Creds, fid: Fid, parent: Fid, name: &str) -> Result<Attr> {
        self.observe("link", Some(fid), 0, 0, async {
            self.inner.moves.fetch_add(1, Ordering::AcqRel);
            self.forget_dir(self.shard(parent, name));
            self.inner.leases.add(self.shard(parent, name), name);
            let req = |dir| Request::MdsLink { creds: creds.clone(), fid, parent: dir, name: name.to_string() };
            answer!("link", self.md_change(parent, name, req).await?, Response::Attr(a) => a)
        })
        .await
    }

    pub async fn unlink(&self, creds: &Creds, parent: Fid, name: &str) -> Result<()> {
        let req = |dir| Request::MdsUnlink { creds: creds.clone(), parent: dir, name: name.to_string() };
        self.observe("unlink", Some(parent), 0, 0, async {
            self.settle_closes().await;
            self.remove_entry(parent, name, req).await
        })
        .await
    }

    pub async fn rmdir(&self, creds: &Creds, parent: Fid, name: &str) -> Result<()> {
        let req = |dir| Request::MdsRmdir { creds: creds.clone(), parent: dir, name: name.to_string() };
        self.observe("rmdir", Some(parent), 0, 0, self.remove_entry(parent, name, req)).await
    }

    /// Sends the request `build(shard)` makes, which removes `name` from `parent` (an
    /// unlink or an rmdir), and remembers the directory as the MDS left it.
    async fn remove_entry(&self, parent: Fid, name: &str, build: impl Fn(Fid) -> Request) -> Result<()> {
        let op = build(parent).op_name();
        let dir = answer!(op, self.md_change(parent, name, build).await?, Response::DirChanged { dir } => dir)?;
        self.note_dir(dir);
        Ok(())
    }

    pub async fn rename(
        &self,
        creds: &Creds,
        parent: Fid,
        name: &str,
        new_parent: Fid,
        new_name: &str,
        flags: RenameFlags,
    ) -> Result<()> {
        self.observe("rename", Some(parent), 0, 0, async {
            self.inner.moves.fetch_add(1, Ordering::AcqRel);
            self.forget_dir(self.shard(parent, name));
            self.forget_dir(self.shard(new_parent, new_name));
            self.settle_closes().await;
            let req = |from, to| Request::MdsRename {
                creds: creds.clone(),
                parent: from,
                name: name.to_string(),
                new_parent: to,
                new_name: new_name.to_string(),
                flags,
            };
            let dirs = [self.shard(new_parent, new_name), self.shard(parent, name)];
            self.inner.leases.add(dirs[0], new_name);
            // To the new entry's MDT, which coordinates a rename from another MDT.
            let r = self.md_entries2((parent, name), Some((new_parent, new_name)), req).await.map(|r| r.response);
            self.track_entries(&r, &dirs);
            answer!("rename", r?, Response::Ok => ())
        })
        .await
    }

    /// One batch of directory entries after `after` (name order), of every shard of
    /// a striped directory.
    pub async fn readdir(
        &self,
        creds: &Creds,
        fid: Fid,
        after: Option<&str>,
        max: u32,
    ) -> Result<(Vec<DirEntry>, bool)> {
        self.observe("readdir", Some(fid), 0, 0, self.readdir_merged(creds, fid, after, max)).await
    }

    /// Every entry of a directory.
    pub async fn readdir_all(&self, creds: &Creds, fid: Fid) -> Result<Vec<DirEntry>> {
        self.observe("readdir_all", Some(fid), 0, 0, async {
            let mut all = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let (batch, eof) = self.readdir(creds, fid, after.as_deref(), 1024).await?;
                after = batch.last().map(|e| e.name.clone());
                all.extend(batch);
                if eof || after.is_none() {
                    return Ok(all);
                }
            }
        })
        .await
    }

    /// Changes attributes. A size change punches the OST objects first, so a crash in
    /// between leaves zeros (never stale bytes) past the new size.
    ///
    /// Every object is cut to the new size whatever size the MDS holds: while a file
    /// is open for writing the MDS's size lags the bytes on the OSTs (writers publish
    /// it at close and fsync), and a cut decided from it would leave bytes past the
    /// new end that a later extension would bring back.
    pub async fn setattr(&self, creds: &Creds, fid: Fid, set: SetAttr) -> Result<Attr> {
        self.observe("setattr", Some(fid), set.size.unwrap_or(0), 0, async {
            self.forget_dir(fid);
            if let Some(size) = set.size {
                let attr = self.getattr(fid).await?;
                // Cut nothing the MDS would refuse to truncate (it checks again).
                check_truncate(&attr, creds, set.by_writer)?;
                if let Some(layout) = attr.layout {
                    let layout = self.layout_below(creds, fid, Arc::new(layout), size).await?;
                    self.cut_objects(fid, &layout, size).await?;
                }
            }
            let times = self.before_times_set(fid, &set).await;
            let req = Request::MdsSetattr { creds: creds.clone(), fid, set };
            let attr = answer!("setattr", self.md(fid, req).await?, Response::Attr(a) => a)?;
            times_set(times);
            self.dir_attr_merged(attr).await
        })
        .await
    }

    /// Before a setattr of `fid` that sets its mtime: waits until the writes of
    /// every handle of the file in this client have landed (a DoM write sets the
    /// mtime as it lands), and returns each handle with its data generation then, for
    /// [`times_set`]. Lustre's client flushes its dirty pages before such a setattr
    /// for the same reason.
    async fn before_times_set(&self, fid: Fid, set: &SetAttr) -> Vec<(Arc<io::Inflight>, u64)> {
        if set.mtime.is_none() {
            return Vec::new();
        }
        let mut handles = Vec::new();
        for i in self.file_inflights(fid) {
            i.settle().await;
            let gen = i.data_gen.load(Ordering::Acquire);
            handles.push((i, gen));
        }
        handles
    }

    /// Changes the layout of an existing file: instantiates components, or adds or
    /// deletes trailing ones (`setstripe --component-add/--component-del`). Returns
    /// the file's attributes with the layout as it now is.
    pub async fn change_layout(&self, creds: &Creds, fid: Fid, change: LayoutChange) -> Result<Attr> {
        let req = Request::MdsLayoutChange { creds: creds.clone(), fid, change };
        md_op!(self, "layout_change", fid, req, Response::Attr(a) => a)
    }

    /// `layout`, of file `fid`, with objects for every byte below `end` (PFL
    /// instantiation): as it is when it has them, else as the MDS makes it.
    async fn layout_below(&self, creds: &Creds, fid: Fid, layout: Arc<Layout>, end: u64) -> Result<Arc<Layout>> {
        if layout.instantiated_below(end) {
            return Ok(layout);
        }
        let attr = self.change_layout(creds, fid, LayoutChange::Instantiate { end }).await?;
        let layout = attr.layout.ok_or_else(|| ClientError::Errno(Errno::Io, format!("{fid} lost its layout")))?;
        Ok(Arc::new(layout))
    }

    /// The handle's layout with objects for every byte below `end`: where a write or
    /// truncate reaching a component not instantiated yet has the MDS instantiate it
    /// (or learns that another client did) and the handle takes the new generation.
    pub(crate) async fn instantiate(&self, f: &OpenFile, end: u64) -> Result<Arc<Layout>> {
        let layout = f.layout();
        if layout.instantiated_below(end) {
            return Ok(layout);
        }
        // Boxed: once per component, kept out of every write's future.
        let fresh = Box::pin(self.layout_below(&f.creds, f.fid, layout, end)).await?;
        f.replace_layout((*fresh).clone());
        let layout = f.layout();
        match layout.instantiated_below(end) {
            true => Ok(layout),
            false => Err(ClientError::Errno(
                Errno::Io,
                format!("{}: the MDS answered a layout without objects below {end}", f.fid),
            )),
        }
    }

    /// Before a truncate or hole punch through a handle: a layout that may have grown
    /// since the handle took it (components instantiated or added by another client)
    /// is asked for again, so the cut reaches every object that holds bytes.
    pub(crate) async fn refresh_unsettled_layout(&self, f: &OpenFile) -> Result<()> {
        if f.layout().is_settled() {
            return Ok(());
        }
        if let Some(fresh) = self.getattr(f.fid).await?.layout {
            f.replace_layout(fresh);
        }
        Ok(())
    }

    /// The data half of a truncate: waits for this client's writes to the file still
    /// on their way (a write that returned before the truncate must not land after
    /// the cut), drops read-ahead, and cuts every object to what `size` needs.
    async fn cut_objects(&self, fid: Fid, layout: &Layout, size: u64) -> Result<()> {
        self.drain_file(fid).await?;
        // Before and after: a read that fetched the old bytes while the cut was on
        // its way must not leave them in the SSD cache.
        self.cache_invalidate(fid, size, u64::MAX - size);
        let r = io::punch(self, fid, layout, size).await;
        self.cache_invalidate(fid, size, u64::MAX - size);
        r
    }

    /// A setattr through an open handle: with a size, the objects are cut through the
    /// handle's layout (no layout lookup), and the handle adopts the new size and
    /// truncate epoch, so its later size reports need no glimpse.
    async fn setattr_through(&self, creds: &Creds, f: &OpenFile, set: SetAttr) -> Result<Attr> {
        f.created().await?;
        let size = set.size;
        if let Some(size) = size {
            self.refresh_unsettled_layout(f).await?;
            let layout = self.instantiate(f, size).await?;
            self.cut_objects(f.fid, &layout, size).await?;
        }
        let times = self.before_times_set(f.fid, &set).await;
        let req = Request::MdsSetattr { creds: creds.clone(), fid: f.fid, set };
        let a = answer!("setattr", self.md(f.fid, req).await?, Response::Attr(a) => a)?;
        times_set(times);
        if let Some(size) = size {
            f.set_size(size);
            f.inflight.trunc_epoch.store(a.trunc_epoch, Ordering::Release);
        }
        Ok(a)
    }

    async fn truncate_open(&self, creds: &Creds, f: &OpenFile, size: u64) -> Result<()> {
        f.created().await?;
        // Opened for writing (or with O_TRUNC): permission was checked at open.
        let by_writer = f.flags.write || f.flags.truncate;
        let set = SetAttr { size: Some(size), by_writer, ..Default::default() };
        self.setattr_through(creds, f, set).await.map(|_| ())
    }

    /// Truncates an open file (ftruncate).
    pub async fn ftruncate(&self, creds: &Creds, f: &OpenFile, size: u64) -> Result<()> {
        self.observe("truncate", Some(f.fid), size, 0, self.truncate_open(creds, f, size)).await
    }

    /// Every handle of `fid` in this client takes the truncate epoch of a truncate
    /// this client just made (`trunc_epoch` from its answer), so their size reports
    /// need no glimpse. Only for a caller that has also set every such handle's size
    /// to the new size (the mount, whose handles of one file share one size cell):
    /// a handle keeping an older, larger size would otherwise publish it again.
    pub fn adopt_truncate(&self, fid: Fid, trunc_epoch: u64) {
        for i in self.file_inflights(fid) {
            i.trunc_epoch.fetch_max(trunc_epoch, Ordering::AcqRel);
        }
    }

    /// Changes attributes through a handle open for writing (the kernel's
    /// `ftruncate`): a size change is not checked against the mode again (permission
    /// was checked at open).
    pub async fn fsetattr(&self, creds: &Creds, f: &OpenFile, set: SetAttr) -> Result<Attr> {
        let set = SetAttr { by_writer: set.size.is_some() && (f.flags.write || f.flags.truncate), ..set };
        self.observe("setattr", Some(f.fid), set.size.unwrap_or(0), 0, self.setattr_through(creds, f, set)).await
    }

    pub async fn setxattr(&self, creds: &Creds, fid: Fid, name: &str, value: &[u8], mode: XattrMode) -> Result<()> {
        self.observe("setxattr", Some(fid), 0, value.len() as u64, async {
            self.forget_dir(fid);
            let req =
                Request::MdsSetxattr { creds: creds.clone(), fid, name: name.to_string(), value: value.to_vec(), mode };
            answer!("setxattr", self.md(fid, req).await?, Response::Ok => ())
        })
        .await
    }

    pub async fn getxattr(&self, creds: &Creds, fid: Fid, name: &str) -> Result<Vec<u8>> {
        let req = Request::MdsGetxattr { creds: creds.clone(), fid, name: name.to_string() };
        md_op!(self, "getxattr", fid, req, Response::Xattr(v) => v)
    }

    pub async fn listxattr(&self, creds: &Creds, fid: Fid) -> Result<Vec<String>> {
        let req = Request::MdsListxattr { creds: creds.clone(), fid };
        md_op!(self, "listxattr", fid, req, Response::XattrNames(v) => v)
    }

    pub async fn removexattr(&self, creds: &Creds, fid: Fid, name: &str) -> Result<()> {
        self.observe("removexattr", Some(fid), 0, 0, async {
            self.forget_dir(fid);
            let req = Request::MdsRemovexattr { creds: creds.clone(), fid, name: name.to_string() };
            answer!("removexattr", self.md(fid, req).await?, Response::Ok => ())
        })
        .await
    }

    pub async fn set_dir_layout(&self, creds: &Creds, fid: Fid, spec: Option<LayoutSpec>) -> Result<()> {
        self.observe("setstripe", Some(fid), 0, 0, async {
            if let Some(s) = &spec {
                s.validate()?;
            }
            let req = Request::MdsSetDirLayout { creds: creds.clone(), fid, spec };
            answer!("setstripe", self.md(fid, req).await?, Response::Ok => ())
        })
        .await
    }

    pub async fn get_dir_layout(&self, fid: Fid) -> Result<Option<LayoutSpec>> {
        md_op!(self, "getstripe", fid, Request::MdsGetDirLayout { fid }, Response::DirLayout(s) => s)
    }

    // ---- data ----

    /// Reads up to `len` bytes at `offset`, clamped to the size the handle knows.
    pub async fn read(&self, f: &OpenFile, offset: u64, len: u64) -> Result<Bytes> {
        let target = || Some(tracer::data_target(f, offset));
        let read = async {
            f.created().await?;
            io::read(self, f, offset, len).await
        };
        self.observe_at("read", Some(f.fid), offset, len, target, read).await
    }

    /// Reads `len` bytes at `offset` for a server that sends them on (the NBD
    /// export): as ranges of local object files when short-circuit I/O reaches all of
    /// them, to be sent from the kernel's page cache without passing through this
    /// process (`sendfile`), each `len` bytes long, zeros past the file's end;
    /// otherwise as [`Client::read`] reads them.
    pub async fn read_for_send(&self, f: &OpenFile, offset: u64, len: u64) -> Result<ReadOut> {
        let target = || Some(tracer::data_target(f, offset));
        let read = async {
            f.created().await?;
            match io::local_ranges(self, f, offset, len).await? {
                Some(ranges) => Ok(ReadOut::Local(ranges)),
                None => io::read(self, f, offset, len).await.map(ReadOut::Bytes),
            }
        };
        self.observe_at("read", Some(f.fid), offset, len, target, read).await
    }

    /// Writes `data` at `offset`, all stripes in parallel. The call returns once the
    /// RPCs are under way (at most `max_dirty_bytes` per file in flight); a failure is
    /// reported by the next write, `flush`, `fsync` or `close` of the handle.
    pub async fn write(&self, f: &OpenFile, offset: u64, data: Bytes) -> Result<u64> {
        let len = data.len() as u64;
        let target = || Some(tracer::data_target(f, offset));
        self.observe_at("write", Some(f.fid), offset, len, target, async {
            io::write(self, f, offset, data).await?;
            Ok(len)
        })
        .await
    }

    /// Deallocates a byte range of an open file; it reads back as zeros and the file
    /// size does not change (`fallocate(PUNCH_HOLE|KEEP_SIZE)`).
    pub async fn punch_hole(&self, f: &OpenFile, offset: u64, len: u64) -> Result<()> {
        self.observe("punch", Some(f.fid), offset, len, async {
            f.created().await?;
            self.drain_file(f.fid).await?;
            self.refresh_unsettled_layout(f).await?;
            let r = io::punch_hole(self, f, offset, len).await;
            // Again once it landed (see `cut_objects`).
            self.cache_invalidate(f.fid, offset, len);
            r
        })
        .await
    }

    /// The close-to-open point (`close(2)` of a descriptor): waits until every write of
    /// the handle reached its OSTs and publishes the size and mtime on the MDS, so a
    /// client that opens the file afterwards reads it whole. Returns the first error of
    /// a write that failed since the last flush. Unlike `fsync`, nothing is forced to disk.
    pub async fn flush(&self, f: &OpenFile) -> Result<()> {
        self.observe("flush", Some(f.fid), 0, 0, async {
            f.created().await?;
            // Both at once: the size covers every write already issued, and close(2)
            // returns only when the data and the size are both where they belong. If
            // a write failed, flush reports it (the size may then cover bytes that
            // read back as zeros, which POSIX allows after a failed write).
            let (drained, published) = tokio::join!(f.inflight.drain(), self.report_size(f));
            drained?;
            published?;
            // A DoM write that could not publish the size with its bytes (the file was
            // truncated from elsewhere meanwhile) says so only when it is answered.
            self.report_size(f).await
        })
        .await
    }

    /// Defers the flush of a handle's close, if it may be (see [`deferred`]): a small
    /// file this client created, in a directory whose lease it still trusts, with no
    /// rename or link since. The flush is then [`Client::finish_deferred`]'s, given the
    /// ticket; without one, flush now.
    pub fn defer_flush(&self, f: &OpenFile) -> Option<deferred::Ticket> {
        let (dir, moves) = f.created_in?;
        if self.inner.moves.load(Ordering::Acquire) != moves {
            return None;
        }
        // Counted before the lease is checked: a revocation after the check waits for it.
        let ticket = self.inner.deferred.begin(f.size())?;
        self.inner.leases.trusted(dir).then_some(ticket)
    }

    /// Carries out a flush deferred by [`Client::defer_flush`] (from a task of its own).
    pub async fn finish_deferred(&self, f: &OpenFile, ticket: deferred::Ticket) {
        if let Err(e) = deferred::exempt(self.flush(f)).await {
            self.inner.deferred.failed(f.fid, e.to_string());
        }
        drop(ticket);
    }

    /// Waits until no flush is deferred (an unmount).
    pub async fn deferred_idle(&self) {
        self.inner.deferred.idle().await
    }

    /// Makes the handle's writes durable on the OSTs and its size on the MDT.
    pub async fn fsync(&self, f: &OpenFile) -> Result<()> {
        self.observe("fsync", Some(f.fid), 0, 0, async {
            f.created().await?;
            if let Some(why) = self.inner.deferred.take_failure(f.fid) {
                return Err(ClientError::Errno(Errno::Io, format!("an earlier close's flush failed: {why}")));
            }
            f.inflight.drain().await?;
            let dirty: Vec<objio::Target> = f.dirty.lock().expect("dirty").drain().collect();
            if let Err(e) = objio::sync(self, &dirty).await {
                // Not synced: a later fsync must try these objects again.
                f.dirty.lock().expect("dirty").extend(dirty);
                return Err(e);
            }
            self.report_size(f).await?;
            self.sync_metadata(f.fid).await
        })
        .await
    }

    /// Makes every metadata operation the MDT holding `fid` has acknowledged durable
    /// (fsync of a file or a directory): MDTs acknowledge once an operation survives
    /// their own crash, and reach the disk at their next checkpoint or at this call.
    pub async fn sync_metadata(&self, fid: Fid) -> Result<()> {
        md_op!(self, "sync_metadata", fid, Request::MdsSync { fid }, Response::Ok => ())
    }

    /// Tells the MDS the size and mtime of a written handle, unless nothing was written
    /// since the last time.
    async fn report_size(&self, f: &OpenFile) -> Result<()> {
        // The generation before the size: a write bumps it again only once its end is in
        // the size (`io::write`), so the size read below covers every write this
        // generation counts.
        let gen = f.inflight.data_gen.load(Ordering::Acquire);
        if !f.was_written() || f.published_gen.load(Ordering::Acquire) == gen {
            return Ok(());
        }
        // Taken before the size is read (one atomic step, so a write that sets it again
        // after growing the size is either seen here with its size, or left for the next
        // report).
        if !f.needs_publish.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let epoch = f.inflight.trunc_epoch.load(Ordering::Acquire);
        let req = Request::MdsSizeUpdate { fid: f.fid, size: f.size(), mtime: f.report_mtime(), trunc_epoch: epoch };
        let reported = match self.md(f.fid, req).await {
            Ok(Response::Attr(_)) => Ok(()),
            Ok(Response::EpochMoved { trunc_epoch }) => self.report_size_from_objects(f, trunc_epoch).await,
            Ok(r) => Err(unexpected("size update", &r)),
            Err(e) => Err(e),
        };
        match reported {
            Ok(()) => f.published_gen.store(gen, Ordering::Release),
            // Still to report: the next flush, fsync or the close tries again.
            Err(_) => f.needs_publish.store(true, Ordering::Release),
        }
        reported
    }

    /// After a truncate from elsewhere (the MDS answered [`Response::EpochMoved`]),
    /// the size this handle holds may predate the cut: the objects say what the file
    /// holds now. Once this client's writes to the file have landed, their sizes are
    /// glimpsed and reported under the new epoch, which the handle adopts.
    async fn report_size_from_objects(&self, f: &OpenFile, mut epoch: u64) -> Result<()> {
        for i in self.file_inflights(f.fid) {
            i.settle().await;
        }
        for _ in 0..EPOCH_RETRIES_MAX {
            let size = io::glimpse(self, f.fid, &f.layout()).await?;
            let req = Request::MdsSizeUpdate { fid: f.fid, size, mtime: f.report_mtime(), trunc_epoch: epoch };
            match self.md(f.fid, req).await? {
                Response::Attr(a) => {
                    f.inflight.trunc_epoch.store(epoch, Ordering::Release);
                    f.set_size(a.size);
                    return Ok(());
                }
                // Truncated again meanwhile: glimpse again.
                Response::EpochMoved { trunc_epoch } => epoch = trunc_epoch,
                r => return Err(unexpected("size update", &r)),
            }
        }
        Err(ClientError::Errno(Errno::Again, format!("{}: truncated from elsewhere throughout the size report", f.fid)))
    }

    /// Closes a handle: a writer reports the file's new size and mtime to the MDS
    /// (what makes close-to-open consistency hold), and the MDS drops its open count
    /// (the last close of an unlinked file destroys it).
    pub async fn close(&self, f: OpenFile) -> Result<()> {
        self.close_shared(&f).await
    }

    /// [`Client::close`] of a handle that something else may still hold for a moment
    /// (the mount: a reader that has answered the kernel but not yet let go). Nothing
    /// may write through it afterwards.
    pub async fn close_shared(&self, f: &OpenFile) -> Result<()> {
        self.observe("close", Some(f.fid), 0, 0, async {
            // A file whose create failed was never open on the MDS.
            f.created().await?;
            let flushed = f.inflight.drain().await;
            let unpublished = f.published_gen.load(Ordering::Acquire) != f.inflight.data_gen.load(Ordering::Acquire)
                && f.needs_publish.load(Ordering::Acquire);
            if !(f.was_written() && unpublished) {
                // Nothing to report: the MDS only needs to learn, soon, that the open
                // count dropped (it keeps an unlinked file while open). Such closes go
                // out together a few milliseconds later, one RPC for many.
                self.defer_close(f.fid).await;
                return flushed;
            }
            let (size, mtime) = (Some(f.size()), f.report_mtime());
            let trunc_epoch = f.inflight.trunc_epoch.load(Ordering::Acquire);
            match self.md(f.fid, Request::MdsClose { fid: f.fid, size, mtime, trunc_epoch }).await? {
                Response::Ok => flushed,
                Response::EpochMoved { trunc_epoch } => {
                    self.report_size_from_objects(f, trunc_epoch).await?;
                    flushed
                }
                r => Err(unexpected("close", &r)),
            }
        })
        .await
    }

    /// A directory's attributes as this client's own create, unlink or rmdir in it
    /// left them, if that was less than `max_age` ago and nothing this client did since
    /// changed them otherwise. The mount answers the kernel's re-read of the parent
    /// after each create or unlink from here (within its attribute cache time, which
    /// bounds how stale an answer can be, as for any cached attribute).
    /// A striped directory's: summed over its shards' (see [`striped`]), when this
    /// client holds recent attributes of every shard.
    pub fn recent_dir_attr(&self, fid: Fid, max_age: Duration) -> Option<(Attr, Duration)> {
        let dirs = self.inner.recent_dirs.lock().expect("recent dirs");
        let recent = |f: Fid| {
            let (a, at) = dirs.get(&f)?;
            let age = at.elapsed();
            (age < max_age).then(|| (a.clone(), max_age - age))
        };
        let (attr, ttl) = recent(fid)?;
        match attr.stripes.clone().filter(|s| s.master() == fid) {
            None => Some((attr, ttl)),
            Some(s) => {
                let mut shards = Vec::with_capacity(s.shards.len() - 1);
                let mut ttl = ttl;
                for &f in s.shards.iter().skip(1) {
                    let (a, t) = recent(f)?;
                    ttl = ttl.min(t);
                    shards.push(a);
                }
                Some((striped::merge_dir_attr(attr, &shards), ttl))
            }
        }
    }

    fn note_dir(&self, attr: Attr) {
        let mut dirs = self.inner.recent_dirs.lock().expect("recent dirs");
        if dirs.len() >= RECENT_DIRS_MAX {
            dirs.clear();
        }
        dirs.insert(attr.fid, (attr, Instant::now()));
    }

    /// A create answered here changed directory `fid` at `now`: what
    /// [`Client::recent_dir_attr`] knows of it takes that time, and keeps its age.
    fn touch_recent_dir(&self, fid: Fid, now: Timespec) {
        if let Some((a, _)) = self.inner.recent_dirs.lock().expect("recent dirs").get_mut(&fid) {
            a.mtime = a.mtime.max(now);
            a.ctime = a.ctime.max(now);
        }
    }

    /// Drops what [`Client::recent_dir_attr`] knows of `fid` (this client changed it).
    fn forget_dir(&self, fid: Fid) {
        self.inner.creates.forget(fid);
        self.inner.recent_dirs.lock().expect("recent dirs").remove(&fid);
    }

    async fn defer_close(&self, fid: Fid) {
        let (first, full) = {
            let mut q = self.inner.closes.lock().expect("closes");
            q.push(fid);
            (q.len() == 1, q.len() >= CLOSE_BATCH_MAX)
        };
        if full {
            self.send_closes().await;
        } else if first {
            let c = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(CLOSE_DELAY).await;
                c.send_closes().await;
            });
        }
    }

    /// Sends every deferred close, one RPC per MDT. A failure is only logged: the MDS
    /// forgets a client's opens when its connection ends.
    async fn send_closes(&self) {
        let fids = std::mem::take(&mut *self.inner.closes.lock().expect("closes"));
        let mut by_mdt: HashMap<u32, Vec<Fid>> = HashMap::new();
        for fid in fids {
            by_mdt.entry(fid.mdt()).or_default().push(fid);
        }
        for fids in by_mdt.into_values() {
            let n = fids.len();
            match self.md(fids[0], Request::MdsCloseMany { fids }).await {
                Ok(Response::Ok) => {}
                Ok(r) => tracing::debug!("{n} deferred close(s): {}", unexpected("close", &r)),
                Err(e) => tracing::debug!("{n} deferred close(s) not delivered: {e}"),
            }
        }
    }

    /// Sends deferred closes now: before removing a name this client just closed (the
    /// file is then destroyed at once instead of left an orphan for the reaper), and
    /// for a caller counting RPCs that must not count them later.
    pub async fn settle_closes(&self) {
        if !self.inner.closes.lock().expect("closes").is_empty() {
            self.send_closes().await;
        }
    }

    /// Takes, changes or releases a byte-range lock (`end` inclusive). Returns the
    /// conflicting lock when it cannot be granted; with `wait`, keeps asking until it is.
    pub async fn set_lock(&self, fid: Fid, lock: LockRequest, wait: bool) -> Result<Option<LockInfo>> {
        self.set_lock_until(fid, lock, wait, || false).await
    }

    /// As [`Client::set_lock`], and a wait ends with `EINTR` once `interrupted` says so
    /// (a signal came for the waiting process). It is asked between the MDS's wait
    /// slices and every [`INTERRUPT_POLL`] while waiting for a turn. A lock granted
    /// before it is noticed is kept, as a local lock granted just before a signal is.
    pub async fn set_lock_until(
        &self,
        fid: Fid,
        lock: LockRequest,
        wait: bool,
        interrupted: impl Fn() -> bool,
    ) -> Result<Option<LockInfo>> {
        let len = lock.end.saturating_sub(lock.start).saturating_add(1);
        let intr = || ClientError::Errno(Errno::Intr, format!("{fid}: lock wait interrupted by a signal"));
        self.observe("setlk", Some(fid), lock.start, len, async {
            let mut first = true;
            loop {
                // A turn each time it has to wait: waiters queued here get theirs as the
                // MDS's wait slices end, whatever lock they wait for. So a lock is first
                // asked for without waiting, with no turn: one that is free (another
                // file's, a holder's own change of its lock) never queues behind the
                // waiters. An unlock never waits, even sent as F_SETLKW (as Python's
                // lockf does).
                let waits = wait && lock.lock != LockType::Unlock && !first;
                first = false;
                let mut turn = None;
                while waits && turn.is_none() {
                    if interrupted() {
                        return Err(intr());
                    }
                    let ask = self.inner.lock_waits.acquire();
                    turn = tokio::time::timeout(INTERRUPT_POLL, ask).await.ok().map(|t| t.expect("never closed"));
                }
                let req = Request::MdsSetLock { fid, lock, wait: waits };
                match self.md(fid, req).await? {
                    Response::Ok => return Ok(None),
                    Response::Lock(Some(c)) if !wait => return Ok(Some(c)),
                    Response::Lock(_) if interrupted() => return Err(intr()),
                    Response::Lock(_) => continue,
                    r => return Err(unexpected("setlk", &r)),
                }
            }
        })
        .await
    }

    /// The first lock that would conflict with the described one (`F_GETLK`).
    pub async fn get_lock(&self, fid: Fid, lock: LockRequest) -> Result<Option<LockInfo>> {
        self.observe("getlk", Some(fid), lock.start, 0, async {
            let req = Request::MdsGetLock { fid, lock };
            answer!("getlk", self.md(fid, req).await?, Response::Lock(c) => c)
        })
        .await
    }

    /// The size of a file as its objects show it (Lustre's glimpse): needed while
    /// another client writes it and has not closed yet.
    pub async fn glimpse_size(&self, attr: &Attr) -> Result<u64> {
        self.observe("glimpse_size", Some(attr.fid), 0, 0, async {
            let Some(layout) = &attr.layout else {
                return Ok(attr.size);
            };
            Ok(attr.size.max(io::glimpse(self, attr.fid, layout).await?))
        })
        .await
    }

    // ---- cluster ----

    /// Usage of every target, asked of the target itself; `Err` for one that does not
    /// answer.
    pub async fn target_usage(&self) -> Result<Vec<(TargetInfo, std::result::Result<Usage, String>)>> {
        self.observe("target_usage", None, 0, 0, async {
            let config = self.load_config().await?;
            let mut out = Vec::new();
            for t in config.mdts.iter().chain(config.osts.iter()) {
                let req = match t.kind {
                    TargetKind::Mdt => Request::MdsStatfs { mdt: t.index },
                    TargetKind::Ost => Request::OstStatfs { ost: t.index },
                };
                let u = if !t.up {
                    Err("inactive device".to_string())
                } else {
                    // The connection every other request uses (a connection per call
                    // cost a handshake each, and `df` in a loop piled them up); a target
                    // that does not answer soon is shown as such, not waited for.
                    let server = self.server(&t.address);
                    match tokio::time::timeout(USAGE_WAIT, server.call(&req, vec![])).await {
                        Ok(Ok(r)) => match r.response {
                            Response::Usage(u) => Ok(u),
                            other => Err(format!("unexpected answer {other:?}")),
                        },
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err(format!("no answer within {} s", USAGE_WAIT.as_secs())),
                    }
                };
                out.push((t.clone(), u));
            }
            Ok(out)
        })
        .await
    }

    /// File system totals (statfs): space from the OSTs, inodes from the MDTs. Targets
    /// that do not answer are left out, as Lustre's client leaves out inactive OSTs;
    /// when no OST (or no MDT) answers, the totals would be made up, so it is an error.
    pub async fn statfs(&self) -> Result<Usage> {
        self.observe("statfs", None, 0, 0, async {
            let mut total = Usage::default();
            let usage = self.target_usage().await?;
            for kind in [TargetKind::Mdt, TargetKind::Ost] {
                let of_kind: Vec<_> = usage.iter().filter(|(t, _)| t.kind == kind).collect();
                if !of_kind.is_empty() && of_kind.iter().all(|(_, u)| u.is_err()) {
                    let why = of_kind.iter().filter_map(|(t, u)| {
                        u.as_ref().err().map(|e| format!("{}{:04x}: {e}", t.kind.name(), t.index))
                    });
                    return Err(ClientError::Errno(
                        Errno::Io,
                        format!("statfs: no {} answered ({})", kind.name(), why.collect::<Vec<_>>().join("; ")),
                    ));
                }
            }
            for (t, u) in usage {
                let Ok(u) = u else { continue };
                match t.kind {
                    TargetKind::Ost => {
                        total.total_bytes += u.total_bytes;
                        total.free_bytes += u.free_bytes;
                        total.avail_bytes += u.avail_bytes;
                    }
                    TargetKind::Mdt => {
                        total.total_inodes += u.total_inodes;
                        total.free_inodes += u.free_inodes;
                    }
                }
            }
            Ok(total)
        })
        .await
    }
}

async fn fetch_config(mgs: &RpcClient) -> Result<ClusterConfig> {
    match mgs.call(&Request::MgsGetConfig, vec![]).await?.response {
        Response::Config(c) => Ok(c),
        r => Err(unexpected("get config", &r)),
    }
}

/// Runs a client on its own runtime for synchronous callers (CLI, FUSE threads).
pub struct BlockingClient {
    rt: tokio::runtime::Runtime,
    pub client: Client,
}

impl BlockingClient {
    pub fn connect(cfg: ClientConfig, worker_threads: usize) -> Result<BlockingClient> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads.max(1))
            .enable_all()
            .thread_name("braid-client")
            .build()
            .map_err(|e| ClientError::Errno(Errno::Io, format!("cannot start the client runtime: {e}")))?;
        let client = rt.block_on(Client::connect(cfg))?;
        Ok(BlockingClient { rt, client })
    }

    /// Runs one future to completion.
    pub fn run<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    pub fn handle(&self) -> tokio::runtime::Handle {
        self.rt.handle().clone()
    }
}

/// A file's name in the SSD cache: its FID, packed.
/// A read's claims on the SSD and memory caches (see `Client::fill_tickets`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FillTickets {
    ssd: Option<cache::Ticket>,
    mem: Option<cache::mem::Ticket>,
}

pub(crate) fn cache_key(fid: Fid) -> cache::Key {
    ((fid.seq as u128) << 64) | ((fid.oid as u128) << 32) | fid.ver as u128
}
