//! Byte-range locks (POSIX `fcntl` and `flock`) held on behalf of clients.
//!
//! Locks live in the MDS's memory, per MDT, keyed by FID; an owner is the pair
//! (client id, the client's lock owner). Setting a lock replaces the owner's own locks
//! in that range (splitting them as POSIX does); two locks conflict when they overlap,
//! belong to different owners and at least one is a write lock. A client whose last
//! connection closes loses its locks, so a dead client never blocks the others.
//! Clients replay the locks they hold when they reconnect (the client's
//! `held_locks`), and after a restart other clients' lock requests wait for the
//! recovery window (see [`crate::recovery`]), as Lustre's lock replay.
//!
//! Waiting requests are known too, so that a wait that would close a cycle (A waits
//! on B, which waits on A) is refused with `EDEADLK`, as the Linux kernel does for
//! local POSIX locks and Lustre's `ldlm_flock_deadlock` across clients. Without it two
//! processes each holding what the other waits for hang forever. Cycles are seen
//! within one MDT's table (a lock's file lives on one MDT).

use std::collections::{HashMap, HashSet};

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

/// Who holds or waits for a lock: (client id, the client's lock owner).
type Owner = (u64, u64);

/// One waiting request, until its wait ends.
struct Waiting {
    id: u64,
    fid: Fid,
    req: LockRequest,
}

#[derive(Default)]
pub struct LockTable {
    by_fid: HashMap<Fid, Vec<Held>>,
    count: usize,
    /// The requests waiting now, by owner (an owner's threads may each wait). Bounded
    /// by the requests in flight: an entry lives only while its request waits.
    waiting: HashMap<Owner, Vec<Waiting>>,
    next_wait: u64,
}

fn overlaps(a_start: u64, a_end: u64, b_start: u64, b_end: u64) -> bool {
    a_start <= b_end && b_start <= a_end
}

impl LockTable {
    /// The owners of the locks that keep `client`'s request waiting.
    fn blockers<'a>(&'a self, fid: Fid, client: u64, req: &'a LockRequest) -> impl Iterator<Item = Owner> + 'a {
        let want_write = req.lock == LockType::Write;
        let active = req.lock != LockType::Unlock;
        self.by_fid.get(&fid).into_iter().flatten().filter_map(move |h| {
            let other = h.client != client || h.owner != req.owner;
            (active && other && (h.write || want_write) && overlaps(h.start, h.end, req.start, req.end))
                .then_some((h.client, h.owner))
        })
    }

    /// Whether waiting for `req` would wait on the requester itself: one of the owners
    /// in its way waits, directly or through other waiting owners, for a lock the
    /// requester holds.
    pub fn would_deadlock(&self, fid: Fid, client: u64, req: &LockRequest) -> bool {
        let me = (client, req.owner);
        let mut seen = HashSet::new();
        let mut next: Vec<Owner> = self.blockers(fid, client, req).collect();
        while let Some(o) = next.pop() {
            if o == me {
                return true;
            }
            if !seen.insert(o) {
                continue;
            }
            for w in self.waiting.get(&o).into_iter().flatten() {
                next.extend(self.blockers(w.fid, o.0, &w.req));
            }
        }
        false
    }

    /// `client`'s request begins to wait; the id ends it ([`LockTable::wait_ends`]).
    pub fn wait_begins(&mut self, fid: Fid, client: u64, req: &LockRequest) -> u64 {
        let id = self.next_wait;
        self.next_wait += 1;
        self.waiting.entry((client, req.owner)).or_default().push(Waiting { id, fid, req: *req });
        id
    }

    /// A wait of `client`'s `owner` ended (granted, timed out or abandoned).
    pub fn wait_ends(&mut self, client: u64, owner: u64, id: u64) {
        if let Some(list) = self.waiting.get_mut(&(client, owner)) {
            list.retain(|w| w.id != id);
            if list.is_empty() {
                self.waiting.remove(&(client, owner));
            }
        }
    }

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
        self.waiting.retain(|o, _| o.0 != client);
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

    #[test]
    fn a_wait_that_closes_a_cycle_is_a_deadlock() {
        const G: Fid = Fid::new(0, 1, 10);
        let mut t = LockTable::default();
        // Client 1's owner 10 holds F[0, 9]; client 2's owner 20 holds F[10, 19] and G.
        t.set(F, 1, &req(10, 1, LockType::Write, 0, 9));
        t.set(F, 2, &req(20, 2, LockType::Write, 10, 19));
        t.set(G, 2, &req(20, 2, LockType::Read, 0, 0));
        // 10 waits for F[10, 19]: nobody waits on 10 yet.
        let a = req(10, 1, LockType::Write, 10, 19);
        assert!(!t.would_deadlock(F, 1, &a));
        let id = t.wait_begins(F, 1, &a);
        // 20 asking for F[0, 9] would wait on 10, which waits on 20.
        assert!(t.would_deadlock(F, 2, &req(20, 2, LockType::Read, 5, 5)));
        // A third owner waiting on 10 does not close a cycle.
        assert!(!t.would_deadlock(F, 3, &req(30, 3, LockType::Write, 0, 0)));
        // Through another file and a third owner: 30 holds G's byte 5 and 20 waits
        // for it; 30 asking for F[0, 0] would wait on 10, which waits on 20, which
        // waits on 30.
        t.set(G, 3, &req(30, 3, LockType::Write, 5, 5));
        let w20 = t.wait_begins(G, 2, &req(20, 2, LockType::Write, 5, 5));
        assert!(t.would_deadlock(F, 3, &req(30, 3, LockType::Write, 0, 0)));
        // Once the waits end, nothing is in a cycle.
        t.wait_ends(1, 10, id);
        t.wait_ends(2, 20, w20);
        assert!(!t.would_deadlock(F, 2, &req(20, 2, LockType::Read, 5, 5)));
        assert!(!t.would_deadlock(F, 3, &req(30, 3, LockType::Write, 0, 0)));
        assert!(t.waiting.is_empty());
        // A client that goes away takes its waits with it.
        t.wait_begins(F, 1, &a);
        t.release_client(1);
        assert!(t.waiting.is_empty());
    }
}
