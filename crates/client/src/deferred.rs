//! Flushes finished after close(2) returned: a file this client created in a
//! directory it holds the lease on.
//!
//! For close-to-open consistency a close waits until the handle's bytes and size are
//! where other clients look for them. That wait is for *other* clients: nobody else
//! can open a file without finding its name first. A file this client created in a
//! directory it holds the lease on (see [`crate::lease`]) has a name nobody else can
//! find yet, because the MDS takes the lease back before it lets another client look
//! in that directory (lookup, listing, open by name, create). So such a close
//! returns at once, the flush goes on in the background, and:
//!
//! - a revocation of any lease is acked only once every deferred flush is done
//!   ([`Deferred::idle`]): by the time another client may look, the bytes are there;
//! - this client's own requests to an MDS wait for them too, except those that cannot
//!   observe a file still being flushed (the flushes' own size reports and closes, and
//!   the create of a name the lease says is new): a reopen, a stat, a rename or an
//!   fsync here sees the flushed file, as it would have without the deferral;
//! - a rename or link made after the create takes the file out of that rule (its new
//!   name may be in a directory others can read): its close waits again.
//!
//! It is Lustre's and CephFS's write-back under a lock or capability, for the one
//! case where it needs no new state on the MDS. A small-file job writing into a
//! directory it made saves one round trip per file. Only files of at most
//! [`FILE_BYTES_MAX`] are deferred, at most [`DEFERRED_MAX`] and [`BYTES_MAX`] at once
//! (past that a close waits as before): a revocation waits for them all, and must be
//! acked well within the MDS's callback timeout (2 s). A deferred flush that
//! fails is logged and reported by the next fsync of the file in this client, as a
//! local file system reports a failed write-back.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use proto::Fid;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

/// Most flushes deferred at once.
pub const DEFERRED_MAX: usize = 256;
/// Largest file whose flush is deferred.
pub const FILE_BYTES_MAX: u64 = 1 << 20;
/// Most bytes of files whose flushes are deferred at once: drained in a fraction of
/// the callback timeout even at 100 MB/s.
pub const BYTES_MAX: u64 = 32 << 20;
/// Most failed deferred flushes remembered for the next fsync.
const FAILED_MAX: usize = 4096;

tokio::task_local! {
    /// Set on the tasks that carry out deferred flushes, and around requests that
    /// cannot observe a deferred file: their MDS requests do not wait for them.
    static EXEMPT: ();
}

/// Runs `fut` with its MDS requests not waiting for deferred flushes.
pub(crate) async fn exempt<F: std::future::Future>(fut: F) -> F::Output {
    EXEMPT.scope((), fut).await
}

/// Whether the current task's MDS requests skip the wait.
pub(crate) fn is_exempt() -> bool {
    EXEMPT.try_with(|_| ()).is_ok()
}

/// The deferred flushes of one client.
pub struct Deferred {
    running: AtomicUsize,
    bytes: AtomicU64,
    done: Notify,
    slots: Arc<Semaphore>,
    failed: Mutex<VecDeque<(Fid, String)>>,
    /// How many tickets name each file and directory (see [`Deferred::busy`]).
    keys: Mutex<HashMap<Fid, usize>>,
    /// Tickets that name no file.
    unkeyed: AtomicUsize,
    /// Moved by everyone who waits for the deferred work: work that holds itself
    /// back a little (a create waiting for its file's first bytes, see
    /// [`crate::async_create`]) goes at once.
    hurry: watch::Sender<u64>,
}

impl Default for Deferred {
    fn default() -> Self {
        Deferred {
            running: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
            done: Notify::new(),
            slots: Arc::new(Semaphore::new(DEFERRED_MAX)),
            failed: Mutex::new(VecDeque::new()),
            keys: Mutex::new(HashMap::new()),
            unkeyed: AtomicUsize::new(0),
            hurry: watch::channel(0).0,
        }
    }
}

/// One deferred flush under way; dropping it marks it done.
pub struct Ticket {
    owner: Arc<Deferred>,
    bytes: u64,
    /// The file and directory the work is on.
    keys: [Option<Fid>; 2],
    _slot: OwnedSemaphorePermit,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.keys.iter().any(Option::is_some) {
            let mut keys = self.owner.keys.lock().expect("deferred keys");
            for k in self.keys.iter().flatten() {
                if let Some(n) = keys.get_mut(k) {
                    *n -= 1;
                    if *n == 0 {
                        keys.remove(k);
                    }
                }
            }
        } else {
            self.owner.unkeyed.fetch_sub(1, Ordering::AcqRel);
        }
        self.owner.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        if self.owner.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.owner.done.notify_waiters();
        }
    }
}

impl Deferred {
    /// Counts the flush of a file of `bytes` about to be deferred, if it is small
    /// enough and there is room. Taken before the lease is checked: a revocation that
    /// comes after the check then waits for it.
    pub(crate) fn begin(self: &Arc<Self>, bytes: u64) -> Option<Ticket> {
        self.begin_on(bytes, [None, None])
    }

    /// [`Deferred::begin`] of work on file `keys[0]` in directory `keys[1]`: a
    /// request about another file or directory need not wait for it (see
    /// [`Deferred::busy`]).
    pub(crate) fn begin_on(self: &Arc<Self>, bytes: u64, keys: [Option<Fid>; 2]) -> Option<Ticket> {
        if bytes > FILE_BYTES_MAX {
            return None;
        }
        let slot = self.slots.clone().try_acquire_owned().ok()?;
        if self.bytes.fetch_add(bytes, Ordering::AcqRel) + bytes > BYTES_MAX {
            self.bytes.fetch_sub(bytes, Ordering::AcqRel);
            return None;
        }
        if keys.iter().any(Option::is_some) {
            let mut k = self.keys.lock().expect("deferred keys");
            for key in keys.iter().flatten() {
                *k.entry(*key).or_default() += 1;
            }
        } else {
            self.unkeyed.fetch_add(1, Ordering::AcqRel);
        }
        self.running.fetch_add(1, Ordering::AcqRel);
        Some(Ticket { owner: self.clone(), bytes, keys, _slot: slot })
    }

