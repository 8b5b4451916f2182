//! Statahead (after Lustre's llite statahead): the attributes of a directory's
//! entries fetched in bulk once lookups are seen walking it.
//!
//! A job that opens or stats the files of a directory one by one (a small-file
//! reader, `find`, `ls -l` without readdirplus, a checkpoint loader) costs one MDS
//! round trip per lookup, and the kernel looks every name up before its open. When
//! lookups keep missing in one directory, the client asks the MDS for the attributes
//! of the next [`CHUNK`] entries after the name that missed
//! ([`proto::Request::MdsStatahead`]), in the background, and answers the lookups that
//! follow from them.
//!
//! What keeps the answers right:
//! - **Age.** An entry serves lookups for at most [`TTL`] after its request was sent,
//!   and once: after that the kernel caches the answer itself, for its own entry and
//!   attribute timeouts. Another client's change is seen at most that late, the
//!   staleness the kernel's cache has already (Lustre protects its statahead entries
//!   with locks; braid bounds them in time, as its kernel cache is bounded).
//! - **This client's own changes.** Every request of this client that may change
//!   metadata (anything but lookups, listings, reads, read-only opens and closes
//!   without a size) moves an epoch ([`Statahead::changed`]); entries fetched under an
//!   older epoch are never served. A write, rename or unlink here is seen by the next
//!   lookup here, as without statahead.
//! - **Who asks.** The MDS lists for the caller's credentials (read and search
//!   permission on the directory); an entry is served only to the same credentials.
//!
//! What it costs: a directory whose lookups do not follow its entries (random stats of
//! a large directory) would have most of each chunk thrown away. A directory whose
//! chunks served fewer than one entry in [`USE_MIN`] stops fetching for [`BACKOFF`];
//! at most [`ENTRIES_MAX`] entries and [`DIRS_MAX`] directories are tracked.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use proto::msg::{Attr, Creds, Request};
use proto::Fid;

/// Entries one statahead request asks for.
pub const CHUNK: u32 = 1024;
/// How long after its request an entry may answer a lookup.
pub const TTL: Duration = Duration::from_secs(1);
/// Most entries kept at once (about 300 bytes each).
pub const ENTRIES_MAX: usize = 32 * 1024;
/// Most directories whose lookups are followed.
pub const DIRS_MAX: usize = 1024;
/// Lookups that must miss in a directory, each within [`TTL`] of the last, before
/// its entries are fetched.
const MISSES_TO_START: u32 = 4;
/// A directory whose fetched entries served fewer than one in this many lookups...
const USE_MIN: u64 = 8;
/// ...(judged once it has fetched this many)...
const JUDGED_AFTER: u64 = 4 * CHUNK as u64;
/// Fetches remembered per directory for that judgment.
const FETCHES_KEPT: usize = 64;
/// ...fetches nothing for this long.
const BACKOFF: Duration = Duration::from_secs(10);

/// Whether `req` changes nothing that a lookup answers: every other request of this
/// client moves the statahead epoch.
pub(crate) fn changes_nothing(req: &Request) -> bool {
    match req {
        Request::MdsLookup { .. }
        | Request::MdsGetattr { .. }
        | Request::MdsReaddir { .. }
        | Request::MdsStatahead { .. }
        | Request::MdsReaddirPlus { .. }
        | Request::MdsReadlink { .. }
        | Request::MdsGetxattr { .. }
        | Request::MdsListxattr { .. }
        | Request::MdsStatfs { .. }
        | Request::MdsGetDirLayout { .. }
        | Request::MdsDomRead { .. }
        | Request::MdsDomGetattr { .. }
        | Request::MdsSetLock { .. }
        | Request::MdsGetLock { .. }
        | Request::MdsAncestors { .. }
        | Request::MdsLeaseCancel { .. }
        | Request::MdsCloseMany { .. }
        | Request::OstRead { .. }
        | Request::OstGetattr { .. }
        | Request::OstStatfs { .. } => true,
        Request::MdsOpen { flags, .. } | Request::MdsOpenAt { flags, .. } => !flags.write && !flags.truncate,
        Request::MdsClose { size, .. } => size.is_none(),
        _ => false,
    }
}

struct Entry {
    attr: Attr,
    sent: Instant,
    epoch: u64,
    creds: Creds,
}

struct Scan {
    misses: u32,
    last_miss: Instant,
    fetching: bool,
    /// Fetches since the directory was last judged: when, and how many entries.
    fetches: VecDeque<(Instant, u64)>,
    /// Lookups its entries answered since then.
    used: u64,
    idle_until: Option<Instant>,
}

