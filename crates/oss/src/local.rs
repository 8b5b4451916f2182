//! The OSS's end of short-circuit local I/O (see `rpc::short_circuit` for what it is
//! and why): a Unix socket per OST, named after its uuid, on which clients of this
//! machine that proved the cluster secret are handed descriptors of object files, and
//! told of every object destroyed.
//!
//! A session answers its client's `OstOpen` requests in order, one at a time. Its
//! answers and the destroys it is told of go through one bounded queue to the task
//! that writes them ([`PEER_QUEUE_MAX`]); a client that lets it fill is cut off, and
//! drops every descriptor it holds when it sees the connection end, as it does when
//! the OSS stops. Which of an answer and a destroy reaches the client first is decided
//! under the lock of the OSS's object handles (see `ObjectHandles`): a descriptor
//! opened while a destroy went on is opened again, not sent.
//!
//! Who is served: a descriptor lets its holder read and write an object file as the
//! OSS does, past every permission the MDS checks, so a connection is first checked
//! by the kernel's word on its peer (`SO_PEERCRED`): root, the OSS's own user and the
//! users of [`ShortCircuitPolicy::uids`] go on to the handshake, any other is closed
//! and logged. On a cluster without a secret (`--insecure`) the handshake proves
//! nothing, so the OSS opens no socket at all unless told to
//! ([`ShortCircuitPolicy::insecure`]).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use proto::auth::{server_handshake, Secret, HANDSHAKE_TIMEOUT};
use proto::frame::{encode_frame, read_frame, FrameKind, FrameLimits};
use proto::msg::{encode, Callback, Request, Response};
use proto::{Errno, ObjectId};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, Notify};

use crate::{io_err, Oss, Ost};

/// Most short-circuit clients of one OSS at once; one more is turned away (it goes on
/// over TCP).
const PEERS_MAX: usize = 64;
/// Answers and destroy notices queued for one client. A destroy that finds the queue
/// full ends the session instead of waiting: an OSS never waits for a client.
const PEER_QUEUE_MAX: usize = 1024;
/// Times an open is tried again when a destroy moved the epoch meanwhile.
const OPEN_TRIES: usize = 3;

/// Something to write to a client: a frame, and the descriptor that goes with it.
struct Outgoing {
    frame: Vec<u8>,
    fd: Option<File>,
}

/// One connected client.
struct Peer {
    ost: u32,
    queue: mpsc::Sender<Outgoing>,
    /// Ends the session (the queue overflowed).
    kill: Arc<Notify>,
}

/// The short-circuit clients of an OSS, by session id. Lives in `KeptHandles`, under
/// its lock.
#[derive(Default)]
pub(crate) struct Peers {
    by_id: HashMap<u64, Peer>,
    next_id: u64,
}

impl Peers {
    fn add(&mut self, peer: Peer) -> Option<u64> {
        if self.by_id.len() >= PEERS_MAX {
            return None;
        }
        self.next_id += 1;
        self.by_id.insert(self.next_id, peer);
        Some(self.next_id)
    }

    /// Queues `out` for peer `id`; a peer whose queue is full or gone is cut off.
    fn send(&mut self, id: u64, out: Outgoing) -> bool {
        let Some(p) = self.by_id.get(&id) else { return false };
        if p.queue.try_send(out).is_ok() {
            return true;
        }
        let p = self.by_id.remove(&id).expect("looked up above");
        p.kill.notify_one();
        false
    }

    /// Object `o` of OST `ost` was unlinked: every client of that OST is told.
    pub(crate) fn tell_destroyed(&mut self, ost: u32, o: &ObjectId) {
        if self.by_id.is_empty() {
            return;
        }
        let Some(frame) = frame(FrameKind::Callback, 0, encode(&Callback::ObjectDestroyed { ost, object: *o })) else {
            return;
        };
        let ids: Vec<u64> = self.by_id.iter().filter(|(_, p)| p.ost == ost).map(|(&id, _)| id).collect();
        for id in ids {
            self.send(id, Outgoing { frame: frame.clone(), fd: None });
        }
    }
}

