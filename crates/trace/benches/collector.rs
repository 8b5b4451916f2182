//! How fast the tracer's parts go (issue 16: the collector must keep up with at least
//! a million records a second): a writer filling the ring, and a collector draining
//! it into batches and a store on disk while a writer thread fills it, as a mount and
//! its collector process do. `cargo bench -p trace`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use proto::Fid;
use trace::ring::{RingReader, RingWriter};
use trace::store::{Batch, Store, StoreLimits};
use trace::{Op, Record, Target, NO_JOB, RECORD_BYTES};

fn rec(i: u64) -> Record {
    Record {
        start_ns: 1_700_000_000_000_000_000 + i,
        dur_ns: 1000,
        pid: 42,
        uid: 1000,
        gid: 1000,
        fid: Fid { seq: 0x200000401, oid: (i % 64) as u32, ver: 0 },
        offset: i * 4096,
        len: 4096,
        job: NO_JOB,
        op: Op::Read,
        errno: 0,
        target: Target::Ost((i % 4) as u16),
    }
}

fn main() {
    let dir = std::env::temp_dir().join(format!("braid-trace-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ring = dir.join("bench.ring");
    const N: u64 = 20_000_000;

    // A writer alone (the collector keeps the ring empty without storing).
    let w = Arc::new(RingWriter::create(&ring, 1 << 16, "bench", true).unwrap());
    let mut r = RingReader::open(&ring).unwrap();
    let t = Instant::now();
    let mut out = Vec::with_capacity(1 << 22);
    for i in 0..N {
        if !w.push(&rec(i)) {
            out.clear();
            r.drain(1 << 16, &mut out);
            w.push(&rec(i));
        }
    }
    let s = t.elapsed().as_secs_f64();
    println!("push (one thread, draining in between): {:.1} ns a record", s * 1e9 / N as f64);
    drop(r);

    // A writer thread and the collector's loop: drain, batch, store.
    let w = Arc::new(RingWriter::create(&ring, 1 << 16, "bench", true).unwrap());
    let mut r = RingReader::open(&ring).unwrap();
    let mut store =
        Store::open(&dir.join("store"), StoreLimits { segment_bytes: 64 << 20, total_bytes: 1 << 30 }).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (w, done) = (w.clone(), done.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !done.load(Ordering::Relaxed) {
                w.push(&rec(i));
                i += 1;
            }
        })
    };
    let t = Instant::now();
    let mut stored = 0u64;
    let mut buf = Vec::with_capacity(16 << 10 << 6);
    while stored < N / 2 {
        let d = r.drain(16 << 10, &mut buf);
        if buf.len() >= (16 << 10) * RECORD_BYTES || (d.records == 0 && !buf.is_empty()) {
            let batch = Batch { client: "bench".into(), jobs: vec![], lost: 0, records: std::mem::take(&mut buf) };
            stored += batch.len() as u64;
            store.append(&batch).unwrap();
        }
    }
    let s = t.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let st = w.stats();
    println!(
        "collector (drain, batch, store on disk) beside a writer thread: {:.2} million records a second ({} stored, {} dropped by the writer meanwhile)",
        stored as f64 / s / 1e6,
        stored,
        st.dropped
    );
    let _ = std::fs::remove_dir_all(&dir);
}
