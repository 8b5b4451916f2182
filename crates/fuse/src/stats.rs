//! What a mount counts for the metrics endpoint: the kernel's requests it serves, by
//! FUSE operation, with their latency (arrival to answer), and the SSD cache's and
//! the memory cache's figures, read off the client at each scrape.

use std::future::Future;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use metrics::{Counter, Family, Gauge, Histogram, Labels};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Op(&'static str);

impl Labels for Op {
    fn each(&self, label: &mut dyn FnMut(&'static str, &str)) {
        label("op", self.0);
    }
}

struct Families {
    requests: Arc<Family<Op, Counter>>,
    latency: Arc<Family<Op, Histogram>>,
}

fn families() -> &'static Families {
    static F: OnceLock<Families> = OnceLock::new();
    F.get_or_init(|| {
        let r = metrics::global();
        Families {
            requests: r.register(Family::new(
                "braid_fuse_requests_total",
                "Kernel (FUSE) requests served by the client, by operation.",
            )),
            latency: r.register(Family::with_buckets(
                "braid_fuse_request_duration_seconds",
                "Time from a kernel request's arrival to its answer, by operation.",
                metrics::LATENCY_SECONDS,
            )),
        }
    })
}

/// The series of one operation, found once (the operations are a fixed set).
struct OpSeries {
    requests: metrics::Series<Counter>,
    latency: metrics::Series<Histogram>,
}

fn op_series(name: &'static str) -> &'static OpSeries {
    static SERIES: metrics::Interned<&'static str, OpSeries> = metrics::Interned::new();
    SERIES.get(&name, |&name| {
        let (f, key) = (families(), Op(name));
        OpSeries { requests: f.requests.series(&key), latency: f.latency.series(&key) }
    })
}

/// `op`, counted as FUSE operation `name` once it has answered.
pub(crate) fn counted<F: Future<Output = ()>>(name: &'static str, op: F) -> impl Future<Output = ()> {
    let started = Instant::now();
    async move {
        op.await;
        let s = op_series(name);
        s.requests.inc();
        s.latency.observe_duration(started.elapsed());
    }
}

struct CacheFamilies {
    hits: Arc<Family<(), Counter>>,
    hit_bytes: Arc<Family<(), Counter>>,
    misses: Arc<Family<(), Counter>>,
    fill_bytes: Arc<Family<(), Counter>>,
    evictions: Arc<Family<(), Counter>>,
    used: Arc<Family<(), Gauge>>,
    size: Arc<Family<(), Gauge>>,
    page_hits: Arc<Family<(), Counter>>,
    page_misses: Arc<Family<(), Counter>>,
    page_used: Arc<Family<(), Gauge>>,
    readahead_hit: Arc<Family<(), Counter>>,
    readahead_miss: Arc<Family<(), Counter>>,
    queued: Arc<Family<Queue, Gauge>>,
}

/// A queue of work the client answered and still owes the MDS.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Queue(&'static str);

impl Labels for Queue {
    fn each(&self, label: &mut dyn FnMut(&'static str, &str)) {
        label("queue", self.0);
    }
}

fn cache_families() -> &'static CacheFamilies {
    static F: OnceLock<CacheFamilies> = OnceLock::new();
    F.get_or_init(|| {
        let r = metrics::global();
        let counter = |name, help| r.register(Family::<(), Counter>::new(name, help));
        let gauge = |name, help| r.register(Family::<(), Gauge>::new(name, help));
        CacheFamilies {
            hits: counter("braid_cache_hits_total", "Reads served whole from the SSD read cache."),
            hit_bytes: counter("braid_cache_hit_bytes_total", "Bytes read from the SSD read cache."),
            misses: counter("braid_cache_misses_total", "Reads the SSD read cache did not hold (sent to the OSTs)."),
            fill_bytes: counter("braid_cache_fill_bytes_total", "Bytes written into the SSD read cache after misses."),
            evictions: counter("braid_cache_evictions_total", "Extents evicted from the SSD read cache."),
            used: gauge("braid_cache_used_bytes", "Bytes the SSD read cache holds."),
            size: gauge("braid_cache_size_bytes", "Bytes the SSD read cache may hold."),
            page_hits: counter("braid_page_cache_hits_total", "Reads served from the client's memory cache."),
            page_misses: counter("braid_page_cache_misses_total", "Reads the client's memory cache did not hold."),
            page_used: gauge("braid_page_cache_used_bytes", "Bytes the client's memory cache holds."),
            readahead_hit: counter(
                "braid_readahead_hit_bytes_total",
                "Bytes of reads answered from chunks the client's read-ahead fetched before they were asked for.",
            ),
            readahead_miss: counter(
                "braid_readahead_miss_bytes_total",
                "Bytes of reads the read-ahead had nothing ahead for (read when asked).",
            ),
            queued: r.register(Family::new(
                "braid_client_queued_operations",
                "Work the client answered itself and is still sending to the MDS, by queue: flush (closes of files \
                 written under a directory lease), unlink (unlinks answered under a lease).",
            )),
        }
    })
}

/// The caches' figures, refreshed at every scrape from the mount's client while it
/// lives (a process with several mounts shows the last one's).
pub(crate) fn watch_caches(mount: Weak<crate::State>) {
    metrics::global().before_scrape(move || {
        let Some(s) = mount.upgrade() else { return };
        let f = cache_families();
        if let Some(c) = s.client.cache_stats() {
            f.hits.with(&(), |m| m.set(c.hits));
            f.hit_bytes.with(&(), |m| m.set(c.hit_bytes));
            f.misses.with(&(), |m| m.set(c.misses));
            f.fill_bytes.with(&(), |m| m.set(c.fill_bytes));
            f.evictions.with(&(), |m| m.set(c.evictions));
            f.used.with(&(), |m| m.set(c.used as i64));
            f.size.with(&(), |m| m.set(c.size as i64));
        }
        let io = s.client.io_stats();
        f.readahead_hit.with(&(), |m| m.set(io.readahead_hit_bytes));
        f.readahead_miss.with(&(), |m| m.set(io.readahead_miss_bytes));
        f.queued.with(&Queue("flush"), |m| m.set(io.deferred_flushes as i64));
        f.queued.with(&Queue("unlink"), |m| m.set(io.deferred_removals as i64));
        if let Some(p) = s.client.page_cache_stats() {
            f.page_hits.with(&(), |m| m.set(p.hits));
            f.page_misses.with(&(), |m| m.set(p.misses));
            f.page_used.with(&(), |m| m.set(p.used as i64));
        }
    });
}