impl Scan {
    fn new(now: Instant) -> Scan {
        Scan { misses: 0, last_miss: now, fetching: false, fetches: VecDeque::new(), used: 0, idle_until: None }
    }

    /// Whether the entries fetched so far mostly went unused: judged on fetches whose
    /// entries have all aged out (those still fresh may yet be used), once they add up
    /// to [`JUDGED_AFTER`] entries; the counts start again after each judgment.
    fn wasteful(&mut self, now: Instant) -> bool {
        let aged: u64 = self.fetches.iter().filter(|(at, _)| now.duration_since(*at) >= TTL).map(|(_, n)| n).sum();
        if aged < JUDGED_AFTER {
            return false;
        }
        let wasted = self.used * USE_MIN < aged;
        self.fetches.clear();
        self.used = 0;
        wasted
    }
}

#[derive(Default)]
struct State {
    entries: HashMap<(Fid, String), Entry>,
    dirs: HashMap<Fid, Scan>,
}

/// One client's statahead: its fetched entries and the directories it follows.
#[derive(Default)]
pub struct Statahead {
    state: Mutex<State>,
    epoch: AtomicU64,
}

/// A fetch to send: directory, the name to list after, and the epoch it starts in.
pub(crate) struct Fetch {
    pub dir: Fid,
    pub after: String,
    pub epoch: u64,
    pub sent: Instant,
}

