//! The `braid` binary: one executable for every server role and every tool. It parses
//! the command line, sets up logging and hands each command to the `cli` crate.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use cli::ClientOpts;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "braid", version, about = "braid: a parallel distributed file system", propagate_version = true)]
struct Cli {
    /// Log lines as text, or as JSON objects (one per line: time, level, target,
    /// message and the event's fields, such as the MDT or client it concerns). Also
    /// BRAID_LOG_FORMAT; the level is BRAID_LOG's (info for servers, warn otherwise).
    #[arg(long, global = true, value_name = "text|json")]
    log_format: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// Where a directory goes over MDTs (`lfs mkdir`/`setdirstripe` options).
#[derive(clap::Args, Debug)]
struct DirSpecOpts {
    /// The MDT of the directory (of its first shard); -1: the MDS chooses, spreading
    /// directories round-robin over the MDTs.
    #[arg(short = 'i', long = "mdt-index", value_name = "K", allow_negative_numbers = true)]
    mdt: Option<i64>,
    /// Stripe the directory's entries over N MDTs (-1: all of them).
    #[arg(short = 'c', long = "mdt-count", value_name = "N", allow_negative_numbers = true)]
    count: Option<i64>,
    /// How names are spread over the shards: fnv_1a_64 (the default) or all_char.
    #[arg(short = 'H', long = "mdt-hash", value_name = "HASH")]
    hash: Option<String>,
}

#[derive(Subcommand)]
enum CacheCommand {
    /// Size, use, hit rate, bytes served, fills, evictions and invalidations.
    Status {
        /// Print the mount's raw answer (JSON).
        #[arg(long)]
        json: bool,
        mountpoint: PathBuf,
    },
    /// Empty the cache (root only).
    Drop { mountpoint: PathBuf },
}

#[derive(Subcommand)]
enum NbdCommand {
    /// Export braid files as NBD block devices (to qemu, nbdinfo, nbdcopy, nbd-client).
    /// Without --tls-dir and --tls-required the export has no authentication: serve
    /// it on loopback or to trusted hosts only.
    Serve {
        /// The file system, braid://MGS/ (else `url` in [nbd] of --config).
        url: Option<String>,
        /// Configuration file (braid.toml): its [nbd] section; flags override it.
        #[arg(long)]
        config: Option<PathBuf>,
        /// An export: NAME=PATH[,ro][,size=SIZE] (size: create the file if missing and
        /// make it at least that long, sparse). Repeat for several; the first is the
        /// default export. Required here or as `exports` in [nbd] of --config.
        #[arg(long = "export", value_name = "NAME=PATH")]
        exports: Vec<String>,
        /// Address to serve NBD on (NBD's port is 10809). Default: 127.0.0.1:10809.
        #[arg(long)]
        listen: Option<String>,
        /// Make every write durable before its reply (as FUA on each).
        #[arg(long)]
        sync: bool,
        /// Bytes of what the exports read that the server keeps in memory for rereads,
        /// as the kernel's page cache does for a local file (K, M, G suffixes; 0: none).
        /// Default: an eighth of the machine's memory.
        #[arg(long, value_name = "SIZE")]
        page_cache: Option<String>,
        /// Microseconds a connection with nothing in flight stays awake after a reply
        /// for the client's next request, instead of sleeping until it comes (a
        /// sleeping thread is slow to wake on a virtual machine); 0: never. Default:
        /// 100, at most 10000.
        #[arg(long, value_name = "US")]
        poll_us: Option<u64>,
        /// Read and write the objects of OSTs whose OSS runs on this machine directly,
        /// through descriptors the OSS hands over, instead of sending it requests
        /// (also `short_circuit` in BRAID_CLIENT_OPTIONS).
        #[arg(long)]
        short_circuit: bool,
        /// Connections served at once; one more is refused in its handshake (with
        /// NBD_REP_ERR_POLICY) and logged. Default: 16.
        #[arg(long, value_name = "N")]
        max_connections: Option<usize>,
        /// Bytes of request data (writes' payloads, reads' data) the server holds at
        /// once for all connections; past it, a connection's next request waits (K, M,
        /// G suffixes). A larger request counts as the whole budget. Default: 256M.
        #[arg(long, value_name = "SIZE")]
        max_inflight_bytes: Option<String>,
        /// Offer TLS (NBD_OPT_STARTTLS) with the x509 files in DIR: ca.pem (clients'
        /// certificates must be signed by it), cert.pem and key.pem (the server's).
        #[arg(long, value_name = "DIR")]
        tls_dir: Option<PathBuf>,
        /// Refuse clients that do not start TLS, before they learn of any export.
        #[arg(long)]
        tls_required: bool,
        /// The cluster secret (also BRAID_SECRET_FILE, then `secret_file` of --config).
        #[arg(long)]
        secret_file: Option<PathBuf>,
    },
}

/// What `braid stats` and `braid top` look at.
#[derive(clap::Args)]
struct StatsOpts {
    /// braid://HOST:PORT/ of the MGS.
    url: String,
    /// Only targets whose name starts with this (OST0001, MDT, OST).
    target: Option<String>,
    /// Seconds between the two looks a view compares.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// ops, bytes, latency or target.
    #[arg(long, default_value = "ops")]
    sort: String,
    /// File holding the cluster secret (also BRAID_SECRET_FILE).
    #[arg(long)]
    secret_file: Option<PathBuf>,
}

impl StatsOpts {
    fn interval(&self) -> anyhow::Result<std::time::Duration> {
        if !(self.interval > 0.0 && self.interval <= 3600.0) {
            anyhow::bail!("--interval {}: seconds, more than 0 and at most 3600", self.interval);
        }
        Ok(std::time::Duration::from_secs_f64(self.interval))
    }
}

#[derive(Subcommand)]
enum TraceCommand {
    /// Start recording a mount's operations (root; starts its collector).
    On { mountpoint: PathBuf },
    /// Stop recording.
    Off { mountpoint: PathBuf },
    /// The mount's tracer: on or off, records written, collected and dropped, its
    /// collector and where it ships.
    Status {
        #[arg(long)]
        json: bool,
        mountpoint: PathBuf,
    },
    /// Drain a mount's trace ring into a trace directory or to a collection server
    /// (a mount starts this itself when tracing is turned on).
    Collect {
        /// The ring file (braid trace status shows it).
        #[arg(long)]
        ring: PathBuf,
        /// Store the records in this trace directory.
        #[arg(long, conflicts_with = "server")]
        dir: Option<PathBuf>,
        /// Ship the records to this collection server (braid trace serve).
        #[arg(long)]
        server: Option<String>,
        /// The cluster secret, for the server (also BRAID_SECRET_FILE).
        #[arg(long)]
        secret_file: Option<PathBuf>,
        /// Ship over TLS with the files in DIR (also BRAID_TLS_DIR).
        #[arg(long, value_name = "DIR")]
        tls_dir: Option<PathBuf>,
    },
    /// Run a collection server: store what collectors ship in a trace directory.
    Serve {
        /// Trace directory.
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "127.0.0.1:9450")]
        listen: String,
        #[arg(long)]
        secret_file: Option<PathBuf>,
        /// Run without authentication (test setups only).
        #[arg(long)]
        insecure: bool,
        /// TLS files of this server (ca.pem, cert.pem, key.pem), as the cluster's
        /// servers take them.
        #[arg(long, value_name = "DIR")]
        tls_dir: Option<PathBuf>,
        /// Refuse collectors that do not speak TLS.
        #[arg(long, requires = "tls_dir")]
        tls_required: bool,
        /// Close a segment file at this size (bytes; K, M, G suffixes).
        #[arg(long, default_value = "64M")]
        segment_size: String,
        /// Drop the oldest segments past this total (bytes; K, M, G, T suffixes).
        #[arg(long, default_value = "10G")]
        max_size: String,
    },
    /// One line per stored operation (seed 001's OPLOG lines).
    Show {
        #[arg(long)]
        dir: PathBuf,
        #[command(flatten)]
        filter: cli::trace::FilterArgs,
    },
    /// Counts, bytes, sizes and latency percentiles per operation, job, user and file,
    /// and each file's read pattern and write pattern.
    Stats {
        #[arg(long)]
        dir: PathBuf,
        #[command(flatten)]
        filter: cli::trace::FilterArgs,
    },
    /// SVG plots: each file's offsets over time (offsets.svg) and each job's
    /// operations per second (jobs.svg).
    Plot {
        #[arg(long)]
        dir: PathBuf,
        /// Directory to write the plots in.
        #[arg(long)]
        out: PathBuf,
        /// Files drawn at most (those with the most transfers).
        #[arg(long, default_value_t = 8)]
        files: usize,
        #[command(flatten)]
        filter: cli::trace::FilterArgs,
    },
    /// The stored operations as CSV (default) or JSON lines.
    Export {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, conflicts_with = "json")]
        csv: bool,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        filter: cli::trace::FilterArgs,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Run the management service (MGS).
    Mgs(cli::serve::MgsArgs),
    /// Run a metadata server (MDS) for one or more MDTs.
    Mds(cli::serve::MdsArgs),
    /// Run an object storage server (OSS) for one or more OSTs.
    Oss(cli::serve::OssArgs),
    /// Run a whole cluster (MGS, MDTs, OSTs) in this process.
    Local(cli::local::LocalArgs),
    /// Mount a file system with FUSE.
    Mount(cli::mount::MountArgs),
    /// Unmount a braid mount.
    Umount { mountpoint: PathBuf },
    /// The SSD read cache of a mount (`-o cache_dir=PATH,cache_size=SIZE`).
    #[command(subcommand)]
    Cache(CacheCommand),
    /// The I/O tracer: turn it on and off on a mount, collect, serve, and read traces.
    #[command(subcommand)]
    Trace(TraceCommand),
    /// Network block devices backed by braid files.
    #[command(subcommand)]
    Nbd(NbdCommand),
    /// IOR-, mdtest- and IOzone-style benchmarks, sweeps and plots.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// The cluster's live view: ops/s, MiB/s, errors and latency percentiles per
    /// target and operation, and per job, over an interval (from every server's
    /// metrics).
    Stats {
        #[command(flatten)]
        view: StatsOpts,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// `braid stats`, refreshed as `top` is (keys: o ops, b bytes, l latency, t target,
    /// q quit).
    Top {
        #[command(flatten)]
        view: StatsOpts,
        /// Print this many views one after the other and stop (no terminal needed).
        #[arg(short = 'n', long)]
        iterations: Option<u64>,
    },
    /// Check MDTs and OSTs online, with the file system in use (as LFSCK): link
    /// counts, `..`, entries naming nothing, objects no layout names (orphans) and
    /// layouts naming missing objects (the bytes that read as zeros). A dry run unless
    /// --repair. Exits 1 if problems are left, 2 if it could not check.
    Fsck {
        /// braid://HOST:PORT/ of the MGS.
        url: String,
        /// Repair what can be: link counts, `..`, entries naming nothing; orphan
        /// objects moved to their OST's lost+found/; missing objects made again,
        /// empty (their bytes are lost and read as zeros).
        #[arg(long)]
        repair: bool,
        /// With --repair: destroy orphan objects instead of keeping them in lost+found/.
        #[arg(long, requires = "repair")]
        destroy_orphans: bool,
        /// Most rows and objects read per second, to leave the servers to the file
        /// system's users (LFSCK's --speed); 0 for no limit.
        #[arg(long, default_value_t = cli::fsck::DEFAULT_SPEED_LIMIT)]
        speed_limit: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// File holding the cluster secret (also BRAID_SECRET_FILE).
        #[arg(long)]
        secret_file: Option<PathBuf>,
    },
    /// Create a new cluster secret file.
    GenSecret { path: PathBuf },
    /// Check the namespace across MDTs from their stores: every entry names a live
    /// inode, link counts and `..` are right, nothing is lost or undecided. The MDSs
    /// must be stopped. Exits 1 if anything is wrong.
    CheckNamespace {
        /// An MDT directory; give every MDT of the file system.
        #[arg(long = "mdt", required = true, value_name = "DIR")]
        mdts: Vec<PathBuf>,
    },
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
    /// Create directories (as `lfs mkdir`: `-i K` on MDT K, a remote directory; `-c N`
    /// striped over N MDTs from K; `-D` sets an existing directory's default for new
    /// subdirectories instead, as `setdirstripe -D`).
    Mkdir {
        #[command(flatten)]
        client: ClientOpts,
        #[arg(short = 'p')]
        parents: bool,
        /// Set the default for new subdirectories of the (existing) directories.
        #[arg(short = 'D', long = "default")]
        default: bool,
        #[command(flatten)]
        dir: DirSpecOpts,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Show a file's attributes.
    Stat {
        #[command(flatten)]
        client: ClientOpts,
        path: String,
    },
    /// Create an empty file with a layout, set a directory's default layout, or change
    /// a file's components (Lustre's `lfs setstripe`; `-E` ends a component).
    #[command(disable_help_flag = true, override_help = cli::stripe::SETSTRIPE_HELP)]
    Setstripe {
        /// The options and the path, in order (see `braid setstripe --help`).
        #[arg(allow_hyphen_values = true, trailing_var_arg = true, num_args = 0..)]
        args: Vec<String>,
    },
    /// Move a file's bytes to a new layout, another pool (Lustre's `lfs migrate`), or a directory tree to another MDT (`-m`).
    #[command(disable_help_flag = true, override_help = cli::stripe::MIGRATE_HELP)]
    Migrate {
        /// setstripe's layout options and the file, in order (see `braid migrate --help`).
        #[arg(allow_hyphen_values = true, trailing_var_arg = true, num_args = 0..)]
        args: Vec<String>,
    },
    /// File-level mirrors: create, extend, resync, split, verify (Lustre's `lfs mirror`).
    #[command(disable_help_flag = true, override_help = cli::mirror::MIRROR_HELP)]
    Mirror {
        /// The mirror command, its options and files, in order (see `braid mirror --help`).
        #[arg(allow_hyphen_values = true, trailing_var_arg = true, num_args = 0..)]
        args: Vec<String>,
    },
    /// Automated hot/cool tiering: the service, its status, and explicit moves.
    #[command(disable_help_flag = true, override_help = cli::tier::TIER_HELP)]
    Tier {
        /// The tier command, its options and paths, in order (see `braid tier --help`).
        #[arg(allow_hyphen_values = true, trailing_var_arg = true, num_args = 0..)]
        args: Vec<String>,
    },
    /// Show the layout of files, or a directory's default.
    Getstripe {
        #[command(flatten)]
        client: ClientOpts,
        /// Show only the directory's default layout.
        #[arg(short = 'd', long = "directory")]
        directory: bool,
        /// Only the stripe count.
        #[arg(short = 'c', long = "stripe-count")]
        count: bool,
        /// Only the stripe size.
        #[arg(short = 'S', long = "stripe-size")]
        size: bool,
        /// Only the first OST index.
        #[arg(short = 'i', long = "stripe-index")]
        index: bool,
        /// Only the component with this id.
        #[arg(short = 'I', long = "component-id")]
        component: Option<u32>,
        /// Only the number of components.
        #[arg(long = "component-count")]
        component_count: bool,
        /// Only the index of the MDT holding the inode.
        #[arg(short = 'm', long = "mdt-index")]
        mdt: bool,
        path: String,
    },
    /// Make a directory over MDTs as `braid mkdir` (as `lfs setdirstripe`), or with
    /// `-D` set a directory's default for the directories made in it.
    Setdirstripe {
        #[command(flatten)]
        client: ClientOpts,
        /// Set the default for new subdirectories (inherited by them).
        #[arg(short = 'D', long = "default")]
        default: bool,
        /// With -D, remove the default.
        #[arg(short = 'd', long = "delete")]
        delete: bool,
        #[command(flatten)]
        dir: DirSpecOpts,
        path: String,
    },
    /// Show how a directory is spread over MDTs (as `lfs getdirstripe`).
    Getdirstripe {
        #[command(flatten)]
        client: ClientOpts,
        /// The directory's default for new subdirectories instead.
        #[arg(short = 'D', long = "default")]
        default: bool,
        /// Only the stripe count.
        #[arg(short = 'c', long = "mdt-count")]
        count: bool,
        /// Only the index of the (first) MDT.
        #[arg(short = 'i', visible_short_alias = 'm', long = "mdt-index")]
        index: bool,
        /// Only the hash type.
        #[arg(short = 'H', long = "mdt-hash")]
        hash: bool,
        path: String,
    },
    /// OST pools (Lustre's lctl pool_new/pool_add/pool_remove/pool_destroy/pool_list):
    /// `braid pool create braid.hot`, `braid pool add braid.hot OST0000 OST[1-2]`,
    /// `braid pool list braid` or `braid pool list braid.hot`.
    Pool {
        #[command(flatten)]
        client: ClientOpts,
        /// create, add, remove, destroy or list.
        op: String,
        /// FSNAME.POOL (FSNAME alone for list).
        name: String,
        /// OSTs to add or remove: OST0003, braid-OST0003_UUID, OST[0-3] or 0,2-3.
        osts: Vec<String>,
        /// The cluster: a braid://MGS/ address or a path inside a mount (else
        /// BRAID_CLUSTER, else the current directory).
        #[arg(long)]
        cluster: Option<String>,
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
        /// Only the OSTs of this pool (POOL or FSNAME.POOL), and the MDTs.
        #[arg(short = 'p', long = "pool")]
        pool: Option<String>,
        path: String,
    },
}

/// How log lines are written (`--log-format`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// From the flag, else BRAID_LOG_FORMAT, else text. It goes into the
    /// environment, so that processes this one starts (a background mount, a trace
    /// collector) log the same way.
    fn choose(flag: Option<&str>) -> Result<LogFormat, String> {
        let env = std::env::var("BRAID_LOG_FORMAT").ok();
        let format = match flag.or(env.as_deref()).unwrap_or("text") {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => return Err(format!("--log-format {other}: text or json")),
        };
        if flag.is_some() {
            // SAFETY: set before any thread of this process is started.
            unsafe { std::env::set_var("BRAID_LOG_FORMAT", if format == LogFormat::Json { "json" } else { "text" }) };
        }
        Ok(format)
    }
}

