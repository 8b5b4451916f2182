//! `braid bench ior`: IOR's bandwidth test with IOR's option names. N task processes write
//! and read one shared file or one file per process, in segments of one block per task,
//! in transfers, sequentially, strided (seed 000's 17-block interval) or at random offsets.
//! Bandwidth per phase is total bytes over the time from the first task's open to the last
//! task's close, as IOR reports it; the summary has IOR's columns and a JSON form.
//!
//! Every transfer carries its file offset and writer in its first 16 bytes over a seeded
//! pattern, so `-R` finds a changed byte and names the task and the offset.

use clap::Parser;
use serde::{Deserialize, Serialize};

use crate::backend::{
    self, read_full_at, write_all_at, AlignedBuf, Api, FileBackend, NativeConnect, OpenFlags, Target,
};
use crate::clock::{monotonic_ns, seconds_between};
use crate::error::{usage, BenchError, Result};
use crate::machine::{self, RunHeader};
use crate::offsets::{AccessPattern, IorLayout, SplitMix64, TransferOrder};
use crate::progress::Progress;
use crate::stats::{rate, Summary};
use crate::task::{Phase, PhaseOrder, PhaseResult, TaskGroup, TaskJob, TaskRunner};
use crate::units::{format_size, mib_per_s, parse_size};

/// Most tasks one driver starts (each is an OS process with its own buffers).
pub const MAX_TASKS: usize = 1024;
/// Most transfers per task with `-z`: the shuffled order costs 8 bytes per transfer.
pub const MAX_RANDOM_TRANSFERS: u64 = 1 << 27;
/// Alignment `--direct` needs of transfer and block sizes.
pub const DIRECT_ALIGN_BYTES: u64 = 4096;
/// Bytes at the start of each transfer that hold its offset and writer.
const STAMP_BYTES: usize = 16;

/// Options of `braid bench ior`; short names are IOR's.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "ior", about = "IOR-style bandwidth benchmark")]
pub struct IorArgs {
    /// I/O interface: posix (any mounted directory) or native (braid://HOST:PORT/path).
    #[arg(short = 'a', long = "api", value_enum, default_value = "posix")]
    pub api: Api,
    /// Contiguous bytes each task writes per segment (IOR -b).
    #[arg(short = 'b', long = "block-size", value_parser = parse_size, default_value = "1m")]
    pub block_bytes: u64,
    /// Bytes per I/O call (IOR -t).
    #[arg(short = 't', long = "transfer-size", value_parser = parse_size, default_value = "256k")]
    pub transfer_bytes: u64,
    /// Number of segments (IOR -s).
    #[arg(short = 's', long = "segment-count", default_value_t = 1)]
    pub segments: u64,
    /// One file per task instead of one shared file (IOR -F).
    #[arg(short = 'F', long = "file-per-proc")]
    pub file_per_process: bool,
    /// Run the write phase (IOR -w). Without -w and -r both run.
    #[arg(short = 'w', long = "write-file")]
    pub write: bool,
    /// Run the read phase (IOR -r).
    #[arg(short = 'r', long = "read-file")]
    pub read: bool,
    /// Each task reads what the next task wrote, to defeat the client cache (IOR -C).
    #[arg(short = 'C', long = "reorder-tasks")]
    pub reorder_tasks: bool,
    /// Random offsets: every transfer once, shuffled (IOR -z).
    #[arg(short = 'z', long = "random-offset")]
    pub random_offset: bool,
    /// Strided offsets: jump K transfers between accesses (seed 000 uses 17).
    #[arg(long = "stride", value_name = "K")]
    pub stride_transfers: Option<u64>,
    /// fsync after writing, inside the timed phase (IOR -e).
    #[arg(short = 'e', long = "fsync")]
    pub fsync: bool,
    /// O_DIRECT: bypass the client cache (transfer and block multiples of 4 KiB).
    #[arg(long = "direct")]
    pub direct: bool,
    /// Repetitions (IOR -i).
    #[arg(short = 'i', long = "repetitions", default_value_t = 1)]
    pub repetitions: u32,
    /// Number of tasks, each an OS process (IOR -N).
    #[arg(short = 'N', long = "num-tasks", default_value_t = 1)]
    pub tasks: usize,
    /// Test file; with -F each task appends .NNNNNNNN (IOR -o).
    #[arg(short = 'o', long = "test-file", default_value = "testFile")]
    pub test_file: String,
    /// Keep the test files at the end (IOR -k).
    #[arg(short = 'k', long = "keep-file")]
    pub keep_file: bool,
    /// Stonewall: stop each phase after this many seconds, 0 = off (IOR -D).
    #[arg(short = 'D', long = "deadline-for-stonewalling", default_value_t = 0)]
    pub stonewall_seconds: u64,
    /// Verify every byte read against what was written (IOR -R).
    #[arg(short = 'R', long = "check-read")]
    pub check_read: bool,
    /// Seed of the data pattern and of random offsets.
    #[arg(long = "seed", default_value_t = 1)]
    pub seed: u64,
    /// sync and drop the page cache before every phase (root).
    #[arg(long = "drop-caches")]
    pub drop_caches: bool,
    /// Print the results as JSON instead of text.
    #[arg(long = "json")]
    pub json: bool,
    /// No progress display.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
}

