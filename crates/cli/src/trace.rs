//! `braid trace`: the I/O tracer's processes and tools (capability C8, seed 001).
//!
//! - A mount records into its trace ring (the client's `tracer`); turning tracing on
//!   (`-o trace`, or `braid trace on MOUNTPOINT` through the mount's root) starts a
//!   collector process, `braid trace collect`, which drains the ring and ships batches
//!   to a collection server (`braid trace serve`, `-o trace_server=HOST:PORT`) or
//!   stores them itself (`-o trace_dir=DIR`). The mount restarts a collector that
//!   died; a collector ends once its mount has and the ring is drained.
//! - `braid trace show|stats|export` read a stored trace (the server's directory).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use client::tracer::{TraceConfig, Tracer, DEFAULT_JOBID_VAR};
use proto::msg::{Request, Response};
use proto::Errno;
use rpc::service::{Answer, RequestCtx};
use trace::analysis::{self, Filter, Stats};
use trace::ring::{RingReader, DEFAULT_CAPACITY};
use trace::store::{Batch, Store, StoreLimits, MAX_BATCH_RECORDS};
use trace::{Op, Record, NO_JOB, RECORD_BYTES};

/// Where stored traces go when a mount names no destination.
pub const DEFAULT_TRACE_DIR: &str = "/var/tmp/braid-trace";
/// Records a collector ships at once, at most (1 MiB).
const BATCH_RECORDS: usize = 16 << 10;
/// A batch goes out at least this often while records come in.
const BATCH_EVERY: Duration = Duration::from_millis(100);
/// How long a collector that caught up waits before looking again.
const POLL: Duration = Duration::from_millis(5);

/// Where a mount's collector sends what it collects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    Dir(PathBuf),
    Server(String),
}

/// The tracing options of a mount (`trace`, `trace_dir=`, `trace_server=`,
/// `jobid_var=`, `trace_ring=`).
#[derive(Debug, Clone)]
pub struct TraceSettings {
    /// Recording from the start (`-o trace`).
    pub on: bool,
    pub destination: Destination,
    pub jobid_var: String,
    /// Records the ring holds.
    pub capacity: u64,
    /// Instead of the ring, a synchronous logger into this file (`-o trace_sync=FILE`,
    /// for the benchmark's contrast).
    pub sync_log: Option<PathBuf>,
}

impl Default for TraceSettings {
    fn default() -> Self {
        TraceSettings {
            on: false,
            destination: Destination::Dir(PathBuf::from(DEFAULT_TRACE_DIR)),
            jobid_var: DEFAULT_JOBID_VAR.into(),
            capacity: DEFAULT_CAPACITY,
            sync_log: None,
        }
    }
}