fn init_logging(default_level: &str, format: LogFormat) {
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
    // openraft logs every vote at INFO and every message at DEBUG: a replicated MDS
    // says what matters itself, so the library's own lines show from WARN (all of
    // them at BRAID_LOG=trace).
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let raft = if level == tracing::Level::TRACE { level } else { level.min(tracing::Level::WARN) };
    let filter = tracing_subscriber::filter::Targets::new().with_default(level).with_target("openraft", raft);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => tracing_subscriber::registry().with(fmt.with_ansi(ansi).with_filter(filter)).try_init(),
        LogFormat::Json => tracing_subscriber::registry()
            .with(fmt.json().with_current_span(false).with_span_list(false).with_filter(filter))
            .try_init(),
    };
}

fn main() {
    // mount(8) and fuse3's mount.fuse run the binary as `mount.fuse.braid SOURCE DIR
    // -o ...` or `braid SOURCE DIR -o ...`: not a subcommand, mount's own convention.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if cli::mount_helper::invoked_as_helper(&args) {
        init_logging("warn", LogFormat::choose(None).unwrap_or(LogFormat::Text));
        if let Err(f) = cli::mount_helper::run(&args) {
            eprintln!("mount.fuse.braid: {:#}", f.error);
            std::process::exit(f.exit_code);
        }
        return;
    }
    let cli = Cli::parse_from(args);
    let server = matches!(cli.command, Command::Mgs(_) | Command::Mds(_) | Command::Oss(_) | Command::Local(_));
    let format = LogFormat::choose(cli.log_format.as_deref()).unwrap_or_else(|e| {
        eprintln!("braid: {e}");
        std::process::exit(2)
    });
    init_logging(if server { "info" } else { "warn" }, format);
    let checking = matches!(cli.command, Command::CheckNamespace { .. } | Command::Fsck { .. });
    if let Err(e) = run(cli.command) {
        eprintln!("braid: {e:#}");
        // A checker's problems found (1) are not its failure to check (2).
        let found = e.downcast_ref::<cli::ProblemsFound>().is_some();
        std::process::exit(if checking && !found { 2 } else { 1 });
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    use cli::tools;
    match command {
        Command::Mgs(a) => cli::serve::run_mgs(a),
        Command::Mds(a) => cli::serve::run_mds(a),
        Command::Oss(a) => cli::serve::run_oss(a),
        Command::Local(a) => cli::local::run(a),
        Command::Mount(a) => cli::mount::run(a),
        Command::Umount { mountpoint } => cli::mount::umount(&mountpoint),
        Command::Bench(cmd) => bench::run(cmd, Some(cli::native_bench::connect)),
        Command::Stats { view, json } => cli::stats::run_stats(
            &view.url,
            cli::client_secret(&view.secret_file)?,
            view.target.as_deref(),
            view.interval()?,
            cli::stats::SortBy::parse(&view.sort)?,
            json,
        ),
        Command::Top { view, iterations } => cli::stats::run_top(
            &view.url,
            cli::client_secret(&view.secret_file)?,
            view.target.as_deref(),
            view.interval()?,
            cli::stats::SortBy::parse(&view.sort)?,
            iterations,
        ),
        Command::Fsck { url, repair, destroy_orphans, speed_limit, json, secret_file } => cli::fsck::run(
            &url,
            cli::client_secret(&secret_file)?,
            cli::fsck::Options { repair, destroy_orphans, speed_limit },
            json,
        ),
        Command::GenSecret { path } => cli::gen_secret(&path),
        Command::CheckNamespace { mdts } => cli::check_namespace(&mdts),
        Command::Cp { client, paths } => tools::cp(&client, &paths),
        Command::Ls { client, long, path } => tools::ls(&client, &path, long),
        Command::Rm { client, recursive, paths } => tools::rm(&client, &paths, recursive),
        Command::Mkdir { client, parents, default, dir, paths } => {
            let spec = cli::stripe::dir_spec(dir.mdt, dir.count, dir.hash.as_deref())?;
            if default {
                return paths.iter().try_for_each(|p| cli::stripe::setdirstripe(&client, p, true, false, spec));
            }
            tools::mkdir(&client, &paths, parents, spec)
        }
        Command::Setdirstripe { client, default, delete, dir, path } => {
            let spec = cli::stripe::dir_spec(dir.mdt, dir.count, dir.hash.as_deref())?;
            cli::stripe::setdirstripe(&client, &path, default, delete, spec)
        }
        Command::Stat { client, path } => tools::stat(&client, &path),
        Command::Setstripe { args } => {
            if args.iter().any(|a| a == "-h" || a == "--help") || args.is_empty() {
                println!("{}", cli::stripe::SETSTRIPE_HELP);
                return Ok(());
            }
            cli::stripe::setstripe(cli::stripe::parse_setstripe(&args)?)
        }
        Command::Migrate { args } => {
            if args.iter().any(|a| a == "-h" || a == "--help") || args.is_empty() {
                println!("{}", cli::stripe::MIGRATE_HELP);
                return Ok(());
            }
            cli::stripe::migrate(&args)
        }
        Command::Tier { args } => {
            if args.is_empty() || args.iter().any(|a| a == "-h" || a == "--help") {
                println!("{}", cli::tier::TIER_HELP);
                return Ok(());
            }
            cli::tier::main(&args)
        }
        Command::Mirror { args } => {
            if args.is_empty() || args.iter().any(|a| a == "-h" || a == "--help") {
                println!("{}", cli::mirror::MIRROR_HELP);
                return Ok(());
            }
            cli::mirror::run(&args)
        }
        Command::Getdirstripe { client, default, count, index, hash, path } => {
            cli::stripe::getdirstripe(&client, &path, &cli::stripe::DirstripeOpts { default, count, index, hash })
        }
        Command::Getstripe { client, mdt: true, path, .. } => cli::stripe::get_mdt_index(&client, &path),
        Command::Getstripe { client, directory, count, size, index, component, component_count, path, .. } => {
            let o = cli::stripe::GetstripeOpts {
                directory_only: directory,
                count,
                size,
                index,
                component,
                component_count,
            };
            cli::stripe::getstripe(&client, &path, &o)
        }
        Command::Df { client, inodes, human, pool, path, .. } => tools::df(&client, &path, inodes, human, pool),
        Command::Pool { client, op, name, osts, cluster } => {
            let cluster = cluster.or_else(|| std::env::var("BRAID_CLUSTER").ok()).unwrap_or_else(|| ".".into());
            cli::pool::pool(&client, &cluster, cli::pool::PoolCommand::parse(&op)?, &name, &osts)
        }
        Command::Cache(CacheCommand::Status { json, mountpoint }) => cli::mountctl::cache_status(&mountpoint, json),
        Command::Cache(CacheCommand::Drop { mountpoint }) => cli::mountctl::cache_drop(&mountpoint),
        Command::Trace(t) => trace_command(t),
        Command::Nbd(NbdCommand::Serve {
            url,
            config,
            exports,
            listen,
            sync,
            page_cache,
            poll_us,
            short_circuit,
            max_connections,
            max_inflight_bytes,
            tls_dir,
            tls_required,
            secret_file,
        }) => cli::nbd::serve(cli::nbd::ServeArgs {
            url,
            config,
            exports,
            listen,
            sync,
            page_cache,
            poll_us,
            short_circuit,
            secret_file,
            max_connections,
            max_inflight_bytes,
            tls_dir,
            tls_required,
        }),
    }
}