impl IorArgs {
    /// Checks the options and returns the run they describe.
    pub fn plan(&self) -> Result<IorPlan> {
        if self.tasks == 0 || self.tasks > MAX_TASKS {
            usage!("-N {}: tasks must be 1..={MAX_TASKS}", self.tasks);
        }
        if self.transfer_bytes == 0 || self.block_bytes == 0 || self.segments == 0 {
            usage!("-t, -b and -s must be greater than 0");
        }
        if !self.block_bytes.is_multiple_of(self.transfer_bytes) {
            usage!(
                "block size (-b {}) must be a multiple of the transfer size (-t {})",
                format_size(self.block_bytes),
                format_size(self.transfer_bytes)
            );
        }
        if self.direct
            && (!self.transfer_bytes.is_multiple_of(DIRECT_ALIGN_BYTES)
                || !self.block_bytes.is_multiple_of(DIRECT_ALIGN_BYTES))
        {
            usage!(
                "--direct needs transfer and block sizes that are multiples of 4k (got -t {} -b {})",
                format_size(self.transfer_bytes),
                format_size(self.block_bytes)
            );
        }
        if self.random_offset && self.stride_transfers.is_some() {
            usage!("-z (random) and --stride are different access patterns: pick one");
        }
        if self.stride_transfers == Some(0) {
            usage!("--stride must be at least 1 transfer");
        }
        if self.reorder_tasks && self.tasks < 2 {
            usage!("-C needs at least 2 tasks (with one task it would read its own data)");
        }
        if self.repetitions == 0 {
            usage!("-i must be at least 1");
        }
        if self.test_file.is_empty() {
            usage!("-o needs a file name");
        }
        let layout = IorLayout {
            block_bytes: self.block_bytes,
            transfer_bytes: self.transfer_bytes,
            segments: self.segments,
            tasks: self.tasks as u64,
            file_per_process: self.file_per_process,
        };
        if self.block_bytes.checked_mul(self.segments).and_then(|b| b.checked_mul(self.tasks as u64)).is_none() {
            usage!("-b x -s x -N overflows 64 bits");
        }
        let transfers = layout.transfers_per_task();
        if self.random_offset && transfers > MAX_RANDOM_TRANSFERS {
            usage!("-z with {transfers} transfers per task: at most {MAX_RANDOM_TRANSFERS} (raise -t)");
        }
        let pattern = if self.random_offset {
            AccessPattern::Random { seed: self.seed }
        } else if let Some(stride_transfers) = self.stride_transfers {
            AccessPattern::Strided { stride_transfers }
        } else {
            AccessPattern::Sequential
        };
        let both = !self.write && !self.read;
        Ok(IorPlan {
            target: Target::parse(self.api, &self.test_file)?,
            layout,
            pattern,
            write: self.write || both,
            read: self.read || both,
        })
    }
}

