//! Attribute changes of a file this client created and holds open, in a directory it
//! holds the lease on: answered here and sent behind, merged into one setattr.
//!
//! `tar x` and `cp -a` create each file, write it, then `fchown`, `fchmod` and
//! `futimens` it before they close it: three round trips to the MDS a file, after
//! the create's. The file's name is one nobody else can find yet (see
//! [`crate::deferred`]: the MDS takes the lease back before another client may look
//! in the directory, and the ack waits for this client's deferred work). So a change
//! of its mode, owner or times is applied to the attributes this client gave the
//! file, answered at once, merged with the changes that follow, and sent as one
//! `MdsSetattr` when the first of these comes:
//!
//! - the flush of a handle of the file (its close, fsync), before its size report;
//! - anyone waiting for this client's deferred work: every other MDS request of
//!   this client that could observe the file, and the ack of a lease revocation
//!   (the changes hold a deferred ticket, so they wait for it, and hurry it);
//! - [`HOLD`] after the first change.
//!
//! Sent as before, once what waits has gone (the MDS's rules decide there): a size
//! change; a file whose mode has, or would get, the set-user-ID or set-group-ID bit
//! (the MDS clears them on some changes); a caller other than the one whose changes
//! wait; a file renamed or linked since its create, or whose directory lease is no
//! longer trusted. After one such change, every later change of the file goes to the
//! MDS too (what this client knows of the file is then not the whole truth).
//!
//! What it gives up: a mount killed after it answered leaves the file with its
//! attributes as created (as a deferred flush leaves it without its bytes). A change
//! the MDS refuses after all is logged and fails the file's next flush or fsync here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::msg::{Attr, Creds, Request, Response, SetAttr, SetBehind, TimeSet, Timespec};
use proto::Fid;

use crate::{async_create, deferred, unexpected, Client, OpenFile, Result};

/// Longest a change answered here waits before it is sent.
pub const HOLD: Duration = Duration::from_millis(100);
/// Most files tracked at once (one per open handle that created its file here).
const FILES_MAX: usize = 65_536;
const S_ISUID_ISGID: u32 = 0o6000;

/// A file this client created under a lease, while its creating handle is open.
pub(crate) struct Created {
    dir: Fid,
    moves: u64,
    /// Its attributes as this client knows them (the size aside: see `size`).
    attr: Mutex<Attr>,
    /// The creating handle's size.
    size: Arc<AtomicU64>,
    /// The create's answer, when this client answered the create itself.
    gate: Option<Arc<async_create::Gate>>,
    /// A change went to the MDS: later ones go there too.
    given_up: AtomicBool,
    /// The changes answered here and not sent yet; locked while they are sent, so a
    /// flush that comes meanwhile waits for them.
    pending: tokio::sync::Mutex<Option<Pending>>,
}

impl Created {
    /// The MDS answered a change of the file with `attr` (the size aside: the
    /// creating handle's is newer).
    fn answered(&self, attr: &Attr) {
        let mut known = self.attr.lock().expect("attributes set behind");
        *known = Attr { size: known.size, ..attr.clone() };
    }
}

/// Changes answered here, not sent yet.
pub(crate) struct Pending {
    creds: Creds,
    set: SetAttr,
    /// Counts the changes as deferred work (see the module's note).
    _ticket: deferred::Ticket,
}

impl Pending {
    /// As a size report carries them.
    pub(crate) fn to_send(&self) -> SetBehind {
        SetBehind { creds: self.creds.clone(), set: self.set.clone() }
    }
}

/// The files of one client whose changes may be answered here.
#[derive(Default)]
pub(crate) struct SetsBehind {
    files: Mutex<HashMap<Fid, Arc<Created>>>,
    /// Changes answered here so far.
    pub(crate) answered: AtomicU64,
}

