//! Which files this mount knows to have no `security.capability`.
//!
//! The kernel asks a file system for that xattr before every write (a write drops a
//! file's capabilities as it drops its set-user-ID bit), and the answer is almost always
//! that there is none: one MDS round trip per `write(2)` for nothing, half the cost of
//! writing a small file. So the answer "none" is remembered for the attribute cache
//! time, as the kernel remembers attributes, learned from an MDS answer or from having
//! created the file, and forgotten when this mount changes the file's xattrs. A
//! capability set from another client within that time is seen once it passes, as a
//! mode change from another client is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use client::Fid;

/// The xattr the kernel asks for before every write.
pub const CAPS_XATTR: &str = "security.capability";

/// Most files remembered; past it the memory starts over.
const NOCAPS_MAX: usize = 65536;

pub struct NoCaps {
    ttl: Duration,
    known: Mutex<HashMap<Fid, Instant>>,
    /// Bumped by every [`NoCaps::forget`]: an answer asked for before a forget may
    /// predate the xattr change and is not remembered.
    forgets: AtomicU64,
}

impl NoCaps {
    pub fn new(ttl: Duration) -> NoCaps {
        NoCaps { ttl, known: Mutex::new(HashMap::new()), forgets: AtomicU64::new(0) }
    }

    /// Whether `fid` is known, within the cache time, to have no capability xattr.
    pub fn knows_none(&self, fid: Fid) -> bool {
        self.known.lock().expect("nocaps").get(&fid).is_some_and(|at| at.elapsed() < self.ttl)
    }

    /// Where the forgets stand: taken before asking the MDS, passed to
    /// [`NoCaps::note_none_asked_at`] with its answer.
    pub fn asked(&self) -> u64 {
        self.forgets.load(Ordering::Acquire)
    }

    /// `fid` has no capability xattr as of now.
    pub fn note_none(&self, fid: Fid) {
        self.note_none_asked_at(fid, self.asked());
    }

    /// The MDS, asked at `asked` ([`NoCaps::asked`]), said `fid` has no capability
    /// xattr: remembered unless this mount changed any xattr since.
    pub fn note_none_asked_at(&self, fid: Fid, asked: u64) {
        if self.ttl.is_zero() {
            return;
        }
        let mut known = self.known.lock().expect("nocaps");
        if self.forgets.load(Ordering::Acquire) != asked {
            return;
        }
        if known.len() >= NOCAPS_MAX {
            known.clear();
        }
        known.insert(fid, Instant::now());
    }

    /// This mount changed `fid`'s xattrs: ask the MDS again.
    pub fn forget(&self, fid: Fid) {
        let mut known = self.known.lock().expect("nocaps");
        self.forgets.fetch_add(1, Ordering::AcqRel);
        known.remove(&fid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_for_the_cache_time_and_forgotten_on_change() {
        let fid = Fid::new(1, 2, 0);
        let n = NoCaps::new(Duration::from_millis(50));
        assert!(!n.knows_none(fid));
        n.note_none(fid);
        assert!(n.knows_none(fid));
        n.forget(fid);
        assert!(!n.knows_none(fid));
        n.note_none(fid);
        std::thread::sleep(Duration::from_millis(60));
        assert!(!n.knows_none(fid), "past the cache time the MDS is asked again");
        // An answer asked for before a change is not remembered after it.
        let asked = n.asked();
        n.forget(fid);
        n.note_none_asked_at(fid, asked);
        assert!(!n.knows_none(fid), "an answer older than a change");
        let off = NoCaps::new(Duration::ZERO);
        off.note_none(fid);
        assert!(!off.knows_none(fid), "attr_timeout=0 caches nothing");
    }
}
