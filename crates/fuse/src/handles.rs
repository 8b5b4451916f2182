//! What the mount remembers between kernel requests: open file and directory
//! handles, and per open inode the shared size cell and lock owners.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use client::Fid;
use client::OpenFile;
use client::{Creds, DirEntry};

use crate::SizeCell;

/// An open file.
pub struct FileState {
    /// It names the inode's backing file (see [`Passthrough`]): its release lets go.
    pub passes_through: AtomicBool,
    pub file: OpenFile,
    /// The process that opened it, its uid and gid: the kernel's RELEASE names no
    /// process, and the trace charges the close to the opener.
    pub opener: (u32, u32, u32),
    /// The flush its last FLUSH left to finish after close(2) returned (see the
    /// client's `deferred`): RELEASE waits for it before closing.
    pub deferred: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Most released directory handles kept for a reopen (see [`Handles::dir_reopened`]).
const RELEASED_DIRS_MAX: usize = 64;

/// How long the attributes a listing brought are handed to the kernel with its
/// entries (a lookup's answer is older than that only in the kernel's own cache).
pub const ATTRS_FRESH: Duration = Duration::from_secs(1);

/// An open directory: entries fetched so far, in name order. Listing resumes after the
/// last name fetched, so entries created or removed during a listing never make it
/// skip or repeat the others.
pub struct DirHandle {
    pub fid: Fid,
    pub creds: Creds,
    state: Mutex<DirState>,
}

#[derive(Default)]
struct DirState {
    entries: Vec<client::DirEntryPlus>,
    eof: bool,
    /// For each batch: the index of its first entry, when it was fetched and the
    /// client's metadata epoch then (see [`DirHandle::entry_plus`]).
    batches: Vec<(usize, Instant, u64)>,
}

impl DirHandle {
    pub fn new(fid: Fid, creds: Creds) -> DirHandle {
        DirHandle { fid, creds, state: Mutex::new(DirState::default()) }
    }

    /// Entry `i` of the listing if it is known (`None` past the end), or else the
    /// name to fetch the next batch after (see [`DirHandle::extend`]).
    pub fn entry(&self, i: usize) -> Result<Option<DirEntry>, Option<String>> {
        self.entry_plus(i, 0).map(|e| e.map(|(e, _)| e))
    }

    /// [`DirHandle::entry`] with the entry's attributes, if its batch brought them
    /// less than [`ATTRS_FRESH`] ago and the client's metadata epoch is still
    /// `epoch` (nothing of this client changed since: the kernel would take them
    /// over attributes it has newer).
    pub fn entry_plus(&self, i: usize, epoch: u64) -> Result<Option<client::DirEntryPlus>, Option<String>> {
        let st = self.state.lock().expect("dir state");
        if i >= st.entries.len() && !st.eof {
            return Err(st.entries.last().map(|(e, _)| e.name.clone()));
        }
        let Some((e, attr)) = st.entries.get(i) else { return Ok(None) };
        let batch = st.batches.iter().rev().find(|(first, _, _)| *first <= i);
        let fresh = batch.is_some_and(|(_, at, e)| at.elapsed() < ATTRS_FRESH && *e == epoch);
        Ok(Some((e.clone(), attr.clone().filter(|_| fresh))))
    }

    /// Forgets the listing if its first batch's attributes no longer hold for the
    /// client's metadata `epoch` (see [`DirHandle::entry_plus`]): a listing from the
    /// start then fetches afresh, rather than look up each entry the kernel is given.
    /// (`OPENDIR` fetches the first batch; the caller may change metadata before it
    /// lists, as `cp -a` makes the copy's directory first.)
    pub fn refresh_if_stale(&self, epoch: u64) {
        let mut st = self.state.lock().expect("dir state");
        if st.batches.first().is_some_and(|(_, at, e)| at.elapsed() >= ATTRS_FRESH || *e != epoch) {
            *st = DirState::default();
        }
    }

    /// A new handle of the same directory for `creds`, holding this one's listing, if
    /// it is the caller's, whole, and fetched in one batch still fresh at client
    /// metadata epoch `epoch` (see [`DirHandle::entry_plus`]).
    pub fn reopened(&self, creds: &Creds, epoch: u64) -> Option<DirHandle> {
        if self.creds != *creds {
            return None;
        }
        let st = self.state.lock().expect("dir state");
        let fresh = matches!(st.batches.as_slice(), [(0, at, e)] if at.elapsed() < ATTRS_FRESH && *e == epoch);
        (st.eof && fresh).then(|| DirHandle {
            fid: self.fid,
            creds: creds.clone(),
            state: Mutex::new(DirState { entries: st.entries.clone(), eof: true, batches: st.batches.clone() }),
        })
    }

