//! `braid mount`, `braid umount`, and finding the cluster behind a path inside a mount.
//! How a FUSE mount is made and taken off is the `fuse` crate's ([`fuse::mount`]);
//! this module parses `-o`, connects the client, and runs the mount in the
//! foreground or as a background process.
//!
//! A mount's source is `braid@MGS_ADDRESS` and its type `fuse` (or `fuse.braid`), so any tool can
//! tell from `/proc/self/mountinfo` which cluster a path belongs to. The mount also
//! records the secret file it used under `/run/braid/` (readable by root only), so
//! tools run on a mounted path find the secret without being told.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use client::{BlockingClient, ClientConfig};

use crate::url::BraidPath;

/// Where mounts record the secret file they use.
const RUN_DIR: &str = "/run/braid";

/// `braid mount`.
#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// braid://HOST:PORT/ of the MGS.
    pub url: String,
    pub mountpoint: PathBuf,
    /// Stay in the foreground (otherwise return once the mount is ready).
    #[arg(short = 'f')]
    pub foreground: bool,
    /// Options: attr_timeout=S, entry_timeout=S, allow_other, direct_io, ro, noexec, threads=N, timeout=S, max_write=BYTES, readahead_kb=KIB, dir_leases=0|1, statahead=0|1, short_circuit (read and write the objects of OSTs served on this machine directly), cache_dir=PATH, cache_size=SIZE (an SSD read cache), passthrough (files the cache holds whole are read by the kernel from it), jobid_var=NAME|procname_uid|disable (the job id requests carry), metrics=HOST:PORT (Prometheus metrics), secret_file=FILE and log=FILE (as --secret-file and --log, for /etc/fstab).
    #[arg(short = 'o')]
    pub options: Vec<String>,
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Log file of a background mount.
    #[arg(long)]
    pub log: Option<PathBuf>,
}

/// Runs `braid mount`: in this process with `-f`, else in a background process.
pub fn run(a: MountArgs) -> Result<()> {
    let settings = parse_options(&a.options)?;
    no_page_cache(&settings)?;
    let secret_file = given_once("--secret-file", "secret_file", a.secret_file, settings.secret_file.clone())?;
    let log = given_once("--log", "log", a.log, settings.log.clone())?;
    // Said at once, before the cluster is asked anything (which may take a while).
    check_mount_point(&a.mountpoint)?;
    if a.foreground {
        mount_foreground(&a.url, &a.mountpoint, settings, secret_file)
    } else {
        // The background process gets these as flags (resolved to absolute paths).
        let options = without_keys(&a.options, &["secret_file", "log"]);
        mount_background(&a.url, &a.mountpoint, &options, secret_file, log)
    }
}

/// A setting given as a flag or as an `-o` option (the way `/etc/fstab` can give
/// it): either, or both if they agree.
fn given_once(
    flag: &str,
    option: &str,
    by_flag: Option<PathBuf>,
    by_option: Option<PathBuf>,
) -> Result<Option<PathBuf>> {
    match (by_flag, by_option) {
        (Some(f), Some(o)) if std::path::absolute(&f).ok().as_ref() != Some(&o) => {
            bail!("{flag} {} and -o {option}={} disagree: give one of them", f.display(), o.display())
        }
        (f, o) => Ok(f.or(o)),
    }
}

/// `-o` lists without the options named in `keys`.
fn without_keys(options: &[String], keys: &[&str]) -> Vec<String> {
    options
        .iter()
        .map(|list| {
            let kept = list.split(',').filter(|o| !keys.contains(&o.split_once('=').map_or(*o, |(k, _)| k)));
            kept.collect::<Vec<_>>().join(",")
        })
        .filter(|list| !list.is_empty())
        .collect()
}

/// A mount point must be an existing directory, and not a braid mount already: a
/// second mount would hide the first (and a background mount would take the first
/// for itself, ready); mount(8) refuses the same for a device already mounted there.
pub fn check_mount_point(mountpoint: &Path) -> Result<()> {
    let target = std::fs::canonicalize(mountpoint).unwrap_or(mountpoint.to_path_buf());
    if let Some(m) = braid_mounts().into_iter().find(|m| m.mountpoint == target) {
        bail!("{} is already a braid mount (of braid@{}); unmount it first", mountpoint.display(), m.mgs);
    }
    match std::fs::metadata(mountpoint) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!("mount point {} is not a directory", mountpoint.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("mount point {} does not exist (create the directory first)", mountpoint.display())
        }
        Err(e) => bail!("cannot use mount point {}: {e}", mountpoint.display()),
    }
}

