//! Starting the server roles (MGS, MDS, OSS) and the all-in-one `local` cluster.
//!
//! Each role binds its listener first (so it knows the address it advertises),
//! registers its targets with the MGS, then serves. `local` runs all three roles in
//! one process and one runtime, each on its own TCP port for clients of other
//! processes; the roles and the mount of that process reach each other in-process
//! (`proto::local`) unless `--tcp` asks for sockets all the way.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use proto::auth::Secret;
use proto::msg::TargetKind;
use proto::rpc::{Identity, RpcClient, RpcOptions};
use proto::server::ServerConfig;
use proto::target::{spawn_heartbeat, TargetDir};

/// Settings every role shares.
#[derive(Debug, Clone)]
pub struct Common {
    pub fsname: String,
    pub secret: Secret,
    pub heartbeat: Duration,
    /// Also serve clients of this process in-process (`proto::local`): what
    /// `braid local` does, as Lustre's `0@lo`.
    pub in_process: bool,
}

/// Makes a server of this process reachable in-process at `addr`, when asked to.
fn serve_in_process<S: proto::server::Service>(common: &Common, addr: &str, svc: &Arc<S>) -> Result<()> {
    if common.in_process {
        proto::local::register(addr, svc.clone()).map_err(anyhow::Error::msg)?;
    }
    Ok(())
}

/// Binds `listen` and returns the listener and the address to advertise.
async fn bind(listen: &str, advertise: Option<&str>) -> Result<(tokio::net::TcpListener, String)> {
    let l = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
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
    let identity = Identity::new(role, common.secret.clone());
    let opts = RpcOptions { recovery_timeout: Duration::from_secs(30), ..Default::default() };
    Arc::new(RpcClient::new(mgs.to_string(), identity, opts))
}

/// Starts the MGS; returns its address.
pub async fn start_mgs(listen: &str, data: &Path, common: &Common, target_timeout: Duration) -> Result<String> {
    let (listener, addr) = bind(listen, None).await?;
    let mgs = mgs::Mgs::open(mgs::MgsConfig {
        data_dir: data.to_path_buf(),
        fsname: common.fsname.clone(),
        heartbeat_timeout: target_timeout,
    })?;
    let mgs = Arc::new(mgs);
    serve_in_process(common, &addr, &mgs)?;
    tokio::spawn(mgs::serve(mgs, listener, ServerConfig::new("mgs", common.secret.clone())));
    tracing::info!("MGS serving {} at {addr}", common.fsname);
    Ok(addr)
}

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
        let index = t.register(mgs, addr, fsname).await.with_context(|| {
            format!("cannot register {} {} with the MGS at {}", kind.name(), d.display(), mgs.addr())
        })?;
        tracing::info!("{}{index:04x} registered from {}", kind.name(), d.display());
        out.push(t);
    }
    Ok(out)
}

/// Starts an MDS serving the MDTs in `dirs`; returns its address.
pub async fn start_mds(
    listen: &str,
    advertise: Option<&str>,
    mgs_addr: &str,
    dirs: &[PathBuf],
    common: &Common,
    cfg: mds::MdsConfig,
) -> Result<String> {
    if dirs.is_empty() {
        bail!("an MDS needs at least one MDT directory (--mdt DIR)");
    }
    let (listener, addr) = bind(listen, advertise).await?;
    let mgs = mgs_client(mgs_addr, common, "mds");
    let targets = register_all(TargetKind::Mdt, dirs, &mgs, &addr, &common.fsname).await?;
    let list: Vec<(u32, PathBuf)> = targets.iter().map(|t| (t.index.expect("registered"), t.dir.clone())).collect();
    let cfg = mds::MdsConfig { config_refresh: common.heartbeat, ..cfg };
    let mds = mds::Mds::start(&list, cfg, Identity::new("mds", common.secret.clone()), mgs.clone())?;
    let usage: Arc<dyn Fn(&TargetDir) -> proto::msg::Usage + Send + Sync> =
        Arc::new(|t| proto::target::dir_usage(&t.dir));
    spawn_heartbeat(mgs, targets, addr.clone(), common.fsname.clone(), common.heartbeat, usage);
    serve_in_process(common, &addr, &mds)?;
    tokio::spawn(mds::serve(mds, listener, ServerConfig::new("mds", common.secret.clone())));
    tracing::info!("MDS serving {} MDT(s) at {addr}", list.len());
    Ok(addr)
}

/// Starts an OSS serving the OSTs in `dirs`; returns its address.
pub async fn start_oss(
    listen: &str,
    advertise: Option<&str>,
    mgs_addr: &str,
    dirs: &[PathBuf],
    common: &Common,
) -> Result<String> {
    if dirs.is_empty() {
        bail!("an OSS needs at least one OST directory (--ost DIR)");
    }
    for d in dirs {
        oss::Ost::format(d).with_context(|| format!("cannot prepare OST directory {}", d.display()))?;
    }
    let (listener, addr) = bind(listen, advertise).await?;
    let mgs = mgs_client(mgs_addr, common, "oss");
    let targets = register_all(TargetKind::Ost, dirs, &mgs, &addr, &common.fsname).await?;
    let service = Arc::new(oss::Oss::new(oss::Oss::targets(&targets)));
    let usage: Arc<dyn Fn(&TargetDir) -> proto::msg::Usage + Send + Sync> = Arc::new(|t| oss::ost_usage(&t.dir));
    let n = targets.len();
    spawn_heartbeat(mgs, targets, addr.clone(), common.fsname.clone(), common.heartbeat, usage);
    serve_in_process(common, &addr, &service)?;
    tokio::spawn(oss::serve(service, listener, ServerConfig::new("oss", common.secret.clone())));
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