/// A frame of `msg` (encoded with `proto::msg::encode`), unless it could not be.
fn frame(kind: FrameKind, request_id: u64, msg: Result<Vec<u8>, proto::msg::CodecError>) -> Option<Vec<u8>> {
    Some(encode_frame(kind, request_id, &msg.ok()?, &[]))
}

/// Who may have an OSS's object descriptors, besides root and the OSS's own user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShortCircuitPolicy {
    /// Other users allowed (`--short-circuit-uids`).
    pub uids: Vec<u32>,
    /// Serve short-circuit clients on a cluster without a secret
    /// (`--short-circuit-insecure`): then any process of an allowed user gets the
    /// descriptors, with no proof that it is a braid client at all.
    pub insecure: bool,
}

impl ShortCircuitPolicy {
    /// Why a peer of user `uid` may not connect, if it may not; `me` is the user the
    /// OSS runs as.
    pub fn refuses(&self, uid: u32, me: u32) -> Option<String> {
        if uid == 0 || uid == me || self.uids.contains(&uid) {
            return None;
        }
        Some(format!("uid {uid} is neither root, the OSS's user (uid {me}) nor one of --short-circuit-uids"))
    }
}

/// Opens each OST's local socket and serves it for the life of the process, to the
/// peers `policy` allows. An OST whose socket cannot be opened (another process
/// serves the same OST) is logged and served over TCP only; so is every OST of an
/// insecure OSS unless `policy` says otherwise.
pub fn listen(oss: &Arc<Oss>, secret: &Secret, policy: &ShortCircuitPolicy) {
    if matches!(secret, Secret::Insecure) && !policy.insecure {
        tracing::warn!(
            "short-circuit I/O off: without a cluster secret (--insecure) any process of this machine could \
             take the object files; --short-circuit-insecure turns it on anyway"
        );
        return;
    }
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let policy = Arc::new(policy.clone());
    for ost in oss.osts.values() {
        if oss.media.contains_key(&ost.index) {
            // Reading and writing the object files directly would bypass the emulation.
            tracing::info!(ost = ost.index, "no short-circuit I/O: the OST emulates a medium");
            continue;
        }
        let name = rpc::short_circuit::socket_name(&ost.uuid);
        let listener = match rpc::short_circuit::listen(&name) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(ost = ost.index, "no short-circuit socket @{name}: {e}");
                continue;
            }
        };
        tracing::debug!(ost = ost.index, "short-circuit clients of this machine at @{name}");
        let (oss, ost, secret, policy) = (oss.clone(), ost.clone(), secret.clone(), policy.clone());
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        // Before the handshake: a refused peer learns nothing.
                        let refused = match stream.peer_cred() {
                            Ok(cred) => policy.refuses(cred.uid(), me).map(|why| {
                                let pid = cred.pid().map_or_else(|| "?".to_string(), |p| p.to_string());
                                format!("{why} (pid {pid})")
                            }),
                            Err(e) => Some(format!("cannot tell who it is: {e}")),
                        };
                        if let Some(why) = refused {
                            tracing::warn!(ost = ost.index, "short-circuit client refused: {why}");
                            continue;
                        }
                        tokio::spawn(session(oss.clone(), ost.clone(), stream, secret.clone()));
                    }
                    Err(e) => {
                        tracing::warn!(ost = ost.index, "short-circuit accept: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            }
        });
    }
}

