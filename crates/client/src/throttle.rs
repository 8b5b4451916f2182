//! A slower path to the OSTs for this client, as if they sat behind a slower network
//! or medium (`-o ost_limit=RATE,ost_latency=DURATION`): the benchmarks of the SSD
//! cache compare it with OSTs slower than the cache's disk, as on a real cluster,
//! where on one machine the OSTs would be the same disk as the cache, a loopback hop
//! away.
//!
//! Transfers are serialized on a virtual link: each one finishes `bytes / rate` after
//! the later of now and the end of the one before, and no sooner than `latency` after
//! it began; its caller waits until then, unless that is within [`SLACK`] (the
//! runtime's timer ticks in milliseconds, so a 4 KiB transfer, 20 us at 200 MB/s,
//! would otherwise wait a whole tick; the link's debt still grows with every transfer,
//! so a stream of them is held to the rate). A latency is waited in full, rounded up
//! to the timer's millisecond.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A transfer ending at most this far ahead goes without waiting.
const SLACK: Duration = Duration::from_millis(2);

pub(crate) struct Throttle {
    /// Bytes per second; `None`: no limit.
    bytes_per_s: Option<f64>,
    latency: Duration,
    /// When the virtual link is free again.
    free_at: Mutex<Instant>,
}

impl Throttle {
    pub(crate) fn new(bytes_per_s: Option<u64>, latency: Duration) -> Throttle {
        Throttle { bytes_per_s: bytes_per_s.map(|r| r.max(1) as f64), latency, free_at: Mutex::new(Instant::now()) }
    }

    /// Waits until `bytes` have crossed the virtual link.
    pub(crate) async fn pass(&self, bytes: u64) {
        let now = Instant::now();
        let mut done = now;
        if let Some(rate) = self.bytes_per_s {
            let mut free = self.free_at.lock().expect("throttle");
            let start = (*free).max(now);
            *free = start + Duration::from_secs_f64(bytes as f64 / rate);
            done = *free;
        }
        if !self.latency.is_zero() {
            tokio::time::sleep_until(done.max(now + self.latency)).await;
        } else if done > now + SLACK {
            tokio::time::sleep_until(done).await;
        }
    }
}
