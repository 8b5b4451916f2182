//! What finding a calling process's job id costs a mount when it is remembered (the
//! cache hit every FUSE request of a process takes but the first in 10 s): part of
//! what metrics cost (issue 42; the rest is in `cargo bench -p rpc --bench stats`).
//! `cargo bench -p client --bench jobid`.

use std::hint::black_box;
use std::time::Instant;

use client::jobid::{JobIds, JobVar, DEFAULT_JOBID_VAR};

/// Calls a repetition.
const CALLS: u32 = 2_000_000;
/// Repetitions; the median is reported.
const REPS: usize = 7;

fn main() {
    let me = std::process::id();
    // As a mount's default: SLURM_JOB_ID, or the program's name and uid without it.
    let jobs = JobIds::new(JobVar::Env(DEFAULT_JOBID_VAR.into()));
    let job = jobs.of(me, 1000);
    assert!(job.is_some(), "this process has a program name");
    let call = || {
        black_box(jobs.of(black_box(me), black_box(1000)));
    };
    for _ in 0..CALLS {
        call();
    }
    let mut reps: Vec<f64> = (0..REPS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..CALLS {
                call();
            }
            t.elapsed().as_nanos() as f64 / f64::from(CALLS)
        })
        .collect();
    reps.sort_by(f64::total_cmp);
    println!("| per call, one thread | ns (median of {REPS}) | min–max |");
    println!("|---|---|---|");
    println!(
        "| mount: JobIds::of, cache hit (job {:?}) | {:.1} | {:.1}–{:.1} |",
        job.as_deref().unwrap_or(""),
        reps[REPS / 2],
        reps[0],
        reps[REPS - 1]
    );

    // Caches cold, as in the rpc bench: each call after reading 8 MiB of other data
    // (more than a core's L2), timed alone, less what timing an empty call takes.
    let evict: Vec<u8> = (0..8usize << 20).map(|i| i as u8).collect();
    let cold = |f: &dyn Fn()| {
        let mut reps: Vec<f64> = (0..=REPS)
            .map(|_| {
                let mut total = 0u128;
                for _ in 0..1000 {
                    black_box(evict.iter().step_by(64).fold(0u8, |a, &b| a ^ b));
                    let t = Instant::now();
                    f();
                    total += t.elapsed().as_nanos();
                }
                total as f64 / 1000.0
            })
            .skip(1)
            .collect();
        reps.sort_by(f64::total_cmp);
        reps
    };
    let empty = cold(&|| ())[REPS / 2];
    let reps = cold(&call);
    println!(
        "| caches cold, one thread: JobIds::of, cache hit | {:.1} | {:.1}–{:.1} |",
        reps[REPS / 2] - empty,
        reps[0] - empty,
        reps[REPS - 1] - empty
    );
    println!("| (timing an empty call, subtracted from the cold row) | {empty:.1} | |");
}
