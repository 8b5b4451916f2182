//! Short-circuit local I/O, the client's end (see `rpc::short_circuit` for what it is
//! and why): for each OST served on this machine, a connection to its local socket
//! and descriptors of the objects this client reads and writes there, which
//! `objio::ObjectIo` reads and writes instead of sending requests.
//!
//! Off unless asked for (`ClientConfig::short_circuit`: `-o short_circuit` on a mount,
//! `braid nbd serve --short-circuit`): a client process beside the OSS otherwise
//! measures what a client on another node sees.
//!
//! Each OST is in one of three states: being connected to (in the background; the
//! I/O that asked goes over TCP meanwhile), up, or unavailable until a given moment
//! (no socket on this machine: the OST is served elsewhere, tried again after
//! [`RETRY_ABSENT`]; a connection that ended, after [`RETRY_BROKEN`]).
//!
//! Only reads and writes use descriptors. Truncates, hole punches, glimpses and syncs
//! stay requests, which the OSS carries out on the same files: a client's `fsync`
//! reaches the OSS, which syncs the object file the client wrote into. A descriptor
//! is kept until the OSS says its object was destroyed or the connection ends, at most
//! [`FILES_MAX`] of them. Whatever the client cannot use (an error answer, a
//! connection gone, no answer within [`OPEN_TIMEOUT`]) sends the I/O over TCP, whose
//! answer is the authority.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use proto::auth::{client_handshake, Secret, HANDSHAKE_TIMEOUT};
use proto::frame::{encode_frame, read_frame, FrameKind, FrameLimits};
use proto::msg::{decode, encode, Callback, Request, Response};
use proto::{Errno, ObjectId};
use rpc::short_circuit::FdReader;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::{ClientError, Result};

/// Most object descriptors a client keeps, all OSTs together (well under the 1,024
/// descriptors a process may have by default).
pub const FILES_MAX: usize = 256;
/// An OST with no socket on this machine is looked for again after this long (an OSS
/// started here later is found then).
const RETRY_ABSENT: Duration = Duration::from_secs(10);
/// A connection that ended (the OSS stopped) is made again after this long.
const RETRY_BROKEN: Duration = Duration::from_secs(1);
/// An open not answered by then goes over TCP, and the connection is given up.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// Open requests queued for one OST's connection; past it, I/O goes over TCP.
const REQUESTS_QUEUED_MAX: usize = 64;
/// Reads and writes up to this long run on the calling thread when they need not
/// wait: from or into the page cache they take microseconds, less than a trip through
/// the blocking pool. A read is tried without waiting for the disk (`RWF_NOWAIT`) and
/// goes to the blocking pool if it would; writes cannot be tried so (ext4 refuses
/// `RWF_NOWAIT` for buffered writes), so at most one runs inline at a time (one the
/// kernel holds back stalls one thread, not all). Longer ones go to the blocking pool,
/// as the OSS's do.
const INLINE_MAX: u64 = 64 << 10;
/// Longer reads and writes running on the blocking pool at once, all OSTs together;
/// others wait their turn. Buffered writes to one object take its inode's lock in
/// turn anyway: a few hundred threads at it (an NBD copy keeps 256 requests in
/// flight) spent the CPU spinning on that lock instead of copying.
const BLOCKING_MAX: usize = 8;

enum OstState {
    Connecting,
    Up(Arc<OstSession>),
    Unavailable { until: Instant },
}

/// The client's local connections, by OST index.
pub(crate) struct LocalOsts {
    secret: Secret,
    client_id: u64,
    osts: Mutex<HashMap<u32, OstState>>,
    /// Descriptors held by all sessions (bounded by [`FILES_MAX`]).
    held: Arc<AtomicUsize>,
    /// Turns on the blocking pool (see [`BLOCKING_MAX`]) and for a write inline (see
    /// [`INLINE_MAX`]).
    turns: Arc<Turns>,
}

/// Who may do file I/O where (see [`INLINE_MAX`] and [`BLOCKING_MAX`]).
struct Turns {
    blocking: Semaphore,
    inline_write: Semaphore,
}

impl LocalOsts {
    pub(crate) fn new(secret: Secret, client_id: u64) -> Arc<LocalOsts> {
        let turns = Arc::new(Turns { blocking: Semaphore::new(BLOCKING_MAX), inline_write: Semaphore::new(1) });
        Arc::new(LocalOsts { secret, client_id, osts: Mutex::default(), held: Arc::default(), turns })
    }

