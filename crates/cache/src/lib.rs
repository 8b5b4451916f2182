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
pub mod mem;
mod readbuf;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use serde::Serialize;

use buddy::{Block, PAGE};
use index::{Changed, Index};
pub use index::{Key, Ticket};

/// Bytes of read data waiting to be written to the cache, at most; fills past it are
/// skipped (the next read of those bytes fills them).
pub const FILL_QUEUE_BYTES: u64 = 64 << 20;
/// Fills waiting, at most.
const FILL_QUEUE_JOBS: usize = 256;
/// How long an open waits for another client to let go of the directory.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
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
    /// The data file opened `O_DIRECT`, where the file system allows: a cached extent is
    /// read from the disk in one request of its size, not through the host's page
    /// cache and its read-ahead (which would also keep a second copy of bytes the
    /// mount's own page cache holds), and written the same way (no dirty pages for the
    /// kernel's writeback to spend the application's CPU on).
    direct: Option<File>,
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
        let data = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(cfg.dir.join("data"))
            .map_err(io("open data"))?;
        let direct = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(cfg.dir.join("data")).ok()
        };
        let (index, replayed) = Index::open(&cfg.dir, cfg.size, cluster).map_err(io("read index"))?;
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
                "SSD cache: index replayed with damage dropped (or written for another size or cluster)"
            );
        }
        tracing::info!(
            dir = %cfg.dir.display(),
            size = index.buddy.capacity(),
            extents = index.extents,
            used = index.buddy.used(),
            "SSD cache open"
        );
        let clock = index.clock();
        let inner = Arc::new(Inner {
            clock,
            dir: cfg.dir.clone(),
            data,
            direct,
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
        let pieces = self.inner.index.lock().expect("cache index").lookup(key, version, off, len);
        let Some(pieces) = pieces else {
            c.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let answer = match self.inner.read_joined(&pieces, split) {
            Joined::Read(answer) => Ok(answer),
            Joined::Damaged(i) => Err(i),
            Joined::Apart => {
                // Extents that do not meet at page boundaries: each read on its own
                // and the answer copied together.
                let mut out = BytesMut::with_capacity(len as usize);
                let mut failed = None;
                for (i, p) in pieces.iter().enumerate() {
                    match self.inner.read_joined(std::slice::from_ref(p), split) {
                        Joined::Read(part) => out.extend_from_slice(&part),
                        _ => {
                            failed = Some(i);
                            break;
                        }
                    }
                }
                failed.map_or(Ok(out.freeze()), Err)
            }
        };
        match answer {
            Ok(answer) => {
                c.hits.fetch_add(1, Ordering::Relaxed);
                c.hit_bytes.fetch_add(len, Ordering::Relaxed);
                Some(answer)
            }
            Err(i) => {
                // Damaged, or evicted and reused since the lookup: only the first is news.
                let p = &pieces[i];
                if self.inner.index.lock().expect("cache index").drop_damaged(key, p.file_off, p.block) {
                    c.damaged.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        dir = %self.inner.dir.display(),
                        at = p.data_off,
                        "SSD cache: cached bytes failed their checksum; dropped, read from the OSTs"
                    );
                }
                c.misses.fetch_add(1, Ordering::Relaxed);
                None
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
}

/// Pages a cached read of more than this is split into, read and checked in parallel:
/// the disk serves several requests at once, and the checksums of one part are
/// computed while others are still being read.
const READ_PART: u64 = 256 << 10;

/// What [`Inner::read_joined`] made of a list of pieces.
enum Joined {
    /// The answer, in one buffer.
    Read(Bytes),
    /// Piece `i` could not be read or did not check.
    Damaged(usize),
    /// The pieces do not meet at page boundaries: read them one by one.
    Apart,
}

/// One disk request of a cached read: `bytes` at `off` of the data file, into the
/// answer's buffer from `dest`, checked against `crcs` (one per page).
struct Part<'a> {
    piece: usize,
    dest: usize,
    off: u64,
    bytes: u64,
    crcs: &'a [u32],
}

impl Inner {
    /// Reads the pieces of a lookup into one page-aligned buffer, each piece's pages
    /// right after the previous one's, and answers the bytes asked for, with no copy.
    /// `split` cuts long pieces into parts read in parallel.
    fn read_joined(&self, pieces: &[index::Piece], split: bool) -> Joined {
        let last = pieces.len() - 1;
        let meet = pieces.iter().enumerate().all(|(i, p)| {
            (i == 0 || p.skip == 0) && (i == last || (p.bytes % PAGE == 0 && p.skip + p.take == p.bytes as usize))
        });
        if !meet {
            return Joined::Apart;
        }
        let mut parts = Vec::new();
        let mut dest = 0usize;
        for (i, p) in pieces.iter().enumerate() {
            let whole = p.bytes.div_ceil(PAGE) * PAGE;
            let step = if split { READ_PART } else { whole };
            let mut at = 0;
            while at < whole {
                let n = step.min(whole - at);
                let first_page = (at / PAGE) as usize;
                parts.push(Part {
                    piece: i,
                    dest: dest + at as usize,
                    off: p.data_off + at,
                    bytes: n.min(p.bytes - at),
                    crcs: &p.crcs[first_page..],
                });
                at += n;
            }
            dest += whole as usize;
        }
        let mut buf = self.buffers.take(dest);
        let failed = self.read_parts(buf.as_mut_slice(), &parts);
        if let Some(i) = failed {
            return Joined::Damaged(i);
        }
        let skip = pieces[0].skip;
        let len: usize = pieces.iter().map(|p| p.take).sum();
        Joined::Read(Bytes::from_owner(buf).slice(skip..skip + len))
    }

    /// Reads and checks `parts` (in order of `dest`, apart) into `buf`, in parallel if
    /// more than one; returns the piece of a part that failed.
    fn read_parts(&self, buf: &mut [u8], parts: &[Part]) -> Option<usize> {
        let mut slices = Vec::with_capacity(parts.len());
        let mut rest = buf;
        let mut at = 0;
        for p in parts {
            let whole = (p.bytes.div_ceil(PAGE) * PAGE) as usize;
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(p.dest - at);
            let (mine, tail) = tail.split_at_mut(whole);
            slices.push((p, mine));
            rest = tail;
            at = p.dest + whole;
        }
        if slices.len() == 1 {
            let (p, dest) = slices.pop().expect("one part");
            return (!self.read_part(dest, p)).then_some(p.piece);
        }
        std::thread::scope(|s| {
            let mut slices = slices.into_iter();
            let (first, first_dest) = slices.next().expect("parts");
            let others: Vec<_> = slices.map(|(p, dest)| s.spawn(move || (p.piece, self.read_part(dest, p)))).collect();
            // The first part on this thread, while the others are read.
            let mut failed = (!self.read_part(first_dest, first)).then_some(first.piece);
            for h in others {
                match h.join() {
                    Ok((_, true)) => {}
                    Ok((piece, false)) => failed = failed.or(Some(piece)),
                    Err(_) => failed = failed.or(Some(first.piece)),
                }
            }
            failed
        })
    }

    /// Reads one part into `dest` (its whole pages) and checks it.
    fn read_part(&self, dest: &mut [u8], p: &Part) -> bool {
        let len = p.bytes as usize;
        let read = match &self.direct {
            Some(d) => d.read_exact_at(dest, p.off).is_ok(),
            None => self.data.read_exact_at(&mut dest[..len], p.off).is_ok(),
        };
        read && dest[..len].chunks(PAGE as usize).zip(p.crcs).all(|(page, &crc)| crc32c::crc32c(page) == crc)
    }
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
    blocks: Vec<Block>,
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

/// Reserves, writes and files a batch of fills.
fn fill_batch(inner: &Inner, fills: Vec<(Ticket, u64, Bytes)>) {
    let c = &inner.counters;
    let mut pending = Vec::with_capacity(fills.len());
    {
        let mut idx = inner.index.lock().expect("cache index");
        idx.hold_log();
        for (ticket, off, data) in fills {
            let mut changed = Changed::default();
            let blocks = idx.reserve(&ticket, data.len() as u64, &mut changed);
            c.changed(changed);
            inner.queued_bytes.fetch_sub(data.len() as u64, Ordering::AcqRel);
            match blocks {
                Some(blocks) => pending.push(Pending { ticket, off, data, blocks }),
                None => {
                    c.fills_skipped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    // The bytes, with no lock held.
    let mut written = Vec::with_capacity(pending.len());
    let mut bounce = Vec::new();
    for p in pending {
        let mut crcs = Vec::with_capacity(p.blocks.len());
        let mut pos = 0usize;
        let mut failed = None;
        for (piece, block) in index::split(p.data.len() as u64).into_iter().zip(&p.blocks) {
            let bytes = &p.data[pos..pos + piece as usize];
            crcs.push(bytes.chunks(PAGE as usize).map(crc32c::crc32c).collect::<Vec<u32>>());
            if let Err(e) = inner.write_block(&mut bounce, *block, bytes) {
                failed = Some(e);
                break;
            }
            pos += piece as usize;
        }
        written.push((p, crcs, failed));
    }
    let mut idx = inner.index.lock().expect("cache index");
    for (p, crcs, failed) in written {
        if let Some(e) = failed {
            idx.abandon(p.blocks);
            // The first failure and every 1000th after it, not one line per read.
            if c.fill_errors.fetch_add(1, Ordering::Relaxed).is_multiple_of(1000) {
                tracing::warn!(dir = %inner.dir.display(), "SSD cache: writing cached bytes failed (the disk may be full): {e}");
            }
            continue;
        }
        let len = p.data.len() as u64;
        if idx.commit(&p.ticket, p.off, len, p.blocks, crcs) {
            c.fills.fetch_add(1, Ordering::Relaxed);
            c.fill_bytes.fetch_add(len, Ordering::Relaxed);
        } else {
            c.fills_skipped.fetch_add(1, Ordering::Relaxed);
        }
    }
    idx.release_log();
}

impl Inner {
    /// Writes `bytes` at the start of `block`: `O_DIRECT` through a page-aligned copy
    /// padded to whole pages (the block has room), or buffered where the file system
    /// has no direct I/O.
    fn write_block(&self, bounce: &mut Vec<u8>, block: Block, bytes: &[u8]) -> std::io::Result<()> {
        let Some(direct) = &self.direct else { return self.data.write_all_at(bytes, block.offset()) };
        let whole = (bytes.len() as u64).div_ceil(PAGE) * PAGE;
        bounce.clear();
        bounce.resize((whole + PAGE) as usize, 0);
        let at = bounce.as_ptr().align_offset(PAGE as usize);
        let buf = &mut bounce[at..at + whole as usize];
        buf[..bytes.len()].copy_from_slice(bytes);
        direct.write_all_at(buf, block.offset())
    }
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
