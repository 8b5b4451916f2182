//! `braid local`: a whole cluster (MGS, MDTs, OSTs) in one process, the README's first
//! command, and optionally its own FUSE mount.
//!
//! The roles run on one runtime, each on its own TCP port for clients of other
//! processes; the roles and the mount of this process reach each other in-process
//! (`rpc::local`, as Lustre's `0@lo`) unless `--tcp` asks for sockets all the way.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use client::Client;
use layout::LayoutSpec;
use proto::auth::Secret;

use crate::mount::MountSettings;
use crate::serve::{self, Common};

/// `braid local`.
#[derive(Args, Debug, Clone)]
pub struct LocalArgs {
    /// Directory for all data; created if needed, reused when started again.
    #[arg(long)]
    pub data: PathBuf,
    #[arg(long, default_value_t = 4)]
    pub osts: u32,
    #[arg(long, default_value_t = 1)]
    pub mdts: u32,
    /// MGS address.
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub listen: String,
    #[arg(long, default_value = "braid")]
    pub fsname: String,
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_ms: u64,
    #[arg(long, default_value_t = 5000)]
    pub target_timeout_ms: u64,
    /// Also mount the file system here (FUSE).
    #[arg(long)]
    pub mount: Option<PathBuf>,
    /// Mount options (see `braid mount`).
    #[arg(short = 'o')]
    pub options: Vec<String>,
    /// Make the roles and the mount of this process talk over TCP, as separate
    /// nodes do (default: in-process, as Lustre's 0@lo; clients of other
    /// processes always use TCP).
    #[arg(long)]
    pub tcp: bool,
    /// The file system's default layout, a built-in template by name (seed-table4:
    /// seed 002's progressive layout); without it, one 1 MiB stripe.
    #[arg(long)]
    pub default_layout: Option<String>,
    /// Stripe the root directory over N of the MDTs (see `braid mds --root-stripes`).
    #[arg(long, value_name = "N")]
    pub root_stripes: Option<u32>,
    /// Make OSTs emulate a medium (see `braid oss --ost`): `0-1:class=ssd,bw=2G`,
    /// `2-3:class=hdd,bw=150M,lat=4ms` (repeat for several sets of OSTs).
    #[arg(long, value_name = "OSTS:class=C,bw=RATE,lat=TIME")]
    pub ost_media: Vec<String>,
    #[command(flatten)]
    pub squash: serve::SquashOpts,
    /// The servers' TLS files (ca.pem, cert.pem, key.pem; see `braid mgs --help`):
    /// clients of other processes that speak TLS are taken over TLS.
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Refuse clients of other processes that do not speak TLS.
    #[arg(long, requires = "tls_dir")]
    pub tls_required: bool,
    /// Serve the Prometheus metrics of every role (and the mount) at HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
}

/// Shape of a `braid local` cluster.
#[derive(Debug, Clone)]
pub struct Local {
    pub osts: u32,
    pub mdts: u32,
    pub listen: String,
    pub fsname: String,
    pub heartbeat_ms: u64,
    pub target_timeout_ms: u64,
    /// The roles and the mount reach each other in-process.
    pub in_process: bool,
    /// The file system's default layout.
    pub default_layout: LayoutSpec,
    /// Stripe the root over this many MDTs while it is empty.
    pub root_stripes: u32,
    /// The media OSTs emulate, by OST index.
    pub ost_media: std::collections::HashMap<u32, proto::msg::Media>,
    /// Root squash for the mount and other clients.
    pub root_squash: Option<proto::squash::RootSquash>,
    /// TLS for clients of other processes.
    pub tls: Option<std::sync::Arc<rpc::tls::TlsContext>>,
}

/// A local cluster's servers, serving on the runtime that started them.
pub struct Started {
    /// Address of the MGS: what clients connect to.
    pub mgs: String,
    pub secret: Secret,
    /// `DATA/cluster.secret`, made absolute.
    pub secret_file: PathBuf,
}

