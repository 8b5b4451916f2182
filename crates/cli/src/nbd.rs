//! `braid nbd serve`: braid files exported as NBD devices. The process is a braid
//! client (as a mount is); each export is one open handle of one file, shared by every
//! connection to it, and striped over OSTs as the file is.
//!
//! Writes go to the OSTs as the native client writes (under way when acknowledged,
//! read back by any connection at once); FLUSH and FUA make them durable with the
//! handle's fsync, which covers every write of the handle: what `CAN_MULTI_CONN`
//! promises. `--sync` makes every write durable before its reply (seed 004's
//! synchronous server writes).

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use bytes::{Bytes, BytesMut};
use client::{Client, ClientError, OpenFile, ReadOut};
use proto::msg::{OpenFlags, SetAttr};

/// One export as `--export NAME=PATH[,ro][,size=SIZE]` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSpec {
    pub name: String,
    pub path: String,
    pub read_only: bool,
    /// Create the file if missing and make it at least this long (sparse).
    pub size: Option<u64>,
}

impl ExportSpec {
    pub fn parse(s: &str) -> Result<ExportSpec> {
        let (name, rest) =
            s.split_once('=').with_context(|| format!("export '{s}': an export is NAME=PATH[,ro][,size=SIZE]"))?;
        if name.is_empty() || name.len() > 4096 {
            bail!("export '{s}': the name must be 1 to 4096 bytes");
        }
        let mut parts = rest.split(',');
        let path = parts.next().filter(|p| p.starts_with('/')).with_context(|| {
            format!("export '{s}': the path must be absolute within the file system (e.g. {name}=/vm/disk.img)")
        })?;
        let mut spec = ExportSpec { name: name.into(), path: path.into(), read_only: false, size: None };
        for p in parts {
            match p.split_once('=') {
                None if p == "ro" => spec.read_only = true,
                Some(("size", v)) => {
                    let n = cache::parse_size(v).filter(|&n| n > 0).with_context(|| {
                        format!("export '{s}': size={v} is not a size (bytes with an optional K, M, G or T)")
                    })?;
                    spec.size = Some(n);
                }
                _ => bail!("export '{s}': unknown option '{p}' (known: ro, size=SIZE)"),
            }
        }
        if spec.read_only && spec.size.is_some() {
            bail!("export '{s}': a read-only export cannot be created or grown (drop size= or ro)");
        }
        Ok(spec)
    }
}

/// Reads at least this long are sent from local object files when they can be.
const SEND_FILES_MIN: u32 = 64 << 10;

fn io_err(e: ClientError) -> io::Error {
    io::Error::from_raw_os_error(e.errno().raw())
}

/// A braid file as a block device.
pub struct FileDevice {
    client: Client,
    file: OpenFile,
    size: u64,
}

impl FileDevice {
    /// Opens (creating and sizing as `spec` asks) the file an export serves.
    pub async fn open(client: &Client, spec: &ExportSpec) -> Result<FileDevice> {
        let creds = client::process_creds();
        let flags = OpenFlags { read: true, write: !spec.read_only, truncate: false };
        let path = &spec.path;
        let (parent, name) = match client.resolve_parent(&creds, path).await {
            Ok(p) => p,
            Err(e) if e.errno() == proto::Errno::NoEnt => {
                let dir = path.rsplit_once('/').map_or("/", |(d, _)| d);
                bail!("cannot open {path}: no such directory {dir}");
            }
            Err(e) => return Err(e).with_context(|| format!("cannot open {path}")),
        };
        let existing = client.open_at(&creds, parent.fid, &name, flags).await;
        let (file, _) = match (existing, spec.size) {
            (Ok(f), _) => f,
            (Err(e), None) if e.errno() == proto::Errno::NoEnt => {
                bail!("cannot open {path}: no such file (size=SIZE creates it)")
            }
            (Err(e), Some(_)) if e.errno() == proto::Errno::NoEnt => {
                let (f, a, _) = client
                    .create(&creds, parent.fid, &name, 0o600, false, flags, None)
                    .await
                    .with_context(|| format!("cannot create {}", spec.path))?;
                (f, a)
            }
            (Err(e), _) => return Err(e).with_context(|| format!("cannot open {}", spec.path)),
        };
        if let Some(size) = spec.size {
            if file.size() < size {
                let set = SetAttr { size: Some(size), ..Default::default() };
                client.fsetattr(&creds, &file, set).await.with_context(|| format!("cannot size {}", spec.path))?;
            }
        }
        let size = file.size();
        if size == 0 {
            bail!("{} is empty: give the export a size (NAME=PATH,size=SIZE)", spec.path);
        }
        Ok(FileDevice { client: client.clone(), file, size })
    }
}

