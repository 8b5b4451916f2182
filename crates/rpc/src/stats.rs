//! What every server counts of the requests it serves, per target and operation
//! (counts, errors, latency, bulk bytes, requests in flight), and per batch job
//! (Lustre's job stats: which job sends which target how much), and the job id a
//! client's requests carry.
//!
//! Counted here, where TCP and in-process requests meet, so that every service is
//! counted the same way without counting anything itself. A job id comes from the
//! client's task ([`with_job`]): the FUSE layer runs each request of a process of job
//! J inside `with_job(J, ..)`, and every RPC made on its behalf carries J.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use metrics::{Counter, Family, Gauge, Histogram, Labels, Limit};
use proto::msg::{Request, Response, TargetKind};

tokio::task_local! {
    static JOB: Option<Arc<str>>;
}

/// `f`, with `job` as the job id of every request it makes.
pub fn with_job<F: Future>(job: Option<Arc<str>>, f: F) -> tokio::task::futures::TaskLocalFuture<Option<Arc<str>>, F> {
    JOB.scope(job, f)
}

/// `f`, to run later (a task of its own), with the job id of the running task: work
/// a request leaves behind (writes behind, read-ahead) is counted to its job.
pub fn in_current_job<F: Future>(f: F) -> tokio::task::futures::TaskLocalFuture<Option<Arc<str>>, F> {
    JOB.scope(current_job(), f)
}

/// The job id of the running task's requests, if any.
pub fn current_job() -> Option<Arc<str>> {
    JOB.try_with(|j| j.clone()).ok().flatten().or_else(|| PROCESS_JOB.get().cloned())
}

/// The job of every request made outside a job's scope in this process: a native
/// client's own (`braid cp` run in a batch job counts for that job). Not set in a
/// mount, whose requests are each made for their caller's job.
static PROCESS_JOB: OnceLock<Arc<str>> = OnceLock::new();

/// Sets this process's job (see [`PROCESS_JOB`]); the first call wins.
pub fn set_process_job(job: &str) {
    let _ = PROCESS_JOB.set(Arc::from(job));
}

/// Series of one job age out after this long without a request (Lustre's
/// `job_cleanup_interval` is 600 s), and a process keeps at most this many.
pub const JOB_IDLE: Duration = Duration::from_secs(600);
pub const JOB_SERIES_MAX: usize = 4096;

/// The target label: `MDT0000`, `OST0003`, or empty for a request of a whole server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TargetLabel(Option<(TargetKind, u32)>);

impl TargetLabel {
    pub fn of(req: &Request) -> TargetLabel {
        TargetLabel(req.target())
    }

