//! Starting the server roles (MGS, MDS, OSS): `braid mgs`, `braid mds`, `braid oss`,
//! and the `start_*` functions that `braid local` and the tests' in-process cluster
//! call to run them all in one process.
//!
//! Each role binds its listener first (so it knows the address it advertises),
//! registers its targets with the MGS, then serves. `local` runs all three roles in
//! one process and one runtime, each on its own TCP port for clients of other
//! processes; the roles and the mount of that process reach each other in-process
//! (`rpc::local`) unless `--tcp` asks for sockets all the way.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use proto::auth::Secret;
use proto::msg::TargetKind;
use proto::squash::RootSquash;
use rpc::server::ServerConfig;
use rpc::target::{spawn_heartbeat, TargetDir};
use rpc::{Identity, RpcClient, RpcOptions};

use crate::{config, ServerOpts};

/// `braid mgs`.
#[derive(Args, Debug, Clone)]
pub struct MgsArgs {
    #[command(flatten)]
    pub server: ServerOpts,
    /// Address to listen on.
    #[arg(long)]
    pub listen: Option<String>,
    /// Directory of the MGS registry.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// A target silent for this long is marked down, in milliseconds.
    #[arg(long)]
    pub target_timeout_ms: Option<u64>,
    #[command(flatten)]
    pub squash: SquashOpts,
}

/// Root squash, as Lustre's `root_squash` and `nosquash_nids` (`braid mgs`, `braid
/// local`): the MGS hands the rule to every MDS and client.
#[derive(Args, Debug, Clone, Default)]
pub struct SquashOpts {
    /// Root on clients acts as this user and group (e.g. 65534:65534; 0:0 is off).
    #[arg(long, value_name = "UID:GID")]
    pub root_squash: Option<String>,
    /// Clients whose root stays root: IP addresses and CIDR ranges, separated by
    /// commas (e.g. 10.0.0.1,192.168.0.0/24).
    #[arg(long, value_name = "ADDRS", requires = "root_squash")]
    pub nosquash_nids: Option<String>,
}

impl SquashOpts {
    /// The rule of these flags, or else of the file's keys.
    pub fn rule(&self, file: &config::MgsSection) -> Result<Option<RootSquash>> {
        let squash = self.root_squash.as_deref().or(file.root_squash.as_deref());
        let nosquash =
            if self.root_squash.is_some() { self.nosquash_nids.as_deref() } else { file.nosquash_nids.as_deref() };
        match squash {
            None if nosquash.is_some() => bail!("nosquash_nids needs root_squash"),
            None => Ok(None),
            Some(s) => RootSquash::parse(s, nosquash.unwrap_or("")).map_err(anyhow::Error::msg),
        }
    }
}

/// `braid mds`.
#[derive(Args, Debug, Clone)]
pub struct MdsArgs {
    #[command(flatten)]
    pub server: ServerOpts,
    #[arg(long)]
    pub listen: Option<String>,
    /// Address other nodes use to reach this server (default: the listen address).
    #[arg(long)]
    pub advertise: Option<String>,
    /// MGS address HOST:PORT.
    #[arg(long)]
    pub mgs: Option<String>,
    /// MDT directory (repeat for several MDTs).
    #[arg(long = "mdt")]
    pub mdts: Vec<PathBuf>,
    /// Default stripe count of the file system (-1 = all OSTs).
    #[arg(long, allow_hyphen_values = true)]
    pub default_stripe_count: Option<i64>,
    /// Default stripe size of the file system (e.g. 1M).
    #[arg(long)]
    pub default_stripe_size: Option<String>,
    /// Default layout of the file system, a built-in template by name (seed-table4:
    /// seed 002's progressive layout); the stripe count and size above fill what it
    /// leaves unset.
    #[arg(long)]
    pub default_layout: Option<String>,
    /// Largest Data-on-MDT component a new file may get (e.g. 64K, 1M; a multiple of
    /// 64K; 0 turns DoM off: the DoM component of a new layout is dropped).
    #[arg(long)]
    pub dom_max: Option<String>,
    /// How often each MDT database is made durable and its redo log emptied, in
    /// milliseconds: the most a machine crash can take back without fsync.
    #[arg(long)]
    pub checkpoint_ms: Option<u64>,
    /// Force the redo log to disk before every reply (every acknowledged operation
    /// survives a power loss; slower).
    #[arg(long)]
    pub sync_journal: bool,
    /// Stripe the root directory over N MDTs (MDT 0 and the next ones), once they
    /// are up, if it is still empty: a choice made with the file system (the MDS
    /// serving MDT 0 acts on it).
    #[arg(long, value_name = "N")]
    pub root_stripes: Option<u32>,
    #[command(flatten)]
    pub failover: FailoverOpts,
    #[command(flatten)]
    pub replicas: ReplicaOpts,
}

