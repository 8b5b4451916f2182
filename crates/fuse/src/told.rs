//! The attributes this mount last told the kernel of each inode, for the kernel's
//! re-asks that want nothing newer.
//!
//! The kernel drops a file's cached atime after every read of it (it cannot know the
//! new atime), and the next `stat` of it then sends `GETATTR`, though the rest of
//! what it cached still holds. `tar c` stats each file after reading it: one MDS
//! round trip per file for nothing. So what a lookup, a listing's entry or an open
//! last brought of a regular file is kept for the attribute cache time, and such a
//! `GETATTR` is answered from it for what remains of that time: exactly as stale as
//! the kernel's own cache would have been. A directory's are asked for again (the
//! kernel drops its atime after each listing): that is where a path walk finds a
//! directory another client removed gone at once, as it did before. What this mount changes in between is not missed: every request
//! of its client that may change metadata, and every write, moves the client's
//! metadata epoch, and attributes fetched under an older epoch are never answered.
//! An open fetches attributes afresh (close-to-open) and replaces what is kept, so
//! the kernel, told by the open to drop what it cached, gets the open's answer.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use client::{Attr, Fid, FileKind};

/// Most inodes remembered; past it the memory starts over.
const TOLD_MAX: usize = 64 * 1024;

/// When attributes were asked for: the client's metadata epoch and the moment, both
/// taken before the request went out.
#[derive(Clone, Copy)]
pub struct Asked {
    pub epoch: u64,
    pub at: Instant,
}

#[derive(Default)]
pub struct Told {
    known: Mutex<HashMap<Fid, (Attr, Asked)>>,
}

impl Told {
    /// The kernel was told `attr`, fetched as `asked` says (kept for a regular file).
    pub fn note(&self, attr: &Attr, asked: Asked) {
        if attr.kind != FileKind::File {
            return;
        }
        let mut known = self.known.lock().expect("told attributes");
        if known.len() >= TOLD_MAX {
            known.clear();
        }
        known.insert(attr.fid, (attr.clone(), asked));
    }

    /// What the kernel was last told of `fid`, if it was asked for less than `ttl`
    /// ago at the client's metadata epoch `epoch` (the current one), with the time
    /// that remains of `ttl`.
    pub fn recent(&self, fid: Fid, ttl: Duration, epoch: u64) -> Option<(Attr, Duration)> {
        let known = self.known.lock().expect("told attributes");
        let (attr, asked) = known.get(&fid)?;
        let age = asked.at.elapsed();
        (age < ttl && asked.epoch == epoch).then(|| (attr.clone(), ttl - age))
    }

    /// The kernel forgot the inode.
    pub fn forget(&self, fid: Fid) {
        self.known.lock().expect("told attributes").remove(&fid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use client::{Creds, Timespec};

    fn attr(fid: Fid, mode: u32) -> Attr {
        Attr::new_inode(fid, FileKind::File, mode, &Creds::root(), 0, Timespec::now())
    }

    #[test]
    fn answers_only_within_the_cache_time_and_at_the_epoch_it_was_asked_at() {
        let told = Told::default();
        let fid = Fid::new(0, 1, 9);
        let now = Instant::now();
        told.note(&attr(fid, 0o640), Asked { epoch: 3, at: now });
        let (a, left) = told.recent(fid, Duration::from_secs(1), 3).expect("within the cache time");
        assert_eq!(a.mode & 0o7777, 0o640);
        assert!(left <= Duration::from_secs(1));
        assert!(told.recent(fid, Duration::from_secs(1), 4).is_none(), "this client changed something since");
        let old = now - Duration::from_secs(2);
        told.note(&attr(fid, 0o600), Asked { epoch: 3, at: old });
        assert!(told.recent(fid, Duration::from_secs(1), 3).is_none(), "older than the cache time");
        told.note(&attr(fid, 0o600), Asked { epoch: 3, at: now });
        told.forget(fid);
        assert!(told.recent(fid, Duration::from_secs(1), 3).is_none(), "forgotten with the inode");
        let dir = Fid::new(0, 1, 10);
        told.note(
            &Attr::new_inode(dir, FileKind::Dir, 0o755, &Creds::root(), 0, Timespec::now()),
            Asked { epoch: 3, at: now },
        );
        assert!(told.recent(dir, Duration::from_secs(1), 3).is_none(), "a directory's are asked for again");
    }
}
