//! The embedded key-value store under the MGS and every MDT, and the one crate that
//! knows which engine that is.
//!
//! The engine is redb (pure Rust, ACID, copy-on-write B-trees, crash-safe with an
//! fsync per durable commit). Its types stop here: owners name their tables with
//! [`Table`], read through a [`Snapshot`] and write through a [`Batch`], and every
//! value they keep is a versioned record ([`record`]), so a later field is an
//! upgrade with a test rather than a silent misread. A corrupt or unknown record
//! becomes a clear error naming what was being read instead of a panic.
//!
//! Every table maps bytes to bytes: keys are built by the owner to sort the way its
//! scans need (3FS style), values are records.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub mod memtable;
pub mod record;
pub mod wal;

pub use record::{decode_record, encode_record, open_record, seal, Record};

use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::{de::DeserializeOwned, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open database {path}: {detail}")]
    Open { path: PathBuf, detail: String },
    #[error("database {op} failed: {detail}")]
    Engine { op: &'static str, detail: String },
    #[error("corrupt {what} record: {detail}")]
    Corrupt { what: &'static str, detail: String },
    #[error(
        "{what} record of version {found}, newer than this braid reads (up to {known}): \
         it was written by a later release"
    )]
    FutureVersion { what: &'static str, found: u8, known: u8 },
    #[error("database format: {0}")]
    Format(String),
}

impl StoreError {
    pub fn engine(op: &'static str, e: impl std::fmt::Display) -> StoreError {
        StoreError::Engine { op, detail: e.to_string() }
    }
}

/// Most tables one database holds (a snapshot keeps one open-table slot for each).
pub const MAX_TABLES: usize = 16;

/// A table of one database: its name on disk and a small index chosen by the owner
/// (its slot in snapshots and in a [`memtable::MemTable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Table {
    name: &'static str,
    slot: usize,
}

impl Table {
    pub const fn new(name: &'static str, slot: usize) -> Table {
        assert!(slot < MAX_TABLES, "table slot out of range");
        Table { name, slot }
    }

    pub fn name(self) -> &'static str {
        self.name
    }

    pub fn slot(self) -> usize {
        self.slot
    }

    fn def(self) -> TableDefinition<'static, &'static [u8], &'static [u8]> {
        TableDefinition::new(self.name)
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

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A consistent read of the database as of now.
    pub fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let txn = self.db.begin_read().map_err(|e| StoreError::engine("begin read", e))?;
        Ok(Snapshot { txn, tables: Default::default() })
    }

    /// A write transaction. A `durable` one is on disk when [`Batch::commit`]
    /// returns (an fsync); otherwise it is visible to readers at once and lost if
    /// the machine, not only the process, goes down before the next durable commit.
    pub fn batch(&self, durable: bool) -> Result<Batch, StoreError> {
        let mut txn = self.db.begin_write().map_err(|e| StoreError::engine("begin write", e))?;
        let durability = if durable { redb::Durability::Immediate } else { redb::Durability::None };
        txn.set_durability(durability).map_err(|e| StoreError::engine("set durability", e))?;
        Ok(Batch { txn })
    }
}

type ReadTable = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;

fn table_error(t: Table, e: redb::TableError) -> StoreError {
    match e {
        redb::TableError::TableTypeMismatch { .. } => {
            StoreError::Format(format!("table {}: {e}: the database was written by an earlier braid format", t.name))
        }
        e => StoreError::engine("open table", format!("{}: {e}", t.name)),
    }
}

/// The database as one read transaction saw it; tables are opened on first use.
pub struct Snapshot {
    txn: redb::ReadTransaction,
    tables: [OnceLock<ReadTable>; MAX_TABLES],
}

impl Snapshot {
    fn table(&self, t: Table) -> Result<&ReadTable, StoreError> {
        let cell = &self.tables[t.slot];
        if let Some(table) = cell.get() {
            return Ok(table);
        }
        let _ = cell.set(self.txn.open_table(t.def()).map_err(|e| table_error(t, e))?);
        Ok(cell.get().expect("just set"))
    }

