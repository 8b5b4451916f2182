//! The OSS: serves OSTs, each a local directory of object files.
//!
//! An object is named by (FID, component, stripe) and stored as one file under one of
//! 256 fan-out directories (`objects/xx/`). It is created by its first write: no
//! precreation round trip. Reads of absent objects or of holes return zeros (short
//! reads at the object's end are completed with zeros by the client up to the file
//! size). Blocking file I/O runs on tokio's blocking pool so the network loop never
//! waits on the disk.

pub mod direct;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use proto::msg::{Request, Response, TargetKind, Usage};
use proto::{Errno, ObjectId};
use rpc::server::{Answer, RequestCtx, Service};
use rpc::target::TargetDir;

/// One OST: its index and its directory.
#[derive(Debug, Clone)]
pub struct Ost {
    pub index: u32,
    pub dir: PathBuf,
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
        Oss { osts: Arc::new(osts.into_iter().map(|o| (o.index, o)).collect()) }
    }

    pub fn targets(dirs: &[TargetDir]) -> Vec<Ost> {
        dirs.iter()
            .filter(|t| t.kind == TargetKind::Ost)
            .filter_map(|t| t.index.map(|index| Ost { index, dir: t.dir.clone() }))
            .collect()
    }

    fn ost(&self, index: u32) -> Result<Ost, Box<Response>> {
        self.osts
            .get(&index)
            .cloned()
            .ok_or_else(|| Box::new(Response::error(Errno::NoEnt, format!("OST {index} is not served here"))))
    }

    fn write(ost: &Ost, o: &ObjectId, offset: u64, data: &[u8], sync: bool) -> Response {
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > i64::MAX as u64) {
            return Response::error(Errno::Inval, "write beyond the largest object offset");
        }
        let path = ost.object_path(o);
        if !sync && direct::eligible(offset, data.len()) {
            match direct::write(&path, offset, data) {
                Ok(true) => return Response::Written { bytes: data.len() as u64 },
                Ok(false) => {} // no O_DIRECT here: buffered below
                Err(e) => return io_err("write", o, e),
            }
        }
        let f = match OpenOptions::new().write(true).create(true).truncate(false).open(&path) {
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

    fn read(ost: &Ost, o: &ObjectId, offset: u64, len: u32) -> Answer {
        if direct::eligible(offset, len as usize) {
            match direct::read(&ost.object_path(o), offset, len as usize) {
                Ok(Some(buf)) => return (Response::Data, vec![Bytes::from_owner(buf)]),
                Ok(None) => {} // no O_DIRECT here: buffered below
                Err(e) if e.kind() == ErrorKind::NotFound => return (Response::Data, vec![]),
                Err(e) => return (io_err("read", o, e), vec![]),
            }
        }
        let f = match File::open(ost.object_path(o)) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return (Response::Data, vec![]),
            Err(e) => return (io_err("open", o, e), vec![]),
        };
        // Read into uninitialised capacity: no zero-fill of a buffer about to be
        // overwritten.
        let mut buf = BytesMut::with_capacity(len as usize);
        let mut got = 0usize;
        while got < len as usize {
            let spare = buf.spare_capacity_mut();
            debug_assert!(spare.len() >= len as usize);
            // SAFETY: pread writes at most `len - got` bytes, inside the spare capacity
            // (at least `len`); `set_len` below covers only bytes it reported written.
            let n = unsafe {
                libc::pread(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    spare.as_mut_ptr().add(got).cast(),
                    len as usize - got,
                    (offset + got as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return (io_err("read", o, e), vec![]);
            }
            if n == 0 {
                break;
            }
            got += n as usize;
        }
        // SAFETY: the first `got` bytes were written by pread above.
        unsafe { buf.set_len(got) };
        (Response::Data, vec![buf.freeze()])
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

    fn destroy(ost: &Ost, o: &ObjectId) -> Response {
        match std::fs::remove_file(ost.object_path(o)) {
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
                Ok(t) => simple(Self::write(&t, &object, offset, &payload, sync)),
                Err(r) => simple(*r),
            },
            Request::OstRead { ost, object, offset, len } => match ost_of(ost) {
                Ok(t) if len <= 16 << 20 => Self::read(&t, &object, offset, len),
                Ok(_) => simple(Response::error(Errno::Inval, format!("read of {len} bytes exceeds 16 MiB"))),
                Err(r) => simple(*r),
            },
            Request::OstPunch { ost, object, size } => {
                simple(ost_of(ost).map_or_else(|r| *r, |t| Self::punch(&t, &object, size)))
            }
            Request::OstDestroy { ost, object } => {
                simple(ost_of(ost).map_or_else(|r| *r, |t| Self::destroy(&t, &object)))
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

impl Service for Oss {
    async fn handle(self: &Oss, _ctx: RequestCtx, req: Request, payload: Bytes) -> Answer {
        // A small read is served inline: from the page cache it takes microseconds,
        // less than the two thread wake-ups of a trip through the blocking pool (which
        // were most of a 4 KiB random read's latency); a miss holds this thread for one
        // disk read.
        if matches!(req, Request::OstRead { len, .. } if len <= INLINE_READ_MAX) {
            return self.handle_blocking(req, payload);
        }
        // Other file I/O blocks: run it on the blocking pool with a cheap handle to the OSTs.
        let oss = Oss { osts: self.osts.clone() };
        match tokio::task::spawn_blocking(move || oss.handle_blocking(req, payload)).await {
            Ok(a) => a,
            Err(e) => (Response::error(Errno::Io, format!("OSS worker failed: {e}")), vec![]),
        }
    }
}

/// Serves on `listener`.
pub async fn serve(oss: Arc<Oss>, listener: tokio::net::TcpListener, server: rpc::server::ServerConfig) {
    rpc::server::serve(listener, Arc::new(server), oss).await
}
