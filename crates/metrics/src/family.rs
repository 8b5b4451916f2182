//! Families of series: one metric name, one series per set of label values.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::Hash;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crate::{escape_label, write_value, Render};

/// The label values of one series, as a key. Label names are the implementor's.
pub trait Labels: Eq + Hash + Clone + Send + Sync + 'static {
    /// Calls `label` with each name and value, in order.
    fn each(&self, label: &mut dyn FnMut(&'static str, &str));
}

impl Labels for () {
    fn each(&self, _label: &mut dyn FnMut(&'static str, &str)) {}
}

/// What a series holds.
pub trait Metric: Send + Sync + 'static {
    /// The `# TYPE` of its family.
    const KIND: &'static str;
    fn new(buckets: &'static [f64]) -> Self;
    /// Writes its samples; `labels` is `a="x",b="y"` or empty.
    fn render(&self, name: &str, labels: &str, out: &mut String);
}

/// A count that only goes up.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    /// Mirrors a count kept elsewhere (read off at a scrape); it must not go down.
    pub fn set(&self, total: u64) {
        self.0.fetch_max(total, Ordering::Relaxed);
    }
}

impl Metric for Counter {
    const KIND: &'static str = "counter";
    fn new(_: &'static [f64]) -> Self {
        Counter::default()
    }
    fn render(&self, name: &str, labels: &str, out: &mut String) {
        sample(out, name, "", labels, None, self.get() as f64);
    }
}

/// A value that goes up and down.
#[derive(Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    pub fn add(&self, n: i64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Metric for Gauge {
    const KIND: &'static str = "gauge";
    fn new(_: &'static [f64]) -> Self {
        Gauge::default()
    }
    fn render(&self, name: &str, labels: &str, out: &mut String) {
        sample(out, name, "", labels, None, self.get() as f64);
    }
}

/// Observations counted into buckets with upper bounds (the last is +Inf), with their
/// sum.
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket, not cumulative; one more than `bounds` (+Inf).
    counts: Box<[AtomicU64]>,
    /// An f64, added to by compare-and-swap.
    sum_bits: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, v: f64) {
        let i = self.bounds.iter().position(|b| v <= *b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let mut cur = self.sum_bits.load(Ordering::Relaxed);
        loop {
            let next = (f64::from_bits(cur) + v).to_bits();
            match self.sum_bits.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Observes a duration in seconds.
    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

impl Metric for Histogram {
    const KIND: &'static str = "histogram";
    fn new(bounds: &'static [f64]) -> Self {
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "histogram bounds must increase");
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_bits: AtomicU64::new(0f64.to_bits()),
        }
    }
    fn render(&self, name: &str, labels: &str, out: &mut String) {
        let mut cumulative = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let le = self.bounds.get(i).copied().unwrap_or(f64::INFINITY);
            sample(out, name, "_bucket", labels, Some(le), cumulative as f64);
        }
        sample(out, name, "_sum", labels, None, f64::from_bits(self.sum_bits.load(Ordering::Relaxed)));
        sample(out, name, "_count", labels, None, cumulative as f64);
    }
}

fn sample(out: &mut String, name: &str, suffix: &str, labels: &str, le: Option<f64>, v: f64) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        out.push_str(labels);
        if let Some(le) = le {
            if !labels.is_empty() {
                out.push(',');
            }
            out.push_str("le=\"");
            write_value(out, le);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    write_value(out, v);
    out.push('\n');
}

/// A bound on a family whose label values come from outside (job ids): series not
/// touched for `idle` are dropped, and at `max_series` the least recently touched
/// goes to make room.
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    pub max_series: usize,
    pub idle: Duration,
}

struct Entry<M> {
    metric: M,
    /// Nanoseconds since the process's first metric, when last touched (limited
    /// families only): the order of eviction and the age for `idle`.
    touched: AtomicU64,
}

/// One series of a family, held (see [`Family::series`]).
pub struct Series<M>(Arc<Entry<M>>);

impl<M> Clone for Series<M> {
    fn clone(&self) -> Self {
        Series(self.0.clone())
    }
}

impl<M> std::ops::Deref for Series<M> {
    type Target = M;
    fn deref(&self) -> &M {
        &self.0.metric
    }
}

/// The one label most series have: the target (`MDT0000`, `OST0001`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target(pub String);

impl Labels for Target {
    fn each(&self, label: &mut dyn FnMut(&'static str, &str)) {
        label("target", &self.0);
    }
}

/// One metric name and its series.
pub struct Family<K, M> {
    name: &'static str,
    help: &'static str,
    buckets: &'static [f64],
    limit: Option<Limit>,
    series: RwLock<HashMap<K, Arc<Entry<M>>>>,
}

fn now_nanos() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn fresh(touched: &AtomicU64, now: u64, idle: Duration) -> bool {
    u128::from(now.saturating_sub(touched.load(Ordering::Relaxed))) < idle.as_nanos()
}

impl<K: Labels, M: Metric> Family<K, M> {
    /// A counter or gauge family. `name` follows Prometheus' conventions (base
    /// units, `_total` for counters).
    pub fn new(name: &'static str, help: &'static str) -> Self {
        Family { name, help, buckets: &[], limit: None, series: RwLock::default() }
    }

    /// A histogram family with these bucket bounds.
    pub fn with_buckets(name: &'static str, help: &'static str, buckets: &'static [f64]) -> Self {
        Family { buckets, ..Family::new(name, help) }
    }

