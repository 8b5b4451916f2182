//! What the cache holds, where, and for which data version: in memory a map per file
//! from file offset to extent, and on disk an append-only log of the changes, replayed
//! at start so a remounted client uses its cache again without re-reading anything.
//!
//! Every log frame carries a checksum; replay stops at the first frame that does not
//! check (the tail a killed client or a lost power left half written) and cuts it off.
//! Extents carry a checksum per page of their bytes, checked on every read (see
//! [`crate::Cache::read`]), so a torn or changed data page is never served. When the
//! log has grown well past what it describes it is rewritten whole (a new file,
//! synced, renamed over the old one).
//!
//! Versions: a file's data version only grows (the MDS bumps it), so an extent filled
//! under a version older than the one the index holds for its file is refused, and a
//! newer one replaces the file's extents.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::buddy::{Block, Buddy, PAGE};

/// A file, as the cache's user names it (a FID packed into 128 bits).
pub type Key = u128;

/// Log frames longer than this are corruption.
const FRAME_MAX: usize = 1 << 20;
/// The log is rewritten once it passes twice what its live records take, plus this.
const COMPACT_SLACK: u64 = 8 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum Rec {
    /// First frame of a log: the data file's capacity and the cluster it was written
    /// for (FIDs and data versions mean nothing in another cluster).
    Header { magic: u64, capacity: u64, cluster: u64 },
    /// The file's cached bytes are of this data version (its older extents are gone).
    Version { key: Key, version: u64 },
    /// An extent: `len` bytes of the file at `off`, in `block` of the data file, one
    /// checksum per page.
    Put { key: Key, off: u64, len: u32, page: u64, order: u32, crcs: Vec<u32> },
    /// The extent of the file at `off` is gone.
    Drop { key: Key, off: u64 },
    /// Everything of the file is gone.
    DropFile { key: Key },
}

const MAGIC: u64 = u64::from_le_bytes(*b"braidSC1");

#[derive(Debug, Clone)]
pub struct Extent {
    pub len: u32,
    pub block: Block,
    pub crcs: Vec<u32>,
    tick: u64,
}

struct FileIdx {
    version: u64,
    /// The invalidation clock when a change through this client last dropped bytes
    /// of the file (see [`Index::ticket`]).
    last_inval: u64,
    extents: BTreeMap<u64, Extent>,
}

/// A read that missed, for filling the cache with its bytes afterwards: valid only if
/// nothing of the file was invalidated since it was taken and the version still holds.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    pub key: Key,
    pub version: u64,
    clock: u64,
}

impl Ticket {
    /// A ticket as of the invalidation clock's value now.
    pub fn new(key: Key, version: u64, clock: &AtomicU64) -> Ticket {
        Ticket { key, version, clock: clock.load(Ordering::Acquire) }
    }
}

/// Part of a read served from the cache: bytes `[skip, skip + take)` of the pages read
/// at `data_off` of the data file (`bytes` long, checked against `crcs`).
#[derive(Debug, Clone)]
pub struct Piece {
    pub file_off: u64,
    pub block: Block,
    pub data_off: u64,
    pub bytes: u64,
    pub crcs: Vec<u32>,
    pub skip: usize,
    pub take: usize,
}

/// What an insertion or eviction changed, for the statistics.
#[derive(Debug, Default, Clone, Copy)]
pub struct Changed {
    pub evicted: u64,
    pub invalidated: u64,
}

pub struct Index {
    files: HashMap<Key, FileIdx>,
    lru: BTreeMap<u64, (Key, u64)>,
    clock: u64,
    /// Moves with every invalidation; shared with [`crate::Cache`], which reads it for
    /// tickets without taking the index's lock.
    inval_clock: Arc<AtomicU64>,
    /// Highest `last_inval` of a file forgotten (no extents left).
    forgotten_inval: u64,
    pub buddy: Buddy,
    log: Log,
    /// Extents held.
    pub extents: u64,
    cluster: u64,
}

