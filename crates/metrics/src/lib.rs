//! Metrics of every braid process: counters, gauges and histograms kept in atomics,
//! rendered in Prometheus' text exposition format (version 0.0.4), served over HTTP
//! ([`endpoint`]) and read back by `braid stats` ([`parse`]).
//!
//! Why our own: the text format is a page of string writing, and the crates that do
//! it bring a dependency tree as large as braid's own. Recording is a read lock, a
//! hash lookup and a few relaxed atomic adds, so it stays on in every process (as
//! Lustre's stats are); `--metrics ADDR` only opens the endpoint.
//!
//! Each crate keeps its families in a `OnceLock` and registers them once per process
//! in [`global`]; several servers in one process (`braid up`) tell their series apart
//! by their `target` label.

pub mod endpoint;
mod family;
pub mod parse;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock};

pub use family::{Counter, Family, Gauge, Histogram, Labels, Limit, Metric, Series, Target};

/// The series a hot path records into, found once per key and kept for the rest of
/// the process: after the first, a request finds all of its series (requests,
/// latency, bytes...) with one hash lookup under a read lock instead of one per
/// family. For keys from a bounded set only (the targets a process serves times the
/// operations it knows): nothing is ever dropped.
pub struct Interned<K, S: 'static> {
    map: OnceLock<std::sync::RwLock<std::collections::HashMap<K, &'static S>>>,
}

impl<K: std::hash::Hash + Eq + Clone, S: Sync> Interned<K, S> {
    pub const fn new() -> Interned<K, S> {
        Interned { map: OnceLock::new() }
    }

    /// The series of `key`, made by `make` the first time it is met.
    pub fn get(&self, key: &K, make: impl FnOnce(&K) -> S) -> &'static S {
        let map = self.map.get_or_init(Default::default);
        if let Some(s) = map.read().expect("interned series").get(key) {
            return s;
        }
        let mut map = map.write().expect("interned series");
        map.entry(key.clone()).or_insert_with(|| Box::leak(Box::new(make(key))))
    }
}

impl<K: std::hash::Hash + Eq + Clone, S: Sync> Default for Interned<K, S> {
    fn default() -> Self {
        Interned::new()
    }
}

/// Histogram bounds for latencies, in seconds: 50 µs (an RPC on loopback) to 10 s (a
/// recovery wait).
pub const LATENCY_SECONDS: &[f64] =
    &[0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Every family of a process, and what refreshes gauges just before a scrape.
#[derive(Default)]
pub struct Registry {
    families: Mutex<Vec<Arc<dyn Render>>>,
    before_scrape: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
}

/// A family as the registry renders it.
pub trait Render: Send + Sync {
    fn render(&self, out: &mut String);
}

/// The process's registry.
pub fn global() -> &'static Registry {
    static GLOBAL: OnceLock<Registry> = OnceLock::new();
    GLOBAL.get_or_init(Registry::default)
}

impl Registry {
    /// Registers a family. Its name must be unique in the registry (each crate
    /// registers its families once, behind a `OnceLock`).
    pub fn register<K: Labels, M: Metric>(&self, family: Family<K, M>) -> Arc<Family<K, M>> {
        let family = Arc::new(family);
        self.families.lock().expect("metric families").push(family.clone());
        family
    }

    /// Runs `refresh` before every scrape: for gauges read off state that is not
    /// counted as it changes (space used, queue depths).
    pub fn before_scrape(&self, refresh: impl Fn() + Send + Sync + 'static) {
        self.before_scrape.lock().expect("scrape hooks").push(Box::new(refresh));
    }

    /// Every family, in the text format, after `braid_process_info`, whose
    /// `instance` label tells processes apart (a process serving several roles
    /// answers at each of their addresses with the same metrics).
    pub fn render(&self) -> String {
        for refresh in self.before_scrape.lock().expect("scrape hooks").iter() {
            refresh();
        }
        let families: Vec<Arc<dyn Render>> = self.families.lock().expect("metric families").clone();
        let mut out = String::with_capacity(16 << 10);
        let _ = write!(
            out,
            "# HELP braid_process_info This process: its instance id and braid version.\n\
             # TYPE braid_process_info gauge\n\
             braid_process_info{{instance=\"{}\",version=\"{}\"}} 1\n",
            instance(),
            env!("CARGO_PKG_VERSION")
        );
        for f in families {
            f.render(&mut out);
        }
        out
    }
}

/// A random id of this process, made at its first scrape.
pub fn instance() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded from the system's randomness per process.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        format!("{:016x}", h.finish())
    })
}

/// Writes `v` as a label value: backslash, double quote and newline escaped.
pub(crate) fn escape_label(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Writes a sample value: integers without a fraction, `+Inf` as Prometheus spells it.
pub(crate) fn write_value(out: &mut String, v: f64) {
    if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        let _ = write!(out, "{}", v as i64);
    } else {
        let _ = write!(out, "{v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interned_series_are_made_once_per_key() {
        static SERIES: Interned<u32, Series<Counter>> = Interned::new();
        let registry = Registry::default();
        let family = registry.register(Family::<Target, Counter>::new("braid_test_interned_total", "test"));
        let made = std::sync::atomic::AtomicUsize::new(0);
        let get = |k: u32| {
            SERIES.get(&k, |k| {
                made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                family.series(&Target(format!("T{k}")))
            })
        };
        get(1).inc();
        get(1).inc();
        get(2).inc();
        assert_eq!(made.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert!(std::ptr::eq(get(1), get(1)));
        let text = registry.render();
        assert!(text.contains("braid_test_interned_total{target=\"T1\"} 2"), "{text}");
        assert!(text.contains("braid_test_interned_total{target=\"T2\"} 1"), "{text}");
    }
}
