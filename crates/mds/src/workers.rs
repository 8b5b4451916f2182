//! The MDS's background work, each a named worker with its own period and bound, all
//! stopped by one signal when the MDS goes away.
//!
//! - `cluster-refresh`: the OST list from the MGS (placement of new files);
//! - `destroy-drain`: destroys the objects of deleted files on their OSTs, from the
//!   persistent queue (fast unlink, no orphans left on OSTs);
//! - `orphan-reap`: destroys files unlinked or replaced while open, once closed;
//! - `orphan-grace`: once, after a restart, the orphans of the previous run;
//! - `checkpoint-tick`: a due checkpoint even when no client writes;
//! - `reply-prune`: answers kept for reply reconstruction, once old enough.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use proto::msg::{Request, Response, TargetKind};
use proto::Fid;
use rpc::{Identity, RpcClient, RpcOptions};
use tokio::sync::watch;

use crate::cluster::ClusterView;
use crate::commit::{now_secs, JobKind};
use crate::mdt::{OpError, Tbl};
use crate::target::Mdt;

/// One kind of background work.
pub trait Worker: Send + 'static {
    /// How it is named in logs.
    const NAME: &'static str;
    /// How long it sleeps between passes.
    fn period(&self) -> Duration;
    /// Whether the first pass runs at once rather than after one period.
    fn eager(&self) -> bool {
        false
    }
    /// One pass.
    fn tick(&mut self) -> impl Future<Output = ()> + Send;
}

/// The running workers; dropping it (or [`Workers::stop`]) stops them all.
pub struct Workers {
    stop: watch::Sender<bool>,
}

impl Default for Workers {
    fn default() -> Self {
        Workers { stop: watch::channel(false).0 }
    }
}

impl Workers {
    /// Runs `w` until the stop signal. Must be called inside a tokio runtime.
    pub fn spawn<W: Worker>(&self, mut w: W) {
        let mut stop = self.stop.subscribe();
        tokio::spawn(async move {
            let mut first = w.eager();
            loop {
                let wait = if first { Duration::ZERO } else { w.period() };
                first = false;
                tokio::select! {
                    _ = stop.changed() => break,
                    _ = tokio::time::sleep(wait) => {}
                }
                tokio::select! {
                    _ = stop.changed() => break,
                    _ = w.tick() => {}
                }
            }
            tracing::debug!(worker = W::NAME, "stopped");
        });
    }

    /// Runs `f` once after `delay`, unless stopped first.
    pub fn once(&self, name: &'static str, delay: Duration, f: impl Future<Output = ()> + Send + 'static) {
        let mut stop = self.stop.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.changed() => tracing::debug!(worker = name, "stopped"),
                _ = async { tokio::time::sleep(delay).await; f.await } => {}
            }
        });
    }

    pub fn stop(&self) {
        self.stop.send_replace(true);
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Fetches the cluster's configuration from the MGS.
pub struct ClusterRefresh {
    pub mgs: Arc<RpcClient>,
    pub cluster: Arc<RwLock<ClusterView>>,
    pub every: Duration,
    /// The last fetch failed (said once per outage).
    pub away: bool,
}

impl Worker for ClusterRefresh {
    const NAME: &'static str = "cluster-refresh";
    fn period(&self) -> Duration {
        self.every
    }
    fn eager(&self) -> bool {
        true
    }
    async fn tick(&mut self) {
        // Given up after a few periods: the next tick tries again.
        let patience = self.every.max(Duration::from_secs(1)) * 3;
        let r = match tokio::time::timeout(patience, refresh_cluster(&self.mgs, &self.cluster)).await {
            Ok(r) => r,
            Err(_) => Err(proto::RpcError::Timeout {
                addr: self.mgs.addr().to_string(),
                timeout_ms: patience.as_millis() as u64,
            }),
        };
        match (&r, self.away) {
            (Ok(()), true) => tracing::info!("the MGS at {} answers again", self.mgs.addr()),
            (Err(e), false) => tracing::warn!(
                "the MGS at {} does not answer ({e}): placing files on the configuration fetched last",
                self.mgs.addr()
            ),
            _ => {}
        }
        self.away = r.is_err();
    }
}

/// Fetches the configuration from the MGS into `cluster`: the OSTs new files are
/// placed on, with their state and pools.
pub async fn refresh_cluster(mgs: &RpcClient, cluster: &RwLock<ClusterView>) -> Result<(), proto::RpcError> {
    let r = mgs.call(&Request::MgsGetConfig, vec![]).await?;
    if let Response::Config(c) = r.response {
        let osts = c.ost_states();
        let mut v = cluster.write().expect("cluster view");
        v.osts = osts;
        v.config = Some(c);
    }
    Ok(())
}

/// Most destroy-queue entries one pass handles.
const DESTROY_PASS_MAX: usize = 256;

/// Destroys the objects of deleted files on their OSTs.
pub struct DestroyDrain {
    pub mdt: Arc<Mdt>,
    pub cluster: Arc<RwLock<ClusterView>>,
    pub identity: Arc<Identity>,
    pub every: Duration,
    /// One connection per OSS address (bounded by the OSSs of the cluster).
    clients: HashMap<String, Arc<RpcClient>>,
}

impl DestroyDrain {
    pub fn new(
        mdt: Arc<Mdt>,
        cluster: Arc<RwLock<ClusterView>>,
        identity: Arc<Identity>,
        every: Duration,
    ) -> DestroyDrain {
        DestroyDrain { mdt, cluster, identity, every, clients: HashMap::new() }
    }
}

impl Worker for DestroyDrain {
    const NAME: &'static str = "destroy-drain";
    fn period(&self) -> Duration {
        self.every
    }
    async fn tick(&mut self) {
        let opts = RpcOptions {
            recovery_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            ..Default::default()
        };
        let m = self.mdt.clone();
        let pending = match tokio::task::spawn_blocking(move || m.pending_destroys(DESTROY_PASS_MAX)).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                tracing::error!(mdt = self.mdt.index, "cannot read destroy queue: {e}");
                return;
            }
            Err(_) => return,
        };
        if pending.is_empty() {
            return;
        }
        let config = self.cluster.read().expect("cluster view").config.clone();
        let Some(config) = config else { return };
        let mut done = Vec::new();
        for (key, rec) in pending {
            let mut all = true;
            for (ost, object) in &rec.objects {
                let Some(t) = config.target(TargetKind::Ost, *ost) else {
                    // The OST was removed from the configuration: nothing to destroy.
                    continue;
                };
                if !t.up {
                    all = false;
                    break;
                }
                let c = self
                    .clients
                    .entry(t.address.clone())
                    .or_insert_with(|| Arc::new(RpcClient::new(t.address.clone(), self.identity.clone(), opts.clone())))
                    .clone();
                if let Err(e) = c.call(&Request::OstDestroy { ost: *ost, object: *object }, vec![]).await {
                    tracing::debug!("destroy of {} on OST {ost} failed: {e}", object.file_name());
                    all = false;
                    break;
                }
            }
            if all {
                done.push(key);
            }
        }
        if !done.is_empty() {
            self.mdt.submit_own(JobKind::DestroyDone(done)).await;
        }
    }
}

