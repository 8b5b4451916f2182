//! Batches of records as collectors ship them, and the collection server's store of
//! them on disk.
//!
//! A batch is what a collector took from one client's ring at once: the client's
//! name, the names of the jobs its records refer to, how many records were lost on
//! the way (ring full, or slots a dying writer left), and the records, 64 bytes each.
//! The same bytes travel as the payload of the trace RPC and are kept on disk, so a
//! stored trace costs 64 bytes an operation plus a few per batch.
//!
//! The store is a directory of segment files, `NNNNNNNN.trace`, each a header and then
//! blocks `{body length u32, crc32c u32, body}` with a batch as body. A segment that
//! reaches its size limit is closed and the next one begun; the oldest go once the
//! store passes its total limit. A torn last block (a server killed mid-append) ends
//! its segment's reading; a block whose checksum fails is skipped and counted: reading
//! a damaged store answers what is intact and says what was not.
//!
//! The records say who did what to which file, so a store is its owner's alone: its
//! directory 0700, its segments 0600. A store's parent may be shared (every
//! collector of a machine makes its own store under one trace directory); the store
//! directory itself must be a real directory of this user, never a symlink.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::record::{Record, RecordError, RECORD_BYTES};

const SEGMENT_MAGIC: &[u8; 8] = b"BRTSEG01";
const BATCH_VERSION: u8 = 1;
/// Records of one batch, at most.
pub const MAX_BATCH_RECORDS: usize = 1 << 16;
/// Longest client or job name.
const MAX_NAME: usize = 255;
/// Modes of a store's directory and of its segments: their owner's alone.
const DIR_MODE: u32 = 0o700;
const SEGMENT_MODE: u32 = 0o600;

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("trace batch ends early (at byte {0})")]
    Short(usize),
    #[error("trace batch of version {0} (this braid reads {BATCH_VERSION})")]
    Version(u8),
    #[error("trace batch has {0} records, more than {MAX_BATCH_RECORDS}")]
    TooMany(usize),
    #[error("trace batch: name is not UTF-8")]
    Name,
    #[error("trace batch has {0} bytes after its records")]
    Trailing(usize),
    #[error("trace batch record {0}: {1}")]
    Record(usize, RecordError),
}

/// Records of one client, as a collector ships them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Batch {
    pub client: String,
    /// Job names by the index records carry.
    pub jobs: Vec<(u32, String)>,
    /// Records lost before this batch since the previous one.
    pub lost: u64,
    /// `RECORD_BYTES` per record, each one that decodes.
    pub records: Vec<u8>,
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    let mut n = name.len().min(MAX_NAME);
    while !name.is_char_boundary(n) {
        n -= 1;
    }
    out.push(n as u8);
    out.extend_from_slice(&name.as_bytes()[..n]);
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], BatchError> {
        let s = self.b.get(self.at..self.at + n).ok_or(BatchError::Short(self.at))?;
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, BatchError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, BatchError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, BatchError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn name(&mut self) -> Result<String, BatchError> {
        let n = self.u8()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| BatchError::Name)
    }
}

impl Batch {
    pub fn len(&self) -> usize {
        self.records.len() / RECORD_BYTES
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.records.len());
        out.push(BATCH_VERSION);
        put_name(&mut out, &self.client);
        out.extend_from_slice(&(self.jobs.len().min(u16::MAX as usize) as u16).to_le_bytes());
        for (i, name) in self.jobs.iter().take(u16::MAX as usize) {
            out.extend_from_slice(&i.to_le_bytes());
            put_name(&mut out, name);
        }
        out.extend_from_slice(&self.lost.to_le_bytes());
        out.extend_from_slice(&(self.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.records);
        out
    }

    /// Reads a batch, checking every field and record: bytes from the network or a
    /// disk are not trusted.
    pub fn decode(b: &[u8]) -> Result<Batch, BatchError> {
        let mut c = Cursor { b, at: 0 };
        let v = c.u8()?;
        if v != BATCH_VERSION {
            return Err(BatchError::Version(v));
        }
        let client = c.name()?;
        let njobs = u16::from_le_bytes(c.take(2)?.try_into().expect("2 bytes"));
        let mut jobs = Vec::with_capacity(njobs as usize);
        for _ in 0..njobs {
            let i = c.u32()?;
            jobs.push((i, c.name()?));
        }
        let lost = c.u64()?;
        let n = c.u32()? as usize;
        if n > MAX_BATCH_RECORDS {
            return Err(BatchError::TooMany(n));
        }
        let records = c.take(n * RECORD_BYTES)?;
        for (i, r) in records.chunks(RECORD_BYTES).enumerate() {
            Record::decode(r.try_into().expect("record size")).map_err(|e| BatchError::Record(i, e))?;
        }
        if c.at != b.len() {
            return Err(BatchError::Trailing(b.len() - c.at));
        }
        Ok(Batch { client, jobs, lost, records: records.to_vec() })
    }

