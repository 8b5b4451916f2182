//! The `braid` binary: one executable for every server role and every tool.
//! It parses the command line and configuration, then wires the crates together.

mod config;
mod mount;
mod native_bench;
mod serve;
mod tools;
mod url;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use proto::auth::Secret;

#[derive(Parser)]
#[command(name = "braid", version, about = "braid: a parallel distributed file system", propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Options shared by every server role.
#[derive(Args, Debug, Clone)]
pub struct ServerOpts {
    /// Configuration file (braid.toml); command-line flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// File holding the cluster secret (also BRAID_SECRET_FILE).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Run without authentication (test clusters only).
    #[arg(long)]
    insecure: bool,
    /// File system name.
    #[arg(long)]
    fsname: Option<String>,
    /// Heartbeat interval of targets to the MGS, in milliseconds.
    #[arg(long)]
    heartbeat_ms: Option<u64>,
}

/// Options of every client tool.
#[derive(Args, Debug, Clone)]
pub struct ClientOpts {
    /// File holding the cluster secret (also BRAID_SECRET_FILE).
    #[arg(long, global = true)]
    secret_file: Option<PathBuf>,
    /// How long an operation keeps retrying while a server is unreachable, in seconds.
    #[arg(long, global = true, default_value_t = 60)]
    timeout_s: u64,
}

