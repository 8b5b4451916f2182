//! The braid wire protocol: what crosses the network between clients, the MGS, MDSs
//! and OSSs, and the plumbing that moves it.
//!
//! - [`fid`]: file identifiers and OST object names;
//! - [`msg`]: typed control messages (postcard-encoded); bulk data never goes through
//!   serde but travels as the frame's raw payload;
//! - [`frame`]: the fixed header, length limits and CRC32C of every frame;
//! - [`auth`]: the challenge/response handshake over the cluster secret;
//! - [`rpc`]: a multiplexed client connection with deadlines, reconnects and retries;
//! - [`server`]: the accept loop and per-connection dispatch used by every server role;
//! - [`local`]: in-process delivery to a server of the same process (Lustre's `0@lo`).

pub mod auth;
pub mod error;
pub mod fid;
pub mod frame;
pub mod local;
pub mod msg;
pub mod rpc;
pub mod server;
pub mod target;

pub use error::{Errno, RemoteError, RpcError};
pub use fid::{Fid, ObjectId};
