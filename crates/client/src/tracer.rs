//! The trace hook (capability C8): what a client operation leaves in the trace ring.
//!
//! Why here: the mount and the native client both pass their operations through it,
//! with the caller's pid, uid and gid, and the client knows where each went (the MDT of
//! a FID, the OST of a stripe). While tracing is off an operation costs the client's
//! look at its observer and one atomic load of the ring's switch; while on, clock
//! reads, a lookup of the caller's job (remembered per thread, read by a thread of its
//! own so that no operation waits on a process in `execve`) and 64 bytes written
//! into the shared-memory ring (see the `trace` crate's `ring`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Instant, UNIX_EPOCH};

use proto::Fid;
use trace::ring::{RingError, RingStats, RingWriter};
use trace::{Op, Record, Target, NO_JOB};

use crate::{OpObserver, OpRecord, OpenFile};

pub use crate::jobid::DEFAULT_JOBID_VAR;
use crate::jobid::{read_job, JobReader, JOBS_CACHED, JOB_TTL};

#[derive(Debug, Clone)]
pub struct TraceConfig {
    /// The ring file (in `/dev/shm`, shared with the collector).
    pub ring: PathBuf,
    pub capacity: u64,
    /// Recording from the start.
    pub enabled: bool,
    /// The environment variable of the calling process that names its job.
    pub jobid_var: String,
    /// How the ring names this client (host and mount point, say).
    pub client_name: String,
}