/// Checked options.
#[derive(Debug, Clone)]
pub struct IorPlan {
    pub target: Target,
    pub layout: IorLayout,
    pub pattern: AccessPattern,
    pub write: bool,
    pub read: bool,
}

/// What one task process is told before the first phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IorTaskJob {
    pub rank: usize,
    pub target: Target,
    pub layout: IorLayout,
    pub pattern: AccessPattern,
    pub reorder_tasks: bool,
    pub fsync: bool,
    pub direct: bool,
    pub verify: bool,
    pub seed: u64,
}

impl IorTaskJob {
    /// The file holding the data of `rank`.
    fn file_of(&self, rank: usize) -> String {
        file_path(&self.target.path, rank, self.layout.file_per_process)
    }

    /// The order `rank` writes its transfers in during `iteration`; readers use the writer's.
    fn order_of(&self, rank: usize, iteration: u32) -> TransferOrder {
        let pattern = match self.pattern {
            AccessPattern::Random { seed } => AccessPattern::Random {
                seed: seed ^ (rank as u64).wrapping_mul(0x9e37_79b9) ^ (u64::from(iteration) << 40),
            },
            other => other,
        };
        TransferOrder::new(pattern, self.layout.transfers_per_task())
    }

    /// The task whose data `rank` reads: the next one with -C, as IOR reorders.
    fn data_rank_for_read(&self, rank: usize) -> usize {
        if self.reorder_tasks {
            (rank + 1) % self.layout.tasks as usize
        } else {
            rank
        }
    }
}

fn file_path(base: &str, rank: usize, file_per_process: bool) -> String {
    if file_per_process {
        format!("{base}.{rank:08}")
    } else {
        base.to_string()
    }
}

/// The task side: a backend, a transfer buffer, and the pattern the data is built from.
pub struct IorTask {
    job: IorTaskJob,
    backend: Box<dyn FileBackend>,
    buffer: AlignedBuf,
    pattern: Vec<u8>,
}