    fn text(&self) -> String {
        self.0.map(|(kind, index)| format!("{}{index:04X}", kind.name())).unwrap_or_default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct OpKey {
    target: TargetLabel,
    op: &'static str,
}

impl Labels for OpKey {
    fn each(&self, label: &mut dyn FnMut(&'static str, &str)) {
        label("target", &self.target.text());
        label("op", self.op);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ErrorKey {
    target: TargetLabel,
    op: &'static str,
    errno: &'static str,
}

impl Labels for ErrorKey {
    fn each(&self, label: &mut dyn FnMut(&'static str, &str)) {
        label("target", &self.target.text());
        label("op", self.op);
        label("errno", self.errno);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct JobKey {
    target: TargetLabel,
    job: Arc<str>,
    op: &'static str,
}

impl Labels for JobKey {
    fn each(&self, label: &mut dyn FnMut(&'static str, &str)) {
        label("target", &self.target.text());
        label("job", &self.job);
        label("op", self.op);
    }
}

struct Families {
    requests: Arc<Family<OpKey, Counter>>,
    errors: Arc<Family<ErrorKey, Counter>>,
    latency: Arc<Family<OpKey, Histogram>>,
    received: Arc<Family<OpKey, Counter>>,
    sent: Arc<Family<OpKey, Counter>>,
    in_flight: Arc<Family<OpKey, Gauge>>,
    job_requests: Arc<Family<JobKey, Counter>>,
    job_bytes: Arc<Family<JobKey, Counter>>,
}

fn families() -> &'static Families {
    static F: OnceLock<Families> = OnceLock::new();
    F.get_or_init(|| {
        let r = metrics::global();
        let jobs = Limit { max_series: JOB_SERIES_MAX, idle: JOB_IDLE };
        Families {
            requests: r.register(Family::new("braid_rpc_requests_total", "Requests served, by target and operation.")),
            errors: r.register(Family::new(
                "braid_rpc_errors_total",
                "Requests answered with an error, by target, operation and errno (lookups of absent names \
                 count as ENOENT).",
            )),
            latency: r.register(Family::with_buckets(
                "braid_rpc_request_duration_seconds",
                "Time from a request's arrival to its answer, by target and operation.",
                metrics::LATENCY_SECONDS,
            )),
            received: r.register(Family::new(
                "braid_rpc_received_bytes_total",
                "Bulk bytes received with requests (data written), by target and operation.",
            )),
            sent: r.register(Family::new(
                "braid_rpc_sent_bytes_total",
                "Bulk bytes sent with answers (data read), by target and operation.",
            )),
            in_flight: r.register(Family::new(
                "braid_rpc_requests_in_flight",
                "Requests being served now, by target and operation.",
            )),
            job_requests: r.register(
                Family::new("braid_job_requests_total", "Requests served, by target, job id and operation.")
                    .limited(jobs),
            ),
            job_bytes: r.register(
                Family::new(
                    "braid_job_bytes_total",
                    "Bulk bytes moved (received and sent), by target, job id and operation.",
                )
                .limited(jobs),
            ),
        }
    })
}

struct UsageFamilies {
    size: Arc<Family<metrics::Target, Gauge>>,
    free: Arc<Family<metrics::Target, Gauge>>,
    avail: Arc<Family<metrics::Target, Gauge>>,
    files: Arc<Family<metrics::Target, Gauge>>,
    files_free: Arc<Family<metrics::Target, Gauge>>,
}

/// Records a target's space and inodes (as its heartbeat reports them to the MGS),
/// named as node_exporter names a file system's.
pub fn target_usage(kind: TargetKind, index: u32, usage: &proto::msg::Usage) {
    static F: OnceLock<UsageFamilies> = OnceLock::new();
    let f = F.get_or_init(|| {
        let r = metrics::global();
        UsageFamilies {
            size: r.register(Family::new("braid_target_size_bytes", "Size of the target's storage.")),
            free: r.register(Family::new("braid_target_free_bytes", "Free space of the target's storage.")),
            avail: r.register(Family::new(
                "braid_target_avail_bytes",
                "Space of the target's storage that files may still take.",
            )),
            files: r.register(Family::new("braid_target_files", "Inodes (files) the target can hold.")),
            files_free: r.register(Family::new("braid_target_files_free", "Inodes (files) the target can still hold.")),
        }
    });
    let t = metrics::Target(TargetLabel(Some((kind, index))).text());
    let set = |fam: &Family<metrics::Target, Gauge>, v: u64| fam.with(&t, |g| g.set(v.min(i64::MAX as u64) as i64));
    set(&f.size, usage.total_bytes);
    set(&f.free, usage.free_bytes);
    set(&f.avail, usage.avail_bytes);
    set(&f.files, usage.total_inodes);
    set(&f.files_free, usage.free_inodes);
}

/// A request being served: counted in flight until [`Served::end`] (or its drop,
/// for a handler given up on).
pub struct Served {
    key: OpKey,
    series: &'static OpSeries,
    job: Option<Arc<str>>,
    started: Instant,
    received: usize,
    ended: bool,
}

/// The series of one target and operation, found once: a request then costs one
/// lookup and a few atomic adds. Made for each (target, operation) met, which the
/// targets a process serves and the operations it knows bound; never dropped.
struct OpSeries {
    requests: metrics::Series<Counter>,
    latency: metrics::Series<Histogram>,
    received: metrics::Series<Counter>,
    sent: metrics::Series<Counter>,
    in_flight: metrics::Series<Gauge>,
}

fn op_series(key: &OpKey) -> &'static OpSeries {
    static SERIES: metrics::Interned<OpKey, OpSeries> = metrics::Interned::new();
    SERIES.get(key, |key| {
        let f = families();
        OpSeries {
            requests: f.requests.series(key),
            latency: f.latency.series(key),
            received: f.received.series(key),
            sent: f.sent.series(key),
            in_flight: f.in_flight.series(key),
        }
    })
}

/// Starts counting a request with `received` bulk bytes.
pub fn begin(req: &Request, job: Option<Arc<str>>, received: usize) -> Served {
    let key = OpKey { target: TargetLabel::of(req), op: req.op_name() };
    let series = op_series(&key);
    series.in_flight.add(1);
    Served { key, series, job, started: Instant::now(), received, ended: false }
}

impl Served {
    /// Counts the answer, with `sent` bulk bytes.
    pub fn end(mut self, resp: &Response, sent: usize) {
        self.ended = true;
        let f = families();
        let (key, s) = (&self.key, self.series);
        s.in_flight.add(-1);
        s.requests.inc();
        if let Response::Error(e) = resp {
            f.errors.with(&ErrorKey { target: key.target, op: key.op, errno: e.code.name() }, |c| c.inc());
        }
        s.latency.observe_duration(self.started.elapsed());
        if self.received > 0 {
            s.received.add(self.received as u64);
        }
        if sent > 0 {
            s.sent.add(sent as u64);
        }
        if let Some(job) = self.job.take() {
            let jk = JobKey { target: key.target, job, op: key.op };
            f.job_requests.with(&jk, |c| c.inc());
            let bytes = (self.received + sent) as u64;
            if bytes > 0 {
                f.job_bytes.with(&jk, |c| c.add(bytes));
            }
        }
    }
}

/// Serves `req` through `handle`, counted; a [`Request::Metrics`] is answered here,
/// for every service alike.
pub(crate) async fn counted<F>(
    req: Request,
    job: Option<Arc<str>>,
    payload: bytes::Bytes,
    handle: F,
) -> crate::service::Answer
where
    F: AsyncFnOnce(Request, bytes::Bytes) -> crate::service::Answer,
{
    // Bytes written to DoM come inline in the message.
    let served = begin(&req, job, payload.len() + req.inline_bytes());
    let answer = match req {
        Request::Metrics => (Response::Data, vec![bytes::Bytes::from(metrics::global().render())]),
        req => handle(req, payload).await,
    };
    served.end(&answer.0, answer.1.iter().map(|b| b.len()).sum());
    answer
}

impl Drop for Served {
    fn drop(&mut self) {
        if !self.ended {
            self.series.in_flight.add(-1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics::parse::parse;
    use proto::Errno;
    use proto::RemoteError;

    fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
        parse(text)
            .unwrap()
            .into_iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
            .map(|s| s.value)
            .sum()
    }

    #[tokio::test]
    async fn requests_are_counted_by_target_op_and_job() {
        let job = with_job(Some("job-42".into()), async { current_job() }).await;
        assert_eq!(job.as_deref(), Some("job-42"));
        assert_eq!(current_job(), None);

        let object = proto::ObjectId { fid: proto::Fid::new(0, 1, 1), component: 0, stripe: 0 };
        let write = Request::OstWrite { ost: 7, object, offset: 0, sync: false };
        begin(&write, job.clone(), 4096).end(&Response::Written { bytes: 4096 }, 0);
        let failed = Request::OstStatfs { ost: 7 };
        let err = Response::Error(RemoteError { code: Errno::Io, message: "x".into() });
        begin(&failed, None, 0).end(&err, 0);
        let abandoned = begin(&failed, None, 0);
        drop(abandoned);

        let text = metrics::global().render();
        let ost = [("target", "OST0007")];
        assert!(value(&text, "braid_rpc_requests_total", &[ost[0], ("op", "ost_write")]) >= 1.0);
        assert!(value(&text, "braid_rpc_errors_total", &[ost[0], ("op", "ost_statfs"), ("errno", "EIO")]) >= 1.0);
        assert!(value(&text, "braid_rpc_received_bytes_total", &[ost[0], ("op", "ost_write")]) >= 4096.0);
        assert_eq!(value(&text, "braid_rpc_requests_in_flight", &[ost[0], ("op", "ost_statfs")]), 0.0);
        assert_eq!(value(&text, "braid_job_bytes_total", &[ost[0], ("job", "job-42"), ("op", "ost_write")]), 4096.0);
        assert_eq!(value(&text, "braid_job_requests_total", &[("job", "job-42")]), 1.0);
    }

    #[tokio::test]
    async fn bytes_written_inline_to_dom_count_for_the_job() {
        let fid = proto::Fid::new(0, 9, 1);
        let write = Request::MdsDomWrite { fid, offset: 0, data: vec![1; 5000], publish: None };
        let job: Option<Arc<str>> = Some("dom-job".into());
        counted(write, job, bytes::Bytes::new(), async |_, _| (Response::Ok, vec![])).await;
        let text = metrics::global().render();
        let key = [("job", "dom-job"), ("op", "dom_write")];
        assert_eq!(value(&text, "braid_job_bytes_total", &key), 5000.0, "{text}");
    }
}