/// One client's connection, until it closes, misbehaves or falls behind.
async fn session(oss: Arc<Oss>, ost: Ost, mut stream: UnixStream, secret: Secret) {
    let hello = match tokio::time::timeout(HANDSHAKE_TIMEOUT, server_handshake(&mut stream, &secret)).await {
        Ok(Ok(h)) => h,
        Ok(Err(why)) => {
            tracing::warn!(ost = ost.index, "short-circuit client refused: {why}");
            return;
        }
        Err(_) => return,
    };
    let (rd, mut wr) = stream.into_split();
    let (queue, mut outgoing) = mpsc::channel::<Outgoing>(PEER_QUEUE_MAX);
    let kill = Arc::new(Notify::new());
    let peer = Peer { ost: ost.index, queue, kill: kill.clone() };
    let Some(id) = oss.handles.inner.lock().expect("object handles").peers.add(peer) else {
        tracing::warn!(ost = ost.index, "{PEERS_MAX} short-circuit clients already: one more goes over TCP");
        return;
    };
    tracing::debug!(ost = ost.index, client = hello.client_id, "short-circuit client connected");
    let writer_kill = kill.clone();
    let writer = tokio::spawn(async move {
        while let Some(out) = outgoing.recv().await {
            let fd = out.fd.as_ref().map(|f| f.as_raw_fd());
            if rpc::short_circuit::send_with_fd(&mut wr, &out.frame, fd).await.is_err() {
                writer_kill.notify_one();
                return;
            }
        }
    });
    let limits = FrameLimits { max_msg_bytes: 4096, max_payload_bytes: 0 };
    let mut rd = tokio::io::BufReader::new(rd);
    loop {
        let frame = tokio::select! {
            f = read_frame(&mut rd, &limits) => f,
            _ = kill.notified() => break,
        };
        let f = match frame {
            Ok(Some(f)) if f.kind == FrameKind::Request => f,
            // Closed, garbled, or not a request: the session ends.
            _ => break,
        };
        let answer = match proto::msg::decode::<Request>(&f.msg) {
            Ok(Request::OstOpen { ost: index, object, create }) if index == ost.index => {
                oss.open_for_peer(&ost, &object, create, id, f.request_id)
            }
            Ok(other) => oss.answer_peer(
                id,
                f.request_id,
                Response::error(
                    Errno::Proto,
                    format!("{} is not served on OST {}'s local socket", other.op_name(), ost.index),
                ),
                None,
            ),
            Err(e) => {
                oss.answer_peer(id, f.request_id, Response::error(Errno::Proto, format!("bad request: {e}")), None)
            }
        };
        if !answer {
            break;
        }
    }
    oss.handles.inner.lock().expect("object handles").peers.by_id.remove(&id);
    writer.abort();
}

impl Oss {
    /// Queues an answer for peer `id`; false if the peer is cut off.
    fn answer_peer(&self, id: u64, request_id: u64, r: Response, fd: Option<File>) -> bool {
        let Some(frame) = frame(FrameKind::Response, request_id, encode(&r)) else { return false };
        self.handles.inner.lock().expect("object handles").peers.send(id, Outgoing { frame, fd })
    }

