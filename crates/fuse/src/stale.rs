//! Opens of unlinked files: a name the kernel cached, or a descriptor reopened?
//!
//! The kernel keeps a name for `entry_timeout` without asking the mount. When another
//! client unlinks the file or renames another over the name (an editor's save), an
//! open through the cached name reaches the mount as an OPEN of the old inode, which
//! the MDS now reports with no links. So does a reopen through `/proc/PID/fd` of a
//! file that is still open, which must work. The kernel tells them apart for us: an
//! open answered ESTALE is walked again with `LOOKUP_REVAL`, which looks names up
//! afresh (the cached name then leads to the file the name is now, or to ENOENT),
//! while a `/proc` link leads to the same inode. So the first OPEN of an unlinked file
//! by a thread answers ESTALE, and the same thread's next OPEN right after is served.
//!
//! The retry is served whatever file it opens: the name may have been replaced again
//! between the kernel's fresh lookup and its OPEN (a reader racing a writer that saves
//! over the name in a loop), and the kernel retries only once, so a second ESTALE
//! would reach the application. The file it opened was the name's a moment ago, whole,
//! as an open just before the rename would have found it. A retry that finds a linked
//! file settles the thread's turn too ([`StaleOpens::opened`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use client::Fid;

/// How long after an ESTALE the same thread's OPEN of the inode counts as the kernel's
/// retry of it.
const RETRY_WINDOW: Duration = Duration::from_secs(5);
/// Most ESTALE answers remembered at once; older ones are dropped first.
const REMEMBERED_MAX: usize = 1024;

#[derive(Default)]
pub struct StaleOpens {
    /// Threads whose last OPEN was answered ESTALE, and when.
    answered: Mutex<HashMap<u32, Instant>>,
}

impl StaleOpens {
    /// Whether thread `tid`'s OPEN of unlinked file `fid` is answered ESTALE: true
    /// unless it is the kernel's retry of an OPEN so answered.
    pub fn answer_stale(&self, fid: Fid, tid: u32) -> bool {
        let now = Instant::now();
        let mut m = self.answered.lock().expect("stale opens");
        if let Some(at) = m.remove(&tid) {
            if now.duration_since(at) < RETRY_WINDOW {
                return false;
            }
        }
        if m.len() >= REMEMBERED_MAX {
            m.retain(|_, at| now.duration_since(*at) < RETRY_WINDOW);
            if m.len() >= REMEMBERED_MAX {
                if let Some(oldest) = m.iter().min_by_key(|(_, at)| **at).map(|(k, _)| *k) {
                    m.remove(&oldest);
                }
            }
        }
        m.insert(tid, now);
        tracing::debug!(%fid, tid, "open of an unlinked file answered ESTALE");
        true
    }

    /// Thread `tid` opened a linked file: a retry it was owed is done.
    pub fn opened(&self, tid: u32) {
        let mut m = self.answered.lock().expect("stale opens");
        if !m.is_empty() {
            m.remove(&tid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fid(n: u64) -> Fid {
        Fid { seq: 1, oid: n as u32, ver: 0 }
    }

    #[test]
    fn the_first_open_is_stale_and_the_same_threads_retry_is_served() {
        let s = StaleOpens::default();
        assert!(s.answer_stale(fid(1), 10));
        // Another thread's open of the same file is its own first.
        assert!(s.answer_stale(fid(1), 11));
        assert!(!s.answer_stale(fid(1), 10));
        assert!(!s.answer_stale(fid(1), 11));
        // Served once: the next open is a new one.
        assert!(s.answer_stale(fid(1), 10));
    }

    #[test]
    fn a_retry_that_finds_the_name_replaced_again_is_served_and_one_that_finds_it_linked_ends_the_turn() {
        let s = StaleOpens::default();
        // The retry's fresh lookup found file 2, itself unlinked before its OPEN.
        assert!(s.answer_stale(fid(1), 10));
        assert!(!s.answer_stale(fid(2), 10));
        // A retry that opened a linked file: the thread's next stale open is a first.
        assert!(s.answer_stale(fid(3), 10));
        s.opened(10);
        assert!(s.answer_stale(fid(4), 10));
    }

    #[test]
    fn the_memory_stays_bounded() {
        let s = StaleOpens::default();
        for n in 0..(REMEMBERED_MAX as u32 * 3) {
            assert!(s.answer_stale(fid(n.into()), n));
        }
        assert!(s.answered.lock().unwrap().len() <= REMEMBERED_MAX);
        // The latest is still remembered.
        let last = REMEMBERED_MAX as u32 * 3 - 1;
        assert!(!s.answer_stale(fid(last.into()), last));
    }
}