impl IorTask {
    pub fn new(job: IorTaskJob, native: Option<NativeConnect>) -> Result<IorTask> {
        let backend = job.target.connect(native)?;
        let size = job.layout.transfer_bytes as usize;
        let mut pattern = vec![0u8; size];
        let mut rng = SplitMix64::new(job.seed ^ 0x0b5e_55ed_da7a);
        for chunk in pattern.chunks_mut(8) {
            let word = rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        let mut buffer = AlignedBuf::new(size);
        buffer.copy_from_slice(&pattern);
        Ok(IorTask { job, backend, buffer, pattern })
    }

    fn stamp(&self, offset: u64, writer: usize) -> [u8; STAMP_BYTES] {
        let mut stamp = [0u8; STAMP_BYTES];
        stamp[..8].copy_from_slice(&offset.to_le_bytes());
        stamp[8..].copy_from_slice(&(writer as u64 ^ (self.job.seed << 24)).to_le_bytes());
        stamp
    }

    fn write_phase(&mut self, order: &PhaseOrder) -> Result<PhaseResult> {
        let rank = self.job.rank;
        let path = self.job.file_of(rank);
        let flags = OpenFlags {
            write: true,
            create: true,
            // A shared file is opened by every task; truncating it would race.
            truncate: self.job.layout.file_per_process,
            direct: self.job.direct,
            ..OpenFlags::default()
        };
        let transfers = self.job.order_of(rank, order.iteration);
        let stamp_len = STAMP_BYTES.min(self.buffer.len());
        let start_ns = monotonic_ns();
        let file = self.backend.open(&path, flags).map_err(|e| BenchError::io("open", &path, e))?;
        let mut done = 0u64;
        for index in transfers.iter() {
            if order.deadline_ns.is_some_and(|deadline| monotonic_ns() >= deadline) {
                break;
            }
            let offset = self.job.layout.offset(rank as u64, index);
            let stamp = self.stamp(offset, rank);
            self.buffer[..stamp_len].copy_from_slice(&stamp[..stamp_len]);
            write_all_at(self.backend.as_mut(), file, &self.buffer, offset)
                .map_err(|e| BenchError::io("write", format!("{path} at offset {offset}"), e))?;
            done += 1;
        }
        if self.job.fsync {
            self.backend.fsync(file).map_err(|e| BenchError::io("fsync", &path, e))?;
        }
        self.backend.close(file).map_err(|e| BenchError::io("close", &path, e))?;
        let end_ns = monotonic_ns();
        Ok(PhaseResult {
            start_ns,
            end_ns,
            bytes: done * self.job.layout.transfer_bytes,
            ops: done,
            ..PhaseResult::default()
        })
    }

    fn read_phase(&mut self, order: &PhaseOrder) -> Result<PhaseResult> {
        let rank = self.job.rank;
        let data_rank = self.job.data_rank_for_read(rank);
        let path = self.job.file_of(data_rank);
        let transfers = self.job.order_of(data_rank, order.iteration);
        let limit = order.transfer_limit.unwrap_or(transfers.count());
        let transfer_len = self.buffer.len();
        let stamp_len = STAMP_BYTES.min(transfer_len);
        let mut result = PhaseResult::default();
        let start_ns = monotonic_ns();
        let file = self
            .backend
            .open(&path, OpenFlags::read_only().with_direct(self.job.direct))
            .map_err(|e| BenchError::io("open", &path, e))?;
        let mut done = 0u64;
        for index in transfers.iter().take(limit as usize) {
            if order.deadline_ns.is_some_and(|deadline| monotonic_ns() >= deadline) {
                break;
            }
            let offset = self.job.layout.offset(data_rank as u64, index);
            let got = read_full_at(self.backend.as_mut(), file, &mut self.buffer, offset)
                .map_err(|e| BenchError::io("read", format!("{path} at offset {offset}"), e))?;
            if got < transfer_len {
                return Err(BenchError::Task {
                    task: rank,
                    message: format!(
                        "short read: {got} of {transfer_len} bytes at offset {offset} of {path} \
                         (was the file written with the same -b -t -s -N?)"
                    ),
                });
            }
            if self.job.verify {
                let stamp = self.stamp(offset, data_rank);
                let mismatches = self.count_mismatches(&stamp[..stamp_len]);
                if let Some((first, count)) = mismatches {
                    if result.first_verify_error.is_none() {
                        let expected = if first < stamp_len { stamp[first] } else { self.pattern[first] };
                        result.first_verify_error = Some(format!(
                            "task {rank} read a corrupted byte at offset {} of {path} \
                             (written by task {data_rank}): expected 0x{expected:02x}, found 0x{:02x}",
                            offset + first as u64,
                            self.buffer[first]
                        ));
                    }
                    result.verify_errors += count;
                }
            }
            done += 1;
        }
        self.backend.close(file).map_err(|e| BenchError::io("close", &path, e))?;
        result.start_ns = start_ns;
        result.end_ns = monotonic_ns();
        result.bytes = done * self.job.layout.transfer_bytes;
        result.ops = done;
        Ok(result)
    }

    /// Position of the first differing byte and the number of differing bytes, if any.
    fn count_mismatches(&self, stamp: &[u8]) -> Option<(usize, u64)> {
        let read = &self.buffer[..];
        let stamp_len = stamp.len();
        if read[..stamp_len] == *stamp && read[stamp_len..] == self.pattern[stamp_len..] {
            return None;
        }
        let mut first = None;
        let mut count = 0;
        for (i, &byte) in read.iter().enumerate() {
            let expected = if i < stamp_len { stamp[i] } else { self.pattern[i] };
            if byte != expected {
                first.get_or_insert(i);
                count += 1;
            }
        }
        first.map(|f| (f, count))
    }
}

impl TaskRunner for IorTask {
    fn run_phase(&mut self, order: &PhaseOrder) -> Result<PhaseResult> {
        match order.phase {
            Phase::Write => self.write_phase(order),
            Phase::Read => self.read_phase(order),
            other => Err(BenchError::Other(format!("ior task asked to run {other:?}"))),
        }
    }
}

/// One phase of one iteration, aggregated over all tasks.
#[derive(Debug, Clone, Serialize)]
pub struct IorSample {
    pub iteration: u32,
    pub operation: &'static str,
    /// Total bytes over (last end - first start).
    pub bandwidth_mib_s: f64,
    pub ops_per_s: f64,
    pub seconds: f64,
    pub bytes: u64,
    pub transfers: u64,
    /// The fastest and slowest single task, to show imbalance.
    pub task_seconds_min: f64,
    pub task_seconds_max: f64,
    /// Whether the phase was cut short by the stonewall (-D).
    pub stonewalled: bool,
}

/// IOR's "Summary of all tests" line for one operation.
#[derive(Debug, Clone, Serialize)]
pub struct IorSummaryRow {
    pub operation: &'static str,
    pub bandwidth_mib_s: Summary,
    pub ops_per_s: Summary,
    pub mean_seconds: f64,
}

/// Everything a run produced; printed as text or JSON, and collected by sweeps.
#[derive(Debug, Clone, Serialize)]
pub struct IorReport {
    #[serde(flatten)]
    pub header: RunHeader,
    pub access: &'static str,
    pub pattern: String,
    pub tasks: usize,
    pub block_bytes: u64,
    pub transfer_bytes: u64,
    pub segments: u64,
    pub aggregate_bytes: u64,
    pub repetitions: u32,
    pub options: IorArgs,
    pub results: Vec<IorSample>,
    pub summary: Vec<IorSummaryRow>,
    pub verify_errors: u64,
    pub verify_messages: Vec<String>,
}

/// Runs the benchmark described by `args`.
pub fn execute(args: &IorArgs, native: Option<NativeConnect>, progress: &mut Progress) -> Result<IorReport> {
    let plan = args.plan()?;
    if args.drop_caches {
        machine::check_drop_caches()?;
    }
    let mut driver = plan.target.connect(native)?;
    let directory = backend::parent(&plan.target.path).to_string();
    match driver.stat(&directory) {
        Ok(stat) if stat.is_dir => {}
        Ok(_) => usage!("{directory} is not a directory"),
        Err(e) => usage!("test file directory {directory}: {e}"),
    }
    let files: Vec<String> = if plan.layout.file_per_process {
        (0..args.tasks).map(|rank| file_path(&plan.target.path, rank, true)).collect()
    } else {
        vec![plan.target.path.clone()]
    };
    let began = machine::utc_now();
    progress.status(&format!("ior: starting {} tasks", args.tasks));
    let mut group = TaskGroup::spawn(args.tasks, |rank| {
        TaskJob::Ior(IorTaskJob {
            rank,
            target: plan.target.clone(),
            layout: plan.layout,
            pattern: plan.pattern,
            reorder_tasks: args.reorder_tasks,
            fsync: args.fsync,
            direct: args.direct,
            verify: args.check_read,
            seed: args.seed,
        })
    })?;
    let mut results = Vec::new();
    let mut verify_errors = 0;
    let mut verify_messages = Vec::new();
    for iteration in 0..args.repetitions {
        let mut written: Option<Vec<u64>> = None;
        if plan.write {
            for file in &files {
                remove_if_present(driver.as_mut(), file)?;
            }
            if args.drop_caches {
                machine::drop_caches()?;
            }
            progress.status(&format!("ior: iteration {}/{} write", iteration + 1, args.repetitions));
            let deadline_ns = stonewall_deadline(args.stonewall_seconds);
            let phase = group.run_phase(|_| PhaseOrder {
                phase: Phase::Write,
                iteration,
                deadline_ns,
                transfer_limit: None,
            })?;
            written = Some(phase.iter().map(|r| r.ops).collect());
            results.push(sample(iteration, "write", &phase, &plan.layout));
        }
        if plan.read {
            if args.drop_caches {
                machine::drop_caches()?;
            }
            progress.status(&format!("ior: iteration {}/{} read", iteration + 1, args.repetitions));
            let deadline_ns = stonewall_deadline(args.stonewall_seconds);
            let tasks = args.tasks;
            let reorder = args.reorder_tasks;
            let phase = group.run_phase(|rank| PhaseOrder {
                phase: Phase::Read,
                iteration,
                deadline_ns,
                transfer_limit: written.as_ref().map(|counts| counts[if reorder { (rank + 1) % tasks } else { rank }]),
            })?;
            for result in &phase {
                verify_errors += result.verify_errors;
                if let Some(message) = &result.first_verify_error {
                    verify_messages.push(message.clone());
                }
            }
            results.push(sample(iteration, "read", &phase, &plan.layout));
        }
        if plan.write && !args.keep_file {
            for file in &files {
                remove_if_present(driver.as_mut(), file)?;
            }
        }
    }
    group.finish()?;
    progress.clear();
    let summary = ["write", "read"].into_iter().filter_map(|operation| summarize(operation, &results)).collect();
    Ok(IorReport {
        header: RunHeader::new("braid bench ior", began, &plan.target, args.drop_caches),
        access: if plan.layout.file_per_process { "file-per-process" } else { "single-shared-file" },
        pattern: plan.pattern.label(),
        tasks: args.tasks,
        block_bytes: args.block_bytes,
        transfer_bytes: args.transfer_bytes,
        segments: args.segments,
        aggregate_bytes: plan.layout.block_bytes * plan.layout.segments * plan.layout.tasks,
        repetitions: args.repetitions,
        options: args.clone(),
        results,
        summary,
        verify_errors,
        verify_messages,
    })
}

fn stonewall_deadline(seconds: u64) -> Option<u64> {
    (seconds > 0).then(|| monotonic_ns() + seconds * 1_000_000_000)
}

fn remove_if_present(backend: &mut dyn FileBackend, path: &str) -> Result<()> {
    match backend.unlink(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(BenchError::io("unlink", path, e)),
    }
}

fn sample(iteration: u32, operation: &'static str, phase: &[PhaseResult], layout: &IorLayout) -> IorSample {
    let first_start = phase.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let last_end = phase.iter().map(|r| r.end_ns).max().unwrap_or(0);
    let seconds = seconds_between(first_start, last_end);
    let bytes: u64 = phase.iter().map(|r| r.bytes).sum();
    let transfers: u64 = phase.iter().map(|r| r.ops).sum();
    let task_seconds: Vec<f64> = phase.iter().map(|r| seconds_between(r.start_ns, r.end_ns)).collect();
    IorSample {
        iteration,
        operation,
        bandwidth_mib_s: mib_per_s(bytes, seconds),
        ops_per_s: rate(transfers as f64, seconds),
        seconds,
        bytes,
        transfers,
        task_seconds_min: task_seconds.iter().copied().fold(f64::MAX, f64::min),
        task_seconds_max: task_seconds.iter().copied().fold(0.0, f64::max),
        stonewalled: transfers < layout.transfers_per_task() * layout.tasks,
    }
}

fn summarize(operation: &'static str, results: &[IorSample]) -> Option<IorSummaryRow> {
    let samples: Vec<&IorSample> = results.iter().filter(|s| s.operation == operation).collect();
    if samples.is_empty() {
        return None;
    }
    let bandwidths: Vec<f64> = samples.iter().map(|s| s.bandwidth_mib_s).collect();
    let ops: Vec<f64> = samples.iter().map(|s| s.ops_per_s).collect();
    let seconds: Vec<f64> = samples.iter().map(|s| s.seconds).collect();
    Some(IorSummaryRow {
        operation,
        bandwidth_mib_s: Summary::of(&bandwidths),
        ops_per_s: Summary::of(&ops),
        mean_seconds: Summary::of(&seconds).mean,
    })
}

/// IOR's text output: the test parameters, one line per phase, then the summary table.
pub fn render_text(report: &IorReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let kib = |b: u64| b as f64 / 1024.0;
    let _ = writeln!(out, "braid bench ior: IOR-style bandwidth benchmark");
    report.header.write_opening(&mut out, 20);
    let _ = writeln!(out, "Caches dropped      : {}", yes_no(report.header.caches_dropped));
    let _ = writeln!(out);
    let _ = writeln!(out, "Options:");
    let _ = writeln!(out, "api                 : {}", report.header.api);
    let _ = writeln!(out, "test filename       : {}", report.header.target);
    let _ = writeln!(out, "file system         : {}", report.header.file_system);
    let _ = writeln!(out, "access              : {}", report.access);
    let _ = writeln!(out, "ordering in a file  : {}", report.pattern);
    let _ = writeln!(out, "tasks               : {}", report.tasks);
    let _ = writeln!(out, "repetitions         : {}", report.repetitions);
    let _ = writeln!(out, "xfersize            : {}", format_size(report.transfer_bytes));
    let _ = writeln!(out, "blocksize           : {}", format_size(report.block_bytes));
    let _ = writeln!(out, "segments            : {}", report.segments);
    let _ = writeln!(out, "aggregate filesize  : {}", format_size(report.aggregate_bytes));
    let _ = writeln!(out, "O_DIRECT            : {}", yes_no(report.options.direct));
    let _ = writeln!(out, "fsync after write   : {}", yes_no(report.options.fsync));
    let _ = writeln!(out);
    let _ = writeln!(out, "Results:");
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<8} {:>11} {:>11} {:>11} {:>11} {:>10} {:>10} {:>5}",
        "access", "bw(MiB/s)", "IOPS", "block(KiB)", "xfer(KiB)", "total(s)", "maxtask(s)", "iter"
    );
    let _ = writeln!(
        out,
        "{:<8} {:>11} {:>11} {:>11} {:>11} {:>10} {:>10} {:>5}",
        "------", "---------", "----", "----------", "---------", "--------", "----------", "----"
    );
    for s in &report.results {
        let _ = writeln!(
            out,
            "{:<8} {:>11.2} {:>11.2} {:>11.2} {:>11.2} {:>10.5} {:>10.5} {:>5}{}",
            s.operation,
            s.bandwidth_mib_s,
            s.ops_per_s,
            kib(report.block_bytes),
            kib(report.transfer_bytes),
            s.seconds,
            s.task_seconds_max,
            s.iteration,
            if s.stonewalled { "  (stonewalled)" } else { "" }
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "Summary of all tests:");
    let _ = writeln!(
        out,
        "{:<9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6} {:>4} {:>3} {:>5} {:>6} {:>10} {:>10} {:>10} {:>6}",
        "Operation", "Max(MiB)", "Min(MiB)", "Mean(MiB)", "StdDev", "Max(OPs)", "Min(OPs)",
        "Mean(OPs)", "StdDev", "Mean(s)", "#Tasks", "reps", "fPP", "reord", "segcnt", "blksiz",
        "xsize", "aggs(MiB)", "API"
    );
    for row in &report.summary {
        let _ = writeln!(
            out,
            "{:<9} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.5} {:>6} {:>4} {:>3} {:>5} {:>6} {:>10} {:>10} {:>10.1} {:>6}",
            row.operation,
            row.bandwidth_mib_s.max,
            row.bandwidth_mib_s.min,
            row.bandwidth_mib_s.mean,
            row.bandwidth_mib_s.stddev,
            row.ops_per_s.max,
            row.ops_per_s.min,
            row.ops_per_s.mean,
            row.ops_per_s.stddev,
            row.mean_seconds,
            report.tasks,
            report.repetitions,
            u8::from(report.options.file_per_process),
            u8::from(report.options.reorder_tasks),
            report.segments,
            report.block_bytes,
            report.transfer_bytes,
            report.aggregate_bytes as f64 / (1u64 << 20) as f64,
            report.header.api
        );
    }
    if report.verify_errors > 0 {
        let _ = writeln!(out);
        let _ = writeln!(out, "DATA CHECK FAILED: {} corrupted bytes", report.verify_errors);
        for message in &report.verify_messages {
            let _ = writeln!(out, "  {message}");
        }
    } else if report.options.check_read {
        let _ = writeln!(out);
        let _ = writeln!(out, "Data check (-R): every byte read matched what was written.");
    }
    out
}

