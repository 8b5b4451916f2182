//! What counting a request costs (issue 42: metrics within 2 % of mdtest creates and
//! IOR bandwidth), in nanoseconds a call on one thread: a server's `begin`..`end` for
//! a metadata request and for a 1 MiB OST write, with and without a job id (the job
//! series), the job id on the wire, and the mount's share: the per-request job scope,
//! the job id each RPC reads, and what `fuse::stats::counted` does (crate-private
//! there, so its calls are made here as it makes them). Then the same with two
//! threads at once and with caches cold, and a scrape's render. The job-id cache's
//! hit is in the client's bench (`cargo bench -p client --bench jobid`). Results and
//! the arithmetic: docs/benchmarks.md, "The counting measured directly".
//! `cargo bench -p rpc --bench stats [-- WORD]` (only the rows naming WORD).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use metrics::{Counter, Family, Histogram, Interned, Series};
use proto::msg::{decode_request, encode_request, Creds, OpenFlags, Request, Response};
use proto::{Fid, ObjectId};
use rpc::stats::{begin, current_job, with_job};

/// Calls of `f` a repetition.
const CALLS: u32 = 2_000_000;
/// Repetitions; the median is reported.
const REPS: usize = 7;

/// The median over [`REPS`] repetitions of ns per call of `f`, after a warm-up of one
/// repetition; and the smallest and largest repetition.
fn ns_per_call(mut f: impl FnMut()) -> (f64, f64, f64) {
    for _ in 0..CALLS {
        f();
    }
    let mut reps: Vec<f64> = (0..REPS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..CALLS {
                f();
            }
            t.elapsed().as_nanos() as f64 / f64::from(CALLS)
        })
        .collect();
    reps.sort_by(f64::total_cmp);
    (reps[REPS / 2], reps[0], reps[REPS - 1])
}

/// Whether to measure the row `what`: all of them, or those whose names contain a
/// word given after `--` (`cargo bench -p rpc --bench stats -- threads`).
fn wanted(what: &str) -> bool {
    let words: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    words.is_empty() || words.iter().any(|w| what.contains(w.as_str()))
}

/// CPU time of the calling thread, in ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes only into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// As [`row`], with two threads calling `f` at once (the series' atomics and the
/// maps' read locks shared between cores, as a server's threads share them): CPU ns
/// a call (the two threads' CPU time over their calls), and how much of the time both
/// ran (their CPU time over the wall time: 2 when they ran side by side throughout,
/// 1 when another process had one of the cores and they took turns).
fn row2(what: &str, f: impl Fn() + Sync) -> f64 {
    if !wanted(what) {
        return f64::NAN;
    }
    let run = || {
        let wall = Instant::now();
        let cpu: u64 = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let t = thread_cpu_ns();
                        for _ in 0..CALLS {
                            f();
                        }
                        thread_cpu_ns() - t
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().expect("bench thread")).sum()
        });
        let wall = wall.elapsed().as_nanos() as f64;
        (cpu as f64 / f64::from(2 * CALLS), cpu as f64 / wall)
    };
    run();
    let mut reps: Vec<(f64, f64)> = (0..REPS).map(|_| run()).collect();
    reps.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (median, min, max) = (reps[REPS / 2].0, reps[0].0, reps[REPS - 1].0);
    let mut both: Vec<f64> = reps.iter().map(|r| r.1).collect();
    both.sort_by(f64::total_cmp);
    println!("| {what} | {median:.1} | {min:.1}–{max:.1} (both ran: {:.2}) |", both[REPS / 2]);
    median
}

/// Bytes read between two calls of [`row_cold`]: more than a core's L2 (1 MiB on the
/// machine measured), less than its L3 (32 MiB).
const EVICT_BYTES: usize = 8 << 20;
/// Calls a repetition of [`row_cold`].
const COLD_CALLS: u32 = 1000;

/// ns a call of `f` made after reading [`EVICT_BYTES`] of other data, as a request
/// comes after a server's other work: its lines come back from L3 or memory. Each
/// call is timed alone; what timing an empty call takes is subtracted.
fn cold_ns(mut f: impl FnMut(), evict: &[u8]) -> Vec<f64> {
    let mut reps: Vec<f64> = (0..=REPS)
        .map(|_| {
            let mut total = 0u128;
            for _ in 0..COLD_CALLS {
                black_box(evict.iter().step_by(64).fold(0u8, |a, &b| a ^ b));
                let t = Instant::now();
                f();
                total += t.elapsed().as_nanos();
            }
            total as f64 / f64::from(COLD_CALLS)
        })
        .skip(1)
        .collect();
    reps.sort_by(f64::total_cmp);
    reps
}