/// How long a first mount waits for the cluster before saying that it is retrying.
const SLOW_CONNECT: Duration = Duration::from_secs(2);

/// Parsed `-o` options of `braid mount`: the FUSE mount's and its client's.
#[derive(Debug, Clone)]
pub struct MountSettings {
    pub fuse: fuse::MountOptions,
    pub timeout_s: u64,
    /// Directory leases (see the client's `lease` module): on unless `dir_leases=0`.
    pub dir_leases: bool,
    /// Statahead (see the client's `statahead` module): on unless `statahead=0`.
    pub statahead: bool,
    /// The SSD read cache (`cache_dir=PATH,cache_size=SIZE`; see the `cache` crate).
    pub cache: Option<cache::CacheConfig>,
    /// `page_cache=SIZE`: bytes of read data a native client keeps in memory (a mount
    /// has the kernel's page cache instead).
    pub page_cache: u64,
    /// `ost_limit=RATE`: most bytes per second to and from OSTs; `ost_latency=MS`: the
    /// least time of each OST transfer (benchmarks; see the client's `throttle`).
    pub ost_limit: Option<u64>,
    pub ost_latency: Duration,
    /// The I/O tracer (`trace`, `trace_dir=`, `trace_server=`, `jobid_var=`,
    /// `trace_ring=`; see [`crate::trace`]).
    pub trace: crate::trace::TraceSettings,
    /// `short_circuit`: read and write objects of OSTs served on this machine through
    /// descriptors their OSS hands over (see the client's `short_circuit` module).
    pub short_circuit: bool,
    /// `tls_dir=DIR`: connect over TLS with the files there (else `BRAID_TLS_DIR`).
    pub tls_dir: Option<PathBuf>,
    /// `metrics=HOST:PORT`: serve the mount's Prometheus metrics there.
    pub metrics: Option<String>,
    /// `secret_file=FILE` and `log=FILE`: as `--secret-file` and `--log`, for mounts
    /// whose only place for settings is `-o` (`/etc/fstab`, a systemd `.mount` unit).
    pub secret_file: Option<PathBuf>,
    pub log: Option<PathBuf>,
}

/// Size of an SSD cache given a directory and no size.
pub const DEFAULT_CACHE_SIZE: u64 = 1 << 30;

impl MountSettings {
    /// The client settings of a mount of the cluster at `mgs`.
    pub fn client_config(&self, mgs: &str, secret: client::Secret) -> Result<ClientConfig> {
        let mut cfg = ClientConfig::new(mgs, secret);
        cfg.tls = crate::client_tls(self.tls_dir.as_deref())?;
        cfg.rpc.recovery_timeout = Duration::from_secs(self.timeout_s);
        cfg.dir_leases = self.dir_leases;
        cfg.statahead = self.statahead;
        cfg.cache = self.cache.clone();
        cfg.page_cache = self.page_cache;
        cfg.ost_limit = self.ost_limit;
        cfg.ost_latency = self.ost_latency;
        cfg.short_circuit = self.short_circuit;
        Ok(cfg)
    }
}