/// An MDT replicated through Raft by a group of MDS processes (see the
/// `mds::replica` module).
#[derive(Args, Debug, Clone, Default)]
pub struct ReplicaOpts {
    /// Serve the one MDT (--mdt, a directory of this node's own) as a replica of the
    /// group at these addresses (HOST:PORT,...; the same list, in the same order, on
    /// every replica, this MDS's advertised address among them). Replica 0 forms the
    /// group on first start.
    #[arg(long, value_delimiter = ',', value_name = "ADDRS")]
    pub replicas: Vec<String>,
    /// Raft heartbeat interval of the group, in milliseconds (default 100).
    #[arg(long, value_name = "MS")]
    pub raft_heartbeat_ms: Option<u64>,
    /// How long a follower hears nothing from the leader before it stands for
    /// election, in milliseconds (default 500; between it and twice it).
    #[arg(long, value_name = "MS")]
    pub raft_election_ms: Option<u64>,
    /// Build a snapshot of the MDT every N entries (default 20000) and trim the log
    /// to a tenth of that behind it.
    #[arg(long, value_name = "N")]
    pub raft_snapshot_entries: Option<u64>,
}

impl ReplicaOpts {
    /// The group this MDS is a replica of, if any.
    fn settings(
        &self,
        file: &config::MdsSection,
        fsname: &str,
        mdts: &[PathBuf],
        advertise: Option<&str>,
        listen: &str,
    ) -> Result<Option<mds::replica::ReplicaConfig>> {
        let replicas = if self.replicas.is_empty() { file.replicas.clone() } else { self.replicas.clone() };
        if replicas.is_empty() {
            return Ok(None);
        }
        let [dir] = mdts else {
            bail!("--replicas serves one MDT: give exactly one --mdt DIR, not {}", mdts.len());
        };
        let me_addr = advertise.unwrap_or(listen);
        let me = replicas.iter().position(|a| a == me_addr).with_context(|| {
            format!(
                "this MDS's address {me_addr} (--advertise, or --listen) is not among --replicas {}",
                replicas.join(",")
            )
        })?;
        let heartbeat = self.raft_heartbeat_ms.or(file.raft_heartbeat_ms).unwrap_or(100);
        let election = self.raft_election_ms.or(file.raft_election_ms).unwrap_or(500);
        if !(10..=10_000).contains(&heartbeat) || election < heartbeat * 3 || election > 60_000 {
            bail!(
                "--raft-heartbeat-ms {heartbeat} --raft-election-ms {election}: want a heartbeat of 10 to 10000                  and an election timeout of 3 heartbeats to 60000"
            );
        }
        let snapshot_entries = self.raft_snapshot_entries.or(file.raft_snapshot_entries).unwrap_or(20_000);
        if !(10..=100_000_000).contains(&snapshot_entries) {
            bail!("--raft-snapshot-entries {snapshot_entries}: want 10 to 100000000");
        }
        let cfg = mds::replica::ReplicaConfig {
            dir: dir.clone(),
            replicas,
            me,
            fsname: fsname.to_string(),
            heartbeat: Duration::from_millis(heartbeat),
            election_timeout: Duration::from_millis(election),
            snapshot_entries,
        };
        cfg.check().map_err(anyhow::Error::msg)?;
        Ok(Some(cfg))
    }
}