thread_local! {
    /// The process an operation runs for, set by the mount around each request.
    static CALLER: std::cell::Cell<Option<(u32, u32, u32)>> = const { std::cell::Cell::new(None) };
    /// The job this thread last found: (tracer, pid, when, job).
    static LAST_JOB: std::cell::Cell<Option<(usize, u32, Instant, u32)>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` (which runs client operations on this thread) on behalf of process `pid`
/// of user `uid` and group `gid`: their trace records name that caller. Without it,
/// a record names this process.
pub fn with_caller<T>(pid: u32, uid: u32, gid: u32, f: impl FnOnce() -> T) -> T {
    /// Puts the caller before back, also when `f` panics: the thread (a runtime's
    /// worker) goes on to run other work.
    struct Restore(Option<(u32, u32, u32)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CALLER.set(self.0);
        }
    }
    let _restore = Restore(CALLER.replace(Some((pid, uid, gid))));
    f()
}

/// `f`, run later (a task of its own) on behalf of the caller of now: its trace
/// records name the process that made the change the client answered, not this one.
pub(crate) fn as_caller<F: std::future::Future>(f: F) -> impl std::future::Future<Output = F::Output> {
    let who = CALLER.get();
    let mut f = Box::pin(f);
    std::future::poll_fn(move |cx| match who {
        Some((pid, uid, gid)) => with_caller(pid, uid, gid, || f.as_mut().poll(cx)),
        None => f.as_mut().poll(cx),
    })
}

fn caller() -> (u32, u32, u32) {
    // This process, asked once: three system calls an operation were most of what
    // tracing cost a native client.
    static PROCESS: std::sync::OnceLock<(u32, u32, u32)> = std::sync::OnceLock::new();
    CALLER.get().unwrap_or_else(|| {
        *PROCESS.get_or_init(|| {
            // SAFETY: getuid and getgid cannot fail.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            (std::process::id(), uid, gid)
        })
    })
}

/// The trace operation of a client operation, by the name it reports (see
/// [`crate::OPS`]); `None` for what is not an operation of the caller's.
pub fn op_of(name: &str) -> Option<Op> {
    Some(match name {
        // The frequent ones first: a string match is tried arm by arm.
        "read" => Op::Read,
        "write" => Op::Write,
        "getattr" | "glimpse_size" => Op::Getattr,
        "lookup" | "resolve" | "resolve_parent" => Op::Lookup,
        "open" => Op::Open,
        "close" => Op::Close,
        "create" => Op::Create,
        "flush" => Op::Flush,
        "setattr" | "truncate" => Op::Setattr,
        "mkdir" => Op::Mkdir,
        "symlink" => Op::Symlink,
        "mknod" => Op::Mknod,
        "readlink" => Op::Readlink,
        "link" => Op::Link,
        "unlink" => Op::Unlink,
        "rmdir" => Op::Rmdir,
        "rename" => Op::Rename,
        // A listing with its entries' attributes (the mount's READDIRPLUS) is a listing.
        "readdir" | "readdir_all" | "readdirplus" => Op::Readdir,
        "setxattr" | "setstripe" | "layout_change" | "migrate" | "mirror" => Op::Setxattr,
        "getxattr" | "getstripe" => Op::Getxattr,
        "listxattr" => Op::Listxattr,
        "removexattr" => Op::Removexattr,
        "punch" => Op::Fallocate,
        "fsync" | "sync_metadata" => Op::Fsync,
        "setlk" | "getlk" => Op::Lock,
        "statfs" | "target_usage" => Op::Statfs,
        _ => return None,
    })
}

impl OpObserver for Tracer {
    fn active(&self) -> bool {
        self.on()
    }

    fn record(&self, r: &OpRecord) {
        let Some(op) = op_of(r.op) else { return };
        let (pid, uid, gid) = caller();
        let fid = r.fid.unwrap_or(trace::NO_FID);
        let wall_ns = r.start.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let target = r.target.unwrap_or_else(|| if r.fid.is_some() { md_target(fid) } else { Target::None });
        let rec = Record {
            start_ns: wall_ns,
            dur_ns: r.duration.as_nanos().min(u32::MAX as u128) as u32,
            pid,
            uid,
            gid,
            fid,
            offset: r.offset,
            len: r.len,
            job: self.job_of(pid),
            op,
            errno: r.result.err().map_or(0, |e| trace::record::errno_byte(e.raw())),
            target,
        };
        self.ring.push(&rec);
    }
}

pub struct Tracer {
    ring: RingWriter,
    jobs_reader: JobReader<Option<String>>,
    /// pid -> (looked up at, job index).
    jobs: Mutex<HashMap<u32, (Instant, u32)>>,
}

impl Tracer {
    pub fn create(cfg: &TraceConfig) -> Result<Tracer, RingError> {
        let ring = RingWriter::create(&cfg.ring, cfg.capacity, &cfg.client_name, cfg.enabled)?;
        Ok(Tracer {
            ring,
            jobs_reader: {
                let var = cfg.jobid_var.clone();
                JobReader::start(move |pid| read_job(pid, &var))
            },
            jobs: Mutex::new(HashMap::new()),
        })
    }

    pub fn ring_path(&self) -> &std::path::Path {
        self.ring.path()
    }

    /// Whether operations are being recorded.
    pub fn on(&self) -> bool {
        self.ring.enabled()
    }

    pub fn set_on(&self, on: bool) {
        self.ring.set_enabled(on);
    }

    pub fn stats(&self) -> RingStats {
        self.ring.stats()
    }

    /// The job of process `pid`: the value of its `jobid_var`, read from
    /// `/proc/PID/environ` once in a while.
    fn job_of(&self, pid: u32) -> u32 {
        // The last answer on this thread first: a thread serves one process for long
        // stretches (a native client, always).
        let me = self as *const Tracer as usize;
        if let Some((t, p, at, job)) = LAST_JOB.get() {
            if t == me && p == pid && at.elapsed() < JOB_TTL {
                return job;
            }
        }
        // Not found in time: recorded without a job, and asked again next time.
        let Some(job) = self.job_lookup(pid) else { return NO_JOB };
        LAST_JOB.set(Some((me, pid, Instant::now(), job)));
        job
    }

    fn job_lookup(&self, pid: u32) -> Option<u32> {
        {
            let jobs = self.jobs.lock().expect("trace jobs");
            if let Some((at, job)) = jobs.get(&pid) {
                if at.elapsed() < JOB_TTL {
                    return Some(*job);
                }
            }
        }
        let job = self.jobs_reader.read(pid).ok()?.map_or(NO_JOB, |name| self.ring.job(&name));
        let mut jobs = self.jobs.lock().expect("trace jobs");
        if jobs.len() >= JOBS_CACHED {
            jobs.clear();
        }
        jobs.insert(pid, (Instant::now(), job));
        Some(job)
    }
}

/// The MDT holding `fid`'s metadata.
pub fn md_target(fid: Fid) -> Target {
    Target::Mdt(fid.mdt() as u16)
}

/// Where the byte at `offset` of an open file lives: the OST of its stripe, or the MDT
/// for Data-on-MDT.
pub fn data_target(f: &OpenFile, offset: u64) -> Target {
    let layout = f.layout();
    let Some(c) = layout.component_at(offset).map(|i| &layout.components[i]) else { return Target::None };
    if c.is_dom() {
        return md_target(f.fid);
    }
    if c.osts.is_empty() {
        return Target::None;
    }
    let (stripe, _) = c.map(offset);
    c.osts.get(stripe as usize).map_or(Target::None, |&ost| Target::Ost(ost as u16))
}