impl Statahead {
    /// How many times this client changed metadata so far (see [`Statahead::changed`]).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// This client sent a request that may change what lookups answer.
    pub(crate) fn changed(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The attributes of `name` in `dir` for `creds`, if a fetch brought them and they
    /// still hold; an entry answers once.
    pub(crate) fn take(&self, dir: Fid, name: &str, creds: &Creds) -> Option<Attr> {
        let mut s = self.state.lock().expect("statahead");
        let e = s.entries.remove(&(dir, name.to_string()))?;
        let fresh = e.sent.elapsed() < TTL && e.epoch == self.epoch.load(Ordering::Acquire);
        if !fresh || e.creds != *creds {
            return None;
        }
        if let Some(scan) = s.dirs.get_mut(&dir) {
            scan.used += 1;
        }
        Some(e.attr)
    }

    /// A lookup of `name` in `dir` missed: the fetch to start, if lookups there have
    /// missed often enough and no fetch of it is under way.
    pub(crate) fn missed(&self, dir: Fid, name: &str) -> Option<Fetch> {
        let now = Instant::now();
        let mut s = self.state.lock().expect("statahead");
        if !s.dirs.contains_key(&dir) && s.dirs.len() >= DIRS_MAX {
            s.dirs.retain(|_, d| d.fetching || now.duration_since(d.last_miss) < TTL);
            if s.dirs.len() >= DIRS_MAX {
                return None;
            }
        }
        let scan = s.dirs.entry(dir).or_insert_with(|| Scan::new(now));
        if now.duration_since(scan.last_miss) >= TTL {
            scan.misses = 0;
        }
        scan.misses += 1;
        scan.last_miss = now;
        if scan.idle_until.is_some_and(|t| now < t) {
            return None;
        }
        if scan.wasteful(now) {
            // The directory's lookups do not follow its entries.
            scan.idle_until = Some(now + BACKOFF);
            return None;
        }
        if scan.fetching || scan.misses < MISSES_TO_START {
            return None;
        }
        scan.fetching = true;
        // The names before this one were looked up already (they missed too).
        Some(Fetch { dir, after: name.to_string(), epoch: self.epoch.load(Ordering::Acquire), sent: now })
    }

    /// A fetch came back with `entries`.
    pub(crate) fn fill(&self, f: &Fetch, creds: &Creds, entries: Vec<(String, Attr)>) {
        let mut s = self.state.lock().expect("statahead");
        let n = entries.len() as u64;
        if let Some(scan) = s.dirs.get_mut(&f.dir) {
            scan.fetching = false;
            if scan.fetches.len() == FETCHES_KEPT {
                scan.fetches.pop_front();
            }
            scan.fetches.push_back((f.sent, n));
        }
        if self.epoch.load(Ordering::Acquire) != f.epoch {
            return;
        }
        if s.entries.len() + entries.len() > ENTRIES_MAX {
            s.entries.retain(|_, e| e.sent.elapsed() < TTL);
        }
        for (name, attr) in entries {
            if s.entries.len() >= ENTRIES_MAX {
                break;
            }
            s.entries.insert((f.dir, name), Entry { attr, sent: f.sent, epoch: f.epoch, creds: creds.clone() });
        }
    }

    /// A fetch failed (no permission, a striped directory, an MDS away): the
    /// directory's lookups go to the MDS alone for a while.
    pub(crate) fn failed(&self, f: &Fetch) {
        let mut s = self.state.lock().expect("statahead");
        if let Some(scan) = s.dirs.get_mut(&f.dir) {
            scan.fetching = false;
            scan.idle_until = Some(Instant::now() + BACKOFF);
        }
    }

    /// Entries kept now.
    pub fn entries(&self) -> usize {
        self.state.lock().expect("statahead").entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::msg::{FileKind, OpenFlags, Timespec};

    fn attr(oid: u32) -> Attr {
        let mut a = Attr::new_inode(Fid::new(0, 1, oid), FileKind::File, 0o644, &Creds::root(), 0, Timespec::default());
        a.size = 4096;
        a
    }

    fn walk(sa: &Statahead, dir: Fid, n: usize) -> Option<Fetch> {
        (0..n).find_map(|i| sa.missed(dir, &format!("f{i}")))
    }

    #[test]
    fn lookups_that_keep_missing_start_a_fetch_and_its_entries_answer_once() {
        let (sa, dir, root) = (Statahead::default(), Fid::new(0, 1, 100), Creds::root());
        assert!(walk(&sa, dir, (MISSES_TO_START - 1) as usize).is_none(), "too few misses to fetch");
        let f = sa.missed(dir, "f3").expect("a fetch once lookups keep missing");
        assert_eq!(f.after, "f3");
        assert!(sa.missed(dir, "f4").is_none(), "one fetch of a directory at a time");
        sa.fill(&f, &root, vec![("f5".into(), attr(5)), ("f6".into(), attr(6))]);
        assert_eq!(sa.take(dir, "f5", &root).map(|a| a.fid), Some(Fid::new(0, 1, 5)));
        assert!(sa.take(dir, "f5", &root).is_none(), "an entry answers once");
        let other = Creds { uid: 1000, gid: 1000, groups: vec![] };
        assert!(sa.take(dir, "f6", &other).is_none(), "only the credentials it was listed for");
    }

    #[test]
    fn a_change_of_this_client_makes_fetched_entries_useless() {
        let (sa, dir, root) = (Statahead::default(), Fid::new(0, 1, 100), Creds::root());
        let f = walk(&sa, dir, 10).unwrap();
        sa.fill(&f, &root, vec![("a".into(), attr(1))]);
        sa.changed();
        assert!(sa.take(dir, "a", &root).is_none(), "fetched before a change here");

        let f = walk(&sa, dir, 10).unwrap();
        sa.changed();
        sa.fill(&f, &root, vec![("b".into(), attr(2))]);
        assert!(sa.take(dir, "b", &root).is_none(), "a change while the fetch was out");
        assert_eq!(sa.entries(), 0);
    }

    #[test]
    fn a_directory_whose_lookups_do_not_follow_its_entries_stops_fetching() {
        let (sa, dir, root) = (Statahead::default(), Fid::new(0, 1, 100), Creds::root());
        let mut fetched = 0;
        for i in 0..100u32 {
            if let Some(mut f) = sa.missed(dir, &format!("r{i}")) {
                // Sent long enough ago that its entries have all aged out.
                f.sent -= TTL;
                let entries = (0..CHUNK).map(|j| (format!("x{i}-{j}"), attr(j))).collect();
                sa.fill(&f, &root, entries);
                fetched += 1;
            }
        }
        assert_eq!(fetched, (JUDGED_AFTER / CHUNK as u64) as usize, "fetches until judged wasteful");
    }

    #[test]
    fn read_only_requests_change_nothing_and_the_rest_do() {
        let fid = Fid::new(0, 1, 7);
        let read = OpenFlags { read: true, write: false, truncate: false };
        let write = OpenFlags { read: false, write: true, truncate: false };
        assert!(changes_nothing(&Request::MdsGetattr { fid }));
        assert!(changes_nothing(&Request::MdsOpen { creds: Creds::root(), fid, flags: read }));
        assert!(!changes_nothing(&Request::MdsOpen { creds: Creds::root(), fid, flags: write }));
        assert!(changes_nothing(&Request::MdsClose { fid, size: None, mtime: None, trunc_epoch: 0 }));
        assert!(!changes_nothing(&Request::MdsSizeUpdate {
            fid,
            size: 1,
            mtime: Some(Timespec::default()),
            trunc_epoch: 0,
            behind: None,
        }));
        assert!(!changes_nothing(&Request::MdsUnlink { creds: Creds::root(), parent: fid, name: "a".into() }));
    }
}