/// How long an orphan (a file replaced by a rename, or unlinked while open) outlives
/// its last name and its last handle before the reaper destroys it.
const REPLACED_GRACE_SECS: u64 = 2;
/// Most orphans one pass destroys.
const REAP_PASS_MAX: usize = 1024;

/// Destroys orphans nobody holds open any more; after a restart, once the recovery
/// is over (the clients' opens are counted again by then).
pub struct OrphanReap {
    pub mdt: Arc<Mdt>,
    pub callbacks: Arc<rpc::server::Callbacks>,
}

impl Worker for OrphanReap {
    const NAME: &'static str = "orphan-reap";
    fn period(&self) -> Duration {
        Duration::from_secs(1)
    }
    async fn tick(&mut self) {
        if let Some(r) = &self.mdt.recovery {
            r.wait_all(&self.callbacks).await;
        }
        let m = self.mdt.clone();
        let before = now_secs().saturating_sub(REPLACED_GRACE_SECS);
        let due = tokio::task::spawn_blocking(move || -> Result<Vec<Fid>, OpError> {
            let view = m.view()?;
            let opens = m.opens.lock().expect("opens");
            let mut due = Vec::new();
            for row in view.scan(Tbl::Orphans, std::ops::Bound::Unbounded)? {
                let (k, at) = row?;
                let at = at.as_slice().try_into().map(u64::from_le_bytes).unwrap_or(0);
                match Fid::from_key(&k) {
                    Some(fid) if at < before && !opens.contains_key(&fid) => due.push(fid),
                    _ => {}
                }
                if due.len() == REAP_PASS_MAX {
                    break;
                }
            }
            Ok(due)
        })
        .await;
        if let Ok(Ok(fids)) = due {
            if !fids.is_empty() {
                self.mdt.submit_own(JobKind::ReapOrphans(Some(fids))).await;
            }
        }
    }
}

/// Wakes the committer now and then, so the last writes before a quiet spell are
/// checkpointed too; ends leases past their time.
pub struct CheckpointTick {
    pub mdt: Arc<Mdt>,
    pub every: Duration,
}

impl Worker for CheckpointTick {
    const NAME: &'static str = "checkpoint-tick";
    fn period(&self) -> Duration {
        self.every
    }
    async fn tick(&mut self) {
        self.mdt.submit_own(JobKind::Checkpoint).await;
        self.mdt.leases().sweep(std::time::Instant::now());
    }
}

/// Drops answers kept for reply reconstruction once older than `keep`.
pub struct ReplyPrune {
    pub mdt: Arc<Mdt>,
    pub keep: Duration,
}

impl Worker for ReplyPrune {
    const NAME: &'static str = "reply-prune";
    fn period(&self) -> Duration {
        Duration::from_secs(60)
    }
    async fn tick(&mut self) {
        let before_secs = now_secs().saturating_sub(self.keep.as_secs());
        self.mdt.submit_own(JobKind::PruneReplies { before_secs }).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    struct Counter(Arc<AtomicU64>);

    impl Worker for Counter {
        const NAME: &'static str = "counter";
        fn period(&self) -> Duration {
            Duration::from_millis(5)
        }
        fn eager(&self) -> bool {
            true
        }
        async fn tick(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn workers_run_until_the_stop_signal_and_not_after() {
        let n = Arc::new(AtomicU64::new(0));
        let once = Arc::new(AtomicU64::new(0));
        let workers = Workers::default();
        workers.spawn(Counter(n.clone()));
        let o = once.clone();
        workers.once("late", Duration::from_secs(3600), async move {
            o.fetch_add(1, Ordering::SeqCst);
        });
        while n.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(workers);
        // Let the workers see the signal, then check that nothing runs any more.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let stopped_at = n.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(n.load(Ordering::SeqCst), stopped_at, "a stopped worker ticked");
        assert_eq!(once.load(Ordering::SeqCst), 0, "a stopped one-shot ran");
    }
}