/// Failover of an MDT between MDS processes that reach its directory (Lustre's
/// failover pairs with MMP; see the `mds::mmp` module).
#[derive(Args, Debug, Clone, Default)]
pub struct FailoverOpts {
    /// The MDT directories are shared with a failover MDS: refuse to start while
    /// another MDS serves them (multiple-mount protection), and stop serving if
    /// another takes them over.
    #[arg(long)]
    pub failover: bool,
    /// Wait until the MDS serving the MDTs stops, then serve them (implies
    /// --failover); the MGS then sends clients here.
    #[arg(long)]
    pub standby: bool,
    /// How often the serving MDS proves it is alive, in milliseconds: a standby takes
    /// over about five of these after it stops.
    #[arg(long, value_name = "MS")]
    pub mmp_interval_ms: Option<u64>,
}

impl FailoverOpts {
    /// What `start_mds` does about it: `None` without failover.
    pub fn settings(&self, file: &config::MdsSection) -> Result<Option<(mds::mmp::Contended, Duration)>> {
        let standby = self.standby || file.standby.unwrap_or(false);
        let failover = standby || self.failover || file.failover.unwrap_or(false);
        let ms = self.mmp_interval_ms.or(file.mmp_interval_ms).unwrap_or(1000);
        if !(50..=60_000).contains(&ms) {
            bail!("--mmp-interval-ms {ms}: want 50 to 60000");
        }
        let contended = if standby { mds::mmp::Contended::Wait } else { mds::mmp::Contended::Refuse };
        Ok(failover.then_some((contended, Duration::from_millis(ms))))
    }
}

/// `braid oss`.
#[derive(Args, Debug, Clone)]
pub struct OssArgs {
    #[command(flatten)]
    pub server: ServerOpts,
    #[arg(long)]
    pub listen: Option<String>,
    #[arg(long)]
    pub advertise: Option<String>,
    #[arg(long)]
    pub mgs: Option<String>,
    /// OST directory (repeat for several OSTs), optionally emulating a medium:
    /// DIR:class=hdd,bw=150M,lat=4ms (bandwidth of reads and writes together, and a
    /// latency added to each).
    #[arg(long = "ost", value_name = "DIR[:class=C,bw=RATE,lat=TIME]")]
    pub osts: Vec<String>,
    /// Users, besides root and the OSS's own, whose processes on this machine may
    /// read and write its object files directly (short-circuit I/O).
    #[arg(long, value_name = "UID,UID", value_delimiter = ',')]
    pub short_circuit_uids: Vec<u32>,
    /// Serve short-circuit I/O even without a cluster secret (--insecure): any
    /// process of those users may then take the object files.
    #[arg(long)]
    pub short_circuit_insecure: bool,
}

/// The file system's default layout: the template named, if any, filled from the
/// default stripe count (1) and size (1 MiB).
pub fn default_layout(template: Option<&str>, count: Option<i64>, size: Option<&str>) -> Result<layout::LayoutSpec> {
    let size = size.map(layout::parse_size).transpose().context("invalid default stripe size")?;
    let plain = layout::LayoutSpec::raid0(Some(count.unwrap_or(1)), Some(size.unwrap_or(1 << 20)));
    let default = match template {
        Some(name) => layout::LayoutSpec::template(name)?.inherit(&plain),
        None => plain,
    };
    default.validate().context("invalid default layout")?;
    Ok(default)
}

/// Parses `--dom-max`: 0, or a multiple of 64 KiB up to 1 GiB.
pub fn parse_dom_max(s: &str) -> Result<u64> {
    let n = layout::parse_size(s).with_context(|| format!("invalid --dom-max {s}"))?;
    if n > layout::DOM_SIZE_MAX || !n.is_multiple_of(layout::STRIPE_SIZE_UNIT) {
        bail!("--dom-max {s}: must be 0 or a multiple of 64K up to 1G");
    }
    Ok(n)
}

