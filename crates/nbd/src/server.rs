//! The NBD server: the fixed newstyle handshake, then requests pipelined and answered
//! out of order, at most [`MAX_IN_FLIGHT`] at once per connection, for at most
//! [`Limits::connections_max`] connections at once to the same exports.
//!
//! Why the two server-wide bounds ([`Limits`]): the export has no authentication, and
//! without them every client that connects may hold 64 requests of up to 32 MiB each
//! (2 GiB) in the server's memory, and any number of clients may connect. So:
//! - a connection past `connections_max` is refused during its handshake: each option
//!   it sends gets `NBD_REP_ERR_POLICY` saying why (clients show the message), and the
//!   server logs a line saying why; the connections already served go on;
//! - the bytes of request data held at once, writes' payloads from before they are
//!   read off the socket and reads' data, until each reply is written, stay within
//!   `inflight_bytes_max` for all connections together. A request that would pass it
//!   waits, and its connection is read no further meanwhile (backpressure, as the
//!   per-connection slots do): nothing fails for it. A request larger than the whole
//!   budget counts as the whole budget, and so goes alone, when nothing else is held.
//!
//! The budget bounds memory, not fairness: a client that stops reading its replies, or
//! stops in the middle of a write's payload, keeps its share until it goes away. An
//! export reachable by hosts that are not trusted needs TLS with client certificates
//! ([`Tls`], required).

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::proto::*;
use crate::sendfile::FileRange;

/// TLS the server offers with `NBD_OPT_STARTTLS` (x509: its certificate, and clients'
/// certificates checked against its CA), and whether it requires it: then a client
/// that does not start TLS gets `NBD_REP_ERR_TLS_REQD` to every option but
/// `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT`, and never learns an export's name or size.
#[derive(Clone)]
pub struct Tls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub required: bool,
}

/// Requests one connection may have in flight; past it the server reads no more.
pub const MAX_IN_FLIGHT: usize = 64;
/// Largest read or write payload (proto.md's interoperable maximum).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Largest option data a client may send.
const MAX_OPTION_BYTES: u32 = 64 << 10;

/// What one server holds at most, for all its connections (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; one more is refused in its handshake.
    pub connections_max: usize,
    /// Bytes of request data (writes' payloads, reads' data) held at once; past it a
    /// connection's next request waits.
    pub inflight_bytes_max: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { connections_max: CONNECTIONS_MAX_DEFAULT, inflight_bytes_max: INFLIGHT_BYTES_MAX_DEFAULT }
    }
}

/// Connections served at once by default: a handful of VMs or tools, each with a few
/// (`nbdcopy` opens four).
pub const CONNECTIONS_MAX_DEFAULT: usize = 16;
/// Bytes of request data held at once by default: eight 32 MiB requests, or 64 of
/// 4 MiB (`nbdcopy`'s four connections of 64 requests of 256 KiB each, four times).
pub const INFLIGHT_BYTES_MAX_DEFAULT: usize = 256 << 20;
/// Refused connections answered at once; past it one is closed without a word.
const REFUSALS_MAX: usize = 16;
/// How long, and for how many options, a refused connection is answered.
const REFUSAL_TIME: std::time::Duration = std::time::Duration::from_secs(10);
const REFUSAL_OPTIONS_MAX: usize = 16;

/// What a read brought back.
pub enum ReadData {
    /// The bytes, in memory.
    Bytes(Bytes),
    /// Ranges of local files making up the bytes, in order: sent from the kernel's
    /// page cache without passing through this process (see [`crate::sendfile`]).
    Files(Vec<FileRange>),
}

/// What an export is backed by. Every method may be called from several connections
/// at once.
pub trait Backend: Send + Sync + 'static {
    /// Bytes of the device.
    fn size(&self) -> u64;
    /// `len` bytes at `offset` (all of them: the range is within the device).
    fn read(&self, offset: u64, len: u32) -> impl Future<Output = io::Result<ReadData>> + Send;
    /// Writes; with `fua`, durable before it returns.
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> impl Future<Output = io::Result<()>> + Send;
    /// Makes every write that returned before it durable.
    fn flush(&self) -> impl Future<Output = io::Result<()>> + Send;
    /// Deallocates a range (it reads back as zeros).
    fn trim(&self, offset: u64, len: u32) -> impl Future<Output = io::Result<()>> + Send;
    /// Zeroes a range; `may_trim` lets it deallocate.
    fn zero(&self, offset: u64, len: u32, may_trim: bool, fua: bool) -> impl Future<Output = io::Result<()>> + Send;
}

/// One export.
pub struct Export<B> {
    pub backend: Arc<B>,
    pub read_only: bool,
    pub description: String,
    /// Every write is durable before its reply (as FUA on each).
    pub sync: bool,
}

impl<B: Backend> Export<B> {
    fn flags(&self) -> u16 {
        let mut f = TX_HAS_FLAGS | TX_SEND_FLUSH | TX_SEND_FUA | TX_SEND_DF | TX_CAN_MULTI_CONN;
        if self.read_only {
            f |= TX_READ_ONLY;
        } else {
            f |= TX_SEND_TRIM | TX_SEND_WRITE_ZEROES;
        }
        f
    }
}

/// The exports of a server, by name; the first is also the default (empty name).
pub struct Exports<B> {
    pub list: BTreeMap<String, Arc<Export<B>>>,
    pub default: Option<String>,
    /// How long a connection with nothing in flight keeps its thread awake after a
    /// reply, for the client's next request (see [`await_briefly`]); zero: not at all.
    pub poll_after_reply: std::time::Duration,
}

impl<B> Exports<B> {
    fn find(&self, name: &str) -> Option<(&str, &Arc<Export<B>>)> {
        let name = if name.is_empty() { self.default.as_deref()? } else { name };
        self.list.get_key_value(name).map(|(k, v)| (k.as_str(), v))
    }
}