impl nbd::Backend for FileDevice {
    fn size(&self) -> u64 {
        self.size
    }

    async fn read(&self, offset: u64, len: u32) -> io::Result<nbd::ReadData> {
        // A long read the export's OSTs on this machine hold is sent from their object
        // files (short-circuit I/O and `sendfile`); a short one costs less read here
        // and sent with other replies in one system call.
        let data = if len >= SEND_FILES_MIN {
            // Boxed: a second read's future beside the first in every read's.
            match Box::pin(self.client.read_for_send(&self.file, offset, len as u64)).await.map_err(io_err)? {
                ReadOut::Local(ranges) => {
                    let ranges = ranges
                        .into_iter()
                        .map(|r| nbd::FileRange { file: r.file, offset: r.offset, len: r.len })
                        .collect();
                    return Ok(nbd::ReadData::Files(ranges));
                }
                ReadOut::Bytes(data) => data,
            }
        } else {
            self.client.read(&self.file, offset, len as u64).await.map_err(io_err)?
        };
        if data.len() == len as usize {
            return Ok(nbd::ReadData::Bytes(data));
        }
        // Past the file's end, within the device: zeros.
        let mut out = BytesMut::zeroed(len as usize);
        out[..data.len()].copy_from_slice(&data);
        Ok(nbd::ReadData::Bytes(out.freeze()))
    }

    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> io::Result<()> {
        self.client.write(&self.file, offset, data).await.map_err(io_err)?;
        if fua {
            // Boxed: an fsync's future is ten times a write's, and every write's
            // future (moved and allocated per request) would be as large.
            Box::pin(self.client.fsync(&self.file)).await.map_err(io_err)?;
        }
        Ok(())
    }

    async fn flush(&self) -> io::Result<()> {
        self.client.fsync(&self.file).await.map_err(io_err)
    }

    async fn trim(&self, offset: u64, len: u32) -> io::Result<()> {
        self.client.punch_hole(&self.file, offset, len as u64).await.map_err(io_err)
    }

    async fn zero(&self, offset: u64, len: u32, may_trim: bool, fua: bool) -> io::Result<()> {
        if may_trim {
            self.client.punch_hole(&self.file, offset, len as u64).await.map_err(io_err)?;
        } else {
            // A piece at a time from one static page of zeros: a request may name up to
            // 4 GiB, which the export must not allocate for an unauthenticated client.
            let mut done = 0u64;
            while done < len as u64 {
                let n = (len as u64 - done).min(ZEROS.len() as u64) as usize;
                let zeros = Bytes::from_static(&ZEROS[..n]);
                self.client.write(&self.file, offset + done, zeros).await.map_err(io_err)?;
                done += n as u64;
            }
        }
        if fua {
            self.client.fsync(&self.file).await.map_err(io_err)?;
        }
        Ok(())
    }
}

/// Zeros written by `WRITE_ZEROES` without trimming, a piece of this size at a time.
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// What `braid nbd serve` was asked to do on its command line.
#[derive(Debug, Default)]
pub struct ServeArgs {
    /// The file system, `braid://MGS/` (else `url` in `[nbd]` of the config file).
    pub url: Option<String>,
    /// `braid.toml`, whose `[nbd]` section the flags override.
    pub config: Option<PathBuf>,
    /// `NAME=PATH[,ro][,size=SIZE]` each.
    pub exports: Vec<String>,
    pub listen: Option<String>,
    /// Every write durable before its reply.
    pub sync: bool,
    /// `--page-cache SIZE`, as given.
    pub page_cache: Option<String>,
    /// Microseconds a connection stays awake for its client's next request.
    pub poll_us: Option<u64>,
    /// Short-circuit I/O with OSTs served on this machine.
    pub short_circuit: bool,
    pub secret_file: Option<PathBuf>,
    /// `--max-connections N`.
    pub max_connections: Option<usize>,
    /// `--max-inflight-bytes SIZE`, as given.
    pub max_inflight_bytes: Option<String>,
    /// `--tls-dir DIR`: offer TLS with the files there.
    pub tls_dir: Option<PathBuf>,
    /// `--tls-required`.
    pub tls_required: bool,
}