/// Runs the MGS until a signal.
pub fn run_mgs(a: MgsArgs) -> Result<()> {
    let file = config::load(a.server.config.as_deref())?;
    let common = config::common(&a.server, &file)?;
    let listen = a.listen.or(file.mgs.listen.clone()).unwrap_or_else(|| "127.0.0.1:9400".into());
    let data = a.data.or(file.mgs.data.clone()).context("the MGS needs --data DIR")?;
    let timeout = Duration::from_millis(a.target_timeout_ms.or(file.mgs.target_timeout_ms).unwrap_or(5000));
    let squash = a.squash.rule(&file.mgs)?;
    let metrics = a.server.metrics.clone().or(file.mgs.metrics.clone());
    run_server("MGS", metrics, async move { start_mgs(&listen, &data, &common, timeout, squash).await })
}

/// `--root-stripes N`: 1 (the root on MDT 0 alone) when not given.
pub fn root_stripes(n: Option<u32>) -> Result<u32> {
    match n {
        None => Ok(1),
        Some(n) if (1..=layout::DIR_STRIPES_MAX).contains(&n) => Ok(n),
        Some(n) => bail!("--root-stripes {n}: want 1 to {}", layout::DIR_STRIPES_MAX),
    }
}

/// Runs an MDS until a signal.
pub fn run_mds(a: MdsArgs) -> Result<()> {
    let file = config::load(a.server.config.as_deref())?;
    let common = config::common(&a.server, &file)?;
    let listen = a.listen.or(file.mds.listen.clone()).unwrap_or_else(|| "127.0.0.1:0".into());
    let advertise = a.advertise.or(file.mds.advertise.clone());
    let mgs = a.mgs.or(file.mds.mgs.clone()).context("the MDS needs --mgs HOST:PORT")?;
    let mdts = if a.mdts.is_empty() { file.mds.mdts.clone() } else { a.mdts };
    let size = a.default_stripe_size.or(file.mds.default_stripe_size.clone());
    let count = a.default_stripe_count.or(file.mds.default_stripe_count);
    let template = a.default_layout.or(file.mds.default_layout.clone());
    let default = default_layout(template.as_deref(), count, size.as_deref())?;
    let dom_max = match a.dom_max.or(file.mds.dom_max.clone()) {
        Some(s) => parse_dom_max(&s)?,
        None => mds::MdsConfig::default().dom_max,
    };
    let checkpoint_ms = a.checkpoint_ms.or(file.mds.checkpoint_ms).unwrap_or(1000);
    if checkpoint_ms == 0 {
        bail!("--checkpoint-ms must be at least 1");
    }
    let cfg = mds::MdsConfig {
        default_layout: default,
        checkpoint_interval: Duration::from_millis(checkpoint_ms),
        sync_journal: a.sync_journal || file.mds.sync_journal.unwrap_or(false),
        dom_max,
        root_stripes: root_stripes(a.root_stripes.or(file.mds.root_stripes))?,
        ..Default::default()
    };
    let failover = a.failover.settings(&file.mds)?;
    let replica = a.replicas.settings(&file.mds, &common.fsname, &mdts, advertise.as_deref(), &listen)?;
    if replica.is_some() && failover.is_some() {
        bail!("--replicas and --failover are two ways to survive an MDS's loss: choose one");
    }
    let metrics = a.server.metrics.clone().or(file.mds.metrics.clone());
    run_server("MDS", metrics, async move {
        match replica {
            Some(r) => start_mds_replica(&listen, advertise.as_deref(), &mgs, r, &common, cfg).await,
            None => start_mds(&listen, advertise.as_deref(), &mgs, &mdts, &common, cfg, failover).await,
        }
    })
}

/// Runs an OSS until a signal.
pub fn run_oss(a: OssArgs) -> Result<()> {
    let file = config::load(a.server.config.as_deref())?;
    let common = config::common(&a.server, &file)?;
    let listen = a.listen.or(file.oss.listen.clone()).unwrap_or_else(|| "127.0.0.1:0".into());
    let advertise = a.advertise.or(file.oss.advertise.clone());
    let mgs = a.mgs.or(file.oss.mgs.clone()).context("the OSS needs --mgs HOST:PORT")?;
    let osts = ost_dirs(if a.osts.is_empty() { &file.oss.osts } else { &a.osts })?;
    let policy = oss::local::ShortCircuitPolicy {
        uids: if a.short_circuit_uids.is_empty() { file.oss.short_circuit_uids.clone() } else { a.short_circuit_uids },
        insecure: a.short_circuit_insecure || file.oss.short_circuit_insecure,
    };
    let metrics = a.server.metrics.clone().or(file.oss.metrics.clone());
    run_server(
        "OSS",
        metrics,
        async move { start_oss(&listen, advertise.as_deref(), &mgs, &osts, &common, &policy).await },
    )
}

