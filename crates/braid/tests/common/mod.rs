//! What the integration tests that drive a native client in their own process share:
//! a runtime and a client connected to a test cluster.

use std::time::Duration;

use client::{Client, ClientConfig};
use proto::auth::Secret;
use testkit::Cluster;

/// How long the client keeps trying a server that does not answer before it fails.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(30);

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

/// A client of `c`, with directory leases if `dir_leases`.
pub fn connect(rt: &tokio::runtime::Runtime, c: &Cluster, dir_leases: bool) -> Client {
    let secret = Secret::load(&c.secret).expect("load the cluster secret");
    let mut cfg = ClientConfig::new(c.mgs_addr.clone(), secret);
    cfg.rpc.recovery_timeout = RECOVERY_TIMEOUT;
    cfg.dir_leases = dir_leases;
    rt.block_on(Client::connect(cfg)).expect("connect a client")
}