    /// Whether deferred work may be on `fid`: work counted without keys, or work on
    /// that file or in that directory.
    pub fn busy(&self, fid: Fid) -> bool {
        self.unkeyed.load(Ordering::Acquire) > 0 || self.keys.lock().expect("deferred keys").contains_key(&fid)
    }

    /// Flushes deferred now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Returns once no flush is deferred (those deferred meanwhile included). Work
    /// holding itself back is told to go now.
    pub async fn idle(&self) {
        loop {
            let done = self.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.running() == 0 {
                return;
            }
            self.hurry.send_modify(|n| *n = n.wrapping_add(1));
            done.await;
        }
    }

    /// What tells deferred work that holds itself back that someone waits for it
    /// (see [`Deferred::idle`]): `changed()` completes from then on.
    pub(crate) fn hurried(&self) -> watch::Receiver<u64> {
        self.hurry.subscribe()
    }

    /// Remembers that the deferred work on `fid` (a file's flush, a removal in a
    /// directory) failed.
    pub(crate) fn failed(&self, fid: Fid, why: String) {
        tracing::warn!(%fid, "work finished after its call returned failed: {why}");
        let mut f = self.failed.lock().expect("failed flushes");
        if f.len() >= FAILED_MAX {
            f.pop_front();
        }
        f.push_back((fid, why));
    }

    /// The failure of a deferred flush of `fid`, once.
    pub(crate) fn take_failure(&self, fid: Fid) -> Option<String> {
        let mut f = self.failed.lock().expect("failed flushes");
        let i = f.iter().position(|(x, _)| *x == fid)?;
        f.remove(i).map(|(_, why)| why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn idle_waits_for_every_ticket_and_slots_are_bounded() {
        let d = Arc::new(Deferred::default());
        d.idle().await;
        let a = d.begin(10).unwrap();
        let b = d.begin(10).unwrap();
        let waiter = {
            let d = d.clone();
            tokio::spawn(async move { d.idle().await })
        };
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "one flush is still deferred");
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("idle once all are done").unwrap();

        let held: Vec<Ticket> = (0..DEFERRED_MAX).map(|_| d.begin(1).unwrap()).collect();
        assert!(d.begin(1).is_none(), "no more than DEFERRED_MAX at once");
        drop(held);
        assert_eq!(d.running(), 0);
        assert!(d.begin(1).is_some());
    }

    #[tokio::test]
    async fn waiting_for_idle_hurries_what_holds_itself_back() {
        let d = Arc::new(Deferred::default());
        let mut hurried = d.hurried();
        d.idle().await;
        assert!(!hurried.has_changed().unwrap(), "nothing deferred: no one to hurry");
        let ticket = d.begin(0).unwrap();
        let waiter = {
            let d = d.clone();
            tokio::spawn(async move { d.idle().await })
        };
        tokio::time::timeout(Duration::from_secs(5), hurried.changed()).await.expect("hurried").unwrap();
        drop(ticket);
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("idle").unwrap();
    }

    #[test]
    fn bytes_are_bounded_per_file_and_in_all() {
        let d = Arc::new(Deferred::default());
        assert!(d.begin(FILE_BYTES_MAX + 1).is_none(), "a large file's close waits");
        let per = FILE_BYTES_MAX;
        let held: Vec<Ticket> = (0..BYTES_MAX / per).map(|_| d.begin(per).unwrap()).collect();
        assert!(d.begin(1).is_none(), "no more than BYTES_MAX at once");
        assert_eq!(d.running(), held.len(), "a refused file is not counted");
        drop(held);
        assert!(d.begin(per).is_some(), "room again once they are done");
    }

    #[test]
    fn work_on_one_file_leaves_others_free_and_unkeyed_work_keeps_all_busy() {
        let d = Arc::new(Deferred::default());
        let (file, dir, other) = (Fid::new(0, 0x400, 1), Fid::new(0, 0x400, 2), Fid::new(0, 0x400, 3));
        assert!(!d.busy(file));
        let a = d.begin_on(0, [Some(file), Some(dir)]).unwrap();
        let b = d.begin_on(0, [Some(file), Some(dir)]).unwrap();
        assert!(d.busy(file) && d.busy(dir) && !d.busy(other));
        drop(a);
        assert!(d.busy(file), "one ticket on it is left");
        drop(b);
        assert!(!d.busy(file) && !d.busy(dir));
        let any = d.begin(0).unwrap();
        assert!(d.busy(other), "work that names no file may be on any");
        drop(any);
        assert!(!d.busy(other));
    }

    #[test]
    fn a_failure_is_reported_once() {
        let d = Deferred::default();
        let f = Fid::new(0, 0x400, 1);
        d.failed(f, "boom".into());
        assert_eq!(d.take_failure(f).as_deref(), Some("boom"));
        assert_eq!(d.take_failure(f), None);
    }

    #[tokio::test]
    async fn exempt_is_scoped() {
        assert!(!is_exempt());
        assert!(exempt(async { is_exempt() }).await);
        assert!(!is_exempt());
    }
}
