//! The server side of braid connections, shared by the MGS, MDS and OSS.
//!
//! Each accepted connection is authenticated, then its frames are read one after the
//! other and each request is handled in its own task, at most `max_in_flight_per_conn`
//! at once (the reader stops reading when that many are pending: backpressure on a
//! client that floods). Handler tasks write their answers themselves.
//!
//! A service that hands out revocable state (the MDS's directory leases) keeps a
//! [`Callbacks`] registry: every connection of a client is registered there, and the
//! service can call the client back on it (a callback frame, answered by an ack) or
//! evict a client that does not answer in [`CALLBACK_TIMEOUT`].
//!
//! Hostile input: a frame that breaks framing (bad magic, checksum, oversize length)
//! closes that connection after a best-effort error reply; a frame whose message does
//! not decode (unknown operation, garbage) gets an error reply and the connection
//! stays. A handler that panics is answered with an error; the server keeps serving.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Semaphore};

use proto::auth::{server_handshake, server_handshake_or_refuse, Secret, HANDSHAKE_TIMEOUT};
use proto::frame::{read_frame, write_frame, FrameError, FrameKind, FrameLimits};
use proto::msg::Hello;
use proto::msg::{Callback, Request, Response};
use proto::Errno;

use crate::local::Dispatch;
use crate::service::{dup_socket, guarded, ReadHalf, WriteHalf};
pub use crate::service::{Answer, RequestCtx, CALLBACK_TIMEOUT, IN_PROCESS_CONN};

/// Ids of accepted connections (0 is [`IN_PROCESS_CONN`]).
static NEXT_CONN_ID: AtomicU64 = AtomicU64::new(1);

/// A service answers requests. Implemented by the MGS, MDS and OSS.
pub trait Service: Send + Sync + 'static {
    fn handle(&self, ctx: RequestCtx, req: Request, payload: Bytes) -> impl Future<Output = Answer> + Send;

    /// The last connection of client `client_id` closed (the client died or went
    /// away): state held for it, such as locks, can be released.
    fn client_gone(&self, _client_id: u64) {}

    /// Connection `conn_id` of client `client_id` closed (called before
    /// [`Service::client_gone`] when it was the last).
    fn connection_closed(&self, _client_id: u64, _conn_id: u64) {}

    /// Where the connections of this service's clients are registered, if the
    /// service calls clients back.
    fn callbacks(&self) -> Option<&Callbacks> {
        None
    }
}

/// Every service can be called in-process ([`crate::local`]).
impl<S: Service> Dispatch for S {
    fn dispatch(
        &self,
        ctx: RequestCtx,
        req: Request,
        payload: Bytes,
    ) -> std::pin::Pin<Box<dyn Future<Output = Answer> + Send + '_>> {
        Box::pin(self.handle(ctx, req, payload))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallbackError {
    #[error("client {0:#x} has no connection")]
    NoConnection(u64),
    #[error("client {0:#x} did not answer a callback in time")]
    Timeout(u64),
    #[error("callback to client {client:#x} failed: {reason}")]
    Io { client: u64, reason: String },
}

/// One connection of a client, as callbacks reach it.
struct ClientConn {
    id: u64,
    /// What the peer said it is in the handshake: a client, or another server.
    role: String,
    out: Out,
    /// The socket's descriptor, duplicated: an eviction shuts it down at once, even
    /// while an answer to a client that stopped reading holds `out`.
    socket: std::net::TcpStream,
    /// Callbacks sent and not acked yet, by callback id (bounded by the callers
    /// waiting, each for at most [`CALLBACK_TIMEOUT`]).
    acks: Mutex<HashMap<u64, oneshot::Sender<()>>>,
}

/// The connections of a service's clients, for calling them back.
#[derive(Default)]
pub struct Callbacks {
    conns: Mutex<HashMap<u64, Vec<Arc<ClientConn>>>>,
    next_id: AtomicU64,
}

impl Callbacks {
    fn attach(&self, client_id: u64, conn: Arc<ClientConn>) {
        self.conns.lock().expect("callback connections").entry(client_id).or_default().push(conn);
    }

    fn detach(&self, client_id: u64, conn: &Arc<ClientConn>) {
        let mut m = self.conns.lock().expect("callback connections");
        if let Some(list) = m.get_mut(&client_id) {
            list.retain(|c| !Arc::ptr_eq(c, conn));
            if list.is_empty() {
                m.remove(&client_id);
            }
        }
    }

