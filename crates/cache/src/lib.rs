//! The client's SSD read cache (capability C7, after MAHA-FS's client cache in seed
//! 003): file data a client read, kept in a local directory (an SSD on a real client)
//! so that it is read again from there instead of from the OSTs.
//!
//! - **Lazy fill.** A read that misses is served from the OSTs first; its bytes are
//!   handed to a fill thread through a bounded queue ([`FILL_QUEUE_BYTES`]) and written
//!   to the cache afterwards, off the application's path. A full queue skips the fill.
//! - **Write-through.** Writes go to the OSTs as always; the cached bytes they touch
//!   are dropped ([`Cache::invalidate`]), and a fill of a read taken before the write is
//!   refused, so the cache never holds what only it has, nor bytes older than a write.
//! - **Coherence across clients** rests on the MDS's data version of each file
//!   (`Attr::data_version`): the cache holds one version per file, an open of a newer
//!   one drops the file's bytes ([`Cache::opened`]), and a read is served only for the
//!   version its handle opened.
//! - **Space.** One sparse cache file per cached file, each byte at its own offset
//!   ([`store`]): the local file system places them (ext4 with its own buddy
//!   allocator). The cache counts what it holds in whole pages against its size; the
//!   least recently used extents are evicted to make room, and their pages punched out.
//! - **Passthrough.** A file held whole, every byte checked by this process, can be
//!   handed out as a backing file ([`Cache::backing`]): the kernel then serves its reads
//!   from the cache file itself, without the mount.
//! - **Persistence.** The index is a checksummed log ([`index`]) replayed at start;
//!   every page of cached data has its checksum, checked on every read: a torn or
//!   changed page is dropped and read from the OSTs, never served.
//!
//! Any failure of the cache directory (missing, read-only, full, held by another
//! client) leaves the client working without it; what happened goes to the log.

pub mod index;
pub mod mem;
mod readbuf;
mod store;

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::Serialize;

use index::{Changed, Found, Index, Reserved, PAGE};
pub use index::{Key, Refused, Ticket};
use store::{Fds, Stamp};

/// Bytes of read data waiting to be written to the cache, at most; fills past it are
/// skipped (the next read of those bytes fills them).
pub const FILL_QUEUE_BYTES: u64 = 64 << 20;
/// Fills waiting, at most.
const FILL_QUEUE_JOBS: usize = 256;
/// How long an open waits for another client to let go of the directory.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// The smallest cache worth having: one extent of the largest size.
pub const MIN_SIZE: u64 = index::EXTENT_MAX;

/// Where the cache lives and how big it may grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    pub dir: PathBuf,
    pub size: u64,
}

/// Why the cache could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cache directory {dir}: {what}: {source}")]
    Io { dir: PathBuf, what: &'static str, source: std::io::Error },
    /// On a read-only file system, or not this process's to write: said as such, not
    /// as a failure to open a lock file the user never heard of.
    #[error("cache directory {dir} is not writable ({what}: {source}); the cache needs a directory it can write")]
    NotWritable { dir: PathBuf, what: &'static str, source: std::io::Error },
    #[error("cache directory {0} is in use by another braid client")]
    Busy(PathBuf),
    #[error("cache size {0} is below the smallest cache ({MIN_SIZE} bytes)")]
    TooSmall(u64),
}

/// What `braid cache status` shows.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Stats {
    pub dir: String,
    /// Bytes the cache may hold.
    pub size: u64,
    /// Bytes of it allocated to cached data.
    pub used: u64,
    pub extents: u64,
    /// Reads served whole from the cache, and their bytes.
    pub hits: u64,
    pub hit_bytes: u64,
    /// Reads that went to the OSTs.
    pub misses: u64,
    /// Extents written to the cache after a miss, and their bytes.
    pub fills: u64,
    pub fill_bytes: u64,
    /// Fills dropped because the queue was full, or refused because the file changed
    /// meanwhile.
    pub fills_skipped: u64,
    /// Fills that failed to write (a full or failing cache disk).
    pub fill_errors: u64,
    pub evictions: u64,
    /// Extents dropped because the file changed (a write or truncate here, a newer data
    /// version at open), or by `braid cache drop`.
    pub invalidations: u64,
    /// Extents whose bytes failed their checksum (dropped, read from the OSTs).
    pub damaged: u64,
    /// Files handed out whole as the backing file of a passthrough open (their reads
    /// then never reach the client, nor these counters).
    pub backings: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    hit_bytes: AtomicU64,
    misses: AtomicU64,
    fills: AtomicU64,
    fill_bytes: AtomicU64,
    fills_skipped: AtomicU64,
    fill_errors: AtomicU64,
    evictions: AtomicU64,
    invalidations: AtomicU64,
    damaged: AtomicU64,
    backings: AtomicU64,
}