#[derive(Subcommand)]
enum Command {
    /// Run the management service (MGS).
    Mgs {
        #[command(flatten)]
        server: ServerOpts,
        /// Address to listen on.
        #[arg(long)]
        listen: Option<String>,
        /// Directory of the MGS registry.
        #[arg(long)]
        data: Option<PathBuf>,
        /// A target silent for this long is marked down, in milliseconds.
        #[arg(long)]
        target_timeout_ms: Option<u64>,
    },
    /// Run a metadata server (MDS) for one or more MDTs.
    Mds {
        #[command(flatten)]
        server: ServerOpts,
        #[arg(long)]
        listen: Option<String>,
        /// Address other nodes use to reach this server (default: the listen address).
        #[arg(long)]
        advertise: Option<String>,
        /// MGS address HOST:PORT.
        #[arg(long)]
        mgs: Option<String>,
        /// MDT directory (repeat for several MDTs).
        #[arg(long = "mdt")]
        mdts: Vec<PathBuf>,
        /// Default stripe count of the file system (-1 = all OSTs).
        #[arg(long, allow_hyphen_values = true)]
        default_stripe_count: Option<i64>,
        /// Default stripe size of the file system (e.g. 1M).
        #[arg(long)]
        default_stripe_size: Option<String>,
        /// How often each MDT database is made durable and its redo log emptied, in
        /// milliseconds: the most a machine crash can take back without fsync.
        #[arg(long)]
        checkpoint_ms: Option<u64>,
        /// Force the redo log to disk before every reply (every acknowledged operation
        /// survives a power loss; slower).
        #[arg(long)]
        sync_journal: bool,
    },
    /// Run an object storage server (OSS) for one or more OSTs.
    Oss {
        #[command(flatten)]
        server: ServerOpts,
        #[arg(long)]
        listen: Option<String>,
        #[arg(long)]
        advertise: Option<String>,
        #[arg(long)]
        mgs: Option<String>,
        /// OST directory (repeat for several OSTs).
        #[arg(long = "ost")]
        osts: Vec<PathBuf>,
    },
    /// Run a whole cluster (MGS, MDTs, OSTs) in this process.
    Local {
        /// Directory for all data; created if needed, reused when started again.
        #[arg(long)]
        data: PathBuf,
        #[arg(long, default_value_t = 4)]
        osts: u32,
        #[arg(long, default_value_t = 1)]
        mdts: u32,
        /// MGS address.
        #[arg(long, default_value = "127.0.0.1:9400")]
        listen: String,
        #[arg(long, default_value = "braid")]
        fsname: String,
        #[arg(long, default_value_t = 1000)]
        heartbeat_ms: u64,
        #[arg(long, default_value_t = 5000)]
        target_timeout_ms: u64,
        /// Also mount the file system here (FUSE).
        #[arg(long)]
        mount: Option<PathBuf>,
        /// Mount options (see `braid mount`).
        #[arg(short = 'o')]
        options: Vec<String>,
        /// Make the roles and the mount of this process talk over TCP, as separate
        /// nodes do (default: in-process, as Lustre's 0@lo; clients of other
        /// processes always use TCP).
        #[arg(long)]
        tcp: bool,
    },
    /// Mount a file system with FUSE.
    Mount {
        /// braid://HOST:PORT/ of the MGS.
        url: String,
        mountpoint: PathBuf,
        /// Stay in the foreground (otherwise return once the mount is ready).
        #[arg(short = 'f')]
        foreground: bool,
        /// Options: attr_timeout=S, entry_timeout=S, allow_other, direct_io, ro, threads=N, timeout=S, max_write=BYTES, readahead_kb=KIB, dir_leases=0|1.
        #[arg(short = 'o')]
        options: Vec<String>,
        #[arg(long)]
        secret_file: Option<PathBuf>,
        /// Log file of a background mount.
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// Unmount a braid mount.
    Umount { mountpoint: PathBuf },
    /// IOR-, mdtest- and IOzone-style benchmarks, sweeps and plots.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Create a new cluster secret file.
    GenSecret { path: PathBuf },
    /// Copy files into, out of, or within braid (paths as braid://HOST:PORT/path).
    Cp {
        #[command(flatten)]
        client: ClientOpts,
        /// Sources, then the destination.
        #[arg(required = true, num_args = 2..)]
        paths: Vec<String>,
    },
    /// List a directory.
    Ls {
        #[command(flatten)]
        client: ClientOpts,
        #[arg(short = 'l')]
        long: bool,
        path: String,
    },
    /// Remove files (and directories with -r).
    Rm {
        #[command(flatten)]
        client: ClientOpts,
        #[arg(short = 'r')]
        recursive: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Create directories.
    Mkdir {
        #[command(flatten)]
        client: ClientOpts,
        #[arg(short = 'p')]
        parents: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Show a file's attributes.
    Stat {
        #[command(flatten)]
        client: ClientOpts,
        path: String,
    },
    /// Create an empty file with a layout, or set a directory's default layout.
    Setstripe {
        #[command(flatten)]
        client: ClientOpts,
        /// Stripe count (-1 = all OSTs).
        #[arg(short = 'c', long = "stripe-count", allow_hyphen_values = true)]
        count: Option<i64>,
        /// Stripe size, a multiple of 64K (e.g. 1M).
        #[arg(short = 'S', long = "stripe-size")]
        size: Option<String>,
        /// Index of the first OST.
        #[arg(short = 'i', long = "stripe-index", allow_hyphen_values = true)]
        index: Option<i64>,
        /// Explicit OST list, e.g. 0,2-3.
        #[arg(short = 'o', long = "ost")]
        osts: Option<String>,
        /// Remove a directory's default layout.
        #[arg(short = 'd', long = "delete")]
        delete: bool,
        path: String,
    },
    /// Show the layout of files, or a directory's default.
    Getstripe {
        #[command(flatten)]
        client: ClientOpts,
        /// Show only the directory's default layout.
        #[arg(short = 'd', long = "directory")]
        directory: bool,
        path: String,
    },
    /// Show space and inode usage of every MDT and OST.
    #[command(disable_help_flag = true)]
    Df {
        #[arg(long, action = clap::ArgAction::Help, help = "Print help")]
        help: Option<bool>,
        #[command(flatten)]
        client: ClientOpts,
        /// Inodes instead of space.
        #[arg(short = 'i')]
        inodes: bool,
        /// Human-readable sizes.
        #[arg(short = 'h', long = "human-readable")]
        human: bool,
        path: String,
    },
}

fn init_logging(default_level: &str) {
    let level = std::env::var("BRAID_LOG").unwrap_or_else(|_| default_level.to_string());
    let level = match level.to_ascii_lowercase().as_str() {
        "trace" => tracing::Level::TRACE,
        "debug" => tracing::Level::DEBUG,
        "warn" => tracing::Level::WARN,
        "error" => tracing::Level::ERROR,
        _ => tracing::Level::INFO,
    };
    // Colours only on a terminal: a log file gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_max_level(level).with_ansi(ansi).with_writer(std::io::stderr).try_init();
}

/// The secret a server runs with: a file, or an explicit `--insecure`.
fn server_secret(file: Option<PathBuf>, insecure: bool) -> Result<Secret> {
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

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}

fn run_server<F>(what: &str, start: F) -> Result<()>
where
    F: std::future::Future<Output = Result<String>>,
{
    let rt = runtime()?;
    let r = rt.block_on(async {
        let addr = start.await?;
        println!("{what} listening on {addr}");
        let sig = serve::until_signal().await?;
        tracing::info!("{what} stopping on {sig}");
        Ok(())
    });
    // Every acknowledged operation is already committed; do not wait for idle workers.
    rt.shutdown_background();
    r
}

fn main() {
    let cli = Cli::parse();
    let server =
        matches!(cli.command, Command::Mgs { .. } | Command::Mds { .. } | Command::Oss { .. } | Command::Local { .. });
    init_logging(if server { "info" } else { "warn" });
    if let Err(e) = run(cli.command) {
        eprintln!("braid: {e:#}");
        std::process::exit(1);
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Mgs { server, listen, data, target_timeout_ms } => {
            let file = config::load(server.config.as_deref())?;
            let common = config::common(&server, &file)?;
            let listen = listen.or(file.mgs.listen.clone()).unwrap_or_else(|| "127.0.0.1:9400".into());
            let data = data.or(file.mgs.data.clone()).context("the MGS needs --data DIR")?;
            let timeout = Duration::from_millis(target_timeout_ms.or(file.mgs.target_timeout_ms).unwrap_or(5000));
            run_server("MGS", async move { serve::start_mgs(&listen, &data, &common, timeout).await })
        }
        Command::Mds {
            server,
            listen,
            advertise,
            mgs,
            mdts,
            default_stripe_count,
            default_stripe_size,
            checkpoint_ms,
            sync_journal,
        } => {
            let file = config::load(server.config.as_deref())?;
            let common = config::common(&server, &file)?;
            let listen = listen.or(file.mds.listen.clone()).unwrap_or_else(|| "127.0.0.1:0".into());
            let advertise = advertise.or(file.mds.advertise.clone());
            let mgs = mgs.or(file.mds.mgs.clone()).context("the MDS needs --mgs HOST:PORT")?;
            let mdts = if mdts.is_empty() { file.mds.mdts.clone() } else { mdts };
            let size = match default_stripe_size.or(file.mds.default_stripe_size.clone()) {
                Some(s) => Some(layout::parse_size(&s)?),
                None => None,
            };
            let count = default_stripe_count.or(file.mds.default_stripe_count).unwrap_or(1);
            let default = layout::LayoutSpec::raid0(Some(count), Some(size.unwrap_or(1 << 20)));
            default.validate().context("invalid default layout")?;
            let checkpoint_ms = checkpoint_ms.or(file.mds.checkpoint_ms).unwrap_or(1000);
            if checkpoint_ms == 0 {
                bail!("--checkpoint-ms must be at least 1");
            }
            let cfg = mds::MdsConfig {
                default_layout: default,
                checkpoint_interval: Duration::from_millis(checkpoint_ms),
                sync_journal: sync_journal || file.mds.sync_journal.unwrap_or(false),
                ..Default::default()
            };
            run_server("MDS", async move {
                serve::start_mds(&listen, advertise.as_deref(), &mgs, &mdts, &common, cfg).await
            })
        }
        Command::Oss { server, listen, advertise, mgs, osts } => {
            let file = config::load(server.config.as_deref())?;
            let common = config::common(&server, &file)?;
            let listen = listen.or(file.oss.listen.clone()).unwrap_or_else(|| "127.0.0.1:0".into());
            let advertise = advertise.or(file.oss.advertise.clone());
            let mgs = mgs.or(file.oss.mgs.clone()).context("the OSS needs --mgs HOST:PORT")?;
            let osts = if osts.is_empty() { file.oss.osts.clone() } else { osts };
            run_server(
                "OSS",
                async move { serve::start_oss(&listen, advertise.as_deref(), &mgs, &osts, &common).await },
            )
        }
        Command::Local { data, osts, mdts, listen, fsname, heartbeat_ms, target_timeout_ms, mount, options, tcp } => {
            let settings = mount::parse_options(&options)?;
            let local = tools::Local { osts, mdts, listen, fsname, heartbeat_ms, target_timeout_ms, in_process: !tcp };
            tools::local(&data, &local, mount.map(|m| (m, settings)))
        }
        Command::Mount { url, mountpoint, foreground, options, secret_file, log } => {
            let settings = mount::parse_options(&options)?;
            if foreground {
                mount::mount_foreground(&url, &mountpoint, settings, secret_file)
            } else {
                mount::mount_background(&url, &mountpoint, &options, secret_file, log)
            }
        }
        Command::Umount { mountpoint } => mount::umount(&mountpoint),
        Command::Bench(cmd) => bench::run(cmd, Some(native_bench::connect)),
        Command::GenSecret { path } => {
            if path.exists() {
                bail!("{} exists; refusing to overwrite a secret", path.display());
            }
            Secret::create_file(&path).map_err(anyhow::Error::msg)?;
            println!("created {}", path.display());
            Ok(())
        }
        Command::Cp { client, paths } => tools::cp(&client, &paths),
        Command::Ls { client, long, path } => tools::ls(&client, &path, long),
        Command::Rm { client, recursive, paths } => tools::rm(&client, &paths, recursive),
        Command::Mkdir { client, parents, paths } => tools::mkdir(&client, &paths, parents),
        Command::Stat { client, path } => tools::stat(&client, &path),
        Command::Setstripe { client, count, size, index, osts, delete, path } => {
            tools::setstripe(&client, &path, count, size.as_deref(), index, osts.as_deref(), delete)
        }
        Command::Getstripe { client, directory, path } => tools::getstripe(&client, &path, directory),
        Command::Df { client, inodes, human, path, .. } => tools::df(&client, &path, inodes, human),
    }
}