pub fn parse_options(list: &[String]) -> Result<MountSettings> {
    let mut s = MountSettings {
        fuse: fuse::MountOptions::default(),
        timeout_s: 60,
        dir_leases: true,
        statahead: true,
        cache: None,
        page_cache: 0,
        ost_limit: None,
        ost_latency: Duration::ZERO,
        trace: crate::trace::TraceSettings::default(),
        short_circuit: false,
        tls_dir: None,
        metrics: None,
        secret_file: None,
        log: None,
    };
    let mut cache_size = None;
    for opt in list.iter().flat_map(|o| o.split(',')).filter(|o| !o.is_empty()) {
        let (k, v) = opt.split_once('=').map_or((opt, None), |(k, v)| (k, Some(v)));
        let num = |v: Option<&str>| -> Result<f64> {
            v.context(format!("option {k} needs a value"))?
                .parse::<f64>()
                .with_context(|| format!("option {opt}: not a number"))
        };
        match k {
            "attr_timeout" => s.fuse.attr_ttl = Duration::from_secs_f64(num(v)?.max(0.0)),
            "entry_timeout" => s.fuse.entry_ttl = Duration::from_secs_f64(num(v)?.max(0.0)),
            "allow_other" => s.fuse.allow_other = true,
            "direct_io" => s.fuse.direct_io = true,
            "passthrough" => s.fuse.passthrough = true,
            "ro" => s.fuse.read_only = true,
            "rw" => s.fuse.read_only = false,
            "noexec" => s.fuse.no_exec = true,
            "exec" => s.fuse.no_exec = false,
            "threads" => s.fuse.threads = (num(v)? as usize).clamp(1, 64),
            "timeout" => s.timeout_s = (num(v)? as u64).max(1),
            "max_write" => s.fuse.max_write_bytes = (num(v)? as u32).clamp(4096, 1 << 20),
            "readahead_kb" => s.fuse.readahead_kb = (num(v)? as u32).clamp(4, 1 << 20),
            "dir_leases" => s.dir_leases = switch(k, v)?,
            "statahead" => s.statahead = switch(k, v)?,
            "short_circuit" => s.short_circuit = switch(k, v)?,
            "tls_dir" => {
                let dir = v.filter(|d| !d.is_empty()).context("option tls_dir needs a directory")?;
                s.tls_dir = Some(std::path::absolute(dir).with_context(|| format!("option {opt}"))?);
            }
            "cache_dir" => {
                let dir = v.filter(|d| !d.is_empty()).context("option cache_dir needs a directory")?;
                let dir = std::path::absolute(dir).with_context(|| format!("option {opt}"))?;
                s.cache = Some(cache::CacheConfig { dir, size: DEFAULT_CACHE_SIZE });
            }
            "cache_size" => {
                let size = v.and_then(cache::parse_size).with_context(|| {
                    format!("option {opt}: a size in bytes with an optional K, M, G or T (e.g. cache_size=20G)")
                })?;
                if size < cache::MIN_SIZE {
                    bail!("option {opt}: the cache needs at least {} bytes (1M)", cache::MIN_SIZE);
                }
                cache_size = Some(size);
            }
            "page_cache" => {
                s.page_cache = v.and_then(cache::parse_size).with_context(|| {
                    format!("option {opt}: a size in bytes with an optional K, M, G or T (e.g. page_cache=2G; 0: none)")
                })?;
            }
            "ost_limit" => {
                let rate = v.and_then(cache::parse_size).filter(|&r| r > 0).with_context(|| {
                    format!("option {opt}: bytes per second with an optional K, M or G (e.g. ost_limit=200M)")
                })?;
                s.ost_limit = Some(rate);
            }
            "ost_latency" => s.ost_latency = Duration::from_secs_f64(num(v)?.clamp(0.0, 10_000.0) / 1000.0),
            "trace" => s.trace.on = switch(k, v)?,
            "trace_dir" => {
                let dir = v.filter(|d| !d.is_empty()).context("option trace_dir needs a directory")?;
                let dir = std::path::absolute(dir).with_context(|| format!("option {opt}"))?;
                s.trace.destination = crate::trace::Destination::Dir(dir);
            }
            "trace_server" => {
                let addr =
                    v.filter(|a| a.contains(':')).with_context(|| format!("option {opt}: trace_server=HOST:PORT"))?;
                s.trace.destination = crate::trace::Destination::Server(addr.to_string());
            }
            "jobid_var" => {
                let var = v.unwrap_or_default();
                s.fuse.jobid_var =
                    client::jobid::JobVar::parse(var).map_err(|e| anyhow::anyhow!("option {opt}: {e}"))?;
                s.trace.jobid_var = var.to_string();
            }
            "trace_sync" => {
                let f = v.filter(|d| !d.is_empty()).context("option trace_sync needs a file")?;
                s.trace.sync_log = Some(std::path::absolute(f).with_context(|| format!("option {opt}"))?);
            }
            "trace_ring" => {
                let n = num(v)? as u64;
                if !n.is_power_of_two() || !(64..=1 << 24).contains(&n) {
                    bail!("option {opt}: records of the trace ring, a power of two from 64 to 16777216");
                }
                s.trace.capacity = n;
            }
            "metrics" => {
                let addr = v.filter(|a| a.contains(':')).with_context(|| format!("option {opt}: metrics=HOST:PORT"))?;
                s.metrics = Some(addr.to_string());
            }
            "secret_file" => {
                let f = v.filter(|f| !f.is_empty()).context("option secret_file needs a file (the cluster secret)")?;
                s.secret_file = Some(std::path::absolute(f).with_context(|| format!("option {opt}"))?);
            }
            "log" => {
                let f = v.filter(|f| !f.is_empty()).context("option log needs a file (the mount's log)")?;
                s.log = Some(std::path::absolute(f).with_context(|| format!("option {opt}"))?);
            }
            _ => bail!("unknown mount option '{opt}' (known: {OPTIONS_HELP})"),
        }
    }
    match (&mut s.cache, cache_size) {
        (Some(c), Some(size)) => c.size = size,
        (None, Some(_)) => bail!("option cache_size needs cache_dir=PATH too"),
        _ => {}
    }
    if s.fuse.passthrough && s.cache.is_none() {
        bail!("option passthrough needs cache_dir=PATH too (reads pass through to the SSD cache's files)");
    }
    Ok(s)
}

