//! The shared-memory ring between a client and its collector (seed 001's shared
//! memory between the PVFS client and its logging process).
//!
//! Why a ring in a mapped file: the I/O path must only write its record and move on.
//! A writer (any thread of the mount) reserves a slot with one compare-and-swap,
//! copies 64 bytes and stamps the slot; nothing waits, nothing is formatted, no
//! system call is made. When the collector has fallen a whole ring behind, the record
//! is dropped and counted, never waited for. The collector is another process: it
//! maps the same file, copies stamped slots out and moves its read position on; if it
//! dies the writer never notices, and the next collector goes on from its position.
//!
//! Layout of the file (all little-endian, the ring's counters on cache lines of their
//! own):
//!
//! ```text
//! 0      header: magic, version, record size, capacity, job table size, client name
//! 128    write_seq   (next slot a writer reserves)
//! 192    read_seq    (next slot the collector copies)
//! 256    dropped     (records dropped because the ring was full)
//! 320    enabled, writer pid, jobs used
//! 4096   job table:  JOBS slots of 64 bytes (length byte, name)
//! ...    stamps:     capacity x u64 (slot n holds record seq s once its stamp is s+1)
//! ...    records:    capacity x 64 bytes
//! ```

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::record::{Record, NO_JOB, RECORD_BYTES};

const MAGIC: &[u8; 8] = b"BRTRACE1";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 4096;
/// Names of jobs a ring can hold; records of later jobs carry [`NO_JOB`].
pub const JOBS: usize = 256;
const JOB_BYTES: usize = 64;
/// Longest client name kept in the header.
const CLIENT_BYTES: usize = 64;
/// Records of a ring by default (4 MiB of records).
pub const DEFAULT_CAPACITY: u64 = 1 << 16;
/// A slot reserved and not stamped for this long was left by a writer that died in
/// the middle (or scribbled on): the collector skips it.
const STUCK: Duration = Duration::from_secs(1);

const OFF_CAPACITY: usize = 16;
const OFF_JOBS: usize = 24;
const OFF_CLIENT: usize = 32;
const OFF_WRITE: usize = 128;
const OFF_READ: usize = 192;
const OFF_DROPPED: usize = 256;
const OFF_ENABLED: usize = 320;
const OFF_PID: usize = 324;
const OFF_JOBS_USED: usize = 328;
/// The ring file's mode: its owner's alone.
const MODE: u32 = 0o600;

#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("trace ring {path}: {what}: {source}")]
    Io { path: PathBuf, what: &'static str, source: std::io::Error },
    #[error("trace ring {path} is not a braid trace ring, or was written over: {why}")]
    Corrupt { path: PathBuf, why: String },
    #[error("trace ring {0} already has a collector")]
    Busy(PathBuf),
    #[error("trace ring {path} refused: {why}")]
    Unsafe { path: PathBuf, why: String },
    #[error("trace ring capacity must be a power of two from 64 to 2^24 records, not {0}")]
    Capacity(u64),
}

/// A mapping of the ring file, shared with other processes.
struct Map {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access to its mutable parts goes
// through atomics or through slots a writer owns between reserving and stamping them.
unsafe impl Send for Map {}
unsafe impl Sync for Map {}

impl Map {
    fn new(file: &File, len: usize, path: &Path) -> Result<Map, RingError> {
        // SAFETY: a fresh shared mapping of `len` bytes of a file at least that long;
        // the pointer is checked before use and unmapped once in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(RingError::Io {
                path: path.to_path_buf(),
                what: "map",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Map { ptr: ptr as *mut u8, len })
    }

    fn bytes(&self, at: usize, n: usize) -> &[u8] {
        assert!(at + n <= self.len);
        // SAFETY: inside the mapping; bytes of the header written once at creation,
        // or a record slot the caller knows to be stamped.
        unsafe { std::slice::from_raw_parts(self.ptr.add(at), n) }
    }

