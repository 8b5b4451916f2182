//! Directory leases: Lustre's lookup/update lock on a directory, as a lease.
//!
//! A client that makes a directory may ask for a lease on it. While it holds the
//! lease, every change to the directory's entries is its own: before another client
//! changes them, the MDS revokes the lease with a callback on the connection it was
//! granted on. The holder thus knows every name in the directory and answers lookups
//! of absent names itself, which removes the LOOKUP round trip that precedes every
//! `open(O_CREAT)` in a directory a job made for its output.
//!
//! The MDS side is this table, consulted by the committer: a batch's change to the
//! entries of a directory leased by another client is taken back and answered with
//! [`crate::mdt::OpError::Leased`]; the request's handler revokes the lease and
//! submits the change again. A client relies on a lease only while its session is
//! trusted ([`rpc::Session::trusted`]); so a lease whose connection closed, or
//! whose holder did not ack a revocation (evicted), is dropped only
//! [`CALLBACK_TIMEOUT`] after that. Leases are not stored: after a restart the MDS
//! lets no change to any directory's entries through but the holders' replay of what
//! they did under leases, for [`CALLBACK_TIMEOUT`] (its recovery window, by which
//! time no client trusts a lease of the previous run) and until that replay has
//! landed (see `crate::recovery`).
//! Leases are granted only on new directories (the holder saw them empty); one that
//! was revoked is never granted again. A holder gives up leases it no longer wants
//! (`MdsLeaseCancel`), and holds at most [`HOLDER_MAX`] per connection. A directory
//! that is removed loses its lease without a revocation: its entries cannot change
//! any more, and a lookup in it is ENOENT whoever answers.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use proto::Fid;
use rpc::server::CALLBACK_TIMEOUT;

use crate::recovery::Recovery;

/// A lease on one directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub holder: u64,
    /// The connection it was granted on: revocations go there, and it ends with it.
    pub conn: u64,
    pub id: u64,
}

/// Most leases one MDT holds; past this, new directories get none.
pub const LEASES_MAX: usize = 1 << 20;

/// Most leases one client holds on one connection; past this, its new directories
/// get none until it cancels some. Twice what a client keeps (its table pushes old
/// leases out and cancels them), so cancels on their way do not stop new grants.
pub const HOLDER_MAX: usize = 8192;

/// A client's connection: (holder, connection id). The holder is part of the key
/// because every in-process client has the same connection id
/// ([`rpc::server::IN_PROCESS_CONN`]).
type Holder = (u64, u64);

/// The leases of one MDT.
#[derive(Default)]
pub struct DirLeases {
    by_dir: HashMap<Fid, Lease>,
    /// The directories leased to each holder: what a closed connection or an
    /// eviction drops, found without scanning every lease.
    by_holder: HashMap<Holder, HashSet<Fid>>,
    next_id: u64,
    /// The first id of this run: lower ids are of leases an earlier run granted.
    first_id: u64,
    /// After a restart, whether a change made under a lease of the previous run is
    /// still its holder's replay.
    recovery: Option<Arc<Recovery>>,
    /// Holders whose connection closed while leases were granted on it, and when:
    /// those leases stay until [`CALLBACK_TIMEOUT`] has passed since.
    closed: HashMap<Holder, Instant>,
}

/// What becomes of a change a client answered itself under a lease (see
/// [`DirLeases::answered_under`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// The lease holds: the change is its holder's, on the connection it was granted on.
    Held { conn: u64 },
    /// The lease is of the previous run, and the recovery still waits for its holder.
    Replay,
    /// The lease is gone (revoked from a holder that did not answer), or it is of the
    /// previous run and its holder came back too late: the change is refused.
    Gone,
}

impl DirLeases {
    /// The leases of an MDT opened now, with its `recovery` if it restarted. Ids
    /// start from the clock, so that they rise across runs: those of an earlier run
    /// are below [`DirLeases::first_id`]'s.
    pub(crate) fn starting(recovery: Option<Arc<Recovery>>) -> DirLeases {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let next_id = now.as_nanos() as u64;
        DirLeases { next_id, first_id: next_id + 1, recovery, ..DirLeases::default() }
    }

