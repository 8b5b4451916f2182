//! The server side of braid connections, shared by the MGS, MDS and OSS.
//!
//! Each accepted connection is authenticated, then its frames are read one after the
//! other and each request is handled in its own task, at most `max_in_flight_per_conn`
//! at once (the reader stops reading when that many are pending: backpressure on a
//! client that floods). Answers go back through one writer task per connection.
//!
//! Hostile input: a frame that breaks framing (bad magic, checksum, oversize length)
//! closes that connection after a best-effort error reply; a frame whose message does
//! not decode (unknown operation, garbage) gets an error reply and the connection
//! stays. A handler that panics is answered with an error; the server keeps serving.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::auth::{server_handshake, Secret, HANDSHAKE_TIMEOUT};
use crate::error::Errno;
use crate::frame::{read_frame, write_frame, FrameError, FrameKind, FrameLimits};
use crate::msg::{Request, Response};

/// Who sent a request.
#[derive(Debug, Clone)]
pub struct RequestCtx {
    pub client_id: u64,
    pub xid: u64,
    pub peer: SocketAddr,
}

/// What a handler returns: the response and its bulk payload.
pub type Answer = (Response, Vec<Bytes>);

/// A service answers requests. Implemented by the MGS, MDS and OSS.
pub trait Service: Send + Sync + 'static {
    fn handle(&self, ctx: RequestCtx, req: Request, payload: Bytes) -> impl Future<Output = Answer> + Send;

    /// The last connection of client `client_id` closed (the client died or went
    /// away): state held for it, such as locks, can be released.
    fn client_gone(&self, _client_id: u64) {}
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub name: String,
    pub secret: Secret,
    pub limits: FrameLimits,
    pub max_in_flight_per_conn: usize,
    /// Connections beyond this are refused at accept.
    pub max_connections: usize,
}

impl ServerConfig {
    pub fn new(name: &str, secret: Secret) -> ServerConfig {
        ServerConfig {
            name: name.to_string(),
            secret,
            limits: FrameLimits::default(),
            max_in_flight_per_conn: 64,
            max_connections: 4096,
        }
    }
}

/// Accepts and serves connections until the listener fails.
pub async fn serve<S: Service>(listener: TcpListener, cfg: Arc<ServerConfig>, svc: Arc<S>) {
    let conns = Arc::new(Semaphore::new(cfg.max_connections));
    let per_client: Arc<std::sync::Mutex<std::collections::HashMap<u64, usize>>> = Default::default();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(server = %cfg.name, error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = conns.clone().try_acquire_owned() else {
            tracing::warn!(server = %cfg.name, %peer, "too many connections; refusing");
            continue;
        };
        let (cfg, svc, per_client) = (cfg.clone(), svc.clone(), per_client.clone());
        tokio::spawn(async move {
            serve_conn(stream, peer, cfg, svc, per_client).await;
            drop(permit);
        });
    }
}

type ClientCounts = Arc<std::sync::Mutex<std::collections::HashMap<u64, usize>>>;

async fn serve_conn<S: Service>(
    mut stream: TcpStream,
    peer: SocketAddr,
    cfg: Arc<ServerConfig>,
    svc: Arc<S>,
    per_client: ClientCounts,
) {
    let _ = stream.set_nodelay(true);
    let hello = match tokio::time::timeout(HANDSHAKE_TIMEOUT, server_handshake(&mut stream, &cfg.secret)).await {
        Ok(Ok(h)) => h,
        Ok(Err(why)) => {
            tracing::warn!(server = %cfg.name, %peer, "authentication failed: {why}");
            return;
        }
        Err(_) => {
            tracing::warn!(server = %cfg.name, %peer, "handshake timed out");
            return;
        }
    };
    tracing::debug!(server = %cfg.name, %peer, role = %hello.role, client = hello.client_id, "connected");
    *per_client.lock().expect("client counts").entry(hello.client_id).or_default() += 1;
    let (rd, wr) = stream.into_split();
    let out = Arc::new(tokio::sync::Mutex::new(BufWriter::with_capacity(64 * 1024, wr)));
    let slots = Arc::new(Semaphore::new(cfg.max_in_flight_per_conn));
    let mut r = BufReader::with_capacity(256 * 1024, rd);
    loop {
        let frame = match read_frame(&mut r, &cfg.limits).await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(FrameError::Io(e)) => {
                tracing::debug!(server = %cfg.name, %peer, "read: {e}");
                break;
            }
            Err(e) => {
                tracing::warn!(server = %cfg.name, %peer, "bad frame, closing connection: {e}");
                let _ = send(&out, 0, Response::error(Errno::Proto, format!("bad frame: {e}")), vec![]).await;
                break;
            }
        };
        if frame.kind != FrameKind::Request {
            tracing::warn!(server = %cfg.name, %peer, "unexpected frame kind {:?}, closing", frame.kind);
            let answer = Response::error(Errno::Proto, "expected a request frame");
            let _ = send(&out, frame.request_id, answer, vec![]).await;
            break;
        }
        let req: Request = match postcard::from_bytes(&frame.msg) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(server = %cfg.name, %peer, "undecodable request: {e}");
                let answer = Response::error(Errno::Proto, format!("malformed or unknown request: {e}"));
                if send(&out, frame.request_id, answer, vec![]).await.is_err() {
                    break;
                }
                continue;
            }
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let ctx = RequestCtx { client_id: hello.client_id, xid: frame.request_id, peer };
        let (svc, out, name) = (svc.clone(), out.clone(), cfg.name.clone());
        tokio::spawn(async move {
            let op = req.op_name();
            let (resp, payload) = guarded(&name, op, svc.handle(ctx, req, frame.payload)).await;
            let _ = send(&out, frame.request_id, resp, payload).await;
            drop(slot);
        });
    }
    // Let requests in flight finish (their answers go out) before the client counts
    // as gone.
    let _ = slots.acquire_many(cfg.max_in_flight_per_conn as u32).await;
    if let Ok(mut w) = Arc::try_unwrap(out).map(|m| m.into_inner()) {
        let _ = w.shutdown().await;
    }
    let gone = {
        let mut m = per_client.lock().expect("client counts");
        let n = m.entry(hello.client_id).or_default();
        *n = n.saturating_sub(1);
        if *n == 0 {
            m.remove(&hello.client_id);
            true
        } else {
            false
        }
    };
    if gone {
        tracing::debug!(server = %cfg.name, client = hello.client_id, "client gone");
        svc.client_gone(hello.client_id);
    }
}

/// Runs a handler; one that panics is answered with an error instead of taking the
/// answer (or the server) with it.
pub(crate) async fn guarded(server: &str, op: &'static str, handler: impl Future<Output = Answer>) -> Answer {
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

type Out = Arc<tokio::sync::Mutex<BufWriter<tokio::net::tcp::OwnedWriteHalf>>>;

/// Writes one answer on the connection.
async fn send(out: &Out, id: u64, resp: Response, payload: Vec<Bytes>) -> std::io::Result<()> {
    let msg = postcard::to_stdvec(&resp).map_err(|e| std::io::Error::other(format!("cannot encode response: {e}")))?;
    let mut w = out.lock().await;
    write_frame(&mut *w, FrameKind::Response, id, &msg, &payload).await?;
    w.flush().await
}
