//! Files an open just found without extended attributes, for the listing that follows.
//!
//! A copy that keeps attributes (`cp -a`, `rsync -X`, `tar --xattrs`) lists each source
//! file's extended attributes right after opening it: on almost every file the answer
//! is "none", at the cost of a round trip to the MDS. The MDS says with the open
//! whether the file has any ([`proto::msg::Response::OpenedWithoutXattrs`]); for
//! [`TTL`] after the open was sent, a listing of such a file is answered here, empty.
//!
//! What keeps the answer right:
//! - **This client's own changes.** Every xattr set or removal through this client
//!   moves an epoch, before it is sent and once it is answered; an open sent under an
//!   older epoch notes nothing, and a note taken under an older one serves nothing.
//! - **Others' changes** are seen at most [`TTL`] late, as a lookup's attributes in the
//!   kernel's cache and the statahead entries are (Lustre keeps its xattr cache under a
//!   lock; braid bounds it in time).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use proto::Fid;

/// How long after its open was sent a file is taken to have no extended attributes.
pub const TTL: Duration = Duration::from_secs(1);
/// Most files noted; all are dropped when full (a note only saves a round trip).
pub const FILES_MAX: usize = 16 * 1024;

/// When an open was sent, as this table counts: the epoch and the instant.
#[derive(Clone, Copy)]
pub(crate) struct Sent {
    epoch: u64,
    at: Instant,
}

#[derive(Default)]
pub(crate) struct Xattrless {
    /// Moved by every xattr change of this client.
    epoch: AtomicU64,
    /// File → when the open that found it bare was sent (an xattr change of this
    /// client empties it).
    files: Mutex<HashMap<Fid, Instant>>,
}

impl Xattrless {
    /// Taken before an open is sent.
    pub fn sent(&self) -> Sent {
        Sent { epoch: self.epoch.load(Ordering::Acquire), at: Instant::now() }
    }

    /// The open sent at `sent` found `fid` without extended attributes.
    pub fn note(&self, fid: Fid, sent: Sent) {
        let mut files = self.files.lock().expect("xattrless files");
        if sent.epoch != self.epoch.load(Ordering::Acquire) {
            return;
        }
        if files.len() >= FILES_MAX {
            files.clear();
        }
        files.insert(fid, sent.at);
    }

    /// An open found `fid` with extended attributes.
    pub fn unnote(&self, fid: Fid) {
        self.files.lock().expect("xattrless files").remove(&fid);
    }

    /// Whether `fid` is known, now, to have no extended attributes.
    pub fn bare(&self, fid: Fid) -> bool {
        self.files.lock().expect("xattrless files").get(&fid).is_some_and(|at| at.elapsed() < TTL)
    }

    /// This client is changing an extended attribute (called before the request is
    /// sent and after its answer).
    pub fn changing(&self) {
        let mut files = self.files.lock().expect("xattrless files");
        self.epoch.fetch_add(1, Ordering::AcqRel);
        files.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_file_is_answered_until_this_client_changes_an_xattr_or_the_note_ages() {
        let t = Xattrless::default();
        let fid = Fid::new(0, 1, 9);
        let sent = t.sent();
        t.note(fid, sent);
        assert!(t.bare(fid));
        assert!(!t.bare(Fid::new(0, 1, 10)), "only the file the open found bare");
        t.changing();
        assert!(!t.bare(fid));
        // An open sent before the change notes nothing.
        t.note(fid, sent);
        assert!(!t.bare(fid));
        let old = Sent { epoch: t.sent().epoch, at: Instant::now() - TTL };
        t.note(fid, old);
        assert!(!t.bare(fid), "a note older than the TTL");
        t.note(fid, t.sent());
        assert!(t.bare(fid));
        t.unnote(fid);
        assert!(!t.bare(fid), "a later open found attributes");
    }
}
