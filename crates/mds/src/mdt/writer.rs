//! The committer's write view of one batch, and the dispatch of a mutation to the
//! file of its family of operations.

use layout::LayoutSpec;
use proto::msg::{FileKind, Request, Response, SetAttr, Timespec};
use proto::{Errno, Fid};

use super::schema::{Redo, Tbl};
use super::view::View;

use super::error::{fail, OpError, OpResult};
use crate::inode::Inode;
use crate::lease::{Answered, DirLeases};
use layout::OstState;
use store::memtable::{MemTable, Prior};
use store::Snapshot;

/// Context the committer passes to a mutation.
pub struct Placement<'a> {
    pub osts: &'a [OstState],
    pub cursor: u64,
    pub default_layout: &'a LayoutSpec,
    /// Largest Data-on-MDT component a new file may get (`--dom-max`; 0: none, and a
    /// DoM component asked for is dropped).
    pub dom_max: u64,
    /// Whether any client (`None`) or the given one holds the FID open: an unlinked
    /// open file becomes an orphan instead of being destroyed, and a writer holding a
    /// file open may instantiate its components.
    pub is_open: &'a dyn Fn(Fid, Option<u64>) -> bool,
    /// Whether a client other than the given one holds the FID open.
    pub open_elsewhere: &'a dyn Fn(Fid, u64) -> bool,
    /// Marks a file leaving this MDT (`braid migrate -m`) unless a client holds it
    /// open (false): none opens it until the batch is applied (see
    /// `commit::OpenTable`).
    pub leave: &'a dyn Fn(Fid) -> bool,
}

/// The committer's write view of one batch. Every change goes through
/// [`Writer::put`] or [`Writer::del`]: into the memtable (where the batch's later
/// reads see it), into `redo` (the batch's record in the redo log), and into an undo
/// list that takes the batch back if it cannot be logged.
pub struct Writer<'a> {
    pub view: View<&'a mut MemTable>,
    pub mdt_index: u32,
    pub redo: Vec<Redo>,
    pub(super) undo: Vec<(Tbl, Vec<u8>, Prior)>,
    /// Where new FIDs come from; the committer keeps it between batches.
    pub fids: FidBlock,
    /// The MDT's directory leases (none while replaying the log): a change to the
    /// entries of a directory another client leases is refused.
    pub(super) leases: Option<&'a mut DirLeases>,
    /// Who the operation being applied comes from, and on which connection.
    pub client: u64,
    pub conn: u64,
    /// The operation across MDTs whose coordinator's half is being applied: its own
    /// halves held on this MDT (a striped directory's shard 0) do not fence it.
    pub coordinating: Option<proto::msg::UpdateId>,
    /// Leases granted in this batch (taken back with it).
    pub(super) granted: Vec<Fid>,
    /// Directories removed in this batch (their leases end with it).
    pub(super) removed_dirs: Vec<Fid>,
    /// Inodes made less inodes dropped in this batch (the MDT's count moves by it once
    /// the batch is logged).
    pub inodes_delta: i64,
}

/// Where one operation of a batch began, to take back just that operation.
#[derive(Debug, Clone, Copy)]
pub struct Savepoint {
    pub(super) undo: usize,
    redo: usize,
    pub(super) granted: usize,
    pub(super) removed_dirs: usize,
    inodes_delta: i64,
}

/// A batch dropped unfinished (it failed, could not be logged, or panicked) is taken
/// back, so readers never see a change the redo log does not hold.
impl Drop for Writer<'_> {
    fn drop(&mut self) {
        self.undo();
    }
}

/// FIDs reserved in `meta` and not handed out yet: `meta` is written once per
/// [`FID_BLOCK`] creates instead of on every one (Lustre grants FID sequences in
/// ranges for the same reason). A restart skips what remained of the block, so a FID
/// is never handed out twice. After a failed batch the committer drops its block,
/// since the reservation may not have been logged.
#[derive(Debug, Default)]
pub struct FidBlock {
    pub(super) seq: u64,
    pub(super) next: u64,
    pub(super) end: u64,
}

/// FIDs reserved at a time.
const FID_BLOCK: u64 = 1024;

/// Most FIDs one grant to a client holds.
pub const FID_GRANT_MAX: u64 = 4096;

const GRANT_PREFIX: &[u8] = b"fidgrant:";