/// Serves `exports` on `listener` within `limits` until the task is dropped.
pub async fn serve<B: Backend>(listener: TcpListener, exports: Arc<Exports<B>>, limits: Limits, tls: Option<Tls>) {
    assert!(limits.connections_max > 0 && limits.inflight_bytes_max > 0, "{limits:?}");
    let payloads = Arc::new(PayloadPool::default());
    let connections = Arc::new(Semaphore::new(limits.connections_max));
    let refusals = Arc::new(Semaphore::new(REFUSALS_MAX));
    let budget = Arc::new(Budget::new(limits.inflight_bytes_max));
    loop {
        match listener.accept().await {
            Ok((sock, peer)) => {
                let _ = sock.set_nodelay(true);
                let Ok(connection_permit) = connections.clone().try_acquire_owned() else {
                    let n = limits.connections_max;
                    tracing::warn!("NBD: refusing connection from {peer}: {n} connections already (--max-connections)");
                    // Past the refusals answered at once, dropped: closed at once.
                    if let Ok(refusal) = refusals.clone().try_acquire_owned() {
                        let why = format!("the server has {n} connections already (its --max-connections)");
                        tokio::spawn(async move {
                            let _refusal = refusal;
                            let _ = tokio::time::timeout(REFUSAL_TIME, refuse(sock, &why)).await;
                        });
                    }
                    continue;
                };
                let (exports, payloads, budget, tls) = (exports.clone(), payloads.clone(), budget.clone(), tls.clone());
                tokio::spawn(async move {
                    let _connection_permit = connection_permit;
                    if let Err(e) = connection(sock, exports, payloads, budget, tls).await {
                        tracing::debug!(%peer, "NBD connection ended: {e}");
                    }
                });
            }
            Err(e) => {
                tracing::warn!("NBD accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// The server's bytes of request data held at once (see the module comment).
struct Budget {
    bytes: Arc<Semaphore>,
    bytes_max: usize,
}

impl Budget {
    fn new(bytes_max: usize) -> Budget {
        let bytes_max = bytes_max.min(Semaphore::MAX_PERMITS);
        Budget { bytes: Arc::new(Semaphore::new(bytes_max)), bytes_max }
    }

    /// A share for `len` bytes, once the budget has it: at most the whole budget, so
    /// that a request larger than it still goes (alone).
    async fn reserve(&self, len: u32) -> Option<OwnedSemaphorePermit> {
        let n = (len as usize).min(self.bytes_max) as u32;
        if n == 0 {
            return None;
        }
        if let Ok(share) = self.bytes.clone().try_acquire_many_owned(n) {
            return Some(share);
        }
        tracing::debug!("NBD: a request of {len} bytes waits for the byte budget ({} bytes)", self.bytes_max);
        Some(self.bytes.clone().acquire_many_owned(n).await.expect("never closed"))
    }
}

/// The server's greeting: fixed newstyle, no zeroes.
async fn greet<S: AsyncWrite + Unpin>(sock: &mut S) -> io::Result<()> {
    let mut hello = [0u8; 18];
    hello[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    hello[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    hello[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    sock.write_all(&hello).await
}

/// Refuses a connection the way the protocol allows: the greeting, then
/// `NBD_REP_ERR_POLICY` with `why` to each option, which clients show their user
/// (`NBD_OPT_EXPORT_NAME` has no error reply: it is closed), for a few options.
async fn refuse(mut sock: TcpStream, why: &str) -> io::Result<()> {
    greet(&mut sock).await?;
    let _client_flags = sock.read_u32().await?;
    for _ in 0..REFUSAL_OPTIONS_MAX {
        if sock.read_u64().await? != IHAVEOPT {
            return Ok(());
        }
        let option = sock.read_u32().await?;
        let len = sock.read_u32().await?;
        if len > MAX_OPTION_BYTES {
            return Ok(());
        }
        let mut data = vec![0u8; len as usize];
        sock.read_exact(&mut data).await?;
        match option {
            OPT_EXPORT_NAME => return Ok(()),
            OPT_ABORT => return send_option_reply(&mut sock, option, REP_ACK, &[]).await,
            _ => send_error(&mut sock, option, REP_ERR_POLICY, why).await?,
        }
    }
    Ok(())
}

fn protocol(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// What the handshake agreed on.
struct Session<B> {
    export: Arc<Export<B>>,
    structured: bool,
    /// The id of `base:allocation`, if the client set it.
    allocation: Option<u32>,
}

/// How far a connection's TLS has come in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TlsState {
    /// Not offered by this server.
    Off,
    /// Offered (and perhaps required), not started.
    Offered { required: bool },
    /// Started: the options go over it.
    On,
}

/// What the option haggling ended in.
enum Agreed<B> {
    Go(Session<B>),
    /// `NBD_OPT_STARTTLS` acked: TLS begins on the socket, and the haggling again.
    StartTls,
    /// The client went away or aborted.
    Gone,
}

async fn connection<B: Backend>(
    mut sock: TcpStream,
    exports: Arc<Exports<B>>,
    payloads: Arc<PayloadPool>,
    budget: Arc<Budget>,
    tls: Option<Tls>,
) -> io::Result<()> {
    greet(&mut sock).await?;
    let client_flags = sock.read_u32().await?;
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(protocol(format!("unknown client flags {client_flags:#x}")));
    }
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
    let state = match &tls {
        Some(t) => TlsState::Offered { required: t.required },
        None => TlsState::Off,
    };
    let poll = exports.poll_after_reply;
    match handshake(&mut sock, &exports, no_zeroes, state).await? {
        Agreed::Go(session) => transmission(sock, session, poll, payloads, budget).await,
        Agreed::Gone => Ok(()),
        Agreed::StartTls => {
            let acceptor = tls.expect("STARTTLS is acked only when offered").acceptor;
            // Read through a buffer: rustls reads 4 KiB at a time (see braid's `rpc::tls`).
            let wire = tokio::io::BufReader::with_capacity(TLS_READ_BYTES, sock);
            let mut secured = acceptor.accept(wire).await.map_err(|e| protocol(format!("TLS: {e}")))?;
            match handshake(&mut secured, &exports, no_zeroes, TlsState::On).await? {
                Agreed::Go(session) => transmission(secured, session, poll, payloads, budget).await,
                Agreed::Gone | Agreed::StartTls => Ok(()),
            }
        }
    }
}

async fn send_option_reply<S: AsyncWrite + Unpin>(sock: &mut S, option: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    sock.write_all(&option_reply(option, kind, data.len() as u32)).await?;
    sock.write_all(data).await
}

async fn send_error<S: AsyncWrite + Unpin>(sock: &mut S, option: u32, kind: u32, message: &str) -> io::Result<()> {
    send_option_reply(sock, option, kind, message.as_bytes()).await?;
    sock.flush().await
}

/// The option haggling of the handshake, after the greeting (again after
/// `NBD_OPT_STARTTLS`, over TLS, with what was agreed before forgotten).
async fn handshake<B: Backend, S: AsyncRead + AsyncWrite + Unpin>(
    sock: &mut S,
    exports: &Exports<B>,
    no_zeroes: bool,
    tls: TlsState,
) -> io::Result<Agreed<B>> {
    let mut structured = false;
    let mut allocation = None;
    loop {
        // What was answered goes out before the next option is waited for (over TLS
        // it may sit in the session's buffer until then).
        sock.flush().await?;
        let magic = sock.read_u64().await?;
        if magic != IHAVEOPT {
            return Err(protocol(format!("bad option magic {magic:#x}")));
        }
        let option = sock.read_u32().await?;
        let len = sock.read_u32().await?;
        if len > MAX_OPTION_BYTES {
            // Its data cannot be skipped at any cost: say why and hang up.
            let _ = send_error(sock, option, REP_ERR_TOO_BIG, "option data too large").await;
            return Err(protocol(format!("option {option} of {len} bytes")));
        }
        let mut data = vec![0u8; len as usize];
        sock.read_exact(&mut data).await?;
        if tls == (TlsState::Offered { required: true }) && !matches!(option, OPT_STARTTLS | OPT_ABORT) {
            if option == OPT_EXPORT_NAME {
                // No error reply exists for it: closed, having named nothing.
                return Err(protocol("a client asked for an export without TLS, which this server requires".into()));
            }
            send_error(sock, option, REP_ERR_TLS_REQD, "this server requires TLS (NBD_OPT_STARTTLS) first").await?;
            continue;
        }
        match option {
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&data).into_owned();
                // This option has no error reply: an unknown name closes the connection.
                let Some((_, export)) = exports.find(&name) else {
                    return Err(protocol(format!("no export named '{name}'")));
                };
                let mut reply = Vec::with_capacity(134);
                reply.extend_from_slice(&export.backend.size().to_be_bytes());
                reply.extend_from_slice(&export.flags().to_be_bytes());
                if !no_zeroes {
                    reply.extend_from_slice(&[0u8; 124]);
                }
                sock.write_all(&reply).await?;
                sock.flush().await?;
                return Ok(Agreed::Go(Session { export: export.clone(), structured: false, allocation: None }));
            }
            OPT_ABORT => {
                let _ = send_option_reply(sock, option, REP_ACK, &[]).await;
                let _ = sock.flush().await;
                return Ok(Agreed::Gone);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    send_error(sock, option, REP_ERR_INVALID, "LIST takes no data").await?;
                    continue;
                }
                for name in exports.list.keys() {
                    let mut d = Vec::with_capacity(4 + name.len());
                    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
                    d.extend_from_slice(name.as_bytes());
                    send_option_reply(sock, option, REP_SERVER, &d).await?;
                }
                send_option_reply(sock, option, REP_ACK, &[]).await?;
            }
            OPT_STARTTLS => match tls {
                TlsState::Off => send_error(sock, option, REP_ERR_POLICY, "this server does not offer TLS").await?,
                TlsState::On => send_error(sock, option, REP_ERR_INVALID, "TLS is on already").await?,
                TlsState::Offered { .. } if !data.is_empty() => {
                    send_error(sock, option, REP_ERR_INVALID, "STARTTLS takes no data").await?
                }
                TlsState::Offered { .. } => {
                    send_option_reply(sock, option, REP_ACK, &[]).await?;
                    sock.flush().await?;
                    return Ok(Agreed::StartTls);
                }
            },
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    send_error(sock, option, REP_ERR_INVALID, "STRUCTURED_REPLY takes no data").await?;
                    continue;
                }
                structured = true;
                send_option_reply(sock, option, REP_ACK, &[]).await?;
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                let req = match MetaRequest::decode(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        send_error(sock, option, REP_ERR_INVALID, &e.to_string()).await?;
                        continue;
                    }
                };
                if option == OPT_SET_META_CONTEXT && !structured {
                    send_error(sock, option, REP_ERR_INVALID, "structured replies first").await?;
                    continue;
                }
                if exports.find(&req.name).is_none() {
                    send_error(sock, option, REP_ERR_UNKNOWN, "no such export").await?;
                    continue;
                }
                let listing = option == OPT_LIST_META_CONTEXT;
                let wanted =
                    req.queries.iter().any(|q| q == BASE_ALLOCATION || (listing && (q == "base:" || q.is_empty())))
                        || (listing && req.queries.is_empty());
                if option == OPT_SET_META_CONTEXT {
                    allocation = None;
                }
                if wanted {
                    let mut d = Vec::new();
                    d.extend_from_slice(&1u32.to_be_bytes());
                    d.extend_from_slice(BASE_ALLOCATION.as_bytes());
                    send_option_reply(sock, option, REP_META_CONTEXT, &d).await?;
                    if option == OPT_SET_META_CONTEXT {
                        allocation = Some(1);
                    }
                }
                send_option_reply(sock, option, REP_ACK, &[]).await?;
            }
            OPT_INFO | OPT_GO => {
                let req = match InfoRequest::decode(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        send_error(sock, option, REP_ERR_INVALID, &e.to_string()).await?;
                        continue;
                    }
                };
                let Some((name, export)) = exports.find(&req.name) else {
                    send_error(sock, option, REP_ERR_UNKNOWN, &format!("no export named '{}'", req.name)).await?;
                    continue;
                };
                send_option_reply(sock, option, REP_INFO, &info_export(export.backend.size(), export.flags())).await?;
                // Always: any offset and length work, 4 KiB is best, 32 MiB at most.
                send_option_reply(sock, option, REP_INFO, &info_block_size(1, 4096, MAX_PAYLOAD)).await?;
                if req.requests.contains(&INFO_NAME) {
                    send_option_reply(sock, option, REP_INFO, &info_text(INFO_NAME, name)).await?;
                }
                if req.requests.contains(&INFO_DESCRIPTION) {
                    send_option_reply(sock, option, REP_INFO, &info_text(INFO_DESCRIPTION, &export.description))
                        .await?;
                }
                send_option_reply(sock, option, REP_ACK, &[]).await?;
                sock.flush().await?;
                if option == OPT_GO {
                    return Ok(Agreed::Go(Session { export: export.clone(), structured, allocation }));
                }
            }
            other => send_error(sock, other, REP_ERR_UNSUP, "unknown option").await?,
        }
    }
}