impl Index {
    /// Opens the index in `dir` for a data file of `capacity` bytes holding files of
    /// `cluster`, replaying its log; a log written for another capacity or cluster, or
    /// none, starts an empty cache.
    pub fn open(dir: &Path, capacity: u64, cluster: u64) -> std::io::Result<(Index, Replayed)> {
        let path = dir.join("index.log");
        let (recs, good_len, torn) = read_log(&path)?;
        let buddy = Buddy::new(capacity);
        let mut idx = Index {
            files: HashMap::new(),
            lru: BTreeMap::new(),
            clock: 0,
            inval_clock: Arc::new(AtomicU64::new(1)),
            forgotten_inval: 0,
            log: Log { path: path.clone(), file: None, bytes: 0, live: 0, held: Vec::new(), hold: false },
            cluster,
            buddy,
            extents: 0,
        };
        let mut replayed = Replayed { torn, ..Default::default() };
        let fits = matches!(recs.first(), Some(Rec::Header { magic: MAGIC, capacity: c, cluster: k })
            if *c == idx.buddy.capacity() && *k == cluster);
        if fits {
            for rec in recs.into_iter().skip(1) {
                idx.replay(rec, &mut replayed);
            }
            let file = OpenOptions::new().write(true).open(&path)?;
            file.set_len(good_len)?;
            drop(file);
            idx.log.file = Some(OpenOptions::new().append(true).open(&path)?);
            idx.log.bytes = good_len;
            idx.log.live = idx.live_estimate();
        } else {
            replayed.discarded = !recs.is_empty();
            idx.rewrite()?;
        }
        Ok((idx, replayed))
    }

    fn replay(&mut self, rec: Rec, r: &mut Replayed) {
        match rec {
            Rec::Header { .. } => r.bad += 1,
            Rec::Version { key, version } => {
                self.drop_file_quiet(key);
                self.files.insert(key, FileIdx { version, last_inval: 0, extents: BTreeMap::new() });
            }
            Rec::Put { key, off, len, page, order, crcs } => {
                let block = Block { page, order };
                let Some(f) = self.files.get(&key) else {
                    r.bad += 1;
                    return;
                };
                let pages = (len as u64).div_ceil(PAGE);
                let overlaps =
                    f.extents.range(..off + len as u64).next_back().is_some_and(|(o, e)| o + e.len as u64 > off);
                if len == 0
                    || crcs.len() as u64 != pages
                    || block.bytes() < len as u64
                    || overlaps
                    || !self.buddy.claim(block)
                {
                    r.bad += 1;
                    return;
                }
                self.clock += 1;
                let tick = self.clock;
                self.lru.insert(tick, (key, off));
                self.extents += 1;
                self.files.get_mut(&key).expect("checked above").extents.insert(off, Extent { len, block, crcs, tick });
            }
            Rec::Drop { key, off } => {
                if let Some(e) = self.files.get_mut(&key).and_then(|f| f.extents.remove(&off)) {
                    self.lru.remove(&e.tick);
                    self.buddy.free(e.block);
                    self.extents -= 1;
                }
            }
            Rec::DropFile { key } => {
                self.drop_file_quiet(key);
            }
        }
    }

    /// Forgets a file and frees its extents, logging nothing.
    fn drop_file_quiet(&mut self, key: Key) -> u64 {
        let Some(f) = self.files.remove(&key) else { return 0 };
        self.forgotten_inval = self.forgotten_inval.max(f.last_inval);
        let n = f.extents.len() as u64;
        for e in f.extents.into_values() {
            self.lru.remove(&e.tick);
            self.buddy.free(e.block);
        }
        self.extents -= n;
        n
    }

    /// The fill thread's changes until [`Index::release_log`] go to the log in one write.
    pub fn hold_log(&mut self) {
        self.log.hold = true;
    }

