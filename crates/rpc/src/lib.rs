//! The braid RPC runtime: what moves [`proto`]'s messages between processes.
//!
//! The arrows point one way, from the top of this list down:
//! - [`target`]: a target's identity on disk, registration and heartbeat to the MGS;
//! - [`client`]: a multiplexed client connection with deadlines, reconnects, retries;
//! - [`server`]: the accept loop and per-connection dispatch used by every server role,
//!   and the [`server::Callbacks`] a service calls clients back with;
//! - [`local`]: in-process delivery to a server of the same process (Lustre's `0@lo`);
//! - [`stats`]: what every server counts of the requests it serves (per target,
//!   operation and job), and the job id a client's requests carry;
//! - [`service`]: what both ends share (request context, answers, callbacks' handler
//!   and deadline);
//! - [`tls`]: TLS on connections, an option over the cluster secret's handshake;
//! - [`short_circuit`]: the local socket over which an OSS hands a client on its own
//!   machine the descriptors of object files.
//!
//! The format (FIDs, messages, frames, the handshake) is [`proto`]'s; nothing there
//! knows this crate.

pub mod client;
pub mod local;
pub mod server;
pub mod service;
pub mod short_circuit;
pub mod stats;
pub mod target;
pub mod tls;

pub use client::{Identity, Reply, RpcClient, RpcOptions, Session};
pub use service::{AckAfter, CallbackHandler};