/// The directory of trace rings: shared memory where there is one.
fn ring_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    pid != 0
        && (unsafe { libc::kill(pid as i32, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// Removes the rings of mounts that died without a collector to drain them.
fn clean_stale_rings(dir: &Path) {
    let Ok(list) = std::fs::read_dir(dir) else { return };
    for e in list.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("braid-trace-")?.strip_suffix(".ring")?.parse().ok())
        else {
            continue;
        };
        if !pid_alive(pid) && RingReader::open(&e.path()).is_ok() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The client's trace configuration for a mount of this process named `client_name`.
pub fn client_trace_config(t: &TraceSettings, client_name: &str) -> TraceConfig {
    let dir = ring_dir();
    clean_stale_rings(&dir);
    TraceConfig {
        ring: dir.join(format!("braid-trace-{}.ring", std::process::id())),
        capacity: t.capacity,
        enabled: t.on,
        jobid_var: t.jobid_var.clone(),
        client_name: client_name.to_string(),
    }
}

/// Sets up the tracing of `client` as `t` asks: the ring and its collector (the
/// returned switch), or a synchronous logger.
pub fn hook(
    client: &client::Client,
    t: &TraceSettings,
    secret_file: Option<PathBuf>,
) -> Result<Option<Arc<MountTrace>>> {
    if let Some(f) = &t.sync_log {
        client.set_observer(Some(Arc::new(SyncLogger::create(f)?)));
        return Ok(None);
    }
    Ok(MountTrace::attach(client, t, secret_file))
}

/// Tracing for a native client, from the trace options in `BRAID_CLIENT_OPTIONS`
/// (kept for the life of the process).
pub fn hook_native(client: &client::Client, t: &TraceSettings) -> Result<()> {
    static NATIVE: std::sync::OnceLock<Option<Arc<MountTrace>>> = std::sync::OnceLock::new();
    let secret = std::env::var_os("BRAID_SECRET_FILE").map(PathBuf::from);
    let mt = hook(client, t, secret)?;
    let _ = NATIVE.set(mt);
    Ok(())
}

/// Whether `t` asks for anything (a native client has no ring otherwise).
pub fn wanted(t: &TraceSettings) -> bool {
    t.on || t.sync_log.is_some()
}

/// A mount's side of `braid trace`: the switch, and the collector it keeps running.
pub struct MountTrace {
    tracer: Arc<Tracer>,
    destination: Destination,
    secret_file: Option<PathBuf>,
    /// The TLS files of the mount, which its collector ships with too.
    tls_dir: Option<PathBuf>,
    collector: Mutex<Option<Child>>,
}

impl MountTrace {
    /// Hooks the tracer of `client` (if it has a ring) into it, and starts the
    /// collector if tracing is on from the start.
    pub fn attach(client: &client::Client, t: &TraceSettings, secret_file: Option<PathBuf>) -> Option<Arc<MountTrace>> {
        let tracer = client.tracer()?.clone();
        client.set_observer(Some(tracer.clone()));
        let mt = Arc::new(MountTrace {
            tracer,
            destination: t.destination.clone(),
            secret_file,
            tls_dir: client.client_config().tls.as_ref().map(|t| t.dir.0.clone()),
            collector: Mutex::new(None),
        });
        if t.on {
            if let Err(e) = mt.ensure_collector() {
                tracing::warn!("trace collector: {e}");
            }
        }
        // Restarts a collector that died while tracing is on.
        let weak = Arc::downgrade(&mt);
        std::thread::Builder::new()
            .name("braid-trace-watch".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_secs(1));
                let Some(mt) = weak.upgrade() else { return };
                if mt.tracer.on() {
                    if let Err(e) = mt.ensure_collector() {
                        tracing::warn!("trace collector: {e}");
                    }
                }
            })
            .ok();
        Some(mt)
    }

    fn ensure_collector(&self) -> Result<()> {
        let mut c = self.collector.lock().expect("collector");
        if let Some(child) = c.as_mut() {
            match child.try_wait() {
                Ok(None) => return Ok(()),
                Ok(Some(status)) => tracing::warn!("trace collector exited ({status}); starting another"),
                Err(e) => tracing::warn!("trace collector: {e}"),
            }
        }
        let exe = std::env::current_exe().context("cannot find the braid executable")?;
        let mut cmd = Command::new(exe);
        cmd.arg("trace").arg("collect").arg("--ring").arg(self.tracer.ring_path());
        match &self.destination {
            Destination::Dir(d) => cmd.arg("--dir").arg(d),
            Destination::Server(s) => cmd.arg("--server").arg(s),
        };
        if let Some(s) = &self.secret_file {
            cmd.arg("--secret-file").arg(s);
        }
        if let Some(d) = &self.tls_dir {
            cmd.arg("--tls-dir").arg(d);
        }
        // Its messages go where the mount's go.
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        let child = cmd.spawn().context("cannot start the trace collector")?;
        tracing::info!(pid = child.id(), ring = %self.tracer.ring_path().display(), "trace collector started");
        *c = Some(child);
        Ok(())
    }

    /// At unmount: recording stops; a collector drains the rest and ends by itself,
    /// and without one the ring goes now.
    pub fn detach(&self) {
        self.tracer.set_on(false);
        let running =
            self.collector.lock().expect("collector").as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)));
        if !running {
            let _ = std::fs::remove_file(self.tracer.ring_path());
        }
    }
}