    pub fn records(&self) -> impl Iterator<Item = Record> + '_ {
        self.records.chunks(RECORD_BYTES).map(|r| Record::decode(r.try_into().expect("record size")).expect("checked"))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("trace store {dir}: {what}: {source}")]
    Io { dir: PathBuf, what: String, source: std::io::Error },
    #[error("trace store {dir} refused: {why}")]
    Unsafe { dir: PathBuf, why: String },
}

/// Limits of a store.
#[derive(Debug, Clone, Copy)]
pub struct StoreLimits {
    /// A segment is closed once it holds this many bytes.
    pub segment_bytes: u64,
    /// The oldest segments go while the store holds more than this.
    pub total_bytes: u64,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits { segment_bytes: 64 << 20, total_bytes: 10 << 30 }
    }
}

/// The collection server's directory of segments, appended to.
pub struct Store {
    dir: PathBuf,
    limits: StoreLimits,
    current: Option<(u64, File, u64)>,
}

fn segment_name(n: u64) -> String {
    format!("{n:08}.trace")
}

/// Segment numbers in `dir`, oldest first.
fn segments(dir: &Path) -> std::io::Result<Vec<u64>> {
    let mut v: Vec<u64> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".trace")?.parse().ok())
        .collect();
    v.sort_unstable();
    Ok(v)
}

impl Store {
    /// Opens the store in `dir`, making it (and its parents) if need be. A `dir` of
    /// another user, or a symlink, is refused; one of this user open to others is
    /// closed to them (0700).
    pub fn open(dir: &Path, limits: StoreLimits) -> Result<Store, StoreError> {
        let io = |what: &str| {
            let what = what.to_string();
            move |source| StoreError::Io { dir: dir.to_path_buf(), what, source }
        };
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io("create its parent"))?;
        }
        match std::fs::DirBuilder::new().mode(DIR_MODE).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("create")(e)),
        }
        let meta = std::fs::symlink_metadata(dir).map_err(io("stat"))?;
        let unsafe_dir = |why: String| StoreError::Unsafe { dir: dir.to_path_buf(), why };
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if !meta.file_type().is_dir() {
            return Err(unsafe_dir("not a directory (a symlink, say)".into()));
        }
        if meta.uid() != me {
            return Err(unsafe_dir(format!("it belongs to uid {}, not to this user (uid {me})", meta.uid())));
        }
        // The umask may have taken the owner's bits, an earlier version left it open.
        if meta.mode() & 0o777 != DIR_MODE {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE)).map_err(io("chmod"))?;
        }
        Ok(Store { dir: dir.to_path_buf(), limits, current: None })
    }

    fn io(&self, what: String) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
        move |source| StoreError::Io { dir: self.dir.clone(), what, source }
    }

    /// Appends a batch (durable once the call returns: the OS has it; a crash of the
    /// server loses at most a torn last block, which reading skips).
    pub fn append(&mut self, batch: &Batch) -> Result<(), StoreError> {
        let body = batch.encode();
        if self.current.as_ref().is_none_or(|(_, _, len)| *len >= self.limits.segment_bytes) {
            self.rotate()?;
        }
        let (n, file, len) = self.current.as_mut().expect("a segment is open");
        let mut block = Vec::with_capacity(8 + body.len());
        block.extend_from_slice(&(body.len() as u32).to_le_bytes());
        block.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        block.extend_from_slice(&body);
        let n = *n;
        if let Err(source) = file.write_all(&block) {
            // Whatever part landed is a torn block; the next append starts a segment.
            self.current = None;
            return Err(StoreError::Io {
                dir: self.dir.clone(),
                what: format!("append to {}", segment_name(n)),
                source,
            });
        }
        *len += block.len() as u64;
        Ok(())
    }

    /// Closes the current segment, begins the next one, and drops the oldest while
    /// the store is over its total limit.
    fn rotate(&mut self) -> Result<(), StoreError> {
        let existing = segments(&self.dir).map_err(self.io("list".into()))?;
        let next = existing.last().map_or(1, |n| n + 1);
        let path = self.dir.join(segment_name(next));
        let mut file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .mode(SEGMENT_MODE)
            .open(&path)
            .map_err(self.io(format!("create {}", segment_name(next))))?;
        file.write_all(SEGMENT_MAGIC).map_err(self.io(format!("write {}", segment_name(next))))?;
        self.current = Some((next, file, SEGMENT_MAGIC.len() as u64));
        let mut sizes: Vec<(u64, u64)> = existing
            .iter()
            .map(|&n| (n, std::fs::metadata(self.dir.join(segment_name(n))).map_or(0, |m| m.len())))
            .collect();
        let mut total: u64 = sizes.iter().map(|(_, s)| s).sum();
        sizes.reverse();
        while total > self.limits.total_bytes {
            let Some((n, size)) = sizes.pop() else { break };
            let _ = std::fs::remove_file(self.dir.join(segment_name(n)));
            total -= size;
        }
        Ok(())
    }
}

