//! The Raft log of one MDT replica: entries appended to one file of CRC'd records,
//! the vote and the purge point each in a small file written durably. The commit
//! point is not kept (openraft's `save_committed` is optional): a restarted replica
//! learns it from the leader, and writing it at every commit cost every change a
//! file replaced on the leader's path.
//!
//! Why not redb: one durable redb commit per append costs a few hundred
//! microseconds (see [`crate::journal`]); an append here is one `write` and, when
//! the MDS is told to sync its journal, one `fdatasync`. The whole log is kept in
//! memory as well: entries go once a snapshot covers them ([`LogStore::purge`]),
//! and the file is rewritten when most of it is purged.
//!
//! Record: `len u32 LE | crc32c(body) u32 LE | body` (postcard of the entry). A torn
//! or damaged record at the tail (a crash mid-append) ends the log there.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader, StorageError, Vote};

use super::{Entry, NodeId, TypeConfig};

/// Records larger than this are damage, not entries (a batch is at most a few MiB).
const RECORD_MAX: usize = 256 << 20;

/// Rewrite the file once this many purged bytes lead it.
const COMPACT_BYTES: u64 = 64 << 20;

struct Inner {
    dir: PathBuf,
    file: File,
    /// Entries present, by index, with the file offset their record starts at.
    entries: BTreeMap<u64, (Entry, u64)>,
    /// Length of the file.
    end: u64,
    purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    /// `fdatasync` every append (the MDS's `sync_journal`).
    sync: bool,
}

/// The log store; clones share it (openraft reads through one while appending
/// through another).
#[derive(Clone)]
pub struct LogStore(Arc<Mutex<Inner>>);

fn io_err(what: &str, path: &Path, e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("{what} {}: {e}", path.display()))
}

fn io_failed(subject: ErrorSubject<NodeId>, e: std::io::Error) -> StorageError<NodeId> {
    StorageError::from_io_error(subject, ErrorVerb::Write, e)
}

fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent() {
        File::open(parent)?.sync_all()?;
    }
    Ok(())
}

fn read_small<T: serde::de::DeserializeOwned>(path: &Path) -> std::io::Result<Option<T>> {
    match std::fs::read(path) {
        Ok(b) => postcard::from_bytes(&b).map(Some).map_err(|e| io_err("cannot decode", path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn encode_record(e: &Entry) -> Vec<u8> {
    let body = postcard::to_allocvec(e).expect("a log entry encodes");
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

impl LogStore {
    /// Opens (creating) the log in `dir`. A damaged tail is cut off, with a warning.
    pub fn open(dir: &Path, sync: bool) -> std::io::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("log");
        let mut file = OpenOptions::new().read(true).append(true).create(true).open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let purged: Option<LogId<NodeId>> = read_small(&dir.join("purged"))?;
        let mut entries = BTreeMap::new();
        let mut at = 0usize;
        while at + 8 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
            let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes"));
            let Some(body) = bytes.get(at + 8..at + 8 + len).filter(|_| len <= RECORD_MAX) else { break };
            if crc32c::crc32c(body) != crc {
                break;
            }
            let Ok(e) = postcard::from_bytes::<Entry>(body) else { break };
            let index = e.log_id.index;
            // Entries past a truncation point were cut by a later append.
            let cut: Vec<u64> = entries.range(index..).map(|(i, _)| *i).collect();
            for i in cut {
                entries.remove(&i);
            }
            if purged.is_none_or(|p| index > p.index) {
                entries.insert(index, (e, at as u64));
            }
            at += 8 + len;
        }
        if at < bytes.len() {
            tracing::warn!("Raft log {}: {} damaged byte(s) at its end cut off", path.display(), bytes.len() - at);
            file.set_len(at as u64)?;
            file.sync_all()?;
        }
        let vote = read_small(&dir.join("vote"))?;
        Ok(LogStore(Arc::new(Mutex::new(Inner {
            dir: dir.to_path_buf(),
            file,
            entries,
            end: at as u64,
            purged,
            vote,
            sync,
        }))))
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether this replica has never taken part in its group (no vote, no entry).
    pub fn is_pristine(&self) -> bool {
        let i = self.inner();
        i.vote.is_none() && i.entries.is_empty() && i.purged.is_none()
    }
}

impl Inner {
    /// Rewrites the file with the entries present only (after purges).
    fn compact(&mut self) -> std::io::Result<()> {
        let path = self.dir.join("log");
        let tmp = self.dir.join("log.tmp");
        let mut out = Vec::new();
        let mut placed = BTreeMap::new();
        for (i, (e, _)) in std::mem::take(&mut self.entries) {
            let at = out.len() as u64;
            out.extend_from_slice(&encode_record(&e));
            placed.insert(i, (e, at));
        }
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&out)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        File::open(&self.dir)?.sync_all()?;
        self.file = OpenOptions::new().read(true).append(true).open(&path)?;
        self.entries = placed;
        self.end = out.len() as u64;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<NodeId>> {
        Ok(self.inner().entries.range(range).map(|(_, (e, _))| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let i = self.inner();
        let last = i.entries.last_key_value().map(|(_, (e, _))| e.log_id).or(i.purged);
        Ok(LogState { last_purged_log_id: i.purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut i = self.inner();
        let bytes = postcard::to_allocvec(vote).expect("a vote encodes");
        write_durably(&i.dir.join("vote"), &bytes).map_err(|e| io_failed(ErrorSubject::Vote, e))?;
        i.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.inner().vote)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut i = self.inner();
        let mut buf = Vec::new();
        let mut placed = Vec::new();
        for e in entries {
            let at = i.end + buf.len() as u64;
            buf.extend_from_slice(&encode_record(&e));
            placed.push((e, at));
        }
        let written = i.file.write_all(&buf).and_then(|()| if i.sync { i.file.sync_data() } else { Ok(()) });
        if let Err(e) = written {
            // Whatever part reached the file is cut at the next open, by its CRC.
            let _ = i.file.set_len(i.end);
            callback.log_io_completed(Err(std::io::Error::new(e.kind(), e.to_string())));
            return Err(io_failed(ErrorSubject::Logs, e));
        }
        i.end += buf.len() as u64;
        for (e, at) in placed {
            i.entries.insert(e.log_id.index, (e, at));
        }
        drop(i);
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut i = self.inner();
        let Some(at) = i.entries.get(&log_id.index).map(|(_, at)| *at) else { return Ok(()) };
        i.file.set_len(at).and_then(|()| i.file.sync_data()).map_err(|e| io_failed(ErrorSubject::Logs, e))?;
        i.end = at;
        let cut: Vec<u64> = i.entries.range(log_id.index..).map(|(k, _)| *k).collect();
        for k in cut {
            i.entries.remove(&k);
        }
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut i = self.inner();
        let bytes = postcard::to_allocvec(&log_id).expect("a log id encodes");
        write_durably(&i.dir.join("purged"), &bytes).map_err(|e| io_failed(ErrorSubject::Logs, e))?;
        i.purged = Some(log_id);
        let gone: Vec<u64> = i.entries.range(..=log_id.index).map(|(k, _)| *k).collect();
        for k in gone {
            i.entries.remove(&k);
        }
        let lead = i.entries.first_key_value().map_or(i.end, |(_, (_, at))| *at);
        if lead >= COMPACT_BYTES {
            i.compact().map_err(|e| io_failed(ErrorSubject::Logs, e))?;
        }
        Ok(())
    }
}
