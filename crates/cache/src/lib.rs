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
//! - **Space.** One data file of the configured size, handed out by a buddy allocator
//!   ([`buddy`]); the least recently used extents are evicted to make room, and the
//!   cache never passes its size.
//! - **Persistence.** The index is a checksummed log ([`index`]) replayed at start;
//!   every page of cached data has its checksum, checked on every read: a torn or
//!   changed page is dropped and read from the OSTs, never served.
//!
//! Any failure of the cache directory (missing, read-only, full, held by another
//! client) leaves the client working without it; what happened goes to the log.

pub mod buddy;
pub mod index;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use serde::Serialize;

use buddy::{Block, PAGE};
pub use index::Key;
use index::{Changed, Index, Ticket};

/// Bytes of read data waiting to be written to the cache, at most; fills past it are
/// skipped (the next read of those bytes fills them).
pub const FILL_QUEUE_BYTES: u64 = 64 << 20;
/// Fills waiting, at most.
const FILL_QUEUE_JOBS: usize = 256;
/// The smallest cache worth having: one top-order block.
pub const MIN_SIZE: u64 = PAGE << buddy::MAX_ORDER;

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
}

impl Stats {
    /// Hits over all reads that asked the cache, in percent.
    pub fn hit_rate(&self) -> f64 {
        let all = self.hits + self.misses;
        if all == 0 {
            0.0
        } else {
            100.0 * self.hits as f64 / all as f64
        }
    }
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
}

impl Counters {
    fn changed(&self, c: Changed) {
        self.evictions.fetch_add(c.evicted, Ordering::Relaxed);
        self.invalidations.fetch_add(c.invalidated, Ordering::Relaxed);
    }
}

struct Inner {
    dir: PathBuf,
    data: File,
    /// The data file opened `O_DIRECT` for reads, where the file system allows: a
    /// cached extent is read from the disk in one request of its size, not through
    /// the host's page cache and its read-ahead (which would also keep a second copy
    /// of bytes the mount's own page cache holds).
    direct: Option<File>,
    index: Mutex<Index>,
    counters: Counters,
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
    /// Opens (or creates) the cache in `cfg.dir`, replaying its index.
    pub fn open(cfg: &CacheConfig) -> Result<Cache, CacheError> {
        let io = |what: &'static str| {
            let dir = cfg.dir.clone();
            move |source| CacheError::Io { dir, what, source }
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
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(CacheError::Busy(cfg.dir.clone()));
        }
        let data = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(cfg.dir.join("data"))
            .map_err(io("open data"))?;
        let direct = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(cfg.dir.join("data")).ok()
        };
        let (index, replayed) = Index::open(&cfg.dir, cfg.size).map_err(io("read index"))?;
        if data.metadata().map_err(io("stat data"))?.len() != index.buddy.capacity() {
            // Sparse: space is taken as extents are written.
            data.set_len(index.buddy.capacity()).map_err(io("size data"))?;
        }
        if replayed.torn || replayed.bad > 0 || replayed.discarded {
            tracing::warn!(
                dir = %cfg.dir.display(),
                torn = replayed.torn,
                bad = replayed.bad,
                discarded = replayed.discarded,
                "SSD cache: index replayed with damage dropped"
            );
        }
        tracing::info!(
            dir = %cfg.dir.display(),
            size = index.buddy.capacity(),
            extents = index.extents,
            used = index.buddy.used(),
            "SSD cache open"
        );
        let inner = Arc::new(Inner {
            dir: cfg.dir.clone(),
            data,
            direct,
            index: Mutex::new(index),
            counters: Counters::default(),
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
    /// all and they check. `None` counts as a miss: read them elsewhere.
    pub fn read(&self, key: Key, version: u64, off: u64, len: u64) -> Option<Bytes> {
        let c = &self.inner.counters;
        let pieces = self.inner.index.lock().expect("cache index").lookup(key, version, off, len);
        let Some(pieces) = pieces else {
            c.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let one = pieces.len() == 1;
        let mut out = BytesMut::new();
        let mut only = None;
        for p in pieces {
            let mut raw = Vec::new();
            let Some(at) = self.inner.read_checked(&mut raw, p.data_off, p.bytes, &p.crcs) else {
                // Damaged, or evicted and reused since the lookup: only the first is news.
                if self.inner.index.lock().expect("cache index").drop_damaged(key, p.file_off, p.block) {
                    c.damaged.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        dir = %self.inner.dir.display(),
                        at = p.data_off,
                        "SSD cache: cached bytes failed their checksum; dropped, read from the OSTs"
                    );
                }
                c.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            let (from, to) = (at + p.skip, at + p.skip + p.take);
            if one {
                // The buffer read into becomes the answer: no copy.
                only = Some(Bytes::from(raw).slice(from..to));
            } else {
                out.extend_from_slice(&raw[from..to]);
            }
        }
        c.hits.fetch_add(1, Ordering::Relaxed);
        c.hit_bytes.fetch_add(len, Ordering::Relaxed);
        Some(only.unwrap_or_else(|| out.freeze()))
    }

    /// Taken before a read that missed goes to the OSTs; hand it to [`Cache::fill`]
    /// with the bytes read.
    pub fn ticket(&self, key: Key, version: u64) -> Ticket {
        self.inner.index.lock().expect("cache index").ticket(key, version)
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
            (idx.buddy.capacity(), idx.buddy.used(), idx.extents)
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
        }
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }
}

/// Pages a cached read of more than this is split into, read and checked in parallel:
/// the disk serves several requests at once, and the checksums of one part are
/// computed while others are still being read.
const READ_PART: u64 = 256 << 10;

impl Inner {
    /// Reads `bytes` of the data file at `off` (page aligned) into a page-aligned part
    /// of `raw` and checks them against `crcs` (one per page); returns where in `raw`
    /// they start, or `None` if the read failed, came short or did not check.
    fn read_checked(&self, raw: &mut Vec<u8>, off: u64, bytes: u64, crcs: &[u32]) -> Option<usize> {
        let whole = bytes.div_ceil(PAGE) * PAGE;
        raw.resize((whole + PAGE) as usize, 0);
        let at = raw.as_ptr().align_offset(PAGE as usize);
        let buf = &mut raw[at..at + whole as usize];
        let part = |buf: &mut [u8], first_page: usize| -> bool {
            let len = (buf.len() as u64).min(bytes - first_page as u64 * PAGE) as usize;
            let read = match &self.direct {
                Some(d) => d.read_exact_at(buf, off + first_page as u64 * PAGE).is_ok(),
                None => self.data.read_exact_at(&mut buf[..len], off + first_page as u64 * PAGE).is_ok(),
            };
            read && buf[..len].chunks(PAGE as usize).zip(&crcs[first_page..]).all(|(p, &crc)| crc32c::crc32c(p) == crc)
        };
        let ok = if whole <= READ_PART {
            part(buf, 0)
        } else {
            std::thread::scope(|s| {
                let parts: Vec<_> = buf
                    .chunks_mut(READ_PART as usize)
                    .enumerate()
                    .map(|(i, chunk)| s.spawn(move || part(chunk, i * (READ_PART / PAGE) as usize)))
                    .collect();
                parts.into_iter().all(|h| h.join().unwrap_or(false))
            })
        };
        ok.then_some(at)
    }
}

fn fill_loop(inner: &Inner, rx: Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        match job {
            Job::Settle(done) => {
                let _ = done.send(());
            }
            Job::Fill { ticket, off, data } => {
                fill_one(inner, &ticket, off, &data);
                inner.queued_bytes.fetch_sub(data.len() as u64, Ordering::AcqRel);
            }
        }
    }
}

