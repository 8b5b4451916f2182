//! The OSS: serves OSTs, each a local directory of object files.
//!
//! An object is named by (FID, component, stripe) and stored as one file under one of
//! 256 fan-out directories (`objects/xx/`). It is created by its first write: no
//! precreation round trip. Reads of absent objects or of holes return zeros (short
//! reads at the object's end are completed with zeros by the client up to the file
//! size). Large or synchronous file I/O runs on tokio's blocking pool so the network
//! loop never waits on the disk; reads and writes of at most 64 KiB, which the page
//! cache serves in microseconds, run on the runtime's thread (see `Service for Oss`).

pub mod direct;
pub mod fsck;
pub mod local;
pub mod media;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use proto::msg::{Media, Request, Response, TargetKind, Usage};
use proto::{Errno, ObjectId};
use rpc::server::{Answer, RequestCtx, Service};
use rpc::target::TargetDir;

/// One OST: its index, its directory, and its uuid (which names its local socket,
/// see [`local`]).
#[derive(Debug, Clone)]
pub struct Ost {
    pub index: u32,
    pub dir: PathBuf,
    pub uuid: String,
}

impl Ost {
    /// Prepares the directory layout of an OST (idempotent).
    pub fn format(dir: &Path) -> std::io::Result<()> {
        let objects = dir.join("objects");
        for b in 0..256 {
            std::fs::create_dir_all(objects.join(format!("{b:02x}")))?;
        }
        Ok(())
    }

    fn object_path(&self, o: &ObjectId) -> PathBuf {
        self.dir.join("objects").join(o.bucket()).join(o.file_name())
    }
}

pub struct Oss {
    osts: Arc<HashMap<u32, Ost>>,
    handles: Arc<ObjectHandles>,
    /// Small writes being served on a runtime thread (see [`INLINE_WRITES_MAX`]).
    inline_writes: Arc<AtomicUsize>,
    /// The OSTs that emulate a medium, and their limits (see [`media`]).
    media: Arc<HashMap<u32, Arc<media::Throttle>>>,
}

/// Most object descriptors kept open (well below the 1,024 descriptors a process may
/// have by default).
const KEPT_HANDLES_MAX: usize = 256;

/// Read-write descriptors of objects used recently, kept open for the next read or
/// small write.
///
/// A 4 KiB read or write opened and closed its object every time: three system calls
/// and a walk of the object's path for one `pread` or `pwrite`, the most of the OSS's
/// work in a small read from the page cache and a sixth of it in a small write.
/// Punches, trims and syncs reach the same inode through descriptors of their own, so
/// a kept one sees them. Only a destroy replaces the file under an object's name (it
/// unlinks it; a later write creates a new one): it drops the object's descriptor and
/// moves the epoch, and a descriptor opened while a destroy went on is used once and
/// not kept, since it may be of the unlinked file.
///
/// The same lock orders what short-circuit clients are told (see [`local`]): a
/// descriptor is handed to one only if no destroy moved the epoch while it was opened,
/// and a destroy is queued to every one of them as it moves the epoch.
#[derive(Default)]
struct ObjectHandles {
    inner: std::sync::Mutex<KeptHandles>,
}

#[derive(Default)]
struct KeptHandles {
    open: HashMap<(u32, ObjectId), Arc<File>>,
    /// Moved by every destroy.
    epoch: u64,
    /// Short-circuit clients on this machine.
    peers: local::Peers,
}

