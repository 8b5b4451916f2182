//! `braid bench mdtest`: mdtest's metadata test with mdtest's option names. N task processes
//! create, stat, read and remove `-n` files and directories each, all in one shared directory
//! or in a directory per task (`-u`), the two layouts seed 000 compares (figures 3-9, 3-10).
//! The rate of a phase is all tasks' items over the time from the first task's start to the
//! last task's end; the output has mdtest's `SUMMARY rate` table and a JSON form.

use clap::Parser;
use serde::{Deserialize, Serialize};

use crate::backend::{self, read_full_at, write_all_at, Api, FileBackend, NativeConnect, OpenFlags, Target};
use crate::clock::{monotonic_ns, seconds_between};
use crate::error::{usage, BenchError, Result};
use crate::machine::{self, RunHeader};
use crate::progress::Progress;
use crate::stats::{rate, Summary};
use crate::task::{Phase, PhaseOrder, PhaseResult, TaskGroup, TaskJob, TaskRunner};
use crate::units::parse_size;

/// Most items one task creates per phase.
pub const MAX_ITEMS_PER_TASK: u64 = 100_000_000;
/// Most bytes written or read per file (`-w`, `-e`); the buffer is allocated once.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Options of `braid bench mdtest`; short names are mdtest's, except `-N` (tasks).
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "mdtest", about = "mdtest-style metadata benchmark")]
pub struct MdtestArgs {
    /// I/O interface: posix (any mounted directory) or native (braid://HOST:PORT/path).
    #[arg(short = 'a', long = "api", value_enum, default_value = "posix")]
    pub api: Api,
    /// Files and/or directories each task creates, stats, reads and removes (mdtest -n).
    #[arg(short = 'n', long = "items", default_value_t = 1000)]
    pub items: u64,
    /// Number of tasks, each an OS process.
    #[arg(short = 'N', long = "num-tasks", default_value_t = 1)]
    pub tasks: usize,
    /// Directory the test tree is made in (mdtest -d).
    #[arg(short = 'd', long = "dir", default_value = "./out")]
    pub dir: String,
    /// Files only (mdtest -F).
    #[arg(short = 'F', long = "files-only")]
    pub files_only: bool,
    /// Directories only (mdtest -D).
    #[arg(short = 'D', long = "dirs-only")]
    pub dirs_only: bool,
    /// A directory per task instead of one shared directory (mdtest -u).
    #[arg(short = 'u', long = "unique-dir")]
    pub unique_dir: bool,
    /// Bytes written into each file at creation (mdtest -w; IO500 mdtest-hard: 3901).
    #[arg(short = 'w', long = "write-bytes", value_parser = parse_size, default_value = "0")]
    pub write_bytes: u64,
    /// Bytes read from each file in the read phase (mdtest -e).
    #[arg(short = 'e', long = "read-bytes", value_parser = parse_size, default_value = "0")]
    pub read_bytes: u64,
    /// fsync each file after writing it (mdtest -y).
    #[arg(short = 'y', long = "sync-file")]
    pub sync_file: bool,
    /// Iterations (mdtest -i).
    #[arg(short = 'i', long = "iterations", default_value_t = 1)]
    pub iterations: u32,
    /// Only the create phase (mdtest -C); -C -T -E -r combine, none given = all phases.
    #[arg(short = 'C', long = "create-only")]
    pub create_only: bool,
    /// Only the stat phase (mdtest -T).
    #[arg(short = 'T', long = "stat-only")]
    pub stat_only: bool,
    /// Only the read phase (mdtest -E).
    #[arg(short = 'E', long = "read-only")]
    pub read_only: bool,
    /// Only the remove phase (mdtest -r).
    #[arg(short = 'r', long = "remove-only")]
    pub remove_only: bool,
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

impl MdtestArgs {
    /// Checks the options and lists the phases of one iteration, in mdtest's order.
    pub fn phases(&self) -> Result<Vec<Phase>> {
        if self.tasks == 0 || self.tasks > crate::ior::MAX_TASKS {
            usage!("-N {}: tasks must be 1..={}", self.tasks, crate::ior::MAX_TASKS);
        }
        if self.items == 0 {
            usage!("-n 0: each of the {} tasks needs at least one item", self.tasks);
        }
        if self.items > MAX_ITEMS_PER_TASK {
            usage!("-n {}: at most {MAX_ITEMS_PER_TASK} items per task", self.items);
        }
        if self.files_only && self.dirs_only {
            usage!("-F (files only) and -D (directories only) exclude each other");
        }
        if self.write_bytes > MAX_FILE_BYTES || self.read_bytes > MAX_FILE_BYTES {
            usage!("-w and -e are at most 64m per file");
        }
        if self.dirs_only && (self.write_bytes > 0 || self.read_bytes > 0) {
            usage!("-w/-e write and read files, but -D tests directories only");
        }
        if self.iterations == 0 {
            usage!("-i must be at least 1");
        }
        let all = !(self.create_only || self.stat_only || self.read_only || self.remove_only);
        let (create, stat, read, remove) =
            (all || self.create_only, all || self.stat_only, all || self.read_only, all || self.remove_only);
        let mut phases = Vec::new();
        if self.unique_dir && create {
            phases.push(Phase::TreeCreate);
        }
        if !self.files_only {
            phases.extend(
                [(create, Phase::DirCreate), (stat, Phase::DirStat), (remove, Phase::DirRemove)]
                    .into_iter()
                    .filter_map(|(on, phase)| on.then_some(phase)),
            );
        }
        if !self.dirs_only {
            phases.extend(
                [
                    (create, Phase::FileCreate),
                    (stat, Phase::FileStat),
                    (read, Phase::FileRead),
                    (remove, Phase::FileRemove),
                ]
                .into_iter()
                .filter_map(|(on, phase)| on.then_some(phase)),
            );
        }
        if self.unique_dir && remove {
            phases.push(Phase::TreeRemove);
        }
        Ok(phases)
    }
}

/// What one task process is told before the first phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MdtestTaskJob {
    pub rank: usize,
    pub target: Target,
    pub unique_dir: bool,
    pub items: u64,
    pub write_bytes: u64,
    pub read_bytes: u64,
    pub sync_file: bool,
}