fn fill_one(inner: &Inner, ticket: &Ticket, off: u64, data: &[u8]) {
    let c = &inner.counters;
    let len = data.len() as u64;
    let mut changed = Changed::default();
    let blocks = inner.index.lock().expect("cache index").reserve(ticket, len, &mut changed);
    c.changed(changed);
    let Some(blocks) = blocks else {
        c.fills_skipped.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let mut crcs = Vec::with_capacity(blocks.len());
    let mut pos = 0usize;
    let mut failed = None;
    for (piece, block) in index::split(len).into_iter().zip(&blocks) {
        let bytes = &data[pos..pos + piece as usize];
        crcs.push(bytes.chunks(PAGE as usize).map(crc32c::crc32c).collect::<Vec<u32>>());
        if let Err(e) = write_block(&inner.data, *block, bytes) {
            failed = Some(e);
            break;
        }
        pos += piece as usize;
    }
    let mut idx = inner.index.lock().expect("cache index");
    if let Some(e) = failed {
        idx.abandon(blocks);
        drop(idx);
        // The first failure and every 1000th after it, not one line per read.
        if c.fill_errors.fetch_add(1, Ordering::Relaxed).is_multiple_of(1000) {
            tracing::warn!(dir = %inner.dir.display(), "SSD cache: writing cached bytes failed (the disk may be full): {e}");
        }
        return;
    }
    if idx.commit(ticket, off, len, blocks, crcs) {
        c.fills.fetch_add(1, Ordering::Relaxed);
        c.fill_bytes.fetch_add(len, Ordering::Relaxed);
    } else {
        c.fills_skipped.fetch_add(1, Ordering::Relaxed);
    }
}

fn write_block(data: &File, block: Block, bytes: &[u8]) -> std::io::Result<()> {
    data.write_all_at(bytes, block.offset())
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
