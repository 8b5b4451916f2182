//! The braid native client.
//!
//! A client knows only the MGS address; everything else (MDTs, OSTs, their addresses
//! and state) comes from the MGS configuration. Metadata operations go to the MDT
//! that owns the FID; file data goes straight to the OSTs named by the file's layout,
//! all stripes of a request in parallel. The MDS is never on the data path.
//!
//! Structure:
//! - [`Client`]: connections, configuration, the observe point, and the helpers every
//!   operation uses; the operations themselves by family, as the MDT's are split:
//!   `namespace` (names, attributes, layouts), `file` (I/O on an open file, flushes,
//!   closes, locks), `cluster` (the targets' usage, statfs). Each public operation passes
//!   through [`Client::observe`] — the one place a tracer hooks in.
//! - [`io`]: the data path (striped reads and writes, truncates, hole punches).
//! - [`objio`]: where each piece of a file lives and the I/O on one piece: the one
//!   place DoM, mirrors and a read cache plug in.
//! - `lease`: directory leases, which answer lookups of absent names locally.
//! - [`deferred`]: closes whose flush finishes after close(2) returned.
//! - [`set_behind`]: attribute changes of a file created here, sent behind.
//! - [`async_create`]: creates answered here under a lease, sent in the background.
//! - [`statahead`]: entries' attributes fetched in bulk ahead of lookups.
//! - [`path`]: path resolution over lookups, symlinks included.
//! - [`mirror`]: file-level mirrors (reads that fall back, writes that mark stale,
//!   extend, resync, split, verify); `migrate`: a file's bytes moved to a new layout.
//! - `striped`: striped directories (which shard holds a name, merged listings).
//! - `short_circuit`: reads and writes of objects whose OSS runs on this machine
//!   through descriptors it hands over.
//! - [`OpenFile`]: an open file's layout (replaceable) and the size it knows.

pub mod async_create;
pub mod deferred;
pub mod first_bytes;
pub mod held_locks;
pub mod io;
pub mod jobid;
mod lease;
pub mod mirror;
pub mod objio;
pub mod path;
pub mod set_behind;
mod short_circuit;
pub mod statahead;
mod striped;
mod throttle;
pub mod tracer;
pub mod xattrless;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use layout::{Layout, LayoutError};
use proto::msg::{Request, Response};
use proto::RpcError;
use rpc::{Identity, RpcClient, RpcOptions};