impl ObjectHandles {
    /// A read-write descriptor of object `o` of `ost`, kept or newly opened; a new
    /// one creates the object if `create` (a write), else a missing object is
    /// `NotFound` (a read).
    fn get(&self, ost: &Ost, o: &ObjectId, create: bool) -> std::io::Result<Arc<File>> {
        let key = (ost.index, *o);
        let epoch = {
            let kept = self.inner.lock().expect("object handles");
            if let Some(f) = kept.open.get(&key) {
                return Ok(f.clone());
            }
            kept.epoch
        };
        let f = Arc::new(OpenOptions::new().read(true).write(true).create(create).open(ost.object_path(o))?);
        let mut kept = self.inner.lock().expect("object handles");
        if kept.epoch == epoch {
            if kept.open.len() >= KEPT_HANDLES_MAX {
                // Any one goes: a hash map's first key is as good as a random pick.
                if let Some(k) = kept.open.keys().next().copied() {
                    kept.open.remove(&k);
                }
            }
            kept.open.insert(key, f.clone());
        }
        Ok(f)
    }

    /// Object `o` of OST `ost` was unlinked: its descriptor goes, and none opened
    /// before this call is kept.
    fn destroyed(&self, ost: u32, o: &ObjectId) {
        let mut kept = self.inner.lock().expect("object handles");
        kept.epoch += 1;
        kept.open.remove(&(ost, *o));
        kept.peers.tell_destroyed(ost, o);
    }
}

fn io_err(op: &str, o: &ObjectId, e: std::io::Error) -> Response {
    let code = match e.kind() {
        ErrorKind::StorageFull => Errno::NoSpc,
        _ => Errno::Io,
    };
    Response::error(code, format!("{op} of object {} failed: {e}", o.file_name()))
}

impl Oss {
    pub fn new(osts: Vec<Ost>) -> Oss {
        Oss {
            osts: Arc::new(osts.into_iter().map(|o| (o.index, o)).collect()),
            handles: Arc::default(),
            inline_writes: Arc::default(),
            media: Arc::default(),
        }
    }

    /// Makes the OSTs named in `media` emulate those media (see [`media`]).
    pub fn with_media(mut self, media: HashMap<u32, Media>) -> Oss {
        self.media = Arc::new(media.into_iter().map(|(i, m)| (i, Arc::new(media::Throttle::new(m)))).collect());
        self
    }

    /// The medium OST `index` emulates, if any.
    pub fn media_of(&self, index: u32) -> Option<Media> {
        self.media.get(&index).map(|t| t.media().clone())
    }

    pub fn targets(dirs: &[TargetDir]) -> Vec<Ost> {
        dirs.iter()
            .filter(|t| t.kind == TargetKind::Ost)
            .filter_map(|t| t.index.map(|index| Ost { index, dir: t.dir.clone(), uuid: t.uuid.clone() }))
            .collect()
    }

    fn ost(&self, index: u32) -> Result<Ost, Box<Response>> {
        self.osts
            .get(&index)
            .cloned()
            .ok_or_else(|| Box::new(Response::error(Errno::NoEnt, format!("OST {index} is not served here"))))
    }

