//! The state machine of one MDT replica: the MDT's database, to which committed
//! entries are applied.
//!
//! A follower applies each entry's changes ([`RedoBatch`], physical puts and
//! deletes) to the database directly, with the last applied log id and membership
//! in the same transaction (durable at most a second later: what a crash takes
//! back, the log gives again). The leader does not: its committer applied its own
//! entries to its memtable before proposing them, and its checkpoint writes them
//! with the applied log id (see [`crate::journal`]). So the database always holds
//! a prefix of the committed log, and a snapshot is one read transaction of it.
//!
//! Snapshot format: rows `table u8 | key len u32 LE | key | value len u32 LE |
//! value`, `table` being the position in [`TABLES`].

use std::io::Cursor;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StoredMembership,
};
use store::memtable::MemTable;
use store::{Store, StoreError};

use super::{BasicNode, Entry, NodeId, TypeConfig};
use crate::mdt::schema::{Redo, RedoBatch, TABLES};
use crate::mdt::Tbl;

/// `meta` keys: the last log entry the database holds, and the membership then.
pub(crate) const META_APPLIED: &[u8] = b"raft_applied";
pub(crate) const META_MEMBERSHIP: &[u8] = b"raft_membership";

/// A follower's applied entries are made durable at least this often.
const DURABLE_EVERY: Duration = Duration::from_secs(1);

pub(crate) type Membership = StoredMembership<NodeId, BasicNode>;

/// A snapshot as kept to send: its description and its bytes.
type Kept = (SnapshotMeta<NodeId, BasicNode>, Arc<Vec<u8>>);

/// The database's rows, and the log id and membership they are as of.
struct Dump {
    applied: Option<LogId<NodeId>>,
    membership: Membership,
    data: Vec<u8>,
}

/// One row of a snapshot: the table's position in [`TABLES`], the key, the value.
type SnapRow<'a> = (usize, &'a [u8], &'a [u8]);

/// What the state machine shares with the rest of the replica.
pub struct Shared {
    store: Arc<Store>,
    /// A follower's applied changes not in the database yet (the leader's MDT
    /// takes it over, see [`crate::replica`]).
    pub(crate) mem: Arc<RwLock<MemTable>>,
    /// The last entry applied, and the membership as of it.
    pub(crate) applied: Mutex<(Option<LogId<NodeId>>, Membership)>,
    /// While this process serves the MDT as leader: the origin its entries carry
    /// (their changes are in its memtable already). 0 otherwise.
    pub(crate) serving: AtomicU64,
    /// Entries were applied since the last checkpoint.
    unflushed: AtomicBool,
    /// The last snapshot built or installed, as sent to a lagging replica.
    current: Mutex<Option<Kept>>,
}

impl Shared {
    pub(crate) fn applied(&self) -> (Option<LogId<NodeId>>, Membership) {
        self.applied.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// A follower's checkpoint: the memtable into the database, with the applied
    /// log id, in one durable transaction. Nothing once this process serves (the
    /// leader's memtable holds proposals, which its committer checkpoints once the
    /// group committed them).
    pub(crate) fn checkpoint(&self) -> Result<(), StoreError> {
        let mut mem = self.mem.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.serving.load(Ordering::Acquire) != 0 || !self.unflushed.load(Ordering::Acquire) {
            return Ok(());
        }
        let (applied, membership) = self.applied();
        let mut b = self.store.batch(true)?;
        b.write_back(&mem, &TABLES)?;
        let meta = Tbl::Meta.table();
        b.put(meta, META_APPLIED, &postcard::to_allocvec(&applied).expect("encodes"))?;
        b.put(meta, META_MEMBERSHIP, &postcard::to_allocvec(&membership).expect("encodes"))?;
        b.commit()?;
        mem.clear();
        self.unflushed.store(false, Ordering::Release);
        Ok(())
    }
}

pub struct StateMachine {
    pub(crate) shared: Arc<Shared>,
}

fn sm_err(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageError::from_io_error(subject, verb, std::io::Error::other(e.to_string()))
}

fn read_meta<T: serde::de::DeserializeOwned + Default>(snap: &store::Snapshot, key: &[u8]) -> Result<T, StoreError> {
    snap.get(Tbl::Meta.table(), key, |v| {
        postcard::from_bytes(v).map_err(|e| StoreError::Corrupt { what: "raft meta", detail: e.to_string() })
    })
    .map(Option::unwrap_or_default)
}

impl StateMachine {
    /// The state machine over `store`, as its database says it was last applied.
    pub fn open(store: Arc<Store>) -> Result<StateMachine, StoreError> {
        {
            let mut b = store.batch(true)?;
            b.create(&TABLES)?;
            b.commit()?;
        }
        let snap = store.snapshot()?;
        let applied: Option<LogId<NodeId>> = read_meta(&snap, META_APPLIED)?;
        let membership: Membership = read_meta(&snap, META_MEMBERSHIP)?;
        let shared = Arc::new(Shared {
            store,
            mem: Arc::new(RwLock::new(crate::mdt::new_memtable())),
            applied: Mutex::new((applied, membership)),
            serving: AtomicU64::new(0),
            unflushed: AtomicBool::new(false),
            current: Mutex::new(None),
        });
        Ok(StateMachine { shared })
    }