fn yes_no(value: bool) -> &'static str {
    if value {
        "yes"
    } else {
        "no"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> IorArgs {
        crate::parse_options("ior", args)
    }

    #[test]
    fn parses_ior_option_names() {
        let args = parse(&[
            "-a", "posix", "-b", "4m", "-t", "64k", "-s", "3", "-F", "-w", "-r", "-C", "-e", "--direct", "-i", "2",
            "-N", "4", "-o", "/tmp/x", "-k", "-D", "5", "-R",
        ]);
        assert_eq!(args.block_bytes, 4 << 20);
        assert_eq!(args.transfer_bytes, 64 << 10);
        assert_eq!(args.segments, 3);
        assert!(args.file_per_process && args.write && args.read && args.reorder_tasks);
        assert!(args.fsync && args.direct && args.keep_file && args.check_read);
        assert_eq!((args.repetitions, args.tasks, args.stonewall_seconds), (2, 4, 5));
        let plan = args.plan().unwrap();
        assert_eq!(plan.layout.transfers_per_task(), 64 * 3);
        assert_eq!(plan.pattern, AccessPattern::Sequential);

        let defaults = parse(&[]);
        assert_eq!(defaults.block_bytes, 1 << 20);
        assert_eq!(defaults.transfer_bytes, 256 << 10);
        assert_eq!(defaults.test_file, "testFile");
        let plan = defaults.plan().unwrap();
        assert!(plan.write && plan.read, "no -w/-r means both");
        assert!(!parse(&["-r"]).plan().unwrap().write);

        assert_eq!(parse(&["--stride", "17"]).plan().unwrap().pattern, AccessPattern::Strided { stride_transfers: 17 });
        assert!(matches!(parse(&["-z"]).plan().unwrap().pattern, AccessPattern::Random { .. }));
    }

    #[test]
    fn refuses_impossible_options() {
        let message = |args: &[&str]| parse(args).plan().unwrap_err().to_string();
        assert!(message(&["-b", "1m", "-t", "300k"]).contains("multiple of the transfer size"));
        assert!(message(&["-N", "0"]).contains("tasks"));
        assert!(message(&["-C"]).contains("-C needs at least 2 tasks"));
        assert!(message(&["-z", "--stride", "17"]).contains("pick one"));
        assert!(message(&["--stride", "0"]).contains("at least 1"));
        assert!(message(&["--direct", "-t", "1000", "-b", "4000"]).contains("4k"));
        assert!(message(&["-i", "0"]).contains("-i"));
        assert!(message(&["-a", "native", "-o", "/x"]).contains("braid://"));
        assert!(message(&["-z", "-t", "1", "-b", "1g"]).contains("transfers per task"));
        assert!(IorArgs::try_parse_from(["ior", "-b", "lots"]).is_err());
    }

    #[test]
    fn reorder_reads_the_next_task() {
        let job = IorTaskJob {
            rank: 0,
            target: Target::parse(Api::Posix, "/d/f").unwrap(),
            layout: IorLayout { block_bytes: 8, transfer_bytes: 8, segments: 1, tasks: 3, file_per_process: true },
            pattern: AccessPattern::Sequential,
            reorder_tasks: true,
            fsync: false,
            direct: false,
            verify: true,
            seed: 1,
        };
        assert_eq!(job.data_rank_for_read(0), 1);
        assert_eq!(job.data_rank_for_read(2), 0);
        assert_eq!(job.file_of(2), "/d/f.00000002");
    }
}