impl SetsBehind {
    /// Tracks file `attr.fid`, created in leased directory `dir` (with `moves`
    /// renames and links sent then) by a handle whose size is `size`.
    pub(crate) fn created(
        &self,
        attr: &Attr,
        dir: Fid,
        moves: u64,
        size: Arc<AtomicU64>,
        gate: Option<Arc<async_create::Gate>>,
    ) -> Option<Arc<Created>> {
        let mut files = self.files.lock().expect("files set behind");
        if files.len() >= FILES_MAX {
            return None;
        }
        let c = Arc::new(Created {
            dir,
            moves,
            attr: Mutex::new(attr.clone()),
            size,
            gate,
            given_up: AtomicBool::new(false),
            pending: tokio::sync::Mutex::new(None),
        });
        files.insert(attr.fid, c.clone());
        Some(c)
    }

    /// Stops tracking `fid` (its creating handle closed), if `c` is what tracks it.
    pub(crate) fn closed(&self, fid: Fid, c: &Arc<Created>) {
        let mut files = self.files.lock().expect("files set behind");
        if files.get(&fid).is_some_and(|x| Arc::ptr_eq(x, c)) {
            files.remove(&fid);
        }
    }

    /// Gives up every file tracked in `dir` (a name there was removed: it may have
    /// been one of theirs, whose link count this client does not follow).
    pub(crate) fn give_up_in(&self, dir: Fid) {
        for c in self.files.lock().expect("files set behind").values().filter(|c| c.dir == dir) {
            c.given_up.store(true, Ordering::Release);
        }
    }

    fn get(&self, fid: Fid) -> Option<Arc<Created>> {
        self.files.lock().expect("files set behind").get(&fid).cloned()
    }
}

/// `set` applied to `attr` at `now`, as the MDS applies it when no rule of its own
/// intervenes (the cases [`Client::setattr_behind`] leaves to it).
fn apply(attr: &mut Attr, set: &SetAttr, now: Timespec) {
    let time = |t: &TimeSet| match t {
        TimeSet::Now => now,
        TimeSet::At(t) => *t,
    };
    if let Some(m) = set.mode {
        attr.mode = m & 0o7777;
    }
    if let Some(u) = set.uid {
        attr.uid = u;
    }
    if let Some(g) = set.gid {
        attr.gid = g;
    }
    if let Some(t) = &set.atime {
        attr.atime = time(t);
    }
    if let Some(t) = &set.mtime {
        attr.mtime = time(t);
    }
    attr.ctime = attr.ctime.max(now);
}

/// `later` merged over `earlier`: each attribute as the last change set it.
fn merge(earlier: &mut SetAttr, later: &SetAttr) {
    earlier.mode = later.mode.or(earlier.mode);
    earlier.uid = later.uid.or(earlier.uid);
    earlier.gid = later.gid.or(earlier.gid);
    earlier.atime = later.atime.or(earlier.atime);
    earlier.mtime = later.mtime.or(earlier.mtime);
}

impl Client {
    /// A setattr of `fid` answered here, if it may be (see [`set_behind`](self)):
    /// the file's attributes after it. `None`: send it to the MDS as usual (which
    /// waits until changes answered here earlier have gone).
    /// (Async only to run in the client's runtime, where the changes' sender is
    /// spawned: it waits for nothing.)
    pub async fn setattr_behind(&self, creds: &Creds, fid: Fid, set: &SetAttr) -> Option<Attr> {
        let c = self.inner.sets_behind.get(fid)?;
        let answered = self.try_setattr_behind(&c, creds, fid, set);
        if answered.is_none() {
            c.given_up.store(true, Ordering::Release);
        }
        answered
    }

