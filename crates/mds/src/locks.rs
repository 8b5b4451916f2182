//! Byte-range locks (POSIX `fcntl` and `flock`) held on behalf of clients.
//!
//! Locks live in the MDS's memory, per MDT, keyed by FID; an owner is the pair
//! (client id, the client's lock owner). Setting a lock replaces the owner's own locks
//! in that range (splitting them as POSIX does); two locks conflict when they overlap,
//! belong to different owners and at least one is a write lock. A client whose last
//! connection closes loses its locks, so a dead client never blocks the others.
//! Locks do not survive an MDS restart (Lustre replays them; braid does not yet).

use std::collections::HashMap;

use proto::msg::{LockInfo, LockRequest, LockType};
use proto::Fid;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    client: u64,
    owner: u64,
    pid: u32,
    write: bool,
    start: u64,
    /// Inclusive.
    end: u64,
}

/// Bound on locks held at once per MDT; beyond it new locks are refused.
pub const MAX_LOCKS: usize = 1 << 20;

#[derive(Default)]
pub struct LockTable {
    by_fid: HashMap<Fid, Vec<Held>>,
    count: usize,
}

fn overlaps(a_start: u64, a_end: u64, b_start: u64, b_end: u64) -> bool {
    a_start <= b_end && b_start <= a_end
}

impl LockTable {
    /// The first lock of another owner that conflicts with the request.
    pub fn conflict(&self, fid: Fid, client: u64, req: &LockRequest) -> Option<LockInfo> {
        let &LockRequest { owner, lock, start, end, .. } = req;
        let want_write = match lock {
            LockType::Unlock => return None,
            LockType::Write => true,
            LockType::Read => false,
        };
        self.by_fid.get(&fid)?.iter().find_map(|h| {
            let other = h.client != client || h.owner != owner;
            (other && (h.write || want_write) && overlaps(h.start, h.end, start, end)).then_some(LockInfo {
                lock: if h.write { LockType::Write } else { LockType::Read },
                start: h.start,
                end: h.end,
                pid: h.pid,
            })
        })
    }

    /// Applies a lock change of one owner (no conflict check). False when the table
    /// is full.
    pub fn set(&mut self, fid: Fid, client: u64, req: &LockRequest) -> bool {
        let &LockRequest { owner, pid, lock, start, end } = req;
        if lock != LockType::Unlock && self.count >= MAX_LOCKS {
            return false;
        }
        let list = self.by_fid.entry(fid).or_default();
        let before = list.len();
        let mut kept = Vec::with_capacity(list.len() + 2);
        for h in list.drain(..) {
            if h.client != client || h.owner != owner || !overlaps(h.start, h.end, start, end) {
                kept.push(h);
                continue;
            }
            // Keep the parts of our old lock outside the new range.
            if h.start < start {
                kept.push(Held { end: start - 1, ..h });
            }
            if h.end > end {
                kept.push(Held { start: end + 1, ..h });
            }
        }
        if lock != LockType::Unlock {
            kept.push(Held { client, owner, pid, write: lock == LockType::Write, start, end });
        }
        *list = kept;
        self.count = self.count + list.len() - before;
        if list.is_empty() {
            self.by_fid.remove(&fid);
        }
        true
    }

    /// Drops every lock of a client.
    pub fn release_client(&mut self, client: u64) -> usize {
        let mut dropped = 0;
        self.by_fid.retain(|_, list| {
            let n = list.len();
            list.retain(|h| h.client != client);
            dropped += n - list.len();
            !list.is_empty()
        });
        self.count -= dropped;
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: Fid = Fid::new(0, 1, 9);

    fn req(owner: u64, pid: u32, lock: LockType, start: u64, end: u64) -> LockRequest {
        LockRequest { owner, pid, lock, start, end }
    }

    #[test]
    fn conflicts_and_splits() {
        let mut t = LockTable::default();
        assert!(t.set(F, 1, &req(10, 100, LockType::Write, 0, 99)));
        assert!(t.conflict(F, 2, &req(20, 0, LockType::Read, 50, 60)).is_some());
        assert!(t.conflict(F, 1, &req(10, 0, LockType::Write, 50, 60)).is_none(), "own locks never conflict");
        assert!(t.conflict(F, 2, &req(20, 0, LockType::Read, 100, 200)).is_none());
        // Unlocking the middle leaves two pieces.
        t.set(F, 1, &req(10, 100, LockType::Unlock, 40, 59));
        assert!(t.conflict(F, 2, &req(20, 0, LockType::Write, 45, 50)).is_none());
        assert!(t.conflict(F, 2, &req(20, 0, LockType::Write, 30, 45)).is_some());
        assert!(t.conflict(F, 2, &req(20, 0, LockType::Write, 55, 70)).is_some());
        // Shared read locks coexist.
        t.set(F, 1, &req(10, 100, LockType::Unlock, 0, u64::MAX));
        t.set(F, 1, &req(10, 100, LockType::Read, 0, u64::MAX));
        assert!(t.conflict(F, 2, &req(20, 0, LockType::Read, 0, 10)).is_none());
        assert!(t.conflict(F, 2, &req(20, 0, LockType::Write, 0, 10)).is_some());
        assert_eq!(t.release_client(1), 1);
        assert!(t.conflict(F, 2, &req(20, 0, LockType::Write, 0, 10)).is_none());
        assert_eq!(t.count, 0);
    }
}
