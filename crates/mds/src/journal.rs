//! The journal: where each batch's changes go before its replies, and where they come
//! back from after a crash.
//!
//! A durable redb commit rewrites the touched B-tree pages and fsyncs: a few hundred
//! microseconds, paid by every metadata operation of a client that works alone. So a
//! batch is applied to the memtable (readers see it at once), its changes are appended
//! to the journal as one record, and a periodic checkpoint writes the memtable into
//! the database in one durable transaction, records the last journal sequence it
//! covers, and empties the journal. At open, records past that sequence are applied
//! again ([`recover`]).
//!
//! [`Journal`] is the seam: a local redo log ([`store::wal::Wal`]: an acknowledged
//! operation survives a crash of the process at once and of the machine once the
//! log or a checkpoint reached the disk), or a replicated MDT's Raft log
//! ([`crate::replica`]), whose records are committed once a majority holds them
//! ([`Journal::committed`]), leaving group commit and the namespace untouched.

use std::sync::RwLock;
use std::time::{Duration, Instant};

use store::memtable::MemTable;
use store::wal::Wal;
use store::{Store, StoreError};

use crate::mdt::schema::{RedoBatch, TABLES};
use crate::mdt::{OpResult, Tbl, View, Writer};

/// Ends once a replicated journal's records are committed ([`Journal::until_committed`]).
pub type CommitWait = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Where batch records go, in order. Sequence numbers rise by one per record.
pub trait Journal: Send {
    /// Appends one batch's record (not necessarily on stable storage yet).
    fn append(&mut self, seq: u64, record: &[u8]) -> Result<(), StoreError>;
    /// Puts every appended record on stable storage.
    fn sync(&mut self) -> Result<(), StoreError>;
    /// Bytes held since the last checkpoint.
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Drops what lies past `len` bytes: an aborted batch's record, or (0) everything
    /// a checkpoint made durable in the database.
    fn truncate(&mut self, len: u64) -> Result<(), StoreError>;
    /// A replicated journal: the sequence number of the last record a majority
    /// holds (records are committed in order); `None` for a local journal, whose
    /// records are committed once appended.
    fn committed(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
    /// A replicated journal: what to wait for before answering a batch, if every
    /// record appended so far is not committed yet (it never ends if the group
    /// lost this leader).
    fn until_committed(&mut self) -> Option<CommitWait> {
        None
    }
    /// Rows a checkpoint writes to the `meta` table with the memtable (a replicated
    /// journal's applied log id).
    fn checkpoint_meta(&self) -> Vec<(&'static [u8], Vec<u8>)> {
        Vec::new()
    }
}

impl Journal for Wal {
    fn append(&mut self, seq: u64, record: &[u8]) -> Result<(), StoreError> {
        Wal::append(self, seq, record)
    }
    fn sync(&mut self) -> Result<(), StoreError> {
        Wal::sync(self)
    }
    fn len(&self) -> u64 {
        Wal::len(self)
    }
    fn truncate(&mut self, len: u64) -> Result<(), StoreError> {
        Wal::truncate(self, len)
    }
}

/// The journal is checkpointed at least this often by size.
const CHECKPOINT_BYTES: u64 = 64 << 20;

/// How long a replicated MDT's checkpoint waits for the group to commit.
const CHECKPOINT_COMMIT_WAIT: Duration = Duration::from_secs(5);

/// `meta` key: the last journal record the durable database holds.
const JOURNAL_SEQ: &str = "wal_seq";

/// A journal and its bookkeeping: sequence, what is unsynced, when to checkpoint.
pub struct Journaled {
    journal: Box<dyn Journal>,
    /// The last record's sequence number.
    seq: u64,
    /// Records appended since the journal was last forced to stable storage.
    unsynced: bool,
    /// Length of the journal up to the last committed batch.
    committed_len: u64,
    last_checkpoint: Instant,
    checkpoint_interval: Duration,
}

impl Journaled {
    /// A journal with nothing past the database (a replicated MDT's, whose database
    /// holds every committed entry when its leader starts serving).
    pub fn new(journal: Box<dyn Journal>, checkpoint_interval: Duration) -> Journaled {
        Journaled {
            journal,
            seq: 0,
            unsynced: false,
            committed_len: 0,
            last_checkpoint: Instant::now(),
            checkpoint_interval,
        }
    }

    /// The last record's sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// See [`Journal::until_committed`].
    pub fn until_committed(&mut self) -> Option<CommitWait> {
        self.journal.until_committed()
    }

