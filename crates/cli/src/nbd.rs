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
        let (name, rest) = s.split_once('=').context("an export is NAME=PATH[,ro][,size=SIZE]")?;
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
        let (parent, name) = client.resolve_parent(&creds, &spec.path).await.with_context(|| spec.path.clone())?;
        let existing = client.open_at(&creds, parent.fid, &name, flags).await;
        let (file, _) = match (existing, spec.size) {
            (Ok(f), _) => f,
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
            let zeros = Bytes::from(vec![0u8; len as usize]);
            self.client.write(&self.file, offset, zeros).await.map_err(io_err)?;
        }
        if fua {
            self.client.fsync(&self.file).await.map_err(io_err)?;
        }
        Ok(())
    }
}

/// What `braid nbd serve` was asked to do.
pub struct ServeArgs {
    /// The file system, `braid://MGS/`.
    pub url: String,
    /// `NAME=PATH[,ro][,size=SIZE]` each.
    pub exports: Vec<String>,
    pub listen: String,
    /// Every write durable before its reply.
    pub sync: bool,
    /// `--page-cache SIZE`, as given.
    pub page_cache: Option<String>,
    /// How long a connection stays awake for its client's next request.
    pub poll: std::time::Duration,
    /// Short-circuit I/O with OSTs served on this machine.
    pub short_circuit: bool,
    pub secret_file: Option<std::path::PathBuf>,
}

/// `braid nbd serve URL --export ... --listen ADDR [--sync]`: serves until signalled.
pub fn serve(args: ServeArgs) -> Result<()> {
    let ServeArgs { url, exports, listen, sync, page_cache, poll, short_circuit, secret_file } = args;
    let (url, listen) = (url.as_str(), listen.as_str());
    let page_cache = page_cache
        .as_deref()
        .map(|v| {
            cache::parse_size(v)
                .with_context(|| format!("--page-cache {v}: a size in bytes with an optional K, M, G or T (0: none)"))
        })
        .transpose()?;
    let specs = exports.iter().map(|e| ExportSpec::parse(e)).collect::<Result<Vec<_>>>()?;
    if specs.is_empty() {
        bail!("give at least one --export NAME=PATH[,ro][,size=SIZE]");
    }
    let mut names = std::collections::HashSet::new();
    for s in &specs {
        if !names.insert(s.name.clone()) {
            bail!("two exports are named '{}'", s.name);
        }
    }
    let p = crate::url::require(url)?;
    let file = secret_file.or_else(|| std::env::var_os("BRAID_SECRET_FILE").map(std::path::PathBuf::from));
    let secret = crate::client_secret(&file)?;
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
    rt.block_on(async {
        let mut cfg = match &settings {
            Some(s) => s.client_config(&p.mgs, secret),
            None => client::ClientConfig::new(&p.mgs, secret),
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
        let server = tokio::spawn(nbd::serve(listener, exports.clone()));
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
}