impl fuse::TraceControl for MountTrace {
    fn set(&self, on: bool) -> std::result::Result<(), String> {
        if on {
            self.ensure_collector().map_err(|e| format!("{e:#}"))?;
        }
        self.tracer.set_on(on);
        Ok(())
    }

    fn status(&self) -> Vec<u8> {
        let s = self.tracer.stats();
        let collector = self.collector.lock().expect("collector").as_mut().and_then(|c| match c.try_wait() {
            Ok(None) => Some(c.id()),
            _ => None,
        });
        let dest = match &self.destination {
            Destination::Dir(d) => serde_json::json!({ "dir": d }),
            Destination::Server(a) => serde_json::json!({ "server": a }),
        };
        serde_json::to_vec(&serde_json::json!({
            "enabled": s.enabled,
            "ring": self.tracer.ring_path(),
            "capacity": s.capacity,
            "written": s.written,
            "collected": s.collected,
            "dropped": s.dropped,
            "collector_pid": collector,
            "destination": dest,
        }))
        .expect("encoding trace status cannot fail")
    }
}

// ---- collector ----

enum Sink {
    Dir(Store),
    Server { rt: tokio::runtime::Runtime, rpc: rpc::RpcClient },
}

impl Sink {
    fn ship(&mut self, b: &Batch) -> Result<()> {
        match self {
            Sink::Dir(store) => store.append(b).map_err(Into::into),
            Sink::Server { rt, rpc } => {
                let payload = Bytes::from(b.encode());
                let r = rt.block_on(rpc.call(&Request::TraceBatch, vec![payload]))?;
                match r.response {
                    Response::Ok => Ok(()),
                    Response::Error(e) => bail!("the trace server refused a batch: {e:?}"),
                    other => bail!("unexpected answer from the trace server: {other:?}"),
                }
            }
        }
    }
}

pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// `braid trace collect`: drains the ring at `ring` until its writer has ended and
/// the ring is empty, shipping batches to `server` or storing them in `dir`.
pub fn collect(
    ring: &Path,
    dir: Option<&Path>,
    server: Option<&str>,
    secret_file: Option<PathBuf>,
    tls_dir: Option<&Path>,
) -> Result<()> {
    let mut reader = RingReader::open(ring)?;
    let mut sink = match (dir, server) {
        (Some(d), None) => {
            // Each collector its own subdirectory: several write one trace directory.
            let sub = d.join(format!("{}-{}", host_name(), std::process::id()));
            Sink::Dir(Store::open(&sub, StoreLimits::default())?)
        }
        (None, Some(addr)) => {
            let secret = crate::client_secret(&secret_file)?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let opts = rpc::RpcOptions { recovery_timeout: Duration::from_secs(5), ..Default::default() };
            let identity = rpc::Identity::with_tls("trace-collector", secret, crate::client_tls(tls_dir)?);
            let rpc = rpc::RpcClient::new(addr.to_string(), identity, opts);
            Sink::Server { rt, rpc }
        }
        _ => bail!("give the collector either --dir DIR or --server HOST:PORT"),
    };
    let client = reader.client();
    let writer = reader.writer_pid();
    tracing::info!(ring = %ring.display(), %client, writer, "collecting");
    let mut buf = Vec::with_capacity(BATCH_RECORDS * RECORD_BYTES);
    let mut lost = 0u64;
    let mut dropped_seen = reader.stats().dropped;
    let mut since = Instant::now();
    let mut failures = 0u32;
    let mut writer_gone = false;
    let mut last_check = Instant::now();
    loop {
        let room = BATCH_RECORDS - buf.len() / RECORD_BYTES;
        let d = reader.drain(room, &mut buf);
        lost += d.lost;
        if last_check.elapsed() >= BATCH_EVERY {
            writer_gone = !pid_alive(writer);
            last_check = Instant::now();
        }
        let s = reader.stats();
        let empty = s.collected >= s.written;
        let full = buf.len() / RECORD_BYTES >= BATCH_RECORDS;
        if full || (!buf.is_empty() && since.elapsed() >= BATCH_EVERY) || (writer_gone && empty) {
            let dropped = s.dropped;
            let batch = Batch {
                client: client.clone(),
                jobs: job_names(&reader, &buf),
                lost: lost + dropped.saturating_sub(dropped_seen),
                records: std::mem::take(&mut buf),
            };
            if !batch.is_empty() || batch.lost > 0 {
                match sink.ship(&batch) {
                    Ok(()) => {
                        lost = 0;
                        dropped_seen = dropped;
                        failures = 0;
                    }
                    Err(e) => {
                        // Keep the batch and try again; meanwhile the ring fills and
                        // the mount drops (and counts) what does not fit.
                        failures += 1;
                        tracing::warn!("trace batch of {} records not shipped: {e:#}", batch.len());
                        if writer_gone && failures >= 5 {
                            bail!("the trace destination is unreachable and the mount has ended");
                        }
                        buf = batch.records;
                        std::thread::sleep(Duration::from_millis(500).min(Duration::from_millis(100) * failures));
                        continue;
                    }
                }
            }
            since = Instant::now();
        }
        if writer_gone && empty && buf.is_empty() {
            let _ = std::fs::remove_file(ring);
            tracing::info!(ring = %ring.display(), "the mount ended; collector done");
            return Ok(());
        }
        if d.records < room {
            // Caught up: let records gather rather than spin on a core the mount
            // needs (a full ring of 65,536 takes tens of milliseconds to fill even at
            // a million operations a second).
            std::thread::sleep(POLL);
        }
    }
}