    /// Calls `f` with the value of `key` in `t`, if there is one.
    pub fn get<T, E: From<StoreError>>(
        &self,
        t: Table,
        key: &[u8],
        f: impl FnOnce(&[u8]) -> Result<T, E>,
    ) -> Result<Option<T>, E> {
        match self.table(t)?.get(key).map_err(|e| StoreError::engine("read", e))? {
            Some(v) => f(v.value()).map(Some),
            None => Ok(None),
        }
    }

    /// The rows of `t` from `from` on, in key order.
    pub fn range<'a>(&'a self, t: Table, from: Bound<&[u8]>) -> Result<Rows<'a>, StoreError> {
        let rows =
            self.table(t)?.range::<&[u8]>((from, Bound::Unbounded)).map_err(|e| StoreError::engine("scan", e))?;
        Ok(Box::new(rows.map(|row| {
            let (k, v) = row.map_err(|e| StoreError::engine("scan", e))?;
            Ok((k.value().to_vec(), v.value().to_vec()))
        })))
    }
}

/// One row: key and value.
pub type Row = (Vec<u8>, Vec<u8>);

/// Rows of a table in key order.
pub type Rows<'a> = Box<dyn Iterator<Item = Result<Row, StoreError>> + 'a>;

/// One write transaction: nothing of it is seen until [`Batch::commit`], and all of
/// it is seen after.
pub struct Batch {
    txn: redb::WriteTransaction,
}