    fn apply_entries(&self, entries: Vec<Entry>) -> Result<usize, StoreError> {
        let serving = self.shared.serving.load(Ordering::Acquire);
        let foreign = |e: &Entry| matches!(&e.payload, EntryPayload::Normal(d) if serving == 0 || d.origin != serving);
        // A serving leader's own entries are in its memtable already, and its apply
        // is on every reply's path: the memtable is not even locked for them.
        let mut mem = match entries.iter().any(foreign) {
            true => Some(self.shared.mem.write().unwrap_or_else(std::sync::PoisonError::into_inner)),
            false => None,
        };
        let (mut applied, mut membership) = self.shared.applied();
        let n = entries.len();
        for e in entries {
            match e.payload {
                EntryPayload::Blank => {}
                EntryPayload::Membership(m) => membership = StoredMembership::new(Some(e.log_id), m),
                EntryPayload::Normal(d) if serving != 0 && d.origin == serving => {}
                EntryPayload::Normal(d) => {
                    if serving != 0 {
                        // Only the leader proposes, and a leader serves one term.
                        tracing::error!("a serving leader applies an entry it did not propose");
                    }
                    let mem = mem.as_mut().expect("locked for foreign entries");
                    for op in RedoBatch::decode(d.format, &d.redo)?.0 {
                        match op {
                            Redo::Put(t, k, v) => mem.set(t.slot(), &k, Some(&v)),
                            Redo::Del(t, k) => mem.set(t.slot(), &k, None),
                        };
                    }
                }
            }
            applied = Some(e.log_id);
        }
        // Under the memtable's lock: a checkpoint sees changes and log id together.
        *self.shared.applied.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = (applied, membership);
        self.shared.unflushed.store(true, Ordering::Release);
        drop(mem);
        Ok(n)
    }
}

/// A follower's checkpoints, every [`DURABLE_EVERY`], until it serves or `shared`
/// goes.
pub(crate) async fn flush(shared: std::sync::Weak<Shared>) {
    loop {
        tokio::time::sleep(DURABLE_EVERY).await;
        let Some(shared) = shared.upgrade() else { return };
        if shared.serving.load(Ordering::Acquire) != 0 {
            return;
        }
        if let Err(e) = shared.checkpoint() {
            tracing::error!("cannot checkpoint applied entries (the log still holds them): {e}");
        }
    }
}

/// Builds snapshots from one read transaction of the database.
pub struct SnapBuilder {
    store: Arc<Store>,
    shared: Arc<Shared>,
}

/// Every row of the database, and the log id and membership it holds.
fn dump(store: &Store) -> Result<Dump, StoreError> {
    let snap = store.snapshot()?;
    let applied = read_meta(&snap, META_APPLIED)?;
    let membership = read_meta(&snap, META_MEMBERSHIP)?;
    let mut out = Vec::new();
    for (pos, t) in TABLES.iter().enumerate() {
        for row in snap.range(*t, std::ops::Bound::Unbounded)? {
            let (k, v) = row?;
            out.push(pos as u8);
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(&k);
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(&v);
        }
    }
    Ok(Dump { applied, membership, data: out })
}

/// The rows of a snapshot, checked whole before anything is written.
fn parse(data: &[u8]) -> Result<Vec<SnapRow<'_>>, StoreError> {
    let bad = |detail: String| StoreError::Corrupt { what: "replica snapshot", detail };
    let mut rows = Vec::new();
    let mut at = 0usize;
    let take = |at: &mut usize| -> Result<&[u8], StoreError> {
        let len = data
            .get(*at..*at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| bad(format!("truncated at byte {at}")))?;
        let v = data.get(*at + 4..*at + 4 + len).ok_or_else(|| bad(format!("truncated at byte {at}")))?;
        *at += 4 + len;
        Ok(v)
    };
    while at < data.len() {
        let pos = data[at] as usize;
        if pos >= TABLES.len() {
            return Err(bad(format!("table {pos} at byte {at} does not exist")));
        }
        at += 1;
        let k = take(&mut at)?;
        let v = take(&mut at)?;
        rows.push((pos, k, v));
    }
    Ok(rows)
}