    /// Appends one batch's changes; the batch is committed once this returns (or,
    /// replicated, once [`Journaled::committed`] reaches it).
    pub fn log(&mut self, redo: &RedoBatch) -> Result<(), StoreError> {
        self.journal.append(self.seq + 1, &store::encode_record(redo))?;
        self.seq += 1;
        self.committed_len = self.journal.len();
        self.unsynced = true;
        Ok(())
    }

    /// Forces the journal to stable storage if anything is unsynced.
    pub fn sync(&mut self) -> Result<(), StoreError> {
        if self.unsynced {
            self.journal.sync()?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// Takes back a record appended by a batch that did not finish (it panicked).
    pub fn take_back_unfinished(&mut self) -> Result<(), StoreError> {
        self.journal.truncate(self.committed_len)
    }

    /// The journal's size in bytes.
    pub fn bytes(&self) -> u64 {
        self.journal.len()
    }

    /// Checkpoints if the interval has passed or the journal grew large; how long a
    /// checkpoint made took.
    pub fn checkpoint_if_due(&mut self, store: &Store, mem: &RwLock<MemTable>, mdt: u32) -> Option<Duration> {
        let due = self.last_checkpoint.elapsed() >= self.checkpoint_interval || self.journal.len() >= CHECKPOINT_BYTES;
        if !due || self.journal.is_empty() {
            return None;
        }
        if let Some(mut committed) = self.journal.committed().filter(|c| *c.borrow() < self.seq) {
            // The database may only ever hold what a majority holds: wait for the
            // records the memtable holds (this task holds the committer only).
            let seq = self.seq;
            let waited = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current()
                    .block_on(tokio::time::timeout(CHECKPOINT_COMMIT_WAIT, committed.wait_for(|c| *c >= seq)))
            });
            if !matches!(waited, Ok(Ok(_))) {
                tracing::warn!(mdt, seq, "checkpoint put off: the group has not committed the memtable's entries");
                self.last_checkpoint = Instant::now();
                return None;
            }
        }
        let started = Instant::now();
        let done = match checkpoint(store, mem, self.journal.as_mut(), self.seq) {
            Ok(()) => {
                self.unsynced = false;
                self.committed_len = 0;
                Some(started.elapsed())
            }
            Err(e) => {
                tracing::error!(mdt, "checkpoint failed, the journal is kept: {e}");
                None
            }
        };
        self.last_checkpoint = Instant::now();
        done
    }
}

/// Writes the memtable into the database in one durable transaction, records that it
/// covers the journal up to record `seq`, then empties the memtable and the journal.
fn checkpoint(store: &Store, mem: &RwLock<MemTable>, journal: &mut dyn Journal, seq: u64) -> OpResult<()> {
    let started = Instant::now();
    let mut b = store.batch(true)?;
    b.write_back(&mem.read().unwrap_or_else(std::sync::PoisonError::into_inner), &TABLES)?;
    b.put(Tbl::Meta.table(), JOURNAL_SEQ.as_bytes(), &seq.to_le_bytes())?;
    for (k, v) in journal.checkpoint_meta() {
        b.put(Tbl::Meta.table(), k, &v)?;
    }
    b.commit()?;
    // The database now holds what the memtable did: readers see the same either way.
    let entries = {
        let mut m = mem.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = m.len();
        m.clear();
        n
    };
    journal.truncate(0)?;
    tracing::debug!(seq, entries, elapsed_us = started.elapsed().as_micros() as u64, "checkpoint");
    Ok(())
}

/// Applies the journal's records the durable database lacks (what the process
/// acknowledged before it died), written in database format `format`, then
/// checkpoints; returns the journal ready for new records.
pub fn recover(
    store: &Store,
    mem: &RwLock<MemTable>,
    mdt: u32,
    mut journal: Box<dyn Journal>,
    records: Vec<(u64, Vec<u8>)>,
    format: u64,
    checkpoint_interval: Duration,
) -> OpResult<Journaled> {
    let durable = View::new(store.snapshot()?, &crate::mdt::new_memtable()).meta_u64(JOURNAL_SEQ)?.unwrap_or(0);
    let mut seq = durable;
    let pending: Vec<_> = records.into_iter().filter(|(s, _)| *s > durable).collect();
    if !pending.is_empty() {
        let mut m = mem.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut w = Writer::new(store.snapshot()?, &mut m, mdt);
        for (s, payload) in &pending {
            for op in &RedoBatch::decode(format, payload)?.0 {
                w.replay(op);
            }
            seq = *s;
        }
        w.finish();
        tracing::info!(mdt, "replayed {} journal record(s) up to {seq}", pending.len());
    }
    checkpoint(store, mem, journal.as_mut(), seq)?;
    Ok(Journaled {
        journal,
        seq,
        unsynced: false,
        committed_len: 0,
        last_checkpoint: Instant::now(),
        checkpoint_interval,
    })
}