/// A reply ready to go out: header bytes, then data.
struct Out(Vec<u8>, Data);

/// A reply's data.
enum Data {
    None,
    Bytes(Bytes),
    Files(Vec<FileRange>),
}

fn error_of(e: &io::Error) -> u32 {
    match e.raw_os_error() {
        Some(libc::EPERM) => EPERM,
        Some(libc::ENOSPC) => ENOSPC,
        Some(libc::EINVAL) => EINVAL,
        Some(libc::ENOMEM) => ENOMEM,
        _ => EIO,
    }
}

/// The reply to a request that failed with `error`.
fn failure(structured: bool, cookie: u64, error: u32, message: &str) -> Out {
    if !structured {
        return Out(simple_reply(error, cookie).to_vec(), Data::None);
    }
    let msg = &message.as_bytes()[..message.len().min(1024)];
    let mut v = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie, 6 + msg.len() as u32).to_vec();
    v.extend_from_slice(&error.to_be_bytes());
    v.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    v.extend_from_slice(msg);
    Out(v, Data::None)
}

fn done(structured: bool, cookie: u64) -> Out {
    if structured {
        Out(chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, 0).to_vec(), Data::None)
    } else {
        Out(simple_reply(0, cookie).to_vec(), Data::None)
    }
}

/// The connection a transmission runs on: plain TCP, or TLS over it.
trait Wire: Send + 'static {
    type Reader: AsyncRead + Unpin + Send + 'static;
    type Writer: ReplyWriter;
    /// Its halves, and its socket's descriptor (open as long as the writer is).
    fn split(self) -> (Self::Reader, Self::Writer, std::os::fd::RawFd);
}