/// One stored operation, with the names its batch gave.
#[derive(Debug, Clone)]
pub struct Entry {
    pub record: Record,
    pub client: Arc<str>,
    pub job: Option<Arc<str>>,
}

/// What reading a store found besides the records.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReadReport {
    pub segments: usize,
    pub batches: u64,
    /// Records the clients lost before they were shipped (counted in the batches).
    pub lost: u64,
    /// Blocks whose checksum or contents failed, skipped.
    pub damaged_blocks: u64,
    /// Segments that ended in a torn block.
    pub torn: usize,
    /// Files that are not segments.
    pub foreign: Vec<String>,
}

/// Reads every stored operation, oldest segment first, handing each to `each`.
pub fn read(dir: &Path, mut each: impl FnMut(Entry)) -> Result<ReadReport, StoreError> {
    let io = |what: String| move |source| StoreError::Io { dir: dir.to_path_buf(), what, source };
    let mut report = ReadReport::default();
    let list = segments(dir).map_err(io("list".into()))?;
    for n in list {
        let name = segment_name(n);
        let file = match File::open(dir.join(&name)) {
            Ok(f) => f,
            // Dropped by the server's rotation since the listing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(format!("open {name}"))(e)),
        };
        let mut r = BufReader::with_capacity(1 << 20, file);
        let mut magic = [0u8; 8];
        if r.read_exact(&mut magic).is_err() || &magic != SEGMENT_MAGIC {
            report.foreign.push(name);
            continue;
        }
        report.segments += 1;
        let mut body = Vec::new();
        loop {
            let mut head = [0u8; 8];
            match read_full(&mut r, &mut head).map_err(io(format!("read {name}")))? {
                0 => break,
                8 => {}
                _ => {
                    report.torn += 1;
                    break;
                }
            }
            let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
            let crc = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
            if len > 64 + (1 + 2 * MAX_NAME) * (u16::MAX as usize + 1) + MAX_BATCH_RECORDS * RECORD_BYTES {
                // A length no batch has: the rest of the segment cannot be framed.
                report.damaged_blocks += 1;
                break;
            }
            body.resize(len, 0);
            if read_full(&mut r, &mut body).map_err(io(format!("read {name}")))? < len {
                report.torn += 1;
                break;
            }
            let batch = match (crc32c::crc32c(&body) == crc).then(|| Batch::decode(&body)) {
                Some(Ok(b)) => b,
                _ => {
                    report.damaged_blocks += 1;
                    continue;
                }
            };
            report.batches += 1;
            report.lost += batch.lost;
            let client: Arc<str> = batch.client.as_str().into();
            let jobs: Vec<(u32, Arc<str>)> = batch.jobs.iter().map(|(i, n)| (*i, n.as_str().into())).collect();
            for record in batch.records() {
                let job = jobs.iter().find(|(i, _)| *i == record.job).map(|(_, n)| n.clone());
                each(Entry { record, client: client.clone(), job });
            }
        }
    }
    Ok(report)
}