/// The tree of one iteration: `DIR/mdtest_tree.I`.
fn tree_path(dir: &str, iteration: u32) -> String {
    backend::join(dir, &format!("mdtest_tree.{iteration}"))
}

impl MdtestTaskJob {
    fn work_dir(&self, iteration: u32) -> String {
        let tree = tree_path(&self.target.path, iteration);
        if self.unique_dir {
            backend::join(&tree, &format!("task.{}", self.rank))
        } else {
            tree
        }
    }
}

/// The task side of mdtest.
pub struct MdtestTask {
    job: MdtestTaskJob,
    backend: Box<dyn FileBackend>,
    write_buffer: Vec<u8>,
    read_buffer: Vec<u8>,
}

impl MdtestTask {
    pub fn new(job: MdtestTaskJob, native: Option<NativeConnect>) -> Result<MdtestTask> {
        let backend = job.target.connect(native)?;
        let write_buffer = (0..job.write_bytes).map(|i| (i % 251) as u8).collect();
        let read_buffer = vec![0u8; job.read_bytes as usize];
        Ok(MdtestTask { job, backend, write_buffer, read_buffer })
    }

    /// Writes `DIR/KIND.mdtest.RANK.INDEX` into `path`, reusing its allocation: at a few
    /// microseconds per stat, building a fresh string per item shows in the rate.
    fn item(&self, path: &mut String, dir: &str, kind: &str, index: u64) {
        use std::fmt::Write;
        path.clear();
        path.push_str(dir);
        if !dir.ends_with('/') {
            path.push('/');
        }
        let _ = write!(path, "{kind}.mdtest.{}.{index}", self.job.rank);
    }