/// The options of [`parse_options`], as its error message lists them.
const OPTIONS_HELP: &str = "attr_timeout=S, entry_timeout=S, allow_other, direct_io, ro, rw, noexec, exec, threads=N, timeout=S, max_write=BYTES, readahead_kb=KIB, dir_leases=0|1, statahead=0|1, short_circuit, cache_dir=PATH, cache_size=SIZE, passthrough, page_cache=SIZE (native clients), ost_limit=RATE, ost_latency=MS, trace[=on|off], trace_dir=DIR, trace_server=HOST:PORT, jobid_var=NAME, trace_ring=RECORDS, trace_sync=FILE, tls_dir=DIR, metrics=HOST:PORT, secret_file=FILE, log=FILE";

/// The keys [`parse_options`] knows (a unit test holds the two together): what a
/// sloppy mount (`mount -s`, see [`crate::mount_helper`]) keeps.
pub const OPTION_KEYS: &[&str] = &[
    "attr_timeout",
    "entry_timeout",
    "allow_other",
    "direct_io",
    "ro",
    "rw",
    "noexec",
    "exec",
    "threads",
    "timeout",
    "max_write",
    "readahead_kb",
    "dir_leases",
    "statahead",
    "short_circuit",
    "cache_dir",
    "cache_size",
    "passthrough",
    "page_cache",
    "ost_limit",
    "ost_latency",
    "trace",
    "trace_dir",
    "trace_server",
    "jobid_var",
    "trace_ring",
    "trace_sync",
    "tls_dir",
    "metrics",
    "secret_file",
    "log",
];

/// An option that is on or off: `NAME`, `NAME=1|on` or `NAME=0|off`.
fn switch(name: &str, v: Option<&str>) -> Result<bool> {
    match v {
        None | Some("1") | Some("on") => Ok(true),
        Some("0") | Some("off") => Ok(false),
        Some(other) => bail!("option {name}={other}: {name}, {name}=1|on or {name}=0|off"),
    }
}

/// `page_cache` is a native client's: a mount reads through the kernel's page cache,
/// and a second copy in the mount's memory would only cost memory.
pub fn no_page_cache(s: &MountSettings) -> Result<()> {
    if s.page_cache > 0 {
        bail!("option page_cache is for native clients (BRAID_CLIENT_OPTIONS, braid nbd serve --page-cache): a mount caches in the kernel's page cache");
    }
    Ok(())
}

/// Options of a mount that a native client (`braid cp`, `braid bench` on a
/// `braid://` target, ...) takes too, from `BRAID_CLIENT_OPTIONS`.
const NATIVE_OPTIONS: [&str; 16] = [
    "short_circuit",
    "tls_dir",
    "cache_dir",
    "cache_size",
    "page_cache",
    "ost_limit",
    "ost_latency",
    "timeout",
    "dir_leases",
    "statahead",
    "trace",
    "trace_dir",
    "trace_server",
    "jobid_var",
    "trace_ring",
    "trace_sync",
];

