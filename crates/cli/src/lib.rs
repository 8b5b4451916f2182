//! braid's command line as library code: everything the `braid` binary does once its
//! arguments are parsed. The binary stays a parser and a dispatch table; what a
//! command does lives here, where tests and other front ends (an NBD server, a
//! second launcher) can call it.
//!
//! - [`serve`]: the server roles (MGS, MDS, OSS): bind, register with the MGS, serve.
//! - [`local`]: `braid local`, every role (and optionally a mount) in one process.
//! - [`mount`]: `braid mount` and `braid umount`, and which cluster a mounted path is in.
//! - [`mount_helper`]: `mount -t fuse.braid` and `/etc/fstab` (braid as mount(8)'s helper).
//! - [`tools`]: the `lfs`-like tools over the native client (`cp`, `ls`, `setstripe`, ...).
//! - [`pool`]: `braid pool`, OST pools as `lctl pool_*` keeps them.
//! - [`fsck`]: `braid fsck`, the online check and repair of MDTs and OSTs.
//! - [`stats`]: `braid stats` and `braid top`, the cluster's live view from its servers' metrics.
//! - [`native_bench`]: the benchmarks' storage interface over the native client.
//! - [`config`]: `braid.toml`, the per-node configuration file.
//! - [`url`]: `braid://HOST:PORT/path` addresses.
//!
//! Errors are `anyhow` here: this crate is the binary's other half, and every error
//! ends as one line on stderr and exit status 1.

pub mod config;
pub mod fsck;
pub mod local;
pub mod migrate_mdt;
pub mod mirror;
pub mod mount;
pub mod mount_helper;
pub mod mountctl;
pub mod native_bench;
pub mod nbd;
pub mod pool;
pub mod serve;
pub mod stats;
pub mod stripe;
pub mod tier;
pub mod tools;
pub mod trace;
pub mod url;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use proto::auth::Secret;

/// Options shared by every server role.
#[derive(Args, Debug, Clone)]
pub struct ServerOpts {
    /// Configuration file (braid.toml); command-line flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// File holding the cluster secret (also BRAID_SECRET_FILE).
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Run without authentication (test clusters only).
    #[arg(long)]
    pub insecure: bool,
    /// File system name.
    #[arg(long)]
    pub fsname: Option<String>,
    /// Heartbeat interval of targets to the MGS, in milliseconds.
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Directory of this node's TLS files: ca.pem (the cluster's CA), cert.pem and
    /// key.pem (this node's, signed by it). Connections of clients that speak TLS are
    /// then taken over TLS, and this server's own connections to others use it.
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Refuse clients that do not speak TLS (needs --tls-dir).
    #[arg(long, requires = "tls_dir")]
    pub tls_required: bool,
    /// Serve Prometheus metrics over HTTP at HOST:PORT (GET /metrics); off unless
    /// given. No authentication: a loopback or management address.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
}

/// Serves this process's metrics at `addr` on the running runtime and says where.
pub async fn serve_metrics(addr: &str) -> Result<()> {
    let bound = metrics::endpoint::spawn(addr, metrics::global())
        .await
        .with_context(|| format!("cannot serve metrics on {addr} (--metrics): is the port in use?"))?;
    println!("metrics on http://{bound}/metrics");
    Ok(())
}

/// Options of every client tool.
#[derive(Args, Debug, Clone)]
pub struct ClientOpts {
    /// File holding the cluster secret (also BRAID_SECRET_FILE).
    #[arg(long, global = true)]
    pub secret_file: Option<PathBuf>,
    /// How long an operation keeps retrying while a server is unreachable, in seconds.
    #[arg(long, global = true, default_value_t = 60)]
    pub timeout_s: u64,
}

/// The secret a server runs with: a file, or an explicit `--insecure`.
pub fn server_secret(file: Option<PathBuf>, insecure: bool) -> Result<Secret> {
    let file = file.or_else(|| std::env::var_os("BRAID_SECRET_FILE").map(PathBuf::from));
    match (file, insecure) {
        (Some(f), _) => Secret::load(&f).map_err(anyhow::Error::msg),
        (None, true) => {
            tracing::warn!("running without authentication (--insecure)");
            Ok(Secret::Insecure)
        }
        (None, false) => bail!(
            "no cluster secret: pass --secret-file FILE (make one with `braid gen-secret FILE`) or run with --insecure"
        ),
    }
}

/// The secret a client tool uses: a file if given, else none (an insecure cluster).
pub fn client_secret(file: &Option<PathBuf>) -> Result<Secret> {
    match file.clone().or_else(|| std::env::var_os("BRAID_SECRET_FILE").map(PathBuf::from)) {
        Some(f) => Secret::load(&f).map_err(anyhow::Error::msg),
        None => Ok(Secret::Insecure),
    }
}

/// The TLS files a client connects with: `dir` (`-o tls_dir=`), else
/// `BRAID_TLS_DIR`, else none (plain connections).
pub fn client_tls(dir: Option<&std::path::Path>) -> Result<Option<std::sync::Arc<rpc::tls::TlsContext>>> {
    let dir = dir.map(PathBuf::from).or_else(|| std::env::var_os("BRAID_TLS_DIR").map(PathBuf::from));
    dir.map(|d| rpc::tls::TlsContext::load(&d, false).map_err(anyhow::Error::msg)).transpose()
}

/// The TLS identity a server runs with: the files in `dir`, if given.
pub fn server_tls(
    dir: Option<&std::path::Path>,
    required: bool,
) -> Result<Option<std::sync::Arc<rpc::tls::TlsContext>>> {
    match dir {
        Some(d) => Ok(Some(rpc::tls::TlsContext::load(d, required).map_err(anyhow::Error::msg)?)),
        None if required => bail!("requiring TLS needs the node's TLS files (--tls-dir DIR)"),
        None => Ok(None),
    }
}

/// `braid gen-secret`: a new cluster secret file; never overwrites one.
pub fn gen_secret(path: &std::path::Path) -> Result<()> {
    if path.exists() {
        bail!("{} exists; refusing to overwrite a secret", path.display());
    }
    Secret::create_file(path).map_err(anyhow::Error::msg)?;
    println!("created {}", path.display());
    Ok(())
}

/// `braid check-namespace`: prints what is wrong with the namespace the MDTs in
/// `dirs` hold, or that it is consistent. Fails with [`ProblemsFound`] if anything
/// is wrong (exit status 1), with another error if the MDTs cannot be read (2), as
/// fsck tells "found problems" from "could not check".
pub fn check_namespace(dirs: &[std::path::PathBuf]) -> Result<()> {
    let problems = mds::check::check_namespace(dirs).context("cannot read the MDTs")?;
    if problems.is_empty() {
        println!("namespace consistent across {} MDT(s)", dirs.len());
        return Ok(());
    }
    for p in &problems {
        println!("{p}");
    }
    Err(ProblemsFound(format!("{} problem(s) in the namespace", problems.len())).into())
}

/// What a checker (`braid check-namespace`, `braid fsck`) ends with when it ran and
/// found problems: exit status 1, where a failure to check at all is 2.
#[derive(Debug)]
pub struct ProblemsFound(pub String);

impl std::fmt::Display for ProblemsFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProblemsFound {}

/// The runtime of a command: every worker thread the machine offers.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}
