//! The MDS: serves one or more MDTs — the namespace, inodes, layouts and xattrs.
//!
//! The MDS is never on the data path: it hands out layouts and the client talks to
//! the OSTs. It talks to OSTs itself only to destroy the objects of deleted files,
//! from a persistent queue drained in the background (fast unlink, no orphans).
//!
//! The rooms, in the order a create travels through them:
//! - [`service`]: routes a request to the MDT owning its FID; reads run inline on a
//!   snapshot, mutations go to the MDT's group commit;
//! - [`target`]: one MDT as served (its group commit, readers, opens, POSIX locks,
//!   lease revocation);
//! - [`commit`]: group commit, a batch of mutations per journal record, with the
//!   reply cache;
//! - [`mdt`]: the namespace itself (schema and records, view, writer, one file per
//!   family of operations);
//! - [`journal`]: the batch records before the replies, checkpoint and replay, behind
//!   the [`journal::Journal`] seam;
//! - [`workers`]: the named background work, and [`cluster`] what it learns of the
//!   cluster;
//! - [`inode`], [`lease`], [`locks`]: inode records and permissions, directory
//!   leases, POSIX record locks; `recovery`: what a restarted MDT waits for before
//!   other clients see directories that lease holders of its previous run changed;
//!   [`mmp`]: one MDS at a time on an MDT that a failover pair shares;
//! - [`replica`]: an MDT served by a group of MDSs that replicate it through Raft.

pub mod check;
pub mod cluster;
pub mod commit;
pub mod config;
pub mod dne;
pub mod inode;
pub mod journal;
pub mod lease;
pub mod locks;
pub mod mdt;
pub mod mmp;
mod recovery;
pub mod replica;
pub mod service;
pub mod stats;
pub mod target;
pub mod workers;

pub use config::{MdsConfig, MdsError};
pub use service::Mds;

/// Serves on `listener`.
pub async fn serve(mds: std::sync::Arc<Mds>, listener: tokio::net::TcpListener, server: rpc::server::ServerConfig) {
    rpc::server::serve(listener, std::sync::Arc::new(server), mds).await
}
