//! The byte-range locks this client holds, as the MDS granted them: what it replays
//! to an MDS it reconnects to (Lustre's lock replay in recovery).
//!
//! An MDS keeps locks in memory and drops a client's when its last connection
//! closes; after a restart it has none. A client that held locks then asks for each
//! again, marked as a reclaim (`MdsSetLock { reclaim: true }`): during the restarted
//! MDS's recovery window reclaims are granted while new lock requests of other clients
//! wait, so an application holding a lock never finds it silently given to another.
//! A reclaim that finds a conflict (the client came back after the window, and
//! another took the range meanwhile) is logged as a lost lock.
//!
//! The table mirrors the MDS's rules for one owner: setting a lock replaces the
//! owner's own locks over its range, splitting them; an unlock removes the range.
//! It is bounded by what the MDS granted (its own bound, `MAX_LOCKS` per MDT).

use std::collections::HashMap;
use std::sync::Mutex;

use proto::msg::{LockRequest, LockType};
use proto::Fid;

#[derive(Default)]
pub struct HeldLocks {
    by_fid: Mutex<HashMap<Fid, Vec<LockRequest>>>,
}

impl HeldLocks {
    /// Records what a granted `lock` (or unlock) of `fid` leaves held.
    pub fn apply(&self, fid: Fid, lock: &LockRequest) {
        let mut m = self.by_fid.lock().expect("held locks");
        let held = m.entry(fid).or_default();
        let mut kept = Vec::with_capacity(held.len() + 2);
        for h in held.drain(..) {
            if h.owner != lock.owner || h.end < lock.start || h.start > lock.end {
                kept.push(h);
                continue;
            }
            // The owner's lock overlaps: what lies outside the new range stays.
            if h.start < lock.start {
                kept.push(LockRequest { end: lock.start - 1, ..h });
            }
            if h.end > lock.end {
                kept.push(LockRequest { start: lock.end + 1, ..h });
            }
        }
        if lock.lock != LockType::Unlock {
            kept.push(*lock);
        }
        if kept.is_empty() {
            m.remove(&fid);
        } else {
            *held = kept;
        }
    }

    /// Forgets one lock (a reclaim the MDS refused).
    pub fn forget(&self, fid: Fid, lock: &LockRequest) {
        self.apply(fid, &LockRequest { lock: LockType::Unlock, ..*lock });
    }

    pub fn is_empty(&self) -> bool {
        self.by_fid.lock().expect("held locks").is_empty()
    }

    /// Every lock held on a file for which `pick` says yes.
    pub fn held(&self, pick: impl Fn(Fid) -> bool) -> Vec<(Fid, LockRequest)> {
        let m = self.by_fid.lock().expect("held locks");
        m.iter().filter(|(f, _)| pick(**f)).flat_map(|(f, locks)| locks.iter().map(|l| (*f, *l))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(owner: u64, lock: LockType, start: u64, end: u64) -> LockRequest {
        LockRequest { owner, pid: 7, lock, start, end }
    }

    #[test]
    fn the_table_follows_posix_splits_and_replacements_per_owner() {
        let t = HeldLocks::default();
        let f = Fid::new(0, 1, 1);
        t.apply(f, &req(1, LockType::Write, 0, 99));
        t.apply(f, &req(2, LockType::Read, 200, 299));
        // Owner 1 unlocks the middle: two pieces stay.
        t.apply(f, &req(1, LockType::Unlock, 40, 59));
        // Owner 1 turns part of one piece into a read lock.
        t.apply(f, &req(1, LockType::Read, 80, 89));
        let mut held: Vec<_> = t.held(|_| true).into_iter().map(|(_, l)| (l.owner, l.lock, l.start, l.end)).collect();
        held.sort_by_key(|h| (h.0, h.2));
        assert_eq!(
            held,
            vec![
                (1, LockType::Write, 0, 39),
                (1, LockType::Write, 60, 79),
                (1, LockType::Read, 80, 89),
                (1, LockType::Write, 90, 99),
                (2, LockType::Read, 200, 299),
            ]
        );
        assert!(t.held(|fid| fid != f).is_empty());
        t.apply(f, &req(1, LockType::Unlock, 0, u64::MAX));
        t.forget(f, &req(2, LockType::Read, 200, 299));
        assert!(t.is_empty(), "unlocking everything leaves nothing");
    }
}