    fn u64_at(&self, at: usize) -> &AtomicU64 {
        assert!(at & 7 == 0 && at + 8 <= self.len);
        // SAFETY: aligned (the mapping is page aligned), inside the mapping, and only
        // ever accessed atomically.
        unsafe { &*(self.ptr.add(at) as *const AtomicU64) }
    }

    fn u32_at(&self, at: usize) -> &AtomicU32 {
        assert!(at & 3 == 0 && at + 4 <= self.len);
        // SAFETY: as `u64_at`.
        unsafe { &*(self.ptr.add(at) as *const AtomicU32) }
    }

    fn write(&self, at: usize, src: &[u8]) {
        assert!(at + src.len() <= self.len);
        // SAFETY: inside the mapping, into a slot this writer reserved (or the header
        // before anyone else sees the file).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(at), src.len()) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Where the parts of a ring of `capacity` records start, and its length.
fn geometry(capacity: u64) -> (usize, usize, usize) {
    let stamps = HEADER_BYTES + JOBS * JOB_BYTES;
    let records = stamps + capacity as usize * 8;
    (stamps, records, records + capacity as usize * RECORD_BYTES)
}

/// What a ring has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingStats {
    pub capacity: u64,
    /// Records written into the ring.
    pub written: u64,
    /// Records the collector has taken.
    pub collected: u64,
    /// Records dropped because the ring was full.
    pub dropped: u64,
    pub enabled: bool,
}

struct Ring {
    map: Map,
    mask: u64,
    stamps: usize,
    records: usize,
    path: PathBuf,
}

impl Ring {
    fn stats(&self) -> RingStats {
        RingStats {
            capacity: self.mask + 1,
            written: self.map.u64_at(OFF_WRITE).load(Ordering::Acquire),
            collected: self.map.u64_at(OFF_READ).load(Ordering::Acquire),
            dropped: self.map.u64_at(OFF_DROPPED).load(Ordering::Relaxed),
            enabled: self.map.u32_at(OFF_ENABLED).load(Ordering::Relaxed) != 0,
        }
    }

