//! The client side of a braid connection.
//!
//! One long-lived TCP connection per (client, server) pair carries many requests at
//! once; responses are matched by request id. The number of requests in flight on a
//! connection is bounded (callers wait for a slot). Each try has a deadline; a
//! connection that fails or times out is dropped and the request is sent again on a
//! new one, with backoff, until the recovery timeout passes — then the caller gets a
//! clean [`RpcError::Unavailable`]. A retried request keeps its request id (the xid),
//! which the MDS reply cache uses to answer a retried non-idempotent operation
//! without applying it twice.
//!
//! A server may call the client back on the same connection (a lease revoked by the
//! MDS): the reader hands the callback to the client's [`CallbackHandler`] before it
//! reads on, then acks it. Each answer names the [`Session`] it came on, which tells
//! whether state granted in it can still be relied on (see
//! [`crate::service::CALLBACK_TIMEOUT`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Semaphore};

use proto::auth::{client_handshake, Secret, HANDSHAKE_TIMEOUT};
use proto::frame::{read_frame, write_frame, Frame, FrameKind, FrameLimits};
use proto::msg::{Callback, Request, Response};
use proto::{Errno, RpcError};

use crate::local::{joined, Dispatch};
pub use crate::service::CallbackHandler;
use crate::service::{dup_socket, guarded, ReadHalf, RequestCtx, WriteHalf, CALLBACK_TIMEOUT, IN_PROCESS_CONN};
use crate::stats::current_job;

#[derive(Debug, Clone)]
pub struct RpcOptions {
    pub connect_timeout: Duration,
    /// Deadline of one try of one request.
    pub request_timeout: Duration,
    /// How long a request keeps being retried across reconnects before it fails.
    pub recovery_timeout: Duration,
    /// Requests in flight per connection (Lustre keeps 8 bulk RPCs per OST; metadata
    /// and small I/O benefit from more).
    pub max_in_flight: usize,
    pub limits: FrameLimits,
}

impl Default for RpcOptions {
    fn default() -> Self {
        RpcOptions {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            recovery_timeout: Duration::from_secs(60),
            max_in_flight: 32,
            limits: FrameLimits::default(),
        }
    }
}

/// Who this process is to the servers it talks to.
#[derive(Debug)]
pub struct Identity {
    pub client_id: u64,
    pub role: String,
    pub secret: Secret,
    /// Connections are made over TLS with this node's certificate.
    pub tls: Option<Arc<crate::tls::TlsContext>>,
    next_xid: AtomicU64,
}

impl Identity {
    pub fn new(role: &str, secret: Secret) -> Arc<Identity> {
        Identity::with_tls(role, secret, None)
    }

    /// As [`Identity::new`], connecting over TLS when `tls` is given.
    pub fn with_tls(role: &str, secret: Secret, tls: Option<Arc<crate::tls::TlsContext>>) -> Arc<Identity> {
        let mut b = [0u8; 8];
        // A random id keeps two clients (or two incarnations of one) apart in the MDS
        // reply cache. Falling back to time and pid is still unique enough per host.
        let id = match getrandom::fill(&mut b) {
            Ok(()) => u64::from_le_bytes(b),
            Err(_) => {
                let t =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos()
                        as u64;
                t ^ ((std::process::id() as u64) << 32)
            }
        };
        Arc::new(Identity { client_id: id, role: role.to_string(), secret, tls, next_xid: AtomicU64::new(1) })
    }

    pub fn next_xid(&self) -> u64 {
        self.next_xid.fetch_add(1, Ordering::Relaxed)
    }
}

/// A response and its bulk payload.
#[derive(Debug)]
pub struct Reply {
    pub response: Response,
    pub payload: Bytes,
    /// Where the answer came from.
    pub session: Session,
    /// The request was sent more than once (a connection was lost or a try timed
    /// out): the answer may come from the server's reply cache, and state it granted
    /// may have been taken back since.
    pub resent: bool,
}