impl Counters {
    fn changed(&self, c: Changed) {
        self.evictions.fetch_add(c.evicted, Ordering::Relaxed);
        self.invalidations.fetch_add(c.invalidated, Ordering::Relaxed);
    }
}

struct Inner {
    dir: PathBuf,
    /// Cache files are read and written `O_DIRECT` where the file system allows (see
    /// [`store::Fds`]): a cached range is read from the disk in one request of its
    /// size, not through the host's page cache and its read-ahead (which would also
    /// keep a second copy of bytes the mount's own page cache holds), and written the
    /// same way (no dirty pages for the kernel's writeback to spend the application's
    /// CPU on).
    index: Mutex<Index>,
    /// The index's invalidation clock (see [`Cache::ticket`]).
    clock: Arc<AtomicU64>,
    counters: Counters,
    /// Buffers of answers, reused.
    buffers: Arc<readbuf::Pool>,
    queued_bytes: AtomicU64,
    /// Holds the directory's lock (`flock`) while the cache is open.
    _lock: File,
}

enum Job {
    Fill { ticket: Ticket, off: u64, data: Bytes },
    Settle(std::sync::mpsc::Sender<()>),
}

/// An open cache. Cheap to clone; when the last clone goes, the fill thread writes
/// what is queued and ends, and the directory is free for the next client.
#[derive(Clone)]
pub struct Cache {
    // Dropped first: the fill thread holds `inner` until it ends.
    filler: Arc<Filler>,
    inner: Arc<Inner>,
}