    /// Answers peer `id`'s request for object `o` with its descriptor (made if
    /// `create`), or says it does not exist or cannot be opened.
    fn open_for_peer(&self, ost: &Ost, o: &ObjectId, create: bool, id: u64, request_id: u64) -> bool {
        for _ in 0..OPEN_TRIES {
            let epoch = self.handles.inner.lock().expect("object handles").epoch;
            let opened = OpenOptions::new().read(true).write(true).create(create).open(ost.object_path(o));
            let (answer, fd) = match opened {
                Ok(f) => (Response::ObjectOpened { exists: true }, Some(f)),
                Err(e) if e.kind() == ErrorKind::NotFound && !create => {
                    (Response::ObjectOpened { exists: false }, None)
                }
                Err(e) => (io_err("open", o, e), None),
            };
            let Some(frame) = frame(FrameKind::Response, request_id, encode(&answer)) else { return false };
            let mut kept = self.handles.inner.lock().expect("object handles");
            if fd.is_some() && kept.epoch != epoch {
                // A destroy went on meanwhile: this may be the unlinked file.
                continue;
            }
            // Queued under the lock: a destroy after this point is queued after it.
            return kept.peers.send(id, Outgoing { frame, fd });
        }
        self.answer_peer(id, request_id, Response::error(Errno::Again, "objects destroyed while opening"), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proto::auth::client_handshake;
    use proto::frame::write_frame;
    use proto::Fid;
    use rpc::short_circuit::FdReader;
    use std::os::unix::fs::FileExt;
    use tokio::io::AsyncWriteExt;

    const SECRET: &[u8] = b"a secret of the test cluster";

    /// A client of an OST's local socket, as the client crate's is, by hand.
    struct Peer {
        rd: FdReader,
        wr: tokio::net::unix::OwnedWriteHalf,
        next: u64,
    }

    impl Peer {
        async fn connect(uuid: &str, secret: &[u8]) -> Result<Peer, String> {
            let mut s =
                rpc::short_circuit::connect(&rpc::short_circuit::socket_name(uuid)).map_err(|e| e.to_string())?;
            client_handshake(&mut s, &Secret::Key(secret.to_vec()), 7, "client").await.map_err(|e| e.reason)?;
            let (rd, wr) = s.into_split();
            Ok(Peer { rd: FdReader::new(rd), wr, next: 0 })
        }

        async fn send(&mut self, r: &Request) {
            self.next += 1;
            write_frame(&mut self.wr, FrameKind::Request, self.next, &encode(r).unwrap(), &[]).await.unwrap();
        }

        async fn frame(&mut self) -> Option<proto::frame::Frame> {
            let limits = FrameLimits { max_msg_bytes: 4096, max_payload_bytes: 0 };
            tokio::time::timeout(std::time::Duration::from_secs(10), read_frame(&mut self.rd, &limits))
                .await
                .expect("an answer in time")
                .ok()
                .flatten()
        }

        async fn open(&mut self, ost: u32, object: ObjectId, create: bool) -> (Response, Option<File>) {
            self.send(&Request::OstOpen { ost, object, create }).await;
            let f = self.frame().await.expect("an answer");
            assert_eq!((f.kind, f.request_id), (FrameKind::Response, self.next));
            let r: Response = proto::msg::decode(&f.msg).unwrap();
            let fd =
                matches!(r, Response::ObjectOpened { exists: true }).then(|| File::from(self.rd.take_fd().unwrap()));
            (r, fd)
        }
    }

    fn object(stripe: u32) -> ObjectId {
        ObjectId { fid: Fid { seq: 0x200000400, oid: 9, ver: 0 }, component: 0, stripe }
    }

    /// A client of this machine gets descriptors of the object files: what it writes
    /// through one the OSS reads, and the other way round; an absent object is said
    /// to be absent unless made; a destroy reaches it; a wrong secret, another OST's
    /// objects and garbage are refused, and the OSS goes on serving.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_local_client_reads_and_writes_object_files_and_hears_of_destroys() {
        let dir = std::env::temp_dir().join(format!("braid-oss-local-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Ost::format(&dir).unwrap();
        let uuid = format!("test-{}-{:x}", std::process::id(), dir.as_os_str().len());
        let oss = Arc::new(Oss::new(vec![Ost { index: 3, dir: dir.clone(), uuid: uuid.clone() }]));
        listen(&oss, &Secret::Key(SECRET.to_vec()), &ShortCircuitPolicy::default());

        let refused = Peer::connect(&uuid, b"not the secret of this cluster").await;
        assert!(refused.is_err(), "a wrong secret is refused");

        let mut p = Peer::connect(&uuid, SECRET).await.unwrap();
        let (r, fd) = p.open(3, object(0), false).await;
        assert!(matches!(r, Response::ObjectOpened { exists: false }) && fd.is_none(), "{r:?}");
        let (r, fd) = p.open(3, object(0), true).await;
        assert!(matches!(r, Response::ObjectOpened { exists: true }), "{r:?}");
        let f = fd.unwrap();
        f.write_all_at(b"written by the client", 10).unwrap();
        let read =
            oss.handle_blocking(Request::OstRead { ost: 3, object: object(0), offset: 10, len: 64 }, Bytes::new());
        assert_eq!(&read.1[0][..], b"written by the client");
        let w = oss.handle_blocking(
            Request::OstWrite { ost: 3, object: object(0), offset: 0, sync: false },
            Bytes::from_static(b"OSS"),
        );
        assert!(matches!(w.0, Response::Written { bytes: 3 }), "{:?}", w.0);
        let mut buf = [0u8; 3];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"OSS");

        // Another OST's object, and a request other than an open: refused, still served.
        let (r, fd) = p.open(4, object(0), true).await;
        assert!(matches!(r, Response::Error(_)) && fd.is_none(), "{r:?}");
        p.send(&Request::OstStatfs { ost: 3 }).await;
        let f2 = p.frame().await.unwrap();
        assert!(matches!(proto::msg::decode::<Response>(&f2.msg).unwrap(), Response::Error(_)));

        // A destroy is told, after the answer to an open made before it.
        let (_, kept) = p.open(3, object(1), true).await;
        assert!(kept.is_some());
        let d = oss.handle_blocking(Request::OstDestroy { ost: 3, object: object(0) }, Bytes::new());
        assert!(matches!(d.0, Response::Ok), "{:?}", d.0);
        let told = p.frame().await.expect("a notice");
        assert_eq!(told.kind, FrameKind::Callback);
        let cb: Callback = proto::msg::decode(&told.msg).unwrap();
        assert_eq!(cb, Callback::ObjectDestroyed { ost: 3, object: object(0) });
        // Made again by an open: a new file, not the unlinked one.
        let (_, again) = p.open(3, object(0), true).await;
        let mut buf = [0u8; 4];
        assert_eq!(again.unwrap().read_at(&mut buf, 0).unwrap(), 0, "the object made again is empty");

        // Garbage ends this session only.
        p.wr.write_all(b"this is not a frame at all, not even a header").await.unwrap();
        assert!(p.frame().await.is_none(), "the session ended");
        let mut q = Peer::connect(&uuid, SECRET).await.unwrap();
        let (r, _) = q.open(3, object(1), false).await;
        assert!(matches!(r, Response::ObjectOpened { exists: true }), "{r:?}");
        drop(q);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(oss.handles.inner.lock().unwrap().peers.by_id.is_empty(), "ended sessions are forgotten");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn root_the_oss_user_and_the_listed_users_are_allowed_no_one_else() {
        let p = ShortCircuitPolicy { uids: vec![1001], insecure: false };
        assert_eq!(p.refuses(0, 1000), None);
        assert_eq!(p.refuses(1000, 1000), None);
        assert_eq!(p.refuses(1001, 1000), None);
        let why = p.refuses(65534, 1000).expect("another user is refused");
        assert!(why.contains("uid 65534"), "{why}");
        assert!(ShortCircuitPolicy::default().refuses(1001, 1000).is_some());
    }

    /// An insecure OSS opens no local socket unless told to.
    #[tokio::test]
    async fn an_insecure_oss_serves_no_descriptors_unless_told_to() {
        let pid = std::process::id();
        let mk = |tag: &str| {
            let dir = std::env::temp_dir().join(format!("braid-oss-insecure-{tag}-{pid}"));
            let _ = std::fs::remove_dir_all(&dir);
            Ost::format(&dir).unwrap();
            let uuid = format!("test-insecure-{tag}-{pid}");
            (Arc::new(Oss::new(vec![Ost { index: 0, dir: dir.clone(), uuid: uuid.clone() }])), dir, uuid)
        };
        let (off, off_dir, off_uuid) = mk("off");
        listen(&off, &Secret::Insecure, &ShortCircuitPolicy::default());
        let e = rpc::short_circuit::connect(&rpc::short_circuit::socket_name(&off_uuid)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
        let (on, on_dir, on_uuid) = mk("on");
        listen(&on, &Secret::Insecure, &ShortCircuitPolicy { uids: vec![], insecure: true });
        let mut p = Peer::connect(&on_uuid, b"any secret at all").await.expect("served when told to");
        let (r, fd) = p.open(0, object(0), true).await;
        assert!(matches!(r, Response::ObjectOpened { exists: true }) && fd.is_some(), "{r:?}");
        for d in [off_dir, on_dir] {
            std::fs::remove_dir_all(&d).unwrap();
        }
    }
}