/// The connection (or the in-process delivery) an answer came on: state a server
/// granted in it and may revoke by callback is to be relied on only while
/// [`Session::trusted`] says so.
#[derive(Clone)]
pub enum Session {
    /// A server of this process: its callbacks are direct calls, so nothing is ever
    /// missed.
    InProcess,
    Tcp(Arc<SessionState>),
}

/// What a [`Session`] knows of its connection. Kept apart from the socket, so state
/// that names a dead connection does not keep the socket open.
pub struct SessionState {
    addr: String,
    alive: AtomicBool,
    /// Until when (see [`now_ms`]) revocable state granted on this connection holds.
    fresh_until_ms: AtomicU64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Session::InProcess => f.write_str("in-process"),
            Session::Tcp(s) => write!(f, "tcp {}", s.addr),
        }
    }
}

impl Session {
    /// Whether its connection still stands (in-process delivery always does).
    pub fn alive(&self) -> bool {
        match self {
            Session::InProcess => true,
            Session::Tcp(s) => s.alive.load(Ordering::Acquire),
        }
    }

    /// Whether state granted in this session still holds: its connection is alive,
    /// and an answer to a request sent less than (a margin under)
    /// [`CALLBACK_TIMEOUT`] ago came on it since, so the server cannot have evicted
    /// this client without its knowing.
    pub fn trusted(&self) -> bool {
        match self {
            Session::InProcess => true,
            Session::Tcp(s) => self.alive() && now_ms() < s.fresh_until_ms.load(Ordering::Acquire),
        }
    }
}

/// How much sooner than [`CALLBACK_TIMEOUT`] a client stops trusting a session:
/// room for clock drift and for the server's side of an ack.
const TRUST_MARGIN: Duration = Duration::from_millis(300);

/// Milliseconds since boot, time suspended included (`CLOCK_BOOTTIME`): a machine
/// that slept must wake with its trust expired, since the server's clock ran on. On
/// the impossible failure of the clock, a time after every trust.
fn now_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes only into the timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return u64::MAX;
    }
    (ts.tv_sec as u64).saturating_mul(1000).saturating_add(ts.tv_nsec as u64 / 1_000_000)
}

type Waiter = oneshot::Sender<Result<Frame, RpcError>>;

/// Most callback acks waiting to be written on one connection; a server that sends
/// more callbacks than that without reading the acks loses the connection.
const ACKS_PENDING_MAX: usize = 256;

/// What the callers and the reader of one connection share.
struct Shared {
    session: Arc<SessionState>,
    pending: Mutex<HashMap<u64, Waiter>>,
    /// The sending half: a caller writes its own frame (no hop through a writer task);
    /// the reader writes callback acks.
    writer: tokio::sync::Mutex<Sender>,
    /// The socket's descriptor, duplicated: shutting it down ends the connection at
    /// once, whoever holds the halves and whatever they wait for.
    socket: std::net::TcpStream,
    handler: Option<Arc<dyn CallbackHandler>>,
    acks_pending: AtomicUsize,
}

impl Shared {
    fn alive(&self) -> bool {
        self.session.alive.load(Ordering::Acquire)
    }

    /// Ends the connection: every waiting caller gets `reason`, the reader wakes to
    /// the end of the stream, and the server sees the connection close.
    fn fail_all(&self, reason: &str) {
        self.session.alive.store(false, Ordering::Release);
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        let waiters: Vec<Waiter> = {
            let mut p = self.pending.lock().expect("pending lock");
            p.drain().map(|(_, w)| w).collect()
        };
        for w in waiters {
            let _ =
                w.send(Err(RpcError::ConnectionLost { addr: self.session.addr.clone(), reason: reason.to_string() }));
        }
    }
}

struct Sender {
    w: BufWriter<WriteHalf>,
    /// Set while a frame is being written. A caller cancelled in the middle leaves it
    /// set, and the next caller then drops the connection instead of sending after a
    /// partial frame.
    in_frame: bool,
}