    fn write(&self, ost: &Ost, o: &ObjectId, offset: u64, data: &[u8], sync: bool) -> Response {
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > i64::MAX as u64) {
            return Response::error(Errno::Inval, "write beyond the largest object offset");
        }
        if !sync && direct::eligible(offset, data.len()) {
            match direct::write(&ost.object_path(o), offset, data) {
                Ok(true) => return Response::Written { bytes: data.len() as u64 },
                Ok(false) => {} // no O_DIRECT here: buffered below
                Err(e) => return io_err("write", o, e),
            }
        }
        let f = match self.handles.get(ost, o, true) {
            Ok(f) => f,
            Err(e) => return io_err("open", o, e),
        };
        if let Err(e) = f.write_all_at(data, offset) {
            return io_err("write", o, e);
        }
        if sync {
            if let Err(e) = f.sync_data() {
                return io_err("sync", o, e);
            }
        }
        Response::Written { bytes: data.len() as u64 }
    }

    fn read(&self, ost: &Ost, o: &ObjectId, offset: u64, len: u32) -> Answer {
        if direct::eligible(offset, len as usize) {
            match direct::read(&ost.object_path(o), offset, len as usize) {
                Ok(Some(buf)) => return (Response::Data, vec![Bytes::from_owner(buf)]),
                Ok(None) => {} // no O_DIRECT here: buffered below
                Err(e) if e.kind() == ErrorKind::NotFound => return (Response::Data, vec![]),
                Err(e) => return (io_err("read", o, e), vec![]),
            }
        }
        let f = match self.handles.get(ost, o, false) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return (Response::Data, vec![]),
            Err(e) => return (io_err("open", o, e), vec![]),
        };
        match rpc::short_circuit::read_at_most(&f, offset, len as usize) {
            Ok(data) => (Response::Data, vec![data]),
            Err(e) => (io_err("read", o, e), vec![]),
        }
    }

    fn punch(ost: &Ost, o: &ObjectId, size: u64) -> Response {
        let f = match OpenOptions::new().write(true).open(ost.object_path(o)) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Response::Ok,
            Err(e) => return io_err("open", o, e),
        };
        let cur = match f.metadata() {
            Ok(m) => m.len(),
            Err(e) => return io_err("stat", o, e),
        };
        if cur > size {
            if let Err(e) = f.set_len(size) {
                return io_err("truncate", o, e);
            }
        }
        Response::Ok
    }

    fn trim(ost: &Ost, o: &ObjectId, offset: u64, len: u64) -> Response {
        let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Response::error(Errno::Inval, "trim range beyond the largest object offset");
        };
        let f = match OpenOptions::new().write(true).open(ost.object_path(o)) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Response::Ok,
            Err(e) => return io_err("open", o, e),
        };
        use std::os::fd::AsRawFd;
        // SAFETY: fallocate on a file descriptor we own, with plain integer arguments.
        let rc =
            unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, off, n) };
        if rc != 0 {
            return io_err("trim", o, std::io::Error::last_os_error());
        }
        Response::Ok
    }

    fn destroy(&self, ost: &Ost, o: &ObjectId) -> Response {
        let r = std::fs::remove_file(ost.object_path(o));
        // After the unlink (see `ObjectHandles`), whatever came of it.
        self.handles.destroyed(ost.index, o);
        match r {
            Ok(()) => Response::Ok,
            Err(e) if e.kind() == ErrorKind::NotFound => Response::Ok,
            Err(e) => io_err("destroy", o, e),
        }
    }

    fn getattr(ost: &Ost, o: &ObjectId) -> Response {
        match std::fs::metadata(ost.object_path(o)) {
            Ok(m) => Response::ObjectAttr { size: m.len(), exists: true },
            Err(e) if e.kind() == ErrorKind::NotFound => Response::ObjectAttr { size: 0, exists: false },
            Err(e) => io_err("stat", o, e),
        }
    }

    fn sync(ost: &Ost, objects: &[ObjectId]) -> Response {
        for o in objects {
            match File::open(ost.object_path(o)) {
                Ok(f) => {
                    if let Err(e) = f.sync_all() {
                        return io_err("sync", o, e);
                    }
                }
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return io_err("open", o, e),
            }
        }
        Response::Ok
    }

    fn handle_blocking(&self, req: Request, payload: Bytes) -> Answer {
        let ost_of = |i: u32| self.ost(i);
        let simple = |r: Response| (r, vec![]);
        match req {
            Request::Ping => simple(Response::Ok),
            Request::OstWrite { ost, object, offset, sync } => match ost_of(ost) {
                Ok(t) => simple(self.write(&t, &object, offset, &payload, sync)),
                Err(r) => simple(*r),
            },
            Request::OstRead { ost, object, offset, len } => match ost_of(ost) {
                Ok(t) if len <= 16 << 20 => self.read(&t, &object, offset, len),
                Ok(_) => simple(Response::error(Errno::Inval, format!("read of {len} bytes exceeds 16 MiB"))),
                Err(r) => simple(*r),
            },
            Request::OstPunch { ost, object, size } => {
                simple(ost_of(ost).map_or_else(|r| *r, |t| Self::punch(&t, &object, size)))
            }
            Request::OstDestroy { ost, object } => {
                simple(ost_of(ost).map_or_else(|r| *r, |t| self.destroy(&t, &object)))
            }
            Request::OstGetattr { ost, object } => {
                simple(ost_of(ost).map_or_else(|r| *r, |t| Self::getattr(&t, &object)))
            }
            Request::OstSync { ost, objects } => simple(ost_of(ost).map_or_else(|r| *r, |t| Self::sync(&t, &objects))),
            Request::OstTrim { ost, object, offset, len } => {
                simple(ost_of(ost).map_or_else(|r| *r, |t| Self::trim(&t, &object, offset, len)))
            }
            Request::OstStatfs { ost } => {
                simple(ost_of(ost).map_or_else(|r| *r, |t| Response::Usage(ost_usage(&t.dir))))
            }
            Request::OstFsckList { ost, after, max } => {
                ost_of(ost).map_or_else(|r| (*r, vec![]), |t| fsck::list(&t, after, max))
            }
            Request::OstFsckLostFound { ost, object } => {
                let r = ost_of(ost).map_or_else(|r| *r, |t| fsck::to_lost_found(&t, &object));
                // Its kept descriptor, if any, is of a file no longer in the namespace.
                self.handles.destroyed(ost, &object);
                simple(r)
            }
            Request::OstOpen { .. } => {
                simple(Response::error(Errno::Proto, "ost_open is answered only on the OST's local socket"))
            }
            other => simple(Response::error(Errno::Proto, format!("an OSS does not serve {}", other.op_name()))),
        }
    }
}