/// Starts one role with `start`, prints where it listens and serves until a signal.
fn run_server<F>(what: &str, metrics: Option<String>, start: F) -> Result<()>
where
    F: std::future::Future<Output = Result<String>>,
{
    let rt = crate::runtime()?;
    let r = rt.block_on(async {
        if let Some(m) = metrics {
            crate::serve_metrics(&m).await?;
        }
        let addr = start.await?;
        println!("{what} listening on {addr}");
        let sig = until_signal().await?;
        tracing::info!("{what} stopping on {sig}");
        Ok(())
    });
    // Every acknowledged operation is already committed; do not wait for idle workers.
    rt.shutdown_background();
    r
}

/// Settings every role shares.
#[derive(Debug, Clone)]
pub struct Common {
    pub fsname: String,
    pub secret: Secret,
    pub heartbeat: Duration,
    /// Also serve clients of this process in-process (`rpc::local`): what
    /// `braid local` does, as Lustre's `0@lo`.
    pub in_process: bool,
    /// This node's TLS identity: its servers take TLS clients, and its connections
    /// to other servers use TLS.
    pub tls: Option<Arc<rpc::tls::TlsContext>>,
}

impl Common {
    /// How this node's servers serve, as `name`.
    fn server_config(&self, name: &str) -> ServerConfig {
        ServerConfig::new(name, self.secret.clone()).with_tls(self.tls.clone())
    }

    /// Who this node is to other servers, as `role`.
    fn identity(&self, role: &str) -> Arc<Identity> {
        Identity::with_tls(role, self.secret.clone(), self.tls.clone())
    }
}

/// Makes a server of this process reachable in-process at `addr`, when asked to.
fn serve_in_process<S: rpc::server::Service>(common: &Common, addr: &str, svc: &Arc<S>) -> Result<()> {
    if common.in_process {
        rpc::local::register(addr, svc.clone()).map_err(anyhow::Error::msg)?;
    }
    Ok(())
}

/// Binds `listen` and returns the listener and the address to advertise.
async fn bind(listen: &str, advertise: Option<&str>) -> Result<(tokio::net::TcpListener, String)> {
    let l = tokio::net::TcpListener::bind(listen).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => anyhow::anyhow!(
            "cannot listen on {listen}: the address is in use (another server, or a braid process still running?): \
             stop it or choose another --listen"
        ),
        _ => anyhow::Error::new(e).context(format!("cannot listen on {listen}")),
    })?;
    let local: SocketAddr = l.local_addr()?;
    let adv = match advertise {
        Some(a) => a.to_string(),
        None if local.ip().is_unspecified() => {
            bail!("listening on {local} needs --advertise HOST:PORT so other nodes know where to connect")
        }
        None => local.to_string(),
    };
    Ok((l, adv))
}

fn mgs_client(mgs: &str, common: &Common, role: &str) -> Arc<RpcClient> {
    let identity = common.identity(role);
    let opts = RpcOptions { recovery_timeout: Duration::from_secs(30), ..Default::default() };
    Arc::new(RpcClient::new(mgs.to_string(), identity, opts))
}

/// Starts the MGS; returns its address.
pub async fn start_mgs(
    listen: &str,
    data: &Path,
    common: &Common,
    target_timeout: Duration,
    root_squash: Option<RootSquash>,
) -> Result<String> {
    let (listener, addr) = bind(listen, None).await?;
    if let Some(rule) = &root_squash {
        tracing::info!("root squash {rule}");
    }
    let mgs = mgs::Mgs::open(mgs::MgsConfig {
        data_dir: data.to_path_buf(),
        fsname: common.fsname.clone(),
        heartbeat_timeout: target_timeout,
        root_squash,
    })?;
    let mgs = Arc::new(mgs);
    serve_in_process(common, &addr, &mgs)?;
    tokio::spawn(mgs::serve(mgs, listener, common.server_config("mgs")));
    tracing::info!("MGS serving {} at {addr}", common.fsname);
    Ok(addr)
}