    /// Delivers `cb` to client `client_id` on connection `conn_id` and waits for its
    /// ack; a client of this process ([`IN_PROCESS_CONN`]) is called directly.
    pub async fn call(&self, client_id: u64, conn_id: u64, cb: &Callback) -> Result<(), CallbackError> {
        if conn_id == IN_PROCESS_CONN {
            let h = crate::local::client_handler(client_id).ok_or(CallbackError::NoConnection(client_id))?;
            if let Some(after) = h.callback(cb) {
                after.await;
            }
            return Ok(());
        }
        let conn = {
            let m = self.conns.lock().expect("callback connections");
            m.get(&client_id)
                .and_then(|l| l.iter().find(|c| c.id == conn_id).cloned())
                .ok_or(CallbackError::NoConnection(client_id))?
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        conn.acks.lock().expect("callback acks").insert(id, tx);
        let msg = proto::msg::encode(cb).map_err(|e| CallbackError::Io { client: client_id, reason: e.to_string() })?;
        let outcome = match tokio::time::timeout(CALLBACK_TIMEOUT, async {
            send_frame(&conn.out, FrameKind::Callback, id, &msg, &[])
                .await
                .map_err(|e| CallbackError::Io { client: client_id, reason: e.to_string() })?;
            rx.await.map_err(|_| CallbackError::NoConnection(client_id))
        })
        .await
        {
            Ok(r) => r,
            Err(_) => Err(CallbackError::Timeout(client_id)),
        };
        conn.acks.lock().expect("callback acks").remove(&id);
        outcome
    }

    /// The connections of clients (not of other servers) open now, as (client id,
    /// connection id).
    pub fn clients(&self) -> Vec<(u64, u64)> {
        let m = self.conns.lock().expect("callback connections");
        let conns = m.iter().flat_map(|(client, l)| l.iter().map(move |c| (*client, c)));
        conns.filter(|(_, c)| c.role == "client").map(|(client, c)| (client, c.id)).collect()
    }

    /// Closes connection `conn_id` of `client_id` (it did not answer a callback): the
    /// client sees its connection end, stops relying on what it was granted on it,
    /// and reconnects. Writes blocked on the connection fail at once.
    pub fn evict(&self, client_id: u64, conn_id: u64) {
        let conn = {
            let m = self.conns.lock().expect("callback connections");
            m.get(&client_id).and_then(|l| l.iter().find(|c| c.id == conn_id).cloned())
        };
        if let Some(c) = conn {
            let _ = c.socket.shutdown(std::net::Shutdown::Both);
            c.acks.lock().expect("callback acks").clear();
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub name: String,
    pub secret: Secret,
    pub limits: FrameLimits,
    pub max_in_flight_per_conn: usize,
    /// Connections beyond this are refused at accept.
    pub max_connections: usize,
    /// TLS: taken from clients that speak it (all of them, if it is required).
    pub tls: Option<Arc<crate::tls::TlsContext>>,
}

impl ServerConfig {
    pub fn new(name: &str, secret: Secret) -> ServerConfig {
        ServerConfig {
            name: name.to_string(),
            secret,
            limits: FrameLimits::default(),
            max_in_flight_per_conn: 64,
            max_connections: 4096,
            tls: None,
        }
    }

    /// With TLS (see [`crate::tls`]).
    pub fn with_tls(self, tls: Option<Arc<crate::tls::TlsContext>>) -> ServerConfig {
        ServerConfig { tls, ..self }
    }
}

/// Sets up a new connection: TLS if the client speaks it (or a refusal if this
/// server requires it and the client does not), then the cluster secret's
/// handshake. The client's hello and the stream's halves.
async fn accept_conn(mut stream: TcpStream, cfg: &ServerConfig) -> Result<(Hello, ReadHalf, WriteHalf), String> {
    let mut first = [0u8; 1];
    let speaks_tls = match stream.peek(&mut first).await {
        Ok(0) => return Err("closed before the handshake".into()),
        Ok(_) => first[0] == crate::tls::HANDSHAKE_RECORD,
        Err(e) => return Err(format!("read: {e}")),
    };
    match (&cfg.tls, speaks_tls) {
        (Some(tls), true) => {
            let mut stream = tls.accept(stream).await?;
            let hello = server_handshake(&mut stream, &cfg.secret).await?;
            let (rd, wr) = tokio::io::split(stream);
            Ok((hello, Box::new(rd), Box::new(wr)))
        }
        (Some(tls), false) if tls.required => {
            let why = "this server takes TLS connections only: give the client the cluster's TLS files \
                       (--tls-dir, -o tls_dir= or BRAID_TLS_DIR)";
            server_handshake_or_refuse(&mut stream, &cfg.secret, Some(why)).await?;
            Err("a plain (non-TLS) client was refused: this server requires TLS".into())
        }
        (None, true) => Err("the client speaks TLS, but this server has no TLS settings (--tls-dir)".into()),
        (_, false) => {
            let hello = server_handshake(&mut stream, &cfg.secret).await?;
            let (rd, wr) = stream.into_split();
            Ok((hello, Box::new(rd), Box::new(wr)))
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
    stream: TcpStream,
    peer: SocketAddr,
    cfg: Arc<ServerConfig>,
    svc: Arc<S>,
    per_client: ClientCounts,
) {
    let _ = stream.set_nodelay(true);
    // A service that calls clients back can evict them: it needs its own handle on
    // the socket for that.
    let socket = match svc.callbacks().map(|_| dup_socket(&stream)).transpose() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(server = %cfg.name, %peer, "cannot duplicate the connection's socket: {e}");
            return;
        }
    };
    let (hello, rd, wr) = match tokio::time::timeout(HANDSHAKE_TIMEOUT, accept_conn(stream, &cfg)).await {
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
    let out = Arc::new(tokio::sync::Mutex::new(BufWriter::with_capacity(64 * 1024, wr)));
    let conn_id = NEXT_CONN_ID.fetch_add(1, Ordering::Relaxed);
    let callbacks = svc.callbacks().zip(socket).map(|(registry, socket)| {
        let conn = Arc::new(ClientConn {
            id: conn_id,
            role: hello.role.clone(),
            out: out.clone(),
            socket,
            acks: Mutex::default(),
        });
        registry.attach(hello.client_id, conn.clone());
        conn
    });
    let slots = Arc::new(Semaphore::new(cfg.max_in_flight_per_conn));
    let mut r = BufReader::with_capacity(proto::frame::READ_BUFFER_BYTES, rd);
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
        if let (FrameKind::CallbackAck, Some(conn)) = (frame.kind, &callbacks) {
            // An ack nobody waits for any more (it came after the timeout) is dropped.
            if let Some(tx) = conn.acks.lock().expect("callback acks").remove(&frame.request_id) {
                let _ = tx.send(());
            }
            continue;
        }
        if frame.kind != FrameKind::Request {
            tracing::warn!(server = %cfg.name, %peer, "unexpected frame kind {:?}, closing", frame.kind);
            let answer = Response::error(Errno::Proto, "expected a request frame");
            let _ = send(&out, frame.request_id, answer, vec![]).await;
            break;
        }
        let (req, job) = match proto::msg::decode_request(&frame.msg) {
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
        let from_server = crate::service::is_server_role(&hello.role);
        let job: Option<Arc<str>> = job.map(Arc::from);
        let ctx = RequestCtx {
            client_id: hello.client_id,
            xid: frame.request_id,
            peer,
            conn_id,
            from_server,
            job: job.clone(),
        };
        let (svc, out, name) = (svc.clone(), out.clone(), cfg.name.clone());
        tokio::spawn(async move {
            let (resp, payload) = crate::stats::counted(req, job, frame.payload, async |req: Request, payload| {
                let op = req.op_name();
                guarded(&name, op, svc.handle(ctx, req, payload)).await
            })
            .await;
            let _ = send(&out, frame.request_id, resp, payload).await;
            drop(slot);
        });
    }
    // Let requests in flight finish (their answers go out) before the client counts
    // as gone.
    let _ = slots.acquire_many(cfg.max_in_flight_per_conn as u32).await;
    if let (Some(registry), Some(conn)) = (svc.callbacks(), callbacks) {
        registry.detach(hello.client_id, &conn);
    }
    svc.connection_closed(hello.client_id, conn_id);
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

type Out = Arc<tokio::sync::Mutex<BufWriter<WriteHalf>>>;

/// Writes one answer on the connection.
async fn send(out: &Out, id: u64, resp: Response, payload: Vec<Bytes>) -> std::io::Result<()> {
    let msg = proto::msg::encode(&resp).map_err(|e| std::io::Error::other(format!("cannot encode response: {e}")))?;
    send_frame(out, FrameKind::Response, id, &msg, &payload).await
}

/// Writes and flushes one frame on the connection.
async fn send_frame(out: &Out, kind: FrameKind, id: u64, msg: &[u8], payload: &[Bytes]) -> std::io::Result<()> {
    let mut w = out.lock().await;
    write_frame(&mut *w, kind, id, msg, payload).await?;
    w.flush().await
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::client::{CallbackHandler, Identity, RpcClient, RpcOptions};
    use proto::Fid;

    /// Remembers who pinged it last, so the test can call that client back; answers
    /// with `answer_bytes` of payload.
    #[derive(Default)]
    struct Caller {
        callbacks: Callbacks,
        last: Mutex<Option<(u64, u64)>>,
        answer_bytes: usize,
        closed: Mutex<Vec<u64>>,
    }

    impl Service for Caller {
        async fn handle(&self, ctx: RequestCtx, _req: Request, _payload: Bytes) -> Answer {
            *self.last.lock().unwrap() = Some((ctx.client_id, ctx.conn_id));
            (Response::Ok, vec![Bytes::from(vec![7u8; self.answer_bytes])])
        }

        fn callbacks(&self) -> Option<&Callbacks> {
            Some(&self.callbacks)
        }

        fn connection_closed(&self, _client_id: u64, conn_id: u64) {
            self.closed.lock().unwrap().push(conn_id);
        }
    }

    async fn start(svc: Caller) -> (String, Arc<Caller>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let svc = Arc::new(svc);
        tokio::spawn(serve(listener, Arc::new(ServerConfig::new("test", Secret::Insecure)), svc.clone()));
        (addr, svc)
    }

    /// Answers with the request's own payload, some at once and some after others.
    struct Echo;

    impl Service for Echo {
        async fn handle(&self, _ctx: RequestCtx, _req: Request, payload: Bytes) -> Answer {
            for _ in 0..payload.len() % 3 {
                tokio::task::yield_now().await;
            }
            (Response::Ok, vec![payload])
        }
    }

    /// Many requests in flight on one connection, answered out of order: every answer
    /// arrives, whole and to its own request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_ready_together_all_arrive_whole_and_to_their_own_requests() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(listener, Arc::new(ServerConfig::new("test", Secret::Insecure)), Arc::new(Echo)));
        let client = Arc::new(RpcClient::new(addr, Identity::new("test", Secret::Insecure), RpcOptions::default()));
        for round in 0..3usize {
            let calls: Vec<_> = (0..300usize)
                .map(|i| {
                    let client = client.clone();
                    tokio::spawn(async move {
                        let body: Vec<u8> = (0..(i * 331 + round) % 90_000).map(|k| (k + i) as u8).collect();
                        let reply = client.call(&Request::Ping, vec![Bytes::from(body.clone())]).await.unwrap();
                        assert!(reply.payload[..] == body[..], "call {i}: the answer is its own");
                    })
                })
                .collect();
            let all = async {
                for c in calls {
                    c.await.unwrap();
                }
            };
            tokio::time::timeout(Duration::from_secs(30), all).await.expect("every answer arrives");
        }
        // One call alone afterwards is answered too (nothing was left unsent).
        let reply = tokio::time::timeout(Duration::from_secs(10), client.call(&Request::Ping, vec![Bytes::from("x")]))
            .await
            .expect("a lone call is answered")
            .unwrap();
        assert_eq!(&reply.payload[..], b"x");
    }

    /// Waits up to 10 s for `ready`.
    async fn eventually(what: &str, ready: impl Fn() -> bool) {
        let since = Instant::now();
        while !ready() {
            assert!(since.elapsed() < Duration::from_secs(10), "{what}: not within 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_eviction_ends_at_once_a_connection_whose_client_stopped_reading() {
        let (addr, svc) = start(Caller { answer_bytes: 8 << 20, ..Default::default() }).await;
        let mut s = TcpStream::connect(&addr).await.unwrap();
        proto::auth::client_handshake(&mut s, &Secret::Insecure, 42, "test").await.unwrap();
        // Ask for large answers and read none: the server's writer blocks on a full
        // socket, holding the connection's sending half.
        let msg = proto::msg::encode(&Request::Ping).unwrap();
        for id in 1..=4 {
            write_frame(&mut s, FrameKind::Request, id, &msg, &[]).await.unwrap();
        }
        s.flush().await.unwrap();
        eventually("the pings to arrive", || svc.last.lock().unwrap().is_some()).await;
        let (client_id, conn_id) = svc.last.lock().unwrap().unwrap();

        let cb = Callback::RevokeLease { dir: Fid::new(0, 0x400, 9), lease: 3 };
        let r = svc.callbacks.call(client_id, conn_id, &cb).await;
        assert!(matches!(r, Err(CallbackError::Timeout(_))), "{r:?}");
        svc.callbacks.evict(client_id, conn_id);
        eventually("the evicted connection to close", || svc.closed.lock().unwrap().contains(&conn_id)).await;
        drop(s);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_gives_up_on_its_connection_closes_it() {
        let (addr, svc) = start(Caller::default()).await;
        let client = RpcClient::new(addr, Identity::new("test", Secret::Insecure), RpcOptions::default());
        let reply = client.call(&Request::Ping, vec![]).await.unwrap();
        let (client_id, conn_id) = svc.last.lock().unwrap().unwrap();
        // A callback the client cannot decode makes it give the connection up; the
        // server must see it close, though the client makes no further call and the
        // answer's session lives on.
        let conn = svc.callbacks.conns.lock().unwrap()[&client_id].iter().find(|c| c.id == conn_id).cloned().unwrap();
        {
            let mut w = conn.out.lock().await;
            write_frame(&mut *w, FrameKind::Callback, 1, b"\xff\xff\xff", &[]).await.unwrap();
            w.flush().await.unwrap();
        }
        eventually("the client to give the connection up", || !reply.session.alive()).await;
        eventually("the server to see the connection close", || svc.closed.lock().unwrap().contains(&conn_id)).await;
    }

    #[derive(Default)]
    struct Heard(Mutex<Vec<Callback>>);

    impl CallbackHandler for Heard {
        fn callback(&self, cb: &Callback) -> Option<crate::AckAfter> {
            self.0.lock().unwrap().push(cb.clone());
            None
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callbacks_reach_the_client_and_a_session_is_trusted_only_while_fresh() {
        let (addr, svc) = start(Caller::default()).await;

        let client = RpcClient::new(addr, Identity::new("test", Secret::Insecure), RpcOptions::default());
        let heard = Arc::new(Heard::default());
        assert!(client.set_callback_handler(heard.clone()));
        let reply = client.call(&Request::Ping, vec![]).await.unwrap();
        assert!(reply.session.trusted(), "just answered");
        let (client_id, conn_id) = svc.last.lock().unwrap().expect("the server saw the ping");

        // The server calls the client back on its connection and hears the ack.
        let cb = Callback::RevokeLease { dir: Fid::new(0, 0x400, 9), lease: 3 };
        svc.callbacks.call(client_id, conn_id, &cb).await.expect("callback acked");
        assert_eq!(*heard.0.lock().unwrap(), std::slice::from_ref(&cb));
        assert!(matches!(
            svc.callbacks.call(client_id, conn_id + 1000, &cb).await,
            Err(CallbackError::NoConnection(_))
        ));

        // Without a fresh answer the session stops being trusted before the server
        // could give up on the client; the next answer makes it trusted again.
        let since = Instant::now();
        while reply.session.trusted() {
            assert!(since.elapsed() < CALLBACK_TIMEOUT, "still trusted a whole callback timeout after its answer");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(reply.session.alive());
        client.call(&Request::Ping, vec![]).await.unwrap();
        assert!(reply.session.trusted(), "one connection, one freshness");

        // A connection that ended is never trusted again.
        svc.callbacks.evict(client_id, conn_id);
        eventually("the client to notice its connection end", || !reply.session.alive()).await;
        assert!(!reply.session.trusted());
    }

    /// Acks only once `release` is notified; meanwhile the test makes calls.
    struct Later(Arc<tokio::sync::Notify>);

    impl CallbackHandler for Later {
        fn callback(&self, _cb: &Callback) -> Option<crate::AckAfter> {
            let release = self.0.clone();
            Some(Box::pin(async move { release.notified().await }))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_ack_waits_for_what_the_handler_left_while_the_connection_answers_calls() {
        let (addr, svc) = start(Caller::default()).await;
        let client = Arc::new(RpcClient::new(addr, Identity::new("test", Secret::Insecure), RpcOptions::default()));
        let release = Arc::new(tokio::sync::Notify::new());
        assert!(client.set_callback_handler(Arc::new(Later(release.clone()))));
        client.call(&Request::Ping, vec![]).await.unwrap();
        let (client_id, conn_id) = svc.last.lock().unwrap().expect("the server saw the ping");

        let cb = Callback::RevokeLease { dir: Fid::new(0, 0x400, 9), lease: 3 };
        let acked = {
            let svc = svc.clone();
            tokio::spawn(async move { svc.callbacks.call(client_id, conn_id, &cb).await })
        };
        // What the handler waits on (in braid, flushes) may need answers on the same
        // connection: they keep coming while the ack waits.
        for _ in 0..20 {
            client.call(&Request::Ping, vec![]).await.expect("answered while an ack waits");
        }
        assert!(!acked.is_finished(), "acked before the handler's work was done");
        release.notify_one();
        tokio::time::timeout(Duration::from_secs(5), acked)
            .await
            .expect("acked once the handler's work was done")
            .unwrap()
            .expect("the callback succeeded");
    }
}