fn row_cold(what: &str, f: impl FnMut(), evict: &[u8], empty: f64) -> f64 {
    if !wanted(what) {
        return f64::NAN;
    }
    let reps = cold_ns(f, evict);
    let median = reps[REPS / 2] - empty;
    println!("| {what} | {median:.1} | {:.1}–{:.1} |", reps[0] - empty, reps[REPS - 1] - empty);
    median
}

fn row(what: &str, f: impl FnMut()) -> f64 {
    if !wanted(what) && !what.starts_with("empty loop") {
        return f64::NAN;
    }
    let (median, min, max) = ns_per_call(f);
    println!("| {what} | {median:.1} | {min:.1}–{max:.1} |");
    median
}

/// Polls `f` once, as a runtime would (the futures here are ready at once).
fn poll_once<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => unreachable!("a ready future"),
    }
}

fn main() {
    // As `braid bench mdtest` through a mount names its job without SLURM_JOB_ID: the
    // program's name and the uid.
    let job: Arc<str> = Arc::from("braid.1000");
    let parent = Fid::new(0, 1, 1);
    let creds = Creds { uid: 1000, gid: 1000, groups: vec![] };
    let create = Request::MdsCreate {
        creds,
        parent,
        name: "file.mdtest.0.1234".into(),
        mode: 0o644,
        exclusive: true,
        flags: OpenFlags { read: false, write: true, truncate: false },
        layout: None,
    };
    let object = ObjectId { fid: Fid::new(0, 1, 77), component: 0, stripe: 1 };
    let write = Request::OstWrite { ost: 1, object, offset: 0, sync: false };
    const MIB: usize = 1 << 20;
    let written = Response::Written { bytes: MIB as u64 };

    println!("| per call, one thread | ns (median of {REPS}) | min–max |");
    println!("|---|---|---|");
    let loop_ns = row("empty loop (what every figure includes)", || {
        black_box(());
    });

    // A server: every request goes through begin..end (rpc::stats::counted).
    row("server: begin..end, MDS create, no job", || {
        begin(black_box(&create), None, 0).end(black_box(&Response::Ok), 0)
    });
    row("server: begin..end, MDS create, job id (job series)", || {
        begin(black_box(&create), Some(job.clone()), 0).end(black_box(&Response::Ok), 0)
    });
    row("server: begin..end, OST write 1 MiB, no job", || {
        begin(black_box(&write), None, MIB).end(black_box(&written), 0)
    });
    row("server: begin..end, OST write 1 MiB, job id (job series)", || {
        begin(black_box(&write), Some(job.clone()), MIB).end(black_box(&written), 0)
    });

    // The job id on the wire: the mount appends it to each request, the server
    // decodes it and makes it an Arc<str> (rpc::server).
    row("wire: encode MDS create, no job", || {
        black_box(encode_request(black_box(&create), None).unwrap());
    });
    row("wire: encode MDS create, job id", || {
        black_box(encode_request(black_box(&create), Some(black_box(&*job))).unwrap());
    });
    let bare = encode_request(&create, None).unwrap();
    let with_id = encode_request(&create, Some(&job)).unwrap();
    row("wire: decode MDS create, no job", || {
        let (req, job) = decode_request(black_box(&bare)).unwrap();
        black_box((req, job.map(Arc::<str>::from)));
    });
    row("wire: decode MDS create, job id, made an Arc<str>", || {
        let (req, job) = decode_request(black_box(&with_id)).unwrap();
        black_box((req, job.map(Arc::<str>::from)));
    });

    // The mount: each FUSE request runs in with_job(job, counted(name, op)); each RPC
    // made for it reads the job id (rpc::client).
    row("mount: with_job scope around a request (made, polled once)", || {
        black_box(poll_once(with_job(Some(job.clone()), async { black_box(1) })));
    });
    poll_once(with_job(Some(job.clone()), async {
        row("mount: current_job() in an RPC (read, dropped)", || {
            black_box(current_job());
        });
    }));

    // fuse::stats::counted, made here as it is there: the clock at arrival, then the
    // operation's series found in an Interned map, a counter and a latency observed.
    struct OpSeries {
        requests: Series<Counter>,
        latency: Series<Histogram>,
    }
    let registry = metrics::Registry::default();
    let requests = registry.register(Family::<metrics::Target, Counter>::new("braid_bench_requests_total", "bench"));
    let latency = registry.register(Family::<metrics::Target, Histogram>::with_buckets(
        "braid_bench_request_duration_seconds",
        "bench",
        metrics::LATENCY_SECONDS,
    ));
    static SERIES: Interned<&'static str, OpSeries> = Interned::new();
    let op_series = |name: &'static str| {
        SERIES.get(&name, |&name| {
            let key = metrics::Target(name.into());
            OpSeries { requests: requests.series(&key), latency: latency.series(&key) }
        })
    };
    for name in ["lookup", "getattr", "create", "flush", "release", "unlink", "write", "read", "open"] {
        op_series(name);
    }
    row("mount: fuse counted (clock, Interned lookup, inc, observe)", || {
        let started = Instant::now();
        let s = op_series(black_box("create"));
        s.requests.inc();
        s.latency.observe_duration(started.elapsed());
    });

    // Two threads at once: what sharing the series' cache lines between cores adds.
    row2("2 threads at once, CPU a call: server begin..end, MDS create, no job", || {
        begin(black_box(&create), None, 0).end(black_box(&Response::Ok), 0)
    });
    row2("2 threads at once, CPU a call: server begin..end, MDS create, job id", || {
        begin(black_box(&create), Some(job.clone()), 0).end(black_box(&Response::Ok), 0)
    });
    row2("2 threads at once, CPU a call: server begin..end, OST write 1 MiB, job id", || {
        begin(black_box(&write), Some(job.clone()), MIB).end(black_box(&written), 0)
    });
    row2("2 threads at once, CPU a call: fuse counted", || {
        let started = Instant::now();
        let s = op_series(black_box("create"));
        s.requests.inc();
        s.latency.observe_duration(started.elapsed());
    });

    // Caches cold: each call after 8 MiB of other reads.
    let evict: Vec<u8> = (0..EVICT_BYTES).map(|i| i as u8).collect();
    let empty = cold_ns(|| (), &evict)[REPS / 2];
    row_cold(
        "caches cold, one thread: server begin..end, MDS create, no job",
        || begin(black_box(&create), None, 0).end(black_box(&Response::Ok), 0),
        &evict,
        empty,
    );
    row_cold(
        "caches cold, one thread: server begin..end, MDS create, job id",
        || begin(black_box(&create), Some(job.clone()), 0).end(black_box(&Response::Ok), 0),
        &evict,
        empty,
    );
    row_cold(
        "caches cold, one thread: server begin..end, OST write 1 MiB, job id",
        || begin(black_box(&write), Some(job.clone()), MIB).end(black_box(&written), 0),
        &evict,
        empty,
    );
    row_cold(
        "caches cold, one thread: fuse counted",
        || {
            let started = Instant::now();
            let s = op_series(black_box("create"));
            s.requests.inc();
            s.latency.observe_duration(started.elapsed());
        },
        &evict,
        empty,
    );
    println!("| (timing an empty call, subtracted from the cold rows) | {empty:.1} | |");

    // A scrape: the text of every series, as a server's endpoint answers it once a
    // second in scripts/bench-metrics.sh. 33 (target, operation) series and their jobs'
    // as `braid local` with 4 OSTs held after mdtest and IOR (864 lines).
    for ost in 0..33 {
        let w = Request::OstWrite { ost, object, offset: 0, sync: false };
        begin(&w, Some(job.clone()), MIB).end(&written, 0);
    }
    let what = "scrape: render the registry";
    if wanted(what) {
        let lines = metrics::global().render().lines().count();
        const RENDERS: u32 = 2000;
        let mut reps: Vec<f64> = (0..=REPS)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..RENDERS {
                    black_box(metrics::global().render());
                }
                t.elapsed().as_nanos() as f64 / f64::from(RENDERS)
            })
            .skip(1)
            .collect();
        reps.sort_by(f64::total_cmp);
        println!(
            "| {what} ({lines} lines), one render | {:.1} | {:.1}–{:.1} |",
            reps[REPS / 2],
            reps[0],
            reps[REPS - 1]
        );
    }

    // The pieces, to see where the time goes.
    let h = latency.series(&metrics::Target("parts".into()));
    row("part: Instant::now()", || {
        black_box(Instant::now());
    });
    row("part: Histogram::observe(20 µs: first bucket)", || h.observe(black_box(0.00002)));
    row("part: Histogram::observe(3 ms: 8th bucket)", || h.observe(black_box(0.003)));
    row("part: Interned lookup (&'static str key)", || {
        black_box(op_series(black_box("create")));
    });
    println!(
        "\nEach figure includes the empty loop's {loop_ns:.1} ns. {CALLS} calls a repetition (each thread's, \
         for the two-thread rows, whose figure is CPU time and counts only while both ran at once if the \
         machine had the cores)."
    );
}
