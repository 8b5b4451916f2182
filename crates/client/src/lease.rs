//! The directory leases this client holds (see the MDS's `lease` module).
//!
//! The MDS grants a lease on a directory this client makes, and revokes it (a
//! callback on the connection it was granted on) before another client changes the
//! directory's entries. While the lease holds, every name in the directory was put
//! there by this client, so a lookup of a name it does not know is answered here:
//! ENOENT without a round trip. That is the LOOKUP before every `open(O_CREAT)` in a
//! directory a job made for its files.
//!
//! A lease is relied on only while the session it was granted in is trusted
//! ([`Session::trusted`]): its connection alive and an answer heard on it recently
//! enough that the MDS cannot have given up on this client. The table forgets a lease
//! on any doubt: a change in the directory that failed or whose outcome is unknown,
//! an answer that contradicts it, a revocation, a full table. Forgetting is always
//! safe; it only costs the lookups their round trip again. Leases forgotten without
//! a revocation are given back to the MDS (`MdsLeaseCancel`), so its table of them
//! does not fill with leases nobody uses.
//!
//! A name goes into the table before the request that makes it is sent, and never
//! leaves it (a name the table knows is looked up at the MDS): so neither a request
//! whose caller gave up, nor answers to concurrent requests handled out of order, can
//! leave a name in the directory that the table calls absent.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use proto::msg::Callback;
use proto::Fid;
use rpc::Session;

/// Most directories leased at once; a new lease pushes out the least recently used.
const DIRS_MAX: usize = 4096;
/// Most names remembered over all leased directories; a directory whose next name
/// would pass it loses its lease.
const NAMES_MAX: usize = 1 << 20;
/// Revocations remembered that came before the answer granting their lease was
/// handled (the MDS may send one while that answer is still on its way).
const EARLY_MAX: usize = 1024;
/// Leases given up and not yet reported to the MDS; past this the oldest are not
/// reported (the MDS then keeps them until it revokes them or the connection ends).
const CANCELS_MAX: usize = 4096;
/// Cancels are sent in batches of this many.
pub const CANCEL_BATCH: usize = 64;

struct Held {
    id: u64,
    session: Session,
    names: HashSet<String>,
    /// When it last answered a lookup or learned a name (a tick of [`State::clock`]).
    used: u64,
}

#[derive(Default)]
struct State {
    by_dir: HashMap<Fid, Held>,
    names: usize,
    clock: u64,
    /// Revocations of leases not installed (yet), and when they came.
    early: VecDeque<(Fid, u64, Instant)>,
    /// No lease is installed before then: revocations were forgotten (see `note_early`).
    refuse_until: Option<Instant>,
    cancels: Vec<(Fid, u64)>,
}

impl State {
    /// Stops relying on the lease on `dir`; `give_back` also reports it to the MDS
    /// (not for a revoked lease, nor one whose connection is gone with its leases).
    fn forget(&mut self, dir: Fid, give_back: bool) {
        if let Some(h) = self.by_dir.remove(&dir) {
            self.names -= h.names.len();
            if give_back && h.session.alive() {
                self.give_back(dir, h.id);
            }
        }
    }

    /// Queues lease `id` on `dir` to be reported to the MDS as given up.
    fn give_back(&mut self, dir: Fid, id: u64) {
        if self.cancels.len() >= CANCELS_MAX {
            self.cancels.remove(0);
        }
        self.cancels.push((dir, id));
    }

    /// Remembers the revocation of a lease not installed; `keep` is how long its
    /// grant may still be on its way (a request's deadline).
    fn note_early(&mut self, dir: Fid, lease: u64, keep: Duration) {
        let now = Instant::now();
        while self.early.front().is_some_and(|e| now.duration_since(e.2) > keep) {
            self.early.pop_front();
        }
        if self.early.len() >= EARLY_MAX {
            // Too many to remember: forget them all, and install no lease until any
            // grant they could cancel has arrived.
            self.early.clear();
            self.refuse_until = Some(now + keep);
        }
        self.early.push_back((dir, lease, now));
    }
}

/// The directory leases of one client.
pub struct DirLeases {
    state: Mutex<State>,
    /// How long after a revocation its grant may still arrive: the request deadline.
    keep: Duration,
}

/// Whether a lookup of `name` is one the MDS would answer ENOENT, or an error of its
/// own (an invalid or overlong name): only the former is answered from a lease.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 255 && name != "." && name != ".." && !name.contains(['/', '\0'])
}