/// The names of the jobs `records` refer to.
fn job_names(reader: &RingReader, records: &[u8]) -> Vec<(u32, String)> {
    let mut seen: Vec<u32> = records
        .chunks(RECORD_BYTES)
        .map(|r| u32::from_le_bytes(r[56..60].try_into().expect("4 bytes")))
        .filter(|&j| j != NO_JOB)
        .collect();
    seen.sort_unstable();
    seen.dedup();
    seen.into_iter().filter_map(|j| reader.job_name(j).map(|n| (j, n))).collect()
}

// ---- collection server ----

struct TraceServer {
    store: Mutex<Store>,
}

impl rpc::server::Service for TraceServer {
    async fn handle(&self, _ctx: RequestCtx, req: Request, payload: Bytes) -> Answer {
        let resp = match req {
            Request::TraceBatch => match Batch::decode(&payload) {
                Ok(b) if b.len() <= MAX_BATCH_RECORDS => match self.store.lock().expect("trace store").append(&b) {
                    Ok(()) => Response::Ok,
                    Err(e) => {
                        tracing::warn!("{e}");
                        Response::error(Errno::Io, format!("{e}"))
                    }
                },
                Ok(_) => Response::error(Errno::Inval, "trace batch too large".to_string()),
                Err(e) => Response::error(Errno::Inval, format!("{e}")),
            },
            Request::Ping => Response::Ok,
            other => Response::error(Errno::Proto, format!("a trace server does not serve {}", other.op_name())),
        };
        (resp, vec![])
    }
}

/// `braid trace serve`: stores what collectors ship in `dir`, until signalled;
/// segments close at `segment_size` and the oldest go past `max_size` (sizes with
/// K, M, G, T suffixes).
pub fn serve(
    dir: &Path,
    listen: &str,
    secret: proto::auth::Secret,
    tls: Option<Arc<rpc::tls::TlsContext>>,
    segment_size: &str,
    max_size: &str,
) -> Result<()> {
    let size = |s: &str, what: &str| {
        cache::parse_size(s)
            .filter(|&n| n >= 4096)
            .with_context(|| format!("--{what}: '{s}' is not a size of at least 4K"))
    };
    let limits =
        StoreLimits { segment_bytes: size(segment_size, "segment-size")?, total_bytes: size(max_size, "max-size")? };
    let store = Store::open(&dir.join("server"), limits)?;
    let rt = crate::runtime()?;
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
        let addr = l.local_addr()?;
        let svc = Arc::new(TraceServer { store: Mutex::new(store) });
        tokio::spawn(rpc::server::serve(
            l,
            Arc::new(rpc::server::ServerConfig::new("trace", secret).with_tls(tls)),
            svc,
        ));
        println!("trace server at {addr}, storing in {}", dir.display());
        let _ = std::io::stdout().flush();
        let sig = crate::serve::until_signal().await?;
        tracing::info!("trace server stopping on {sig}");
        Ok(())
    })
}

