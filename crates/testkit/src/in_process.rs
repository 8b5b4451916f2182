//! A whole cluster inside the test process: the MGS, one MDS with one MDT and the
//! OSSs of a spec, started by the same launcher as `braid mgs`/`mds`/`oss` and
//! `braid local` (`cli::serve`), on one tokio runtime, with a connected
//! [`client::Client`]. No root, no FUSE, no child processes: namespace rules
//! (rename, setattr, unlink, and the DNE and DoM rules to come) get tests that run in
//! a fraction of a second beside the real-process ones.
//!
//! The servers listen on loopback TCP ports rather than being registered for
//! in-process delivery (`rpc::local`, what `braid local` uses): that registry keeps
//! a server for the life of the process and holds at most 64, and a test binary
//! starts a cluster per test.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use client::{Client, ClientConfig};
use proto::auth::Secret;

use crate::client::{client_config, WAIT};
use crate::TempDir;

/// How to shape an in-process cluster.
#[derive(Debug, Clone)]
pub struct InProcessSpec {
    /// OSTs per OSS.
    pub osts_per_oss: Vec<usize>,
    pub heartbeat_ms: u64,
    /// The MDS's settings (its OST-list refresh is the heartbeat).
    pub mds: mds::MdsConfig,
}

impl Default for InProcessSpec {
    fn default() -> Self {
        InProcessSpec { osts_per_oss: vec![2], heartbeat_ms: 200, mds: mds::MdsConfig::default() }
    }
}

/// MGS, MDS and OSSs running on this process's runtime `rt`, their data in a
/// temporary directory. Dropping it stops every server (the runtime goes) and then
/// removes the directory.
pub struct InProcessCluster {
    /// A client connected as root (see [`InProcessCluster::connect`] for others).
    pub client: Client,
    pub mgs_addr: String,
    pub secret: Secret,
    // Field order is drop order: the client and the servers before the directory.
    rt: Option<tokio::runtime::Runtime>,
    dir: TempDir,
}

impl InProcessCluster {
    /// A cluster of one OSS with two OSTs.
    pub fn start() -> InProcessCluster {
        InProcessCluster::start_with(InProcessSpec::default())
    }

    /// A cluster shaped by `spec`. OSSs start before the MDS, as in `braid local`,
    /// so the MDS's first look at the configuration finds every OST.
    pub fn start_with(spec: InProcessSpec) -> InProcessCluster {
        let dir = TempDir::new("inproc");
        let rt = crate::client::runtime();
        let secret = Secret::create_file(&dir.path().join("cluster.secret")).expect("create a cluster secret");
        let common = cli::serve::Common {
            fsname: "braid".into(),
            secret: secret.clone(),
            heartbeat: Duration::from_millis(spec.heartbeat_ms.max(1)),
            in_process: false,
            tls: None,
        };
        let root = dir.path().to_path_buf();
        let mgs_addr = rt.block_on(async {
            let bounded = async {
                let mgs = cli::serve::start_mgs("127.0.0.1:0", &root.join("mgs"), &common, WAIT, None).await?;
                let mut ost = 0;
                for n in &spec.osts_per_oss {
                    let dirs: Vec<cli::serve::OstDir> = (ost..ost + n)
                        .map(|k| cli::serve::OstDir { dir: root.join(format!("ost{k}")), media: None })
                        .collect();
                    ost += n;
                    cli::serve::start_oss("127.0.0.1:0", None, &mgs, &dirs, &common, &Default::default()).await?;
                }
                cli::serve::start_mds("127.0.0.1:0", None, &mgs, &[root.join("mdt0")], &common, spec.mds.clone(), None)
                    .await?;
                anyhow::Ok(mgs)
            };
            match tokio::time::timeout(WAIT, bounded).await {
                Ok(r) => r.unwrap_or_else(|e| panic!("in-process cluster did not start: {e:#}")),
                Err(_) => panic!("in-process cluster not started in {WAIT:?}"),
            }
        });
        let client = crate::client::connect(&rt, client_config(&mgs_addr, secret.clone()));
        InProcessCluster { client, mgs_addr, secret, rt: Some(rt), dir }
    }

    /// Runs `f` (typically calls on [`InProcessCluster::client`]) on the cluster's
    /// runtime, failing the test if it takes longer than [`WAIT`].
    pub fn run<F: Future>(&self, f: F) -> F::Output {
        crate::client::within(self.rt(), "an operation on the in-process cluster", f)
    }

    /// Another client, with settings `cfg` (e.g. without directory leases); start
    /// from [`InProcessCluster::client_config`].
    pub fn connect(&self, cfg: ClientConfig) -> Client {
        crate::client::connect(self.rt(), cfg)
    }

    /// The settings of a client of this cluster.
    pub fn client_config(&self) -> ClientConfig {
        client_config(&self.mgs_addr, self.secret.clone())
    }

    /// The directory holding the MGS, MDT and OST data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("runtime until drop")
    }
}

impl Drop for InProcessCluster {
    fn drop(&mut self) {
        // Servers are tasks of the runtime: they stop with it, without waiting for
        // idle workers, before the directory under them is removed.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
