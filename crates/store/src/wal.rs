//! A redo log in front of the database: cheap durability for small transactions.
//!
//! A durable redb commit rewrites the touched B-tree pages and fsyncs: a few hundred
//! microseconds, paid by every metadata operation of a client that works alone. With
//! this log the owner commits to redb without fsync (visible to readers at once,
//! lost if the process dies) and appends the transaction's changes here (one write,
//! in the kernel's page cache, so it survives the process being killed). A periodic
//! checkpoint makes redb durable, records the last sequence number it covers, and
//! empties the log; at open, records past that number are applied again.
//!
//! This is ext4's and Lustre's trade: an acknowledged operation survives a crash of
//! the server process at once and a crash of the machine once the log or a
//! checkpoint reached the disk (`sync`, or the checkpoint interval); fsync asks for it.
//!
//! Record layout: magic `BWAL`, payload length (u32 LE), sequence (u64 LE), CRC32C of
//! sequence and payload (u32 LE), payload. Reading stops at the first record that is
//! torn or fails its checksum: the tail of a write the machine did not finish.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::StoreError;

const MAGIC: &[u8; 4] = b"BWAL";
const HEADER: usize = 20;
/// Largest payload one record may carry; anything longer in a header is corruption.
pub const MAX_RECORD: usize = 256 << 20;

/// One record read back: its sequence number and payload.
pub type Record = (u64, Vec<u8>);

pub struct Wal {
    file: File,
    path: PathBuf,
    len: u64,
}

impl Wal {
    /// Opens (creating if absent) the log at `path` and returns it with the valid
    /// records it holds, in order. A torn tail is cut off.
    pub fn open(path: &Path) -> Result<(Wal, Vec<Record>), StoreError> {
        let err = |op: &'static str| {
            let p = path.display().to_string();
            move |e: std::io::Error| StoreError::Engine { op, detail: format!("{p}: {e}") }
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(err("open log"))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(err("read log"))?;
        let (records, valid) = parse(&bytes);
        if valid < bytes.len() {
            tracing::warn!(
                "{}: cutting {} bytes of an unfinished record off the log",
                path.display(),
                bytes.len() - valid
            );
            file.set_len(valid as u64).map_err(err("cut torn log tail"))?;
        }
        Ok((Wal { file, path: path.to_path_buf(), len: valid as u64 }, records))
    }

    /// Bytes in the log.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends one record (not yet forced to disk: see [`Wal::sync`]).
    pub fn append(&mut self, seq: u64, payload: &[u8]) -> Result<(), StoreError> {
        if payload.len() > MAX_RECORD {
            return Err(self.io("append", format!("record of {} bytes exceeds {MAX_RECORD}", payload.len())));
        }
        let mut rec = Vec::with_capacity(HEADER + payload.len());
        rec.extend_from_slice(MAGIC);
        rec.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        rec.extend_from_slice(&seq.to_le_bytes());
        rec.extend_from_slice(&checksum(seq, payload).to_le_bytes());
        rec.extend_from_slice(payload);
        if let Err(e) = self.file.write_all_at(&rec, self.len) {
            // Leave no partial record behind for the next append to follow.
            let _ = self.file.set_len(self.len);
            return Err(self.io("append", e.to_string()));
        }
        self.len += rec.len() as u64;
        Ok(())
    }

    /// Takes back everything after `len` (a record whose transaction failed to commit).
    pub fn truncate(&mut self, len: u64) -> Result<(), StoreError> {
        self.file.set_len(len).map_err(|e| self.io("truncate", e.to_string()))?;
        self.len = len.min(self.len);
        Ok(())
    }

    /// Forces the log to disk.
    pub fn sync(&self) -> Result<(), StoreError> {
        self.file.sync_data().map_err(|e| self.io("sync", e.to_string()))
    }

    fn io(&self, op: &'static str, detail: String) -> StoreError {
        StoreError::Engine { op, detail: format!("log {}: {detail}", self.path.display()) }
    }
}

fn checksum(seq: u64, payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&seq.to_le_bytes()), payload)
}

/// The valid records at the start of `bytes`, and how many bytes they span.
fn parse(bytes: &[u8]) -> (Vec<Record>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= HEADER {
        let h = &bytes[at..at + HEADER];
        if &h[..4] != MAGIC {
            break;
        }
        let len = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes")) as usize;
        let seq = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(h[16..20].try_into().expect("4 bytes"));
        if len > MAX_RECORD || bytes.len() - at - HEADER < len {
            break;
        }
        let payload = &bytes[at + HEADER..at + HEADER + len];
        if checksum(seq, payload) != crc {
            break;
        }
        out.push((seq, payload.to_vec()));
        at += HEADER + len;
    }
    (out, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("braid-wal-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn records_come_back_in_order_and_a_torn_or_corrupt_tail_is_cut() {
        let d = dir("tail");
        let p = d.join("log");
        {
            let (mut w, recs) = Wal::open(&p).unwrap();
            assert!(recs.is_empty());
            w.append(1, b"one").unwrap();
            w.append(2, b"").unwrap();
            w.append(3, &[7u8; 5000]).unwrap();
        }
        let full = std::fs::read(&p).unwrap();
        let (_, recs) = Wal::open(&p).unwrap();
        assert_eq!(recs.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(recs[0].1, b"one");
        assert_eq!(recs[2].1.len(), 5000);

        // A record cut short by a crash: the two before it survive, the file is trimmed.
        std::fs::write(&p, &full[..full.len() - 10]).unwrap();
        let (mut w, recs) = Wal::open(&p).unwrap();
        assert_eq!(recs.len(), 2);
        let trimmed = std::fs::metadata(&p).unwrap().len();
        assert_eq!(trimmed, w.len());
        w.append(4, b"four").unwrap();
        drop(w);
        let (_, recs) = Wal::open(&p).unwrap();
        assert_eq!(recs.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2, 4]);

        // A flipped payload byte fails the checksum: reading stops there.
        let mut bad = full.clone();
        bad[HEADER + 1] ^= 0xff;
        std::fs::write(&p, &bad).unwrap();
        let (_, recs) = Wal::open(&p).unwrap();
        assert!(recs.is_empty());

        // A header claiming an absurd length is corruption, not an allocation.
        let mut huge = full.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&p, &huge).unwrap();
        let (_, recs) = Wal::open(&p).unwrap();
        assert!(recs.is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn truncate_takes_back_the_last_record() {
        let d = dir("trunc");
        let p = d.join("log");
        let (mut w, _) = Wal::open(&p).unwrap();
        w.append(1, b"kept").unwrap();
        let mark = w.len();
        w.append(2, b"taken back").unwrap();
        w.truncate(mark).unwrap();
        w.sync().unwrap();
        drop(w);
        let (w, recs) = Wal::open(&p).unwrap();
        assert_eq!(recs, vec![(1, b"kept".to_vec())]);
        assert_eq!(w.len(), mark);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