    pub fn release_log(&mut self) {
        self.log.hold = false;
        self.log.flush();
    }

    /// Runs a change that must reach the log at once (anything but a fill): what the
    /// fill thread holds goes first.
    fn at_once<T>(&mut self, f: impl FnOnce(&mut Index) -> T) -> T {
        let hold = std::mem::replace(&mut self.log.hold, false);
        self.log.flush();
        let r = f(self);
        self.log.hold = hold;
        r
    }

    /// A file was opened at `version`: its extents of an older version go.
    pub fn opened(&mut self, key: Key, version: u64) -> Changed {
        self.at_once(|idx| idx.opened_now(key, version))
    }

    fn opened_now(&mut self, key: Key, version: u64) -> Changed {
        let mut c = Changed::default();
        if let Some(f) = self.files.get(&key) {
            if version > f.version {
                c.invalidated = self.drop_file_quiet(key);
                self.log.append(&[Rec::DropFile { key }]);
            }
        }
        c
    }

    /// Bytes `[off, off + len)` of the file at `version`, if all of them are held.
    pub fn lookup(&mut self, key: Key, version: u64, off: u64, len: u64) -> Option<Vec<Piece>> {
        let f = self.files.get_mut(&key)?;
        if f.version != version || len == 0 {
            return None;
        }
        let end = off + len;
        let mut pieces = Vec::new();
        let mut pos = off;
        let first = f.extents.range(..=off).next_back().map(|(&o, _)| o)?;
        for (&eoff, e) in f.extents.range(first..) {
            if pos >= end {
                break;
            }
            let eend = eoff + e.len as u64;
            if eoff > pos || eend <= pos {
                return None;
            }
            let take_end = eend.min(end);
            let first_page = (pos - eoff) / PAGE;
            let last_page = (take_end - eoff - 1) / PAGE;
            let data_off = e.block.offset() + first_page * PAGE;
            let bytes = ((last_page + 1) * PAGE).min(e.len as u64) - first_page * PAGE;
            pieces.push(Piece {
                file_off: eoff,
                block: e.block,
                data_off,
                bytes,
                crcs: e.crcs[first_page as usize..=last_page as usize].to_vec(),
                skip: (pos - eoff - first_page * PAGE) as usize,
                take: (take_end - pos) as usize,
            });
            pos = take_end;
        }
        if pos < end {
            return None;
        }
        for p in &pieces {
            self.clock += 1;
            let f = self.files.get_mut(&key).expect("looked up above");
            let e = f.extents.get_mut(&p.file_off).expect("looked up above");
            self.lru.remove(&e.tick);
            e.tick = self.clock;
            self.lru.insert(self.clock, (key, p.file_off));
        }
        Some(pieces)
    }

    /// Drops the extent at `file_off` if it is still in `block` (a read found its bytes
    /// damaged). True if it was.
    pub fn drop_damaged(&mut self, key: Key, file_off: u64, block: Block) -> bool {
        self.at_once(|idx| idx.drop_damaged_now(key, file_off, block))
    }

    fn drop_damaged_now(&mut self, key: Key, file_off: u64, block: Block) -> bool {
        let same = self.files.get(&key).and_then(|f| f.extents.get(&file_off)).is_some_and(|e| e.block == block);
        if same {
            self.drop_extent(key, file_off);
        }
        same
    }

    fn drop_extent(&mut self, key: Key, off: u64) {
        let Some(f) = self.files.get_mut(&key) else { return };
        let Some(e) = f.extents.remove(&off) else { return };
        self.lru.remove(&e.tick);
        self.buddy.free(e.block);
        self.extents -= 1;
        self.log.append(&[Rec::Drop { key, off }]);
        if f.extents.is_empty() {
            self.drop_file_quiet(key);
            self.log.append(&[Rec::DropFile { key }]);
        }
    }