    fn one_item(&mut self, phase: Phase, path: &str) -> Result<u64> {
        let backend = self.backend.as_mut();
        match phase {
            Phase::DirCreate => backend.mkdir(path).map_err(|e| BenchError::io("mkdir", path, e))?,
            Phase::DirStat | Phase::FileStat => {
                backend.stat(path).map_err(|e| BenchError::io("stat", path, e))?;
            }
            Phase::DirRemove => backend.rmdir(path).map_err(|e| BenchError::io("rmdir", path, e))?,
            Phase::FileRemove => backend.unlink(path).map_err(|e| BenchError::io("unlink", path, e))?,
            Phase::FileCreate => {
                let flags = OpenFlags { write: true, create: true, exclusive: true, ..OpenFlags::default() };
                let file = backend.open(path, flags).map_err(|e| BenchError::io("create", path, e))?;
                if !self.write_buffer.is_empty() {
                    write_all_at(backend, file, &self.write_buffer, 0).map_err(|e| BenchError::io("write", path, e))?;
                }
                if self.job.sync_file {
                    backend.fsync(file).map_err(|e| BenchError::io("fsync", path, e))?;
                }
                backend.close(file).map_err(|e| BenchError::io("close", path, e))?;
                return Ok(self.write_buffer.len() as u64);
            }
            Phase::FileRead => {
                let file = backend.open(path, OpenFlags::read_only()).map_err(|e| BenchError::io("open", path, e))?;
                let mut got = 0;
                if !self.read_buffer.is_empty() {
                    got = read_full_at(backend, file, &mut self.read_buffer, 0)
                        .map_err(|e| BenchError::io("read", path, e))?;
                }
                backend.close(file).map_err(|e| BenchError::io("close", path, e))?;
                return Ok(got as u64);
            }
            other => return Err(BenchError::Other(format!("{other:?} is not a per-item phase"))),
        }
        Ok(0)
    }
}

impl TaskRunner for MdtestTask {
    fn run_phase(&mut self, order: &PhaseOrder) -> Result<PhaseResult> {
        let dir = self.job.work_dir(order.iteration);
        let rpcs_before = self.backend.rpc_tally();
        let start_ns = monotonic_ns();
        let mut bytes = 0;
        let ops = match order.phase {
            Phase::TreeCreate => {
                self.backend.mkdir(&dir).map_err(|e| BenchError::io("mkdir", &dir, e))?;
                1
            }
            Phase::TreeRemove => {
                self.backend.rmdir(&dir).map_err(|e| BenchError::io("rmdir", &dir, e))?;
                1
            }
            phase => {
                let kind = match phase {
                    Phase::DirCreate | Phase::DirStat | Phase::DirRemove => "dir",
                    _ => "file",
                };
                let mut path = String::with_capacity(dir.len() + 64);
                for index in 0..self.job.items {
                    self.item(&mut path, &dir, kind, index);
                    bytes += self.one_item(phase, &path)?;
                }
                self.job.items
            }
        };
        let end_ns = monotonic_ns();
        let rpcs = rpcs_before.zip(self.backend.rpc_tally()).map(|(before, after)| before.until(after));
        Ok(PhaseResult { start_ns, end_ns, bytes, ops, rpcs, ..PhaseResult::default() })
    }
}

/// One phase of one iteration, aggregated over all tasks.
#[derive(Debug, Clone, Serialize)]
pub struct MdtestSample {
    pub iteration: u32,
    pub operation: &'static str,
    pub ops_per_s: f64,
    pub seconds: f64,
    pub items: u64,
    pub bytes: u64,
    /// Requests per item the clients sent, when they count them (`-a native`).
    pub rpcs_per_item: Option<RpcsPerItem>,
}

/// Requests per item of a phase, to metadata and to object servers.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RpcsPerItem {
    pub mds: f64,
    pub ost: f64,
}

/// One line of mdtest's SUMMARY tables.
#[derive(Debug, Clone, Serialize)]
pub struct MdtestSummaryRow {
    pub operation: &'static str,
    pub ops_per_s: Summary,
    pub seconds: Summary,
}

/// Everything a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct MdtestReport {
    #[serde(flatten)]
    pub header: RunHeader,
    pub tasks: usize,
    pub items_per_task: u64,
    pub unique_dir: bool,
    pub iterations: u32,
    pub options: MdtestArgs,
    pub results: Vec<MdtestSample>,
    pub summary: Vec<MdtestSummaryRow>,
}