impl Sender {
    /// Writes and flushes one frame, unless an interrupted one went before it.
    async fn send(&mut self, kind: FrameKind, id: u64, msg: &[u8], payload: &[Bytes]) -> std::io::Result<()> {
        if self.in_frame {
            return Err(std::io::Error::other("an interrupted request left a partial frame"));
        }
        self.in_frame = true;
        let r = match write_frame(&mut self.w, kind, id, msg, payload).await {
            Ok(()) => self.w.flush().await,
            Err(e) => Err(e),
        };
        self.in_frame = r.is_err();
        r
    }
}

struct Conn {
    shared: Arc<Shared>,
    slots: Semaphore,
}

impl Drop for Conn {
    /// The last user of a connection is gone (its client dropped, or replaced after a
    /// failure): close the socket. The reader holds the shared half and would
    /// otherwise keep it open, and the server's descriptor with it, for as long as the
    /// server does.
    fn drop(&mut self) {
        self.shared.fail_all("the client closed the connection");
    }
}

/// A connection to one server, re-established as needed.
pub struct RpcClient {
    addr: String,
    identity: Arc<Identity>,
    opts: RpcOptions,
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    /// The server itself when it runs in this process ([`crate::local`]).
    local: Option<Arc<dyn Dispatch>>,
    /// Who carries out this server's callbacks, for connections made from now on.
    handler: Mutex<Option<Arc<dyn CallbackHandler>>>,
}

/// How one call reaches its server.
enum Route<'a> {
    /// The encoded request, sent again as it is on every try.
    Tcp(Arc<Vec<u8>>),
    InProcess(&'a Arc<dyn Dispatch>),
}

/// The peer address in-process requests carry.
const LOOPBACK_PEER: std::net::SocketAddr =
    std::net::SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 0));

impl RpcClient {
    /// A client of the server at `addr`: in-process when this process registered a
    /// server there, over TCP otherwise.
    pub fn new(addr: impl Into<String>, identity: Arc<Identity>, opts: RpcOptions) -> RpcClient {
        let addr = addr.into();
        let local = crate::local::find(&addr);
        if local.is_some() {
            tracing::debug!(%addr, role = %identity.role, "requests to {addr} are delivered in-process");
        }
        RpcClient { addr, identity, opts, conn: tokio::sync::Mutex::new(None), local, handler: Mutex::new(None) }
    }

    /// Has `handler` carry out this server's callbacks. Set it before the first call.
    /// False when callbacks cannot reach it (a server of this process with too many
    /// clients registered): the caller must then not ask for revocable state.
    pub fn set_callback_handler(&self, handler: Arc<dyn CallbackHandler>) -> bool {
        let ok =
            self.local.is_none() || crate::local::register_client(self.identity.client_id, Arc::downgrade(&handler));
        *self.handler.lock().expect("callback handler") = Some(handler);
        ok
    }