/// Reads until `buf` is full or the end; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Op, Target, NO_JOB};
    use proto::Fid;

    fn batch(client: &str, from: u64, n: u64) -> Batch {
        let mut records = Vec::new();
        for i in from..from + n {
            let mut b = [0u8; RECORD_BYTES];
            Record {
                start_ns: i,
                dur_ns: 1,
                pid: 7,
                uid: 0,
                gid: 0,
                fid: Fid { seq: 1, oid: 2, ver: 0 },
                offset: i,
                len: 1,
                job: if i % 2 == 0 { 0 } else { NO_JOB },
                op: Op::Write,
                errno: 0,
                target: Target::Ost(0),
            }
            .encode(&mut b);
            records.extend_from_slice(&b);
        }
        Batch { client: client.into(), jobs: vec![(0, "job-1".into())], lost: 2, records }
    }

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("braid-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn batches_round_trip_and_hostile_ones_are_refused() {
        let b = batch("node1:/mnt/braid", 0, 10);
        let bytes = b.encode();
        assert_eq!(Batch::decode(&bytes).unwrap(), b);
        for cut in [0, 1, 5, bytes.len() - 1] {
            assert!(Batch::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(matches!(Batch::decode(&extra), Err(BatchError::Trailing(1))));
        let mut bad = bytes.clone();
        let at = bad.len() - RECORD_BYTES + 60;
        bad[at] = 200;
        assert!(matches!(Batch::decode(&bad), Err(BatchError::Record(9, _))));
        let mut huge = bytes.clone();
        let n_at = bytes.len() - 10 * RECORD_BYTES - 4;
        huge[n_at..n_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Batch::decode(&huge), Err(BatchError::TooMany(_))));
        assert!(matches!(Batch::decode(&[9]), Err(BatchError::Version(9))));
    }

    #[test]
    fn a_store_rotates_within_its_limits_and_reads_back_what_is_intact() {
        let d = dir("rotate");
        let limits = StoreLimits { segment_bytes: 4096, total_bytes: 20_000 };
        let mut s = Store::open(&d, limits).unwrap();
        for i in 0..40 {
            s.append(&batch("c", i * 20, 20)).unwrap();
        }
        let segs = segments(&d).unwrap();
        let total: u64 = segs.iter().map(|n| std::fs::metadata(d.join(segment_name(*n))).unwrap().len()).sum();
        assert!(segs.len() > 2 && total <= 20_000 + 4096 + 2000, "{} segments, {total} bytes", segs.len());
        assert!(segs[0] > 1, "the oldest went");
        let mut got = Vec::new();
        let report = read(&d, |e| got.push(e)).unwrap();
        assert_eq!(report.damaged_blocks, 0);
        assert!(got.windows(2).all(|w| w[0].record.start_ns + 1 == w[1].record.start_ns), "in order, no gap");
        assert_eq!(got.last().unwrap().record.start_ns, 799);
        assert_eq!(got[0].client.as_ref(), "c");
        assert_eq!(got.iter().find(|e| e.record.start_ns % 2 == 0).unwrap().job.as_deref(), Some("job-1"));
        assert_eq!(got.iter().find(|e| e.record.start_ns % 2 == 1).unwrap().job, None);
        assert_eq!(report.lost, 2 * report.batches);

        // A flipped byte in one block, a torn tail, and a stray file.
        let d2 = dir("damage");
        let mut s = Store::open(&d2, StoreLimits::default()).unwrap();
        for i in 0..3 {
            s.append(&batch("c", i * 5, 5)).unwrap();
        }
        drop(s);
        let seg = d2.join(segment_name(1));
        let mut raw = std::fs::read(&seg).unwrap();
        let block = 8 + Batch::encode(&batch("c", 0, 5)).len();
        raw[8 + block + 20] ^= 0xff;
        raw.extend_from_slice(&[100, 0, 0, 0, 1, 2]);
        std::fs::write(&seg, &raw).unwrap();
        std::fs::write(d2.join("00000099.trace"), b"junk").unwrap();
        let mut n = 0;
        let report = read(&d2, |_| n += 1).unwrap();
        assert_eq!(n, 10, "the two intact batches");
        assert_eq!((report.damaged_blocks, report.torn), (1, 1));
        assert_eq!(report.foreign, vec!["00000099.trace".to_string()]);
        // Appending after a reopen starts a new segment, after the stray one.
        let mut s = Store::open(&d2, StoreLimits::default()).unwrap();
        s.append(&batch("c", 100, 1)).unwrap();
        assert!(d2.join(segment_name(100)).exists());
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_dir_all(&d2);
    }

    /// A store is its owner's alone: its directory 0700 (made so, or closed if an
    /// earlier version left it open), its segments 0600; a symlink in its place is
    /// refused.
    #[test]
    fn a_store_is_for_its_owner_only() {
        let d = dir("private");
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        let mut s = Store::open(&d, StoreLimits::default()).unwrap();
        s.append(&batch("c", 0, 1)).unwrap();
        assert_eq!(mode(&d), 0o700);
        assert_eq!(mode(&d.join(segment_name(1))), 0o600);
        drop(s);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        Store::open(&d, StoreLimits::default()).unwrap();
        assert_eq!(mode(&d), 0o700, "closed to others again");
        let link = dir("private-link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        let e = Store::open(&link, StoreLimits::default()).err().expect("a symlink is refused");
        assert!(matches!(e, StoreError::Unsafe { .. }), "{e}");
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&d);
    }
}
