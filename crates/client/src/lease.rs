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
//! safe; it only costs the lookups their round trip again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use proto::msg::Callback;
use proto::rpc::{CallbackHandler, Session};
use proto::Fid;

/// Most directories leased at once; a new lease pushes out an old one.
const DIRS_MAX: usize = 4096;
/// Most names remembered over all leased directories; a directory whose next name
/// would pass it loses its lease.
const NAMES_MAX: usize = 1 << 20;
/// Revocations remembered that came before the answer granting their lease was
/// handled (the MDS may send one while that answer is still on its way).
const EARLY_MAX: usize = 1024;

struct Held {
    id: u64,
    session: Session,
    names: HashSet<String>,
}

#[derive(Default)]
struct State {
    by_dir: HashMap<Fid, Held>,
    names: usize,
    early: VecDeque<(Fid, u64)>,
}

impl State {
    fn forget(&mut self, dir: Fid) {
        if let Some(h) = self.by_dir.remove(&dir) {
            self.names -= h.names.len();
        }
    }
}

/// The directory leases of one client.
#[derive(Default)]
pub struct DirLeases {
    state: Mutex<State>,
}

impl DirLeases {
    /// Takes lease `id` on the new (empty) directory `dir`, granted in `session`.
    pub fn install(&self, dir: Fid, id: u64, session: Session) {
        let mut s = self.state.lock().expect("leases");
        if let Some(i) = s.early.iter().position(|e| *e == (dir, id)) {
            s.early.remove(i);
            return;
        }
        if s.by_dir.len() >= DIRS_MAX {
            s.by_dir.retain(|_, h| h.session.trusted());
            let total: usize = s.by_dir.values().map(|h| h.names.len()).sum();
            s.names = total;
            if s.by_dir.len() >= DIRS_MAX {
                let victim = *s.by_dir.keys().next().expect("the table is full");
                s.forget(victim);
            }
        }
        s.by_dir.insert(dir, Held { id, session, names: HashSet::new() });
    }

    /// Whether `name` is known to be absent from `dir`: a lease on `dir` holds and no
    /// name this client put there is `name`.
    pub fn absent(&self, dir: Fid, name: &str) -> bool {
        let mut s = self.state.lock().expect("leases");
        let Some(h) = s.by_dir.get(&dir) else { return false };
        if !h.session.trusted() {
            // A stale session may become fresh again with the next answer; a dead one
            // never does.
            if !h.session.alive() {
                s.forget(dir);
            }
            return false;
        }
        !h.names.contains(name)
    }

    /// This client put `name` into `dir`.
    pub fn added(&self, dir: Fid, name: &str) {
        let mut s = self.state.lock().expect("leases");
        let full = s.names >= NAMES_MAX;
        let Some(h) = s.by_dir.get_mut(&dir) else { return };
        if full {
            s.forget(dir);
            return;
        }
        if h.names.insert(name.to_string()) {
            s.names += 1;
        }
    }

    /// This client took `name` out of `dir`.
    pub fn removed(&self, dir: Fid, name: &str) {
        let mut s = self.state.lock().expect("leases");
        if s.by_dir.get_mut(&dir).is_some_and(|h| h.names.remove(name)) {
            s.names -= 1;
        }
    }

    /// Stops relying on the lease on `dir`, if any.
    pub fn forget(&self, dir: Fid) {
        self.state.lock().expect("leases").forget(dir);
    }

    /// Directories leased now (for tests and statistics).
    pub fn len(&self) -> usize {
        self.state.lock().expect("leases").by_dir.len()
    }
}

impl CallbackHandler for DirLeases {
    fn callback(&self, cb: &Callback) {
        match *cb {
            Callback::RevokeLease { dir, lease } => {
                let mut s = self.state.lock().expect("leases");
                match s.by_dir.get(&dir) {
                    Some(h) if h.id == lease => s.forget(dir),
                    // Not installed yet: its grant is still on its way to this client.
                    _ => {
                        if s.early.len() >= EARLY_MAX {
                            s.early.pop_front();
                        }
                        s.early.push_back((dir, lease));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Fid = Fid::new(0, 0x400, 7);

    #[test]
    fn names_put_in_a_leased_directory_are_present_and_others_absent() {
        let t = DirLeases::default();
        assert!(!t.absent(D, "x"), "no lease, no answer");
        t.install(D, 1, Session::InProcess);
        assert!(t.absent(D, "x"));
        t.added(D, "x");
        assert!(!t.absent(D, "x"));
        t.removed(D, "x");
        assert!(t.absent(D, "x"));
        t.callback(&Callback::RevokeLease { dir: D, lease: 1 });
        assert!(!t.absent(D, "x"), "a revoked lease answers nothing");
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn a_revocation_that_overtakes_its_grant_cancels_it() {
        let t = DirLeases::default();
        t.callback(&Callback::RevokeLease { dir: D, lease: 5 });
        t.install(D, 5, Session::InProcess);
        assert!(!t.absent(D, "x"));
        // A later lease on the same directory (a new id) is not cancelled by it.
        t.install(D, 6, Session::InProcess);
        assert!(t.absent(D, "x"));
        // A revocation of an older lease leaves the current one.
        t.callback(&Callback::RevokeLease { dir: D, lease: 5 });
        assert!(t.absent(D, "x"));
    }

    #[test]
    fn a_full_table_pushes_a_lease_out_and_names_stay_counted() {
        let t = DirLeases::default();
        for i in 0..DIRS_MAX as u32 + 1 {
            let d = Fid::new(0, 0x400, 100 + i);
            t.install(d, i as u64, Session::InProcess);
            t.added(d, "a");
        }
        assert_eq!(t.len(), DIRS_MAX);
        let s = t.state.lock().unwrap();
        assert_eq!(s.names, s.by_dir.values().map(|h| h.names.len()).sum::<usize>());
    }
}
