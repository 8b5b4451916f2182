//! Error codes that cross the wire, and the errors of the RPC layer itself.
//!
//! [`Errno`] is the POSIX-shaped outcome a server reports (mapped to a real errno at
//! the FUSE border); [`RpcError`] is everything a caller can see: a remote error, a
//! lost connection, a timeout, an authentication failure or a protocol violation.

use serde::{Deserialize, Serialize};

/// Failure kinds a server reports. Named after the errno they map to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Errno {
    NoEnt,
    Exist,
    NotDir,
    IsDir,
    NotEmpty,
    Access,
    Perm,
    Inval,
    NoSpc,
    Io,
    NameTooLong,
    NoData,
    Range,
    Stale,
    XDev,
    Loop,
    Busy,
    /// The request could not be decoded or is not allowed here.
    Proto,
    /// Not supported (e.g. an xattr namespace braid does not keep).
    NotSup,
    /// The server is not ready (e.g. not registered yet): retry later.
    Again,
    /// Waiting for a lock would deadlock (`F_SETLKW`'s `EDEADLK`).
    Deadlk,
    /// The caller was interrupted by a signal while it waited (a client's own answer).
    Intr,
    /// Too many links: a file with hard links cannot move to another MDT alone.
    MLink,
}

impl Errno {
    /// The errno's symbolic name (`ENOENT`), as metrics label it.
    pub fn name(self) -> &'static str {
        match self {
            Errno::NoEnt => "ENOENT",
            Errno::Exist => "EEXIST",
            Errno::NotDir => "ENOTDIR",
            Errno::IsDir => "EISDIR",
            Errno::NotEmpty => "ENOTEMPTY",
            Errno::Access => "EACCES",
            Errno::Perm => "EPERM",
            Errno::Inval => "EINVAL",
            Errno::NoSpc => "ENOSPC",
            Errno::Io => "EIO",
            Errno::NameTooLong => "ENAMETOOLONG",
            Errno::NoData => "ENODATA",
            Errno::Range => "ERANGE",
            Errno::Stale => "ESTALE",
            Errno::XDev => "EXDEV",
            Errno::Loop => "ELOOP",
            Errno::Busy => "EBUSY",
            Errno::Proto => "EPROTO",
            Errno::NotSup => "EOPNOTSUPP",
            Errno::Again => "EAGAIN",
            Errno::Deadlk => "EDEADLK",
            Errno::Intr => "EINTR",
            Errno::MLink => "EMLINK",
        }
    }

    /// The Linux errno value.
    pub fn raw(self) -> i32 {
        match self {
            Errno::NoEnt => 2,
            Errno::Io => 5,
            Errno::Again => 11,
            Errno::Deadlk => 35,
            Errno::Intr => 4,
            Errno::Access => 13,
            Errno::Busy => 16,
            Errno::Exist => 17,
            Errno::XDev => 18,
            Errno::NotDir => 20,
            Errno::IsDir => 21,
            Errno::Inval | Errno::Proto => 22,
            Errno::NoSpc => 28,
            Errno::Range => 34,
            Errno::NameTooLong => 36,
            Errno::NotEmpty => 39,
            Errno::Loop => 40,
            Errno::NoData => 61,
            Errno::Stale => 116,
            Errno::NotSup => 95,
            Errno::Perm => 1,
            Errno::MLink => 31,
        }
    }
}

/// An error reported by the remote side, with its message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message} ({code:?})")]
pub struct RemoteError {
    pub code: Errno,
    pub message: String,
}

impl RemoteError {
    pub fn new(code: Errno, message: impl Into<String>) -> Self {
        RemoteError { code, message: message.into() }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("connection to {addr} failed: {reason}")]
    Connect { addr: String, reason: String },
    #[error("connection to {addr} lost: {reason}")]
    ConnectionLost { addr: String, reason: String },
    #[error("request to {addr} timed out after {timeout_ms} ms")]
    Timeout { addr: String, timeout_ms: u64 },
    #[error("authentication with {addr} failed: {reason}")]
    Auth { addr: String, reason: String },
    #[error("protocol error with {addr}: {reason}")]
    Protocol { addr: String, reason: String },
    #[error("{addr} gave no answer within the recovery timeout of {timeout_ms} ms (last error: {last})")]
    Unavailable { addr: String, timeout_ms: u64, last: String },
}

impl RpcError {
    /// Whether another try on a new connection may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            RpcError::Connect { .. } | RpcError::ConnectionLost { .. } | RpcError::Timeout { .. } => true,
            RpcError::Remote(e) => e.code == Errno::Again,
            _ => false,
        }
    }

    /// The errno a front end should report for this error.
    pub fn errno(&self) -> Errno {
        match self {
            RpcError::Remote(e) => e.code,
            RpcError::Auth { .. } => Errno::Access,
            _ => Errno::Io,
        }
    }
}