/// How long a registration goes unanswered before the server says it is waiting.
const SLOW_MGS: Duration = Duration::from_secs(2);

async fn register_all(
    kind: TargetKind,
    dirs: &[PathBuf],
    mgs: &RpcClient,
    addr: &str,
    fsname: &str,
) -> Result<Vec<TargetDir>> {
    let mut out = Vec::new();
    for d in dirs {
        let mut t = TargetDir::open(kind, d)
            .with_context(|| format!("cannot open {} directory {}", kind.name(), d.display()))?;
        // Retried until the MGS answers (its client's recovery timeout): say so
        // rather than wait in silence.
        let registered = {
            let registering = t.register(mgs, addr, fsname);
            tokio::pin!(registering);
            tokio::select! {
                r = &mut registering => r,
                _ = tokio::time::sleep(SLOW_MGS) => {
                    tracing::warn!(
                        "the MGS at {} does not answer yet (or asks this server to wait); retrying for up to {} s",
                        mgs.addr(),
                        mgs.options().recovery_timeout.as_secs()
                    );
                    registering.await
                }
            }
        };
        let index = registered.with_context(|| {
            format!("cannot register {} {} with the MGS at {}", kind.name(), d.display(), mgs.addr())
        })?;
        tracing::info!("{}{index:04x} registered from {}", kind.name(), d.display());
        out.push(t);
    }
    Ok(out)
}

/// Starts an MDS serving the MDTs in `dirs`; returns its address. With `failover`,
/// the MDTs are taken under multiple-mount protection first (see `mds::mmp`): a
/// standby waits here until the MDS serving them stops, and an MDS whose MDT is taken
/// over stops serving (the process exits).
pub async fn start_mds(
    listen: &str,
    advertise: Option<&str>,
    mgs_addr: &str,
    dirs: &[PathBuf],
    common: &Common,
    cfg: mds::MdsConfig,
    failover: Option<(mds::mmp::Contended, Duration)>,
) -> Result<String> {
    if dirs.is_empty() {
        bail!("an MDS needs at least one MDT directory (--mdt DIR)");
    }
    let (listener, addr) = bind(listen, advertise).await?;
    if let Some((contended, interval)) = failover {
        let owner = format!("the MDS at {addr} (pid {})", std::process::id());
        if contended == mds::mmp::Contended::Wait {
            println!("standing by for {} MDT(s) at {addr}", dirs.len());
            use std::io::Write;
            let _ = std::io::stdout().flush();
        }
        for d in dirs {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
            let mmp = mds::mmp::Mmp::take(d, &owner, interval, contended).await.map_err(anyhow::Error::msg)?;
            tracing::info!("took the MDT in {} (multiple-mount protection every {interval:?})", d.display());
            tokio::spawn(async move {
                let why = mmp.keep().await;
                // Another MDS serves the MDT now, or this one cannot prove it does:
                // serving on would be two MDSs writing one MDT.
                tracing::error!("stopping at once: {why}");
                eprintln!("braid mds: stopping at once: {why}");
                std::process::exit(3);
            });
        }
    }
    let mgs = mgs_client(mgs_addr, common, "mds");
    let targets = register_all(TargetKind::Mdt, dirs, &mgs, &addr, &common.fsname).await?;
    let list: Vec<(u32, PathBuf)> = targets.iter().map(|t| (t.index.expect("registered"), t.dir.clone())).collect();
    let cfg = mds::MdsConfig { config_refresh: common.heartbeat, ..cfg };
    let mds = mds::Mds::start(&list, cfg, common.identity("mds"), mgs.clone())?;
    mds.load_config().await.with_context(|| format!("cannot fetch the configuration from the MGS at {mgs_addr}"))?;
    let report: rpc::target::TargetReport = Arc::new(|t| (rpc::target::dir_usage(&t.dir), None));
    spawn_heartbeat(mgs, targets, addr.clone(), common.fsname.clone(), common.heartbeat, report);
    serve_in_process(common, &addr, &mds)?;
    tokio::spawn(mds::serve(mds, listener, common.server_config("mds")));
    tracing::info!("MDS serving {} MDT(s) at {addr}", list.len());
    Ok(addr)
}