fn trace_command(t: TraceCommand) -> anyhow::Result<()> {
    match t {
        TraceCommand::On { mountpoint } => cli::mountctl::trace_switch(&mountpoint, true),
        TraceCommand::Off { mountpoint } => cli::mountctl::trace_switch(&mountpoint, false),
        TraceCommand::Status { json, mountpoint } => cli::mountctl::trace_status(&mountpoint, json),
        TraceCommand::Collect { ring, dir, server, secret_file, tls_dir } => {
            cli::trace::collect(&ring, dir.as_deref(), server.as_deref(), secret_file, tls_dir.as_deref())
        }
        TraceCommand::Serve { dir, listen, secret_file, insecure, tls_dir, tls_required, segment_size, max_size } => {
            let secret = cli::server_secret(secret_file, insecure)?;
            let tls = cli::server_tls(tls_dir.as_deref(), tls_required)?;
            cli::trace::serve(&dir, &listen, secret, tls, &segment_size, &max_size)
        }
        TraceCommand::Show { dir, filter } => cli::trace::show(&dir, &filter),
        TraceCommand::Stats { dir, filter } => cli::trace::stats(&dir, &filter),
        TraceCommand::Plot { dir, out, files, filter } => cli::trace::plot(&dir, &filter, &out, files),
        TraceCommand::Export { dir, csv: _, json, filter } => cli::trace::export(&dir, &filter, json),
    }
}