    /// A change of `[off, off + len)` through this client (a write, truncate or hole
    /// punch): the extents it touches go, and fills of reads taken before it are refused.
    pub fn invalidate(&mut self, key: Key, off: u64, len: u64) -> Changed {
        self.at_once(|idx| idx.invalidate_now(key, off, len))
    }

    fn invalidate_now(&mut self, key: Key, off: u64, len: u64) -> Changed {
        let clock = self.inval_clock.fetch_add(1, Ordering::AcqRel) + 1;
        let Some(f) = self.files.get_mut(&key) else {
            // Nothing held; a fill of it under way must still be refused.
            self.forgotten_inval = clock;
            return Changed::default();
        };
        f.last_inval = clock;
        let hit = overlapping(f, off, len);
        let n = hit.len() as u64;
        for o in hit {
            self.drop_extent(key, o);
        }
        Changed { invalidated: n, evicted: 0 }
    }

    /// The invalidation clock, for [`Ticket::new`].
    pub fn clock(&self) -> Arc<AtomicU64> {
        self.inval_clock.clone()
    }

    fn valid(&self, t: &Ticket) -> bool {
        match self.files.get(&t.key) {
            Some(f) => f.last_inval <= t.clock && t.version >= f.version,
            None => self.forgotten_inval <= t.clock,
        }
    }

    /// Blocks for an extent of `len` bytes, evicting the least recently used extents as
    /// needed; `None` if the ticket no longer holds or no space can be made.
    pub fn reserve(&mut self, t: &Ticket, len: u64, c: &mut Changed) -> Option<Vec<Block>> {
        if !self.valid(t) {
            return None;
        }
        let mut blocks = Vec::new();
        for piece in split(len) {
            let order = crate::buddy::order_for(piece);
            loop {
                if let Some(b) = self.buddy.alloc(order) {
                    blocks.push(b);
                    break;
                }
                let Some((_, (key, off))) = self.lru.pop_first() else {
                    for b in blocks {
                        self.buddy.free(b);
                    }
                    return None;
                };
                // Put back for drop_extent to take out (it keeps the LRU in step).
                if let Some(e) = self.files.get(&key).and_then(|f| f.extents.get(&off)) {
                    self.lru.insert(e.tick, (key, off));
                }
                self.drop_extent(key, off);
                c.evicted += 1;
            }
        }
        Some(blocks)
    }

    /// Files the extents written into `blocks` (from [`Index::reserve`], in order) for
    /// `[off, off + len)`, if the ticket still holds; otherwise frees the blocks.
    pub fn commit(&mut self, t: &Ticket, off: u64, len: u64, blocks: Vec<Block>, crcs: Vec<Vec<u32>>) -> bool {
        if !self.valid(t) {
            for b in blocks {
                self.buddy.free(b);
            }
            return false;
        }
        let newer = self.files.get(&t.key).is_some_and(|f| t.version > f.version);
        if newer {
            self.drop_file_quiet(t.key);
            self.log.append(&[Rec::DropFile { key: t.key }]);
        }
        if !self.files.contains_key(&t.key) {
            let last_inval = self.forgotten_inval;
            self.files.insert(t.key, FileIdx { version: t.version, last_inval, extents: BTreeMap::new() });
            self.log.append(&[Rec::Version { key: t.key, version: t.version }]);
        }
        // Another fill of the same bytes may have landed meanwhile: it gives way.
        let f = self.files.get(&t.key).expect("inserted above");
        for o in overlapping(f, off, len) {
            self.drop_extent(t.key, o);
        }
        if !self.files.contains_key(&t.key) {
            let last_inval = self.forgotten_inval;
            self.files.insert(t.key, FileIdx { version: t.version, last_inval, extents: BTreeMap::new() });
            self.log.append(&[Rec::Version { key: t.key, version: t.version }]);
        }
        let mut recs = Vec::new();
        let mut pos = off;
        for ((piece, block), crcs) in split(len).into_iter().zip(blocks).zip(crcs) {
            self.clock += 1;
            let tick = self.clock;
            self.lru.insert(tick, (t.key, pos));
            let e = Extent { len: piece as u32, block, crcs: crcs.clone(), tick };
            self.files.get_mut(&t.key).expect("inserted above").extents.insert(pos, e);
            self.extents += 1;
            recs.push(Rec::Put { key: t.key, off: pos, len: piece as u32, page: block.page, order: block.order, crcs });
            pos += piece;
        }
        self.log.append(&recs);
        if self.log.bytes > 2 * self.log.live + COMPACT_SLACK {
            if let Err(e) = self.rewrite() {
                tracing::warn!("SSD cache: rewriting the index log failed: {e}");
            }
        }
        true
    }