/// Runs the benchmark described by `args`.
pub fn execute(args: &MdtestArgs, native: Option<NativeConnect>, progress: &mut Progress) -> Result<MdtestReport> {
    let phases = args.phases()?;
    let target = Target::parse(args.api, &args.dir)?;
    if args.drop_caches {
        machine::check_drop_caches()?;
    }
    let mut driver = target.connect(native)?;
    match driver.stat(&target.path) {
        Ok(stat) if stat.is_dir => {}
        Ok(_) => usage!("-d {}: not a directory", target.path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            driver.mkdir(&target.path).map_err(|e| BenchError::io("mkdir", &target.path, e))?
        }
        Err(e) => return Err(BenchError::io("stat", &target.path, e)),
    }
    let began = machine::utc_now();
    progress.status(&format!("mdtest: starting {} tasks", args.tasks));
    let mut group = TaskGroup::spawn(args.tasks, |rank| {
        TaskJob::Mdtest(MdtestTaskJob {
            rank,
            target: target.clone(),
            unique_dir: args.unique_dir,
            items: args.items,
            write_bytes: args.write_bytes,
            read_bytes: args.read_bytes,
            sync_file: args.sync_file,
        })
    })?;
    let removes_all = phases.contains(&Phase::FileRemove) || phases.contains(&Phase::DirRemove);
    let mut results = Vec::new();
    for iteration in 0..args.iterations {
        let tree = tree_path(&target.path, iteration);
        match driver.mkdir(&tree) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(BenchError::io("mkdir", &tree, e)),
        }
        for &phase in &phases {
            if args.drop_caches {
                machine::drop_caches()?;
            }
            progress.status(&format!("mdtest: iteration {}/{} {}", iteration + 1, args.iterations, phase.label()));
            let phase_results =
                group.run_phase(|_| PhaseOrder { phase, iteration, deadline_ns: None, transfer_limit: None })?;
            results.push(sample(iteration, phase, &phase_results));
        }
        if removes_all {
            match driver.rmdir(&tree) {
                Ok(()) => {}
                // Left in place when only some item kinds were removed; say nothing.
                Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {}
                Err(e) => return Err(BenchError::io("rmdir", &tree, e)),
            }
        }
    }
    group.finish()?;
    progress.clear();
    let mut summary = Vec::new();
    for phase in &phases {
        let samples: Vec<&MdtestSample> = results.iter().filter(|s| s.operation == phase.label()).collect();
        let rates: Vec<f64> = samples.iter().map(|s| s.ops_per_s).collect();
        let seconds: Vec<f64> = samples.iter().map(|s| s.seconds).collect();
        summary.push(MdtestSummaryRow {
            operation: phase.label(),
            ops_per_s: Summary::of(&rates),
            seconds: Summary::of(&seconds),
        });
    }
    Ok(MdtestReport {
        header: RunHeader::new("braid bench mdtest", began, &target, args.drop_caches),
        tasks: args.tasks,
        items_per_task: args.items,
        unique_dir: args.unique_dir,
        iterations: args.iterations,
        options: args.clone(),
        results,
        summary,
    })
}

fn sample(iteration: u32, phase: Phase, results: &[PhaseResult]) -> MdtestSample {
    let first_start = results.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let last_end = results.iter().map(|r| r.end_ns).max().unwrap_or(0);
    let seconds = seconds_between(first_start, last_end);
    let items: u64 = results.iter().map(|r| r.ops).sum();
    let counted: Option<Vec<crate::backend::RpcTally>> = results.iter().map(|r| r.rpcs).collect();
    let per_item = |n: u64| if items == 0 { 0.0 } else { n as f64 / items as f64 };
    MdtestSample {
        iteration,
        operation: phase.label(),
        ops_per_s: rate(items as f64, seconds),
        seconds,
        items,
        bytes: results.iter().map(|r| r.bytes).sum(),
        rpcs_per_item: counted.map(|all| {
            let (mds, ost) = all.iter().fold((0, 0), |(m, o), t| (m + t.mds, o + t.ost));
            RpcsPerItem { mds: per_item(mds), ost: per_item(ost) }
        }),
    }
}

