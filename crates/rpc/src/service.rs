//! What both ends of a connection share: who sent a request, what a handler answers,
//! how a client is called back, and how long a callback may take. The bottom of the
//! runtime: [`crate::local`], [`crate::server`] and [`crate::client`] build on it, and
//! it builds on nothing of theirs.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use proto::msg::{Callback, Response};
use proto::Errno;
use tokio::net::TcpStream;

/// The halves of a connection's stream: plain TCP, or TLS over it.
pub type ReadHalf = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
pub type WriteHalf = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// Who sent a request.
#[derive(Debug, Clone)]
pub struct RequestCtx {
    pub client_id: u64,
    pub xid: u64,
    pub peer: SocketAddr,
    /// The connection it came on (unique in this process; [`IN_PROCESS_CONN`] for
    /// requests delivered in-process).
    pub conn_id: u64,
    /// The sender said in its handshake that it is a server (an MDS asking another
    /// for its part of an operation): its requests carry credentials already checked
    /// and squashed by the server that took them from a client.
    pub from_server: bool,
    /// The batch job the request was made for, if the client said (see
    /// [`crate::stats`]).
    pub job: Option<std::sync::Arc<str>>,
}

/// Whether a handshake's role is a server's.
pub fn is_server_role(role: &str) -> bool {
    matches!(role, "mgs" | "mds" | "oss")
}

/// The connection id of requests delivered in-process ([`crate::local`]).
pub const IN_PROCESS_CONN: u64 = 0;

/// What a handler returns: the response and its bulk payload.
pub type Answer = (Response, Vec<Bytes>);

/// How long a server waits for a client to ack a callback before evicting it (its
/// connections are closed). A client relies on revocable state only until a little
/// less than this long after it sent a request whose answer it has received since:
/// a revocation sent before that answer reached it first (one connection keeps
/// order), and one sent after it cannot have been given up on yet.
pub const CALLBACK_TIMEOUT: Duration = Duration::from_secs(2);

/// What must finish before a callback is acked (see [`CallbackHandler::callback`]).
pub type AckAfter = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Carries out what a server asks of this client ([`Callback`]). Called by the
/// connection's reader before it reads the next frame, so it must be quick and must
/// not wait on anything the connection delivers. What cannot be done at once (a
/// revoked lease's writes still on their way to the server) is returned: the ack
/// waits for it, while the reader reads on, so it may wait on answers of the same
/// connection.
pub trait CallbackHandler: Send + Sync {
    fn callback(&self, cb: &Callback) -> Option<AckAfter>;

    /// The connection to the server at `addr` ended (it is made again at the next
    /// request). A client holding state there may want that at once: a restarted
    /// server waits only for the clients connected to it (the MDS's recovery).
    fn disconnected(&self, _addr: &str) {}
}

/// Runs a handler; one that panics is answered with an error instead of taking the
/// answer (or the server) with it.
pub async fn guarded(server: &str, op: &'static str, handler: impl Future<Output = Answer>) -> Answer {
    let mut handler = std::pin::pin!(handler);
    let caught = std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.as_mut().poll(cx))) {
            Ok(p) => p.map(Ok),
            Err(_) => std::task::Poll::Ready(Err(())),
        }
    });
    caught.await.unwrap_or_else(|()| {
        tracing::error!(server, op, "handler panicked");
        (Response::error(Errno::Io, format!("internal server error in {op}")), vec![])
    })
}

/// A second descriptor of `stream`'s socket: `shutdown` on it ends the connection for
/// every holder (a shutdown acts on the socket, not the descriptor).
pub fn dup_socket(stream: &TcpStream) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::AsFd;
    Ok(std::net::TcpStream::from(stream.as_fd().try_clone_to_owned()?))
}
