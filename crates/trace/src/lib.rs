//! The I/O tracer (capability C8, after seed 001's PVFS tracer): every client
//! operation becomes one fixed-size [`record::Record`], written by the I/O path into a
//! shared-memory [`ring`] and nothing more; a collector process drains the ring and
//! ships [`store::Batch`]es to a collection server, which keeps them compactly in a
//! [`store::Store`]; [`analysis`] answers questions from what is stored.
//!
//! Why this shape: the seed measured synchronous logging (format and write each
//! record before the operation returns) at 46-76 % of the throughput, and a shared
//! memory hand-off to another process at about 1 %. The ring never blocks the I/O
//! path: a full ring drops records and counts them.

pub mod analysis;
pub mod plot;
pub mod record;
pub mod ring;
pub mod store;

pub use record::{Op, Record, Target, NO_FID, NO_JOB, RECORD_BYTES};