// What front ends (the FUSE mount, the CLI tools, the coming NBD server) need of the
// wire's types, so that they depend on this crate alone and never on messages.
pub use cache::Backing as CacheBacking;
pub use layout::DirHash;
pub use proto::auth::Secret;
pub use proto::msg::{
    Attr, ClusterConfig, Creds, DirEntry, DirEntryPlus, DirSpec, DirStripes, FileKind, LockInfo, LockRequest, LockType,
    LoggedOpen, OpenFlags, RenameFlags, SetAttr, TargetInfo, TargetKind, TimeSet, Timespec, Usage, XattrMode,
    DIR_STRIPES_ALL, MDT_BALANCED,
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

// The operation families, declared after the macros above, which they use.
mod cluster;
mod file;
mod migrate;
mod namespace;

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
    /// How often the configuration is fetched again from the MGS, so that a client
    /// that lives on learns of new targets, pools and root squash without a failure
    /// first (Lustre's clients are told by the MGS's config lock); zero: never.
    pub config_refresh: Duration,
    /// Connect over TLS with these files (see `rpc::tls`).
    pub tls: Option<Arc<rpc::tls::TlsContext>>,
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
            config_refresh: CONFIG_REFRESH,
            tls: None,
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
    "readdirplus",
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
    "pool_change",
    "migrate",
    "mirror",
    "open_log",
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
    /// The address servers see this client's requests come from (that of its
    /// connection to the MGS), for root squash's exempt list.
    own_ip: std::net::IpAddr,
    servers: Mutex<HashMap<String, Arc<RpcClient>>>,
    observer: RwLock<Option<Arc<dyn OpObserver>>>,
    last_refresh: Mutex<Instant>,
    /// The MGS did not answer the last fetch of the configuration (said once per
    /// outage).
    mgs_away: AtomicBool,
    /// In-flight write state of every open handle, by file: a truncate or hole punch
    /// waits for them first.
    open_files: Mutex<HashMap<Fid, Vec<std::sync::Weak<io::Inflight>>>>,
    /// Closes with nothing to report, not yet sent (see [`Client::close`]).
    closes: Mutex<Vec<Fid>>,
    /// Turns to wait on an MDS for a lock (see [`LOCK_WAITS_MAX`]).
    lock_waits: tokio::sync::Semaphore,
    /// The locks this client holds (see [`held_locks`]), and replays of them under
    /// way.
    held_locks: Arc<held_locks::HeldLocks>,
    replays: Arc<deferred::Deferred>,
    /// Lock requests hold it shared, a replay alone: a replay sends what the table
    /// says with no lock request of this client between.
    lock_gate: tokio::sync::RwLock<()>,
    /// Directories' attributes as this client's own create or unlink in them left
    /// them, and when (see [`Client::recent_dir_attr`]).
    recent_dirs: Mutex<HashMap<Fid, (Attr, Instant)>>,
    /// Directory leases held; also what carries out the MDS's callbacks.
    leases: Arc<lease::DirLeases>,
    /// Whether every server's callbacks can reach `leases` (false: ask for none).
    leases_reachable: AtomicBool,
    /// Flushes finished after their close returned (see [`deferred`]).
    deferred: Arc<deferred::Deferred>,
    /// Unlinks answered here and sent in the background (see
    /// [`Client::unlink_vetted`]): waited for as the deferred flushes are.
    removals: Arc<deferred::Deferred>,
    unlinks_answered: AtomicU64,
    /// Files created here whose attribute changes may be answered here (see
    /// [`set_behind`]).
    sets_behind: set_behind::SetsBehind,
    /// What carries out the MDS's callbacks: the leases, then the deferred flushes.
    revocations: Arc<Revocations>,
    /// Renames and links sent: a file created before one may have a name others can
    /// read, so its close is not deferred.
    moves: AtomicU64,
    /// Requests sent, by kind of target.
    rpcs: Arc<RpcCounters>,
    readahead_stats: io::ReadaheadStats,
    /// Inodes that moved to another MDT, and where they went (see
    /// [`Client::md_reply`]).
    moved_inodes: Mutex<HashMap<Fid, Fid>>,
    any_moved: AtomicBool,
    /// Creates answered here (see [`async_create`]): templates and FID grants.
    creates: async_create::AsyncCreates,
    /// Entries' attributes fetched ahead of lookups (see [`statahead`]); every request
    /// that may change metadata moves its epoch, whether statahead is on or not.
    statahead: Arc<statahead::Statahead>,
    /// Small files' layouts and sizes as last told, for reads beside their opens
    /// (see [`first_bytes`]).
    first_bytes: first_bytes::Hints,
    /// Files an open just found without extended attributes (see [`xattrless`]).
    xattrless: xattrless::Xattrless,
    /// OSTs mirrored reads failed on lately (see [`mirror`]).
    failed_osts: mirror::FailedOsts,
    /// The shard tables of striped directories met so far.
    stripes: striped::StripeTables,
    /// The SSD read cache, if configured and usable.
    pub(crate) cache: Option<cache::Cache>,
    pub(crate) pages: Option<cache::mem::MemCache>,
    ost_throttle: Option<Arc<throttle::Throttle>>,
    /// Microseconds each MDS request waits before it is sent (see
    /// [`Client::set_mds_latency`]).
    mds_latency_us: AtomicU64,
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

/// A reading of [`Client::io_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Bytes of reads answered from chunks read ahead, and read without one.
    pub readahead_hit_bytes: u64,
    pub readahead_miss_bytes: u64,
    /// Flushes finished after their close returned (see [`deferred`]), and unlinks
    /// answered here, still being sent: the client's queues of work owed to the MDS.
    pub deferred_flushes: u64,
    pub deferred_removals: u64,
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
/// once, and acked once every deferred flush and removal is done (see [`deferred`]);
/// so is a restarted MDS's call for what was deferred under its previous run's leases.
struct Revocations {
    leases: Arc<lease::DirLeases>,
    deferred: Arc<deferred::Deferred>,
    removals: Arc<deferred::Deferred>,
    /// Replays of opens and locks under way (a restarted MDS's call waits for them).
    replays: Arc<deferred::Deferred>,
    /// Servers whose connection ended, for [`keep_connected`] (bounded; one lost is
    /// made again by the next request).
    lost: tokio::sync::mpsc::Sender<String>,
}

impl rpc::CallbackHandler for Revocations {
    fn callback(&self, cb: &proto::msg::Callback) -> Option<rpc::AckAfter> {
        self.leases.revoked(cb);
        if self.deferred.running() == 0 && self.removals.running() == 0 && self.replays.running() == 0 {
            return None;
        }
        let (deferred, removals, replays) = (self.deferred.clone(), self.removals.clone(), self.replays.clone());
        Some(Box::pin(async move {
            deferred.idle().await;
            removals.idle().await;
            replays.idle().await
        }))
    }

    fn disconnected(&self, addr: &str) {
        // [`keep_connected`] sees whether anything needs the server at once.
        let _ = self.lost.try_send(addr.to_string());
    }
}

/// Most lost connections [`keep_connected`] has yet to look at.
const LOST_MAX: usize = 64;

/// Most hops one request follows an inode moving between MDTs.
const MOVED_MAX: usize = 16;

/// Most moved inodes a client remembers the last place of (all are forgotten when
/// it is full: a forgotten one costs the hops again, and a mount's handles opened
/// through a new name are no longer found from the kernel's old one). Some 3 MiB at
/// most.
const MOVED_KEPT: usize = 65_536;

/// How often a request an MDS has not answered looks whether its MDT moved (see
/// [`Client::call_following`]).
const MOVE_CHECK: Duration = Duration::from_secs(1);

/// The default of [`ClientConfig::config_refresh`].
pub const CONFIG_REFRESH: Duration = Duration::from_secs(5);

/// Fetches the configuration again every `every` (see
/// [`ClientConfig::config_refresh`]); a fetch the MGS does not answer within that is
/// given up until the next. Ends with the client.
async fn follow_config(inner: std::sync::Weak<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else { return };
        Client { inner }.config_or_last(every).await;
    }
}