    /// OST `ost`'s session if it is up. If the OST was not tried lately, starts
    /// connecting to it in the background, its uuid (which names its socket) from
    /// `uuid`.
    pub(crate) fn session(
        self: &Arc<Self>,
        ost: u32,
        uuid: impl FnOnce() -> Option<String>,
    ) -> Option<Arc<OstSession>> {
        let mut osts = self.osts.lock().expect("local OSTs");
        match osts.get(&ost) {
            Some(OstState::Up(s)) => return Some(s.clone()),
            Some(OstState::Connecting) => return None,
            Some(OstState::Unavailable { until }) if Instant::now() < *until => return None,
            _ => {}
        }
        let uuid = uuid()?;
        osts.insert(ost, OstState::Connecting);
        tokio::spawn(self.clone().connect(ost, uuid));
        None
    }

    async fn connect(self: Arc<Self>, ost: u32, uuid: String) {
        let name = rpc::short_circuit::socket_name(&uuid);
        let made = async {
            let mut stream = rpc::short_circuit::connect(&name).map_err(|e| e.to_string())?;
            let shake = client_handshake(&mut stream, &self.secret, self.client_id, "client");
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, shake).await {
                Ok(Ok(())) => Ok(stream),
                Ok(Err(e)) => Err(e.reason),
                Err(_) => Err("no handshake".to_string()),
            }
        };
        let state = match made.await {
            Ok(stream) => {
                tracing::info!(ost, "short-circuit I/O with OST {ost}: its OSS is on this machine");
                OstState::Up(OstSession::start(
                    ost,
                    stream,
                    self.held.clone(),
                    self.turns.clone(),
                    Arc::downgrade(&self),
                ))
            }
            Err(why) => {
                tracing::debug!(ost, "no short-circuit I/O with OST {ost} (@{name}): {why}");
                OstState::Unavailable { until: Instant::now() + RETRY_ABSENT }
            }
        };
        self.osts.lock().expect("local OSTs").insert(ost, state);
    }

    /// The OSTs whose sessions are up, in index order.
    pub(crate) fn up(&self) -> Vec<u32> {
        let osts = self.osts.lock().expect("local OSTs");
        let mut up: Vec<u32> = osts.iter().filter(|(_, s)| matches!(s, OstState::Up(_))).map(|(&i, _)| i).collect();
        up.sort_unstable();
        up
    }

    /// Session `s` ended: its OST is tried again after a moment.
    fn ended(&self, s: &OstSession) {
        let mut osts = self.osts.lock().expect("local OSTs");
        if matches!(osts.get(&s.ost), Some(OstState::Up(up)) if std::ptr::eq(Arc::as_ptr(up), s)) {
            osts.insert(s.ost, OstState::Unavailable { until: Instant::now() + RETRY_BROKEN });
        }
    }
}

/// What an open request came to.
enum Opened {
    File(Arc<File>),
    Absent,
    /// An error answer: the I/O goes over TCP, whose answer counts.
    Refused,
}

/// A connection to one OST's local socket and the descriptors it brought.
pub(crate) struct OstSession {
    ost: u32,
    state: Mutex<SessionState>,
    /// Requests on their way to the writing task, in the order of `state.waiting`.
    requests: mpsc::Sender<Vec<u8>>,
    held: Arc<AtomicUsize>,
    turns: Arc<Turns>,
}

struct SessionState {
    alive: bool,
    files: HashMap<ObjectId, Arc<File>>,
    /// Open requests sent and not answered, oldest first (answers come in order).
    waiting: VecDeque<(ObjectId, oneshot::Sender<Opened>)>,
    next_request: u64,
}

impl OstSession {
    fn start(
        ost: u32,
        stream: tokio::net::UnixStream,
        held: Arc<AtomicUsize>,
        turns: Arc<Turns>,
        registry: Weak<LocalOsts>,
    ) -> Arc<Self> {
        let (rd, mut wr) = stream.into_split();
        let (requests, mut outgoing) = mpsc::channel::<Vec<u8>>(REQUESTS_QUEUED_MAX);
        let state = SessionState { alive: true, files: HashMap::new(), waiting: VecDeque::new(), next_request: 0 };
        let s = Arc::new(OstSession { ost, state: Mutex::new(state), requests, held, turns });
        // Writes requests until the session is dropped (its sender with it), which
        // closes the connection and so ends the reader too.
        tokio::spawn(async move {
            while let Some(frame) = outgoing.recv().await {
                if wr.write_all(&frame).await.is_err() {
                    return;
                }
            }
        });
        tokio::spawn(read_answers(Arc::downgrade(&s), FdReader::new(rd), registry));
        s
    }