/// Usage of an OST: its file system's space, and inodes as objects.
pub fn ost_usage(dir: &Path) -> Usage {
    rpc::target::dir_usage(dir)
}

/// Largest read served on the runtime's own thread.
const INLINE_READ_MAX: u32 = 64 << 10;

/// Largest write (without `sync`) served on the runtime's own thread.
const INLINE_WRITE_MAX: usize = 64 << 10;

/// Most small writes served on runtime threads at once; the others go to the blocking
/// pool. A write into the page cache takes microseconds, but one the kernel holds back
/// (dirty pages over their limit, a journal commit) can wait for milliseconds: at most
/// one runtime thread waits so, and the others go on reading requests.
const INLINE_WRITES_MAX: usize = 1;

impl Service for Oss {
    async fn handle(self: &Oss, _ctx: RequestCtx, req: Request, payload: Bytes) -> Answer {
        // An emulated medium first takes the time it would (see `media`).
        if let Some((ost, bytes)) = match &req {
            Request::OstRead { ost, len, .. } => Some((*ost, u64::from(*len))),
            Request::OstWrite { ost, .. } => Some((*ost, payload.len() as u64)),
            _ => None,
        } {
            if let Some(t) = self.media.get(&ost) {
                t.pass(bytes).await;
            }
        }
        // A small read is served inline: from the page cache it takes microseconds,
        // less than the two thread wake-ups of a trip through the blocking pool (which
        // were most of a 4 KiB random read's latency); a miss holds this thread for one
        // disk read.
        if matches!(req, Request::OstRead { len, .. } if len <= INLINE_READ_MAX) {
            return self.handle_blocking(req, payload);
        }
        // So is a small write, into the page cache, as long as no other runtime thread
        // is in one (4 KiB random writes through the NBD export at 8 in flight: 19 K
        // IOPS with the trip, 28 K without).
        if matches!(req, Request::OstWrite { sync: false, .. }) && payload.len() <= INLINE_WRITE_MAX {
            if let Some(_slot) = InlineSlot::take(&self.inline_writes) {
                return self.handle_blocking(req, payload);
            }
        }
        // Other file I/O blocks: run it on the blocking pool with a cheap handle to the OSTs.
        let oss = Oss {
            osts: self.osts.clone(),
            handles: self.handles.clone(),
            inline_writes: self.inline_writes.clone(),
            media: self.media.clone(),
        };
        match tokio::task::spawn_blocking(move || oss.handle_blocking(req, payload)).await {
            Ok(a) => a,
            Err(e) => (Response::error(Errno::Io, format!("OSS worker failed: {e}")), vec![]),
        }
    }
}