    fn job_name(&self, i: u32) -> Option<String> {
        let used = self.map.u32_at(OFF_JOBS_USED).load(Ordering::Acquire) as usize;
        let i = i as usize;
        if i >= used.min(JOBS) {
            return None;
        }
        let b = self.map.bytes(HEADER_BYTES + i * JOB_BYTES, JOB_BYTES);
        let n = (b[0] as usize).min(JOB_BYTES - 1);
        Some(String::from_utf8_lossy(&b[1..1 + n]).into_owned())
    }
}

/// The client's end: writes records.
pub struct RingWriter {
    ring: Ring,
    /// Job names registered by this process (the table is append-only).
    jobs: Mutex<Vec<String>>,
}

impl RingWriter {
    /// Creates the ring file at `path` (replacing one left by an earlier process), for
    /// the client named `client`, enabled or not.
    pub fn create(path: &Path, capacity: u64, client: &str, enabled: bool) -> Result<RingWriter, RingError> {
        if !capacity.is_power_of_two() || !(64..=1 << 24).contains(&capacity) {
            return Err(RingError::Capacity(capacity));
        }
        let io = |what| {
            let path = path.to_path_buf();
            move |source| RingError::Io { path, what, source }
        };
        // A ring left by an earlier process of this pid goes. Another user's file in
        // the way stays (a sticky directory forbids removing it), and creating the
        // ring then fails: its records never go into a file someone else controls.
        if let Err(e) = std::fs::remove_file(path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(io("remove the file in the way")(e));
            }
        }
        // `create_new` is O_EXCL: a file or symlink put there since is refused, not
        // followed.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(io("create"))?;
        // The umask may only have taken bits away; this gives the owner back its own.
        file.set_permissions(std::fs::Permissions::from_mode(MODE)).map_err(io("chmod"))?;
        let (stamps, records, len) = geometry(capacity);
        file.set_len(len as u64).map_err(io("size"))?;
        let map = Map::new(&file, len, path)?;
        map.write(0, MAGIC);
        map.write(8, &VERSION.to_le_bytes());
        map.write(12, &(RECORD_BYTES as u32).to_le_bytes());
        map.write(OFF_CAPACITY, &capacity.to_le_bytes());
        map.write(OFF_JOBS, &(JOBS as u32).to_le_bytes());
        let name = client.as_bytes();
        let n = name.len().min(CLIENT_BYTES - 1);
        map.write(OFF_CLIENT, &[n as u8]);
        map.write(OFF_CLIENT + 1, &name[..n]);
        map.u32_at(OFF_PID).store(std::process::id(), Ordering::Relaxed);
        map.u32_at(OFF_ENABLED).store(enabled as u32, Ordering::Release);
        Ok(RingWriter {
            ring: Ring { map, mask: capacity - 1, stamps, records, path: path.to_path_buf() },
            jobs: Mutex::new(Vec::new()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.ring.path
    }

    pub fn enabled(&self) -> bool {
        self.ring.map.u32_at(OFF_ENABLED).load(Ordering::Relaxed) != 0
    }

    pub fn set_enabled(&self, on: bool) {
        self.ring.map.u32_at(OFF_ENABLED).store(on as u32, Ordering::Release);
    }

    pub fn stats(&self) -> RingStats {
        self.ring.stats()
    }

    /// The index of job `name` in the ring's table, adding it if new; [`NO_JOB`] once
    /// the table is full.
    pub fn job(&self, name: &str) -> u32 {
        let mut jobs = self.jobs.lock().expect("trace job table");
        if let Some(i) = jobs.iter().position(|j| j == name) {
            return i as u32;
        }
        if jobs.len() >= JOBS {
            return NO_JOB;
        }
        let i = jobs.len();
        let b = name.as_bytes();
        // Cut at a character boundary within the slot.
        let mut n = b.len().min(JOB_BYTES - 1);
        while !name.is_char_boundary(n) {
            n -= 1;
        }
        let at = HEADER_BYTES + i * JOB_BYTES;
        self.ring.map.write(at, &[n as u8]);
        self.ring.map.write(at + 1, &b[..n]);
        self.ring.map.u32_at(OFF_JOBS_USED).store(i as u32 + 1, Ordering::Release);
        jobs.push(name.to_string());
        i as u32
    }

    /// Writes `rec` into the ring, or drops it (counted) if the collector is a whole
    /// ring behind. Never blocks. Returns whether it was written.
    pub fn push(&self, rec: &Record) -> bool {
        let m = &self.ring.map;
        let write = m.u64_at(OFF_WRITE);
        let seq = loop {
            let w = write.load(Ordering::Relaxed);
            if w.wrapping_sub(m.u64_at(OFF_READ).load(Ordering::Acquire)) > self.ring.mask {
                m.u64_at(OFF_DROPPED).fetch_add(1, Ordering::Relaxed);
                return false;
            }
            if write.compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                break w;
            }
        };
        let slot = (seq & self.ring.mask) as usize;
        let mut b = [0u8; RECORD_BYTES];
        rec.encode(&mut b);
        m.write(self.ring.records + slot * RECORD_BYTES, &b);
        m.u64_at(self.ring.stamps + slot * 8).store(seq + 1, Ordering::Release);
        true
    }
}

/// Whether a ring file is one a collector of this user may trust: a regular file of
/// this user that no other may open. A ring of another user, or one opened to others,
/// was not made by this user's mount (whose rings are 0600 from the start).
fn owned_privately(meta: &std::fs::Metadata) -> Result<(), String> {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.file_type().is_file() {
        return Err("not a regular file".into());
    }
    if meta.uid() != me {
        return Err(format!("it belongs to uid {}, not to this user (uid {me})", meta.uid()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!("mode {:04o} lets other users open it (a ring is 0600)", meta.mode() & 0o7777));
    }
    Ok(())
}

/// What one [`RingReader::drain`] took.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Records appended to the caller's buffer.
    pub records: usize,
    /// Slots skipped: reserved by a writer that never stamped them (it died in the
    /// middle), or bytes that are not a record.
    pub lost: u64,
}

/// The collector's end: takes records out. One at a time per ring (a lock on the
/// file).
pub struct RingReader {
    ring: Ring,
    /// A slot found reserved and not stamped, and since when.
    waiting: Option<(u64, Instant)>,
    _lock: File,
}

impl RingReader {
    /// Opens the ring at `path` for collecting; a second collector gets
    /// [`RingError::Busy`], a file that is not a ring [`RingError::Corrupt`].
    pub fn open(path: &Path) -> Result<RingReader, RingError> {
        let io = |what| {
            let path = path.to_path_buf();
            move |source| RingError::Io { path, what, source }
        };
        let corrupt = |why: String| RingError::Corrupt { path: path.to_path_buf(), why };
        // Not through a symlink, and without waiting on a FIFO put at the path.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(io("open"))?;
        let meta = file.metadata().map_err(io("stat"))?;
        owned_privately(&meta).map_err(|why| RingError::Unsafe { path: path.to_path_buf(), why })?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(RingError::Busy(path.to_path_buf()));
        }
        let len = meta.len();
        if len < HEADER_BYTES as u64 {
            return Err(corrupt(format!("{len} bytes, shorter than a header")));
        }
        let mut head = [0u8; 32];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut head, 0).map_err(io("read header"))?;
        if &head[..8] != MAGIC {
            return Err(corrupt("bad magic".into()));
        }
        let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
        let rec = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes"));
        let capacity = u64::from_le_bytes(head[16..24].try_into().expect("8 bytes"));
        let jobs = u32::from_le_bytes(head[24..28].try_into().expect("4 bytes"));
        if version != VERSION || rec as usize != RECORD_BYTES || jobs as usize != JOBS {
            return Err(corrupt(format!("version {version}, record size {rec}, job table {jobs}")));
        }
        if !capacity.is_power_of_two() || !(64..=1 << 24).contains(&capacity) {
            return Err(corrupt(format!("capacity {capacity}")));
        }
        let (stamps, records, want) = geometry(capacity);
        if len != want as u64 {
            return Err(corrupt(format!("{len} bytes where a ring of {capacity} records has {want}")));
        }
        let map = Map::new(&file, want, path)?;
        Ok(RingReader {
            ring: Ring { map, mask: capacity - 1, stamps, records, path: path.to_path_buf() },
            waiting: None,
            _lock: file,
        })
    }