/// Connects again at once to an MDS whose connection ended while deferred work was
/// under way or locks were held (its sending retries only now and then, and OST
/// transfers may hold it back): a restarted MDS waits, at the end of its recovery
/// window, only for the clients connected to it (see the MDS's `recovery`). Once
/// connected (where the MDTs were, or where the MGS says they moved), replays the
/// open handles and locks held on them ([`Client::replay`]). Ends with the client.
async fn keep_connected(weak: std::sync::Weak<Inner>, mut lost: tokio::sync::mpsc::Receiver<String>) {
    let pinging: Arc<Mutex<std::collections::HashSet<String>>> = Arc::default();
    while let Some(addr) = lost.recv().await {
        let Some(inner) = weak.upgrade() else { return };
        // The MDTs that were served there.
        let mdts: Vec<u32> =
            inner.config.read().expect("config").mdts.iter().filter(|t| t.address == addr).map(|t| t.index).collect();
        if mdts.is_empty() {
            continue;
        }
        let replays = !inner.held_locks.is_empty() || Client { inner: inner.clone() }.holds_open();
        let deferred = inner.deferred.running() > 0 || inner.removals.running() > 0;
        if !(replays || deferred) || !pinging.lock().expect("pinging").insert(addr.clone()) {
            continue;
        }
        // Taken now: a restarted MDS's call at its window's end waits for the replay.
        let replay = replays.then(|| inner.replays.begin(0)).flatten();
        let give_up = Instant::now() + inner.cfg.rpc.recovery_timeout;
        let (pinging, weak) = (pinging.clone(), weak.clone());
        drop(inner);
        tokio::spawn(async move {
            // The MDS back where it was, or the MDTs moved (a failover): whichever
            // answers first.
            let mut at = addr.clone();
            let back = loop {
                let Some(inner) = weak.upgrade() else { break false };
                let c = Client { inner };
                let server = c.server(&at);
                match tokio::time::timeout(MOVE_CHECK, server.call(&Request::Ping, vec![])).await {
                    Ok(Ok(_)) => break true,
                    Ok(Err(e)) => {
                        tracing::debug!(%at, "not connected again: {e}");
                        break false;
                    }
                    Err(_) if Instant::now() >= give_up => break false,
                    Err(_) => {
                        let config = c.config_or_last(MOVE_CHECK).await;
                        if let Some(t) = config.target(TargetKind::Mdt, mdts[0]) {
                            at = t.address.clone();
                        }
                    }
                }
            };
            if let (true, Some(inner), Some(_)) = (back, weak.upgrade(), &replay) {
                Client { inner }.replay(&mdts).await;
            }
            pinging.lock().expect("pinging").remove(&addr);
        });
    }
}

