//! What tests that talk to a cluster through the native client (or through a mount,
//! by system call) need again and again: a runtime, a connected client, a bound on
//! every wait, and errnos out of results.

use std::time::Duration;

use client::{Client, ClientConfig};
use proto::auth::Secret;
use proto::Errno;

use crate::{Cluster, Mount};

/// Bound on anything a test waits for that must finish (a client's recovery timeout,
/// one operation): a hang fails the test instead of hanging the suite.
pub const WAIT: Duration = Duration::from_secs(30);

/// A runtime for the clients of one test: two workers, as the machines that run
/// the suite have few cores.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
}

/// The settings of a client of the cluster at `mgs` that retries for up to [`WAIT`].
pub fn client_config(mgs: &str, secret: Secret) -> ClientConfig {
    let mut cfg = ClientConfig::new(mgs, secret);
    cfg.rpc.recovery_timeout = WAIT;
    cfg
}

/// Connects a client with `cfg` on `rt`.
pub fn connect(rt: &tokio::runtime::Runtime, cfg: ClientConfig) -> Client {
    rt.block_on(Client::connect(cfg)).expect("connect a client")
}

/// Runs `f` on `rt`, failing the test if it takes longer than [`WAIT`].
pub fn within<T>(rt: &tokio::runtime::Runtime, what: &str, f: impl std::future::Future<Output = T>) -> T {
    rt.block_on(async { tokio::time::timeout(WAIT, f).await })
        .unwrap_or_else(|_| panic!("{what}: not done in {WAIT:?}"))
}

impl Cluster {
    /// The settings of a client of this cluster (see [`client_config`]).
    pub fn client_config(&self) -> ClientConfig {
        if self.spec.insecure {
            return client_config(&self.mgs_addr, Secret::Insecure);
        }
        client_config(&self.mgs_addr, Secret::load(&self.secret).expect("load the cluster secret"))
    }

    /// A client of this cluster connected on `rt`.
    pub fn connect(&self, rt: &tokio::runtime::Runtime) -> Client {
        connect(rt, self.client_config())
    }
}

/// The errno of a failed client operation; panics if it succeeded.
#[track_caller]
pub fn client_errno<T: std::fmt::Debug>(r: client::Result<T>) -> Errno {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.errno(),
    }
}

/// The errno of a failed system call; panics if it succeeded or the error is not
/// an OS error.
#[track_caller]
pub fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.raw_os_error().unwrap_or_else(|| panic!("not an OS error: {e}")),
    }
}

/// 0 for success, else the errno (-1 for an error that is not an OS error): for
/// tests that assert both outcomes of one call.
pub fn code<T>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

/// The calling thread's `errno` after a raw `libc` call failed.
pub fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A non-blocking whole-file fcntl lock of `typ` (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`)
/// on `fd`: 0 or the errno.
pub fn setlk(fd: i32, typ: i32) -> i32 {
    // SAFETY: flock is plain data; fcntl on a descriptor the caller holds.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    if unsafe { libc::fcntl(fd, libc::F_SETLK, &mut fl as *mut libc::flock) } == 0 {
        0
    } else {
        last_errno()
    }
}

/// A cluster of real processes with one FUSE mount of it. Field order is drop
/// order: the mount goes before the servers.
pub struct MountedCluster {
    pub m: Mount,
    pub c: Cluster,
}

impl MountedCluster {
    /// Starts a default cluster with `bin` and mounts it with `-o opts`.
    pub fn start(bin: &std::path::Path, opts: &str) -> MountedCluster {
        let c = Cluster::start(bin, crate::ClusterSpec::default());
        let m = Mount::new(&c, opts);
        MountedCluster { m, c }
    }
}