/// Starts an MDS as a replica of a replicated MDT (see `mds::replica`); returns its
/// address. It answers its group at once and serves clients while it leads.
pub async fn start_mds_replica(
    listen: &str,
    advertise: Option<&str>,
    mgs_addr: &str,
    replica: mds::replica::ReplicaConfig,
    common: &Common,
    cfg: mds::MdsConfig,
) -> Result<String> {
    let (listener, addr) = bind(listen, advertise).await?;
    let mgs = mgs_client(mgs_addr, common, "mds");
    let cfg = mds::MdsConfig { config_refresh: common.heartbeat, ..cfg };
    let (n, me, dir) = (replica.replicas.len(), replica.me, replica.dir.clone());
    let service = mds::replica::Replica::start(replica, cfg, common.identity("mds"), mgs)
        .await
        .with_context(|| format!("cannot start the MDT replica in {}", dir.display()))?;
    tokio::spawn(rpc::server::serve(listener, Arc::new(common.server_config("mds")), service));
    tracing::info!("MDS replica {me} of {n} serving at {addr}");
    Ok(addr)
}

/// One OST of an OSS: its directory, and the medium it emulates, if any.
#[derive(Debug, Clone)]
pub struct OstDir {
    pub dir: PathBuf,
    pub media: Option<proto::msg::Media>,
}

/// The OSTs of `--ost` arguments (or `osts` in `braid.toml`).
pub fn ost_dirs(args: &[String]) -> Result<Vec<OstDir>> {
    args.iter()
        .map(|a| {
            let (dir, media) = oss::media::parse_ost_arg(a).map_err(anyhow::Error::msg)?;
            Ok(OstDir { dir, media })
        })
        .collect()
}

/// Starts an OSS serving the OSTs in `dirs`, short-circuit I/O as `policy` allows;
/// returns its address.
pub async fn start_oss(
    listen: &str,
    advertise: Option<&str>,
    mgs_addr: &str,
    dirs: &[OstDir],
    common: &Common,
    policy: &oss::local::ShortCircuitPolicy,
) -> Result<String> {
    if dirs.is_empty() {
        bail!("an OSS needs at least one OST directory (--ost DIR)");
    }
    for d in dirs {
        oss::Ost::format(&d.dir).with_context(|| format!("cannot prepare OST directory {}", d.dir.display()))?;
    }
    let (listener, addr) = bind(listen, advertise).await?;
    let mgs = mgs_client(mgs_addr, common, "oss");
    let paths: Vec<PathBuf> = dirs.iter().map(|d| d.dir.clone()).collect();
    let targets = register_all(TargetKind::Ost, &paths, &mgs, &addr, &common.fsname).await?;
    let emulated: HashMap<u32, proto::msg::Media> =
        targets.iter().zip(dirs).filter_map(|(t, d)| Some((t.index?, d.media.clone()?))).collect();
    for (index, m) in &emulated {
        tracing::info!("OST{index:04x} emulates {m}");
    }
    let service = Arc::new(oss::Oss::new(oss::Oss::targets(&targets)).with_media(emulated));
    let s = service.clone();
    let report: rpc::target::TargetReport =
        Arc::new(move |t| (oss::ost_usage(&t.dir), t.index.and_then(|i| s.media_of(i))));
    let n = targets.len();
    spawn_heartbeat(mgs, targets, addr.clone(), common.fsname.clone(), common.heartbeat, report);
    serve_in_process(common, &addr, &service)?;
    oss::local::listen(&service, &common.secret, policy);
    tokio::spawn(oss::serve(service, listener, common.server_config("oss")));
    tracing::info!("OSS serving {n} OST(s) at {addr}");
    Ok(addr)
}

/// Waits for Ctrl-C or SIGTERM.
pub async fn until_signal() -> Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("cannot install SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot install SIGINT handler")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
