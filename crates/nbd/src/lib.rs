//! The NBD export (capability C9, after seed 004's GNBD): braid files served as network
//! block devices to qemu, libnbd's tools and the kernel's client.
//!
//! [`proto`] is the wire format; [`server`] runs the handshake and the transmission
//! phase over a [`server::Backend`], which the `cli` crate implements on a braid file
//! through the native client. Several connections to one export share one backend,
//! so a flush on any of them covers the writes of all (`NBD_FLAG_CAN_MULTI_CONN`).
//! [`client`] is a small blocking client that `braid bench` measures exports with.
//! [`sendfile`] sends a read's data from local files a backend names, without
//! reading them into memory.

pub mod client;
pub mod proto;
pub mod sendfile;
pub mod server;

pub use sendfile::FileRange;
pub use server::{serve, Backend, Export, Exports, Limits, ReadData};
