//! What a namespace operation fails with: an errno answer (nothing written), a
//! storage failure (the batch aborts), a directory another client leases, an entry
//! whose inode is on another MDT, or a name of another shard of a striped directory.

use proto::msg::{DirStripes, FileKind};
use proto::{Errno, Fid};
use store::StoreError;

/// Either an errno answer (nothing written) or a storage failure (abort the batch).
#[derive(Debug)]
pub enum OpError {
    Errno(Errno, String),
    Store(StoreError),
    /// The operation changes the entries of a directory another client holds a lease
    /// on: nothing was written; revoke the lease and apply it again.
    Leased(Fid),
    /// The operation's entry names an inode on another MDT: nothing was written; the
    /// MDS coordinates it across the MDTs (or the client goes to that MDT).
    Elsewhere(Fid, FileKind),
    /// The name belongs to another shard of the striped directory the request named
    /// (its table): nothing was written; the client sends it to that shard.
    WrongShard(Box<DirStripes>),
    /// The directory the request names moved to another MDT under a new FID
    /// (`braid migrate -m`): nothing was done; the client sends it there.
    Moved(Fid, Fid),
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpError::Errno(_, m) => f.write_str(m),
            OpError::Store(e) => e.fmt(f),
            OpError::Leased(dir) => write!(f, "directory {dir} is leased by another client"),
            OpError::Elsewhere(fid, _) => write!(f, "the entry names {fid}, whose inode is on MDT {}", fid.mdt()),
            OpError::WrongShard(s) => write!(f, "the name belongs to another shard of directory {}", s.master()),
            OpError::Moved(from, to) => write!(f, "{from} moved to MDT {} as {to}", to.mdt()),
        }
    }
}

impl OpError {
    /// The answer a client gets for it.
    pub fn into_response(self) -> proto::msg::Response {
        use proto::msg::Response;
        match self {
            OpError::Errno(code, msg) => Response::error(code, msg),
            OpError::Store(e) => Response::error(Errno::Io, format!("MDT storage error: {e}")),
            e @ OpError::Leased(_) => Response::error(Errno::Again, e.to_string()),
            e @ OpError::Elsewhere(..) => Response::error(Errno::XDev, e.to_string()),
            OpError::WrongShard(s) => Response::Striped(*s),
            OpError::Moved(from, to) => Response::Moved { from, to },
        }
    }
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        OpError::Store(e)
    }
}

pub type OpResult<T> = Result<T, OpError>;

pub(super) fn fail<T>(code: Errno, msg: impl Into<String>) -> OpResult<T> {
    Err(OpError::Errno(code, msg.into()))
}
