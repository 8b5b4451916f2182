//! `braid bench sweep --preset nbd`: seed 004's measurements of a network block device,
//! taken through the NBD protocol itself (`nbd::client`) on each target export, braid's
//! (`braid nbd serve`) and any other server's alike (nbdkit's `file` plugin on a local
//! file is the seed's "local" reference):
//!
//! - **Table 1**: the latency of one request in flight, reads and writes of 512 B to
//!   64 KiB at random offsets.
//! - **Figure 1**: sequential write, write with FUA on every request (the seed's
//!   synchronous server, `braid nbd serve --sync`), and read bandwidth.
//! - **Figure 3**: write bandwidth by the amount written, one request in flight,
//!   beside the seed's model of it: blocks of `b` bytes go to the server's memory in
//!   `t_b` each until a fraction `r` of its memory `s` is dirty, after which each also
//!   waits `t_d` for the disk:
//!   `B(f) = b / t_b` while `f < r s`, else `f b / (r s t_b + (f - r s)(t_b + t_d))`.
//!   `t_b` is the mean latency of a `b`-byte write (Table 1), `t_d` what a FUA write
//!   of `b` bytes takes beyond it, `s` this machine's memory and `r` its
//!   `vm.dirty_ratio`. (The seed prints the second case without the factor `f`; the
//!   bandwidth is bytes over time, so it is restored here.) The model leaves out the
//!   network, as the seed's does, so a measurement at one request in flight, which
//!   pays it, is below the model by the round trip.
//! - **Figure 4**: sequential bandwidth by requests in flight, 1 to 32.

use std::time::Instant;

use nbd::client::Client;
use nbd::proto::{CMD_FLAG_FUA, CMD_READ, CMD_WRITE, TX_READ_ONLY};

use crate::error::{usage, BenchError, Result};
use crate::figures::{figure, Figure, Figures, SweepRun, SweepTarget};
use crate::machine::{self, Machine};
use crate::progress::Progress;
use crate::svg::XAxis;
use crate::units::{format_size, mib_per_s};

/// What `braid bench sweep --preset nbd` asks (the sweep's options that apply).
#[derive(Debug, Clone)]
pub struct NbdOptions {
    /// `LABEL=nbd://HOST:PORT/EXPORT`, one per target.
    pub targets: Vec<String>,
    pub quick: bool,
    /// Bytes of each export used (default 1 GiB, 64 MiB with `quick`).
    pub region: Option<u64>,
    /// Figure 3's amounts written.
    pub amounts: Vec<u64>,
    pub drop_caches: bool,
}

/// What the preset measured, for the sweep's report.
pub struct NbdSweep {
    pub targets: Vec<SweepTarget>,
    pub figures: Vec<Figure>,
    pub runs: Vec<SweepRun>,
}

/// Request sizes of Table 1.
const LATENCY_SIZES: [u64; 4] = [512, 1 << 10, 4 << 10, 64 << 10];
/// The block size `b` of figure 3 and the request size of figure 4.
const BLOCK: u64 = 64 << 10;
/// Request size of figure 1's sequential transfers, and its requests in flight.
const SEQUENTIAL: (u64, usize) = (256 << 10, 8);
/// Requests in flight of figure 4.
const DEPTHS: [usize; 6] = [1, 2, 4, 8, 16, 32];
/// Figure 1's categories.
const SEQUENTIAL_CASES: [&str; 3] = ["write", "write, FUA", "read"];

/// What one measurement did.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Measured {
    pub requests: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// Mean time from a request's submission to its reply, microseconds.
    pub mean_latency_us: f64,
}

impl Measured {
    fn mib_per_s(&self) -> f64 {
        mib_per_s(self.bytes, self.seconds)
    }
}

/// How a run picks offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Sequential,
    /// Uniform over the region, aligned to the request size (xorshift, fixed seed).
    Random,
}

/// One run: `count` requests of `kind` (with `flags`) and `len` bytes over
/// `[0, region)`, `depth` in flight.
#[derive(Debug, Clone, Copy)]
struct Load {
    kind: u16,
    flags: u16,
    len: u64,
    region: u64,
    count: u64,
    depth: usize,
    order: Order,
}

