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

use crate::store::{Fds, Stamp, Store};

/// Bytes of one page: the unit of checksums, of direct I/O and of hole punching.
pub const PAGE: u64 = 4096;
/// Extents longer than this are cut into several (the unit of eviction).
pub const EXTENT_MAX: u64 = 1 << 20;

pub use crate::store::Key;

/// Log frames longer than this are corruption.
const FRAME_MAX: usize = 1 << 20;
/// The log is rewritten once it passes twice what its live records take, plus this.
const COMPACT_SLACK: u64 = 8 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
enum Rec {
    /// First frame of a log: the cache's capacity and the cluster it was written for
    /// (FIDs and data versions mean nothing in another cluster).
    Header { magic: u64, capacity: u64, cluster: u64 },
    /// The file's cached bytes are of this data version (its older extents are gone),
    /// in its cache file of generation `gen`.
    Version { key: Key, version: u64, gen: u64 },
    /// An extent: `len` bytes of the file at `off`, at the same offset of its cache
    /// file, one checksum per file page it touches.
    Put { key: Key, off: u64, len: u32, crcs: Vec<u32> },
    /// The extent of the file at `off` is gone.
    Drop { key: Key, off: u64 },
    /// Everything of the file is gone.
    DropFile { key: Key },
}

const MAGIC: u64 = u64::from_le_bytes(*b"braidSC2");

#[derive(Debug, Clone)]
pub struct Extent {
    pub len: u32,
    /// One per file page the extent touches, over the extent's bytes in that page.
    pub crcs: Vec<u32>,
    tick: u64,
    /// Names this extent for as long as it lives (a damaged read drops only it).
    id: u64,
    /// Its bytes were written or checked by this process: a replayed extent is not,
    /// until a read checks it (see [`Index::backing`]).
    verified: bool,
}

struct FileIdx {
    version: u64,
    /// The cache file's generation: a file dropped while a reader holds it is unlinked
    /// and the next fills go to a new one.
    gen: u64,
    /// The invalidation clock when a change through this client last dropped bytes
    /// of the file (see [`Index::ticket`]).
    last_inval: u64,
    extents: BTreeMap<u64, Extent>,
    /// Fills reserved and not yet filed or abandoned: the file stays while they run.
    filling: u32,
    /// The fill thread is changing the cache file (writes or punches) until it stamps it.
    busy: bool,
    /// The cache file's inode and change time after this process last changed it;
    /// another change (behind the cache's back) refuses it as a backing file.
    stamp: Option<Stamp>,
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

/// An extent a read is served from: its bytes `[off, off + len)` (at the same offset
/// of the cache file), checked against `crcs` (one per file page touched).
#[derive(Debug, Clone)]
pub struct Piece {
    pub off: u64,
    pub len: u64,
    pub crcs: Vec<u32>,
    pub id: u64,
    pub verified: bool,
}

/// What a lookup found: the extents covering a range, and the cache file they are in.
pub struct Found {
    pub pieces: Vec<Piece>,
    pub fds: Arc<Fds>,
}

/// A fill's claim on space: the generation of the file it writes to.
#[derive(Debug, Clone, Copy)]
pub struct Reserved {
    pub gen: u64,
    bytes: u64,
}

/// What an insertion or eviction changed, for the statistics.
#[derive(Debug, Default, Clone, Copy)]
pub struct Changed {
    pub evicted: u64,
    pub invalidated: u64,
}

/// Why a file cannot be handed out as a backing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not all of it is cached at this version.
    Incomplete,
    /// Some of its bytes were not checked since this process opened the cache.
    Unchecked,
    /// Its cache file changed behind the cache's back.
    Changed,
    /// The fill thread is writing to it.
    Busy,
}

/// Pages of a file, dropped from the index, whose bytes are punched out of the cache
/// file by the fill thread (the one writer of cache files) before its next writes.
#[derive(Debug, Clone, Copy)]
pub struct Dead {
    pub key: Key,
    pub gen: u64,
    pub start: u64,
    pub end: u64,
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
    capacity: u64,
    /// Bytes of extents held and of fills reserved, each rounded up to whole pages.
    used: u64,
    log: Log,
    /// Extents held.
    pub extents: u64,
    cluster: u64,
    next_id: u64,
    next_gen: u64,
    dead: Vec<Dead>,
    /// Cache files (a file's key and generation) handed out as backing files, and how
    /// many times.
    pinned: HashMap<(Key, u64), u32>,
    pub store: Store,
}

