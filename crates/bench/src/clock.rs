//! One clock all task processes agree on. Aggregate bandwidth is total bytes divided by
//! (last task's end - first task's start), and those instants come from different processes:
//! `std::time::Instant` gives no cross-process guarantee, `CLOCK_MONOTONIC` is system-wide on
//! Linux and never jumps like wall time does.

/// Nanoseconds on the system-wide monotonic clock.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec and CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Seconds between two `monotonic_ns` readings.
pub fn seconds_between(start_ns: u64, end_ns: u64) -> f64 {
    end_ns.saturating_sub(start_ns) as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_goes_backwards() {
        let first = monotonic_ns();
        let second = monotonic_ns();
        assert!(second >= first);
        assert_eq!(seconds_between(2_000_000_000, 3_500_000_000), 1.5);
        assert_eq!(seconds_between(5, 1), 0.0);
    }
}