/// The one file or directory a request reads about, if it reads about one: a file's
/// attributes, bytes, xattrs or open by FID, or a directory's entries (a lookup,
/// listing or open by name there). Deferred work elsewhere cannot change its answer.
/// A setattr too: what it must land after is deferred work naming its file (its
/// create, its flushes) or directory (the creates there, which its mode and times
/// must follow), so `tar x`'s and `cp -a`'s directory times and modes, set after
/// their contents, do not wait for every other copy's flush. And a create, mkdir,
/// symlink or mknod by name: its answer depends on the names of its directory only
/// (a file whose flush is deferred elsewhere has no other name: a link or rename
/// waits for every deferred flush), so `tar x` making the next directory does not
/// wait for the flushes of the files it just wrote in the last one.
fn about(req: &Request) -> Option<Fid> {
    match req {
        Request::MdsGetattr { fid }
        | Request::MdsOpen { fid, .. }
        | Request::MdsReadlink { fid }
        | Request::MdsGetxattr { fid, .. }
        | Request::MdsListxattr { fid, .. }
        | Request::MdsDomRead { fid, .. }
        | Request::MdsDomGetattr { fid }
        | Request::MdsReaddir { fid, .. }
        | Request::MdsReaddirPlus { fid, .. }
        | Request::MdsStatahead { fid, .. }
        | Request::MdsSetattr { fid, .. } => Some(*fid),
        Request::MdsLookup { parent, .. }
        | Request::MdsOpenAt { parent, .. }
        | Request::MdsCreate { parent, .. }
        | Request::MdsMkdir { parent, .. }
        | Request::MdsSymlink { parent, .. }
        | Request::MdsMknod { parent, .. } => Some(*parent),
        _ => None,
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
    /// This handle created the file under a lease: its attribute changes may be
    /// answered here until it closes (see [`set_behind`]).
    behind: Option<Arc<set_behind::Created>>,
}

impl OpenFile {
    fn new(attr: &Attr, flags: OpenFlags, creds: &Creds) -> Result<OpenFile> {
        let layout = attr.layout.clone().ok_or_else(|| match attr.kind {
            FileKind::Dir => ClientError::Errno(Errno::IsDir, format!("{} is a directory", attr.fid)),
            kind => ClientError::Errno(Errno::NotSup, format!("{} is a {kind:?}: no I/O through braid", attr.fid)),
        })?;
        let inflight = io::Inflight::default();
        inflight.trunc_epoch.store(attr.trunc_epoch, Ordering::Release);
        inflight.writable.store(flags.write, Ordering::Release);
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
            behind: None,
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
        let identity = Identity::with_tls("client", cfg.secret.clone(), cfg.tls.clone());
        let mgs = RpcClient::new(cfg.mgs.clone(), identity.clone(), cfg.rpc.clone());
        let config = fetch_config(&mgs).await?;
        let own_ip = mgs.local_ip().await?;
        let leases = Arc::new(lease::DirLeases::new(cfg.rpc.request_timeout));
        let deferred: Arc<deferred::Deferred> = Arc::default();
        let removals: Arc<deferred::Deferred> = Arc::default();
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
        let (lost_tx, lost_rx) = tokio::sync::mpsc::channel(LOST_MAX);
        let held_locks: Arc<held_locks::HeldLocks> = Arc::default();
        let replays: Arc<deferred::Deferred> = Arc::default();
        let client = Client {
            inner: Arc::new(Inner {
                cfg,
                identity,
                mgs,
                config: RwLock::new(config),
                own_ip,
                servers: Mutex::new(HashMap::new()),
                observer: RwLock::new(None),
                last_refresh: Mutex::new(Instant::now()),
                mgs_away: AtomicBool::new(false),
                open_files: Mutex::new(HashMap::new()),
                closes: Mutex::new(Vec::new()),
                lock_waits: tokio::sync::Semaphore::new(LOCK_WAITS_MAX),
                held_locks: held_locks.clone(),
                replays: replays.clone(),
                lock_gate: tokio::sync::RwLock::new(()),
                recent_dirs: Mutex::new(HashMap::new()),
                revocations: Arc::new(Revocations {
                    leases: leases.clone(),
                    deferred: deferred.clone(),
                    removals: removals.clone(),
                    lost: lost_tx,
                    replays: replays.clone(),
                }),
                leases,
                leases_reachable: AtomicBool::new(true),
                deferred,
                removals,
                unlinks_answered: AtomicU64::new(0),
                sets_behind: Default::default(),
                moves: AtomicU64::new(0),
                rpcs: Arc::default(),
                readahead_stats: Default::default(),
                moved_inodes: Default::default(),
                any_moved: AtomicBool::new(false),
                statahead: Arc::default(),
                first_bytes: Default::default(),
                xattrless: Default::default(),
                failed_osts: Default::default(),
                creates: Default::default(),
                stripes: Default::default(),
                cache,
                pages,
                ost_throttle: throttle,
                mds_latency_us: AtomicU64::new(0),
                tracer,
                local_osts,
            }),
        };
        tokio::spawn(keep_connected(Arc::downgrade(&client.inner), lost_rx));
        if !client.inner.cfg.config_refresh.is_zero() {
            tokio::spawn(follow_config(Arc::downgrade(&client.inner), client.inner.cfg.config_refresh));
        }
        Ok(client)
    }

    /// Whether root on this client acts as another user: the configuration's root
    /// squash ([`proto::squash`]) applies to this client's address.
    pub fn root_squashed(&self) -> bool {
        let config = self.inner.config.read().expect("config");
        config.root_squash.as_ref().is_some_and(|r| !r.exempt(self.inner.own_ip))
    }

    /// `creds` as the MDS takes them: root squashed when [`Client::root_squashed`].
    /// What this client answers itself (creates and unlinks under a directory
    /// lease, permission checks against cached attributes) must use these.
    pub fn squash(&self, mut creds: Creds) -> Creds {
        if creds.uid == 0 {
            let config = self.inner.config.read().expect("config");
            if let Some(rule) = &config.root_squash {
                creds.squash(rule, self.inner.own_ip);
            }
        }
        creds
    }

    /// Has every MDS request from now on wait `latency` before it is sent: a far MDS,
    /// or a client slow to send what it deferred, emulated (for tests of recovery and
    /// eviction, and benchmarks of what leases hide).
    pub fn set_mds_latency(&self, latency: Duration) {
        self.inner.mds_latency_us.store(latency.as_micros() as u64, Ordering::Release);
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

    /// What the read-ahead served and the work answered here still queued to send:
    /// figures for the mount's metrics endpoint.
    pub fn io_stats(&self) -> IoStats {
        let (readahead_hit_bytes, readahead_miss_bytes) = self.inner.readahead_stats.read();
        IoStats {
            readahead_hit_bytes,
            readahead_miss_bytes,
            deferred_flushes: self.inner.deferred.running() as u64,
            deferred_removals: self.inner.removals.running() as u64,
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

    /// This client's id, as servers know it (see [`LoggedOpen::client`]).
    pub fn client_id(&self) -> u64 {
        self.inner.identity.client_id
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

    /// The configuration fetched from the MGS now, or, when the MGS does not answer
    /// within `wait`, the last one: a client goes on without its MGS, and says so
    /// once (and again once it is back).
    pub(crate) async fn config_or_last(&self, wait: Duration) -> ClusterConfig {
        let why = match tokio::time::timeout(wait, self.load_config()).await {
            Ok(Ok(c)) => {
                if self.inner.mgs_away.swap(false, Ordering::AcqRel) {
                    tracing::info!("the MGS at {} answers again", self.inner.cfg.mgs);
                }
                return c;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer in {wait:?}"),
        };
        if !self.inner.mgs_away.swap(true, Ordering::AcqRel) {
            let age = self.inner.last_refresh.lock().expect("refresh").elapsed();
            tracing::warn!(
                "the MGS at {} does not answer ({why}): going on with the configuration fetched {}s ago",
                self.inner.cfg.mgs,
                age.as_secs()
            );
        }
        self.config()
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

    /// Tracks a file this handle created in leased directory `dir`, whose attribute
    /// changes may then be answered here (see [`set_behind`]).
    fn track_created(&self, f: &mut OpenFile, attr: &Attr, dir: Fid) {
        let moves = self.inner.moves.load(Ordering::Acquire);
        f.behind = self.inner.sets_behind.created(attr, dir, moves, f.size.clone(), f.created.clone());
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

    /// The FID inode `fid` has now: where this client saw it move to another MDT
    /// (`braid migrate -m`), every move followed; `fid` itself otherwise. What is
    /// kept by FID (a handle's state, a truncate's epoch) is kept under this one.
    pub fn now_named(&self, mut fid: Fid) -> Fid {
        if !self.inner.any_moved.load(Ordering::Relaxed) {
            return fid;
        }
        let moved = self.inner.moved_inodes.lock().expect("moved inodes");
        for _ in 0..MOVED_MAX {
            match moved.get(&fid) {
                Some(&to) => fid = to,
                None => break,
            }
        }
        fid
    }

    /// Sends a metadata request to the MDT of `fid`.
    async fn md(&self, fid: Fid, req: Request) -> Result<Response> {
        Ok(self.md_reply(fid, req).await?.response)
    }

    /// As [`Client::md`], with the answer's payload. A request naming an inode that
    /// moved to another MDT (`braid migrate -m`) is sent again naming it where it is
    /// now (the old MDT answers [`Response::Moved`]): a name the kernel keeps for the
    /// old inode goes on working.
    async fn md_reply(&self, mut fid: Fid, mut req: Request) -> Result<rpc::Reply> {
        // An inode this client saw move: straight to where it went last (no lock
        // taken while none did).
        let known = match self.inner.any_moved.load(Ordering::Relaxed) {
            true => self.inner.moved_inodes.lock().expect("moved inodes").get(&fid).copied(),
            false => None,
        };
        if let Some(to) = known.filter(|&to| req.retarget(fid, to)) {
            fid = to;
        }
        let reply = self.md_reply_once(fid, &req).await?;
        match reply.response {
            Response::Moved { from, to } => Box::pin(self.md_moved(fid, req, from, to)).await,
            _ => Ok(reply),
        }
    }

    /// Sends `req`, whose inode `from` moved to `to`, again naming `to`, as long as
    /// the inodes it names keep moving (at most [`MOVED_MAX`] hops: an inode moved
    /// back and forth leaves a chain of them), and remembers where `from` ended up.
    async fn md_moved(&self, mut fid: Fid, mut req: Request, mut from: Fid, mut to: Fid) -> Result<rpc::Reply> {
        // Where each inode met went last: a chain of moves of one inode is remembered
        // from its start to its end, another inode (a rename names two directories)
        // on its own.
        let mut learned = vec![(from, to)];
        for _ in 0..MOVED_MAX {
            if !req.retarget(from, to) {
                break;
            }
            if fid == from {
                fid = to;
            }
            tracing::debug!(%from, %to, op = req.op_name(), "the inode moved to another MDT: sending there");
            let reply = self.md_reply_once(fid, &req).await?;
            match reply.response {
                Response::Moved { from: f, to: t } => {
                    match learned.iter_mut().find(|(_, last)| *last == f) {
                        Some(chain) => chain.1 = t,
                        None => learned.push((f, t)),
                    }
                    (from, to) = (f, t);
                }
                _ => {
                    let mut moved = self.inner.moved_inodes.lock().expect("moved inodes");
                    if moved.len() + learned.len() > MOVED_KEPT {
                        moved.clear();
                    }
                    moved.extend(learned);
                    self.inner.any_moved.store(true, Ordering::Relaxed);
                    return Ok(reply);
                }
            }
        }
        Err(ClientError::Errno(Errno::Stale, format!("{from} moved to {to}, and {} cannot follow", req.op_name())))
    }

    async fn md_reply_once(&self, fid: Fid, req: &Request) -> Result<rpc::Reply> {
        let sees_files =
            !matches!(req, Request::MdsSizeUpdate { .. } | Request::MdsClose { .. } | Request::MdsCloseMany { .. });
        if sees_files && !deferred::is_exempt() {
            // It may observe a file whose flush, or a name whose removal, is still on
            // its way (see `deferred`). A request about one file or directory waits
            // only for work on it (`Deferred::busy`): `cp -a` reading its sources
            // does not wait for the flushes of the copies it made.
            let wait = match about(req) {
                Some(fid) => self.inner.deferred.busy(fid),
                None => self.inner.deferred.running() > 0,
            };
            if wait {
                self.inner.deferred.idle().await;
            }
            if self.inner.removals.running() > 0 {
                self.inner.removals.idle().await;
            }
        }
        let latency = self.inner.mds_latency_us.load(Ordering::Acquire);
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        let c = self.mdt(fid).await?;
        self.inner.rpcs.count_mds();
        // An unlink this client answered itself moved the epoch when it was answered,
        // and every request of this client since has waited for it to land (above:
        // a removal names no file, so all wait), so its sending moves nothing more
        // (`rm -rf` listing the next directory while the last one's unlinks are sent
        // keeps the listing's first batch). A create answered here does not qualify:
        // a listing of its directory's parent does not wait for it.
        let answered_here = matches!(req, Request::MdsUnlinkAt { .. });
        if !statahead::changes_nothing(req) && !answered_here {
            self.inner.statahead.changed();
        }
        self.call_following(fid.mdt(), c, req).await
    }

    /// Sends `req` to MDT `mdt` through `c`, and follows the MDT if it moves
    /// meanwhile: while the request is unanswered, the configuration is looked at
    /// every [`MOVE_CHECK`], and once the MGS names another address for the MDT (its
    /// MDS came back on another node or port) the request goes there instead, with
    /// the same xid, so that the MDT's reply cache answers a change sent twice as the
    /// first time.
    async fn call_following(&self, mdt: u32, mut c: Arc<RpcClient>, req: &Request) -> Result<rpc::Reply> {
        let xid = self.inner.identity.next_xid();
        loop {
            let addr = c.addr().to_string();
            let to = {
                // Boxed, both: a server of this process runs its handler inside the
                // call's future, and a test thread's stack does not hold two such.
                let moved = Box::pin(async {
                    loop {
                        tokio::time::sleep(MOVE_CHECK).await;
                        let config = self.config_or_last(MOVE_CHECK).await;
                        if let Some(t) = config.target(TargetKind::Mdt, mdt).filter(|t| t.address != addr) {
                            return t.address.clone();
                        }
                    }
                });
                tokio::select! {
                    r = Box::pin(c.call_with_xid(xid, req, vec![])) => return Ok(r?),
                    to = moved => to,
                }
            };
            tracing::info!(mdt, from = %addr, %to, "the MDT moved: sending its request there");
            c = self.server(&to);
        }
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

    /// Moves whenever this client sends a request that may change metadata (or
    /// answers one itself): attributes fetched before it moved may predate this
    /// client's own change, and are not handed on as current.
    pub fn metadata_epoch(&self) -> u64 {
        self.inner.statahead.epoch()
    }

    /// Unlinks this client answered itself so far (see [`Client::unlink_vetted`]).
    pub fn unlinks_answered_here(&self) -> u64 {
        self.inner.unlinks_answered.load(Ordering::Relaxed)
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

    /// Whether this client holds a lease on directory `dir` it may rely on now (no
    /// revocation on its way, its connection fresh): no other client has changed the
    /// directory's entries since it was granted.
    pub fn trusts_dir_lease(&self, dir: Fid) -> bool {
        self.inner.leases.trusted(dir)
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
pub(crate) fn cache_key(fid: Fid) -> cache::Key {
    ((fid.seq as u128) << 64) | ((fid.oid as u128) << 32) | fid.ver as u128
}