// ---- tools on a stored trace ----

/// Reads the trace in `dir`, handing each entry `filter` lets through to `each`;
/// says on stderr what was damaged or lost.
fn read_filtered(dir: &Path, filter: &Filter, mut each: impl FnMut(&trace::store::Entry)) -> Result<()> {
    if !dir.is_dir() {
        bail!("{} is not a trace directory", dir.display());
    }
    let mut report = trace::store::ReadReport::default();
    let mut add = |r: trace::store::ReadReport| {
        report.segments += r.segments;
        report.batches += r.batches;
        report.lost += r.lost;
        report.damaged_blocks += r.damaged_blocks;
        report.torn += r.torn;
        report.foreign.extend(r.foreign);
    };
    // The directory itself, then each writer's subdirectory (a server's, collectors').
    let mut dirs = vec![dir.to_path_buf()];
    let mut subs: Vec<PathBuf> = std::fs::read_dir(dir)?.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    subs.sort();
    dirs.extend(subs);
    let mut entries = Vec::new();
    for d in &dirs {
        add(trace::store::read(d, |e| {
            if filter.matches(&e) {
                entries.push(e);
            }
        })?);
    }
    // Several writers: one time line.
    entries.sort_by_key(|e| e.record.start_ns);
    entries.iter().for_each(&mut each);
    if report.lost > 0 {
        eprintln!(
            "braid trace: {} records were lost before they were stored (ring full or a writer died)",
            report.lost
        );
    }
    if report.damaged_blocks > 0 || report.torn > 0 {
        eprintln!(
            "braid trace: skipped {} damaged block(s) and {} torn segment end(s)",
            report.damaged_blocks, report.torn
        );
    }
    for f in &report.foreign {
        eprintln!("braid trace: {f} is not a trace segment; skipped");
    }
    Ok(())
}

/// Filters as `braid trace show|stats|export` take them.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct FilterArgs {
    /// Only this job.
    #[arg(long)]
    pub job: Option<String>,
    /// Only this user id.
    #[arg(long)]
    pub uid: Option<u32>,
    /// Only this file (its FID, as `[0x200000401:0x1:0x0]`).
    #[arg(long)]
    pub fid: Option<String>,
    /// Only this operation (read, write, open, create, ...).
    #[arg(long)]
    pub op: Option<String>,
    /// Only this client (as the ring named it, host:mountpoint).
    #[arg(long)]
    pub client: Option<String>,
    /// Only operations started at or after this time (seconds since the epoch).
    #[arg(long)]
    pub since: Option<f64>,
    /// Only operations started before this time (seconds since the epoch).
    #[arg(long)]
    pub until: Option<f64>,
}

impl FilterArgs {
    fn filter(&self) -> Result<Filter> {
        let secs = |s: f64| -> Result<u64> {
            if !(0.0..1e11).contains(&s) {
                bail!("{s} is not a time in seconds since the epoch");
            }
            Ok((s * 1e9) as u64)
        };
        Ok(Filter {
            job: self.job.clone(),
            uid: self.uid,
            fid: self
                .fid
                .as_deref()
                .map(|f| analysis::parse_fid(f).with_context(|| format!("'{f}' is not a FID ([SEQ:OID:VER])")))
                .transpose()?,
            op: self
                .op
                .as_deref()
                .map(|o| {
                    Op::from_name(o).with_context(|| {
                        let names: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
                        format!("unknown operation '{o}' (known: {})", names.join(", "))
                    })
                })
                .transpose()?,
            client: self.client.clone(),
            since_ns: self.since.map(secs).transpose()?,
            until_ns: self.until.map(secs).transpose()?,
        })
    }
}