    /// Whether the listing is whole and fetched in one batch, the only kind
    /// [`DirHandle::reopened`] starts from.
    fn whole_in_one(&self) -> bool {
        let st = self.state.lock().expect("dir state");
        st.eof && st.batches.len() == 1
    }

    /// Appends a batch fetched after `after` (at client metadata epoch `epoch`),
    /// unless another fetch of the same handle appended one first.
    pub fn extend(&self, after: Option<String>, batch: Vec<client::DirEntryPlus>, eof: bool, epoch: u64) {
        let mut st = self.state.lock().expect("dir state");
        if st.eof || st.entries.last().map(|(e, _)| &e.name) != after.as_ref() {
            return;
        }
        st.eof = eof || batch.is_empty();
        let first = st.entries.len();
        st.batches.push((first, Instant::now(), epoch));
        st.entries.extend(batch);
    }
}

/// An inode's backing file while handles pass through to it. The kernel holds an inode
/// in one I/O mode at a time: while any handle of it passes through, every other open
/// must name the same backing file (with `FOPEN_DIRECT_IO` to have its reads come to
/// the mount), or it fails.
pub struct Passthrough {
    pub id: fuser::BackingId,
    pub backing: client::CacheBacking,
    /// The data version the backing file holds.
    pub version: u64,
}

/// Per-inode state while the inode has open handles in this mount.
pub struct InodeState {
    pub size: SizeCell,
    handles: u32,
    /// The backing file and how many handles pass through to it.
    pub passthrough: Option<(Arc<Passthrough>, u32)>,
    /// Written through this mount since it was opened: its size may be ahead of the MDS.
    pub dirty: AtomicBool,
    lock_owners: HashSet<u64>,
}

#[derive(Default)]
pub struct Handles {
    next: AtomicU64,
    files: Mutex<HashMap<u64, Arc<FileState>>>,
    dirs: Mutex<HashMap<u64, Arc<DirHandle>>>,
    /// The last directory handles released, by directory, for an open of the same
    /// directory right after (see [`Handles::dir_reopened`]).
    released_dirs: Mutex<HashMap<Fid, Arc<DirHandle>>>,
    inodes: Mutex<HashMap<Fid, InodeState>>,
    /// Woken when the last handle of an inode passing through is released.
    passthrough_released: tokio::sync::Notify,
}

impl InodeState {
    /// Handles of the inode open in this mount.
    pub fn open_handles(&self) -> u32 {
        self.handles
    }
}

impl Handles {
    fn next_fh(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn insert_file(&self, file: OpenFile, opener: (u32, u32, u32)) -> u64 {
        let fh = self.next_fh();
        self.files.lock().expect("files").insert(
            fh,
            Arc::new(FileState { passes_through: AtomicBool::new(false), file, opener, deferred: Mutex::new(None) }),
        );
        fh
    }

    pub fn file(&self, fh: u64) -> Option<Arc<FileState>> {
        self.files.lock().expect("files").get(&fh).cloned()
    }

    pub fn remove_file(&self, fh: u64) -> Option<Arc<FileState>> {
        self.files.lock().expect("files").remove(&fh)
    }

    pub fn insert_dir(&self, d: DirHandle) -> u64 {
        let fh = self.next_fh();
        self.dirs.lock().expect("dirs").insert(fh, Arc::new(d));
        fh
    }

    pub fn dir(&self, fh: u64) -> Option<Arc<DirHandle>> {
        self.dirs.lock().expect("dirs").get(&fh).cloned()
    }

    pub fn remove_dir(&self, fh: u64) {
        let Some(d) = self.dirs.lock().expect("dirs").remove(&fh) else { return };
        // A listing a reopen could not start from is not kept (a large directory's).
        if !d.whole_in_one() {
            return;
        }
        let mut released = self.released_dirs.lock().expect("released dirs");
        if released.len() >= RELEASED_DIRS_MAX {
            released.clear();
        }
        released.insert(d.fid, d);
    }

    /// A new handle of directory `fid` for `creds` holding the listing of one open or
    /// just released (see [`DirHandle::reopened`]): `rm -rf` opens each directory
    /// twice, once to see whether it is empty and once to empty it, and the second
    /// open then costs no round trip. The caller makes sure no other client can have
    /// changed the directory's entries meanwhile (it holds the directory's lease).
    pub fn dir_reopened(&self, fid: Fid, creds: &Creds, epoch: u64) -> Option<DirHandle> {
        let open =
            self.dirs.lock().expect("dirs").values().filter(|d| d.fid == fid).find_map(|d| d.reopened(creds, epoch));
        open.or_else(|| self.released_dirs.lock().expect("released dirs").get(&fid)?.reopened(creds, epoch))
    }

    /// A handle of `fid` opened; returns the size cell all its handles share.
    pub fn inode_opened(&self, fid: Fid, cell: SizeCell) -> SizeCell {
        let mut m = self.inodes.lock().expect("inodes");
        let st = m.entry(fid).or_insert_with(|| InodeState {
            size: cell.clone(),
            handles: 0,
            passthrough: None,
            dirty: AtomicBool::new(false),
            lock_owners: HashSet::new(),
        });
        st.handles += 1;
        if !st.dirty.load(Ordering::Acquire) {
            // Nothing written here: the size the MDS just gave is the truth.
            st.size.store(cell.load(Ordering::Acquire), Ordering::Release);
        }
        st.size.clone()
    }

    /// Whether any handle of `fid` is open in this mount.
    pub fn inode_open(&self, fid: Fid) -> bool {
        self.inodes.lock().expect("inodes").contains_key(&fid)
    }

    /// Runs `f` on the state of open inode `fid`.
    pub fn with_inode<T>(&self, fid: Fid, f: impl FnOnce(&mut InodeState) -> T) -> Option<T> {
        self.inodes.lock().expect("inodes").get_mut(&fid).map(f)
    }

    /// The backing file open handles of `fid` pass through to, if any: a change of the
    /// file through this mount is applied to it too.
    pub fn passthrough(&self, fid: Fid) -> Option<Arc<Passthrough>> {
        self.inodes.lock().expect("inodes").get(&fid).and_then(|st| st.passthrough.as_ref().map(|(p, _)| p.clone()))
    }

    /// Waits, until `deadline` at most, for the handles of `fid` passing through to be
    /// released; whether none is left. The kernel sends RELEASE once close(2) has
    /// returned, so a process that closes a file and opens it again can be quicker
    /// than the RELEASE of its own close.
    pub async fn passthrough_released(&self, fid: Fid, deadline: tokio::time::Instant) -> bool {
        loop {
            let mut released = std::pin::pin!(self.passthrough_released.notified());
            released.as_mut().enable();
            if self.passthrough(fid).is_none() {
                return true;
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return self.passthrough(fid).is_none();
            }
        }
    }

    /// A handle of `fid` was released (one that named the backing file, if
    /// `passed_through`).
    pub fn inode_closed(&self, fid: Fid, passed_through: bool) {
        let mut m = self.inodes.lock().expect("inodes");
        if let Some(st) = m.get_mut(&fid) {
            if passed_through {
                if let Some((_, n)) = st.passthrough.as_mut() {
                    *n -= 1;
                    if *n == 0 {
                        st.passthrough = None;
                        self.passthrough_released.notify_waiters();
                    }
                }
            }
            st.handles = st.handles.saturating_sub(1);
            if st.handles == 0 {
                m.remove(&fid);
            }
        }
    }

    pub fn mark_dirty(&self, fid: Fid) {
        if let Some(st) = self.inodes.lock().expect("inodes").get(&fid) {
            st.dirty.store(true, Ordering::Release);
        }
    }

    /// The size this mount knows better than the MDS: that of an inode written here.
    pub fn local_size(&self, fid: Fid) -> Option<u64> {
        let m = self.inodes.lock().expect("inodes");
        m.get(&fid).filter(|st| st.dirty.load(Ordering::Acquire)).map(|st| st.size())
    }

    pub fn truncated(&self, fid: Fid, size: u64) {
        if let Some(st) = self.inodes.lock().expect("inodes").get(&fid) {
            st.size.store(size, Ordering::Release);
        }
    }

    pub fn add_lock_owner(&self, fid: Fid, owner: u64) {
        if let Some(st) = self.inodes.lock().expect("inodes").get_mut(&fid) {
            st.lock_owners.insert(owner);
        }
    }

    /// Forgets `owner`'s locks on `fid`; true if it held any (they must be released).
    pub fn take_lock_owner(&self, fid: Fid, owner: u64) -> bool {
        self.inodes.lock().expect("inodes").get_mut(&fid).is_some_and(|st| st.lock_owners.remove(&owner))
    }
}