/// Runs `braid local` until a signal.
pub fn run(a: LocalArgs) -> Result<()> {
    let mut settings = crate::mount::parse_options(&a.options)?;
    crate::mount::no_page_cache(&settings)?;
    // One endpoint for the process: its servers' metrics and its mount's.
    if a.metrics.is_some() && settings.metrics.is_some() {
        bail!("give the metrics address once: --metrics serves the whole process, the mount included");
    }
    let metrics = a.metrics.or(settings.metrics.take());
    let l = Local {
        osts: a.osts,
        mdts: a.mdts,
        listen: a.listen,
        fsname: a.fsname,
        heartbeat_ms: a.heartbeat_ms,
        target_timeout_ms: a.target_timeout_ms,
        in_process: !a.tcp,
        default_layout: serve::default_layout(a.default_layout.as_deref(), None, None)?,
        root_stripes: serve::root_stripes(a.root_stripes)?,
        ost_media: ost_media(&a.ost_media, a.osts)?,
        root_squash: a.squash.rule(&Default::default())?,
        tls: crate::server_tls(a.tls_dir.as_deref(), a.tls_required)?,
    };
    local(&a.data, &l, metrics.as_deref(), a.mount.map(|m| (m, settings)))
}

/// `--ost-media OSTS:SPEC` arguments: the medium of each OST they name (of `osts`).
pub fn ost_media(args: &[String], osts: u32) -> Result<std::collections::HashMap<u32, proto::msg::Media>> {
    let mut out = std::collections::HashMap::new();
    for a in args {
        let Some((list, spec)) = a.split_once(':') else {
            bail!("--ost-media {a}: want OSTS:class=C,bw=RATE,lat=TIME, e.g. 0-1:class=hdd,bw=150M");
        };
        let indices = layout::parse_ost_list(list).with_context(|| format!("--ost-media {a}: OSTs '{list}'"))?;
        let media = oss::media::parse_media(spec).map_err(|e| anyhow::anyhow!("--ost-media {a}: {e}"))?;
        for i in indices {
            if i >= osts {
                bail!("--ost-media {a}: OST {i} is not one of the {osts} OSTs");
            }
            if out.insert(i, media.clone()).is_some() {
                bail!("--ost-media {a}: OST {i} is given a medium twice");
            }
        }
    }
    Ok(out)
}

/// Starts the cluster `l` with its data under `data` on the current runtime: the
/// MGS, then one OSS with every OST, then one MDS with every MDT. The secret
/// (`DATA/cluster.secret`) is made on the first start and reused after.
pub async fn start(data: &Path, l: &Local) -> Result<Started> {
    if l.osts == 0 || l.mdts == 0 {
        bail!("a cluster needs at least one MDT and one OST");
    }
    if l.osts > 256 || l.mdts > 16 {
        bail!("braid local runs at most 16 MDTs and 256 OSTs");
    }
    std::fs::create_dir_all(data).with_context(|| format!("cannot create {}", data.display()))?;
    let secret_path = data.join("cluster.secret");
    let secret = Secret::create_file(&secret_path).map_err(anyhow::Error::msg)?;
    let common = Common {
        fsname: l.fsname.clone(),
        secret: secret.clone(),
        heartbeat: Duration::from_millis(l.heartbeat_ms.max(1)),
        in_process: l.in_process,
        tls: l.tls.clone(),
    };
    let timeout = Duration::from_millis(l.target_timeout_ms);
    let mgs = serve::start_mgs(&l.listen, &data.join("mgs"), &common, timeout, l.root_squash.clone()).await?;
    let mdt_dirs: Vec<PathBuf> = (0..l.mdts).map(|i| data.join(format!("mdt{i}"))).collect();
    let ost_dirs: Vec<serve::OstDir> = (0..l.osts)
        .map(|i| serve::OstDir { dir: data.join(format!("ost{i}")), media: l.ost_media.get(&i).cloned() })
        .collect();
    if l.root_stripes > l.mdts {
        bail!("--root-stripes {} is more than the {} MDT(s) asked for", l.root_stripes, l.mdts);
    }
    let cfg =
        mds::MdsConfig { default_layout: l.default_layout.clone(), root_stripes: l.root_stripes, ..Default::default() };
    // OSTs first: the MDS's first look at the configuration then finds every one
    // of them, so the mount's first files are striped over all the OSTs asked for.
    let oss = serve::start_oss(&listen_again(data, "oss"), None, &mgs, &ost_dirs, &common, &Default::default()).await?;
    remember_address(data, "oss", &oss);
    let mds = serve::start_mds(&listen_again(data, "mds"), None, &mgs, &mdt_dirs, &common, cfg, None).await?;
    remember_address(data, "mds", &mds);
    let secret_file = std::fs::canonicalize(&secret_path).unwrap_or(secret_path);
    Ok(Started { mgs, secret, secret_file })
}

