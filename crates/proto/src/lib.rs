//! The braid wire format: what crosses the network between clients, the MGS, MDSs
//! and OSSs. The runtime that moves it (client connections, the server loop,
//! in-process delivery) is the `rpc` crate, which builds on this one.
//!
//! - [`fid`]: file identifiers and OST object names;
//! - [`msg`]: typed control messages (postcard-encoded); bulk data never goes through
//!   serde but travels as the frame's raw payload;
//! - [`frame`]: the fixed header, length limits and CRC32C of every frame;
//! - [`squash`]: root squash, the rule MDSs enforce and clients apply;
//! - [`auth`]: the challenge/response handshake over the cluster secret;
//! - [`error`]: errno codes and the errors of a call.

pub mod auth;
pub mod bytes_field;
pub mod error;
pub mod fid;
pub mod frame;
pub mod msg;
pub mod squash;

pub use error::{Errno, RemoteError, RpcError};
pub use fid::{objects_fid, Fid, ObjectId};
