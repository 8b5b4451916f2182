//! `braid stats` and `braid top`: the cluster's live view from the command line,
//! without a Prometheus server.
//!
//! Every server the configuration names (the MGS, each MDS and OSS) is asked for its
//! metrics (`Request::Metrics`: the text its `--metrics` endpoint serves, collected
//! whether or not that endpoint is open) twice, an interval apart. The differences
//! give each target's and operation's rate, bandwidth, errors and latency percentiles
//! (interpolated in the histogram's buckets, as PromQL's `histogram_quantile`), and
//! each job's. A process serving several roles answers at each of their addresses
//! with the same metrics: it is counted once, by its `braid_process_info` instance.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use metrics::parse::Sample;
use proto::msg::{Request, Response};
use rpc::{Identity, RpcClient, RpcOptions};

/// What a view is sorted by (`--sort`, and keys in `braid top`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    Ops,
    Bytes,
    Latency,
    Target,
}

impl SortBy {
    pub fn parse(s: &str) -> Result<SortBy> {
        Ok(match s {
            "ops" => SortBy::Ops,
            "bytes" => SortBy::Bytes,
            "latency" => SortBy::Latency,
            "target" => SortBy::Target,
            _ => bail!("--sort {s}: ops, bytes, latency or target"),
        })
    }
}

/// One target and operation over the interval.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpRow {
    pub target: String,
    pub op: String,
    pub ops_per_s: f64,
    pub bytes_per_s: f64,
    pub errors_per_s: f64,
    /// Latency percentiles in seconds (`None` without requests).
    pub p50_s: Option<f64>,
    pub p99_s: Option<f64>,
}

/// One job on one target over the interval.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobRow {
    pub job: String,
    pub target: String,
    pub ops_per_s: f64,
    pub bytes_per_s: f64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct View {
    pub interval_s: f64,
    /// Server processes that answered, and addresses that did not.
    pub processes: usize,
    pub unreachable: Vec<String>,
    pub ops: Vec<OpRow>,
    pub jobs: Vec<JobRow>,
}

/// The samples of one process at one moment.
type Snapshot = Vec<Sample>;

/// (target, op) -> value of the samples of `name`, summed over other labels.
fn by_target_op(s: &Snapshot, name: &str) -> HashMap<(String, String), f64> {
    let mut out = HashMap::new();
    for x in s.iter().filter(|x| x.name == name) {
        let key = (x.label("target").unwrap_or("").to_string(), x.label("op").unwrap_or("").to_string());
        *out.entry(key).or_default() += x.value;
    }
    out
}