/// The `meta` key of a grant in FID sequence `seq` ending (exclusively) at `end`.
fn grant_key(seq: u64, end: u64) -> Vec<u8> {
    let mut k = GRANT_PREFIX.to_vec();
    k.extend_from_slice(&seq.to_be_bytes());
    k.extend_from_slice(&end.to_be_bytes());
    k
}

impl<'a> Writer<'a> {
    /// Whether inode `fid` is held by an operation across MDTs other than the one
    /// being coordinated here.
    pub(super) fn held_by_another(&self, fid: Fid) -> OpResult<bool> {
        Ok(self.view.pending(fid)?.is_some_and(|p| Some(p.id) != self.coordinating))
    }

    pub fn new(base: Snapshot, mem: &'a mut MemTable, mdt_index: u32) -> Writer<'a> {
        Writer {
            view: View::new(base, mem),
            mdt_index,
            redo: Vec::new(),
            undo: Vec::new(),
            fids: FidBlock::default(),
            leases: None,
            client: 0,
            conn: 0,
            coordinating: None,
            granted: Vec::new(),
            removed_dirs: Vec::new(),
            inodes_delta: 0,
        }
    }

    /// Has this batch respect (and grant) the MDT's directory leases.
    pub fn with_leases(mut self, leases: &'a mut DirLeases) -> Writer<'a> {
        self.leases = Some(leases);
        self
    }

    /// Writes `key` → `value` in `table` and records the change.
    pub fn put(&mut self, table: Tbl, key: &[u8], value: &[u8]) -> OpResult<()> {
        self.check_lease(table, key)?;
        self.set(table, key, Some(value));
        self.redo.push(Redo::Put(table, key.to_vec(), value.to_vec()));
        Ok(())
    }

    /// Removes `key` from `table` and records the change.
    pub fn del(&mut self, table: Tbl, key: &[u8]) -> OpResult<()> {
        self.check_lease(table, key)?;
        self.set(table, key, None);
        self.redo.push(Redo::Del(table, key.to_vec()));
        Ok(())
    }

    /// Applies one recorded change without recording it again (the redo log's replay).
    pub fn replay(&mut self, op: &Redo) {
        match op {
            Redo::Put(t, k, v) => self.set(*t, k, Some(v)),
            Redo::Del(t, k) => self.set(*t, k, None),
        }
    }

    /// Every change to a directory's entries passes here: one another client holds a
    /// lease on must be revoked first.
    pub(super) fn check_lease(&self, table: Tbl, key: &[u8]) -> OpResult<()> {
        if table != Tbl::Dentries {
            return Ok(());
        }
        let (Some(leases), Some(dir)) = (self.leases.as_deref(), Fid::from_key(key)) else { return Ok(()) };
        match leases.get(dir) {
            Some(l) if l.holder != self.client || l.conn != self.conn => Err(OpError::Leased(dir)),
            _ => Ok(()),
        }
    }

    /// Lets through a change the client answered itself under lease `lease` on `dir`
    /// (see [`DirLeases::answered_under`]) or refuses it. One under a lease that holds
    /// is the holder's, on the connection the lease is on (the client may have
    /// reconnected since: the lease is still its own).
    fn answered_under(&mut self, dir: Fid, lease: u64) -> OpResult<()> {
        let Some(leases) = self.leases.as_deref() else { return Ok(()) };
        match leases.answered_under(dir, lease, self.client) {
            Answered::Held { conn } => {
                self.conn = conn;
                Ok(())
            }
            Answered::Replay => Ok(()),
            Answered::Gone => fail(
                Errno::Stale,
                format!(
                    "the lease on directory {dir} this change was answered under is gone (its holder did not \
                     answer a revocation, or came back after the recovery): refused"
                ),
            ),
        }
    }

    pub(super) fn set(&mut self, table: Tbl, key: &[u8], value: Option<&[u8]>) {
        let prior = self.view.mem.set(table.slot(), key, value);
        self.undo.push((table, key.to_vec(), prior));
    }

    /// A lease on `dir`, just made by this batch, for the current client.
    pub(super) fn grant_lease(&mut self, dir: Fid) -> Option<u64> {
        let id = self.leases.as_deref_mut()?.grant(dir, self.client, self.conn)?;
        self.granted.push(dir);
        Some(id)
    }

    /// Where the next operation begins.
    pub fn savepoint(&self) -> Savepoint {
        Savepoint {
            undo: self.undo.len(),
            redo: self.redo.len(),
            granted: self.granted.len(),
            removed_dirs: self.removed_dirs.len(),
            inodes_delta: self.inodes_delta,
        }
    }

    /// Whether anything was written since `sp`.
    pub fn wrote_since(&self, sp: Savepoint) -> bool {
        self.undo.len() > sp.undo || self.granted.len() > sp.granted || self.removed_dirs.len() > sp.removed_dirs
    }

    /// Takes back everything since `sp` (one operation that could not be applied).
    /// The FID block is dropped too: the operation may have reserved it.
    pub fn rollback(&mut self, sp: Savepoint) {
        self.undo_to(sp);
        self.fids = FidBlock::default();
    }

    pub(super) fn undo_to(&mut self, sp: Savepoint) {
        for (t, k, prior) in self.undo.drain(sp.undo..).rev() {
            self.view.mem.restore(t.slot(), &k, prior);
        }
        self.redo.truncate(sp.redo);
        for dir in self.granted.drain(sp.granted..) {
            if let Some(l) = self.leases.as_deref_mut() {
                l.forget(dir);
            }
        }
        self.removed_dirs.truncate(sp.removed_dirs);
        self.inodes_delta = sp.inodes_delta;
    }

    /// Keeps the batch's changes: the redo log holds them now.
    pub fn finish(mut self) {
        self.undo.clear();
        self.granted.clear();
        if let Some(l) = self.leases.as_deref_mut() {
            for dir in self.removed_dirs.drain(..) {
                l.forget(dir);
            }
        }
    }

    /// Takes back every change of this batch.
    pub(super) fn undo(&mut self) {
        self.undo_to(Savepoint { undo: 0, redo: 0, granted: 0, removed_dirs: 0, inodes_delta: 0 });
    }

    /// Moves the data version of file `fid` (gone or not a file: nothing to do).
    pub fn data_moved(&mut self, fid: Fid) -> OpResult<()> {
        let Some(mut ino) = self.view.inode(fid)? else { return Ok(()) };
        if ino.attr.kind != FileKind::File {
            return Ok(());
        }
        ino.attr.data_version += 1;
        self.put_inode(fid, &ino)
    }

    pub(super) fn put_inode(&mut self, fid: Fid, ino: &Inode) -> OpResult<()> {
        debug_assert_eq!(ino.attr.fid, fid, "an inode is stored under its own FID");
        self.put(Tbl::Inodes, &fid.to_key(), &store::encode_record(ino))
    }

    pub(super) fn meta_u64(&self, key: &str) -> OpResult<Option<u64>> {
        self.view.meta_u64(key)
    }

    pub(super) fn set_meta_u64(&mut self, key: &str, v: u64) -> OpResult<()> {
        self.put(Tbl::Meta, key.as_bytes(), &v.to_le_bytes())
    }

    /// Allocates the FID of a new inode on this MDT (and counts the inode): a sequence
    /// holds 2^32 - 1 object ids. They come from the block in `fids`; an exhausted block
    /// reserves the next one in `meta` (in this batch's transaction and redo record).
    pub(super) fn new_fid(&mut self) -> OpResult<Fid> {
        if self.fids.next >= self.fids.end {
            let mut seq = self.meta_u64("seq")?.unwrap_or(proto::fid::FIRST_SEQ as u64);
            let mut oid = self.meta_u64("next_oid")?.unwrap_or(2);
            if oid > u32::MAX as u64 {
                seq += 1;
                oid = 1;
            }
            if seq > 0xffff {
                return fail(Errno::NoSpc, "this MDT has used all of its FID sequences");
            }
            let end = (oid + FID_BLOCK).min(u32::MAX as u64 + 1);
            self.set_meta_u64("seq", seq)?;
            self.set_meta_u64("next_oid", end)?;
            self.fids = FidBlock { seq, next: oid, end };
        }
        let oid = self.fids.next;
        self.fids.next += 1;
        self.inodes_delta += 1;
        Ok(Fid::new(self.mdt_index, self.fids.seq as u32, oid as u32))
    }

    /// Grants `count` FIDs (at most [`FID_GRANT_MAX`]) for creates a client answers
    /// itself: a range past every FID reserved so far, recorded in `meta` so that a
    /// create naming one is accepted after a restart too (16 bytes per grant).
    pub(super) fn grant_fids(&mut self, count: u32) -> OpResult<Response> {
        let count = (count as u64).clamp(1, FID_GRANT_MAX);
        let mut seq = self.meta_u64("seq")?.unwrap_or(proto::fid::FIRST_SEQ as u64);
        let mut oid = self.meta_u64("next_oid")?.unwrap_or(2);
        if oid + count > u32::MAX as u64 + 1 {
            seq += 1;
            oid = 1;
        }
        if seq > 0xffff {
            return fail(Errno::NoSpc, "this MDT has used all of its FID sequences");
        }
        let end = oid + count;
        self.set_meta_u64("seq", seq)?;
        self.set_meta_u64("next_oid", end)?;
        let first = Fid::new(self.mdt_index, seq as u32, oid as u32);
        self.put(Tbl::Meta, &grant_key(first.seq, end), &oid.to_le_bytes())?;
        Ok(Response::FidGrant { first, count: count as u32 })
    }

    /// Whether `fid` lies in a range granted by [`Writer::grant_fids`].
    pub(super) fn fid_granted(&self, fid: Fid) -> OpResult<bool> {
        if fid.mdt() != self.mdt_index {
            return Ok(false);
        }
        // The first grant of the sequence ending past the FID: the FID is in it if
        // the grant starts at or below it.
        let prefix = grant_key(fid.seq, 0);
        let prefix = &prefix[..GRANT_PREFIX.len() + 8];
        let from = grant_key(fid.seq, fid.oid as u64 + 1);
        let mut rows = self.view.scan(Tbl::Meta, std::ops::Bound::Included(from.as_slice()))?;
        match rows.next().transpose()? {
            Some((k, v)) if k.starts_with(prefix) => {
                let start = v.as_slice().try_into().map(u64::from_le_bytes).unwrap_or(u64::MAX);
                Ok(start <= fid.oid as u64)
            }
            _ => Ok(false),
        }
    }

    pub(super) fn touch_dir(&mut self, fid: Fid, dir: &mut Inode, now: Timespec, nlink_delta: i32) -> OpResult<()> {
        dir.attr.mtime = now;
        dir.attr.ctime = now;
        dir.attr.nlink = (dir.attr.nlink as i64 + nlink_delta as i64).max(0) as u32;
        self.put_inode(fid, dir)
    }

    /// Applies one mutation. Errno errors are returned before anything is written.
    pub fn apply(&mut self, req: &Request, place: &mut Placement<'_>) -> OpResult<Response> {
        let now = Timespec::now();
        match req {
            Request::MdsCreate { creds, parent, name, mode, exclusive, flags, layout } => {
                self.create(creds, *parent, name, *mode, *exclusive, *flags, layout.clone(), place, now)
            }
            Request::MdsCreateGranted { creds, parent, name, mode, fid, layout, data, lease, .. } => {
                self.answered_under(*parent, *lease)?;
                self.create_granted(creds, *parent, name, *mode, *fid, layout, data, place, now)
            }
            &Request::MdsFidGrant { mdt, count } => {
                if mdt != self.mdt_index {
                    return fail(Errno::Stale, format!("a FID grant for MDT {mdt} reached MDT {}", self.mdt_index));
                }
                self.grant_fids(count)
            }
            Request::MdsMkdir { creds, parent, name, mode, lease, spec } => {
                if spec.is_some_and(|s| s.mdt != self.mdt_index || s.count != 1) {
                    return fail(
                        Errno::Inval,
                        "a remote or striped mkdir is coordinated by the MDS, not applied as one",
                    );
                }
                self.mkdir(creds, *parent, name, *mode, *lease, now)
            }
            Request::MdsUpdate { mdt, id, op } => {
                if *mdt != self.mdt_index {
                    return fail(Errno::Stale, format!("an update for MDT {mdt} reached MDT {}", self.mdt_index));
                }
                self.update(*id, op, place, now)
            }
            &Request::MdsUpdateDone { fid, id, committed, .. } => self.update_done(fid, id, committed, place),
            Request::MdsShardSync(sync) => self.shard_sync(sync, now),
            Request::MdsSymlink { creds, parent, name, target } => self.symlink(creds, *parent, name, target, now),
            Request::MdsMknod { creds, parent, name, kind, mode, rdev } => {
                self.mknod(creds, *parent, name, *kind, *mode, *rdev, now)
            }
            Request::MdsLink { creds, fid, parent, name } => self.link(creds, *fid, *parent, name, now),
            Request::MdsUnlink { creds, parent, name } => self.remove(creds, *parent, name, false, place, now),
            Request::MdsUnlinkAt { creds, parent, name, at, lease } => {
                self.answered_under(*parent, *lease)?;
                // Never back in time (the client's clock may be behind): the later of
                // its time and the directory's, as the client itself shows it.
                let at = self.view.inode(*parent)?.map_or(*at, |d| (*at).max(d.attr.mtime));
                self.remove(creds, *parent, name, false, place, at)
            }
            Request::MdsRmdir { creds, parent, name } => self.remove(creds, *parent, name, true, place, now),
            Request::MdsRename { creds, parent, name, new_parent, new_name, flags } => {
                self.rename(creds, *parent, name, *new_parent, new_name, *flags, place, now, false)
            }
            &Request::MdsClose { fid, size, mtime, trunc_epoch } => {
                let mut ino = match self.view.handle_inode(fid) {
                    Ok(ino) => ino,
                    // Gone: the size goes with the file to where it moved, if it did.
                    Err(e @ OpError::Moved(..)) if size.is_some() => return Err(e),
                    Err(_) => return Ok(Response::Ok),
                };
                if let Some(size) = size {
                    self.view.takes_changes(&ino)?;
                    if trunc_epoch != ino.attr.trunc_epoch {
                        return Ok(Response::EpochMoved { trunc_epoch: ino.attr.trunc_epoch });
                    }
                    ino.attr.size = ino.attr.size.max(size);
                    written(&mut ino, mtime, now);
                    self.put_inode(fid, &ino)?;
                }
                // An orphan is left to the reaper (see `reap_replaced`).
                Ok(Response::Ok)
            }
            Request::MdsSetattr { creds, fid, set } => self.setattr(creds, *fid, set.clone(), now),
            Request::MdsFsckRepair { creds, fix } => self.fsck_fix(creds, fix),
            Request::MdsSetxattr { creds, fid, name, value, mode } => {
                self.setxattr(creds, *fid, name, value.clone(), *mode, now)
            }
            Request::MdsRemovexattr { creds, fid, name } => self.removexattr(creds, *fid, name, now),
            Request::MdsSetDirLayout { creds, fid, spec } => {
                self.set_dir_layout(creds, *fid, spec.clone(), place.dom_max, now)
            }
            Request::MdsLayoutChange { creds, fid, change } => self.layout_change(creds, *fid, change, place, now),
            Request::MdsReplaceLayout { creds, fid, layout, data_version } => {
                self.replace_layout(creds, *fid, layout, *data_version, place, now)
            }
            Request::MdsDomWrite { fid, offset, data, publish } => self.dom_write(*fid, *offset, data, *publish, now),
            &Request::MdsDomTrim { fid, offset, len } => self.dom_trim(fid, offset, len),
            &Request::MdsDomPunch { fid, size } => self.dom_cut(fid, size),
            Request::MdsSizeUpdate { fid, size, mtime, trunc_epoch, behind } => {
                let (fid, size, mtime) = (*fid, *size, *mtime);
                let mut ino = self.view.handle_inode(fid)?;
                if ino.attr.kind != FileKind::File {
                    return fail(Errno::IsDir, "size update of a non-file");
                }
                self.view.takes_changes(&ino)?;
                if *trunc_epoch != ino.attr.trunc_epoch {
                    return Ok(Response::EpochMoved { trunc_epoch: ino.attr.trunc_epoch });
                }
                if let Some(b) = behind {
                    let sp = self.savepoint();
                    let set = SetAttr { size: None, by_writer: false, ..b.set.clone() };
                    if let Err(e) = self.setattr(&b.creds, fid, set, now) {
                        // Left out, as a setattr sent alone would have been refused: the
                        // client finds the change missing from the answer.
                        tracing::debug!(%fid, "attributes set behind, refused with a size report: {e}");
                        self.undo_to(sp);
                    }
                    ino = self.view.must_inode(fid)?;
                }
                ino.attr.size = ino.attr.size.max(size);
                written(&mut ino, mtime, now);
                self.put_inode(fid, &ino)?;
                Ok(Response::Attr(ino.attr.clone()))
            }
            other => fail(Errno::Proto, format!("{} is not a mutation", other.op_name())),
        }
    }
}

/// A writer's report of its writes (`MdsSizeUpdate`, `MdsClose`): the data changed,
/// and the mtime is the report's unless the writer set the times explicitly since
/// its last write (`None`).
fn written(ino: &mut Inode, mtime: Option<Timespec>, now: Timespec) {
    match mtime {
        Some(m) => {
            ino.attr.mtime = m;
            ino.attr.ctime = now.max(m);
        }
        None => ino.attr.ctime = now,
    }
    ino.attr.data_version += 1;
}