    /// The descriptor of `object`, kept or asked for (made if `create`): `Some(None)`
    /// if the object does not exist, `None` if the I/O should go over TCP.
    pub(crate) async fn file(&self, object: ObjectId, create: bool) -> Option<Option<Arc<File>>> {
        if let Some(f) = self.state.lock().expect("short-circuit session").files.get(&object) {
            return Some(Some(f.clone()));
        }
        // Boxed: once per object, and kept out of the future of every read and write
        // (moved and allocated per request).
        Box::pin(self.ask(object, create)).await
    }

    /// Asks the OSS for the descriptor of `object` (see [`OstSession::file`]).
    async fn ask(&self, object: ObjectId, create: bool) -> Option<Option<Arc<File>>> {
        let answer = {
            let mut st = self.state.lock().expect("short-circuit session");
            if let Some(f) = st.files.get(&object) {
                return Some(Some(f.clone()));
            }
            if !st.alive {
                return None;
            }
            st.next_request += 1;
            let msg = encode(&Request::OstOpen { ost: self.ost, object, create }).ok()?;
            // Queued under the lock, so requests leave in the order they wait.
            self.requests.try_send(encode_frame(FrameKind::Request, st.next_request, &msg, &[])).ok()?;
            let (tx, rx) = oneshot::channel();
            st.waiting.push_back((object, tx));
            rx
        };
        match tokio::time::timeout(OPEN_TIMEOUT, answer).await {
            Ok(Ok(Opened::File(f))) => Some(Some(f)),
            Ok(Ok(Opened::Absent)) if !create => Some(None),
            Ok(_) => None,
            Err(_) => {
                tracing::warn!(ost = self.ost, "short-circuit open unanswered for {OPEN_TIMEOUT:?}: over TCP from now");
                self.end();
                None
            }
        }
    }

    /// The answer to the oldest request; `Err` if there is none waiting.
    fn answered(&self, answer: Response, fd: Option<std::os::fd::OwnedFd>) -> std::result::Result<(), String> {
        let mut st = self.state.lock().expect("short-circuit session");
        let Some((object, waiter)) = st.waiting.pop_front() else {
            return Err("an answer to no request".into());
        };
        let opened = match (answer, fd) {
            (Response::ObjectOpened { exists: true }, Some(fd)) => {
                let f = Arc::new(File::from(fd));
                self.keep(&mut st, object, &f);
                Opened::File(f)
            }
            (Response::ObjectOpened { exists: false }, None) => Opened::Absent,
            (Response::Error(e), None) => {
                tracing::debug!(ost = self.ost, "short-circuit open refused: {}", e.message);
                Opened::Refused
            }
            (other, _) => return Err(format!("an odd answer to an open: {other:?}")),
        };
        // The requester may have given up; the descriptor stays kept all the same.
        let _ = waiter.send(opened);
        Ok(())
    }