impl Load {
    /// All of `[0, region)` once, in order, `len` bytes a request.
    fn sequential(kind: u16, flags: u16, len: u64, region: u64, depth: usize) -> Load {
        Load { kind, flags, len, region, count: region / len, depth, order: Order::Sequential }
    }

    /// `count` requests of `len` bytes at random offsets in `[0, region)`, one in flight.
    fn random(kind: u16, flags: u16, len: u64, region: u64, count: u64) -> Load {
        Load { kind, flags, len, region, count, depth: 1, order: Order::Random }
    }
}

/// Runs `load` on the export; any error reply fails the run.
fn measure(c: &mut Client, load: Load) -> Result<Measured> {
    let Load { kind, flags, len, region, count, depth, order } = load;
    let slots = (region / len).max(1);
    let payload: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    let payload = if kind == CMD_WRITE { &payload[..] } else { &[][..] };
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = 0u64;
    let mut offset_of = |n: u64| match order {
        Order::Sequential => (n % slots) * len,
        Order::Random => {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % slots) * len
        }
    };
    let mut sent_at = std::collections::HashMap::with_capacity(depth);
    let mut latency_sum = 0f64;
    let failed = |e: std::io::Error| BenchError::Other(format!("NBD request: {e}"));
    let start = Instant::now();
    let mut done = 0u64;
    while done < count {
        while next < count && sent_at.len() < depth {
            let cookie = c.submit(kind, flags, offset_of(next), len as u32, payload).map_err(failed)?;
            sent_at.insert(cookie, Instant::now());
            next += 1;
        }
        let r = c.complete().map_err(failed)?;
        if r.error != 0 {
            return Err(BenchError::Other(format!("the server answered error {} to a request", r.error)));
        }
        let Some(t) = sent_at.remove(&r.cookie) else {
            return Err(BenchError::Other(format!("a reply to unknown request {}", r.cookie)));
        };
        latency_sum += t.elapsed().as_secs_f64();
        done += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(Measured {
        requests: count,
        bytes: count * len,
        seconds,
        mean_latency_us: latency_sum / count.max(1) as f64 * 1e6,
    })
}

/// The memory size `s` and dirty fraction `r` of figure 3's model, from this machine.
fn model_memory() -> (f64, f64) {
    let s = Machine::detect().memory_bytes as f64;
    let r = std::fs::read_to_string("/proc/sys/vm/dirty_ratio")
        .ok()
        .and_then(|t| t.trim().parse::<f64>().ok())
        .filter(|&p| p > 0.0)
        .unwrap_or(20.0)
        / 100.0;
    (s, r)
}

/// Seed 004's write bandwidth model in MiB/s for `f` bytes written (see the module).
pub fn write_model(f: f64, b: f64, t_b: f64, t_d: f64, s: f64, r: f64) -> f64 {
    let bytes_per_s = if f < r * s { b / t_b } else { f * b / (r * s * t_b + (f - r * s) * (t_b + t_d)) };
    bytes_per_s / (1 << 20) as f64
}

fn parse_targets(args: &NbdOptions) -> Result<Vec<(String, String)>> {
    let mut targets: Vec<(String, String)> = Vec::new();
    for spec in &args.targets {
        let Some((label, uri)) = spec.split_once('=').filter(|(l, u)| !l.is_empty() && !u.is_empty()) else {
            usage!("--target {spec}: expected LABEL=nbd://HOST:PORT/EXPORT");
        };
        nbd::client::parse_uri(uri).map_err(|e| BenchError::Usage(format!("--target {spec}: {e}")))?;
        if targets.iter().any(|(l, _)| l == label) {
            usage!("--target label '{label}' is used twice");
        }
        targets.push((label.to_string(), uri.to_string()));
    }
    Ok(targets)
}