    /// Frees the blocks of a fill that was not written.
    pub fn abandon(&mut self, blocks: Vec<Block>) {
        for b in blocks {
            self.buddy.free(b);
        }
    }

    /// Everything goes.
    pub fn clear(&mut self) -> std::io::Result<u64> {
        let n = self.extents;
        let keys: Vec<Key> = self.files.keys().copied().collect();
        for k in keys {
            self.drop_file_quiet(k);
        }
        self.forgotten_inval = self.inval_clock.fetch_add(1, Ordering::AcqRel) + 1;
        self.rewrite()?;
        Ok(n)
    }

    fn live_estimate(&self) -> u64 {
        // A Put frame is about 40 bytes and 4 per page; a Version frame about 30.
        let mut b = 0;
        for f in self.files.values() {
            b += 30;
            for e in f.extents.values() {
                b += 40 + 4 * e.crcs.len() as u64;
            }
        }
        b
    }

    /// Writes the log anew from what is held: a new file, synced, renamed over the old.
    fn rewrite(&mut self) -> std::io::Result<()> {
        // Held frames describe what memory holds already: the new log has it all.
        self.log.held.clear();
        let tmp = self.log.path.with_extension("new");
        let mut out = Vec::new();
        frame(&mut out, &Rec::Header { magic: MAGIC, capacity: self.buddy.capacity(), cluster: self.cluster });
        for (&key, f) in &self.files {
            frame(&mut out, &Rec::Version { key, version: f.version });
            for (&off, e) in &f.extents {
                let rec =
                    Rec::Put { key, off, len: e.len, page: e.block.page, order: e.block.order, crcs: e.crcs.clone() };
                frame(&mut out, &rec);
            }
        }
        let mut file = File::create(&tmp)?;
        file.write_all(&out)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, &self.log.path)?;
        if let Some(dir) = self.log.path.parent() {
            File::open(dir)?.sync_all()?;
        }
        self.log.file = Some(OpenOptions::new().append(true).open(&self.log.path)?);
        self.log.bytes = out.len() as u64;
        self.log.live = out.len() as u64;
        Ok(())
    }
}

/// Offsets of the file's extents that overlap `[off, off + len)`.
fn overlapping(f: &FileIdx, off: u64, len: u64) -> Vec<u64> {
    let end = off.saturating_add(len);
    let mut hit = Vec::new();
    if let Some((&o, e)) = f.extents.range(..off).next_back() {
        if o + e.len as u64 > off {
            hit.push(o);
        }
    }
    hit.extend(f.extents.range(off..end).map(|(&o, _)| o));
    hit
}

/// How an extent of `len` bytes is cut into blocks: whole largest blocks, then the rest
/// in page-rounded powers of two, so no block wastes more than a page.
pub fn split(len: u64) -> Vec<u64> {
    let top = PAGE << crate::buddy::MAX_ORDER;
    let mut out = Vec::new();
    let mut left = len;
    while left > 0 {
        let piece = if left >= top {
            top
        } else {
            let pages = left.div_ceil(PAGE);
            // The largest power of two of pages not above what is left, or the last bit.
            let p = 1u64 << (63 - pages.leading_zeros());
            (p * PAGE).min(left)
        };
        out.push(piece);
        left -= piece;
    }
    out
}