/// (target, op) -> [(le, cumulative count)] of the latency histogram.
fn buckets(s: &Snapshot) -> HashMap<(String, String), Vec<(f64, f64)>> {
    let mut out: HashMap<(String, String), Vec<(f64, f64)>> = HashMap::new();
    for x in s.iter().filter(|x| x.name == "braid_rpc_request_duration_seconds_bucket") {
        let le = match x.label("le") {
            Some("+Inf") => f64::INFINITY,
            Some(v) => match v.parse() {
                Ok(v) => v,
                Err(_) => continue,
            },
            None => continue,
        };
        let key = (x.label("target").unwrap_or("").to_string(), x.label("op").unwrap_or("").to_string());
        out.entry(key).or_default().push((le, x.value));
    }
    for b in out.values_mut() {
        b.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// The `q` quantile of a cumulative histogram, interpolated linearly in its bucket;
/// `None` when it counts nothing.
pub fn quantile(q: f64, cumulative: &[(f64, f64)]) -> Option<f64> {
    let total = cumulative.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut below = (0.0, 0.0);
    for &(le, count) in cumulative {
        if count >= rank {
            if le.is_infinite() {
                // Past the last bound: the last bound is all that is known.
                return Some(below.0);
            }
            let in_bucket = count - below.1;
            let frac = if in_bucket > 0.0 { (rank - below.1) / in_bucket } else { 1.0 };
            return Some(below.0 + (le - below.0) * frac);
        }
        below = (le, count);
    }
    Some(below.0)
}

/// The view of the interval between snapshots `before` and `after` of the same
/// processes, `secs` apart.
pub fn view(before: &[Snapshot], after: &[Snapshot], secs: f64) -> View {
    let sum = |snaps: &[Snapshot], name: &str| {
        let mut total: HashMap<(String, String), f64> = HashMap::new();
        for s in snaps {
            for (k, v) in by_target_op(s, name) {
                *total.entry(k).or_default() += v;
            }
        }
        total
    };
    let delta = |name: &str| {
        let (b, a) = (sum(before, name), sum(after, name));
        a.into_iter().map(|(k, v)| (k.clone(), (v - b.get(&k).copied().unwrap_or(0.0)).max(0.0))).collect()
    };
    let requests: HashMap<(String, String), f64> = delta("braid_rpc_requests_total");
    let errors: HashMap<(String, String), f64> = delta("braid_rpc_errors_total");
    let received: HashMap<(String, String), f64> = delta("braid_rpc_received_bytes_total");
    let sent: HashMap<(String, String), f64> = delta("braid_rpc_sent_bytes_total");
    let hist = |snaps: &[Snapshot]| {
        let mut total: HashMap<(String, String), BTreeMap<u64, (f64, f64)>> = HashMap::new();
        for s in snaps {
            for (k, bs) in buckets(s) {
                let t = total.entry(k).or_default();
                for (le, c) in bs {
                    t.entry(le.to_bits()).or_insert((le, 0.0)).1 += c;
                }
            }
        }
        total
    };
    let (hb, ha) = (hist(before), hist(after));
    let secs = secs.max(1e-9);
    let mut ops = Vec::new();
    for ((target, op), n) in &requests {
        if *n <= 0.0 {
            continue;
        }
        let key = (target.clone(), op.clone());
        let mut cumulative: Vec<(f64, f64)> = ha
            .get(&key)
            .map(|a| {
                a.iter()
                    .map(|(bits, (le, c))| {
                        let was = hb.get(&key).and_then(|b| b.get(bits)).map_or(0.0, |x| x.1);
                        (*le, (c - was).max(0.0))
                    })
                    .collect()
            })
            .unwrap_or_default();
        cumulative.sort_by(|a, b| a.0.total_cmp(&b.0));
        let bytes = received.get(&key).copied().unwrap_or(0.0) + sent.get(&key).copied().unwrap_or(0.0);
        ops.push(OpRow {
            target: target.clone(),
            op: op.clone(),
            ops_per_s: n / secs,
            bytes_per_s: bytes / secs,
            errors_per_s: errors.get(&key).copied().unwrap_or(0.0) / secs,
            p50_s: quantile(0.5, &cumulative),
            p99_s: quantile(0.99, &cumulative),
        });
    }
    let job_sum = |snaps: &[Snapshot], name: &str| {
        let mut total: HashMap<(String, String), f64> = HashMap::new();
        for x in snaps.iter().flatten().filter(|x| x.name == name) {
            let key = (x.label("job").unwrap_or("").to_string(), x.label("target").unwrap_or("").to_string());
            *total.entry(key).or_default() += x.value;
        }
        total
    };
    let job_delta = |name: &str| -> HashMap<(String, String), f64> {
        let (b, a) = (job_sum(before, name), job_sum(after, name));
        a.into_iter().map(|(k, v)| (k.clone(), (v - b.get(&k).copied().unwrap_or(0.0)).max(0.0))).collect()
    };
    let job_ops = job_delta("braid_job_requests_total");
    let job_bytes = job_delta("braid_job_bytes_total");
    let mut jobs: Vec<JobRow> = job_ops
        .iter()
        .filter(|(_, n)| **n > 0.0)
        .map(|((job, target), n)| JobRow {
            job: job.clone(),
            target: target.clone(),
            ops_per_s: n / secs,
            bytes_per_s: job_bytes.get(&(job.clone(), target.clone())).copied().unwrap_or(0.0) / secs,
        })
        .collect();
    jobs.sort_by(|a, b| b.bytes_per_s.total_cmp(&a.bytes_per_s).then(b.ops_per_s.total_cmp(&a.ops_per_s)));
    View { interval_s: secs, processes: after.len(), unreachable: Vec::new(), ops, jobs }
}

impl View {
    /// Keeps the rows of targets whose name starts with `prefix` (`OST0001`, `MDT`).
    pub fn only_target(&mut self, prefix: &str) {
        self.ops.retain(|r| r.target.starts_with(prefix));
        self.jobs.retain(|r| r.target.starts_with(prefix));
    }

    pub fn sort(&mut self, by: SortBy) {
        let lat = |r: &OpRow| r.p99_s.unwrap_or(0.0);
        self.ops.sort_by(|a, b| match by {
            SortBy::Ops => b.ops_per_s.total_cmp(&a.ops_per_s),
            SortBy::Bytes => b.bytes_per_s.total_cmp(&a.bytes_per_s),
            SortBy::Latency => lat(b).total_cmp(&lat(a)),
            SortBy::Target => a.target.cmp(&b.target).then(a.op.cmp(&b.op)),
        });
        if by == SortBy::Target {
            self.jobs.sort_by(|a, b| a.target.cmp(&b.target).then(a.job.cmp(&b.job)));
        }
    }

    /// The view as text tables, at most `rows` rows each.
    pub fn render(&self, rows: usize) -> String {
        let mut out = String::new();
        let ms = |s: Option<f64>| s.map_or_else(|| "-".to_string(), |s| format!("{:.3}", s * 1e3));
        out.push_str(&format!(
            "{} server process(es), over {:.1} s{}\n\n",
            self.processes,
            self.interval_s,
            if self.unreachable.is_empty() {
                String::new()
            } else {
                format!("; not answering: {}", self.unreachable.join(", "))
            }
        ));
        out.push_str(&format!(
            "{:<9} {:<18} {:>10} {:>10} {:>8} {:>9} {:>9}\n",
            "TARGET", "OP", "OPS/S", "MIB/S", "ERR/S", "P50_MS", "P99_MS"
        ));
        for r in self.ops.iter().take(rows) {
            out.push_str(&format!(
                "{:<9} {:<18} {:>10.1} {:>10.2} {:>8.1} {:>9} {:>9}\n",
                if r.target.is_empty() { "-" } else { &r.target },
                r.op,
                r.ops_per_s,
                r.bytes_per_s / (1 << 20) as f64,
                r.errors_per_s,
                ms(r.p50_s),
                ms(r.p99_s)
            ));
        }
        if self.ops.is_empty() {
            out.push_str("(no requests in the interval)\n");
        }
        if !self.jobs.is_empty() {
            out.push_str(&format!("\n{:<24} {:<9} {:>10} {:>10}\n", "JOB", "TARGET", "OPS/S", "MIB/S"));
            for j in self.jobs.iter().take(rows) {
                out.push_str(&format!(
                    "{:<24} {:<9} {:>10.1} {:>10.2}\n",
                    j.job,
                    j.target,
                    j.ops_per_s,
                    j.bytes_per_s / (1 << 20) as f64
                ));
            }
        }
        out
    }
}

/// The servers of a cluster, reached as a client tool.
pub struct Cluster {
    rpc: Vec<Arc<RpcClient>>,
}

impl Cluster {
    /// The MGS at `mgs` and every server its configuration names.
    pub async fn connect(mgs: &str, secret: proto::auth::Secret, timeout: Duration) -> Result<Cluster> {
        let tls = crate::client_tls(None)?;
        let identity = Identity::with_tls("admin", secret, tls);
        let opts = RpcOptions { recovery_timeout: timeout, request_timeout: timeout, ..Default::default() };
        let client = |addr: &str| Arc::new(RpcClient::new(addr.to_string(), identity.clone(), opts.clone()));
        let m = client(mgs);
        let answer = m.call(&Request::MgsGetConfig, vec![]).await.with_context(|| format!("the MGS at {mgs}"))?;
        let cfg = match answer.response {
            Response::Config(c) => c,
            other => bail!("the MGS at {mgs} answered {other:?} to a configuration request"),
        };
        let mut addrs = vec![mgs.to_string()];
        for t in cfg.mdts.iter().chain(cfg.osts.iter()) {
            if !addrs.contains(&t.address) {
                addrs.push(t.address.clone());
            }
        }
        Ok(Cluster { rpc: addrs.iter().map(|a| client(a)).collect() })
    }

    /// One snapshot per server process that answers, and the addresses that did not.
    pub async fn snapshot(&self) -> (Vec<Snapshot>, Vec<String>) {
        let mut asks = tokio::task::JoinSet::new();
        for r in &self.rpc {
            let r = r.clone();
            asks.spawn(async move { (r.addr().to_string(), fetch(&r).await) });
        }
        let answers = asks.join_all().await;
        let mut seen = HashSet::new();
        let (mut snaps, mut down) = (Vec::new(), Vec::new());
        for (addr, a) in answers {
            match a {
                Ok(samples) => {
                    let instance = samples
                        .iter()
                        .find(|s| s.name == "braid_process_info")
                        .and_then(|s| s.label("instance"))
                        .unwrap_or(&addr)
                        .to_string();
                    if seen.insert(instance) {
                        snaps.push(samples);
                    }
                }
                Err(e) => {
                    tracing::debug!("{addr}: {e:#}");
                    down.push(addr);
                }
            }
        }
        (snaps, down)
    }

    /// Snapshots `interval` apart and the view between them.
    pub async fn view(&self, interval: Duration) -> View {
        let (before, _) = self.snapshot().await;
        let started = Instant::now();
        tokio::time::sleep(interval).await;
        let (after, down) = self.snapshot().await;
        // A process that answered only once is left out of the interval.
        let ids = |s: &[Snapshot]| -> Vec<Option<String>> { s.iter().map(instance_of).collect() };
        let before_ids = ids(&before);
        let after: Vec<Snapshot> = after.into_iter().filter(|s| before_ids.contains(&instance_of(s))).collect();
        let mut v = view(&before, &after, started.elapsed().as_secs_f64());
        v.unreachable = down;
        v
    }
}

fn instance_of(s: &Snapshot) -> Option<String> {
    s.iter().find(|x| x.name == "braid_process_info").and_then(|x| x.label("instance")).map(str::to_string)
}

async fn fetch(rpc: &RpcClient) -> Result<Snapshot> {
    let r = rpc.call(&Request::Metrics, vec![]).await?;
    if !matches!(r.response, Response::Data) {
        bail!("answered {:?} to a metrics request", r.response);
    }
    let text = std::str::from_utf8(&r.payload).context("metrics are not UTF-8")?;
    Ok(metrics::parse::parse(text)?)
}

/// `braid stats`: one view of the cluster.
pub fn run_stats(
    url: &str,
    secret: proto::auth::Secret,
    target: Option<&str>,
    interval: Duration,
    sort: SortBy,
    json: bool,
) -> Result<()> {
    let p = crate::url::require(url)?;
    let rt = crate::runtime()?;
    let v = rt.block_on(async {
        let cluster = Cluster::connect(&p.mgs, secret, Duration::from_secs(10)).await?;
        let mut v = cluster.view(interval).await;
        if let Some(t) = target {
            v.only_target(t);
        }
        v.sort(sort);
        anyhow::Ok(v)
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", v.render(usize::MAX));
    }
    Ok(())
}

/// `braid top`: the view again every `interval`, as `top` is: keys `o` (by ops),
/// `b` (by bytes), `l` (by latency), `t` (by target), `q` or Ctrl-C to quit. Without a
/// terminal (or with `iterations`), it prints that many views one after the other.
pub fn run_top(
    url: &str,
    secret: proto::auth::Secret,
    target: Option<&str>,
    interval: Duration,
    mut sort: SortBy,
    iterations: Option<u64>,
) -> Result<()> {
    let p = crate::url::require(url)?;
    let rt = crate::runtime()?;
    let cluster = rt.block_on(Cluster::connect(&p.mgs, secret, Duration::from_secs(10)))?;
    let tty = iterations.is_none() && unsafe { libc::isatty(0) == 1 && libc::isatty(1) == 1 };
    let _raw = if tty { Some(RawTerminal::enter()?) } else { None };
    let mut n = 0u64;
    loop {
        let mut v = rt.block_on(cluster.view(interval));
        if let Some(t) = target {
            v.only_target(t);
        }
        v.sort(sort);
        let mut out = std::io::stdout().lock();
        if tty {
            let rows = terminal_rows().saturating_sub(8) / 2;
            // Home, clear, then the view with CR LF line ends (raw mode).
            write!(out, "\x1b[H\x1b[2J")?;
            let head =
                format!("braid top  {}  sort: {:?}  (o ops, b bytes, l latency, t target, q quit)\n", p.mgs, sort);
            write!(out, "{}", (head + &v.render(rows.max(3))).replace('\n', "\r\n"))?;
        } else {
            writeln!(out, "{}", v.render(usize::MAX))?;
        }
        out.flush()?;
        n += 1;
        if iterations.is_some_and(|max| n >= max) {
            return Ok(());
        }
        if tty {
            match read_key() {
                Some(b'q' | 3) => return Ok(()),
                Some(b'o') => sort = SortBy::Ops,
                Some(b'b') => sort = SortBy::Bytes,
                Some(b'l') => sort = SortBy::Latency,
                Some(b't') => sort = SortBy::Target,
                _ => {}
            }
        }
    }
}

/// The terminal without line buffering or echo while `braid top` runs.
struct RawTerminal(libc::termios);

impl RawTerminal {
    fn enter() -> Result<RawTerminal> {
        // SAFETY: termios is plain data, filled by tcgetattr on a valid descriptor.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                bail!("cannot read the terminal's settings: {}", std::io::Error::last_os_error());
            }
            let saved = t;
            // Ctrl-C comes as a key (ISIG off), so that the settings are put back
            // on the way out.
            t.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
            t.c_cc[libc::VMIN] = 0;
            t.c_cc[libc::VTIME] = 0;
            libc::tcsetattr(0, libc::TCSANOW, &t);
            Ok(RawTerminal(saved))
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restores the settings read at enter.
        unsafe {
            libc::tcsetattr(0, libc::TCSANOW, &self.0);
        }
        println!();
    }
}

/// A key pressed since the last look, if any.
fn read_key() -> Option<u8> {
    let mut b = [0u8; 16];
    // SAFETY: reads into a local buffer; the terminal is non-blocking (VMIN 0).
    let n = unsafe { libc::read(0, b.as_mut_ptr().cast(), b.len()) };
    (n > 0).then(|| b[n as usize - 1])
}

fn terminal_rows() -> usize {
    // SAFETY: winsize is plain data filled by the ioctl.
    unsafe {
        let mut w: libc::winsize = std::mem::zeroed();
        if libc::ioctl(1, libc::TIOCGWINSZ, &mut w) == 0 && w.ws_row > 0 {
            w.ws_row as usize
        } else {
            40
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_in_their_bucket() {
        let h = [(0.001, 50.0), (0.01, 90.0), (0.1, 100.0), (f64::INFINITY, 100.0)];
        assert_eq!(quantile(0.5, &h), Some(0.001));
        let p90 = quantile(0.9, &h).unwrap();
        assert!((p90 - 0.01).abs() < 1e-12, "{p90}");
        let p95 = quantile(0.95, &h).unwrap();
        assert!((p95 - 0.055).abs() < 1e-9, "{p95}");
        assert_eq!(quantile(0.5, &[(0.1, 0.0), (f64::INFINITY, 0.0)]), None);
        assert_eq!(quantile(0.99, &[(0.1, 1.0), (f64::INFINITY, 10.0)]), Some(0.1), "past the last bound");
    }

    fn snap(text: &str) -> Snapshot {
        metrics::parse::parse(text).unwrap()
    }

    #[test]
    fn a_view_is_the_difference_of_two_snapshots() {
        let before = snap(
            "braid_rpc_requests_total{target=\"OST0001\",op=\"ost_write\"} 100\n\
             braid_rpc_received_bytes_total{target=\"OST0001\",op=\"ost_write\"} 1048576\n\
             braid_rpc_request_duration_seconds_bucket{target=\"OST0001\",op=\"ost_write\",le=\"0.001\"} 100\n\
             braid_rpc_request_duration_seconds_bucket{target=\"OST0001\",op=\"ost_write\",le=\"+Inf\"} 100\n\
             braid_job_requests_total{target=\"OST0001\",job=\"7\",op=\"ost_write\"} 100\n",
        );
        let after = snap(
            "braid_rpc_requests_total{target=\"OST0001\",op=\"ost_write\"} 300\n\
             braid_rpc_errors_total{target=\"OST0001\",op=\"ost_write\"} 2\n\
             braid_rpc_received_bytes_total{target=\"OST0001\",op=\"ost_write\"} 5242880\n\
             braid_rpc_request_duration_seconds_bucket{target=\"OST0001\",op=\"ost_write\",le=\"0.001\"} 100\n\
             braid_rpc_request_duration_seconds_bucket{target=\"OST0001\",op=\"ost_write\",le=\"+Inf\"} 300\n\
             braid_rpc_requests_total{target=\"MDT0000\",op=\"getattr\"} 5\n\
             braid_job_requests_total{target=\"OST0001\",job=\"7\",op=\"ost_write\"} 300\n\
             braid_job_bytes_total{target=\"OST0001\",job=\"7\",op=\"ost_write\"} 4194304\n",
        );
        let v = view(&[before], &[after], 2.0);
        let w = v.ops.iter().find(|r| r.op == "ost_write").unwrap();
        assert_eq!((w.ops_per_s, w.bytes_per_s, w.errors_per_s), (100.0, 2097152.0, 1.0));
        // Every request of the interval took more than 1 ms: the percentile is the
        // last finite bound.
        assert_eq!(w.p50_s, Some(0.001));
        let g = v.ops.iter().find(|r| r.op == "getattr").unwrap();
        assert_eq!(g.ops_per_s, 2.5, "a series new in the interval counts from zero");
        assert_eq!(
            v.jobs,
            vec![JobRow { job: "7".into(), target: "OST0001".into(), ops_per_s: 100.0, bytes_per_s: 2097152.0 }]
        );
        let text = v.render(10);
        assert!(text.contains("OST0001") && text.contains("ost_write") && text.contains("JOB"), "{text}");
    }
}