    /// The client the ring belongs to, as its writer named it.
    pub fn client(&self) -> String {
        let b = self.ring.map.bytes(OFF_CLIENT, CLIENT_BYTES);
        let n = (b[0] as usize).min(CLIENT_BYTES - 1);
        String::from_utf8_lossy(&b[1..1 + n]).into_owned()
    }

    /// The writer's process id.
    pub fn writer_pid(&self) -> u32 {
        self.ring.map.u32_at(OFF_PID).load(Ordering::Relaxed)
    }

    pub fn job_name(&self, i: u32) -> Option<String> {
        self.ring.job_name(i)
    }

    pub fn stats(&self) -> RingStats {
        self.ring.stats()
    }

    /// Moves up to `max` stamped records, in order, into `out` (64 bytes each,
    /// checked to decode), and frees their slots for writers.
    pub fn drain(&mut self, max: usize, out: &mut Vec<u8>) -> Drained {
        let m = &self.ring.map;
        let read = m.u64_at(OFF_READ);
        let mut r = read.load(Ordering::Acquire);
        let w = m.u64_at(OFF_WRITE).load(Ordering::Acquire);
        let mut d = Drained::default();
        if w < r || w - r > self.ring.mask + 1 {
            // Counters written over: start again from the writers' position.
            d.lost += w.wrapping_sub(r).min(self.ring.mask + 1);
            read.store(w, Ordering::Release);
            self.waiting = None;
            return d;
        }
        while r < w && d.records < max {
            let slot = (r & self.ring.mask) as usize;
            if m.u64_at(self.ring.stamps + slot * 8).load(Ordering::Acquire) != r + 1 {
                // Reserved, not stamped yet: a writer in the middle of its copy, or
                // one that died there.
                match self.waiting {
                    Some((seq, since)) if seq == r && since.elapsed() >= STUCK => {
                        d.lost += 1;
                        r += 1;
                        self.waiting = None;
                        continue;
                    }
                    Some((seq, _)) if seq == r => {}
                    _ => self.waiting = Some((r, Instant::now())),
                }
                break;
            }
            let b: &[u8; RECORD_BYTES] =
                m.bytes(self.ring.records + slot * RECORD_BYTES, RECORD_BYTES).try_into().expect("record size");
            if Record::decode(b).is_ok() {
                out.extend_from_slice(b);
                d.records += 1;
            } else {
                d.lost += 1;
            }
            r += 1;
        }
        read.store(r, Ordering::Release);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Op, Target};
    use proto::Fid;