/// What a replay found.
#[derive(Debug, Default, Clone, Copy)]
pub struct Replayed {
    /// The log ended in a frame that did not check (cut off).
    pub torn: bool,
    /// Records that made no sense (an extent overlapping another, or of a file never
    /// versioned): dropped.
    pub bad: u64,
    /// The log was for another capacity or cluster: the cache started empty.
    pub discarded: bool,
}

struct Log {
    path: PathBuf,
    file: Option<File>,
    bytes: u64,
    /// Bytes the live records take (estimated), for deciding when to rewrite.
    live: u64,
    /// While the fill thread works through a batch, its frames wait here and go in one
    /// write; any other change writes them first, then its own, so the log's order is
    /// the order of the changes (a drop never lands before the put it undoes).
    held: Vec<u8>,
    hold: bool,
}

impl Log {
    /// Appends frames with one write. A failed append (a full disk) loses nothing the
    /// cache serves: the extent's own checksums and the next rewrite cover it; it is
    /// logged.
    fn append(&mut self, recs: &[Rec]) {
        let mut out = Vec::new();
        for r in recs {
            frame(&mut out, r);
        }
        self.bytes += out.len() as u64;
        for r in recs {
            match r {
                Rec::Put { crcs, .. } => self.live += 40 + 4 * crcs.len() as u64,
                Rec::Version { .. } => self.live += 30,
                _ => {}
            }
        }
        self.held.extend_from_slice(&out);
        if !self.hold {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.held.is_empty() {
            return;
        }
        if let Some(f) = self.file.as_mut() {
            if let Err(e) = f.write_all(&self.held) {
                tracing::warn!("SSD cache: appending to {} failed: {e}", self.path.display());
            }
        }
        self.held.clear();
    }
}

fn frame(out: &mut Vec<u8>, rec: &Rec) {
    let body = postcard::to_allocvec(rec).expect("encoding an in-memory record cannot fail");
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
}

/// The records of the log, the length of its good prefix, and whether a bad tail
/// followed it.
fn read_log(path: &Path) -> std::io::Result<(Vec<Rec>, u64, bool)> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => {
            f.read_to_end(&mut bytes)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((vec![], 0, false)),
        Err(e) => return Err(e),
    }
    let mut recs = Vec::new();
    let mut pos = 0usize;
    while pos + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().expect("4 bytes"));
        if len > FRAME_MAX || pos + 8 + len > bytes.len() {
            break;
        }
        let body = &bytes[pos + 8..pos + 8 + len];
        if crc32c::crc32c(body) != crc {
            break;
        }
        let Ok(rec) = postcard::from_bytes::<Rec>(body) else { break };
        recs.push(rec);
        pos += 8 + len;
    }
    Ok((recs, pos as u64, pos < bytes.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_split_into_blocks_wasting_under_a_page() {
        assert_eq!(split(4096), vec![4096]);
        assert_eq!(split(100), vec![100]);
        assert_eq!(split((1 << 20) + 5000), vec![1 << 20, 5000]);
        assert_eq!(split(100 << 10), vec![64 << 10, 32 << 10, 4 << 10]);
        assert_eq!(split(3 << 20), vec![1 << 20; 3]);
        assert_eq!(split(0), Vec::<u64>::new());
        for len in [1u64, 4095, 4097, 12_345, 999_999, 5 << 20] {
            let s = split(len);
            assert_eq!(s.iter().sum::<u64>(), len);
            let alloc: u64 =
                s.iter().map(|&p| crate::buddy::Block { page: 0, order: crate::buddy::order_for(p) }.bytes()).sum();
            assert!(alloc - len < PAGE * s.len() as u64, "{len}: {alloc} allocated");
        }
    }
}