    /// Whether requests go to a server in this process rather than over TCP.
    pub fn is_in_process(&self) -> bool {
        self.local.is_some()
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn options(&self) -> &RpcOptions {
        &self.opts
    }

    /// The address the server sees this client's requests come from: the local end
    /// of the connection (made if there is none), or loopback in-process.
    pub async fn local_ip(&self) -> Result<std::net::IpAddr, RpcError> {
        if self.local.is_some() {
            return Ok(LOOPBACK_PEER.ip());
        }
        let conn = self.connection().await?;
        conn.shared
            .socket
            .local_addr()
            .map(|a| a.ip())
            .map_err(|e| RpcError::Connect { addr: self.addr.clone(), reason: e.to_string() })
    }

    /// Whether a connection to the server is up now (or being made).
    pub fn connected(&self) -> bool {
        self.local.is_some() || self.conn.try_lock().map_or(true, |c| c.as_ref().is_some_and(|c| c.shared.alive()))
    }

    /// Sends a request and waits for its answer, retrying across reconnects until the
    /// recovery timeout. A server-side error comes back as [`RpcError::Remote`].
    pub async fn call(&self, req: &Request, payload: Vec<Bytes>) -> Result<Reply, RpcError> {
        self.call_with_xid(self.identity.next_xid(), req, payload).await
    }

    /// Like [`RpcClient::call`] with a caller-chosen request id.
    pub async fn call_with_xid(&self, xid: u64, req: &Request, payload: Vec<Bytes>) -> Result<Reply, RpcError> {
        // In-process requests are handed over as they are; over TCP they are encoded once.
        let route = match &self.local {
            Some(svc) => Route::InProcess(svc),
            None => Route::Tcp(Arc::new(proto::msg::encode_request(req, current_job().as_deref()).map_err(|e| {
                RpcError::Protocol { addr: self.addr.clone(), reason: format!("cannot encode {}: {e}", req.op_name()) }
            })?)),
        };
        let started = Instant::now();
        let mut backoff = Duration::from_millis(20);
        let mut resent = false;
        loop {
            let attempt = match &route {
                Route::Tcp(msg) => self.try_once(xid, msg.clone(), payload.clone()).await,
                Route::InProcess(svc) => self.try_in_process(svc, xid, req, &payload).await,
            };
            let err = match attempt {
                Ok(mut reply) => match reply.response {
                    Response::Error(e) if e.code == Errno::Again => RpcError::Remote(e),
                    Response::Error(e) => return Err(RpcError::Remote(e)),
                    _ => {
                        reply.resent = resent;
                        return Ok(reply);
                    }
                },
                Err(e) => {
                    resent = true;
                    e
                }
            };
            if !err.is_retryable() {
                return Err(err);
            }
            if started.elapsed() + backoff > self.opts.recovery_timeout {
                return Err(RpcError::Unavailable {
                    addr: self.addr.clone(),
                    timeout_ms: self.opts.recovery_timeout.as_millis() as u64,
                    last: err.to_string(),
                });
            }
            tracing::debug!(addr = %self.addr, op = req.op_name(), error = %err, "retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// One try against the server of this process: its handler runs on this task.
    async fn try_in_process(
        &self,
        svc: &Arc<dyn Dispatch>,
        xid: u64,
        req: &Request,
        payload: &[Bytes],
    ) -> Result<Reply, RpcError> {
        let ctx = RequestCtx {
            client_id: self.identity.client_id,
            xid,
            peer: LOOPBACK_PEER,
            conn_id: IN_PROCESS_CONN,
            from_server: crate::service::is_server_role(&self.identity.role),
            job: current_job(),
        };
        let job = ctx.job.clone();
        let handler =
            crate::stats::counted(req.clone(), job, joined(payload.to_vec()), async |req: Request, payload| {
                let op = req.op_name();
                guarded(&self.addr, op, svc.dispatch(ctx, req, payload)).await
            });
        match tokio::time::timeout(self.opts.request_timeout, handler).await {
            Ok((response, payload)) => {
                Ok(Reply { response, payload: joined(payload), session: Session::InProcess, resent: false })
            }
            Err(_) => Err(RpcError::Timeout {
                addr: self.addr.clone(),
                timeout_ms: self.opts.request_timeout.as_millis() as u64,
            }),
        }
    }

    async fn try_once(&self, xid: u64, msg: Arc<Vec<u8>>, payload: Vec<Bytes>) -> Result<Reply, RpcError> {
        let conn = self.connection().await?;
        let _slot = conn
            .slots
            .acquire()
            .await
            .map_err(|_| RpcError::ConnectionLost { addr: self.addr.clone(), reason: "connection closed".into() })?;
        let (tx, rx) = oneshot::channel();
        conn.shared.pending.lock().expect("pending lock").insert(xid, tx);
        if !conn.shared.alive() {
            conn.shared.pending.lock().expect("pending lock").remove(&xid);
            return Err(RpcError::ConnectionLost { addr: self.addr.clone(), reason: "connection closed".into() });
        }
        let sent_at_ms = now_ms();
        let sent = conn.shared.writer.lock().await.send(FrameKind::Request, xid, &msg, &payload).await;
        if let Err(e) = sent {
            conn.shared.pending.lock().expect("pending lock").remove(&xid);
            conn.shared.fail_all(&format!("write failed: {e}"));
            return Err(RpcError::ConnectionLost { addr: self.addr.clone(), reason: format!("write failed: {e}") });
        }
        let frame = match tokio::time::timeout(self.opts.request_timeout, rx).await {
            Ok(Ok(r)) => r?,
            Ok(Err(_)) => {
                return Err(RpcError::ConnectionLost { addr: self.addr.clone(), reason: "reader stopped".into() })
            }
            Err(_) => {
                conn.shared.pending.lock().expect("pending lock").remove(&xid);
                // A hung peer: drop the connection so the next try starts clean.
                conn.shared.fail_all("request timed out");
                return Err(RpcError::Timeout {
                    addr: self.addr.clone(),
                    timeout_ms: self.opts.request_timeout.as_millis() as u64,
                });
            }
        };
        let response: Response = proto::msg::decode(&frame.msg)
            .map_err(|e| RpcError::Protocol { addr: self.addr.clone(), reason: format!("malformed response: {e}") })?;
        // The reader handed over every callback sent before this answer already.
        let trust = (CALLBACK_TIMEOUT - TRUST_MARGIN).as_millis() as u64;
        let session = &conn.shared.session;
        session.fresh_until_ms.fetch_max(sent_at_ms.saturating_add(trust), Ordering::AcqRel);
        Ok(Reply { response, payload: frame.payload, session: Session::Tcp(session.clone()), resent: false })
    }

    async fn connection(&self) -> Result<Arc<Conn>, RpcError> {
        let mut guard = self.conn.lock().await;
        if let Some(c) = guard.as_ref() {
            if c.shared.alive() {
                return Ok(c.clone());
            }
        }
        *guard = None;
        let c = Arc::new(self.connect().await?);
        *guard = Some(c.clone());
        Ok(c)
    }

    /// The cluster secret's handshake over a connection's stream (inside TLS, if
    /// any).
    async fn handshake<S>(&self, stream: &mut S) -> Result<(), RpcError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let connect_err = |reason: String| RpcError::Connect { addr: self.addr.clone(), reason };
        let id = &self.identity;
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, client_handshake(stream, &id.secret, id.client_id, &id.role))
            .await
        {
            Err(_) => Err(connect_err("handshake timed out".into())),
            Ok(Err(e)) if e.denied => Err(RpcError::Auth { addr: self.addr.clone(), reason: e.reason }),
            Ok(Err(e)) if id.tls.is_some() && crate::tls::refused_by_peer(&e.reason) => Err(RpcError::Auth {
                addr: self.addr.clone(),
                reason: format!("the server refused this client's TLS certificate ({})", e.reason),
            }),
            Ok(Err(e)) => Err(connect_err(format!("handshake: {}", e.reason))),
            Ok(Ok(())) => Ok(()),
        }
    }

    /// A failed TLS handshake: a certificate problem is not worth retrying.
    fn tls_err(&self, reason: String) -> RpcError {
        if reason.contains("certificate") || crate::tls::refused_by_peer(&reason) {
            RpcError::Auth { addr: self.addr.clone(), reason }
        } else {
            RpcError::Connect { addr: self.addr.clone(), reason }
        }
    }

    async fn connect(&self) -> Result<Conn, RpcError> {
        let connect_err = |reason: String| RpcError::Connect { addr: self.addr.clone(), reason };
        let mut stream = tokio::time::timeout(self.opts.connect_timeout, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| connect_err("connect timed out".into()))?
            .map_err(|e| connect_err(e.to_string()))?;
        stream.set_nodelay(true).map_err(|e| connect_err(e.to_string()))?;
        let socket = dup_socket(&stream).map_err(|e| connect_err(e.to_string()))?;
        let (rd, wr): (ReadHalf, WriteHalf) = match &self.identity.tls {
            Some(tls) => {
                let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.connect(&self.addr, stream))
                    .await
                    .map_err(|_| connect_err("TLS handshake timed out".into()))?
                    .map_err(|e| self.tls_err(e))?;
                let mut stream = tls;
                self.handshake(&mut stream).await?;
                let (rd, wr) = tokio::io::split(stream);
                (Box::new(rd), Box::new(wr))
            }
            None => {
                self.handshake(&mut stream).await?;
                let (rd, wr) = stream.into_split();
                (Box::new(rd), Box::new(wr))
            }
        };
        let shared = Arc::new(Shared {
            session: Arc::new(SessionState {
                addr: self.addr.clone(),
                alive: AtomicBool::new(true),
                fresh_until_ms: AtomicU64::new(0),
            }),
            pending: Mutex::new(HashMap::new()),
            writer: tokio::sync::Mutex::new(Sender { w: BufWriter::with_capacity(64 * 1024, wr), in_frame: false }),
            socket,
            handler: self.handler.lock().expect("callback handler").clone(),
            acks_pending: AtomicUsize::new(0),
        });
        tokio::spawn(reader(rd, shared.clone(), self.opts.limits));
        Ok(Conn { shared, slots: Semaphore::new(self.opts.max_in_flight) })
    }
}

/// Carries out a callback from the server, then acks it (from a task of its own, so
/// the reader goes on reading while the ack waits for what the handler left to
/// finish, and for the socket).
fn handle_callback(shared: &Arc<Shared>, frame: Frame) -> Result<(), String> {
    let cb: Callback = proto::msg::decode(&frame.msg).map_err(|e| format!("malformed callback: {e}"))?;
    if shared.acks_pending.fetch_add(1, Ordering::AcqRel) >= ACKS_PENDING_MAX {
        return Err(format!("more than {ACKS_PENDING_MAX} callbacks waiting for their acks"));
    }
    let after = shared.handler.as_ref().and_then(|h| h.callback(&cb));
    let shared = shared.clone();
    tokio::spawn(async move {
        if let Some(after) = after {
            after.await;
        }
        let sent = shared.writer.lock().await.send(FrameKind::CallbackAck, frame.request_id, &[], &[]).await;
        shared.acks_pending.fetch_sub(1, Ordering::AcqRel);
        if let Err(e) = sent {
            shared.fail_all(&format!("callback ack failed: {e}"));
        }
    });
    Ok(())
}

/// Reads the connection's frames until it ends, then tells the callback handler.
async fn reader(rd: ReadHalf, shared: Arc<Shared>, limits: FrameLimits) {
    read_frames(rd, &shared, limits).await;
    if let Some(h) = &shared.handler {
        h.disconnected(&shared.session.addr);
    }
}

async fn read_frames(rd: ReadHalf, shared: &Arc<Shared>, limits: FrameLimits) {
    let mut r = BufReader::with_capacity(proto::frame::READ_BUFFER_BYTES, rd);
    loop {
        match read_frame(&mut r, &limits).await {
            Ok(Some(f)) if f.kind == FrameKind::Callback => {
                if let Err(why) = handle_callback(shared, f) {
                    shared.fail_all(&why);
                    return;
                }
            }
            Ok(Some(f)) if f.kind != FrameKind::Response => {
                shared.fail_all(&format!("unexpected {:?} frame from the server", f.kind));
                return;
            }
            Ok(Some(f)) => {
                let waiter = shared.pending.lock().expect("pending lock").remove(&f.request_id);
                match waiter {
                    Some(w) => {
                        let _ = w.send(Ok(f));
                    }
                    None => {
                        tracing::debug!(addr = %shared.session.addr, id = f.request_id, "response for no waiter")
                    }
                }
            }
            Ok(None) => {
                shared.fail_all("closed by the server");
                return;
            }
            Err(e) => {
                shared.fail_all(&format!("bad frame from server: {e}"));
                return;
            }
        }
        if !shared.alive() {
            shared.fail_all("connection dropped");
            return;
        }
    }
}