/// Where an export listens by default: loopback only, as without TLS it has no
/// authentication.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:10809";
/// Longest `--poll-us`.
const POLL_US_MAX: u64 = 10_000;
const POLL_US_DEFAULT: u64 = 100;

/// `braid nbd serve`'s settings: the flags, else `[nbd]` of the config file, else the
/// defaults.
#[derive(Debug)]
struct Settings {
    url: String,
    specs: Vec<ExportSpec>,
    listen: String,
    sync: bool,
    page_cache: Option<u64>,
    poll: std::time::Duration,
    short_circuit: bool,
    secret_file: Option<PathBuf>,
    limits: nbd::Limits,
    tls_dir: Option<PathBuf>,
    tls_required: bool,
}

/// The exports `list` names (`--export`, or `exports` in `[nbd]` of braid.toml: the
/// same checks for both): at least one, each well formed, no two of one name.
pub fn export_specs(list: &[String]) -> Result<Vec<ExportSpec>> {
    let specs = list.iter().map(|e| ExportSpec::parse(e)).collect::<Result<Vec<_>>>()?;
    if specs.is_empty() {
        bail!("give at least one --export NAME=PATH[,ro][,size=SIZE] (or exports in [nbd] of braid.toml)");
    }
    let mut names = std::collections::HashSet::new();
    for s in &specs {
        if !names.insert(s.name.clone()) {
            bail!("two exports are named '{}'", s.name);
        }
    }
    Ok(specs)
}

fn settings(a: ServeArgs, file: &crate::config::FileConfig) -> Result<Settings> {
    let f = &file.nbd;
    let url = a.url.or(f.url.clone()).context("give the file system, braid://MGS/ (or url in [nbd] of braid.toml)")?;
    let specs = match &a.config {
        Some(path) if a.exports.is_empty() && !f.exports.is_empty() => {
            export_specs(&f.exports).with_context(|| format!("in [nbd] exports of {}", path.display()))?
        }
        _ => export_specs(&a.exports)?,
    };
    let page_cache = a
        .page_cache
        .or(f.page_cache.clone())
        .map(|v| {
            cache::parse_size(&v)
                .with_context(|| format!("--page-cache {v}: a size in bytes with an optional K, M, G or T (0: none)"))
        })
        .transpose()?;
    let poll_us = a.poll_us.or(f.poll_us).unwrap_or(POLL_US_DEFAULT);
    if poll_us > POLL_US_MAX {
        bail!("--poll-us {poll_us}: at most {POLL_US_MAX}");
    }
    let connections_max = a.max_connections.or(f.max_connections).unwrap_or(nbd::server::CONNECTIONS_MAX_DEFAULT);
    if connections_max == 0 {
        bail!("--max-connections 0: at least 1");
    }
    let inflight_bytes_max = match a.max_inflight_bytes.or(f.max_inflight_bytes.clone()) {
        None => nbd::server::INFLIGHT_BYTES_MAX_DEFAULT,
        Some(v) => cache::parse_size(&v).filter(|&n| n > 0).with_context(|| {
            format!("--max-inflight-bytes {v}: a size in bytes with an optional K, M, G or T, above 0")
        })? as usize,
    };
    Ok(Settings {
        url,
        specs,
        listen: a.listen.or(f.listen.clone()).unwrap_or_else(|| LISTEN_DEFAULT.into()),
        sync: a.sync || f.sync.unwrap_or(false),
        page_cache,
        poll: std::time::Duration::from_micros(poll_us),
        short_circuit: a.short_circuit || f.short_circuit.unwrap_or(false),
        secret_file: a
            .secret_file
            .or_else(|| std::env::var_os("BRAID_SECRET_FILE").map(PathBuf::from))
            .or(file.secret_file.clone()),
        limits: nbd::Limits { connections_max, inflight_bytes_max },
        tls_dir: a.tls_dir.or(f.tls_dir.clone()),
        tls_required: a.tls_required || f.tls_required.unwrap_or(false),
    })
}