    fn rec(i: u64) -> Record {
        Record {
            start_ns: 1_000 + i,
            dur_ns: 5,
            pid: 1,
            uid: 2,
            gid: 3,
            fid: Fid { seq: 9, oid: i as u32, ver: 0 },
            offset: i * 4096,
            len: 4096,
            job: NO_JOB,
            op: Op::Read,
            errno: 0,
            target: Target::Ost(1),
        }
    }

    fn path(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("braid-ring-{tag}-{}", std::process::id()))
    }

    #[test]
    fn records_go_through_in_order_a_full_ring_drops_and_counts() {
        let p = path("order");
        let w = RingWriter::create(&p, 64, "host:/mnt", true).unwrap();
        let mut r = RingReader::open(&p).unwrap();
        assert_eq!(r.client(), "host:/mnt");
        assert!(matches!(RingReader::open(&p), Err(RingError::Busy(_))), "one collector at a time");
        for i in 0..100 {
            assert_eq!(w.push(&rec(i)), i < 64, "record {i}");
        }
        assert_eq!(w.stats().dropped, 36);
        let mut out = Vec::new();
        assert_eq!(r.drain(1000, &mut out), Drained { records: 64, lost: 0 });
        for (i, b) in out.chunks(RECORD_BYTES).enumerate() {
            assert_eq!(Record::decode(b.try_into().unwrap()).unwrap(), rec(i as u64));
        }
        // Room again, and the slots come round.
        out.clear();
        for i in 100..150 {
            assert!(w.push(&rec(i)));
        }
        assert_eq!(r.drain(20, &mut out).records, 20, "at most what was asked");
        assert_eq!(r.drain(1000, &mut out).records, 30);
        let got: Vec<u64> =
            out.chunks(RECORD_BYTES).map(|b| Record::decode(b.try_into().unwrap()).unwrap().start_ns).collect();
        assert_eq!(got, (1100..1150).collect::<Vec<_>>());
        let s = r.stats();
        assert_eq!((s.written, s.collected, s.dropped), (114, 114, 36));
        drop(r);
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn writers_on_many_threads_lose_nothing_the_ring_holds() {
        let p = path("threads");
        let w = std::sync::Arc::new(RingWriter::create(&p, 1 << 12, "c", true).unwrap());
        let mut r = RingReader::open(&p).unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let w = w.clone();
                std::thread::spawn(move || (0..20_000u64).filter(|i| w.push(&rec(t * 1_000_000 + i))).count())
            })
            .collect();
        let reader = {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut out = Vec::new();
                loop {
                    let finished = done.load(Ordering::Acquire);
                    r.drain(1 << 10, &mut out);
                    if finished && r.stats().collected == r.stats().written {
                        return out;
                    }
                }
            })
        };
        let written: usize = writers.into_iter().map(|h| h.join().unwrap()).sum();
        done.store(true, Ordering::Release);
        let out = reader.join().unwrap();
        assert_eq!(out.len() / RECORD_BYTES, written);
        assert_eq!(written as u64 + w.stats().dropped, 80_000);
        // Each writer's records in its own order.
        let mut last = [None::<u64>; 4];
        for b in out.chunks(RECORD_BYTES) {
            let s = Record::decode(b.try_into().unwrap()).unwrap().start_ns - 1_000;
            let t = (s / 1_000_000) as usize;
            assert!(last[t].is_none_or(|l| l < s));
            last[t] = Some(s);
        }
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn jobs_are_named_once_and_a_scribbled_ring_is_refused_or_resynced() {
        let p = path("jobs");
        let w = RingWriter::create(&p, 64, "c", false).unwrap();
        assert!(!w.enabled());
        w.set_enabled(true);
        assert_eq!(w.job("1234"), 0);
        assert_eq!(w.job("5678"), 1);
        assert_eq!(w.job("1234"), 0);
        let long = "é".repeat(40);
        assert_eq!(w.job(&long), 2);
        let mut r = RingReader::open(&p).unwrap();
        assert_eq!(r.job_name(1).as_deref(), Some("5678"));
        assert_eq!(r.job_name(2).unwrap(), "é".repeat(31), "cut at a character boundary");
        assert_eq!(r.job_name(3), None);
        assert!(r.stats().enabled);
        // Counters written over by another process: the collector starts again.
        w.push(&rec(1));
        r.ring.map.u64_at(OFF_READ).store(1 << 40, Ordering::Release);
        let mut out = Vec::new();
        assert_eq!(r.drain(10, &mut out).records, 0);
        assert!(w.push(&rec(2)));
        assert_eq!(r.drain(10, &mut out).records, 1);
        // A record slot written over with garbage: skipped and counted, not passed on.
        w.push(&rec(3));
        let slot = (r.stats().written - 1) & 63;
        r.ring.map.write(r.ring.records + slot as usize * RECORD_BYTES + 60, &[0]);
        assert_eq!(r.drain(10, &mut out), Drained { records: 0, lost: 1 });
        drop(r);
        // Files that are not rings (private ones: a file open to others is refused
        // before it is read).
        let private = |bytes: &[u8]| {
            std::fs::write(&p, bytes).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        };
        private(b"not a ring");
        assert!(matches!(RingReader::open(&p), Err(RingError::Corrupt { .. })));
        private(&[0u8; 8192]);
        assert!(matches!(RingReader::open(&p), Err(RingError::Corrupt { .. })));
        assert!(matches!(RingWriter::create(&p, 100, "c", true), Err(RingError::Capacity(100))));
        let _ = std::fs::remove_file(&p);
    }

    /// A ring is its owner's alone whatever the umask; a symlink at its path is
    /// replaced, not followed; a collector refuses a ring through a symlink, one open
    /// to other users, and another user's.
    #[test]
    fn a_ring_is_for_its_owner_only_and_symlinks_are_not_followed() {
        let p = path("private");
        let victim = path("victim");
        std::fs::write(&victim, b"a file the symlink points at").unwrap();
        let _ = std::fs::remove_file(&p);
        std::os::unix::fs::symlink(&victim, &p).unwrap();
        // SAFETY: umask only sets this process's file creation mask; 0 would let the
        // default mode through untouched.
        let old = unsafe { libc::umask(0) };
        let w = RingWriter::create(&p, 64, "c", true);
        // SAFETY: as above, putting the mask back.
        unsafe { libc::umask(old) };
        let w = w.unwrap();
        let meta = std::fs::symlink_metadata(&p).unwrap();
        assert!(meta.file_type().is_file(), "the symlink was replaced by the ring");
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_eq!(std::fs::read(&victim).unwrap(), b"a file the symlink points at", "the victim is untouched");
        assert!(w.push(&rec(1)));
        drop(RingReader::open(&p).expect("the owner collects its ring"));

        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = RingReader::open(&p).err().expect("a ring others may read is refused");
        assert!(e.to_string().contains("mode 0644"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();

        let link = path("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(matches!(RingReader::open(&link), Err(RingError::Io { what: "open", .. })), "through a symlink");

        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
            let e = RingReader::open(&p).err().expect("another user's ring is refused");
            assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
        }
        drop(w);
        for f in [&p, &victim, &link] {
            let _ = std::fs::remove_file(f);
        }
    }
}