/// mdtest's text output: the parameters, then `SUMMARY rate` and `SUMMARY time`.
pub fn render_text(report: &MdtestReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "braid bench mdtest: mdtest-style metadata benchmark");
    report.header.write_opening(&mut out, 20);
    let _ = writeln!(out, "Path                : {} ({})", report.header.target, report.header.file_system);
    let _ = writeln!(out, "Caches dropped      : {}", if report.header.caches_dropped { "yes" } else { "no" });
    let _ = writeln!(
        out,
        "{} tasks, {} items per task, directory: {}",
        report.tasks,
        report.items_per_task,
        if report.unique_dir { "one per task (-u)" } else { "one shared" }
    );
    for (title, pick) in [
        ("rate", (|r: &MdtestSummaryRow| r.ops_per_s) as fn(&MdtestSummaryRow) -> Summary),
        ("time", |r: &MdtestSummaryRow| r.seconds),
    ] {
        let _ = writeln!(out);
        let _ = writeln!(out, "SUMMARY {title}: (of {} iterations)", report.iterations);
        let _ = writeln!(out, "   {:<22}{:>14}{:>15}{:>15}{:>15}", "Operation", "Max", "Min", "Mean", "Std Dev");
        let _ = writeln!(out, "   {:<22}{:>14}{:>15}{:>15}{:>15}", "---------", "---", "---", "----", "-------");
        for row in &report.summary {
            let s = pick(row);
            let _ = writeln!(
                out,
                "   {:<22}{:>14.3}{:>15.3}{:>15.3}{:>15.3}",
                row.operation, s.max, s.min, s.mean, s.stddev
            );
        }
    }
    // Round trips per item, where the client counted them (the native client).
    let counted: Vec<&MdtestSample> = report.results.iter().filter(|s| s.rpcs_per_item.is_some()).collect();
    if !counted.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "RPCs per item (client-side count):");
        let _ = writeln!(out, "   {:<22}{:>10}{:>14}{:>14}", "Operation", "Iteration", "MDS", "OST");
        for s in counted {
            let r = s.rpcs_per_item.expect("filtered");
            let _ = writeln!(out, "   {:<22}{:>10}{:>14.2}{:>14.2}", s.operation, s.iteration, r.mds, r.ost);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> MdtestArgs {
        crate::parse_options("mdtest", args)
    }

    #[test]
    fn parses_mdtest_option_names() {
        let args = parse(&["-n", "50", "-N", "3", "-d", "/x", "-F", "-u", "-w", "3901", "-e", "3901", "-i", "2"]);
        assert_eq!((args.items, args.tasks, args.iterations), (50, 3, 2));
        assert_eq!((args.write_bytes, args.read_bytes), (3901, 3901));
        assert_eq!(
            args.phases().unwrap(),
            vec![
                Phase::TreeCreate,
                Phase::FileCreate,
                Phase::FileStat,
                Phase::FileRead,
                Phase::FileRemove,
                Phase::TreeRemove
            ]
        );
        assert_eq!(parse(&["-D"]).phases().unwrap(), vec![Phase::DirCreate, Phase::DirStat, Phase::DirRemove]);
        assert_eq!(parse(&["-C", "-F"]).phases().unwrap(), vec![Phase::FileCreate]);
        assert_eq!(parse(&[]).phases().unwrap().len(), 7);
    }

    #[test]
    fn refuses_impossible_options() {
        let message = |args: &[&str]| parse(args).phases().unwrap_err().to_string();
        assert!(message(&["-F", "-D"]).contains("exclude"));
        assert!(message(&["-n", "0", "-N", "4"]).contains("4 tasks"));
        assert!(message(&["-N", "0"]).contains("tasks"));
        assert!(message(&["-D", "-w", "10"]).contains("-D"));
        assert!(message(&["-w", "1g"]).contains("64m"));
    }
}
