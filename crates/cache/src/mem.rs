//! A client's memory cache of file data: the bytes a native client read, kept in its
//! own memory so that a reread is answered without the OSTs.
//!
//! Why: a braid file reached through the native client has no page cache. Local block
//! servers (nbdkit's `file` plugin, `qemu-nbd`) answer rereads from the kernel's, and
//! Lustre's client keeps the pages it read; `braid nbd serve` without one sends every
//! reread of a hot block to an OSS. A mount does not need this: the kernel caches for it.
//!
//! The coherence rules are the SSD cache's (see the crate's documentation), kept in
//! memory only:
//! - **Lazy fill** from what a read brought back, never from what a write sends: a
//!   cached byte is one an OST (or the MDT) gave this client.
//! - **Invalidation** of the range a write, truncate or hole punch of this client
//!   changes, and refusal of a fill whose read was ticketed before such a change
//!   ([`Ticket`]: the cache's invalidation clock when the read began).
//! - **Data versions**: the cache holds one version per file; an open of a newer one
//!   drops the file's bytes, and a read is served only for the version its handle opened.
//!
//! Space: extents as they were read (slices of the read's buffer, not copies), the
//! least recently used evicted to stay under the capacity. A write into an extent
//! drops the whole extent.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};

use crate::index::Key;

/// A read's claim to fill what it brings back: refused if the file changed in this
/// client since it was taken.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    key: Key,
    version: u64,
    clock: u64,
}

/// Counters since the cache began.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemStats {
    pub capacity: u64,
    pub used: u64,
    pub extents: u64,
    pub hits: u64,
    pub misses: u64,
    pub evicted: u64,
    pub refused: u64,
}

/// File data in memory, at most `capacity` bytes of it.
pub struct MemCache {
    capacity: u64,
    /// Moves at every invalidation; a ticket older than a file's last one is refused.
    clock: AtomicU64,
    state: Mutex<State>,
    hits: AtomicU64,
    misses: AtomicU64,
}

#[derive(Default)]
struct State {
    files: HashMap<Key, FileData>,
    /// Extents by last use, oldest first: stamp -> (file, offset).
    lru: BTreeMap<u64, (Key, u64)>,
    next_stamp: u64,
    used: u64,
    /// The last invalidation of a file the cache no longer holds anything of (tickets
    /// older than it are refused for every such file).
    forgotten: u64,
    evicted: u64,
    refused: u64,
}

struct FileData {
    version: u64,
    last_inval: u64,
    /// Offset -> extent; extents never overlap.
    extents: BTreeMap<u64, Extent>,
}

struct Extent {
    data: Bytes,
    stamp: u64,
}