    /// Whether a change `holder` made itself under lease `lease` on `dir` (a create
    /// or an unlink it answered, sent later) may be applied: Lustre evicts a client
    /// that does not answer a callback, and refuses what it sends afterwards.
    pub fn answered_under(&self, dir: Fid, lease: u64, holder: u64) -> Answered {
        match self.by_dir.get(&dir) {
            Some(l) if l.id == lease && l.holder == holder => Answered::Held { conn: l.conn },
            _ if lease < self.first_id && self.recovery.as_ref().is_some_and(|r| r.admits_replay(holder)) => {
                Answered::Replay
            }
            _ => Answered::Gone,
        }
    }

    pub fn get(&self, dir: Fid) -> Option<Lease> {
        self.by_dir.get(&dir).copied()
    }

    /// Grants a lease on the new directory `dir`; `None` when the MDT's table or the
    /// holder's share of it is full.
    pub fn grant(&mut self, dir: Fid, holder: u64, conn: u64) -> Option<u64> {
        let held = self.by_holder.get(&(holder, conn)).map_or(0, HashSet::len);
        if self.by_dir.len() >= LEASES_MAX || held >= HOLDER_MAX {
            return None;
        }
        self.forget(dir);
        self.next_id += 1;
        let id = self.next_id;
        self.by_dir.insert(dir, Lease { holder, conn, id });
        self.by_holder.entry((holder, conn)).or_default().insert(dir);
        Some(id)
    }

    /// Drops the lease on `dir` if it is still lease `id`.
    pub fn remove(&mut self, dir: Fid, id: u64) {
        if self.by_dir.get(&dir).is_some_and(|l| l.id == id) {
            self.forget(dir);
        }
    }

    /// Drops lease `id` on `dir` if `holder` holds it on `conn`: the holder gave it up
    /// itself. A lease of another holder stays, whatever the request says.
    pub fn cancel(&mut self, dir: Fid, id: u64, holder: u64, conn: u64) {
        if self.by_dir.get(&dir) == Some(&Lease { holder, conn, id }) {
            self.forget(dir);
        }
    }

    /// The directory is gone (removed, or a batch that made it was taken back).
    pub fn forget(&mut self, dir: Fid) {
        if let Some(l) = self.by_dir.remove(&dir) {
            let key = (l.holder, l.conn);
            if let Some(dirs) = self.by_holder.get_mut(&key) {
                dirs.remove(&dir);
                if dirs.is_empty() {
                    self.by_holder.remove(&key);
                    self.closed.remove(&key);
                }
            }
        }
    }

    /// Connection `conn` of client `holder` closed at `at`.
    pub fn connection_closed(&mut self, holder: u64, conn: u64, at: Instant) {
        if self.by_holder.contains_key(&(holder, conn)) {
            self.closed.insert((holder, conn), at);
        }
    }

    /// When connection `conn` of `holder` closed, if it did while holding leases.
    pub fn closed_at(&self, holder: u64, conn: u64) -> Option<Instant> {
        self.closed.get(&(holder, conn)).copied()
    }

    /// Drops every lease `holder` was granted on connection `conn` (it closed, or was
    /// evicted, at least [`CALLBACK_TIMEOUT`] ago; or it is an in-process client that
    /// is gone).
    pub fn drop_connection(&mut self, holder: u64, conn: u64) {
        for dir in self.by_holder.remove(&(holder, conn)).unwrap_or_default() {
            self.by_dir.remove(&dir);
        }
        self.closed.remove(&(holder, conn));
    }

    /// Drops the leases of connections that closed [`CALLBACK_TIMEOUT`] or more before
    /// `now`.
    pub fn sweep(&mut self, now: Instant) {
        let done: Vec<Holder> = self
            .closed
            .iter()
            .filter(|(_, at)| now.duration_since(**at) >= CALLBACK_TIMEOUT)
            .map(|(c, _)| *c)
            .collect();
        for (holder, conn) in done {
            self.drop_connection(holder, conn);
        }
    }

