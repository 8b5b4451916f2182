//! The embedded key-value store under the MGS and every MDT.
//!
//! A thin wrapper over redb (pure Rust, ACID, copy-on-write B-trees, crash-safe with
//! an fsync per durable commit). It exists so the engine is named in one place, so
//! every record is encoded the same way (postcard), and so a corrupt record becomes a
//! clear error naming what was being read instead of a panic.

use std::path::{Path, PathBuf};

pub mod memtable;
pub mod wal;

pub use redb;
use redb::ReadableDatabase;
use serde::{de::DeserializeOwned, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open database {path}: {detail}")]
    Open { path: PathBuf, detail: String },
    #[error("database {op} failed: {detail}")]
    Engine { op: &'static str, detail: String },
    #[error("corrupt {what} record: {detail}")]
    Corrupt { what: &'static str, detail: String },
}

impl StoreError {
    pub fn engine(op: &'static str, e: impl std::fmt::Display) -> StoreError {
        StoreError::Engine { op, detail: e.to_string() }
    }
}

/// An open database file.
pub struct Store {
    db: redb::Database,
    path: PathBuf,
}

impl Store {
    /// Opens (creating if absent) the database at `path`. redb recovers to the last
    /// durable commit if the previous process died mid-transaction.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let db = redb::Database::create(path)
            .map_err(|e| StoreError::Open { path: path.to_path_buf(), detail: e.to_string() })?;
        Ok(Store { db, path: path.to_path_buf() })
    }

    pub fn db(&self) -> &redb::Database {
        &self.db
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn begin_write(&self) -> Result<redb::WriteTransaction, StoreError> {
        self.db.begin_write().map_err(|e| StoreError::engine("begin write", e))
    }

    pub fn begin_read(&self) -> Result<redb::ReadTransaction, StoreError> {
        self.db.begin_read().map_err(|e| StoreError::engine("begin read", e))
    }
}

/// Encodes a record.
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).expect("postcard encoding of an in-memory record cannot fail")
}

/// Decodes a record, naming `what` in the error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], what: &'static str) -> Result<T, StoreError> {
    postcard::from_bytes(bytes).map_err(|e| StoreError::Corrupt { what, detail: e.to_string() })
}

/// Decodes a record that must fill `bytes` exactly: a record of another encoding that
/// happens to start the same way is refused instead of misread.
pub fn decode_exact<T: DeserializeOwned>(bytes: &[u8], what: &'static str) -> Result<T, StoreError> {
    match postcard::take_from_bytes(bytes) {
        Ok((v, [])) => Ok(v),
        Ok((_, rest)) => Err(StoreError::Corrupt { what, detail: format!("{} bytes left over", rest.len()) }),
        Err(e) => Err(StoreError::Corrupt { what, detail: e.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::TableDefinition;

    const T: TableDefinition<&str, &[u8]> = TableDefinition::new("t");

    #[test]
    fn roundtrip_and_corruption() {
        let dir = std::env::temp_dir().join(format!("braid-store-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("db.redb");
        {
            let s = Store::open(&path).unwrap();
            let w = s.begin_write().unwrap();
            w.open_table(T).unwrap().insert("k", encode(&(1u32, "x".to_string())).as_slice()).unwrap();
            w.commit().unwrap();
        }
        let s = Store::open(&path).unwrap();
        let r = s.begin_read().unwrap();
        let t = r.open_table(T).unwrap();
        let v: (u32, String) = decode(t.get("k").unwrap().unwrap().value(), "test").unwrap();
        assert_eq!(v, (1, "x".into()));
        assert!(matches!(decode::<(u32, String)>(&[0xff, 0xff], "test"), Err(StoreError::Corrupt { .. })));
        drop(t);
        drop(r);
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