impl Wire for TcpStream {
    type Reader = tokio::net::tcp::OwnedReadHalf;
    type Writer = tokio::net::tcp::OwnedWriteHalf;
    fn split(self) -> (Self::Reader, Self::Writer, std::os::fd::RawFd) {
        use std::os::fd::AsRawFd;
        let fd = self.as_raw_fd();
        let (rd, wr) = self.into_split();
        (rd, wr, fd)
    }
}

type TlsStream = tokio_rustls::server::TlsStream<tokio::io::BufReader<TcpStream>>;

/// Bytes read from a TLS connection's socket at a time.
const TLS_READ_BYTES: usize = 256 << 10;

impl Wire for TlsStream {
    type Reader = tokio::io::ReadHalf<TlsStream>;
    type Writer = tokio::io::WriteHalf<TlsStream>;
    fn split(self) -> (Self::Reader, Self::Writer, std::os::fd::RawFd) {
        use std::os::fd::AsRawFd;
        let fd = self.get_ref().0.get_ref().as_raw_fd();
        let (rd, wr) = tokio::io::split(self);
        (rd, wr, fd)
    }
}

/// Where replies are written: file data goes out with `sendfile` on plain TCP, and
/// is read and encrypted over TLS.
trait ReplyWriter: AsyncWrite + Unpin + Send + 'static {
    fn send_files(&mut self, ranges: Vec<FileRange>) -> impl Future<Output = io::Result<()>> + Send;
}

impl ReplyWriter for tokio::net::tcp::OwnedWriteHalf {
    async fn send_files(&mut self, ranges: Vec<FileRange>) -> io::Result<()> {
        crate::sendfile::send(self.as_ref(), ranges).await
    }
}

impl ReplyWriter for tokio::io::WriteHalf<TlsStream> {
    async fn send_files(&mut self, ranges: Vec<FileRange>) -> io::Result<()> {
        let data = tokio::task::spawn_blocking(move || crate::sendfile::read(&ranges))
            .await
            .map_err(|e| io::Error::other(format!("reading file ranges: {e}")))??;
        self.write_all(&data).await
    }
}

async fn transmission<B: Backend, C: Wire>(
    conn: C,
    s: Session<B>,
    poll: std::time::Duration,
    payloads: Arc<PayloadPool>,
    budget: Arc<Budget>,
) -> io::Result<()> {
    let (rd, wr, fd) = conn.split();
    // Buffered: the headers of requests pipelined together come in with one read.
    let mut rd = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, rd);
    let out = Arc::new(Outbox::new(wr, fd));
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let s = Arc::new(s);
    let result = loop {
        let mut head = [0u8; REQUEST_BYTES];
        match rd.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break Ok(()),
            Err(e) => break Err(e),
        }
        let req = match Request::decode(&head) {
            Ok(r) => r,
            Err(e) => break Err(protocol(e.to_string())),
        };
        if req.kind == CMD_DISC {
            break Ok(());
        }
        if req.kind == CMD_WRITE && req.length > MAX_PAYLOAD {
            // Its payload cannot be skipped safely: answer and hang up.
            let reply = failure(s.structured, req.cookie, EOVERFLOW, "write larger than 32 MiB");
            let _ = out.send(reply, Held::default(), false).await;
            break Err(protocol(format!("write of {} bytes", req.length)));
        }
        // A slot, then the request's share of the server's bytes: until both are free
        // this connection is read no further (a write's payload stays in the socket).
        let slot = slots.clone().acquire_owned().await.expect("never closed");
        let carries_data = matches!(req.kind, CMD_WRITE | CMD_READ) && req.length <= MAX_PAYLOAD;
        let bytes = if carries_data { budget.reserve(req.length).await } else { None };
        // A write's payload comes with it, whatever becomes of the write.
        let mut payload = None;
        if req.kind == CMD_WRITE {
            match read_payload(&mut rd, req.length as usize, &payloads).await {
                Ok(data) => payload = Some(data),
                Err(e) => break Err(e),
            }
        }
        let held = Held { slot: Some(slot), bytes };
        let (s, out, in_flight) = (s.clone(), out.clone(), slots.clone());
        tokio::spawn(async move {
            let reply = execute(&s, req, payload).await;
            // Others in flight may finish together with this one (see `Outbox::send`).
            let others = MAX_IN_FLIGHT - in_flight.available_permits() > 1;
            // A client gone away: its reply has nowhere to go. The slot and the bytes
            // go back once the reply is written, by whichever task writes it.
            let _ = out.send(reply, held, others).await;
            // The last reply out: the client is turning it around (one request in
            // flight at a time, as a VM's or a database's synchronous I/O).
            if in_flight.available_permits() == MAX_IN_FLIGHT {
                await_briefly(out.fd, poll).await;
            }
        });
    };
    // Answer what is in flight before closing (a client that disconnects cleanly
    // waits for its replies first). A slot comes back once its reply is written.
    let _ = slots.acquire_many(MAX_IN_FLIGHT as u32).await;
    let _ = out.wr.lock().await.shutdown().await;
    result
}