    /// Bounded as `limit` says.
    pub fn limited(self, limit: Limit) -> Self {
        assert!(limit.max_series > 0, "a limited family needs room for a series");
        Family { limit: Some(limit), ..self }
    }

    /// Runs `f` on the series of `key`, made if it is new.
    pub fn with<R>(&self, key: &K, f: impl FnOnce(&M) -> R) -> R {
        let found = self.series.read().expect("metric series").get(key).cloned();
        let s = match found {
            Some(s) => s,
            None => self.insert(key),
        };
        if self.limit.is_some() {
            s.touched.store(now_nanos(), Ordering::Relaxed);
        }
        f(&s.metric)
    }

    fn insert(&self, key: &K) -> Arc<Entry<M>> {
        let mut series = self.series.write().expect("metric series");
        if let Some(s) = series.get(key) {
            return s.clone();
        }
        if let Some(limit) = self.limit {
            if series.len() >= limit.max_series {
                let now = now_nanos();
                series.retain(|_, s| fresh(&s.touched, now, limit.idle));
            }
            if series.len() >= limit.max_series {
                let oldest =
                    series.iter().min_by_key(|(_, s)| s.touched.load(Ordering::Relaxed)).map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    series.remove(&k);
                }
            }
        }
        let s = Arc::new(Entry { metric: M::new(self.buckets), touched: AtomicU64::new(now_nanos()) });
        series.insert(key.clone(), s.clone());
        s
    }

    /// The series of `key`, made if it is new, to record into without a lookup (a
    /// target's own series, held by the target). Not for limited families, whose
    /// series must be touched as they are used.
    pub fn series(&self, key: &K) -> Series<M> {
        assert!(self.limit.is_none(), "the series of a limited family are reached through `with`");
        let found = self.series.read().expect("metric series").get(key).cloned();
        Series(found.unwrap_or_else(|| self.insert(key)))
    }

    /// How many series the family holds.
    pub fn len(&self) -> usize {
        self.series.read().expect("metric series").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn label_text<K: Labels>(key: &K) -> String {
    let mut s = String::new();
    key.each(&mut |name, value| {
        if !s.is_empty() {
            s.push(',');
        }
        let _ = write!(s, "{name}=\"");
        escape_label(&mut s, value);
        s.push('"');
    });
    s
}

impl<K: Labels, M: Metric> Render for Family<K, M> {
    fn render(&self, out: &mut String) {
        if let Some(limit) = self.limit {
            let now = now_nanos();
            self.series.write().expect("metric series").retain(|_, s| fresh(&s.touched, now, limit.idle));
        }
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, M::KIND);
        let series = self.series.read().expect("metric series");
        let mut rows: Vec<(String, &Arc<Entry<M>>)> = series.iter().map(|(k, s)| (label_text(k), s)).collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        for (labels, s) in rows {
            s.metric.render(self.name, &labels, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, PartialEq, Eq, Hash)]
    struct Op(&'static str, String);
    impl Labels for Op {
        fn each(&self, label: &mut dyn FnMut(&'static str, &str)) {
            label("op", self.0);
            label("job", &self.1);
        }
    }

    #[test]
    fn counters_and_histograms_render_in_the_text_format() {
        let c: Family<Op, Counter> = Family::new("braid_test_requests_total", "Requests.");
        c.with(&Op("write", "a\"b\\c\nd".into()), |c| c.add(3));
        let h: Family<(), Histogram> = Family::with_buckets("braid_test_seconds", "Latency.", &[0.001, 0.01]);
        h.with(&(), |h| {
            h.observe(0.0005);
            h.observe(0.005);
            h.observe(3.0);
        });
        let mut out = String::new();
        c.render(&mut out);
        h.render(&mut out);
        assert_eq!(
            out,
            "# HELP braid_test_requests_total Requests.\n# TYPE braid_test_requests_total counter\n\
             braid_test_requests_total{op=\"write\",job=\"a\\\"b\\\\c\\nd\"} 3\n\
             # HELP braid_test_seconds Latency.\n# TYPE braid_test_seconds histogram\n\
             braid_test_seconds_bucket{le=\"0.001\"} 1\nbraid_test_seconds_bucket{le=\"0.01\"} 2\n\
             braid_test_seconds_bucket{le=\"+Inf\"} 3\nbraid_test_seconds_sum 3.0055\nbraid_test_seconds_count 3\n"
        );
    }

    #[test]
    fn a_limited_family_keeps_at_most_its_bound_and_drops_the_least_recent() {
        let f: Family<Op, Counter> = Family::new("braid_test_jobs_total", "Jobs.")
            .limited(Limit { max_series: 3, idle: Duration::from_secs(3600) });
        for i in 0..10 {
            f.with(&Op("read", format!("job{i}")), |c| c.inc());
            assert!(f.len() <= 3, "{} series", f.len());
        }
        // The newest is kept; the series touched just now survives the next insert.
        f.with(&Op("read", "job9".into()), |c| c.inc());
        f.with(&Op("read", "job10".into()), |c| c.inc());
        assert_eq!(f.with(&Op("read", "job9".into()), |c| c.get()), 2);
        assert_eq!(f.len(), 3);
    }

    #[test]
    fn idle_series_of_a_limited_family_age_out_at_a_scrape() {
        let f: Family<Op, Counter> =
            Family::new("braid_test_idle_total", "Idle.").limited(Limit { max_series: 10, idle: Duration::ZERO });
        f.with(&Op("read", "j".into()), |c| c.inc());
        let mut out = String::new();
        f.render(&mut out);
        assert!(!out.contains("job=\"j\""), "{out}");
        assert!(f.is_empty());
    }
}