impl Batch {
    fn table(&self, t: Table) -> Result<redb::Table<'_, &'static [u8], &'static [u8]>, StoreError> {
        self.txn.open_table(t.def()).map_err(|e| table_error(t, e))
    }

    /// Creates the tables that do not exist yet, and checks that those that do hold
    /// bytes keyed by bytes.
    pub fn create(&mut self, tables: &[Table]) -> Result<(), StoreError> {
        for t in tables {
            self.table(*t)?;
        }
        Ok(())
    }

    pub fn get(&self, t: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let table = self.table(t)?;
        let v = table.get(key).map_err(|e| StoreError::engine("read", e))?;
        Ok(v.map(|v| v.value().to_vec()))
    }

    pub fn put(&mut self, t: Table, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.table(t)?.insert(key, value).map_err(|e| StoreError::engine("write", e))?;
        Ok(())
    }

    pub fn del(&mut self, t: Table, key: &[u8]) -> Result<(), StoreError> {
        self.table(t)?.remove(key).map_err(|e| StoreError::engine("delete", e))?;
        Ok(())
    }

    /// Deletes every row of `t` (a replica replacing its state with a snapshot).
    pub fn clear(&mut self, t: Table) -> Result<(), StoreError> {
        self.table(t)?.retain(|_, _| false).map_err(|e| StoreError::engine("clear", e))?;
        Ok(())
    }

    /// Every row of `t`, in key order (for upgrades and loading small tables).
    pub fn rows(&self, t: Table) -> Result<Vec<Row>, StoreError> {
        let table = self.table(t)?;
        let mut out = Vec::new();
        for row in table.iter().map_err(|e| StoreError::engine("scan", e))? {
            let (k, v) = row.map_err(|e| StoreError::engine("scan", e))?;
            out.push((k.value().to_vec(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// Writes every change `mem` holds (a checkpoint); `tables` maps its slots.
    pub fn write_back(&mut self, mem: &memtable::MemTable, tables: &[Table]) -> Result<(), StoreError> {
        let mut open = Vec::with_capacity(tables.len());
        for t in tables {
            open.push((t.slot, self.table(*t)?));
        }
        for (slot, key, value) in mem.iter() {
            let (_, table) = open
                .iter_mut()
                .find(|(s, _)| *s == slot)
                .ok_or_else(|| StoreError::Format(format!("memtable slot {slot} names no table")))?;
            match value {
                Some(v) => table.insert(key, v).map(drop),
                None => table.remove(key).map(drop),
            }
            .map_err(|e| StoreError::engine("write back", e))?;
        }
        Ok(())
    }

    /// Removes a table of the first braid format (keys were strings, not bytes) and
    /// returns its rows, for an upgrade to rewrite them. Absent: no rows.
    pub fn take_string_keyed(&mut self, name: &'static str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let def: TableDefinition<&str, &[u8]> = TableDefinition::new(name);
        let mut out = Vec::new();
        {
            let table = match self.txn.open_table(def) {
                Ok(t) => t,
                Err(e) => return Err(StoreError::engine("open table", format!("{name}: {e}"))),
            };
            for row in table.iter().map_err(|e| StoreError::engine("scan", e))? {
                let (k, v) = row.map_err(|e| StoreError::engine("scan", e))?;
                out.push((k.value().to_string(), v.value().to_vec()));
            }
        }
        self.txn.delete_table(def).map_err(|e| StoreError::engine("delete table", e))?;
        Ok(out)
    }

    /// Whether table `name` exists with string keys (the first braid format).
    pub fn has_string_keyed(&self, name: &'static str) -> Result<bool, StoreError> {
        use redb::TableHandle;
        let tables = self.txn.list_tables().map_err(|e| StoreError::engine("list tables", e))?;
        let named: Vec<_> = tables.filter(|h| h.name() == name).collect();
        if named.is_empty() {
            return Ok(false);
        }
        let def: TableDefinition<&str, &[u8]> = TableDefinition::new(name);
        match self.txn.open_table(def) {
            Ok(_) => Ok(true),
            Err(redb::TableError::TableTypeMismatch { .. }) => Ok(false),
            Err(e) => Err(StoreError::engine("open table", format!("{name}: {e}"))),
        }
    }

    pub fn commit(self) -> Result<(), StoreError> {
        self.txn.commit().map_err(|e| StoreError::engine("commit", e))
    }
}

/// Encodes an unversioned value (inside a record, or a redo log's payload parts).
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).expect("postcard encoding of an in-memory record cannot fail")
}

/// Decodes an unversioned value, naming `what` in the error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], what: &'static str) -> Result<T, StoreError> {
    postcard::from_bytes(bytes).map_err(|e| StoreError::Corrupt { what, detail: e.to_string() })
}

/// Decodes a value that must fill `bytes` exactly: a value of another encoding that
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

    const T: Table = Table::new("t", 0);

    #[test]
    fn roundtrip_scan_and_corruption() {
        let dir = std::env::temp_dir().join(format!("braid-store-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("db.redb");
        {
            let s = Store::open(&path).unwrap();
            let mut w = s.batch(true).unwrap();
            w.create(&[T]).unwrap();
            w.put(T, b"k", &encode(&(1u32, "x".to_string()))).unwrap();
            w.put(T, b"l", b"2").unwrap();
            w.commit().unwrap();
        }
        let s = Store::open(&path).unwrap();
        let r = s.snapshot().unwrap();
        let v: Option<(u32, String)> = r.get(T, b"k", |v| decode(v, "test")).unwrap();
        assert_eq!(v, Some((1, "x".into())));
        let keys: Vec<_> = r.range(T, Bound::Excluded(b"k")).unwrap().map(|r| r.unwrap().0).collect();
        assert_eq!(keys, [b"l".to_vec()]);
        assert!(matches!(decode::<(u32, String)>(&[0xff, 0xff], "test"), Err(StoreError::Corrupt { .. })));
        drop(r);
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_table_of_the_first_format_is_named_and_taken_for_an_upgrade() {
        let dir = std::env::temp_dir().join(format!("braid-store-old-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = Store::open(&dir.join("db.redb")).unwrap();
        let w = s.db.begin_write().unwrap();
        let old: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
        w.open_table(old).unwrap().insert("fsname", b"x".as_slice()).unwrap();
        w.commit().unwrap();
        let meta = Table::new("meta", 0);
        let mut b = s.batch(true).unwrap();
        let err = b.create(&[meta]).unwrap_err().to_string();
        assert!(err.contains("meta") && err.contains("earlier braid format"), "{err}");
        drop(b);
        let mut b = s.batch(true).unwrap();
        assert!(b.has_string_keyed("meta").unwrap());
        assert_eq!(b.take_string_keyed("meta").unwrap(), [("fsname".to_string(), b"x".to_vec())]);
        b.create(&[meta]).unwrap();
        assert!(!b.has_string_keyed("meta").unwrap());
        b.commit().unwrap();
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