/// Runs the nbd preset on every target.
pub fn sweep(args: &NbdOptions, progress: &mut Progress) -> Result<NbdSweep> {
    let targets = parse_targets(args)?;
    let region_default = args.region.unwrap_or(if args.quick { 64 << 20 } else { 1 << 30 });
    let latency_count: u64 = if args.quick { 300 } else { 3000 };
    let amounts = args.amounts.clone();
    if let Some(&small) = amounts.iter().find(|&&f| f < BLOCK) {
        usage!("--values {}: figure 3 writes at least one 64 KiB block", format_size(small));
    }
    let size_axis = XAxis::Log2Bytes;
    let mut figures = Figures {
        figures: vec![
            figure(
                "nbd-latency",
                "Latency of one request in flight (seed 004 Table 1)",
                "request size (bytes)",
                "microseconds",
                size_axis.clone(),
            ),
            figure(
                "nbd-sequential",
                "Sequential bandwidth, 256 KiB requests, 8 in flight (seed 004 figure 1)",
                "transfer",
                "MiB/s",
                XAxis::Categories(SEQUENTIAL_CASES.iter().map(|s| s.to_string()).collect()),
            ),
            figure(
                "nbd-write-model",
                "Write bandwidth by amount written, 64 KiB, one in flight, and the model (seed 004 figure 3)",
                "bytes written",
                "MiB/s",
                size_axis,
            ),
            figure(
                "nbd-depth",
                "Sequential bandwidth by requests in flight, 64 KiB (seed 004 figure 4)",
                "requests in flight",
                "MiB/s",
                XAxis::Log2,
            ),
        ],
    };
    let (s, r) = model_memory();
    let mut runs = Vec::new();
    let mut sweep_targets = Vec::new();
    let drop = || if args.drop_caches { machine::drop_caches() } else { Ok(()) };
    for (label, uri) in &targets {
        let mut c = Client::connect(uri).map_err(|e| BenchError::Usage(format!("target {label}: {e}")))?;
        if c.flags & TX_READ_ONLY != 0 {
            usage!("target {label}: the export is read-only; the nbd preset writes");
        }
        let region = region_default.min(c.size) / BLOCK * BLOCK;
        if region < SEQUENTIAL.0 * SEQUENTIAL.1 as u64 {
            usage!("target {label}: the export ({} bytes) is too small", c.size);
        }
        sweep_targets.push(SweepTarget {
            label: label.clone(),
            location: uri.clone(),
            file_system: format!("NBD export of {}", format_size(c.size)),
        });
        // Each measurement is a run of the report, and a point of a figure unless
        // `point` is None: (figure, series, x, y).
        let mut record =
            |figures: &mut Figures, point: Option<(&str, String, (f64, String), f64)>, what: String, m: Measured| {
                if let Some((id, series, x, y)) = point {
                    figures.add(id, series, x.0, x.1, y);
                }
                runs.push(SweepRun {
                    target: label.clone(),
                    command: what,
                    report: serde_json::to_value(m).expect("measurements serialize"),
                });
            };
        // Figure 1 first: its sequential write fills the region the reads then read.
        // FUA writes reach the disk one by one: a smaller region keeps them short.
        let (seq_len, seq_depth) = SEQUENTIAL;
        let fua_region = region.min(64 << 20);
        let cases = [(CMD_WRITE, 0, region), (CMD_WRITE, CMD_FLAG_FUA, fua_region), (CMD_READ, 0, region)];
        for (index, (name, (kind, flags, bytes))) in SEQUENTIAL_CASES.iter().zip(cases).enumerate() {
            if kind == CMD_READ {
                drop()?;
            }
            progress.status(&format!("sweep nbd: {label}: sequential {name}"));
            let m = measure(&mut c, Load::sequential(kind, flags, seq_len, bytes, seq_depth))?;
            let what = format!("sequential {name} of {} in 256 KiB requests, 8 in flight", format_size(bytes));
            let x = (index as f64, name.to_string());
            record(&mut figures, Some(("nbd-sequential", label.clone(), x, m.mib_per_s())), what, m);
        }
        // Table 1.
        let mut t_b = None;
        for &len in &LATENCY_SIZES {
            for (name, kind) in [("read", CMD_READ), ("write", CMD_WRITE)] {
                progress.status(&format!("sweep nbd: {label}: {name} latency, {}", format_size(len)));
                let m = measure(&mut c, Load::random(kind, 0, len, region, latency_count))?;
                if kind == CMD_WRITE && len == BLOCK {
                    t_b = Some(m.mean_latency_us / 1e6);
                }
                let what = format!("{latency_count} random {name}s of {}, one in flight", format_size(len));
                let x = (len as f64, format_size(len));
                record(&mut figures, Some(("nbd-latency", format!("{label} {name}"), x, m.mean_latency_us)), what, m);
            }
        }
        // Figure 3: t_d is what a FUA write of a block costs beyond a plain one.
        progress.status(&format!("sweep nbd: {label}: FUA write latency"));
        let fua = measure(&mut c, Load::random(CMD_WRITE, CMD_FLAG_FUA, BLOCK, region, latency_count))?;
        let t_b = t_b.expect("Table 1 measures BLOCK-sized writes");
        let t_d = (fua.mean_latency_us / 1e6 - t_b).max(0.0);
        let what = format!("{latency_count} random FUA writes of 64k, one in flight (t_d of the model)");
        record(&mut figures, None, what, fua);
        for &f in &amounts {
            if f > c.size {
                continue;
            }
            progress.status(&format!("sweep nbd: {label}: writing {}", format_size(f)));
            let m = measure(&mut c, Load::sequential(CMD_WRITE, 0, BLOCK, f, 1))?;
            let x = (f as f64, format_size(f));
            let what = format!("sequential write of {} in 64 KiB requests, one in flight", format_size(f));
            record(&mut figures, Some(("nbd-write-model", label.clone(), x.clone(), m.mib_per_s())), what, m);
            let model = write_model(f as f64, BLOCK as f64, t_b, t_d, s, r);
            figures.add("nbd-write-model", format!("{label} model"), x.0, x.1, model);
        }
        // Figure 4.
        let depth_region = region.min(if args.quick { 32 << 20 } else { 256 << 20 });
        for &depth in &DEPTHS {
            for (name, kind) in [("write", CMD_WRITE), ("read", CMD_READ)] {
                if kind == CMD_READ {
                    drop()?;
                }
                progress.status(&format!("sweep nbd: {label}: {name}, {depth} in flight"));
                let m = measure(&mut c, Load::sequential(kind, 0, BLOCK, depth_region, depth))?;
                let what =
                    format!("sequential {name} of {} in 64 KiB requests, {depth} in flight", format_size(depth_region));
                let x = (depth as f64, depth.to_string());
                record(&mut figures, Some(("nbd-depth", format!("{label} {name}"), x, m.mib_per_s())), what, m);
            }
        }
        c.disconnect().map_err(|e| BenchError::Other(format!("target {label}: disconnect: {e}")))?;
    }
    progress.clear();
    Ok(NbdSweep { targets: sweep_targets, figures: figures.figures, runs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_labelled_nbd_uris() {
        let parse = |targets: &[&str]| {
            let options = NbdOptions {
                targets: targets.iter().map(|t| t.to_string()).collect(),
                quick: true,
                region: None,
                amounts: vec![],
                drop_caches: false,
            };
            parse_targets(&options)
        };
        let ok = parse(&["braid=nbd://127.0.0.1:10809/disk", "local=nbd://h:1"]).unwrap();
        let tiny = NbdOptions {
            targets: vec!["a=nbd://127.0.0.1:9/x".into()],
            quick: true,
            region: None,
            amounts: vec![16 << 20, 4096],
            drop_caches: false,
        };
        let e = sweep(&tiny, &mut Progress::silent()).err().expect("a 4 KiB amount is refused").to_string();
        assert!(e.contains("64 KiB block"), "{e}");
        assert_eq!(ok[1], ("local".to_string(), "nbd://h:1".to_string()));
        for (bad, why) in [
            (&["a=/some/dir"][..], "expected nbd://"),
            (&["nbd://h/x"][..], "expected LABEL="),
            (&["a=nbd://h/x", "a=nbd://h/y"][..], "twice"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_write_model_is_flat_until_the_dirty_limit_then_falls_toward_the_disk() {
        let (b, t_b, t_d, s, r) = (4096.0, 19e-6, 135e-6, 512e6, 0.4);
        let flat = write_model(100e6, b, t_b, t_d, s, r);
        assert!((flat - b / t_b / 1048576.0).abs() < 1e-9);
        // Just past r s the model is continuous; far past it, it tends to b / (t_b + t_d).
        let at_knee = write_model(r * s + 1.0, b, t_b, t_d, s, r);
        assert!((at_knee - flat).abs() / flat < 1e-3);
        let far = write_model(1e13, b, t_b, t_d, s, r);
        let disk = b / (t_b + t_d) / 1048576.0;
        assert!((far - disk).abs() / disk < 1e-2, "{far} vs {disk}");
        assert!(write_model(2.0 * s, b, t_b, t_d, s, r) < flat);
    }
}