    pub fn len(&self) -> usize {
        self.by_dir.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_dir.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const D: Fid = Fid::new(0, 0x400, 7);
    const E: Fid = Fid::new(0, 0x400, 8);

    #[test]
    fn leases_end_by_id_by_directory_and_after_their_connection_closed() {
        let mut t = DirLeases::default();
        let a = t.grant(D, 1, 10).unwrap();
        let b = t.grant(E, 1, 11).unwrap();
        assert_ne!(a, b);
        assert_eq!(t.get(D), Some(Lease { holder: 1, conn: 10, id: a }));

        t.remove(D, a + 100);
        assert!(t.get(D).is_some(), "a stale id removes nothing");
        t.remove(D, a);
        assert!(t.get(D).is_none());

        // A closed connection's leases stay until the callback timeout has passed.
        let t0 = Instant::now();
        t.connection_closed(1, 12, t0);
        assert_eq!(t.closed_at(1, 12), None, "a connection without leases is not tracked");
        t.connection_closed(2, 11, t0);
        assert_eq!(t.closed_at(2, 11), None, "another client's connection of the same id");
        t.connection_closed(1, 11, t0);
        assert_eq!(t.closed_at(1, 11), Some(t0));
        t.sweep(t0 + CALLBACK_TIMEOUT - Duration::from_millis(1));
        assert!(t.get(E).is_some());
        t.sweep(t0 + CALLBACK_TIMEOUT);
        assert!(t.get(E).is_none() && t.closed_at(1, 11).is_none());
        assert!(t.is_empty());
    }

    #[test]
    fn a_change_answered_under_a_lease_passes_while_its_holder_holds_it_or_replays_it() {
        let mut t = DirLeases::starting(None);
        let id = t.grant(D, 1, 10).unwrap();
        assert_eq!(t.answered_under(D, id, 1), Answered::Held { conn: 10 });
        assert_eq!(t.answered_under(D, id, 2), Answered::Gone, "another client's");
        assert_eq!(t.answered_under(D, id + 1, 1), Answered::Gone, "another lease");
        t.drop_connection(1, 10);
        assert_eq!(t.answered_under(D, id, 1), Answered::Gone, "evicted");
        assert_eq!(t.answered_under(E, 5, 1), Answered::Gone, "an earlier run's, with no recovery");

        let recovery = Arc::new(Recovery::starting(0, false).expect("a restarted MDT's"));
        let t = DirLeases::starting(Some(recovery));
        assert_eq!(t.answered_under(E, 5, 1), Answered::Replay, "an earlier run's, in the window");
        assert!(t.first_id > 5 && t.first_id > id, "ids rise across runs");
    }

    #[test]
    fn in_process_holders_share_a_connection_id_but_not_their_leases() {
        let mut t = DirLeases::default();
        let conn = rpc::server::IN_PROCESS_CONN;
        t.grant(D, 1, conn).unwrap();
        t.grant(E, 2, conn).unwrap();
        t.drop_connection(1, conn);
        assert!(t.get(D).is_none());
        assert_eq!(t.get(E).map(|l| l.holder), Some(2), "client 2's lease is its own");
    }

    #[test]
    fn only_the_holder_cancels_and_a_holder_has_a_bounded_share() {
        let mut t = DirLeases::default();
        let id = t.grant(D, 1, 10).unwrap();
        t.cancel(D, id, 2, 10);
        t.cancel(D, id, 1, 11);
        t.cancel(D, id + 1, 1, 10);
        assert!(t.get(D).is_some(), "nobody but the holder, on its connection, cancels its lease");
        t.cancel(D, id, 1, 10);
        assert!(t.is_empty());

        for i in 0..HOLDER_MAX as u32 {
            assert!(t.grant(Fid::new(0, 0x400, 1000 + i), 1, 10).is_some());
        }
        assert_eq!(t.grant(D, 1, 10), None, "the holder's share is full");
        assert!(t.grant(D, 2, 20).is_some(), "another holder still gets leases");
        t.drop_connection(1, 10);
        assert_eq!(t.len(), 1);
        assert!(t.grant(E, 1, 10).is_some(), "dropped leases free the share");
    }
}