/// The client settings in `BRAID_CLIENT_OPTIONS` (mount options of the client, as
/// `cache_dir=/ssd/braid,cache_size=20G`), or none.
pub fn native_settings() -> Result<Option<MountSettings>> {
    let Some(list) = std::env::var_os("BRAID_CLIENT_OPTIONS") else { return Ok(None) };
    let list = list.into_string().map_err(|_| anyhow::anyhow!("BRAID_CLIENT_OPTIONS is not UTF-8"))?;
    for opt in list.split(',').filter(|o| !o.is_empty()) {
        let key = opt.split_once('=').map_or(opt, |(k, _)| k);
        if !NATIVE_OPTIONS.contains(&key) {
            bail!(
                "BRAID_CLIENT_OPTIONS: '{opt}' is not an option of a native client (known: {})",
                NATIVE_OPTIONS.join(", ")
            );
        }
    }
    parse_options(&[list]).map(Some).context("BRAID_CLIENT_OPTIONS")
}

/// Has this native client's requests count for the job it runs in (job stats), as a
/// mount's count for their callers': `jobid_var` of `BRAID_CLIENT_OPTIONS`, else
/// `SLURM_JOB_ID`, found in this process's own environment.
pub fn set_native_job(settings: Option<&MountSettings>) {
    let default_var = client::jobid::JobVar::Env(client::jobid::DEFAULT_JOBID_VAR.into());
    let var = settings.map_or(&default_var, |s| &s.fuse.jobid_var);
    if let Some(job) = client::jobid::own_job(var) {
        client::jobid::set_process_job(&job);
    }
}

/// A native client of the cluster at `mgs`, with the client options of
/// `BRAID_CLIENT_OPTIONS` (its SSD cache, its tracing) and, if given, the recovery
/// timeout.
pub fn native_client(mgs: &str, secret: client::Secret, timeout: Option<Duration>) -> Result<BlockingClient> {
    let settings = native_settings()?;
    let mut cfg = match &settings {
        Some(s) => s.client_config(mgs, secret)?,
        None => ClientConfig { tls: crate::client_tls(None)?, ..ClientConfig::new(mgs, secret) },
    };
    set_native_job(settings.as_ref());
    let traced = settings.as_ref().map(|s| &s.trace).filter(|t| crate::trace::wanted(t));
    if let Some(t) = traced {
        let name = format!("{}:native-{}", crate::trace::host_name(), std::process::id());
        cfg.trace = Some(crate::trace::client_trace_config(t, &name));
    }
    if let Some(t) = timeout {
        cfg.rpc.recovery_timeout = t.max(Duration::from_secs(1));
    }
    let bc = BlockingClient::connect(cfg, 2).with_context(|| format!("cannot connect to the cluster at {mgs}"))?;
    if let Some(t) = traced {
        crate::trace::hook_native(&bc.client, t)?;
    }
    Ok(bc)
}

fn secret_record(mgs: &str) -> PathBuf {
    Path::new(RUN_DIR).join(format!("{}.secret-file", mgs.replace([':', '/'], "_")))
}

fn record_secret(mgs: &str, secret_file: Option<&Path>) {
    if let Some(f) = secret_file {
        record_secret_file(mgs, f);
    }
}

/// Records which secret file the mount of `mgs` uses.
pub fn record_secret_file(mgs: &str, f: &Path) {
    let Ok(abs) = std::fs::canonicalize(f) else { return };
    if std::fs::create_dir_all(RUN_DIR).is_ok() {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(RUN_DIR, std::fs::Permissions::from_mode(0o700));
        let _ = std::fs::write(secret_record(mgs), abs.to_string_lossy().as_bytes());
    }
}

/// The secret file a mount of `mgs` recorded, while such a mount is mounted and
/// the file is there: a record outlives its mount (a mount killed, the machine's
/// MGS addresses reused by another cluster), and a stale one must not stand in for
/// the secret the caller was asked for.
pub fn recorded_secret(mgs: &str) -> Option<PathBuf> {
    let file = PathBuf::from(std::fs::read_to_string(secret_record(mgs)).ok()?.trim());
    (file.is_file() && braid_mounts().iter().any(|m| m.mgs == mgs)).then_some(file)
}