    fn try_setattr_behind(&self, c: &Arc<Created>, creds: &Creds, fid: Fid, set: &SetAttr) -> Option<Attr> {
        if set.size.is_some() {
            return None;
        }
        let mut pending = c.pending.try_lock().ok()?;
        if pending.as_ref().is_some_and(|p| p.creds != *creds) {
            return None;
        }
        let mut attr = c.attr.lock().expect("attributes set behind");
        if (attr.mode | set.mode.unwrap_or(0)) & S_ISUID_ISGID != 0 {
            return None;
        }
        // Counted before the lease is checked: a revocation after the check waits.
        let ticket = match pending.is_none() {
            true => Some(self.inner.deferred.begin_on(0, [Some(fid), Some(c.dir)])?),
            false => None,
        };
        if !self.is_live(c) {
            return None;
        }
        if set.mtime.is_some() {
            // The handles' size reports leave the mtime alone unless they write again.
            for i in self.file_inflights(fid) {
                let gen = i.data_gen.load(Ordering::Acquire);
                i.mtime_set_at.store(gen.wrapping_add(1), Ordering::Release);
            }
        }
        apply(&mut attr, set, Timespec::now());
        let mut out = attr.clone();
        out.size = c.size.load(Ordering::Acquire);
        drop(attr);
        if let Some(p) = pending.as_mut() {
            merge(&mut p.set, set);
        } else if let Some(ticket) = ticket {
            let set = SetAttr { size: None, by_writer: false, ..set.clone() };
            *pending = Some(Pending { creds: creds.clone(), set, _ticket: ticket });
            let (client, c) = (self.clone(), c.clone());
            let mut hurry = self.inner.deferred.hurried();
            tokio::spawn(rpc::stats::in_current_job(async move {
                tokio::select! {
                    _ = hurry.changed() => {}
                    _ = tokio::time::sleep(HOLD) => {}
                }
                if let Err(e) = client.send_behind(fid, &c).await {
                    client.inner.deferred.failed(fid, format!("attributes set after its create: {e}"));
                }
            }));
        }
        drop(pending);
        self.inner.statahead.changed();
        self.inner.sets_behind.answered.fetch_add(1, Ordering::Relaxed);
        Some(out)
    }

    /// The changes of `f`'s file answered here and not sent yet, taken to go with
    /// its size report (see [`Request::MdsSizeUpdate`]), when they are its opener's.
    pub(crate) async fn take_behind(&self, f: &OpenFile) -> Option<Pending> {
        let c = f.behind.as_ref()?;
        c.pending.lock().await.take_if(|p| p.creds == f.creds)
    }

    /// Sends changes taken from `f`'s file (see [`Client::take_behind`]) alone.
    pub(crate) async fn send_taken_behind(&self, f: &OpenFile, p: Pending) -> Result<()> {
        match &f.behind {
            Some(c) => self.send_pending(f.fid, c, p).await,
            None => Ok(()),
        }
    }

    /// Changes taken from `f`'s file went with its size report, answered `attr`: what
    /// this client knows of the file now. A change the MDS left out is reported as a
    /// refused setattr is (the file's next flush or fsync fails with it).
    pub(crate) fn sent_behind_with(&self, f: &OpenFile, p: &Pending, attr: &Attr) {
        if let Some(c) = &f.behind {
            c.answered(attr);
        }
        let set = &p.set;
        let applied = set.mode.is_none_or(|m| m & 0o7777 == attr.mode & 0o7777)
            && set.uid.is_none_or(|u| u == attr.uid)
            && set.gid.is_none_or(|g| g == attr.gid);
        if !applied {
            let fid = attr.fid;
            tracing::warn!(%fid, "attributes set after a create answered here were refused with its size report");
            self.inner.deferred.failed(fid, "attributes set after its create were refused".to_string());
        }
    }

    /// Sends the changes of `fid` answered here, if any wait (and waits for a send
    /// already under way).
    pub(crate) async fn send_behind(&self, fid: Fid, c: &Created) -> Result<()> {
        let mut pending = c.pending.lock().await;
        let Some(p) = pending.take() else { return Ok(()) };
        if let Some(gate) = &c.gate {
            gate.wait().await?;
        }
        if p.set.mtime.is_some() {
            // A DoM write sets the mtime as it lands: the writes before go first.
            for i in self.file_inflights(fid) {
                i.settle().await;
            }
        }
        self.send_pending(fid, c, p).await
    }

