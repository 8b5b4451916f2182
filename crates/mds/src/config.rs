//! What an MDS is told at start, and what can stop it from starting.

use std::path::PathBuf;
use std::time::Duration;

use layout::LayoutSpec;
use store::StoreError;

#[derive(Debug, Clone)]
pub struct MdsConfig {
    /// The file system's default layout (the root directory's default at format).
    pub default_layout: LayoutSpec,
    /// How often the OST list is fetched from the MGS.
    pub config_refresh: Duration,
    /// Most mutations applied in one transaction.
    pub batch_max: usize,
    /// How long a reply stays in the reply cache (well above any client's recovery
    /// timeout, so a retry always finds it).
    pub reply_keep: Duration,
    /// How often the destroy queue is drained.
    pub destroy_interval: Duration,
    /// After a restart, orphans (unlinked files open at the time) are destroyed after
    /// this long.
    pub orphan_grace: Duration,
    /// How often the database is made durable and the redo log emptied: the most a
    /// crash of the machine (not of the process) can take back without an fsync.
    pub checkpoint_interval: Duration,
    /// Force the redo log to disk before every reply (Lustre's `sync_journal`):
    /// every acknowledged operation survives a power loss, at one fsync per batch.
    pub sync_journal: bool,
    /// Largest Data-on-MDT component a new file may get (Lustre's `dom_stripesize`,
    /// 1 MiB by default); 0 refuses new DoM layouts by dropping their DoM component.
    pub dom_max: u64,
    /// Stripe the root over this many MDTs, from MDT 0, once they are up, if it is
    /// still empty (`--root-stripes`; 1 leaves it on MDT 0).
    pub root_stripes: u32,
}

impl Default for MdsConfig {
    fn default() -> Self {
        MdsConfig {
            default_layout: LayoutSpec::raid0(Some(1), Some(1 << 20)),
            config_refresh: Duration::from_secs(1),
            batch_max: 256,
            reply_keep: Duration::from_secs(600),
            destroy_interval: Duration::from_millis(500),
            orphan_grace: Duration::from_secs(60),
            checkpoint_interval: Duration::from_secs(1),
            sync_journal: false,
            dom_max: 1 << 20,
            root_stripes: 1,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MdsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("MDT {index} in {dir}: {detail}")]
    Format { index: u32, dir: PathBuf, detail: String },
}