impl DirLeases {
    /// A table whose callers' requests give up after `request_timeout`.
    pub fn new(request_timeout: Duration) -> DirLeases {
        DirLeases { state: Mutex::default(), keep: request_timeout }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes lease `id` on the new (empty) directory `dir`, granted in `session`.
    pub fn install(&self, dir: Fid, id: u64, session: Session) {
        let mut s = self.lock();
        if let Some(i) = s.early.iter().position(|e| (e.0, e.1) == (dir, id)) {
            s.early.remove(i);
            return;
        }
        if s.refuse_until.is_some_and(|t| Instant::now() < t) {
            // Revocations were forgotten: this grant may be one of theirs.
            s.give_back(dir, id);
            return;
        }
        if s.by_dir.len() >= DIRS_MAX {
            let stale: Vec<Fid> = s.by_dir.iter().filter(|(_, h)| !h.session.trusted()).map(|(d, _)| *d).collect();
            for d in stale {
                s.forget(d, true);
            }
            if s.by_dir.len() >= DIRS_MAX {
                let victim = s.by_dir.iter().min_by_key(|(_, h)| h.used).map(|(d, _)| *d).expect("the table is full");
                s.forget(victim, true);
            }
        }
        s.clock += 1;
        let used = s.clock;
        s.by_dir.insert(dir, Held { id, session, names: HashSet::new(), used });
    }

    /// Whether `name` is known to be absent from `dir`: a lease on `dir` holds and no
    /// name this client put there is `name`.
    pub fn absent(&self, dir: Fid, name: &str) -> bool {
        if !plain_name(name) {
            return false;
        }
        let mut s = self.lock();
        s.clock += 1;
        let now = s.clock;
        let Some(h) = s.by_dir.get_mut(&dir) else { return false };
        if !h.session.trusted() {
            // A stale session may become fresh again with the next answer; a dead one
            // never does.
            if !h.session.alive() {
                s.forget(dir, false);
            }
            return false;
        }
        h.used = now;
        !h.names.contains(name)
    }

    /// This client is about to put `name` into `dir`; true when the table did not
    /// know the name yet.
    pub fn add(&self, dir: Fid, name: &str) -> bool {
        let mut s = self.lock();
        let full = s.names >= NAMES_MAX;
        let Some(h) = s.by_dir.get(&dir) else { return false };
        if h.names.contains(name) {
            return false;
        }
        if full {
            s.forget(dir, true);
            return false;
        }
        s.clock += 1;
        let now = s.clock;
        let h = s.by_dir.get_mut(&dir).expect("checked above");
        h.names.insert(name.to_string());
        h.used = now;
        s.names += 1;
        true
    }

    /// Adds `name` to the lease on `dir` if the lease is trusted now and says the name
    /// is new: the lease's id when this client may answer a create of it itself (the
    /// create names it, see `proto::Request::MdsCreateGranted`).
    pub fn claim(&self, dir: Fid, name: &str) -> Option<u64> {
        if !plain_name(name) {
            return None;
        }
        let mut s = self.lock();
        if s.names >= NAMES_MAX {
            return None;
        }
        let h = s.by_dir.get_mut(&dir)?;
        if !h.session.trusted() || h.names.contains(name) {
            return None;
        }
        h.names.insert(name.to_string());
        let id = h.id;
        s.clock += 1;
        let now = s.clock;
        let h = s.by_dir.get_mut(&dir).expect("checked above");
        h.used = now;
        s.names += 1;
        Some(id)
    }

    /// Stops relying on the lease on `dir`, if any, and gives it back to the MDS.
    pub fn forget(&self, dir: Fid) {
        self.lock().forget(dir, true);
    }

    /// Leases given up since the last call, once a batch of them is ready (or all of
    /// them with `all`): (directory, lease id), to send to the MDS.
    pub fn take_cancels(&self, all: bool) -> Vec<(Fid, u64)> {
        let mut s = self.lock();
        if all || s.cancels.len() >= CANCEL_BATCH {
            std::mem::take(&mut s.cancels)
        } else {
            Vec::new()
        }
    }

    /// Directories leased now (for tests and statistics).
    pub fn len(&self) -> usize {
        self.lock().by_dir.len()
    }

    /// Whether a lease on `dir` is held now.
    pub fn holds(&self, dir: Fid) -> bool {
        self.lock().by_dir.contains_key(&dir)
    }

    /// Whether a lease on `dir` is held now and may be relied on.
    pub fn trusted(&self, dir: Fid) -> bool {
        self.trusted_id(dir).is_some()
    }

    /// The id of the lease on `dir`, if it is held now and may be relied on.
    pub fn trusted_id(&self, dir: Fid) -> Option<u64> {
        self.lock().by_dir.get(&dir).filter(|h| h.session.trusted()).map(|h| h.id)
    }
}

impl DirLeases {
    /// Carries out a revocation: the lease is not relied on from now.
    pub fn revoked(&self, cb: &Callback) {
        match *cb {
            Callback::RevokeLease { dir, lease } => {
                let mut s = self.lock();
                match s.by_dir.get(&dir) {
                    Some(h) if h.id == lease => s.forget(dir, false),
                    // Not installed yet: its grant is still on its way to this client.
                    _ => s.note_early(dir, lease, self.keep),
                }
            }
            // Only an OST's local socket sends it, never an MDS.
            Callback::ObjectDestroyed { .. } => {}
            // Every lease of the previous run is gone with its connection already.
            Callback::Recovered => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Fid = Fid::new(0, 0x400, 7);
    const E: Fid = Fid::new(0, 0x400, 8);
    const KEEP: Duration = Duration::from_secs(30);

    #[test]
    fn names_put_in_a_leased_directory_are_present_and_others_absent() {
        let t = DirLeases::new(KEEP);
        assert!(!t.absent(D, "x"), "no lease, no answer");
        t.install(D, 1, Session::InProcess);
        assert!(t.absent(D, "x"));
        assert!(t.add(D, "x"));
        assert!(!t.add(D, "x"), "known already");
        assert!(!t.absent(D, "x"));
        for odd in ["", ".", "..", "a/b", &"n".repeat(256)] {
            assert!(!t.absent(D, odd), "{odd:?} is the MDS's to answer");
        }
        t.revoked(&Callback::RevokeLease { dir: D, lease: 1 });
        assert!(!t.absent(D, "y"), "a revoked lease answers nothing");
        assert_eq!(t.len(), 0);
        assert!(t.take_cancels(true).is_empty(), "a revoked lease is not given back");
    }

    #[test]
    fn a_revocation_that_overtakes_its_grant_cancels_it() {
        let t = DirLeases::new(KEEP);
        t.revoked(&Callback::RevokeLease { dir: D, lease: 5 });
        t.install(D, 5, Session::InProcess);
        assert!(!t.absent(D, "x"));
        // A later lease on the same directory (a new id) is not cancelled by it.
        t.install(D, 6, Session::InProcess);
        assert!(t.absent(D, "x"));
        // A revocation of an older lease leaves the current one.
        t.revoked(&Callback::RevokeLease { dir: D, lease: 5 });
        assert!(t.absent(D, "x"));
    }

    #[test]
    fn early_revocations_expire_after_the_request_deadline_and_too_many_refuse_installs() {
        let t = DirLeases::new(Duration::from_millis(20));
        t.revoked(&Callback::RevokeLease { dir: D, lease: 5 });
        std::thread::sleep(Duration::from_millis(40));
        t.revoked(&Callback::RevokeLease { dir: E, lease: 9 });
        // No grant can arrive after its request's deadline: the stale entry is gone.
        assert_eq!(t.lock().early.len(), 1);

        let t = DirLeases::new(KEEP);
        for i in 0..=EARLY_MAX as u64 {
            t.revoked(&Callback::RevokeLease { dir: E, lease: 100 + i });
        }
        // Revocations were forgotten: a grant now might be one of theirs.
        t.install(D, 5, Session::InProcess);
        assert!(!t.absent(D, "x"), "no lease is installed");
        assert_eq!(t.take_cancels(true), [(D, 5)], "and the grant is given back");
    }

    #[test]
    fn a_full_table_pushes_out_the_least_recently_used_lease_and_gives_it_back() {
        let t = DirLeases::new(KEEP);
        let dir = |i: u32| Fid::new(0, 0x400, 100 + i);
        for i in 0..DIRS_MAX as u32 {
            t.install(dir(i), i as u64, Session::InProcess);
            t.add(dir(i), "a");
        }
        assert!(t.absent(dir(0), "b"), "the oldest lease is used again");
        t.install(dir(DIRS_MAX as u32), 99_999, Session::InProcess);
        assert_eq!(t.len(), DIRS_MAX);
        assert!(t.absent(dir(0), "b"), "a lease in use stays");
        assert!(!t.absent(dir(1), "b"), "the least recently used one went");
        assert!(t.take_cancels(false).is_empty(), "one cancel is not a batch yet");
        assert_eq!(t.take_cancels(true), [(dir(1), 1)]);
        let s = t.lock();
        assert_eq!(s.names, s.by_dir.values().map(|h| h.names.len()).sum::<usize>());
    }
}