/// Bytes `len` at `off` take on disk, in whole pages (an extent shares a page with
/// its neighbours at most at its ends; counting those twice keeps the bound).
fn pages_of(off: u64, len: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    ((off + len).div_ceil(PAGE) - off / PAGE) * PAGE
}

/// The checksums of `data` placed at file offset `off`: one per file page it touches.
pub fn page_crcs(off: u64, data: &[u8]) -> Vec<u32> {
    let mut crcs = Vec::with_capacity(pages_of(off, data.len() as u64) as usize / PAGE as usize);
    let mut pos = 0usize;
    while pos < data.len() {
        let at = off + pos as u64;
        let n = ((PAGE - at % PAGE) as usize).min(data.len() - pos);
        crcs.push(crc32c::crc32c(&data[pos..pos + n]));
        pos += n;
    }
    crcs
}

impl Index {
    /// Opens the index in `dir` for a cache of `capacity` bytes holding files of
    /// `cluster`, replaying its log; a log written for another capacity or cluster, or
    /// none, starts an empty cache. Cache files the index does not name are removed.
    pub fn open(dir: &Path, capacity: u64, cluster: u64) -> std::io::Result<(Index, Replayed)> {
        let path = dir.join("index.log");
        let (recs, good_len, torn) = read_log(&path)?;
        let mut idx = Index {
            files: HashMap::new(),
            lru: BTreeMap::new(),
            clock: 0,
            inval_clock: Arc::new(AtomicU64::new(1)),
            forgotten_inval: 0,
            log: Log { path: path.clone(), file: None, bytes: 0, live: 0, held: Vec::new(), hold: false },
            cluster,
            capacity,
            used: 0,
            extents: 0,
            next_id: 1,
            next_gen: 1,
            dead: Vec::new(),
            pinned: HashMap::new(),
            store: Store::open(dir)?,
        };
        let mut replayed = Replayed { torn, ..Default::default() };
        let fits = matches!(recs.first(), Some(Rec::Header { magic: MAGIC, capacity: c, cluster: k })
            if *c == capacity && *k == cluster);
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
        let keep: Vec<(Key, u64)> = idx.files.iter().map(|(&k, f)| (k, f.gen)).collect();
        replayed.removed = idx.store.remove_others(&keep);
        Ok((idx, replayed))
    }

    fn replay(&mut self, rec: Rec, r: &mut Replayed) {
        match rec {
            Rec::Header { .. } => r.bad += 1,
            Rec::Version { key, version, gen } => {
                self.drop_file_quiet(key);
                self.next_gen = self.next_gen.max(gen + 1);
                self.files.insert(key, FileIdx::new(version, gen, 0));
            }
            Rec::Put { key, off, len, crcs } => {
                let Some(f) = self.files.get(&key) else {
                    r.bad += 1;
                    return;
                };
                let overlaps =
                    f.extents.range(..off + len as u64).next_back().is_some_and(|(o, e)| o + e.len as u64 > off);
                let bytes = pages_of(off, len as u64);
                if len == 0
                    || crcs.len() as u64 != bytes / PAGE
                    || off.checked_add(len as u64).is_none()
                    || overlaps
                    || self.used + bytes > self.capacity
                {
                    r.bad += 1;
                    return;
                }
                self.used += bytes;
                self.insert_extent(key, off, len, crcs, false);
            }
            Rec::Drop { key, off } => {
                if let Some(e) = self.files.get_mut(&key).and_then(|f| f.extents.remove(&off)) {
                    self.lru.remove(&e.tick);
                    self.used -= pages_of(off, e.len as u64);
                    self.extents -= 1;
                }
            }
            Rec::DropFile { key } => {
                self.drop_file_quiet(key);
            }
        }
    }

    fn insert_extent(&mut self, key: Key, off: u64, len: u32, crcs: Vec<u32>, verified: bool) {
        self.clock += 1;
        let tick = self.clock;
        let id = self.next_id;
        self.next_id += 1;
        self.lru.insert(tick, (key, off));
        self.extents += 1;
        let e = Extent { len, crcs, tick, id, verified };
        self.files.get_mut(&key).expect("the file is indexed").extents.insert(off, e);
    }

    /// Forgets a file and unlinks its cache file, logging nothing. A reader holding the
    /// cache file (a backing file) keeps its bytes.
    fn drop_file_quiet(&mut self, key: Key) -> u64 {
        let Some(f) = self.files.remove(&key) else { return 0 };
        self.forgotten_inval = self.forgotten_inval.max(f.last_inval);
        let n = f.extents.len() as u64;
        for (off, e) in f.extents {
            self.lru.remove(&e.tick);
            self.used -= pages_of(off, e.len as u64);
        }
        self.extents -= n;
        self.store.unlink(key, f.gen);
        n
    }

