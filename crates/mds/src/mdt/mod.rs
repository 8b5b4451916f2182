//! One MDT: its tables and the namespace operations on them.
//!
//! Keys follow the 3FS style so the common operations are point reads and range scans.
//! Every table maps bytes to bytes; the encodings are these (a "record" starts with
//! its version byte, see [`store::record`]):
//!
//! | table      | key                               | value                          |
//! |------------|-----------------------------------|--------------------------------|
//! | `inodes`   | FID (16 bytes, big-endian)        | [`Inode`] record               |
//! | `dentries` | parent FID + name                 | record: child FID + kind       |
//! | `xattrs`   | FID + name                        | the value, as the user set it  |
//! | `destroy`  | sequence number (u64, big-endian) | [`DestroyRecord`]              |
//! | `replies`  | client id + xid                   | [`Reply`] record               |
//! | `meta`     | name (UTF-8)                      | counters (u64, little-endian), MDT index, format |
//! | `orphans`  | FID                               | time of unlink (u64, little-endian) |
//!
//! The database holds the MDT as of the last checkpoint; the changes since are in a
//! memtable in front of it and in the journal (see [`crate::journal`]). A [`View`]
//! reads the two as one.
//!
//! Mutations are applied in batches: many client operations, one journal record, then
//! the replies (group commit; see [`crate::commit`]). Every change goes through
//! [`Writer::put`] or [`Writer::del`], which record it for the journal and for undoing
//! the batch. Every mutation first validates (returning an errno without writing
//! anything) and only then writes, so an errno reply never leaves a half-applied
//! operation in the batch. Its reply is stored in `replies` in the same batch, so a
//! client that retries after a lost reply or a server crash gets the original answer
//! instead of a second application (Lustre's reply reconstruction).
//!
//! The rooms: [`schema`] (tables, records, format and upgrade), [`view`] (reads),
//! [`writer`] (the batch's changes and the dispatch of a mutation), then one file per
//! family of namespace operations: [`create`], [`remove`], [`rename`], [`attr`].

pub mod attr;
pub mod create;
pub mod remove;
pub mod rename;
pub mod schema;
#[cfg(test)]
mod tests;
pub mod view;
pub mod writer;

use proto::{Errno, Fid};
use store::StoreError;

pub use crate::inode::Inode;
pub use schema::{layout_objects, new_memtable, DestroyRecord, Redo, Reply, Tbl};
pub use view::View;
pub use writer::{FidBlock, Placement, Savepoint, Writer};

/// Longest name of one directory entry (as Linux).
pub const NAME_MAX: usize = 255;
/// Largest symlink target (as Linux's PATH_MAX).
pub const SYMLINK_MAX: usize = 4096;
/// Largest xattr value and name.
pub const XATTR_VALUE_MAX: usize = 64 * 1024;
pub const XATTR_NAME_MAX: usize = 255;
/// Most entries one readdir answer carries.
pub const READDIR_MAX: u32 = 4096;

/// Either an errno answer (nothing written) or a storage failure (abort the batch).
#[derive(Debug)]
pub enum OpError {
    Errno(Errno, String),
    Store(StoreError),
    /// The operation changes the entries of a directory another client holds a lease
    /// on: nothing was written; revoke the lease and apply it again.
    Leased(Fid),
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpError::Errno(_, m) => f.write_str(m),
            OpError::Store(e) => e.fmt(f),
            OpError::Leased(dir) => write!(f, "directory {dir} is leased by another client"),
        }
    }
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        OpError::Store(e)
    }
}

pub type OpResult<T> = Result<T, OpError>;

fn fail<T>(code: Errno, msg: impl Into<String>) -> OpResult<T> {
    Err(OpError::Errno(code, msg.into()))
}

fn check_name(name: &str) -> OpResult<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return fail(Errno::Inval, format!("invalid name {name:?}"));
    }
    if name.len() > NAME_MAX {
        return fail(Errno::NameTooLong, format!("name of {} bytes exceeds {NAME_MAX}", name.len()));
    }
    Ok(())
}