/// Where the server `name` (`oss` or `mds`) of the cluster in `data` listens: where it
/// listened before (`DATA/NAME.addr`), if that port is free, so that a mount that
/// outlives a restart of `braid local` finds its servers again (clients learn the
/// servers' addresses from the MGS once, when they connect); otherwise, and on the
/// first start, a port the system picks.
fn listen_again(data: &Path, name: &str) -> String {
    let file = data.join(format!("{name}.addr"));
    let before = std::fs::read_to_string(&file).ok().and_then(|s| s.trim().parse::<std::net::SocketAddr>().ok());
    match before {
        Some(a) if std::net::TcpListener::bind(a).is_ok() => a.to_string(),
        Some(a) => {
            tracing::warn!(
                "the {name}'s address of the previous run, {a}, is taken: clients of that run will not find it"
            );
            "127.0.0.1:0".into()
        }
        None => "127.0.0.1:0".into(),
    }
}

/// Records where server `name` listens, for [`listen_again`]; a failure only costs
/// the next restart its old address.
fn remember_address(data: &Path, name: &str, addr: &str) {
    let file = data.join(format!("{name}.addr"));
    if let Err(e) = std::fs::write(&file, addr) {
        tracing::warn!("cannot record the {name}'s address in {}: {e}", file.display());
    }
}

/// Runs the cluster `l` with its data under `data`, mounted on the given mount point
/// if any, until a signal.
pub fn local(data: &Path, l: &Local, metrics: Option<&str>, mount: Option<(PathBuf, MountSettings)>) -> Result<()> {
    let rt = crate::runtime()?;
    let r = rt.block_on(async {
        if let Some(addr) = metrics {
            crate::serve_metrics(addr).await?;
        }
        let Started { mgs, secret, secret_file } = start(data, l).await?;
        println!(
            "braid local: file system '{}' with {} MDT(s) and {} OST(s), data in {}",
            l.fsname,
            l.mdts,
            l.osts,
            data.display()
        );
        println!("MGS at {mgs}");
        println!("client: export BRAID_SECRET_FILE={}", secret_file.display());
        println!("        braid ls braid://{mgs}/");
        let mut mounted = None;
        if let Some((mp, settings)) = &mount {
            let mut cfg = settings.client_config(&mgs, secret)?;
            let name = format!("{}:{}", crate::trace::host_name(), std::path::absolute(mp)?.display());
            cfg.trace = Some(crate::trace::client_trace_config(&settings.trace, &name));
            let client = Client::connect(cfg).await.context("cannot connect the mount's client")?;
            let mut opts = settings.fuse.clone();
            opts.fsname = format!("braid@{mgs}");
            let traced = crate::trace::hook(&client, &settings.trace, Some(secret_file.clone()))?;
            opts.trace = traced.clone().map(|t| fuse::TraceHook(t));
            let handle = tokio::runtime::Handle::current();
            let mp2 = mp.clone();
            let mut fs =
                tokio::task::spawn_blocking(move || fuse::mount(client, handle, &mp2, opts)).await?.with_context(
                    || format!("cannot mount on {} (is fuse3 installed and the directory empty?)", mp.display()),
                )?;
            crate::mount::record_secret_file(&mgs, &secret_file);
            let unmounter = fs.unmounter();
            let thread = std::thread::spawn(move || fs.run());
            println!("mounted on {}", mp.display());
            mounted = Some((unmounter, thread, traced));
        }
        let _ = std::io::stdout().flush();
        let sig = serve::until_signal().await?;
        tracing::info!("braid local stopping on {sig}");
        if let Some((mut unmounter, thread, traced)) = mounted {
            if let Err(e) = unmounter.unmount() {
                tracing::warn!("unmount failed: {e}");
            }
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            if let Some(t) = traced {
                t.detach();
            }
        }
        Ok(())
    });
    rt.shutdown_background();
    r
}