/// `braid trace show`: one `OPLOG:` line per operation.
pub fn show(dir: &Path, f: &FilterArgs) -> Result<()> {
    let filter = f.filter()?;
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let mut err = None;
    read_filtered(dir, &filter, |e| {
        if err.is_none() {
            err = writeln!(out, "{}", analysis::oplog_line(e)).err();
        }
    })?;
    match err {
        Some(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Some(e) => Err(e.into()),
        None => out
            .flush()
            .or_else(|e| if e.kind() == std::io::ErrorKind::BrokenPipe { Ok(()) } else { Err(e) })
            .map_err(Into::into),
    }
}

/// `braid trace stats`.
pub fn stats(dir: &Path, f: &FilterArgs) -> Result<()> {
    let filter = f.filter()?;
    let mut s = Stats::default();
    read_filtered(dir, &filter, |e| s.add(e))?;
    print!("{}", s.render());
    Ok(())
}

/// `braid trace export --csv|--json`.
pub fn export(dir: &Path, f: &FilterArgs, json: bool) -> Result<()> {
    let filter = f.filter()?;
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    if !json {
        writeln!(out, "{}", analysis::CSV_HEADER)?;
    }
    let mut err = None;
    read_filtered(dir, &filter, |e| {
        if err.is_none() {
            let line = if json { analysis::json_line(e) } else { analysis::csv_line(e) };
            err = writeln!(out, "{line}").err();
        }
    })?;
    if let Some(e) = err {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e.into());
        }
    }
    let _ = out.flush();
    Ok(())
}

/// `braid trace plot`: `offsets.svg` (each file's offsets over time) and `jobs.svg`
/// (each job's operations per second) in `out`.
pub fn plot(dir: &Path, f: &FilterArgs, out: &Path, files: usize) -> Result<()> {
    let filter = f.filter()?;
    let mut entries = Vec::new();
    read_filtered(dir, &filter, |e| entries.push(e.clone()))?;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    for (name, svg) in
        [("offsets.svg", trace::plot::offsets(&entries, files)), ("jobs.svg", trace::plot::jobs(&entries, 60))]
    {
        let p = out.join(name);
        std::fs::write(&p, svg).with_context(|| format!("cannot write {}", p.display()))?;
        println!("{}", p.display());
    }
    Ok(())
}

/// A synchronous logger for contrast (seed 001's Figures 4 and 5: PVFS's own logging):
/// each record formatted and written to a file before the operation returns.
pub struct SyncLogger {
    file: Mutex<std::fs::File>,
}

impl SyncLogger {
    pub fn create(path: &Path) -> Result<SyncLogger> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        // The records are the owner's alone, as in a ring: 0600, not through a symlink.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot chmod {}", path.display()))?;
        Ok(SyncLogger { file: Mutex::new(file) })
    }
}

impl client::OpObserver for SyncLogger {
    fn record(&self, r: &client::OpRecord) {
        let Some(op) = client::tracer::op_of(r.op) else { return };
        let start_ns = r.start.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let rec = Record {
            start_ns,
            dur_ns: r.duration.as_nanos().min(u32::MAX as u128) as u32,
            pid: std::process::id(),
            uid: 0,
            gid: 0,
            fid: r.fid.unwrap_or(trace::NO_FID),
            offset: r.offset,
            len: r.len,
            job: NO_JOB,
            op,
            errno: 0,
            target: r.target.unwrap_or(trace::Target::None),
        };
        let e = trace::store::Entry { record: rec, client: Arc::from("sync"), job: None };
        let line = analysis::oplog_line(&e);
        let mut f = self.file.lock().expect("sync log");
        let _ = writeln!(f, "{line}");
    }
}