    /// Drops a file and logs it.
    fn drop_file(&mut self, key: Key) -> u64 {
        let n = self.drop_file_quiet(key);
        self.log.append(&[Rec::DropFile { key }]);
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
        if self.files.get(&key).is_some_and(|f| version > f.version) {
            c.invalidated = self.drop_file(key);
        }
        c
    }

    /// The extents holding bytes `[off, off + len)` of the file at `version`, if all of
    /// them are held, and the cache file to read them from.
    pub fn lookup(&mut self, key: Key, version: u64, off: u64, len: u64) -> Option<Found> {
        let f = self.files.get(&key)?;
        if f.version != version || len == 0 {
            return None;
        }
        let end = off.checked_add(len)?;
        let gen = f.gen;
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
            pieces.push(Piece { off: eoff, len: e.len as u64, crcs: e.crcs.clone(), id: e.id, verified: e.verified });
            pos = eend;
        }
        if pos < end {
            return None;
        }
        let fds = self.store.fds(key, gen, false)?;
        for p in &pieces {
            self.clock += 1;
            let f = self.files.get_mut(&key).expect("looked up above");
            let e = f.extents.get_mut(&p.off).expect("looked up above");
            self.lru.remove(&e.tick);
            e.tick = self.clock;
            self.lru.insert(self.clock, (key, p.off));
        }
        Some(Found { pieces, fds })
    }

    /// The extents of `ids` passed their checksums on a read. The cache file's stamp
    /// is taken now if it has none (a change after this one refuses it as a backing
    /// file).
    pub fn checked(&mut self, key: Key, ids: &[u64]) {
        let Some(f) = self.files.get_mut(&key) else { return };
        for e in f.extents.values_mut() {
            if ids.contains(&e.id) {
                e.verified = true;
            }
        }
        if f.stamp.is_none() && !f.busy {
            f.stamp = crate::store::stamp_of(&self.store.path(key, f.gen));
        }
    }

    /// Drops the extent `id` at `off` if it is still there (a read found its bytes
    /// damaged). True if it was.
    pub fn drop_damaged(&mut self, key: Key, off: u64, id: u64) -> bool {
        self.at_once(|idx| {
            let same = idx.files.get(&key).and_then(|f| f.extents.get(&off)).is_some_and(|e| e.id == id);
            if same {
                idx.drop_extent(key, off);
            }
            same
        })
    }

    fn pinned(&self, key: Key) -> bool {
        self.files.get(&key).is_some_and(|f| self.pinned.contains_key(&(key, f.gen)))
    }

    fn drop_extent(&mut self, key: Key, off: u64) {
        if self.pinned(key) {
            // A reader reads the cache file itself (a backing file): its bytes stay
            // as they are, and the cache lets go of the whole file.
            self.drop_file(key);
            return;
        }
        let Some(f) = self.files.get_mut(&key) else { return };
        let Some(e) = f.extents.remove(&off) else { return };
        let gen = f.gen;
        let empty = f.extents.is_empty() && f.filling == 0;
        self.lru.remove(&e.tick);
        self.used -= pages_of(off, e.len as u64);
        self.extents -= 1;
        self.log.append(&[Rec::Drop { key, off }]);
        if empty {
            self.drop_file(key);
        } else {
            self.dead.push(Dead { key, gen, start: off, end: off + e.len as u64 });
        }
    }

    /// Cuts `[from, to)` out of the extent at `off` (a fill of those bytes replaces
    /// them): what lies before `from` and after `to` stays, in whole pages of the
    /// extent, so their checksums stay those of the extent.
    fn trim_extent(&mut self, key: Key, off: u64, from: u64, to: u64, recs: &mut Vec<Rec>) {
        let Some(f) = self.files.get_mut(&key) else { return };
        let Some(e) = f.extents.remove(&off) else { return };
        self.lru.remove(&e.tick);
        self.used -= pages_of(off, e.len as u64);
        self.extents -= 1;
        recs.push(Rec::Drop { key, off });
        let end = off + e.len as u64;
        let first_page = off / PAGE;
        let head_end = from / PAGE * PAGE;
        if head_end > off {
            let crcs = e.crcs[..(head_end.div_ceil(PAGE) - first_page) as usize].to_vec();
            self.keep_part(key, off, head_end - off, crcs, e.verified, recs);
        }
        let tail = to.div_ceil(PAGE) * PAGE;
        if tail < end {
            let crcs = e.crcs[(tail / PAGE - first_page) as usize..].to_vec();
            self.keep_part(key, tail, end - tail, crcs, e.verified, recs);
        }
    }

    fn keep_part(&mut self, key: Key, off: u64, len: u64, crcs: Vec<u32>, verified: bool, recs: &mut Vec<Rec>) {
        self.used += pages_of(off, len);
        self.insert_extent(key, off, len as u32, crcs.clone(), verified);
        recs.push(Rec::Put { key, off, len: len as u32, crcs });
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

    /// Space for a fill of `len` bytes at `off`, evicting the least recently used
    /// extents as needed, and the cache file it goes to; `None` if the ticket no longer
    /// holds or no space can be made.
    pub fn reserve(&mut self, t: &Ticket, off: u64, len: u64, c: &mut Changed) -> Option<Reserved> {
        let bytes = pages_of(off, len);
        if !self.valid(t) || len == 0 || bytes > self.capacity || off.checked_add(len).is_none() {
            return None;
        }
        if self.files.get(&t.key).is_some_and(|f| t.version > f.version) {
            c.invalidated += self.drop_file(t.key);
        }
        if self.files.get(&t.key).is_some_and(|f| f.version == t.version && covered(f, off, off + len)) {
            // Held already (a read-ahead and the read it served both fill).
            return None;
        }
        let mut skipped = Vec::new();
        while self.used + bytes > self.capacity {
            let Some((tick, (key, eoff))) = self.lru.pop_first() else { break };
            if self.pinned(key) {
                skipped.push((tick, (key, eoff)));
                continue;
            }
            // Put back for drop_extent to take out (it keeps the LRU in step).
            self.lru.insert(tick, (key, eoff));
            self.drop_extent(key, eoff);
            c.evicted += 1;
        }
        self.lru.extend(skipped);
        if self.used + bytes > self.capacity {
            return None;
        }
        if !self.files.contains_key(&t.key) {
            let gen = self.next_gen;
            self.next_gen += 1;
            self.files.insert(t.key, FileIdx::new(t.version, gen, self.forgotten_inval));
            self.log.append(&[Rec::Version { key: t.key, version: t.version, gen }]);
        }
        let f = self.files.get_mut(&t.key).expect("inserted above");
        f.filling += 1;
        f.busy = true;
        self.used += bytes;
        Some(Reserved { gen: f.gen, bytes })
    }

    /// Files the fill written under `r` for `[off, off + len)` (its checksums per file
    /// page), if the ticket and the cache file still hold; otherwise gives the space
    /// back and marks the bytes for punching.
    pub fn commit(&mut self, t: &Ticket, r: Reserved, off: u64, len: u64, crcs: Vec<u32>) -> bool {
        let same_file = self.files.get(&t.key).is_some_and(|f| f.gen == r.gen);
        if !same_file || !self.valid(t) {
            self.abandon(t.key, r, off, len);
            return false;
        }
        // Another fill of some of the same bytes (of the same version) may have landed
        // meanwhile: this one takes over what they overlap, and they keep the rest.
        let f = self.files.get(&t.key).expect("checked above");
        let mut recs = Vec::new();
        for o in overlapping(f, off, len) {
            self.trim_extent(t.key, o, off, off + len, &mut recs);
        }
        let mut pos = off;
        let mut crcs = crcs.into_iter();
        while pos < off + len {
            let n = (EXTENT_MAX - pos % EXTENT_MAX).min(off + len - pos);
            let mine: Vec<u32> = crcs.by_ref().take((pages_of(pos, n) / PAGE) as usize).collect();
            self.used += pages_of(pos, n);
            self.insert_extent(t.key, pos, n as u32, mine.clone(), true);
            recs.push(Rec::Put { key: t.key, off: pos, len: n as u32, crcs: mine });
            pos += n;
        }
        self.end_fill(t.key, r);
        self.log.append(&recs);
        if self.log.bytes > 2 * self.log.live + COMPACT_SLACK {
            if let Err(e) = self.rewrite() {
                tracing::warn!("SSD cache: rewriting the index log failed: {e}");
            }
        }
        true
    }

    /// Gives back the space of a fill that was not written.
    pub fn abandon(&mut self, key: Key, r: Reserved, off: u64, len: u64) {
        self.end_fill(key, r);
        self.dead.push(Dead { key, gen: r.gen, start: off, end: off + len });
        self.forget_if_empty(key);
    }

    /// Ends a reservation: its space is given back (a commit takes it again per extent).
    /// True if the file is still the one the fill wrote to.
    fn end_fill(&mut self, key: Key, r: Reserved) -> bool {
        self.used -= r.bytes;
        match self.files.get_mut(&key) {
            Some(f) if f.gen == r.gen => {
                f.filling -= 1;
                true
            }
            _ => false,
        }
    }

    fn forget_if_empty(&mut self, key: Key) {
        if self.files.get(&key).is_some_and(|f| f.extents.is_empty() && f.filling == 0) {
            self.drop_file(key);
        }
    }

    /// The pages to punch out of cache files now: of the ranges dropped since the last
    /// call, those of files still held where no extent lies.
    pub fn take_dead(&mut self) -> Vec<(Key, u64, Arc<Fds>, u64, u64)> {
        let mut out = Vec::new();
        for d in std::mem::take(&mut self.dead) {
            let Some(f) = self.files.get(&d.key).filter(|f| f.gen == d.gen) else { continue };
            let mut page = d.start / PAGE;
            let last = d.end.div_ceil(PAGE);
            let mut holes = Vec::new();
            while page < last {
                // The first page from `page` that some extent touches, and past it.
                let touched = f
                    .extents
                    .range(..last * PAGE)
                    .rev()
                    .take_while(|(&o, e)| o + e.len as u64 > page * PAGE)
                    .map(|(&o, e)| (o / PAGE, (o + e.len as u64).div_ceil(PAGE)))
                    .filter(|&(_, to)| to > page)
                    .min();
                match touched {
                    Some((from, to)) if from <= page => page = to,
                    Some((from, to)) => {
                        holes.push((page, from.min(last)));
                        page = to;
                    }
                    None => {
                        holes.push((page, last));
                        page = last;
                    }
                }
            }
            if holes.is_empty() {
                continue;
            }
            let Some(fds) = self.store.fds(d.key, d.gen, false) else { continue };
            // Until the fill thread stamps it after punching (see `Index::backing`).
            self.files.get_mut(&d.key).expect("looked up above").busy = true;
            for (from, to) in holes {
                out.push((d.key, d.gen, fds.clone(), from * PAGE, (to - from) * PAGE));
            }
        }
        out
    }

    /// The cache file of `key` at `gen`, created if need be (for the fill thread).
    pub fn fds_for_fill(&mut self, key: Key, gen: u64) -> Option<Arc<Fds>> {
        self.store.fds(key, gen, true)
    }

    /// Notes the cache file's inode and change time after this process changed it (the
    /// fill thread, after each batch; a grant, after sizing the file).
    pub fn stamp(&mut self, key: Key, gen: u64, stamp: Option<Stamp>) {
        if let Some(f) = self.files.get_mut(&key).filter(|f| f.gen == gen) {
            f.stamp = stamp;
            f.busy = false;
        }
    }

    /// The cache file of `key` if it holds all `size` bytes of the file at `version`,
    /// each checked by this process, unchanged since: it can serve the file's reads
    /// itself. Pinned until [`Index::unpin`]: the cache keeps it whole meanwhile (a
    /// change through this client lets go of it instead of changing it).
    pub fn backing(&mut self, key: Key, version: u64, size: u64) -> Result<(PathBuf, u64), Refused> {
        let f = self.files.get(&key).filter(|f| f.version == version).ok_or(Refused::Incomplete)?;
        if f.filling > 0 || f.busy {
            return Err(Refused::Busy);
        }
        let mut pos = 0;
        for (&o, e) in &f.extents {
            if o != pos {
                tracing::debug!(
                    extents = ?f.extents.iter().map(|(o, e)| (*o, e.len)).collect::<Vec<_>>(),
                    "SSD cache: not held whole"
                );
                return Err(Refused::Incomplete);
            }
            if !e.verified {
                return Err(Refused::Unchecked);
            }
            pos = o + e.len as u64;
        }
        if pos != size || size == 0 {
            tracing::debug!(
                extents = ?f.extents.iter().map(|(o, e)| (*o, e.len)).collect::<Vec<_>>(),
                size,
                "SSD cache: not held whole"
            );
            return Err(Refused::Incomplete);
        }
        let path = self.store.path(key, f.gen);
        let now = crate::store::stamp_of(&path);
        if now.is_none() || now != f.stamp {
            // Checked again by the next reads before it serves as a backing file.
            let f = self.files.get_mut(&key).expect("looked up above");
            for e in f.extents.values_mut() {
                e.verified = false;
            }
            f.stamp = None;
            return Err(Refused::Changed);
        }
        *self.pinned.entry((key, f.gen)).or_default() += 1;
        Ok((path, f.gen))
    }

    /// A backing file handed out by [`Index::backing`] was let go.
    pub fn unpin(&mut self, key: Key, gen: u64) {
        if let Some(n) = self.pinned.get_mut(&(key, gen)) {
            *n -= 1;
            if *n == 0 {
                self.pinned.remove(&(key, gen));
            }
        }
    }

    /// The fill thread is done with the cache file of `key` at `gen` without changing
    /// it (it could not be opened).
    pub fn unbusy(&mut self, key: Key, gen: u64) {
        if let Some(f) = self.files.get_mut(&key).filter(|f| f.gen == gen) {
            f.busy = false;
        }
    }

    /// Space the cache may hold, and holds.
    pub fn space(&self) -> (u64, u64) {
        (self.capacity, self.used)
    }

    /// Everything goes.
    pub fn clear(&mut self) -> std::io::Result<u64> {
        let n = self.extents;
        let keys: Vec<Key> = self.files.keys().copied().collect();
        for k in keys {
            // A file with fills under way stays as an empty entry for them to land in.
            if self.files.get(&k).is_some_and(|f| f.filling > 0) && !self.pinned(k) {
                let hit: Vec<u64> = self.files[&k].extents.keys().copied().collect();
                for o in hit {
                    self.drop_extent(k, o);
                }
            } else {
                self.drop_file_quiet(k);
            }
        }
        self.forgotten_inval = self.inval_clock.fetch_add(1, Ordering::AcqRel) + 1;
        for f in self.files.values_mut() {
            f.last_inval = self.forgotten_inval;
        }
        self.rewrite()?;
        Ok(n)
    }

    fn live_estimate(&self) -> u64 {
        // A Put frame is about 30 bytes and 4 per page; a Version frame about 40.
        let mut b = 0;
        for f in self.files.values() {
            b += 40;
            for e in f.extents.values() {
                b += 30 + 4 * e.crcs.len() as u64;
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
        frame(&mut out, &Rec::Header { magic: MAGIC, capacity: self.capacity, cluster: self.cluster });
        for (&key, f) in &self.files {
            frame(&mut out, &Rec::Version { key, version: f.version, gen: f.gen });
            for (&off, e) in &f.extents {
                frame(&mut out, &Rec::Put { key, off, len: e.len, crcs: e.crcs.clone() });
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

impl FileIdx {
    fn new(version: u64, gen: u64, last_inval: u64) -> FileIdx {
        FileIdx { version, gen, last_inval, extents: BTreeMap::new(), filling: 0, busy: false, stamp: None }
    }
}

/// Whether the file's extents hold every byte of `[from, to)`.
fn covered(f: &FileIdx, from: u64, to: u64) -> bool {
    let mut pos = from;
    let Some(first) = f.extents.range(..=from).next_back().map(|(&o, _)| o) else { return false };
    for (&o, e) in f.extents.range(first..) {
        if pos >= to || o > pos {
            break;
        }
        pos = pos.max(o + e.len as u64);
    }
    pos >= to
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
    /// Cache files no record names (left by a fill a crash cut short), removed.
    pub removed: u64,
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
                Rec::Put { crcs, .. } => self.live += 30 + 4 * crcs.len() as u64,
                Rec::Version { .. } => self.live += 40,
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
    fn checksums_go_by_file_page_and_space_by_whole_pages() {
        assert_eq!(pages_of(0, 4096), 4096);
        assert_eq!(pages_of(0, 1), 4096);
        assert_eq!(pages_of(4095, 2), 8192, "two pages touched");
        assert_eq!(pages_of(1000, 300_000), 303_104);
        assert_eq!(pages_of(5, 0), 0);
        let data = vec![7u8; 10_000];
        let crcs = page_crcs(1000, &data);
        assert_eq!(crcs.len(), 3, "pages 0, 1 and 2");
        assert_eq!(crcs[0], crc32c::crc32c(&data[..3096]));
        assert_eq!(crcs[1], crc32c::crc32c(&data[3096..7192]));
        assert_eq!(crcs[2], crc32c::crc32c(&data[7192..]));
        assert_eq!(page_crcs(8192, &data[..4096]).len(), 1);
    }
}