/// `braid nbd serve URL --export ... --listen ADDR [--sync]`: serves until signalled.
pub fn serve(args: ServeArgs) -> Result<()> {
    let file = crate::config::load(args.config.as_deref())?;
    let Settings {
        url,
        specs,
        listen,
        sync,
        page_cache,
        poll,
        short_circuit,
        secret_file,
        limits,
        tls_dir,
        tls_required,
    } = settings(args, &file)?;
    let tls = crate::server_tls(tls_dir.as_deref(), tls_required)?
        .map(|t| nbd::server::Tls { acceptor: t.acceptor(), required: tls_required });
    let (url, listen) = (url.as_str(), listen.as_str());
    let p = crate::url::require(url)?;
    let secret = crate::client_secret(&secret_file)?;
    let settings = crate::mount::native_settings()?;
    // One thread serves every connection and the client's RPCs: a request then wakes
    // no other thread of this process on its way (measured against the default pool:
    // 4 KiB random reads +15-20 % at 8 and 32 in flight, writes and copies the same or
    // better; docs/benchmarks.md). An SSD cache is read on the thread that asks, so
    // with one the pool keeps the other connections going while a read waits for it.
    let rt = if settings.as_ref().is_some_and(|s| s.cache.is_some()) {
        crate::runtime()?
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the async runtime")?
    };
    crate::mount::set_native_job(settings.as_ref());
    rt.block_on(async {
        let mut cfg = match &settings {
            Some(s) => s.client_config(&p.mgs, secret)?,
            None => client::ClientConfig { tls: crate::client_tls(None)?, ..client::ClientConfig::new(&p.mgs, secret) },
        };
        // The flag, else BRAID_CLIENT_OPTIONS's page_cache, else the default.
        cfg.page_cache = match (page_cache, &settings) {
            (Some(n), _) => n,
            (None, Some(s)) if s.page_cache > 0 => s.page_cache,
            (None, _) => default_page_cache(),
        };
        cfg.short_circuit |= short_circuit;
        let client =
            Client::connect(cfg).await.with_context(|| format!("cannot connect to the cluster at {}", p.mgs))?;
        let mut list = BTreeMap::new();
        for s in &specs {
            let dev = FileDevice::open(&client, s).await?;
            let description = format!("braid file {}", s.path);
            tracing::info!(export = %s.name, path = %s.path, size = dev.size, read_only = s.read_only, "exporting");
            list.insert(
                s.name.clone(),
                Arc::new(nbd::Export { backend: Arc::new(dev), read_only: s.read_only, description, sync }),
            );
        }
        tracing::info!(
            connections_max = limits.connections_max,
            inflight_bytes_max = limits.inflight_bytes_max,
            "NBD limits"
        );
        let exports = Arc::new(nbd::Exports { list, default: Some(specs[0].name.clone()), poll_after_reply: poll });
        let listener =
            tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
        let addr = listener.local_addr()?;
        println!(
            "NBD server at {addr}, exports: {}",
            specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();
        if let Some(t) = &tls {
            tracing::info!(required = t.required, "NBD offers TLS");
        }
        let server = tokio::spawn(nbd::serve(listener, exports.clone(), limits, tls));
        let sig = crate::serve::until_signal().await?;
        tracing::info!("NBD server stopping on {sig}");
        server.abort();
        // What was acknowledged goes to disk before the process ends.
        for e in exports.list.values() {
            if let Err(err) = nbd::Backend::flush(e.backend.as_ref()).await {
                tracing::warn!("flushing at exit: {err}");
            }
        }
        crate::mount::log_requests(&client);
        if let Some(st) = client.page_cache_stats() {
            tracing::info!(
                hits = st.hits,
                misses = st.misses,
                used = st.used,
                capacity = st.capacity,
                evicted = st.evicted,
                "page cache at exit"
            );
        }
        Ok(())
    })
}

/// An eighth of the machine's memory (1 GiB if it cannot be read).
fn default_page_cache() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages > 0 && page > 0 {
        (pages as u64).saturating_mul(page as u64) / 8
    } else {
        1 << 30
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_specs_parse_and_bad_ones_say_why() {
        assert_eq!(
            ExportSpec::parse("disk=/vm/disk.img,size=10G").unwrap(),
            ExportSpec { name: "disk".into(), path: "/vm/disk.img".into(), read_only: false, size: Some(10 << 30) }
        );
        assert!(ExportSpec::parse("iso=/images/a.iso,ro").unwrap().read_only);
        for bad in ["disk", "=/a", "d=rel/path", "d=/a,size=x", "d=/a,bogus", "d=/a,ro,size=1G", "d=/a,size=0"] {
            assert!(ExportSpec::parse(bad).is_err(), "{bad}");
        }
    }

    fn url() -> Option<String> {
        Some("braid://127.0.0.1:9400/".into())
    }

    /// Flags over `[nbd]` of braid.toml over the defaults; by default the export
    /// listens on loopback only.
    #[test]
    fn flags_win_over_the_file_and_the_export_listens_on_loopback_by_default() {
        let file: crate::config::FileConfig = toml::from_str(
            r#"
[nbd]
url = "braid://10.0.0.1:9400/"
listen = "0.0.0.0:10809"
exports = ["f=/f.img,size=1M", "g=/g.img,ro"]
max_connections = 3
max_inflight_bytes = "64M"
poll_us = 5
"#,
        )
        .unwrap();
        let config = Some(PathBuf::from("braid.toml"));
        let s = settings(ServeArgs { config: config.clone(), ..Default::default() }, &file).unwrap();
        assert_eq!(s.url, "braid://10.0.0.1:9400/");
        assert_eq!(s.specs.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["f", "g"]);
        assert_eq!((s.listen.as_str(), s.poll), ("0.0.0.0:10809", std::time::Duration::from_micros(5)));
        assert_eq!(s.limits, nbd::Limits { connections_max: 3, inflight_bytes_max: 64 << 20 });
        let flags = ServeArgs {
            url: url(),
            config,
            exports: vec!["x=/x.img".into()],
            listen: Some("127.0.0.1:1".into()),
            max_connections: Some(5),
            max_inflight_bytes: Some("1M".into()),
            ..Default::default()
        };
        let s = settings(flags, &file).unwrap();
        assert_eq!(
            (s.url.as_str(), s.specs[0].name.as_str(), s.listen.as_str()),
            (url().as_deref().unwrap(), "x", "127.0.0.1:1")
        );
        assert_eq!(s.limits, nbd::Limits { connections_max: 5, inflight_bytes_max: 1 << 20 });
        let plain = ServeArgs { url: url(), exports: vec!["x=/x.img".into()], ..Default::default() };
        let s = settings(plain, &Default::default()).unwrap();
        assert_eq!(s.listen, "127.0.0.1:10809");
        assert_eq!(s.limits, nbd::Limits::default());
        assert_eq!(nbd::Limits::default(), nbd::Limits { connections_max: 16, inflight_bytes_max: 256 << 20 });
    }

    #[test]
    fn bad_limits_say_which_flag() {
        let bad = |a: ServeArgs, says: &str| {
            let a = ServeArgs { url: url(), exports: vec!["x=/x.img".into()], ..a };
            let e = format!("{:#}", settings(a, &Default::default()).unwrap_err());
            assert!(e.starts_with(says), "{e}");
        };
        bad(ServeArgs { max_connections: Some(0), ..Default::default() }, "--max-connections 0: at least 1");
        for v in ["0", "lots", "-1"] {
            bad(
                ServeArgs { max_inflight_bytes: Some(v.into()), ..Default::default() },
                &format!("--max-inflight-bytes {v}:"),
            );
        }
        bad(ServeArgs { poll_us: Some(10_001), ..Default::default() }, "--poll-us 10001: at most 10000");
        let e = settings(ServeArgs { exports: vec!["x=/x.img".into()], ..Default::default() }, &Default::default());
        assert!(format!("{:#}", e.unwrap_err()).contains("give the file system"));
    }
}