/// A write's payload of `len` bytes, read into memory that is not zeroed first (the
/// zeroing of a `vec!` was a tenth of the export's CPU on a sequential copy in); a long
/// one into a buffer of `pool`'s, which it goes back to once the write is done with it.
async fn read_payload<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut R,
    len: usize,
    pool: &Arc<PayloadPool>,
) -> io::Result<Bytes> {
    let mut buf = if (POOLED_MIN..=POOLED_MAX).contains(&len) { pool.take(len) } else { Vec::with_capacity(len) };
    // At most `len` bytes: what follows is the next request's header.
    let mut limited = rd.take(len as u64);
    while buf.len() < len {
        if limited.read_buf(&mut buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    if buf.capacity() < POOLED_MIN {
        return Ok(Bytes::from(buf));
    }
    Ok(Bytes::from_owner(Pooled { buf, pool: pool.clone() }))
}

/// Payloads at least this long are read into buffers kept for reuse.
const POOLED_MIN: usize = 64 << 10;
/// Longer ones are allocated for themselves.
const POOLED_MAX: usize = 4 << 20;
/// Bytes of idle buffers the server keeps, for all its connections: a client opens
/// several at once (`nbdcopy` four, each with 64 requests in flight) and often anew,
/// and a pool of a connection's own would start with fresh memory each time.
const POOL_BYTES_MAX: usize = 64 << 20;

/// The server's idle payload buffers. Why: a long write's payload in fresh memory
/// cost a page fault and the zeroing of each of its pages (the allocator gives freed
/// memory back to the system at once, and on this project's VMs memory handed back is
/// slow to get again: a sixth of the export's CPU on a sequential copy in); a buffer
/// reused is memory already there. Bounded by [`POOL_BYTES_MAX`]; one more is freed.
#[derive(Default)]
struct PayloadPool {
    free: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl PayloadPool {
    /// An empty buffer of at least `len` bytes' capacity.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock().expect("payload pool");
        match free.iter().position(|b| b.capacity() >= len) {
            Some(i) => free.swap_remove(i),
            None => Vec::with_capacity(len),
        }
    }

    fn give_back(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut free = self.free.lock().expect("payload pool");
        if free.iter().map(Vec::capacity).sum::<usize>() + buf.capacity() <= POOL_BYTES_MAX {
            free.push(buf);
        }
    }
}

/// A payload in a pooled buffer, given back when the last `Bytes` of it goes.
struct Pooled {
    buf: Vec<u8>,
    pool: Arc<PayloadPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

/// Waits for the client's next request on socket `fd` without letting the thread
/// sleep, for at most `spin`: yields to the other tasks of the runtime (which then
/// polls its sockets without blocking) until bytes arrive or the time is up.
///
/// Why: a thread that sleeps in `epoll_wait` between requests is woken for the next
/// one, and on a virtual machine waking an idle vCPU costs tens of microseconds (an
/// interrupt to the host, which reschedules the vCPU): on this project's 2-vCPU test
/// machine a 4 KiB read from memory took 85 µs of which the wake-up was most, against
/// 40 µs with the thread kept awake (nbdkit, whose worker threads hand the socket to
/// each other, 35 µs). Kernel busy-polling does the same for network devices, but not
/// for loopback or every NIC. Bounded, and only while nothing else of the connection
/// is in flight (the thread then has nothing to wait for but the client).
async fn await_briefly(fd: std::os::fd::RawFd, spin: std::time::Duration) {
    if spin.is_zero() {
        return;
    }
    let until = std::time::Instant::now() + spin;
    let mut byte = 0u8;
    loop {
        // SAFETY: a one-byte peek into a local; the descriptor is the live socket's.
        let n = unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        if n != -1 || std::io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock {
            return;
        }
        if std::time::Instant::now() >= until {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// Bytes read from a connection at a time: many pipelined request headers, while a
/// write's payload larger than this goes straight into its own buffer.
const READ_BUFFER_BYTES: usize = 32 << 10;
/// Most replies written with one system call (below the kernel's `IOV_MAX` of 1,024
/// slices, two per reply).
const REPLIES_PER_WRITE: usize = 256;

/// The replies of one connection on their way out. Each request's task writes its own
/// reply (a writer task of its own was one more thread wake-up per request), but
/// replies that are ready together go out together: the task that finds nobody
/// writing becomes the writer, first lets the other tasks that are ready run (they
/// only queue their replies), then writes everything queued with one `writev` until
/// the queue is empty. With many requests in flight this is one system call, and one
/// wake-up of the client, for many replies instead of one each. A queued reply keeps
/// its request's slot (and its bytes) until it is written, so the queue is bounded by
/// the slots.
struct Outbox<W> {
    queue: std::sync::Mutex<Queued>,
    wr: tokio::sync::Mutex<W>,
    /// The connection's socket, open as long as `wr` is.
    fd: std::os::fd::RawFd,
}

/// What a request holds until its reply is written: given back when dropped.
#[derive(Default)]
#[expect(dead_code, reason = "held only to be dropped with the reply")]
struct Held {
    /// Its slot among the connection's [`MAX_IN_FLIGHT`].
    slot: Option<OwnedSemaphorePermit>,
    /// Its share of the server's bytes of request data ([`Budget`]).
    bytes: Option<OwnedSemaphorePermit>,
}

#[derive(Default)]
struct Queued {
    /// Each with what its request holds: a reply queued but not written still counts
    /// as in flight, so a client that stops reading its replies stops being read.
    replies: Vec<(Out, Held)>,
    /// A task is writing the queue out (and will write what is added meanwhile).
    writing: bool,
}

impl<W: ReplyWriter> Outbox<W> {
    fn new(wr: W, fd: std::os::fd::RawFd) -> Outbox<W> {
        Outbox { queue: std::sync::Mutex::new(Queued::default()), wr: tokio::sync::Mutex::new(wr), fd }
    }

    /// Queues one reply (kept whole: replies never interleave), and writes the queue
    /// out unless another task already is. `others`: other requests are in flight,
    /// whose replies may be ready to join this write (alone, nobody can, and the
    /// reply goes out at once). An error means the connection is broken; replies then
    /// queued are dropped with it.
    async fn send(&self, reply: Out, held: Held, others: bool) -> io::Result<()> {
        {
            let mut q = self.queue.lock().expect("outbox");
            q.replies.push((reply, held));
            if q.writing {
                return Ok(());
            }
            q.writing = true;
        }
        if others {
            tokio::task::yield_now().await;
        }
        let mut w = self.wr.lock().await;
        loop {
            let mut batch = {
                let mut q = self.queue.lock().expect("outbox");
                if q.replies.is_empty() {
                    q.writing = false;
                    return Ok(());
                }
                let n = q.replies.len().min(REPLIES_PER_WRITE);
                q.replies.drain(..n).collect::<Vec<_>>()
            };
            if let Err(e) = write_replies(&mut *w, &mut batch).await {
                let mut q = self.queue.lock().expect("outbox");
                q.replies.clear();
                q.writing = false;
                return Err(e);
            }
        }
    }
}

/// Writes `replies` whole and in order: heads and data in memory with one `writev`
/// up to each reply whose data is in files, that data with `sendfile`.
async fn write_replies<W: ReplyWriter, T>(w: &mut W, replies: &mut [(Out, T)]) -> io::Result<()> {
    let mut rest = replies;
    while !rest.is_empty() {
        let upto = rest.iter().position(|(Out(_, d), _)| matches!(d, Data::Files(_))).map_or(rest.len(), |i| i + 1);
        let (now, later) = rest.split_at_mut(upto);
        let mut slices = Vec::with_capacity(now.len() * 2);
        for (Out(head, data), _) in now.iter() {
            slices.push(io::IoSlice::new(head));
            if let Data::Bytes(d) = data {
                if !d.is_empty() {
                    slices.push(io::IoSlice::new(d));
                }
            }
        }
        let mut bufs = &mut slices[..];
        while !bufs.is_empty() {
            let n = w.write_vectored(bufs).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            io::IoSlice::advance_slices(&mut bufs, n);
        }
        if let Some((Out(_, data @ Data::Files(_)), _)) = now.last_mut() {
            let Data::Files(ranges) = std::mem::replace(data, Data::None) else { unreachable!() };
            w.send_files(ranges).await?;
        }
        rest = later;
    }
    // Over TLS, what the session holds goes out now (a no-op on plain TCP).
    w.flush().await
}

async fn execute<B: Backend>(s: &Session<B>, req: Request, payload: Option<Bytes>) -> Out {
    let e = &s.export;
    let size = e.backend.size();
    let end = req.offset.checked_add(req.length as u64);
    let within = end.is_some_and(|end| end <= size);
    let writes = matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && e.read_only {
        return failure(s.structured, req.cookie, EPERM, "the export is read-only");
    }
    let fua = req.flags & CMD_FLAG_FUA != 0 || e.sync;
    let r = match req.kind {
        CMD_READ => {
            if !within {
                return failure(s.structured, req.cookie, EINVAL, "read past the end of the export");
            }
            if req.length > MAX_PAYLOAD {
                return failure(s.structured, req.cookie, EOVERFLOW, "read larger than 32 MiB");
            }
            return match e.backend.read(req.offset, req.length).await {
                Ok(ReadData::Bytes(data)) => read_reply(s.structured, req, data),
                Ok(ReadData::Files(ranges)) if ranges.iter().map(|r| r.len).sum::<u64>() == req.length as u64 => {
                    files_reply(s.structured, req, ranges)
                }
                Ok(ReadData::Files(_)) => failure(s.structured, req.cookie, EIO, "the backend read the wrong length"),
                Err(err) => failure(s.structured, req.cookie, error_of(&err), &err.to_string()),
            };
        }
        CMD_WRITE if !within => return failure(s.structured, req.cookie, ENOSPC, "write past the end of the export"),
        CMD_WRITE => e.backend.write(req.offset, payload.unwrap_or_default(), fua).await,
        // Boxed, as the other rare commands: their futures are several times a read's
        // or a write's, and each request's task (allocated and moved per request)
        // would be as large as the largest.
        CMD_FLUSH => Box::pin(e.backend.flush()).await,
        CMD_TRIM | CMD_WRITE_ZEROES if !within => {
            return failure(s.structured, req.cookie, ENOSPC, "range past the end of the export")
        }
        CMD_TRIM => {
            let r = Box::pin(e.backend.trim(req.offset, req.length)).await;
            match r {
                Ok(()) if fua => Box::pin(e.backend.flush()).await,
                r => r,
            }
        }
        CMD_WRITE_ZEROES => {
            Box::pin(e.backend.zero(req.offset, req.length, req.flags & CMD_FLAG_NO_HOLE == 0, fua)).await
        }
        CMD_CACHE => Ok(()),
        CMD_BLOCK_STATUS => {
            let Some(id) = s.allocation.filter(|_| s.structured) else {
                return failure(s.structured, req.cookie, EINVAL, "no metadata context was set");
            };
            if !within || req.length == 0 {
                return failure(s.structured, req.cookie, EINVAL, "block status past the end of the export");
            }
            // Every byte is reported as data: braid does not tell which ranges of a
            // file its OSTs hold (reads of holes come back as zeros either way).
            let mut v = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, req.cookie, 12).to_vec();
            v.extend_from_slice(&id.to_be_bytes());
            v.extend_from_slice(&req.length.to_be_bytes());
            v.extend_from_slice(&0u32.to_be_bytes());
            return Out(v, Data::None);
        }
        _ => return failure(s.structured, req.cookie, EINVAL, "unknown command"),
    };
    match r {
        Ok(()) => done(s.structured, req.cookie),
        Err(err) => failure(s.structured, req.cookie, error_of(&err), &err.to_string()),
    }
}

/// The reply to a read: the data (simple), or one chunk, a hole if it is all zeros
/// and the client did not ask for data only (`DF` does not forbid holes; `NO_HOLE`
/// is for writes).
fn read_reply(structured: bool, req: Request, data: Bytes) -> Out {
    if !structured {
        return Out(simple_reply(0, req.cookie).to_vec(), Data::Bytes(data));
    }
    if !data.is_empty() && data.iter().all(|&b| b == 0) {
        let mut v = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_HOLE, req.cookie, 12).to_vec();
        v.extend_from_slice(&req.offset.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        return Out(v, Data::None);
    }
    let mut v = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, req.cookie, 8 + data.len() as u32).to_vec();
    v.extend_from_slice(&req.offset.to_be_bytes());
    Out(v, Data::Bytes(data))
}

/// The reply to a read whose data is in files (`req.length` bytes of them): one data
/// chunk (no look for zeros, which would mean reading the files here).
fn files_reply(structured: bool, req: Request, ranges: Vec<FileRange>) -> Out {
    if !structured {
        return Out(simple_reply(0, req.cookie).to_vec(), Data::Files(ranges));
    }
    let mut v = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, req.cookie, 8 + req.length).to_vec();
    v.extend_from_slice(&req.offset.to_be_bytes());
    Out(v, Data::Files(ranges))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload is read whole and nothing past it: the next request's header stays
    /// for the next read, through a buffer smaller or larger than the payload; a
    /// connection that ends inside one is an error.
    #[tokio::test]
    async fn a_payload_is_read_exactly_and_a_short_one_is_an_error() {
        let pool = Arc::new(PayloadPool::default());
        for capacity in [7, 4096, 1 << 20] {
            let stream: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
            let mut rd = tokio::io::BufReader::with_capacity(capacity, &stream[..]);
            let data = read_payload(&mut rd, 70_000, &pool).await.unwrap();
            assert_eq!(&data[..], &stream[..70_000], "buffer of {capacity}");
            let mut rest = Vec::new();
            rd.read_to_end(&mut rest).await.unwrap();
            assert_eq!(&rest[..], &stream[70_000..], "buffer of {capacity}: what follows is left");
            let mut short = tokio::io::BufReader::with_capacity(capacity, &stream[..10]);
            let e = read_payload(&mut short, 11, &pool).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        }
        assert!(read_payload(&mut &[][..], 0, &pool).await.unwrap().is_empty());
    }

    /// A long payload's buffer is reused once its bytes are dropped, never while they
    /// are held, and the idle buffers stay within their bound.
    #[tokio::test]
    async fn payload_buffers_are_reused_only_once_free() {
        let pool = Arc::new(PayloadPool::default());
        let a_bytes = vec![1u8; 1 << 20];
        let a = read_payload(&mut &a_bytes[..], 1 << 20, &pool).await.unwrap();
        let b_bytes = vec![2u8; 1 << 20];
        let b = read_payload(&mut &b_bytes[..], 1 << 20, &pool).await.unwrap();
        assert_ne!(a.as_ptr(), b.as_ptr(), "a held buffer is not handed out again");
        let (a_at, half) = (a.as_ptr(), a.slice(..1000));
        drop(a);
        assert!(pool.free.lock().unwrap().is_empty(), "a slice still holds it");
        drop(half);
        let c = read_payload(&mut &[3u8; 100_000][..], 100_000, &pool).await.unwrap();
        assert_eq!(c.as_ptr(), a_at, "the free buffer is reused");
        assert!(c.iter().all(|&x| x == 3) && b.iter().all(|&x| x == 2));
        let many: Vec<Bytes> = hold_many(&pool, 40).await;
        drop(many);
        let idle: usize = pool.free.lock().unwrap().iter().map(Vec::capacity).sum();
        assert!(idle <= POOL_BYTES_MAX, "{idle} bytes idle");
    }

    async fn hold_many(pool: &Arc<PayloadPool>, n: usize) -> Vec<Bytes> {
        let mut out = Vec::new();
        for i in 0..n {
            let data = vec![i as u8; 4 << 20];
            out.push(read_payload(&mut &data[..], 4 << 20, pool).await.unwrap());
        }
        out
    }

    /// Replies queued by many tasks at once, of many sizes, reach the client whole,
    /// none cut into by another, and each once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replies_queued_together_go_out_whole_and_each_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move { TcpStream::connect(addr).await.unwrap() });
        let (server, _) = listener.accept().await.unwrap();
        let mut client = client.await.unwrap();
        let (_rd, wr, fd) = Wire::split(server);
        let out = Arc::new(Outbox::new(wr, fd));
        const N: u32 = 600;
        // Reply `i`: an 8-byte head (`i` and the data's length), then `i % 251` repeated
        // over a length that crosses the socket buffer at times.
        let len = |i: u32| (i as usize * 997) % 70_000;
        let slots = Arc::new(Semaphore::new(N as usize));
        let mut tasks = Vec::new();
        for i in 0..N {
            let out = out.clone();
            let slot = slots.clone().acquire_owned().await.unwrap();
            tasks.push(tokio::spawn(async move {
                let mut head = i.to_be_bytes().to_vec();
                head.extend_from_slice(&(len(i) as u32).to_be_bytes());
                let data = match len(i) {
                    0 => Data::None,
                    n => Data::Bytes(Bytes::from(vec![(i % 251) as u8; n])),
                };
                out.send(Out(head, data), Held { slot: Some(slot), bytes: None }, i % 2 == 0).await.unwrap();
            }));
        }
        let reader = tokio::spawn(async move {
            let mut seen = vec![false; N as usize];
            for _ in 0..N {
                let mut head = [0u8; 8];
                client.read_exact(&mut head).await.unwrap();
                let i = u32::from_be_bytes(head[..4].try_into().unwrap());
                let n = u32::from_be_bytes(head[4..].try_into().unwrap()) as usize;
                assert!(i < N && !seen[i as usize], "reply {i} unknown or twice");
                assert_eq!(n, len(i), "reply {i}: its head is whole");
                let mut data = vec![0u8; n];
                client.read_exact(&mut data).await.unwrap();
                assert!(data.iter().all(|&b| b == (i % 251) as u8), "reply {i}: its data is its own");
                seen[i as usize] = true;
            }
            seen
        });
        for t in tasks {
            t.await.unwrap();
        }
        let seen = tokio::time::timeout(std::time::Duration::from_secs(30), reader).await.unwrap().unwrap();
        assert!(seen.iter().all(|&s| s));
        assert_eq!(slots.available_permits(), N as usize, "every written reply gave its slot back");
        assert!(!out.queue.lock().unwrap().writing, "nobody is left writing");
    }

    /// An export in memory that counts the bytes of the writes under way in it.
    struct Memory {
        data: std::sync::Mutex<Vec<u8>>,
        writing_bytes: std::sync::atomic::AtomicUsize,
        writing_bytes_peak: std::sync::atomic::AtomicUsize,
    }

    impl Backend for Memory {
        fn size(&self) -> u64 {
            self.data.lock().unwrap().len() as u64
        }
        async fn read(&self, offset: u64, len: u32) -> io::Result<ReadData> {
            let d = self.data.lock().unwrap();
            Ok(ReadData::Bytes(Bytes::copy_from_slice(&d[offset as usize..][..len as usize])))
        }
        async fn write(&self, offset: u64, data: Bytes, _fua: bool) -> io::Result<()> {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.writing_bytes.fetch_add(data.len(), SeqCst) + data.len();
            self.writing_bytes_peak.fetch_max(now, SeqCst);
            // Long enough for the other connections' writes to pile up behind it.
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            self.data.lock().unwrap()[offset as usize..][..data.len()].copy_from_slice(&data);
            self.writing_bytes.fetch_sub(data.len(), SeqCst);
            Ok(())
        }
        async fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        async fn trim(&self, _offset: u64, _len: u32) -> io::Result<()> {
            Ok(())
        }
        async fn zero(&self, _offset: u64, _len: u32, _may_trim: bool, _fua: bool) -> io::Result<()> {
            Ok(())
        }
    }

    /// A server of one export in memory of `size` bytes within `limits`; its URI.
    async fn memory_server(size: usize, limits: Limits) -> (Arc<Memory>, String, tokio::task::JoinHandle<()>) {
        let memory = Arc::new(Memory {
            data: std::sync::Mutex::new(vec![0; size]),
            writing_bytes: Default::default(),
            writing_bytes_peak: Default::default(),
        });
        let export = Export { backend: memory.clone(), read_only: false, description: String::new(), sync: false };
        let exports = Exports {
            list: BTreeMap::from([("m".to_string(), Arc::new(export))]),
            default: Some("m".into()),
            poll_after_reply: std::time::Duration::ZERO,
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("nbd://{}/m", listener.local_addr().unwrap());
        (memory, uri, tokio::spawn(serve(listener, Arc::new(exports), limits, None)))
    }

    /// Writes from several connections, many in flight on each and some larger than
    /// the whole budget, all succeed, and the bytes held never pass the budget.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_past_the_byte_budget_wait_for_it_and_all_succeed() {
        const BUDGET: usize = 3 << 20;
        let limits = Limits { connections_max: 8, inflight_bytes_max: BUDGET };
        // Four clients' sixteen 1 MiB writes fill the first 64 MiB, their 4 MiB
        // writes the 16 MiB after: no two writes overlap, so every byte has one writer.
        let (memory, uri, server) = memory_server(80 << 20, limits).await;
        let mut clients = Vec::new();
        for c in 0..4u64 {
            let uri = uri.clone();
            clients.push(tokio::task::spawn_blocking(move || {
                let mut client = crate::client::Client::connect(&uri).unwrap();
                // Sixteen writes in flight of 1 MiB, and one of 4 MiB, a quarter each.
                let mut cookies = Vec::new();
                for i in 0..16u64 {
                    let at = (c * 16 + i) << 20;
                    let data = vec![(c * 16 + i) as u8 + 1; 1 << 20];
                    cookies.push(client.submit(CMD_WRITE, 0, at, 1 << 20, &data).unwrap());
                }
                let big = vec![0xf0 + c as u8; 4 << 20];
                let at = (64 + c * 4) << 20;
                cookies.push(client.submit(CMD_WRITE, 0, at, 4 << 20, &big).unwrap());
                for _ in 0..cookies.len() {
                    let done = client.complete().unwrap();
                    assert_eq!(done.error, 0, "write {} failed", done.cookie);
                }
                client.disconnect().unwrap();
            }));
        }
        for c in clients {
            c.await.unwrap();
        }
        let peak = memory.writing_bytes_peak.load(std::sync::atomic::Ordering::SeqCst);
        assert!(peak > 1 << 20, "writes overlapped: {peak}");
        assert!(peak <= BUDGET.max(4 << 20), "{peak} bytes held by writes at once, over the budget of {BUDGET}");
        let data = memory.data.lock().unwrap();
        for (i, chunk) in data[..64 << 20].chunks(1 << 20).enumerate() {
            assert!(chunk.iter().all(|&b| b == i as u8 + 1), "MiB {i}");
        }
        for (c, chunk) in data[64 << 20..].chunks(4 << 20).enumerate() {
            assert!(chunk.iter().all(|&b| b == 0xf0 + c as u8), "large write {c}");
        }
        server.abort();
    }

    /// Past `connections_max`, a client is told why in its handshake and the others
    /// go on; once one leaves, a new one is served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_past_the_bound_is_refused_with_why_and_the_others_go_on() {
        let limits = Limits { connections_max: 2, ..Limits::default() };
        let (memory, uri, server) = memory_server(1 << 20, limits).await;
        let u = uri.clone();
        tokio::task::spawn_blocking(move || {
            let mut first = crate::client::Client::connect(&u).unwrap();
            let second = crate::client::Client::connect(&u).unwrap();
            let e = crate::client::Client::connect(&u).err().expect("a third connection is refused");
            let said = e.to_string();
            assert!(said.contains("0x80000002") && said.contains("2 connections already"), "{said}");
            first.submit(CMD_WRITE, 0, 0, 5, b"first").unwrap();
            assert_eq!(first.complete().unwrap().error, 0);
            second.disconnect().unwrap();
            // Its slot comes back once the server has seen it go.
            let start = std::time::Instant::now();
            let mut third = loop {
                match crate::client::Client::connect(&u) {
                    Ok(c) => break c,
                    Err(e) => assert!(start.elapsed().as_secs() < 10, "no connection after one left: {e}"),
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            };
            third.submit(CMD_WRITE, 0, 5, 5, b"third").unwrap();
            assert_eq!(third.complete().unwrap().error, 0);
        })
        .await
        .unwrap();
        assert_eq!(&memory.data.lock().unwrap()[..10], b"firstthird");
        server.abort();
    }
}