/// Mounts and serves in this process until unmounted or signalled.
pub fn mount_foreground(
    url: &str,
    mountpoint: &Path,
    settings: MountSettings,
    secret_file: Option<PathBuf>,
) -> Result<()> {
    let p = crate::url::require(url)?;
    let mut cfg = settings.client_config(&p.mgs, crate::client_secret(&secret_file)?)?;
    let name = format!("{}:{}", crate::trace::host_name(), std::path::absolute(mountpoint)?.display());
    cfg.trace = Some(crate::trace::client_trace_config(&settings.trace, &name));
    let timeout_s = settings.timeout_s;
    let bc = {
        // A cluster that does not answer is retried for the mount's timeout: say so
        // rather than wait in silence.
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let mgs = p.mgs.clone();
        let notice = std::thread::spawn(move || {
            if wait.recv_timeout(SLOW_CONNECT) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                eprintln!("braid mount: the MGS at {mgs} does not answer yet; retrying for up to {timeout_s} s");
            }
        });
        let bc = BlockingClient::connect(cfg, 4);
        let _ = done.send(());
        let _ = notice.join();
        bc.with_context(|| format!("cannot connect to the cluster at {}", p.mgs))?
    };
    if p.path != "/" {
        bail!("mounting a subdirectory is not supported; mount braid://{}/", p.mgs);
    }
    if let Some(addr) = &settings.metrics {
        bc.handle().block_on(crate::serve_metrics(addr))?;
    }
    let mut fuse_opts = settings.fuse.clone();
    fuse_opts.fsname = format!("braid@{}", p.mgs);
    let secret_used = secret_file.clone().or_else(|| std::env::var_os("BRAID_SECRET_FILE").map(PathBuf::from));
    let traced = crate::trace::hook(&bc.client, &settings.trace, secret_used)?;
    fuse_opts.trace = traced.clone().map(|t| fuse::TraceHook(t));
    let mut mounted = fuse::mount(bc.client.clone(), bc.handle(), mountpoint, fuse_opts).with_context(|| {
        format!(
            "cannot mount on {} (is fuse3 installed and {} an empty directory?)",
            mountpoint.display(),
            mountpoint.display()
        )
    })?;
    record_secret(
        &p.mgs,
        secret_file.clone().or_else(|| std::env::var_os("BRAID_SECRET_FILE").map(PathBuf::from)).as_deref(),
    );
    let mut unmounter = mounted.unmounter();
    let mp = mountpoint.to_path_buf();
    let handle = bc.handle();
    std::thread::spawn(move || {
        if let Ok(sig) = handle.block_on(crate::serve::until_signal()) {
            tracing::info!("unmounting {} on {sig}", mp.display());
            if let Err(e) = unmounter.unmount() {
                tracing::warn!("unmount of {} failed: {e}", mp.display());
            }
        }
    });
    println!("braid mounted {} on {}", p.url(), mountpoint.display());
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let r = mounted.run().context("FUSE session failed");
    if let Some(t) = traced {
        t.detach();
    }
    log_requests(&bc.client);
    r
}

/// What a client sent at the end of its life, and what it did through local
/// descriptors instead (short-circuit I/O): in the log, for whoever wonders where
/// the bytes went.
pub fn log_requests(client: &client::Client) {
    let sent = client.rpc_counts();
    tracing::info!(
        mds = sent.mds,
        ost = sent.ost,
        local = sent.local,
        "requests sent (local: OST reads and writes made through descriptors instead)"
    );
}