impl MemCache {
    pub fn new(capacity: u64) -> MemCache {
        MemCache {
            capacity,
            clock: AtomicU64::new(0),
            state: Mutex::new(State::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// A ticket for a read of file `key` at data `version` beginning now.
    pub fn ticket(&self, key: Key, version: u64) -> Ticket {
        Ticket { key, version, clock: self.clock.load(Ordering::Acquire) }
    }

    /// A handle of `key` was opened at `version`: bytes of an older version go.
    pub fn opened(&self, key: Key, version: u64) {
        let mut s = self.state.lock().expect("memory cache");
        if s.files.get(&key).is_some_and(|f| version > f.version) {
            s.drop_file(key);
        }
    }

    /// `[off, off + len)` of file `key` at `version`, if the cache holds all of it: a
    /// slice of one extent, or a copy of several adjacent ones.
    pub fn read(&self, key: Key, version: u64, off: u64, len: u64) -> Option<Bytes> {
        let found = self.lookup(key, version, off, len);
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    fn lookup(&self, key: Key, version: u64, off: u64, len: u64) -> Option<Bytes> {
        let end = off.checked_add(len).filter(|_| len > 0)?;
        let mut s = self.state.lock().expect("memory cache");
        let s = &mut *s;
        let f = s.files.get_mut(&key).filter(|f| f.version == version)?;
        let (&first, e) = f.extents.range(..=off).next_back()?;
        let first_end = first + e.data.len() as u64;
        if first_end <= off {
            return None;
        }
        if first_end >= end {
            let data = e.data.slice((off - first) as usize..(end - first) as usize);
            touch(&mut s.lru, &mut s.next_stamp, key, first, f.extents.get_mut(&first).expect("extent"));
            return Some(data);
        }
        // Several extents, each beginning where the one before ends.
        let mut pieces = vec![first];
        let mut pos = first_end;
        while pos < end {
            let e = f.extents.get(&pos)?;
            pieces.push(pos);
            pos += e.data.len() as u64;
        }
        let mut out = BytesMut::with_capacity(len as usize);
        for at in pieces {
            let e = f.extents.get_mut(&at).expect("extent");
            let from = off.max(at) - at;
            let to = (end.min(at + e.data.len() as u64)) - at;
            out.extend_from_slice(&e.data[from as usize..to as usize]);
            touch(&mut s.lru, &mut s.next_stamp, key, at, e);
        }
        Some(out.freeze())
    }

    /// What a read ticketed by `t` brought back from `off`, unless the file changed in
    /// this client since; makes room by evicting the least recently used extents.
    pub fn fill(&self, t: Ticket, off: u64, data: Bytes) {
        let len = data.len() as u64;
        if len == 0 || len > self.capacity || off.checked_add(len).is_none() {
            return;
        }
        let mut s = self.state.lock().expect("memory cache");
        let valid = match s.files.get(&t.key) {
            Some(f) => f.last_inval <= t.clock && t.version >= f.version,
            None => s.forgotten <= t.clock,
        };
        if !valid {
            s.refused += 1;
            return;
        }
        if s.files.get(&t.key).is_some_and(|f| t.version > f.version) {
            s.drop_file(t.key);
        }
        s.drop_range(t.key, off, len);
        while s.used + len > self.capacity {
            let Some((_, (key, at))) = s.lru.pop_first() else { break };
            s.remove_extent(key, at);
            s.evicted += 1;
        }
        let stamp = s.next_stamp;
        s.next_stamp += 1;
        s.lru.insert(stamp, (t.key, off));
        s.used += len;
        let f = s.files.entry(t.key).or_insert_with(|| FileData {
            version: t.version,
            last_inval: t.clock,
            extents: BTreeMap::new(),
        });
        let data = if data.len() >= COPY_FROM { populated_copy(&data) } else { data };
        f.extents.insert(off, Extent { data, stamp });
    }

    /// This client changed `[off, off + len)` of file `key` (a write, truncate or
    /// punch): the extents it touches go, and fills of reads ticketed before go too.
    pub fn invalidate(&self, key: Key, off: u64, len: u64) {
        let clock = self.clock.fetch_add(1, Ordering::AcqRel) + 1;
        let mut s = self.state.lock().expect("memory cache");
        match s.files.get_mut(&key) {
            Some(f) => f.last_inval = clock,
            None => {
                s.forgotten = clock;
                return;
            }
        }
        s.drop_range(key, off, len);
    }

    /// Everything goes.
    pub fn clear(&self) {
        let clock = self.clock.fetch_add(1, Ordering::AcqRel) + 1;
        let mut s = self.state.lock().expect("memory cache");
        let keys: Vec<Key> = s.files.keys().copied().collect();
        for k in keys {
            s.drop_file(k);
        }
        s.forgotten = clock;
    }

    pub fn stats(&self) -> MemStats {
        let s = self.state.lock().expect("memory cache");
        MemStats {
            capacity: self.capacity,
            used: s.used,
            extents: s.lru.len() as u64,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evicted: s.evicted,
            refused: s.refused,
        }
    }
}

/// Fills at least this long are copied into memory of the cache's own (see
/// [`populated_copy`]); shorter ones are kept as the slices they came as.
const COPY_FROM: usize = 64 << 10;

/// Anonymous memory mapped for one extent, unmapped with it.
struct Mapped {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is written once, before it is shared, and only read after.
unsafe impl Send for Mapped {}
// SAFETY: as above.
unsafe impl Sync for Mapped {}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped at `ptr`, initialized by `populated_copy`, live
        // until drop.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping `populated_copy` made; nothing refers to it any more.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// `data` copied into fresh memory mapped with its pages already in (`MAP_POPULATE`).
///
/// Why: keeping the read's own buffer keeps the allocator from reusing it, so every
/// later read lands in memory never touched, and each of its 4 KiB pages faults in on
/// first touch. A 1 GiB cold copy through the NBD export took 250,000 faults and twice
/// the export's CPU (578 MiB/s against 864 without the cache); one mapping populated by
/// the kernel and a copy cost far less (750 MiB/s). Falls back to the heap if the
/// mapping fails.
fn populated_copy(data: &[u8]) -> Bytes {
    let len = data.len();
    // SAFETY: a new private anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    let Some(ptr) = std::ptr::NonNull::new(p.cast::<u8>()).filter(|_| p != libc::MAP_FAILED) else {
        return Bytes::copy_from_slice(data);
    };
    // SAFETY: `len` writable bytes at `ptr`, not overlapping `data`.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr(), len) };
    Bytes::from_owner(Mapped { ptr, len })
}

/// Marks an extent just used.
fn touch(lru: &mut BTreeMap<u64, (Key, u64)>, next: &mut u64, key: Key, at: u64, e: &mut Extent) {
    lru.remove(&e.stamp);
    e.stamp = *next;
    *next += 1;
    lru.insert(e.stamp, (key, at));
}

impl State {
    /// Drops every extent overlapping `[off, off + len)` of file `key`.
    fn drop_range(&mut self, key: Key, off: u64, len: u64) {
        let Some(f) = self.files.get(&key) else { return };
        let end = off.saturating_add(len);
        let start = f.extents.range(..=off).next_back().map_or(off, |(&o, _)| o);
        let hit: Vec<u64> =
            f.extents.range(start..end).filter(|(&o, e)| o + e.data.len() as u64 > off).map(|(&o, _)| o).collect();
        for o in hit {
            self.remove_extent(key, o);
        }
    }

    fn remove_extent(&mut self, key: Key, at: u64) {
        let Some(f) = self.files.get_mut(&key) else { return };
        let Some(e) = f.extents.remove(&at) else { return };
        self.lru.remove(&e.stamp);
        self.used -= e.data.len() as u64;
        if f.extents.is_empty() {
            // Its invalidation clock lives on in `forgotten`.
            let last = f.last_inval;
            self.files.remove(&key);
            self.forgotten = self.forgotten.max(last);
        }
    }

    fn drop_file(&mut self, key: Key) {
        let Some(f) = self.files.remove(&key) else { return };
        for e in f.extents.values() {
            self.lru.remove(&e.stamp);
            self.used -= e.data.len() as u64;
        }
        self.forgotten = self.forgotten.max(f.last_inval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: u8, n: usize) -> Bytes {
        Bytes::from(vec![v; n])
    }

    #[test]
    fn a_read_is_served_from_what_was_filled_and_nothing_else() {
        let c = MemCache::new(1 << 20);
        assert_eq!(c.read(1, 5, 0, 4096), None);
        c.fill(c.ticket(1, 5), 0, bytes(7, 8192));
        assert_eq!(c.read(1, 5, 100, 4096).unwrap(), bytes(7, 4096));
        // Past what was filled, another version, another file: nothing.
        assert_eq!(c.read(1, 5, 4096, 8192), None);
        assert_eq!(c.read(1, 5, 50_000, 10), None);
        assert_eq!(c.read(1, 6, 0, 10), None);
        assert_eq!(c.read(2, 5, 0, 10), None);
        // Adjacent extents are read as one range.
        c.fill(c.ticket(1, 5), 8192, bytes(9, 4096));
        let both = c.read(1, 5, 4096, 8192).unwrap();
        assert_eq!(&both[..4096], &bytes(7, 4096)[..]);
        assert_eq!(&both[4096..], &bytes(9, 4096)[..]);
        let st = c.stats();
        assert_eq!((st.hits, st.misses, st.used), (2, 5, 12288));
    }

    #[test]
    fn a_write_drops_what_it_touches_and_refuses_fills_of_reads_begun_before_it() {
        let c = MemCache::new(1 << 20);
        c.fill(c.ticket(1, 1), 0, bytes(1, 4096));
        c.fill(c.ticket(1, 1), 4096, bytes(1, 4096));
        let before = c.ticket(1, 1);
        c.invalidate(1, 5000, 10);
        assert!(c.read(1, 1, 0, 4096).is_some(), "an extent the write missed stays");
        assert_eq!(c.read(1, 1, 4096, 4096), None);
        // A read begun before the write may have the old bytes: refused.
        c.fill(before, 4096, bytes(0, 4096));
        assert_eq!(c.read(1, 1, 4096, 4096), None);
        assert_eq!(c.stats().refused, 1);
        // One begun after it is taken.
        c.fill(c.ticket(1, 1), 4096, bytes(2, 4096));
        assert_eq!(c.read(1, 1, 4096, 4096).unwrap(), bytes(2, 4096));
        // A change of a file the cache holds nothing of still refuses older tickets.
        let old = c.ticket(3, 1);
        c.invalidate(3, 0, 1);
        c.fill(old, 0, bytes(3, 10));
        assert_eq!(c.read(3, 1, 0, 10), None);
        // The same after the file's last extent went.
        let old = c.ticket(1, 1);
        c.invalidate(1, 0, u64::MAX);
        c.fill(old, 0, bytes(4, 10));
        assert_eq!(c.read(1, 1, 0, 10), None);
        assert_eq!(c.stats().used, 0);
    }

    #[test]
    fn a_newer_version_replaces_the_file_and_an_older_one_is_refused() {
        let c = MemCache::new(1 << 20);
        c.fill(c.ticket(1, 2), 0, bytes(2, 100));
        c.fill(c.ticket(1, 1), 200, bytes(1, 100));
        assert_eq!(c.read(1, 1, 200, 100), None, "older than what the cache holds");
        c.opened(1, 2);
        assert!(c.read(1, 2, 0, 100).is_some(), "the same version stays at an open");
        c.opened(1, 3);
        assert_eq!(c.read(1, 2, 0, 100), None);
        assert_eq!(c.stats().used, 0);
        c.fill(c.ticket(1, 3), 0, bytes(3, 100));
        c.fill(c.ticket(1, 4), 100, bytes(4, 100));
        assert_eq!(c.read(1, 3, 0, 100), None, "a fill of a newer version dropped the older");
        assert!(c.read(1, 4, 100, 100).is_some());
    }

    #[test]
    fn long_fills_are_copied_whole_and_read_back_as_filled() {
        let c = MemCache::new(16 << 20);
        let data: Bytes = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into();
        c.fill(c.ticket(1, 1), 4096, data.clone());
        assert_eq!(c.read(1, 1, 4096, 1 << 20).unwrap(), data);
        assert_eq!(c.read(1, 1, 4096 + 1000, 5000).unwrap(), data.slice(1000..6000));
        c.invalidate(1, 0, 4096);
        assert_eq!(c.stats().used, 1 << 20, "a change before the extent leaves it");
        c.invalidate(1, 500_000, 1);
        assert_eq!(c.stats().used, 0, "the extent touched by the write went");
    }

    #[test]
    fn the_least_recently_used_go_first_and_the_cache_stays_within_its_size() {
        let c = MemCache::new(3 * 4096);
        for i in 0..3 {
            c.fill(c.ticket(1, 1), i * 4096, bytes(i as u8, 4096));
        }
        assert!(c.read(1, 1, 0, 1).is_some()); // extent 0 is now the most recent
        c.fill(c.ticket(2, 1), 0, bytes(9, 4096));
        assert!(c.read(1, 1, 0, 1).is_some());
        assert_eq!(c.read(1, 1, 4096, 1), None, "the least recently used went");
        assert!(c.read(1, 1, 8192, 1).is_some());
        // Overlapping fills replace, and the count of bytes stays exact.
        c.fill(c.ticket(2, 1), 0, bytes(8, 4096));
        assert_eq!(c.read(2, 1, 0, 4096).unwrap(), bytes(8, 4096));
        let st = c.stats();
        assert_eq!((st.used, st.extents, st.evicted), (3 * 4096, 3, 1));
        // Larger than the whole cache: not kept.
        c.fill(c.ticket(4, 1), 0, bytes(1, 4 * 4096));
        assert_eq!(c.read(4, 1, 0, 1), None);
        c.clear();
        assert_eq!(c.stats().used, 0);
        assert_eq!(c.read(2, 1, 0, 1), None);
    }
}