impl RaftSnapshotBuilder<TypeConfig> for SnapBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        // A follower's memtable goes in first, so the snapshot has all it applied.
        let read = |e| sm_err(ErrorSubject::StateMachine, ErrorVerb::Read, e);
        self.shared.checkpoint().map_err(read)?;
        let Dump { applied, membership, data } = dump(&self.store).map_err(read)?;
        let id = format!("{}-{}", applied.map_or(0, |l| l.index), super::now_millis());
        let meta = SnapshotMeta { last_log_id: applied, last_membership: membership, snapshot_id: id };
        let data = Arc::new(data);
        tracing::info!(last = ?applied, bytes = data.len(), "snapshot built");
        *self.shared.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((meta.clone(), data.clone()));
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new((*data).clone())) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId<NodeId>>, Membership), StorageError<NodeId>> {
        Ok(self.shared.applied())
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let n = self.apply_entries(entries).map_err(|e| sm_err(ErrorSubject::StateMachine, ErrorVerb::Write, e))?;
        Ok(vec![(); n])
    }

    async fn get_snapshot_builder(&mut self) -> SnapBuilder {
        SnapBuilder { store: self.shared.store.clone(), shared: self.shared.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let data = snapshot.into_inner();
        let mut mem = self.shared.mem.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let installed = (|| -> Result<(), StoreError> {
            let rows = parse(&data)?;
            let mut b = self.shared.store.batch(true)?;
            for t in TABLES {
                b.clear(t)?;
            }
            for (pos, k, v) in rows {
                b.put(TABLES[pos], k, v)?;
            }
            let m = Tbl::Meta.table();
            b.put(m, META_APPLIED, &postcard::to_allocvec(&meta.last_log_id).expect("encodes"))?;
            b.put(m, META_MEMBERSHIP, &postcard::to_allocvec(&meta.last_membership).expect("encodes"))?;
            b.commit()
        })();
        installed.map_err(|e| sm_err(ErrorSubject::Snapshot(Some(meta.signature())), ErrorVerb::Write, e))?;
        mem.clear();
        *self.shared.applied.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            (meta.last_log_id, meta.last_membership.clone());
        drop(mem);
        tracing::info!(last = ?meta.last_log_id, bytes = data.len(), "snapshot installed");
        *self.shared.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((meta.clone(), Arc::new(data)));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let current = self.shared.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        Ok(current.map(|(meta, data)| Snapshot { meta, snapshot: Box::new(Cursor::new((*data).clone())) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_parses_back_and_damage_is_refused() {
        let dir = std::env::temp_dir().join(format!("braid-sm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = Arc::new(Store::open(&dir.join("s.redb")).unwrap());
        let sm = StateMachine::open(store.clone()).unwrap();
        let mut b = store.batch(true).unwrap();
        b.put(Tbl::Inodes.table(), b"k1", b"v1").unwrap();
        b.put(Tbl::Dentries.table(), b"k2", b"").unwrap();
        b.commit().unwrap();
        let data = dump(&store).unwrap().data;
        let rows = parse(&data).unwrap();
        assert!(rows.contains(&(0, &b"k1"[..], &b"v1"[..])));
        assert!(rows.contains(&(1, &b"k2"[..], &b""[..])));
        assert!(parse(&data[..data.len() - 1]).is_err(), "a truncated snapshot is refused");
        let mut bad = data.clone();
        bad[0] = 200;
        assert!(parse(&bad).is_err(), "a table that does not exist is refused");
        drop(sm);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