/// Starts `braid mount -f` in the background and waits until the mount is ready.
pub fn mount_background(
    url: &str,
    mountpoint: &Path,
    options: &[String],
    secret_file: Option<PathBuf>,
    log: Option<PathBuf>,
) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the braid executable")?;
    let log = log.unwrap_or_else(|| std::env::temp_dir().join(format!("braid-mount-{}.log", std::process::id())));
    let log_file = std::fs::File::create(&log).with_context(|| format!("cannot create log {}", log.display()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("mount").arg("-f").arg(url).arg(mountpoint);
    for o in options {
        cmd.arg("-o").arg(o);
    }
    if let Some(s) = &secret_file {
        cmd.arg("--secret-file").arg(s);
    }
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(log_file);
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid only detaches the child from our session; it is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start the mount process")?;
    let start = Instant::now();
    let mut said = false;
    let target = std::fs::canonicalize(mountpoint).unwrap_or(mountpoint.to_path_buf());
    loop {
        if braid_mounts().iter().any(|m| m.mountpoint == target) {
            println!("braid mounted {url} on {} (pid {}, log {})", mountpoint.display(), child.id(), log.display());
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            bail!("mount process exited with {status}:\n{text}");
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("mount not ready after 60 s; see {}", log.display());
        }
        if !said && start.elapsed() > SLOW_CONNECT + Duration::from_secs(1) {
            // The mount process says why in its log (e.g. an MGS that does not answer).
            said = true;
            let why = std::fs::read_to_string(&log).unwrap_or_default();
            match why.lines().rev().find(|l| l.contains("does not answer yet")) {
                Some(line) => eprintln!("{line}"),
                None => eprintln!("braid mount: not ready yet; waiting (log {})", log.display()),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long `umount` waits before aborting the FUSE connection.
const UMOUNT_WAIT: Duration = Duration::from_secs(10);

/// Unmounts a braid mount (see [`fuse::unmount`]: it always finishes).
pub fn umount(mountpoint: &Path) -> Result<()> {
    let target = std::fs::canonicalize(mountpoint).unwrap_or(mountpoint.to_path_buf());
    let done = fuse::unmount(&target, UMOUNT_WAIT);
    if done.aborted {
        eprintln!("braid: {} did not unmount in {UMOUNT_WAIT:?}; aborted its FUSE connection", target.display());
    }
    done.result.with_context(|| format!("cannot unmount {}", target.display()))
}

#[derive(Debug, Clone, PartialEq)]
pub struct MountEntry {
    pub mountpoint: PathBuf,
    pub mgs: String,
}

/// Every braid mount of this machine.
pub fn braid_mounts() -> Vec<MountEntry> {
    fuse::mount::mountinfo::entries().iter().filter_map(braid_mount).collect()
}

/// A mount that is braid's: type `fuse.braid` (or `fuse`: mount(2) without
/// fusermount does not always record the subtype) and source `braid@MGS`.
fn braid_mount(e: &fuse::mount::mountinfo::Entry) -> Option<MountEntry> {
    if e.fstype != "fuse.braid" && e.fstype != "fuse" {
        return None;
    }
    let mgs = e.source.strip_prefix("braid@")?;
    Some(MountEntry { mountpoint: e.mountpoint.clone(), mgs: mgs.to_string() })
}

/// Turns a path inside a braid mount into a braid path.
pub fn resolve_mounted(path: &str) -> Result<Option<BraidPath>> {
    let Ok(abs) = std::fs::canonicalize(path).or_else(|e| {
        // A path that does not exist yet (setstripe on a new file): canonicalize its parent.
        let p = Path::new(path);
        match (p.parent(), p.file_name()) {
            (Some(parent), Some(name)) => {
                let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
                std::fs::canonicalize(parent).map(|d| d.join(name))
            }
            _ => Err(e),
        }
    }) else {
        return Ok(None);
    };
    let best = braid_mounts()
        .into_iter()
        .filter(|m| abs.starts_with(&m.mountpoint))
        .max_by_key(|m| m.mountpoint.as_os_str().len());
    let Some(m) = best else { return Ok(None) };
    let rel = abs.strip_prefix(&m.mountpoint).expect("prefix checked");
    Ok(Some(BraidPath { mgs: m.mgs, path: format!("/{}", rel.to_string_lossy()) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        use fuse::mount::mountinfo::parse_line;
        let l = "36 35 0:44 / /mnt/my\\040fs rw,nosuid,nodev shared:1 - fuse.braid braid@127.0.0.1:9400 rw,user_id=0";
        let m = braid_mount(&parse_line(l).unwrap()).unwrap();
        assert_eq!(m.mountpoint, PathBuf::from("/mnt/my fs"));
        assert_eq!(m.mgs, "127.0.0.1:9400");
        assert!(braid_mount(&parse_line("22 1 8:1 / / rw - ext4 /dev/vda rw").unwrap()).is_none());
    }

    #[test]
    fn options() {
        let s = parse_options(&["attr_timeout=0.5,ro".into(), "threads=4".into()]).unwrap();
        assert_eq!(s.fuse.attr_ttl, Duration::from_millis(500));
        assert!(s.fuse.read_only);
        assert_eq!(s.fuse.threads, 4);
        assert_eq!(s.fuse.readahead_kb, 4096);
        assert_eq!(parse_options(&["readahead_kb=1024".into()]).unwrap().fuse.readahead_kb, 1024);
        assert!(parse_options(&["bogus".into()]).is_err());
        assert!(parse_options(&[]).unwrap().dir_leases);
        assert!(!parse_options(&["dir_leases=0".into()]).unwrap().dir_leases);
        assert!(parse_options(&["dir_leases=maybe".into()]).is_err());
        assert!(parse_options(&[]).unwrap().statahead);
        assert!(!parse_options(&["statahead=0".into()]).unwrap().statahead);
        assert!(parse_options(&["statahead=2".into()]).is_err());
        // A native client's memory cache: parsed, and refused by a mount.
        let s = parse_options(&["page_cache=2G".into()]).unwrap();
        assert_eq!(s.page_cache, 2 << 30);
        assert!(no_page_cache(&s).unwrap_err().to_string().contains("native clients"));
        assert!(no_page_cache(&parse_options(&[]).unwrap()).is_ok());
        assert!(parse_options(&["page_cache=lots".into()]).is_err());
        assert!(parse_options(&["threads=x".into()]).is_err());
        assert!(parse_options(&["noexec".into()]).unwrap().fuse.no_exec);
        assert!(!parse_options(&["noexec,exec".into()]).unwrap().fuse.no_exec);
    }

    /// The key list a sloppy mount keeps, the keys `parse_options` takes and the
    /// keys its error message names are one set.
    #[test]
    fn option_keys_are_the_parsers() {
        let unknown = |opt: &str| {
            parse_options(&[opt.to_string()]).is_err_and(|e| e.to_string().starts_with("unknown mount option"))
        };
        for key in OPTION_KEYS {
            assert!(!unknown(key) || !unknown(&format!("{key}=1")), "{key} is in OPTION_KEYS but not parsed");
        }
        assert!(unknown("bogus"));
        let mut named: Vec<&str> =
            OPTIONS_HELP.split(", ").map(|o| o.split(['=', '[', ' ']).next().expect("a key")).collect();
        let mut keys = OPTION_KEYS.to_vec();
        named.sort_unstable();
        keys.sort_unstable();
        assert_eq!(named, keys, "the error message names every key, and only those");
    }

    /// What /etc/fstab gives in -o (secret_file=, log=) against the same flags.
    #[test]
    fn secret_file_and_log_as_options() {
        let s = parse_options(&["secret_file=/etc/braid/cluster.secret,log=/var/log/braid-mount.log".into()]).unwrap();
        assert_eq!(s.secret_file, Some(PathBuf::from("/etc/braid/cluster.secret")));
        assert_eq!(s.log, Some(PathBuf::from("/var/log/braid-mount.log")));
        let rel = parse_options(&["secret_file=s".into()]).unwrap().secret_file.unwrap();
        assert!(rel.is_absolute(), "made absolute while the caller's directory is known: {rel:?}");
        assert!(parse_options(&["log=".into()]).is_err());
        let f = |p: &str| Some(PathBuf::from(p));
        assert_eq!(given_once("--secret-file", "secret_file", f("/a"), None).unwrap(), f("/a"));
        assert_eq!(given_once("--secret-file", "secret_file", None, f("/b")).unwrap(), f("/b"));
        assert_eq!(given_once("--secret-file", "secret_file", f("/a"), f("/a")).unwrap(), f("/a"));
        let e = given_once("--secret-file", "secret_file", f("/a"), f("/b")).unwrap_err().to_string();
        assert!(e.contains("disagree"), "{e}");
        let opts = vec!["ro,secret_file=/a".to_string(), "log=/l".into(), "threads=2".into()];
        assert_eq!(without_keys(&opts, &["secret_file", "log"]), vec!["ro".to_string(), "threads=2".into()]);
    }
}