    /// Sends changes answered here for `c`'s file as one `MdsSetattr`; its answer is
    /// what this client knows of the file from then on.
    async fn send_pending(&self, fid: Fid, c: &Created, p: Pending) -> Result<()> {
        let req = Request::MdsSetattr { creds: p.creds.clone(), fid, set: p.set.clone() };
        // Not waiting for deferred work: this is some (its ticket is `p`'s).
        let r = deferred::exempt(self.md(fid, req)).await;
        drop(p);
        match r? {
            Response::Attr(a) => {
                c.answered(&a);
                Ok(())
            }
            r => Err(unexpected("setattr", &r)),
        }
    }

    /// The attributes of `fid` as this client knows them, if it created the file
    /// and still holds it where no one else can find it (see the module's note).
    /// Its times are those this client gave or set it: a write shows in its mtime
    /// once the handle's flush reports it, as on the MDS.
    pub fn attr_behind(&self, fid: Fid) -> Option<Attr> {
        let c = self.live_behind(fid)?;
        let mut a = c.attr.lock().expect("attributes set behind").clone();
        a.size = c.size.load(Ordering::Acquire);
        Some(a)
    }

    /// Whether `fid` is a file this client created and holds where no one else can
    /// find it, and that has had no xattr set since: it has none.
    pub(crate) fn no_xattrs_behind(&self, fid: Fid) -> bool {
        self.live_behind(fid).is_some()
    }

    /// Changes of `fid` other than those answered here (an xattr set, a truncate, a
    /// hole punched, any setattr sent to the MDS) go to the MDS from now on, and so
    /// do questions about it.
    pub(crate) fn give_up_behind(&self, fid: Fid) {
        if let Some(c) = self.inner.sets_behind.get(fid) {
            c.given_up.store(true, Ordering::Release);
        }
    }

    fn live_behind(&self, fid: Fid) -> Option<Arc<Created>> {
        let c = self.inner.sets_behind.get(fid)?;
        self.is_live(&c).then_some(c)
    }

    /// Whether no one else can have found or changed `c`'s file: nothing handed it
    /// back to the MDS, no rename or link since its create, its directory's lease
    /// trusted.
    fn is_live(&self, c: &Created) -> bool {
        !c.given_up.load(Ordering::Acquire)
            && self.inner.moves.load(Ordering::Acquire) == c.moves
            && self.inner.leases.trusted(c.dir)
    }

    /// Setattrs answered here so far.
    pub fn setattrs_answered_here(&self) -> u64 {
        self.inner.sets_behind.answered.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::msg::FileKind;

    fn ts(sec: i64) -> Timespec {
        Timespec { sec, nsec: 0 }
    }

    #[test]
    fn changes_merge_last_one_wins_and_apply_as_the_mds_would() {
        let mut set = SetAttr { mode: Some(0o600), uid: Some(7), ..SetAttr::default() };
        merge(&mut set, &SetAttr { mode: Some(0o640), mtime: Some(TimeSet::At(ts(5))), ..Default::default() });
        assert_eq!((set.mode, set.uid, set.gid), (Some(0o640), Some(7), None));
        let mut attr = Attr::new_inode(Fid::new(0, 1, 2), FileKind::File, 0o644, &Creds::root(), 0, ts(1));
        let now = ts(9);
        apply(&mut attr, &set, now);
        assert_eq!((attr.mode, attr.uid, attr.gid), (0o640, 7, 0));
        assert_eq!((attr.mtime, attr.atime, attr.ctime), (ts(5), ts(1), now));
        apply(&mut attr, &SetAttr { atime: Some(TimeSet::Now), ..Default::default() }, ts(10));
        assert_eq!(attr.atime, ts(10));
    }
}
