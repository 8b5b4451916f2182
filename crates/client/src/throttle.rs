//! A limit on the bytes this client moves to and from OSTs per second, as if they sat
//! behind a slower network or medium (`-o ost_limit=RATE`): the benchmarks of the SSD
//! cache compare it with OSTs slower than the cache's disk, as on a real cluster,
//! where on one machine the OSTs would be the same disk as the cache.
//!
//! Transfers are serialized on a virtual link: each one finishes `bytes / rate` after
//! the later of now and the end of the one before, and its caller waits until then,
//! unless that is within [`SLACK`]: the runtime's timer ticks in milliseconds, so a
//! 4 KiB transfer (20 us at 200 MB/s) would otherwise wait a whole tick. The link's
//! debt still grows with every transfer, so a stream of them is held to the rate.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A transfer ending at most this far ahead goes without waiting.
const SLACK: Duration = Duration::from_millis(2);

pub(crate) struct Throttle {
    bytes_per_s: f64,
    /// When the virtual link is free again.
    free_at: Mutex<Instant>,
}

impl Throttle {
    pub(crate) fn new(bytes_per_s: u64) -> Throttle {
        Throttle { bytes_per_s: bytes_per_s.max(1) as f64, free_at: Mutex::new(Instant::now()) }
    }

    /// Waits until `bytes` have crossed the virtual link.
    pub(crate) async fn pass(&self, bytes: u64) {
        let done = {
            let mut free = self.free_at.lock().expect("throttle");
            let start = (*free).max(Instant::now());
            *free = start + Duration::from_secs_f64(bytes as f64 / self.bytes_per_s);
            *free
        };
        if done > Instant::now() + SLACK {
            tokio::time::sleep_until(done).await;
        }
    }
}