    /// Keeps `f` for `object` if the client's bound allows, making room among this
    /// session's own if needed (any one goes).
    fn keep(&self, st: &mut SessionState, object: ObjectId, f: &Arc<File>) {
        if self.held.fetch_add(1, Ordering::AcqRel) >= FILES_MAX {
            let Some(&victim) = st.files.keys().next() else {
                // All held by other OSTs' sessions: used once, not kept.
                self.held.fetch_sub(1, Ordering::AcqRel);
                return;
            };
            st.files.remove(&victim);
            self.held.fetch_sub(1, Ordering::AcqRel);
        }
        if st.files.insert(object, f.clone()).is_some() {
            self.held.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The OSS destroyed `object`: its descriptor goes.
    fn forget(&self, object: &ObjectId) {
        if self.state.lock().expect("short-circuit session").files.remove(object).is_some() {
            self.held.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The connection is gone or given up: every descriptor goes, waiting opens go
    /// over TCP.
    fn end(&self) {
        let mut st = self.state.lock().expect("short-circuit session");
        st.alive = false;
        self.held.fetch_sub(st.files.len(), Ordering::AcqRel);
        st.files.clear();
        st.waiting.clear();
    }
}

impl Drop for OstSession {
    fn drop(&mut self) {
        let st = self.state.get_mut().expect("short-circuit session");
        self.held.fetch_sub(st.files.len(), Ordering::AcqRel);
    }
}

/// Reads a session's answers and the OSS's notices in order until the connection
/// ends (or the session is dropped), then ends the session.
async fn read_answers(session: Weak<OstSession>, mut rd: FdReader, registry: Weak<LocalOsts>) {
    let limits = FrameLimits { max_msg_bytes: 4096, max_payload_bytes: 0 };
    let why = loop {
        let f = match read_frame(&mut rd, &limits).await {
            Ok(Some(f)) => f,
            Ok(None) => break "the OSS closed the connection".to_string(),
            Err(e) => break e.to_string(),
        };
        let Some(s) = session.upgrade() else { return };
        match f.kind {
            FrameKind::Response => {
                let answer = match decode::<Response>(&f.msg) {
                    Ok(a) => a,
                    Err(e) => break format!("an answer that does not decode: {e}"),
                };
                let fd = match answer {
                    Response::ObjectOpened { exists: true } => match rd.take_fd() {
                        Some(fd) => Some(fd),
                        None => break "an open answered without its descriptor".to_string(),
                    },
                    _ => None,
                };
                if let Err(why) = s.answered(answer, fd) {
                    break why;
                }
            }
            FrameKind::Callback => {
                if let Ok(Callback::ObjectDestroyed { object, .. }) = decode::<Callback>(&f.msg) {
                    s.forget(&object);
                }
            }
            other => break format!("an unexpected {other:?} frame"),
        }
    };
    let Some(s) = session.upgrade() else { return };
    tracing::info!(ost = s.ost, "short-circuit I/O with OST {} ended: {why}", s.ost);
    s.end();
    if let Some(r) = registry.upgrade() {
        r.ended(&s);
    }
}

fn io_error(op: &str, ost: u32, object: &ObjectId, e: std::io::Error) -> ClientError {
    let code = match e.kind() {
        std::io::ErrorKind::StorageFull => Errno::NoSpc,
        _ => Errno::Io,
    };
    ClientError::Errno(code, format!("short-circuit {op} of object {} of OST {ost}: {e}", object.file_name()))
}

impl OstSession {
    /// Runs `work` on the blocking pool in its turn.
    async fn blocking<T: Send + 'static>(&self, work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
        let _turn = self.turns.blocking.acquire().await.expect("never closed");
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|e| ClientError::Errno(Errno::Io, format!("short-circuit I/O task failed: {e}")))?
    }

    /// Up to `len` bytes of object `object` at `offset` through its descriptor.
    pub(crate) async fn read(&self, file: Arc<File>, object: ObjectId, offset: u64, len: u64) -> Result<Bytes> {
        let ost = self.ost;
        if len <= INLINE_MAX {
            let cached = rpc::short_circuit::read_cached(&file, offset, len as usize);
            if let Some(data) = cached.map_err(|e| io_error("read", ost, &object, e))? {
                return Ok(data);
            }
        }
        // Boxed, as the write's below: the read's future is every read's.
        Box::pin(self.blocking(move || {
            rpc::short_circuit::read_at_most(&file, offset, len as usize).map_err(|e| io_error("read", ost, &object, e))
        }))
        .await
    }

    /// `payload` (contiguous in the object) written at `offset` through its descriptor.
    pub(crate) async fn write(
        &self,
        file: Arc<File>,
        object: ObjectId,
        offset: u64,
        payload: Vec<Bytes>,
    ) -> Result<()> {
        let len: u64 = payload.iter().map(|b| b.len() as u64).sum();
        let ost = self.ost;
        let work = move || {
            let mut at = offset;
            for piece in &payload {
                file.write_all_at(piece, at).map_err(|e| io_error("write", ost, &object, e))?;
                at += piece.len() as u64;
            }
            Ok(())
        };
        if len <= INLINE_MAX {
            if let Ok(_turn) = self.turns.inline_write.try_acquire() {
                return work();
            }
        }
        Box::pin(self.blocking(work)).await
    }
}