struct Filler {
    tx: Option<SyncSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Filler {
    fn send(&self, job: Job) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.send(job).is_ok())
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Cache {
    /// Opens (or creates) the cache in `cfg.dir` for files of `cluster` (a number naming
    /// the file system: bytes cached for another one are dropped), replaying its index.
    pub fn open(cfg: &CacheConfig, cluster: u64) -> Result<Cache, CacheError> {
        let io = |what: &'static str| {
            let dir = cfg.dir.clone();
            move |source: std::io::Error| match source.kind() {
                ErrorKind::ReadOnlyFilesystem | ErrorKind::PermissionDenied => {
                    CacheError::NotWritable { dir, what, source }
                }
                _ => CacheError::Io { dir, what, source },
            }
        };
        if cfg.size < MIN_SIZE {
            return Err(CacheError::TooSmall(cfg.size));
        }
        std::fs::create_dir_all(&cfg.dir).map_err(io("create"))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(cfg.dir.join("lock"))
            .map_err(io("open lock"))?;
        // A mount unmounted a moment ago may still be writing its last fills: wait for it
        // a while before calling the directory busy.
        let give_up = std::time::Instant::now() + LOCK_WAIT;
        // SAFETY: flock on a descriptor this function owns.
        while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if std::time::Instant::now() >= give_up {
                return Err(CacheError::Busy(cfg.dir.clone()));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let (index, replayed) = Index::open(&cfg.dir, cfg.size, cluster).map_err(io("read index"))?;
        if replayed.torn || replayed.bad > 0 || replayed.discarded || replayed.removed > 0 {
            tracing::warn!(
                dir = %cfg.dir.display(),
                torn = replayed.torn,
                bad = replayed.bad,
                discarded = replayed.discarded,
                removed = replayed.removed,
                "SSD cache: index replayed with damage dropped (or written for another size or cluster)"
            );
        }
        let (size, used) = index.space();
        tracing::info!(dir = %cfg.dir.display(), size, extents = index.extents, used, "SSD cache open");
        let clock = index.clock();
        let inner = Arc::new(Inner {
            clock,
            dir: cfg.dir.clone(),
            index: Mutex::new(index),
            counters: Counters::default(),
            buffers: Arc::default(),
            queued_bytes: AtomicU64::new(0),
            _lock: lock,
        });
        let (tx, rx) = sync_channel(FILL_QUEUE_JOBS);
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name("braid-cache-fill".into())
            .spawn(move || fill_loop(&worker, rx))
            .map_err(io("start the fill thread"))?;
        Ok(Cache { filler: Arc::new(Filler { tx: Some(tx), thread: Some(thread) }), inner })
    }

    /// A handle of file `key` was opened at data `version`: bytes of an older version go.
    pub fn opened(&self, key: Key, version: u64) {
        let c = self.inner.index.lock().expect("cache index").opened(key, version);
        self.inner.counters.changed(c);
    }

    /// Bytes `[off, off + len)` of the file as of `version`, if the cache holds them
    /// all and they check. `None` counts as a miss: read them elsewhere. For a caller
    /// that waits: a long read is split in parts read in parallel.
    pub fn read(&self, key: Key, version: u64, off: u64, len: u64) -> Option<Bytes> {
        self.read_pieces(key, version, off, len, true)
    }

    /// As [`Cache::read`], for a prefetcher that has other reads in flight: one disk
    /// request per cached extent, one after the other, on the calling thread.
    pub fn read_ahead(&self, key: Key, version: u64, off: u64, len: u64) -> Option<Bytes> {
        self.read_pieces(key, version, off, len, false)
    }

    fn read_pieces(&self, key: Key, version: u64, off: u64, len: u64, split: bool) -> Option<Bytes> {
        let c = &self.inner.counters;
        let found = self.inner.index.lock().expect("cache index").lookup(key, version, off, len);
        let Some(found) = found else {
            c.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        match self.inner.read_found(&found, off, len, split) {
            Ok(answer) => {
                c.hits.fetch_add(1, Ordering::Relaxed);
                c.hit_bytes.fetch_add(len, Ordering::Relaxed);
                if found.pieces.iter().any(|p| !p.verified) {
                    self.check_rest(key, &found, off, len);
                }
                Some(answer)
            }
            Err(i) => {
                // Damaged, or evicted and punched since the lookup: only the first is news.
                let p = &found.pieces[i];
                if self.inner.index.lock().expect("cache index").drop_damaged(key, p.off, p.id) {
                    c.damaged.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        dir = %self.inner.dir.display(),
                        at = p.off,
                        "SSD cache: cached bytes failed their checksum; dropped, read from the OSTs"
                    );
                }
                c.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// After a read served from extents not yet checked by this process (replayed at
    /// start): they count as checked once each of their pages was, so the parts the
    /// read did not cover are read and checked now (once per extent, at most 1 MiB).
    fn check_rest(&self, key: Key, found: &Found, off: u64, len: u64) {
        let (from, to) = (off / PAGE * PAGE, (off + len).div_ceil(PAGE) * PAGE);
        let mut ok = Vec::new();
        for p in found.pieces.iter().filter(|p| !p.verified) {
            let whole = p.off >= from && p.off + p.len <= to;
            let one = Found { pieces: vec![p.clone()], fds: found.fds.clone() };
            if whole || self.inner.read_found(&one, p.off, p.len, false).is_ok() {
                ok.push(p.id);
            }
        }
        if !ok.is_empty() {
            self.inner.index.lock().expect("cache index").checked(key, &ok);
        }
    }

    /// File `key` as a backing file for a passthrough open, if the cache holds all
    /// `size` bytes of it at `version`, each checked since this client opened the cache
    /// and unchanged since. The cache keeps it whole until the [`Backing`] goes: a change
    /// of the file through this client makes the cache let go of it (the holder keeps
    /// its bytes, and applies the change itself; see [`Backing::file`]).
    pub fn backing(&self, key: Key, version: u64, size: u64) -> Result<Backing, Refused> {
        let mut idx = self.inner.index.lock().expect("cache index");
        let (path, gen) = idx.backing(key, version, size)?;
        let files = OpenOptions::new().read(true).write(true).open(&path).and_then(|f| {
            if f.metadata()?.len() != size {
                // Past the end: extents evicted since (punches keep the size).
                f.set_len(size)?;
            }
            let reader = File::open(&path)?;
            Ok((f, reader))
        });
        match files {
            Ok((file, reader)) => {
                idx.stamp(key, gen, store::stamp_of_file(&file));
                drop(idx);
                self.inner.counters.backings.fetch_add(1, Ordering::Relaxed);
                Ok(Backing { cache: self.clone(), key, gen, file, reader })
            }
            Err(e) => {
                idx.unpin(key, gen);
                tracing::warn!(path = %path.display(), "SSD cache: opening a cache file as a backing file failed: {e}");
                Err(Refused::Changed)
            }
        }
    }

    /// Taken before a read looks anywhere (before it waits for this client's writes of
    /// its range to land): hand it to [`Cache::fill`] with the bytes the read got
    /// elsewhere. Any change of the file through [`Cache::invalidate`] after it refuses
    /// that fill. Takes no lock.
    pub fn ticket(&self, key: Key, version: u64) -> Ticket {
        Ticket::new(key, version, &self.inner.clock)
    }

    /// Queues the bytes of a read that missed for writing into the cache, unless the
    /// queue is full.
    pub fn fill(&self, ticket: Ticket, off: u64, data: Bytes) {
        let len = data.len() as u64;
        if len == 0 {
            return;
        }
        let c = &self.inner.counters;
        if self.inner.queued_bytes.fetch_add(len, Ordering::AcqRel) + len > FILL_QUEUE_BYTES {
            self.inner.queued_bytes.fetch_sub(len, Ordering::AcqRel);
            c.fills_skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(tx) = self.filler.tx.as_ref() else { return };
        match tx.try_send(Job::Fill { ticket, off, data }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.inner.queued_bytes.fetch_sub(len, Ordering::AcqRel);
                c.fills_skipped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// This client changed `[off, off + len)` of the file (a write, truncate or punch).
    pub fn invalidate(&self, key: Key, off: u64, len: u64) {
        let c = self.inner.index.lock().expect("cache index").invalidate(key, off, len);
        self.inner.counters.changed(c);
    }

    /// Empties the cache (`braid cache drop`).
    pub fn clear(&self) -> std::io::Result<()> {
        let n = self.inner.index.lock().expect("cache index").clear()?;
        self.inner.counters.invalidations.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Waits until every fill queued so far is written (or dropped).
    pub fn settle(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.filler.send(Job::Settle(tx)) {
            let _ = rx.recv();
        }
    }

    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        let (size, used, extents) = {
            let idx = self.inner.index.lock().expect("cache index");
            let (size, used) = idx.space();
            (size, used, idx.extents)
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            dir: self.inner.dir.display().to_string(),
            size,
            used,
            extents,
            hits: get(&c.hits),
            hit_bytes: get(&c.hit_bytes),
            misses: get(&c.misses),
            fills: get(&c.fills),
            fill_bytes: get(&c.fill_bytes),
            fills_skipped: get(&c.fills_skipped),
            fill_errors: get(&c.fill_errors),
            evictions: get(&c.evictions),
            invalidations: get(&c.invalidations),
            damaged: get(&c.damaged),
            backings: get(&c.backings),
        }
    }
}

/// A file the cache holds whole, handed out as the backing file of a passthrough open.
/// The cache keeps the file's bytes as they are while it lives.
pub struct Backing {
    cache: Cache,
    key: Key,
    gen: u64,
    /// The cache file, open for reading and writing: a change of the braid file through
    /// this client while it is held (a truncate) is applied to it too, so that the
    /// reads the kernel passes through see it (the cache itself has let go of the file
    /// by then).
    pub file: File,
    /// The same file opened read-only: what the kernel is given. A shared writable
    /// mapping through a passthrough handle then fails (`EACCES`) instead of writing to
    /// the cache file alone.
    pub reader: File,
}

impl Drop for Backing {
    fn drop(&mut self) {
        self.cache.inner.index.lock().expect("cache index").unpin(self.key, self.gen);
    }
}

/// Bytes a cached read of more than this is split into, read and checked in parallel:
/// the disk serves several requests at once, and the checksums of one part are
/// computed while others are still being read.
const READ_PART: u64 = 256 << 10;

impl Inner {
    /// Reads the pages holding `[off, off + len)` from the cache file into one
    /// page-aligned buffer, checks every page of the extents they hold, and answers the
    /// bytes asked for with no copy; or names the piece that did not check. `split` cuts
    /// a long read into parts read in parallel.
    fn read_found(&self, found: &Found, off: u64, len: u64, split: bool) -> Result<Bytes, usize> {
        let from = off / PAGE * PAGE;
        let to = (off + len).div_ceil(PAGE) * PAGE;
        let mut buf = self.buffers.take((to - from) as usize);
        let parts: Vec<(u64, u64)> = if split {
            (from..to).step_by(READ_PART as usize).map(|a| (a, (a + READ_PART).min(to))).collect()
        } else {
            vec![(from, to)]
        };
        if !read_parts(&found.fds, buf.as_mut_slice(), from, &parts) {
            return Err(0);
        }
        let bytes = buf.as_mut_slice();
        for (i, p) in found.pieces.iter().enumerate() {
            let first = (p.off / PAGE).max(from / PAGE);
            let last = (p.off + p.len).div_ceil(PAGE).min(to / PAGE);
            for page in first..last {
                let a = (page * PAGE).max(p.off);
                let b = ((page + 1) * PAGE).min(p.off + p.len);
                let crc = p.crcs[(page - p.off / PAGE) as usize];
                if crc32c::crc32c(&bytes[(a - from) as usize..(b - from) as usize]) != crc {
                    return Err(i);
                }
            }
        }
        let skip = (off - from) as usize;
        Ok(Bytes::from_owner(buf).slice(skip..skip + len as usize))
    }
}

/// Reads `parts` (file ranges, in order, together `[from, ...)`) of a cache file into
/// `buf`, in parallel if more than one. Past the file's end reads as zeros (a checksum
/// then tells). False if a read failed.
fn read_parts(fds: &Fds, buf: &mut [u8], from: u64, parts: &[(u64, u64)]) -> bool {
    let file = fds.direct.as_ref().unwrap_or(&fds.plain);
    if parts.len() == 1 {
        return read_full(file, buf, from).is_ok();
    }
    let mut slices = Vec::with_capacity(parts.len());
    let mut rest = buf;
    for &(a, b) in parts {
        let (mine, tail) = std::mem::take(&mut rest).split_at_mut((b - a) as usize);
        slices.push((a, mine));
        rest = tail;
    }
    std::thread::scope(|s| {
        let mut slices = slices.into_iter();
        let (a0, first) = slices.next().expect("parts");
        let others: Vec<_> = slices.map(|(a, dest)| s.spawn(move || read_full(file, dest, a).is_ok())).collect();
        // The first part on this thread, while the others are read.
        let mut ok = read_full(file, first, a0).is_ok();
        for h in others {
            ok &= h.join().unwrap_or(false);
        }
        ok
    })
}

/// Fills `buf` from `file` at `off`; what lies past the end of the file reads as zeros.
fn read_full(file: &File, buf: &mut [u8], off: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                return Ok(());
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fills taken from the queue at once: their blocks are reserved under one lock of
/// the index and filed under one more, and their index changes go to the log in one
/// write.
const FILL_BATCH: usize = 64;
/// A batch of small fills waits this long for company: a random reader's 4 KiB misses
/// would otherwise each cost the index two locks and the log a write.
const FILL_GATHER: std::time::Duration = std::time::Duration::from_millis(2);
/// Fills of at least this many bytes go without waiting for others.
const FILL_ALONE_BYTES: u64 = 256 << 10;

struct Pending {
    ticket: Ticket,
    off: u64,
    data: Bytes,
    reserved: Reserved,
    fds: Arc<Fds>,
}

fn fill_loop(inner: &Inner, rx: Receiver<Job>) {
    // Off the application's path, at the normal priority: the thread holds the index's
    // lock for moments, and a thread of lower priority (tried: SCHED_IDLE) holding it
    // would stall the readers and writers waiting for it on a busy machine. When it
    // cannot keep up, the queue fills and fills are skipped, never waited for.
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        let deadline = std::time::Instant::now() + FILL_GATHER;
        while jobs.len() < FILL_BATCH {
            let small = matches!(jobs.last(), Some(Job::Fill { data, .. }) if (data.len() as u64) < FILL_ALONE_BYTES);
            let next = if small {
                rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())).ok()
            } else {
                rx.try_recv().ok()
            };
            match next {
                Some(j) => jobs.push(j),
                None => break,
            }
        }
        let mut settled = Vec::new();
        let mut fills = Vec::new();
        for job in jobs {
            match job {
                Job::Settle(done) => settled.push(done),
                Job::Fill { ticket, off, data } => fills.push((ticket, off, data)),
            }
        }
        fill_batch(inner, fills);
        for done in settled {
            let _ = done.send(());
        }
    }
}

/// Punches what was dropped, then reserves, writes and files a batch of fills.
fn fill_batch(inner: &Inner, fills: Vec<(Ticket, u64, Bytes)>) {
    let c = &inner.counters;
    let mut pending = Vec::with_capacity(fills.len());
    let dead;
    {
        let mut idx = inner.index.lock().expect("cache index");
        idx.hold_log();
        // Pages dropped since the last batch go before this batch writes anything: a
        // fill may be about to write the same pages.
        dead = idx.take_dead();
        for (ticket, off, data) in fills {
            inner.queued_bytes.fetch_sub(data.len() as u64, Ordering::AcqRel);
            let mut changed = Changed::default();
            let reserved = idx.reserve(&ticket, off, data.len() as u64, &mut changed);
            c.changed(changed);
            let Some(reserved) = reserved else {
                c.fills_skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            match idx.fds_for_fill(ticket.key, reserved.gen) {
                Some(fds) => pending.push(Pending { ticket, off, data, reserved, fds }),
                None => {
                    idx.abandon(ticket.key, reserved, off, data.len() as u64);
                    idx.unbusy(ticket.key, reserved.gen);
                    c.fill_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    // The disk work, with no lock held: only this thread writes cache files.
    let mut touched: Vec<(Key, u64, Arc<Fds>)> = Vec::new();
    for (key, gen, fds, off, len) in dead {
        if let Err(e) = store::punch(&fds.plain, off, len) {
            tracing::debug!(dir = %inner.dir.display(), "SSD cache: punching dropped bytes failed: {e}");
        }
        touched.push((key, gen, fds));
    }
    let mut written = Vec::with_capacity(pending.len());
    let mut bounce = Vec::new();
    for p in pending {
        let crcs = index::page_crcs(p.off, &p.data);
        let r = write_range(&p.fds, p.off, &p.data, &mut bounce);
        touched.push((p.ticket.key, p.reserved.gen, p.fds.clone()));
        written.push((p, crcs, r.err()));
    }
    let stamps: Vec<(Key, u64, Option<Stamp>)> =
        touched.iter().map(|(k, g, f)| (*k, *g, store::stamp_of_file(&f.plain))).collect();
    let mut idx = inner.index.lock().expect("cache index");
    for (p, crcs, failed) in written {
        let len = p.data.len() as u64;
        if let Some(e) = failed {
            idx.abandon(p.ticket.key, p.reserved, p.off, len);
            // The first failure and every 1000th after it, not one line per read.
            if c.fill_errors.fetch_add(1, Ordering::Relaxed).is_multiple_of(1000) {
                tracing::warn!(dir = %inner.dir.display(), "SSD cache: writing cached bytes failed (the disk may be full): {e}");
            }
            continue;
        }
        if idx.commit(&p.ticket, p.reserved, p.off, len, crcs) {
            c.fills.fetch_add(1, Ordering::Relaxed);
            c.fill_bytes.fetch_add(len, Ordering::Relaxed);
        } else {
            c.fills_skipped.fetch_add(1, Ordering::Relaxed);
        }
    }
    for (key, gen, stamp) in stamps {
        idx.stamp(key, gen, stamp);
    }
    idx.release_log();
}

/// Writes `data` at `off` of a cache file: the whole pages `O_DIRECT` through a
/// page-aligned copy, a partial page at either end buffered (a direct write would
/// overwrite the rest of its page), all buffered where the file system has no direct
/// I/O.
fn write_range(fds: &Fds, off: u64, data: &[u8], bounce: &mut Vec<u8>) -> std::io::Result<()> {
    let end = off + data.len() as u64;
    let (a, b) = (off.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
    let Some(direct) = fds.direct.as_ref().filter(|_| a < b) else { return fds.plain.write_all_at(data, off) };
    if off < a {
        fds.plain.write_all_at(&data[..(a - off) as usize], off)?;
    }
    let whole = &data[(a - off) as usize..(b - off) as usize];
    bounce.clear();
    bounce.resize(whole.len() + PAGE as usize, 0);
    let at = bounce.as_ptr().align_offset(PAGE as usize);
    let buf = &mut bounce[at..at + whole.len()];
    buf.copy_from_slice(whole);
    direct.write_all_at(buf, a)?;
    if b < end {
        fds.plain.write_all_at(&data[(b - off) as usize..], b)?;
    }
    Ok(())
}

/// Parses a size with an optional K, M, G or T suffix (powers of 1024), as `20G`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return None,
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}
