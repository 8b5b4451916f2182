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
//! | `dom`      | FID + block index (u64, big-endian) | a Data-on-MDT block: version, CRC32C, bytes (see [`dom`]) |
//! | `updates`  | FID                               | [`schema::PendingUpdate`]: this MDT's half of an operation spanning MDTs, undecided (see [`update`]) |
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
//! The rooms: [`error`] (what an operation fails with), [`schema`] (tables, records,
//! limits, format and upgrade), [`view`] (reads),
//! [`writer`] (the batch's changes and the dispatch of a mutation), then one file per
//! family of namespace operations: [`create`], [`remove`], [`rename`], [`attr`],
//! [`file_layout`] (changes to a file's layout), [`dom`] (Data-on-MDT bytes),
//! [`update`] (both halves of operations that span MDTs).

pub mod attr;
pub mod create;
pub mod dom;
pub mod error;
pub mod file_layout;
pub mod fsck;
pub mod remove;
pub mod rename;
pub mod schema;
#[cfg(test)]
mod tests;
pub mod update;
pub mod view;
pub mod writer;

pub use crate::inode::Inode;
pub use error::{OpError, OpResult};
pub use rename::Victim;
pub use schema::{
    layout_objects, new_memtable, DestroyRecord, Participant, PendingOp, PendingUpdate, Redo, Reply, Tbl,
};
pub use schema::{NAME_MAX, READDIR_MAX, SYMLINK_MAX, XATTR_NAME_MAX, XATTR_VALUE_MAX};
pub use view::View;
pub use writer::{FidBlock, Placement, Savepoint, Writer};