/// One of the [`INLINE_WRITES_MAX`] places for a write served inline, given back on drop.
struct InlineSlot<'a>(&'a AtomicUsize);

impl<'a> InlineSlot<'a> {
    fn take(count: &'a AtomicUsize) -> Option<InlineSlot<'a>> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < INLINE_WRITES_MAX).then_some(n + 1))
            .ok()
            .map(|_| InlineSlot(count))
    }
}

impl Drop for InlineSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves on `listener`.
pub async fn serve(oss: Arc<Oss>, listener: tokio::net::TcpListener, server: rpc::server::ServerConfig) {
    rpc::server::serve(listener, Arc::new(server), oss).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::Fid;

    fn data(a: &Answer) -> Vec<u8> {
        assert!(matches!(a.0, Response::Data), "{:?}", a.0);
        a.1.iter().flat_map(|b| b.iter().copied()).collect()
    }

    /// A kept descriptor never outlives its object: after a destroy, a read finds the
    /// object gone, and a write makes it again under the same name (read back, not
    /// the unlinked file); writes and truncates in between are seen.
    #[test]
    fn kept_descriptors_see_every_change_and_no_destroyed_object() {
        let dir = std::env::temp_dir().join(format!("braid-oss-handles-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Ost::format(&dir).unwrap();
        let oss = Oss::new(vec![Ost { index: 0, dir: dir.clone(), uuid: "test".into() }]);
        let o = ObjectId { fid: Fid { seq: 0x200000400, oid: 7, ver: 0 }, component: 0, stripe: 1 };
        let read = |len: u32| oss.handle_blocking(Request::OstRead { ost: 0, object: o, offset: 0, len }, Bytes::new());
        let write = |b: &'static [u8]| {
            let a =
                oss.handle_blocking(Request::OstWrite { ost: 0, object: o, offset: 0, sync: false }, Bytes::from(b));
            assert!(matches!(a.0, Response::Written { .. }), "{:?}", a.0);
        };
        assert!(data(&read(16)).is_empty(), "an absent object reads as nothing");
        write(b"first bytes");
        assert_eq!(data(&read(16)), b"first bytes");
        write(b"FIRST");
        assert_eq!(data(&read(16)), b"FIRST bytes", "a second write is seen");
        let a = oss.handle_blocking(Request::OstPunch { ost: 0, object: o, size: 3 }, Bytes::new());
        assert!(matches!(a.0, Response::Ok), "{:?}", a.0);
        assert_eq!(data(&read(16)), b"FIR", "a truncate is seen");
        let a = oss.handle_blocking(Request::OstDestroy { ost: 0, object: o }, Bytes::new());
        assert!(matches!(a.0, Response::Ok), "{:?}", a.0);
        assert!(data(&read(16)).is_empty(), "a destroyed object reads as nothing");
        write(b"second");
        assert_eq!(data(&read(16)), b"second", "the object made again, not the unlinked one");
        // Many objects: the kept descriptors stay bounded.
        for stripe in 0..(KEPT_HANDLES_MAX as u32 + 50) {
            let o = ObjectId { stripe: stripe + 100, ..o };
            oss.handle_blocking(Request::OstWrite { ost: 0, object: o, offset: 0, sync: false }, Bytes::from("x"));
            let a = oss.handle_blocking(Request::OstRead { ost: 0, object: o, offset: 0, len: 1 }, Bytes::new());
            assert_eq!(data(&a), b"x");
        }
        assert!(oss.handles.inner.lock().unwrap().open.len() <= KEPT_HANDLES_MAX);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
