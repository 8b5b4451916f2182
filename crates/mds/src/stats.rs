//! What an MDT counts of its commits for the metrics endpoint: operations per
//! group-commit batch, mutations waiting for one, the redo log's size, and how long
//! checkpoints take. Requests
//! themselves are counted by `rpc::stats`, as every server's are.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Family, Gauge, Histogram, Series, Target};

/// Bounds of the batch-size histogram (operations per journal record).
const BATCH_OPERATIONS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

struct Families {
    batch: std::sync::Arc<Family<Target, Histogram>>,
    redo: std::sync::Arc<Family<Target, Gauge>>,
    checkpoint: std::sync::Arc<Family<Target, Histogram>>,
    queue: std::sync::Arc<Family<Target, Gauge>>,
}

fn families() -> &'static Families {
    static F: OnceLock<Families> = OnceLock::new();
    F.get_or_init(|| {
        let r = metrics::global();
        Families {
            batch: r.register(Family::with_buckets(
                "braid_mdt_batch_operations",
                "Mutations applied per group-commit batch (one redo record each).",
                BATCH_OPERATIONS,
            )),
            redo: r.register(Family::new(
                "braid_mdt_redo_log_bytes",
                "Size of the MDT's redo log: what the next checkpoint writes into the database.",
            )),
            checkpoint: r.register(Family::with_buckets(
                "braid_mdt_checkpoint_duration_seconds",
                "Time a checkpoint of the memtable into the database takes.",
                metrics::LATENCY_SECONDS,
            )),
            queue: r.register(Family::new(
                "braid_mdt_commit_queue_operations",
                "Mutations queued for the MDT's next group-commit batch (its queue depth).",
            )),
        }
    })
}

/// The queue-depth series of MDT `index`, held by its group commit.
pub fn queue_depth(index: u32) -> Series<Gauge> {
    families().queue.series(&Target(format!("MDT{index:04X}")))
}

/// The series of one MDT, held by its committer.
pub struct MdtStats {
    batch: Series<Histogram>,
    redo: Series<Gauge>,
    checkpoint: Series<Histogram>,
}

impl MdtStats {
    pub fn of(index: u32) -> MdtStats {
        let f = families();
        let t = Target(format!("MDT{index:04X}"));
        MdtStats { batch: f.batch.series(&t), redo: f.redo.series(&t), checkpoint: f.checkpoint.series(&t) }
    }

    /// A batch of `operations` was logged; the redo log holds `redo_bytes`.
    pub fn logged(&self, operations: usize, redo_bytes: u64) {
        self.batch.observe(operations as f64);
        self.redo.set(redo_bytes as i64);
    }

    /// A checkpoint took `took`; the redo log holds `redo_bytes` now.
    pub fn checkpointed(&self, took: Duration, redo_bytes: u64) {
        self.checkpoint.observe_duration(took);
        self.redo.set(redo_bytes as i64);
    }
}
