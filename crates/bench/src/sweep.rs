//! `braid bench sweep`: a named experiment run against several targets side by side, written
//! up as `report.md`, one SVG per figure and the raw JSON. The presets reproduce the figures
//! of seed 000 chapter 3: bandwidth by task count (fig. 3-5), by file size (3-6, the client
//! cache effect), by transfer size (3-7), by access pattern (3-8), and metadata rates by task
//! count in a shared and in a unique directory (3-9, 3-10); and those of seed 002 on
//! braid's layouts: a shared file written and read by more and more tasks with and
//! without the progressive layout of its Table 4 (figures 8 and 9), and small files
//! with and without Data-on-MDT (figure 10). Each point is an ordinary
//! `braid bench ior|mdtest|iozone` run whose command line the report lists.

use std::fmt::Write as _;
use std::path::Path;

use clap::Parser;
use serde::Serialize;

use crate::backend::{Api, NativeConnect, Target};
use crate::error::{usage, BenchError, Result};
pub use crate::figures::{figure, Figure, FigurePoint, FigureSeries, Figures, SweepRun, SweepTarget};
use crate::ior::{self, IorArgs};
use crate::iozone::{self, IozoneArgs};
use crate::machine::{self, Machine};
use crate::mdtest::{self, MdtestArgs};
use crate::progress::Progress;
use crate::svg::{self, Plot, Series, XAxis};
use crate::units::{format_size, parse_size};

/// The experiments `--preset` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// Bandwidth by task count: file per process, 1 MiB transfers, sequential (fig. 3-5).
    Tasks,
    /// Bandwidth by file size, one task: the client cache effect on read/reread (fig. 3-6).
    Filesize,
    /// Bandwidth by transfer size, one task, sequential (fig. 3-7).
    Blocksize,
    /// Bandwidth by access pattern: sequential, strided (17 blocks), random (fig. 3-8).
    Pattern,
    /// mdtest create/stat/remove rates by task count, shared vs unique directory (3-9, 3-10).
    Metadata,
    /// Seed 002 figures 8 and 9: one shared file written and read by 1..N tasks, in a
    /// directory with seed 002's Table 4 progressive layout and in a plain one (braid).
    Pfl,
    /// Seed 002 figure 10: IOR file per process with 1 KiB and 1,000 KiB blocks (1 KiB
    /// and 100 KiB transfers, its Table 6), in a Data-on-MDT directory (its Table 5)
    /// and in a plain one (braid).
    Dom,
    /// Seed 002 figures 6 and 7: IOR file per process and mdtest (1,000 files per task)
    /// in one directory on one MDT and in one striped over 2 and 4 MDTs (braid).
    Dne,
    /// Seed 003 figures 3 and 4: IOzone sequential write, rewrite, read, reread (64 KiB
    /// records) then random read and write (4 KiB records) of one file, O_DIRECT, on
    /// each target: a braid mount without and with the SSD cache, and the cache's own
    /// directory.
    Cache,
    /// Seed 001 figures 4 and 5: IOR read and write bandwidth by transfer size (4 KiB
    /// to 4 MiB), one task, on each target: a braid mount with tracing off, on, and
    /// with a synchronous logger, for the tracer's overhead.
    Tracer,
    /// Seed 000's aggregate bandwidth by OSTs: N tasks, file per process, each file on
    /// one OST, for N = 1, 2, 4, 8 (on a file system whose OSTs are bandwidth-limited,
    /// `braid local --ost-media 0-7:bw=200M`, it shows how the OSTs add up).
    Osts,
    /// Seed 000 figure 3-12: the tasks sweep on each target, the targets being
    /// directories placed in pools of OSTs that emulate different media (e.g. an
    /// `hdd` pool and an `ssd` pool: `braid setstripe -p hdd DIR`).
    Media,
    /// Seed 002 figure 13: read bandwidth of a shared file and of files per process
    /// in four states: in the hot pool, purged to the cool pool, just purged with the
    /// tiering service staging them back as they are read, and after staging (braid,
    /// pools named `hot` and `cool`).
    Tiering,
    /// Seed 004 Table 1 and figures 1, 3 and 4: NBD exports (targets `LABEL=nbd://...`)
    /// measured through the protocol: latency of one request in flight by size,
    /// sequential bandwidth with and without FUA, write bandwidth by amount written
    /// beside the seed's model, and bandwidth by requests in flight.
    Nbd,
}

impl Preset {
    fn describe(self) -> &'static str {
        match self {
            Preset::Tasks => "Seed 000 figure 3-5: aggregate write and read bandwidth as the number of tasks grows; file per process, 1 MiB transfers, sequential.",
            Preset::Osts => "Seed 000's scaling with storage targets: N tasks write then read a file each (1 MiB transfers, sequential), every file with one stripe (`braid setstripe -c 1` on the work directory), so round-robin placement puts the N files on N different OSTs: the aggregate bandwidth of 1, 2, 4 and 8 OSTs. On OSTs with an emulated bandwidth limit (`braid oss --ost DIR:bw=200M`, `braid local --ost-media 0-7:bw=200M`) it should grow with N until the client or the machine runs out; each target's `ideal` series is N times its one-OST figure.",
            Preset::Media => "Seed 000 figure 3-12: aggregate write and read bandwidth by number of tasks (file per process, 1 MiB transfers) on each target, where each target is a directory whose files go to OSTs of one emulated medium (`braid pool` an `hdd` and an `ssd` set of OSTs started with `--ost DIR:class=hdd,bw=150M,lat=4ms` and the like, then `braid setstripe -p hdd DIR`). The same workload shows what each medium delivers.",
            Preset::Filesize => "Seed 000 figure 3-6: bandwidth by file size for one task with 1 MiB records (IOzone-style write, rewrite, read, reread). Files that fit in the client's memory are read back from its cache, so read and reread rise well above what the storage delivers; past the cache size they fall to the storage's speed.",
            Preset::Blocksize => "Seed 000 figure 3-7: bandwidth by transfer (block) size for one task, file per process, sequential. Small transfers pay a per-call cost.",
            Preset::Pattern => "Seed 000 figure 3-8: bandwidth by access pattern for one task with 1 MiB transfers: sequential, strided with an interval of 17 transfers, random. Write-back hides the pattern from writes; reads pay for it.",
            Preset::Metadata => "Seed 000 figures 3-9 and 3-10: mdtest create, stat and remove rates of files and directories by task count, all tasks in one shared directory vs a directory per task.",
            Preset::Pfl => "Seed 002 figures 8 and 9: aggregate write and read bandwidth of one shared file (IOR without -F, 1 MiB transfers) as the number of tasks grows, in a directory whose default is seed 002's Table 4 progressive layout (`braid setstripe --template seed-table4`) and in a plain one (the file system default). Instantiating the later components as the file grows should cost nothing measurable.",
            Preset::Dne => "Seed 002 figures 6 and 7: N tasks in one directory on one MDT, and in one striped over 2 and 4 MDTs (`braid mkdir -c`, as many as the file system has): IOR file per process (its Table 2: 1 MiB transfers, write then read) for bandwidth, and mdtest on files (its Table 3: 1,000 files per task; create, stat, read, remove) for metadata rates. All tasks share the directory, so a striped one spreads their names, and the MDTs' work, over its MDTs.",
            Preset::Tracer => "Seed 001 figures 4 and 5: IOR read and write bandwidth by transfer size (4 KiB to 4 MiB), one task, file per process, sequential, O_DIRECT so that every transfer is one operation of the client. Run it on a braid mount with tracing off, one with it on (`-o trace`: a record into the shared-memory ring per operation, drained by a collector process), and one with a synchronous logger (`-o trace_sync=FILE`: each record formatted and written to a file before the operation returns, as the seed's PVFS logging): the overhead of each is its distance from tracing off.",
            Preset::Cache => "Seed 003 figures 3 and 4 (its Table 2 options, one task): IOzone sequential write, rewrite, read and reread with 64 KiB records, then random read and write with 4 KiB records on the same file, O_DIRECT so the client's page cache hides nothing. Run it on a braid mount without the SSD cache, one with it (`-o cache_dir=...`), and the cache's own directory: the cached mount's reread and random read come from the SSD cache, and its write and first read should match the mount without it.",
            Preset::Nbd => "Seed 004 Table 1 and figures 1, 3 and 4, on NBD exports (targets LABEL=nbd://HOST:PORT/EXPORT: `braid nbd serve` on a braid file, and for the seed's local reference nbdkit's file plugin on a local file), measured through the NBD protocol by braid's own client: the latency of one request in flight by request size (random reads and writes, Table 1); sequential write, write with FUA on every request (the seed's synchronous server) and read bandwidth (figure 1); write bandwidth by amount written, one 64 KiB request in flight, beside the seed's model b/t_b until the server's dirty memory limit and then the disk's pace, with t_b and t_d measured (figure 3); and sequential bandwidth by requests in flight from 1 to 32 (figure 4). The write-model figure's model series uses this machine's memory and vm.dirty_ratio.",
            Preset::Tiering => "Seed 002 figure 13 (its Table 7 hot/cool tiering): N tasks (--max-tasks, default 2) write a shared file and a file each into a directory of the hot pool (`braid setstripe -p hot`), then read them back in four states: in hot; purged to cool (`braid tier purge`: a cool mirror made, the hot one dropped); just purged, read while `braid tier run` notices the reads and stages the files back to hot (the reads are served from cool); and after that staging. The file system needs OST pools named `hot` and `cool` (e.g. `braid local --ost-media 2-3:class=hdd,bw=150M` and `braid pool`); the policy the preset gives the service is written beside the report.",
            Preset::Dom => "Seed 002 figure 10: IOR file per process with the block and transfer sizes of its Table 6 (1 KiB blocks of 1 KiB transfers; 1,000 KiB blocks of 100 KiB transfers), in a directory whose default is its Table 5 Data-on-MDT layout (`braid setstripe --template seed-table5`: the first 64 KiB on the MDT) and in a plain one.",
        }
    }
}

/// Options of `braid bench sweep`.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "sweep", about = "Run a named experiment against several targets and plot it")]
pub struct SweepArgs {
    /// The experiment to run.
    #[arg(long = "preset", value_enum)]
    pub preset: Preset,
    /// A target as LABEL=DIR (a directory, or braid://HOST:PORT/path for the native client);
    /// repeat for several targets.
    #[arg(long = "target", value_name = "LABEL=DIR", required = true)]
    pub targets: Vec<String>,
    /// Directory for report.md, the SVG plots and results.json.
    #[arg(long = "out", value_name = "DIR")]
    pub out: String,
    /// Shrink every size so a preset finishes in about a minute.
    #[arg(long = "quick")]
    pub quick: bool,
    /// Largest task count for the tasks and metadata presets (default: max(4, cores)).
    #[arg(long = "max-tasks")]
    pub max_tasks: Option<usize>,
    /// Replace the preset's x values (tasks, sizes; MDT counts for dne), comma
    /// separated.
    #[arg(long = "values", value_delimiter = ',')]
    pub values: Vec<String>,
    /// Bytes per task for the tasks, blocksize and pattern presets (default 1g; with
    /// --quick 32m for tasks, 64m otherwise).
    #[arg(long = "size", value_parser = parse_size)]
    pub size_bytes: Option<u64>,
    /// Items per task for the metadata preset (default 1000, 250 with --quick).
    #[arg(long = "items")]
    pub items: Option<u64>,
    /// Iterations of every point (IOR -i, mdtest -i); the plot shows the mean.
    #[arg(short = 'i', long = "iterations", default_value_t = 1)]
    pub iterations: u32,
    /// sync and drop the page cache before every phase (root).
    #[arg(long = "drop-caches")]
    pub drop_caches: bool,
    /// No progress display.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    pub tool: &'static str,
    pub began: String,
    pub command: String,
    pub machine: Machine,
    pub preset: Preset,
    pub description: &'static str,
    pub quick: bool,
    pub caches_dropped: bool,
    pub targets: Vec<SweepTarget>,
    pub figures: Vec<Figure>,
    pub runs: Vec<SweepRun>,
}

impl SweepArgs {
    fn parse_targets(&self) -> Result<Vec<(String, Target)>> {
        let mut targets: Vec<(String, Target)> = Vec::new();
        for spec in &self.targets {
            let Some((label, location)) = spec.split_once('=') else {
                usage!("--target {spec}: expected LABEL=DIR");
            };
            if label.is_empty() || location.is_empty() {
                usage!("--target {spec}: expected LABEL=DIR");
            }
            if targets.iter().any(|(l, _)| l == label) {
                usage!("--target label '{label}' is used twice");
            }
            let api = if location.starts_with("braid://") { Api::Native } else { Api::Posix };
            targets.push((label.to_string(), Target::parse(api, location)?));
        }
        Ok(targets)
    }

    fn task_counts(&self) -> Result<Vec<u64>> {
        // The dne preset's values are MDT counts; its tasks are the largest count.
        if !self.values.is_empty() && self.preset != Preset::Dne {
            return self
                .values
                .iter()
                .map(|v| match v.parse::<u64>() {
                    Ok(n) if n >= 1 && n as usize <= ior::MAX_TASKS => Ok(n),
                    _ => Err(BenchError::Usage(format!(
                        "--values {v}: task counts are whole numbers 1..={}",
                        ior::MAX_TASKS
                    ))),
                })
                .collect();
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let max = self.max_tasks.unwrap_or(if self.quick { 4 } else { cores.max(4) });
        if max == 0 {
            usage!("--max-tasks must be at least 1");
        }
        let mut counts = Vec::new();
        let mut n = 1;
        while n <= max {
            counts.push(n as u64);
            n *= 2;
        }
        if *counts.last().expect("max >= 1") != max as u64 {
            counts.push(max as u64);
        }
        Ok(counts)
    }

    /// The OST (and task) counts of the osts preset: `--values`, or 1, 2, 4 and 8.
    fn ost_counts(&self) -> Result<Vec<u64>> {
        if self.values.is_empty() {
            return Ok(vec![1, 2, 4, 8]);
        }
        self.task_counts()
    }

    /// The MDT counts of the dne preset: `--values`, or 1, 2 and 4.
    fn mdt_counts(&self) -> Result<Vec<u32>> {
        if self.values.is_empty() {
            return Ok(vec![1, 2, 4]);
        }
        self.values
            .iter()
            .map(|v| match v.parse::<u32>() {
                Ok(n) if (1..=256).contains(&n) => Ok(n),
                _ => Err(BenchError::Usage(format!("--values {v}: MDT counts are whole numbers 1..=256"))),
            })
            .collect()
    }

    fn sizes(&self, default: &[&str], quick: &[&str]) -> Result<Vec<u64>> {
        let texts: Vec<String> = if !self.values.is_empty() {
            self.values.clone()
        } else if self.quick {
            quick.iter().map(|s| s.to_string()).collect()
        } else {
            default.iter().map(|s| s.to_string()).collect()
        };
        texts.iter().map(|t| parse_size(t).map_err(|e| BenchError::Usage(format!("--values: {e}")))).collect()
    }

    /// The report of a sweep of these options that began at `began`.
    fn report(
        &self,
        began: String,
        targets: Vec<SweepTarget>,
        figures: Vec<Figure>,
        runs: Vec<SweepRun>,
    ) -> SweepReport {
        SweepReport {
            tool: "braid bench sweep",
            began,
            command: machine::command_line(),
            machine: Machine::detect(),
            preset: self.preset,
            description: self.preset.describe(),
            quick: self.quick,
            caches_dropped: self.drop_caches,
            targets,
            figures,
            runs,
        }
    }

    fn bytes_per_task(&self, quick_default: u64) -> u64 {
        self.size_bytes.unwrap_or(if self.quick { quick_default } else { 1 << 30 })
    }
}

fn words(args: &[String]) -> String {
    args.iter().map(|a| machine::shell_quote(a)).collect::<Vec<_>>().join(" ")
}

/// Runs the sweep and writes its files; returns the report for printing.
pub fn execute(args: &SweepArgs, native: Option<NativeConnect>) -> Result<SweepReport> {
    if args.preset == Preset::Nbd {
        let out = Path::new(&args.out);
        std::fs::create_dir_all(out).map_err(|e| BenchError::io("mkdir", &args.out, e))?;
        if args.drop_caches {
            machine::check_drop_caches()?;
        }
        let began = machine::utc_now();
        let options = crate::nbd::NbdOptions {
            targets: args.targets.clone(),
            quick: args.quick,
            region: args.size_bytes,
            amounts: args.sizes(&["16m", "64m", "256m", "1g"], &["16m", "64m"])?,
            drop_caches: args.drop_caches,
        };
        let measured = crate::nbd::sweep(&options, &mut Progress::new(args.quiet))?;
        let report = args.report(began, measured.targets, measured.figures, measured.runs);
        write_outputs(out, &report)?;
        return Ok(report);
    }
    let targets = args.parse_targets()?;
    if args.iterations == 0 {
        usage!("-i must be at least 1");
    }
    if args.drop_caches {
        machine::check_drop_caches()?;
    }
    let mut progress = Progress::new(args.quiet);
    let out = Path::new(&args.out);
    std::fs::create_dir_all(out).map_err(|e| BenchError::io("mkdir", &args.out, e))?;
    let began = machine::utc_now();
    let mut figures = Figures {
        figures: match args.preset {
            Preset::Tasks => {
                vec![figure("tasks", "Bandwidth by number of tasks (file per process)", "tasks", "MiB/s", XAxis::Log2)]
            }
            Preset::Osts => vec![figure(
                "osts",
                "Aggregate bandwidth by OSTs (N tasks, a one-stripe file each)",
                "OSTs (= tasks)",
                "MiB/s",
                XAxis::Log2,
            )],
            Preset::Media => vec![figure(
                "media",
                "Bandwidth by number of tasks on each medium (file per process)",
                "tasks",
                "MiB/s",
                XAxis::Log2,
            )],
            Preset::Filesize => vec![figure(
                "filesize",
                "Bandwidth by file size (one task, 1 MiB records)",
                "file size (bytes)",
                "MiB/s",
                XAxis::Log2Bytes,
            )],
            Preset::Blocksize => vec![figure(
                "blocksize",
                "Bandwidth by transfer size (one task)",
                "transfer size (bytes)",
                "MiB/s",
                XAxis::Log2Bytes,
            )],
            Preset::Pattern => vec![figure(
                "pattern",
                "Bandwidth by access pattern (one task, 1 MiB transfers)",
                "access pattern",
                "MiB/s",
                XAxis::Categories(vec!["sequential".into(), "strided (17)".into(), "random".into()]),
            )],
            Preset::Metadata => [
                ("metadata-shared-files", "File metadata rate, shared directory"),
                ("metadata-shared-dirs", "Directory metadata rate, shared directory"),
                ("metadata-unique-files", "File metadata rate, unique directory per task"),
                ("metadata-unique-dirs", "Directory metadata rate, unique directory per task"),
            ]
            .into_iter()
            .map(|(id, title)| figure(id, title, "tasks", "ops/s", XAxis::Log2))
            .collect(),
            Preset::Pfl => vec![
                figure("pfl-write", "Shared-file write bandwidth by number of tasks", "tasks", "MiB/s", XAxis::Log2),
                figure("pfl-read", "Shared-file read bandwidth by number of tasks", "tasks", "MiB/s", XAxis::Log2),
            ],
            Preset::Dne => {
                let cases = XAxis::Categories(args.mdt_counts()?.iter().map(|&n| mdts_label(n)).collect());
                vec![
                    figure(
                        "dne-bandwidth",
                        "Bandwidth by MDTs of the directory (IOR file per process)",
                        "directory",
                        "MiB/s",
                        cases.clone(),
                    ),
                    figure(
                        "dne-iops",
                        "File metadata rate by MDTs of the directory (mdtest)",
                        "directory",
                        "ops/s",
                        cases,
                    ),
                ]
            }
            Preset::Cache => vec![
                figure(
                    "cache-sequential",
                    "Sequential I/O, 64 KiB records, O_DIRECT (seed 003 figure 3)",
                    "test",
                    "MiB/s",
                    XAxis::Categories(CACHE_SEQUENTIAL.iter().map(|s| s.to_string()).collect()),
                ),
                figure(
                    "cache-random",
                    "Random I/O, 4 KiB records, O_DIRECT (seed 003 figure 4)",
                    "test",
                    "ops/s",
                    XAxis::Categories(CACHE_RANDOM.iter().map(|s| s.to_string()).collect()),
                ),
            ],
            Preset::Tracer => vec![
                figure(
                    "tracer-read",
                    "Read bandwidth by transfer size (seed 001 figure 4)",
                    "transfer size (bytes)",
                    "MiB/s",
                    XAxis::Log2Bytes,
                ),
                figure(
                    "tracer-write",
                    "Write bandwidth by transfer size (seed 001 figure 5)",
                    "transfer size (bytes)",
                    "MiB/s",
                    XAxis::Log2Bytes,
                ),
            ],
            // Measured by crate::nbd, which returned above.
            Preset::Tiering => vec![figure(
                "tiering",
                "Read bandwidth by tiering state (shared file and file per process)",
                "state",
                "MiB/s",
                XAxis::Categories(TIERING_STATES.iter().map(|s| s.to_string()).collect()),
            )],
            Preset::Nbd => Vec::new(),
            Preset::Dom => {
                let cases = XAxis::Categories(DOM_CASES.iter().map(|c| c.0.to_string()).collect());
                vec![
                    figure(
                        "dom-write",
                        "Small-file write bandwidth, file per process",
                        "IOR block / transfer",
                        "MiB/s",
                        cases.clone(),
                    ),
                    figure(
                        "dom-read",
                        "Small-file read bandwidth, file per process",
                        "IOR block / transfer",
                        "MiB/s",
                        cases,
                    ),
                ]
            }
        },
    };
    // Every point as (figure, x, x label, engine arguments) before anything runs, so bad
    // --values fail at once.
    let task_counts = match args.preset {
        Preset::Tasks | Preset::Media | Preset::Metadata | Preset::Pfl | Preset::Dom | Preset::Dne => {
            args.task_counts()?
        }
        Preset::Osts => args.ost_counts()?,
        _ => Vec::new(),
    };
    let mdt_counts = if args.preset == Preset::Dne { args.mdt_counts()? } else { Vec::new() };
    let mut runs = Vec::new();
    let mut sweep_targets = Vec::new();
    let transfer_sizes =
        args.sizes(&["4k", "16k", "64k", "256k", "1m", "4m"], &["4k", "16k", "64k", "256k", "1m", "4m"])?;
    let file_sizes =
        args.sizes(&["1m", "4m", "16m", "64m", "256m", "1g", "4g"], &["1m", "4m", "16m", "64m", "256m"])?;
    let total_points = targets.len()
        * match args.preset {
            Preset::Tasks | Preset::Media | Preset::Osts => task_counts.len(),
            Preset::Metadata | Preset::Pfl => task_counts.len() * 2,
            Preset::Dom => DOM_CASES.len() * 2,
            Preset::Cache => 1,
            Preset::Dne => mdt_counts.len() * 2,
            Preset::Pattern => 3,
            Preset::Filesize => file_sizes.len(),
            Preset::Blocksize | Preset::Tracer => transfer_sizes.len(),
            Preset::Tiering => TIERING_STATES.len(),
            Preset::Nbd => 0,
        };
    let mut done_points = 0;
    for (label, target) in &targets {
        let dir = crate::backend::join(&target.display(), &format!("braid-bench-{:?}", args.preset).to_lowercase());
        let work = Target::parse(target.api, &dir)?;
        let mut driver = work.connect(native)?;
        if let Err(e) = driver.stat(&target.path) {
            let why =
                if e.kind() == std::io::ErrorKind::NotFound { "does not exist".to_string() } else { e.to_string() };
            return Err(BenchError::Usage(format!("target {label}={}: the directory {why}", target.display())));
        }
        match driver.mkdir(&work.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(BenchError::io("mkdir", &work.path, e)),
        }
        sweep_targets.push(SweepTarget {
            label: label.clone(),
            location: target.display(),
            file_system: machine::file_system(target),
        });
        let api = if target.api == Api::Native { "native" } else { "posix" };
        let iterations = args.iterations.to_string();
        let mut status = |progress: &mut Progress, what: &str| {
            done_points += 1;
            progress.status(&format!("sweep {:?}: {label}: {what} ({done_points}/{total_points})", args.preset));
        };
        let run_ior = |extra: &[String]| -> Result<(ior::IorReport, String)> {
            let mut argv: Vec<String> =
                vec!["ior".into(), "-a".into(), api.into(), "-i".into(), iterations.clone(), "-q".into()];
            if args.drop_caches {
                argv.push("--drop-caches".into());
            }
            argv.extend_from_slice(extra);
            let parsed = IorArgs::try_parse_from(&argv).map_err(|e| BenchError::Other(format!("internal: {e}")))?;
            let report = ior::execute(&parsed, native, &mut Progress::silent())?;
            Ok((report, format!("braid bench {}", words(&argv))))
        };
        match args.preset {
            Preset::Osts => {
                let size = args.bytes_per_task(32 << 20);
                let (block, transfer) = (format_size(size), format_size(size.min(1 << 20)));
                let sub = layout_dir(&mut *driver, &work.path, &dir, "one stripe", &["-c", "1"])?;
                let mut one = None;
                for &n in &task_counts {
                    status(&mut progress, &format!("{n} OSTs"));
                    let extra: Vec<String> =
                        ["-F", "-w", "-r", "-t", &transfer, "-b", &block, "-N", &n.to_string(), "-o"]
                            .iter()
                            .map(|s| s.to_string())
                            .chain([crate::backend::join(&sub.0, "testFile")])
                            .collect();
                    let (report, command) = run_ior(&extra)?;
                    // N times what one OST gave: where perfect scaling would be.
                    if n == 1 {
                        one = Some(
                            report.summary.iter().map(|r| (r.operation, r.bandwidth_mib_s.mean)).collect::<Vec<_>>(),
                        );
                    }
                    for (op, bw) in one.iter().flatten() {
                        figures.add("osts", format!("{label} ideal {op}"), n as f64, n.to_string(), bw * n as f64);
                    }
                    add_ior_run(&mut figures, &mut runs, "osts", label, (n as f64, n.to_string()), report, command);
                }
                let _ = driver.rmdir(&sub.1);
            }
            Preset::Tasks | Preset::Media => {
                let fig = if args.preset == Preset::Media { "media" } else { "tasks" };
                let size = args.bytes_per_task(32 << 20);
                let (block, transfer) = (format_size(size), format_size(size.min(1 << 20)));
                for &n in &task_counts {
                    status(&mut progress, &format!("{n} tasks"));
                    let extra: Vec<String> = [
                        "-F",
                        "-w",
                        "-r",
                        "-t",
                        &transfer,
                        "-b",
                        &block,
                        "-N",
                        &n.to_string(),
                        "-o",
                        &crate::backend::join(&dir, "testFile"),
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                    let (report, command) = run_ior(&extra)?;
                    add_ior_run(&mut figures, &mut runs, fig, label, (n as f64, n.to_string()), report, command);
                }
            }
            Preset::Blocksize | Preset::Tracer => {
                // The tracer's figures take O_DIRECT, so that each transfer is one
                // operation of the client, and draw reads and writes apart.
                let tracer = args.preset == Preset::Tracer;
                let size = args.bytes_per_task(64 << 20);
                for &transfer in &transfer_sizes {
                    status(&mut progress, &format!("transfer {}", format_size(transfer)));
                    if !size.is_multiple_of(transfer) {
                        usage!(
                            "--size {} is not a multiple of transfer size {}",
                            format_size(size),
                            format_size(transfer)
                        );
                    }
                    let mut extra: Vec<String> = [
                        "-F",
                        "-w",
                        "-r",
                        "-t",
                        &format_size(transfer),
                        "-b",
                        &format_size(size),
                        "-o",
                        &crate::backend::join(&dir, "testFile"),
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                    if tracer {
                        extra.push("--direct".into());
                    }
                    let (report, command) = run_ior(&extra)?;
                    let x = (transfer as f64, format_size(transfer));
                    if tracer {
                        for row in &report.summary {
                            let id = format!("tracer-{}", row.operation);
                            figures.add(&id, label.clone(), x.0, x.1.clone(), row.bandwidth_mib_s.mean);
                        }
                        runs.push(SweepRun { target: label.to_string(), command, report: to_json(&report) });
                    } else {
                        add_ior_run(&mut figures, &mut runs, "blocksize", label, x, report, command);
                    }
                }
            }
            Preset::Pattern => {
                let size = args.bytes_per_task(64 << 20);
                let transfer = format_size(size.min(1 << 20));
                let patterns: [(&str, &[&str]); 3] =
                    [("sequential", &[]), ("strided (17)", &["--stride", "17"]), ("random", &["-z"])];
                for (index, (name, flags)) in patterns.iter().enumerate() {
                    status(&mut progress, name);
                    let mut extra: Vec<String> = [
                        "-F",
                        "-w",
                        "-r",
                        "-t",
                        &transfer,
                        "-b",
                        &format_size(size),
                        "-o",
                        &crate::backend::join(&dir, "testFile"),
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                    extra.extend(flags.iter().map(|s| s.to_string()));
                    let (report, command) = run_ior(&extra)?;
                    add_ior_run(
                        &mut figures,
                        &mut runs,
                        "pattern",
                        label,
                        (index as f64, name.to_string()),
                        report,
                        command,
                    );
                }
            }
            Preset::Cache => {
                status(&mut progress, "IOzone sequential and random");
                // Seed 003's 500 MB per thread; 64 MiB with --quick.
                let size = format_size(args.size_bytes.unwrap_or(if args.quick { 64 << 20 } else { 512 << 20 }));
                let mut argv: Vec<String> = [
                    "iozone",
                    "--api",
                    api,
                    "--quiet",
                    "-I",
                    "-i",
                    "0,1,2",
                    "-s",
                    &size,
                    "-r",
                    "64k",
                    "--random-record-size",
                    "4k",
                    "-f",
                    &crate::backend::join(&dir, "iozone.tmp"),
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                if args.drop_caches {
                    argv.push("--drop-caches".into());
                }
                let parsed =
                    IozoneArgs::try_parse_from(&argv).map_err(|e| BenchError::Other(format!("internal: {e}")))?;
                let mut seq = [0.0f64; 4];
                let mut random = [0.0f64; 2];
                let mut reports = Vec::new();
                let n = f64::from(args.iterations);
                for _ in 0..args.iterations {
                    let report = iozone::execute(&parsed, native, &mut Progress::silent())?;
                    let cell = &report.cells[0];
                    for (mean, value) in seq.iter_mut().zip([cell.write, cell.rewrite, cell.read, cell.reread]) {
                        *mean += value.unwrap_or(0.0) / n;
                    }
                    // MiB/s of 4 KiB records as operations per second.
                    for (mean, value) in random.iter_mut().zip([cell.random_read, cell.random_write]) {
                        *mean += value.unwrap_or(0.0) * 256.0 / n;
                    }
                    reports.push(report);
                }
                for (i, (name, v)) in CACHE_SEQUENTIAL.iter().zip(seq).enumerate() {
                    figures.add("cache-sequential", label.clone(), i as f64, name.to_string(), v);
                }
                for (i, (name, v)) in CACHE_RANDOM.iter().zip(random).enumerate() {
                    figures.add("cache-random", label.clone(), i as f64, name.to_string(), v);
                }
                runs.push(SweepRun {
                    target: label.clone(),
                    command: format!("braid bench {} (x{})", words(&argv), args.iterations),
                    report: to_json(&reports),
                });
            }
            Preset::Filesize => {
                for &size in &file_sizes {
                    status(&mut progress, &format!("file {}", format_size(size)));
                    let record = size.min(1 << 20);
                    let file = crate::backend::join(&dir, "iozone.tmp");
                    let argv: Vec<String> = vec![
                        "iozone".into(),
                        "--api".into(),
                        api.into(),
                        "--quiet".into(),
                        "-i".into(),
                        "0,1".into(),
                        "-s".into(),
                        format_size(size),
                        "-r".into(),
                        format_size(record),
                        "-f".into(),
                        file,
                    ];
                    let parsed =
                        IozoneArgs::try_parse_from(&argv).map_err(|e| BenchError::Other(format!("internal: {e}")))?;
                    let mut means = [0.0f64; 4];
                    let mut reports = Vec::new();
                    for _ in 0..args.iterations {
                        let report = iozone::execute(&parsed, native, &mut Progress::silent())?;
                        let cell = &report.cells[0];
                        for (mean, value) in means.iter_mut().zip([cell.write, cell.rewrite, cell.read, cell.reread]) {
                            *mean += value.unwrap_or(0.0) / f64::from(args.iterations);
                        }
                        reports.push(report);
                    }
                    for (name, mean) in ["write", "rewrite", "read", "reread"].iter().zip(means) {
                        figures.add("filesize", format!("{label} {name}"), size as f64, format_size(size), mean);
                    }
                    runs.push(SweepRun {
                        target: label.clone(),
                        command: format!("braid bench {} (x{})", words(&argv), args.iterations),
                        report: to_json(&reports),
                    });
                }
            }
            Preset::Metadata => {
                let items = args.items.unwrap_or(if args.quick { 250 } else { 1000 }).to_string();
                for (layout, unique) in [("shared", false), ("unique", true)] {
                    for &n in &task_counts {
                        status(
                            &mut progress,
                            &format!("{} directory, {n} tasks", if unique { "unique" } else { "shared" }),
                        );
                        let mut argv: Vec<String> = vec![
                            "mdtest".into(),
                            "-a".into(),
                            api.into(),
                            "-q".into(),
                            "-n".into(),
                            items.clone(),
                            "-N".into(),
                            n.to_string(),
                            "-i".into(),
                            iterations.clone(),
                            "-d".into(),
                            crate::backend::join(&dir, "mdtest"),
                        ];
                        if unique {
                            argv.push("-u".into());
                        }
                        if args.drop_caches {
                            argv.push("--drop-caches".into());
                        }
                        let parsed = MdtestArgs::try_parse_from(&argv)
                            .map_err(|e| BenchError::Other(format!("internal: {e}")))?;
                        let report = mdtest::execute(&parsed, native, &mut Progress::silent())?;
                        // Seed 000 counts create, stat and remove; the read of an empty
                        // file (open + close) and the tree setup stay in results.json.
                        for row in &report.summary {
                            let (kind, operation) = match row.operation {
                                "File creation" => ("files", "create"),
                                "File stat" => ("files", "stat"),
                                "File removal" => ("files", "remove"),
                                "Directory creation" => ("dirs", "create"),
                                "Directory stat" => ("dirs", "stat"),
                                "Directory removal" => ("dirs", "remove"),
                                _ => continue,
                            };
                            figures.add(
                                &format!("metadata-{layout}-{kind}"),
                                format!("{label} {operation}"),
                                n as f64,
                                n.to_string(),
                                row.ops_per_s.mean,
                            );
                        }
                        runs.push(SweepRun {
                            target: label.clone(),
                            command: format!("braid bench {}", words(&argv)),
                            report: to_json(&report),
                        });
                    }
                }
                let md = crate::backend::join(&work.path, "mdtest");
                let _ = driver.rmdir(&md);
            }
            Preset::Pfl => {
                let size = args.bytes_per_task(32 << 20);
                let block = format_size(size);
                for (name, setstripe) in [("plain", &[][..]), ("Table 4", &["--template", "seed-table4"][..])] {
                    let sub = layout_dir(&mut *driver, &work.path, &dir, name, setstripe)?;
                    for &n in &task_counts {
                        status(&mut progress, &format!("{name}: {n} tasks"));
                        let extra: Vec<String> = ["-w", "-r", "-t", "1m", "-b", &block, "-N", &n.to_string(), "-o"]
                            .iter()
                            .map(|s| s.to_string())
                            .chain([crate::backend::join(&sub.0, "sharedFile")])
                            .collect();
                        let (report, command) = run_ior(&extra)?;
                        add_layout_run(
                            &mut figures,
                            &mut runs,
                            "pfl",
                            label,
                            name,
                            (n as f64, n.to_string()),
                            report,
                            command,
                        );
                    }
                    let _ = driver.rmdir(&sub.1);
                }
            }
            Preset::Tiering => {
                let n = args.max_tasks.unwrap_or(2).max(1);
                let size = args.bytes_per_task(32 << 20);
                let (block, transfer) = (format_size(size), format_size(size.min(1 << 20)));
                let sub = layout_dir(&mut *driver, &work.path, &dir, "tiering", &["-p", "hot"])?;
                let policy = out.join(format!("tier-policy-{}.toml", label.replace(' ', "-")));
                write_file(
                    &policy,
                    &format!(
                        "# braid bench sweep --preset tiering: stage what is read, nothing else\n\
                         hot_pool = \"hot\"\ncool_pool = \"cool\"\nmirror_age_s = 86400\n\
                         high_watermark = 100\nlow_watermark = 99\nscan_interval_ms = 200\n\
                         hot_layout = \"-c 1\"\ncool_layout = \"-c 1\"\nstate = \"tier-state-{}.json\"\n",
                        label.replace(' ', "-")
                    ),
                )?;
                let policy = policy.display().to_string();
                let base = |shared: bool| crate::backend::join(&sub.0, if shared { "shared" } else { "fpp" });
                let files: Vec<String> =
                    std::iter::once(base(true)).chain((0..n).map(|r| format!("{}.{r:08}", base(false)))).collect();
                let ior = |shared: bool, op: &str| -> Result<(ior::IorReport, String)> {
                    let mut extra: Vec<String> = [op, "-k", "-t", &transfer, "-b", &block, "-N", &n.to_string(), "-o"]
                        .iter()
                        .map(|s| s.to_string())
                        .chain([base(shared)])
                        .collect();
                    if !shared {
                        extra.insert(0, "-F".into());
                    }
                    run_ior(&extra)
                };
                for shared in [true, false] {
                    let (report, command) = ior(shared, "-w")?;
                    runs.push(SweepRun { target: format!("{label} write"), command, report: to_json(&report) });
                }
                let mut service: Option<std::process::Child> = None;
                let mut r = Ok(());
                for (i, state) in TIERING_STATES.iter().enumerate() {
                    status(&mut progress, state);
                    let step = match i {
                        1 => {
                            files.iter().try_for_each(|f| braid(&["tier", "purge", "--policy", &policy, f]).map(|_| ()))
                        }
                        2 => tier_service(&policy, &sub.0, out, label).map(|c| service = Some(c)),
                        3 => wait_staged(&files),
                        _ => Ok(()),
                    };
                    if let Err(e) = step {
                        r = Err(e);
                        break;
                    }
                    for (shared, what) in [(true, "shared file"), (false, "file per process")] {
                        let (report, command) = ior(shared, "-r")?;
                        for row in report.summary.iter().filter(|r| r.operation == "read") {
                            let series = format!("{label} {what} read");
                            figures.add("tiering", series, i as f64, state.to_string(), row.bandwidth_mib_s.mean);
                        }
                        runs.push(SweepRun { target: format!("{label} {state}"), command, report: to_json(&report) });
                    }
                }
                if let Some(mut c) = service {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                r?;
                for f in &files {
                    let _ = driver.unlink(&f.replacen(&sub.0, &sub.1, 1));
                }
                let _ = driver.rmdir(&sub.1);
            }
            Preset::Nbd => {}
            Preset::Dom => {
                let n = *task_counts.last().expect("task counts are never empty");
                for (name, setstripe) in [("plain", &[][..]), ("DoM", &["--template", "seed-table5"][..])] {
                    let sub = layout_dir(&mut *driver, &work.path, &dir, name, setstripe)?;
                    for (index, &(case, block, transfer)) in DOM_CASES.iter().enumerate() {
                        status(&mut progress, &format!("{name}: {case}"));
                        let extra: Vec<String> =
                            ["-F", "-w", "-r", "-t", transfer, "-b", block, "-N", &n.to_string(), "-o"]
                                .iter()
                                .map(|s| s.to_string())
                                .chain([crate::backend::join(&sub.0, "testFile")])
                                .collect();
                        let (report, command) = run_ior(&extra)?;
                        add_layout_run(
                            &mut figures,
                            &mut runs,
                            "dom",
                            label,
                            name,
                            (index as f64, case.to_string()),
                            report,
                            command,
                        );
                    }
                    let _ = driver.rmdir(&sub.1);
                }
            }
            Preset::Dne => {
                let n = *task_counts.last().expect("task counts are never empty");
                let items = args.items.unwrap_or(if args.quick { 250 } else { 1000 }).to_string();
                let block = format_size(args.bytes_per_task(32 << 20));
                for (index, &count) in mdt_counts.iter().enumerate() {
                    let name = mdts_label(count);
                    let Some(sub) = striped_dir(&mut *driver, &work.path, &dir, count)? else {
                        progress.clear();
                        eprintln!("sweep dne: {label}: skipped {name} (the file system has fewer MDTs)");
                        continue;
                    };
                    status(&mut progress, &format!("{name}: IOR, {n} tasks"));
                    let extra: Vec<String> = ["-F", "-w", "-r", "-t", "1m", "-b", &block, "-N", &n.to_string(), "-o"]
                        .iter()
                        .map(|s| s.to_string())
                        .chain([crate::backend::join(&sub.0, "testFile")])
                        .collect();
                    let (report, command) = run_ior(&extra)?;
                    for row in &report.summary {
                        let series = format!("{label} {}", row.operation);
                        figures.add("dne-bandwidth", series, index as f64, name.clone(), row.bandwidth_mib_s.mean);
                    }
                    runs.push(SweepRun { target: format!("{label} {name}"), command, report: to_json(&report) });
                    status(&mut progress, &format!("{name}: mdtest, {n} tasks"));
                    let argv: Vec<String> = ["mdtest", "-a", api, "-q", "-F", "-n", &items, "-N", &n.to_string()]
                        .iter()
                        .map(|s| s.to_string())
                        .chain(["-i".into(), iterations.clone(), "-d".into(), crate::backend::join(&sub.0, "mdtest")])
                        .chain(args.drop_caches.then(|| "--drop-caches".to_string()))
                        .collect();
                    let parsed =
                        MdtestArgs::try_parse_from(&argv).map_err(|e| BenchError::Other(format!("internal: {e}")))?;
                    let report = mdtest::execute(&parsed, native, &mut Progress::silent())?;
                    for row in &report.summary {
                        let operation = match row.operation {
                            "File creation" => "create",
                            "File stat" => "stat",
                            "File read" => "read",
                            "File removal" => "remove",
                            _ => continue,
                        };
                        let series = format!("{label} {operation}");
                        figures.add("dne-iops", series, index as f64, name.clone(), row.ops_per_s.mean);
                    }
                    runs.push(SweepRun {
                        target: format!("{label} {name}"),
                        command: format!("braid bench {}", words(&argv)),
                        report: to_json(&report),
                    });
                    let _ = driver.rmdir(&crate::backend::join(&sub.1, "mdtest"));
                    let _ = driver.rmdir(&sub.1);
                }
            }
        }
        // The work directory is removed when the engines left it empty.
        let _ = driver.rmdir(&work.path);
    }
    progress.clear();
    let report = args.report(began, sweep_targets, figures.figures, runs);
    write_outputs(out, &report)?;
    Ok(report)
}

/// The states of the tiering preset's files, in the order they are read.
const TIERING_STATES: [&str; 4] = ["in hot", "in cool", "just purged", "after staging"];

/// Runs this binary (`braid`) with `args`; its stdout.
fn braid(args: &[&str]) -> Result<String> {
    let exe = std::env::current_exe().map_err(|e| BenchError::Other(format!("cannot find this binary: {e}")))?;
    let out = std::process::Command::new(exe)
        .args(args)
        .output()
        .map_err(|e| BenchError::Other(format!("cannot run braid {}: {e}", args.join(" "))))?;
    if !out.status.success() {
        return Err(BenchError::Usage(format!(
            "this preset needs a braid target: `braid {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Starts `braid tier run` over `dir` with `policy`, its log beside the report; the
/// caller kills it (by its PID, through the child).
fn tier_service(policy: &str, dir: &str, out: &Path, label: &str) -> Result<std::process::Child> {
    let exe = std::env::current_exe().map_err(|e| BenchError::Other(format!("cannot find this binary: {e}")))?;
    let log_path = out.join(format!("tier-{}.log", label.replace(' ', "-")));
    let log =
        std::fs::File::create(&log_path).map_err(|e| BenchError::io("create", log_path.display().to_string(), e))?;
    let mut child = std::process::Command::new(exe)
        .args(["tier", "run", "--policy", policy, dir])
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| BenchError::Other(format!("cannot start braid tier run: {e}")))?;
    // Ready once it says so (it has set up the directory and read its state).
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped");
    let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
    if !line.starts_with("tiering") {
        let _ = child.kill();
        let _ = child.wait();
        return Err(BenchError::Other(format!("braid tier run did not start: see {}", log_path.display())));
    }
    Ok(child)
}

/// Waits until every file of `files` has its hot copy back (two mirrors again).
fn wait_staged(files: &[String]) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    for f in files {
        while !braid(&["getstripe", f])?.contains("lcm_mirror_count:  2") {
            if std::time::Instant::now() > deadline {
                return Err(BenchError::Other(format!("{f} was not staged back to hot within 5 minutes")));
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
    Ok(())
}

/// The cases of seed 002's Table 6: (label, IOR block, IOR transfer).
/// The tests of the cache preset's figures, in order.
const CACHE_SEQUENTIAL: [&str; 4] = ["write", "rewrite", "read", "reread"];
const CACHE_RANDOM: [&str; 2] = ["random read", "random write"];

const DOM_CASES: [(&str, &str, &str); 2] = [("1 KiB / 1 KiB", "1k", "1k"), ("1000 KiB / 100 KiB", "1000k", "100k")];

/// Makes the directory `name` (spaces become dashes) in the work directory and, with
/// `setstripe` options (`--template seed-table4`, `-c 1`), gives it that default
/// layout with `braid setstripe` (this binary: the bench runs inside `braid`). Returns
/// its location as the engines take it (a path or URL) and as the driver does.
fn layout_dir(
    driver: &mut dyn crate::backend::FileBackend,
    work_path: &str,
    work_display: &str,
    name: &str,
    setstripe: &[&str],
) -> Result<(String, String)> {
    let leaf = name.replace(' ', "-").to_lowercase();
    let path = crate::backend::join(work_path, &leaf);
    match driver.mkdir(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(BenchError::io("mkdir", &path, e)),
    }
    let display = crate::backend::join(work_display, &leaf);
    if !setstripe.is_empty() {
        let exe = std::env::current_exe().map_err(|e| BenchError::Other(format!("cannot find this binary: {e}")))?;
        let out = std::process::Command::new(exe)
            .arg("setstripe")
            .args(setstripe)
            .arg(&display)
            .output()
            .map_err(|e| BenchError::Other(format!("cannot run braid setstripe: {e}")))?;
        if !out.status.success() {
            return Err(BenchError::Usage(format!(
                "this preset needs a braid target: `braid setstripe {} {display}` failed: {}",
                setstripe.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    Ok((display, path))
}

/// "1 MDT", "2 MDTs", ...
fn mdts_label(n: u32) -> String {
    if n == 1 {
        "1 MDT".into()
    } else {
        format!("{n} MDTs")
    }
}

/// Makes the directory `mdts-N` in the work directory over `count` MDTs from MDT 0
/// with `braid mkdir -c N -i 0` (this binary: the bench runs inside `braid`), as the
/// engines and the driver take it; `None` when the file system has fewer MDTs.
fn striped_dir(
    driver: &mut dyn crate::backend::FileBackend,
    work_path: &str,
    work_display: &str,
    count: u32,
) -> Result<Option<(String, String)>> {
    let leaf = format!("mdts-{count}");
    let (path, display) = (crate::backend::join(work_path, &leaf), crate::backend::join(work_display, &leaf));
    let _ = driver.rmdir(&path);
    let exe = std::env::current_exe().map_err(|e| BenchError::Other(format!("cannot find this binary: {e}")))?;
    let out = std::process::Command::new(exe)
        .args(["mkdir", "-c", &count.to_string(), "-i", "0", &display])
        .output()
        .map_err(|e| BenchError::Other(format!("cannot run braid mkdir: {e}")))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("larger than the number of MDTs") {
        return Ok(None);
    }
    if !out.status.success() {
        return Err(BenchError::Usage(format!(
            "this preset needs a braid target (as root): `braid mkdir -c {count} -i 0 {display}` failed: {}",
            stderr.trim()
        )));
    }
    Ok(Some((display, path)))
}

/// Adds one IOR run made in the directory of layout `layout`: each summary row (write,
/// read) on figure `PREFIX-ROW`, in the series `LABEL LAYOUT`.
#[allow(clippy::too_many_arguments)]
fn add_layout_run(
    figures: &mut Figures,
    runs: &mut Vec<SweepRun>,
    prefix: &str,
    label: &str,
    layout: &str,
    x: (f64, String),
    report: ior::IorReport,
    command: String,
) {
    for row in &report.summary {
        let figure = format!("{prefix}-{}", row.operation);
        if figures.figures.iter().any(|f| f.id == figure) {
            figures.add(&figure, format!("{label} {layout}"), x.0, x.1.clone(), row.bandwidth_mib_s.mean);
        }
    }
    runs.push(SweepRun { target: format!("{label} {layout}"), command, report: to_json(&report) });
}

/// Adds one IOR run of a sweep: a point per summary row (phase) on `figure`, at `x`
/// (value and axis label), and the raw report.
fn add_ior_run(
    figures: &mut Figures,
    runs: &mut Vec<SweepRun>,
    figure: &str,
    label: &str,
    x: (f64, String),
    report: ior::IorReport,
    command: String,
) {
    for row in &report.summary {
        figures.add(figure, format!("{label} {}", row.operation), x.0, x.1.clone(), row.bandwidth_mib_s.mean);
    }
    runs.push(SweepRun { target: label.to_string(), command, report: to_json(&report) });
}

fn to_json(value: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(value).expect("reports serialize")
}

fn write_file(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).map_err(|e| BenchError::io("write", path.display().to_string(), e))
}

/// `results.json`, one SVG per figure and `report.md`.
fn write_outputs(out: &Path, report: &SweepReport) -> Result<()> {
    let json = serde_json::to_string_pretty(report).expect("reports serialize");
    write_file(&out.join("results.json"), &json)?;
    for figure in &report.figures {
        let plot = Plot {
            title: figure.title.clone(),
            x_label: figure.x_label.clone(),
            y_label: figure.y_label.clone(),
            x_axis: figure.x_axis.clone(),
            series: figure
                .series
                .iter()
                .map(|s| Series { label: s.label.clone(), points: s.points.iter().map(|p| (p.x, p.y)).collect() })
                .collect(),
        };
        write_file(&out.join(format!("{}.svg", figure.id)), &svg::render(&plot))?;
    }
    write_file(&out.join("report.md"), &render_markdown(report))
}

/// The Markdown report: what was run where, then each figure with its numbers.
pub fn render_markdown(report: &SweepReport) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# braid bench sweep: {:?}\n", report.preset);
    let _ = writeln!(md, "{}\n", report.description);
    let _ = writeln!(md, "- Date: {}", report.began);
    let _ = writeln!(md, "- Command: `{}`", report.command);
    let _ = writeln!(md, "- Machine: {}", report.machine.describe());
    let _ = writeln!(
        md,
        "- Caches dropped before every phase: {}",
        if report.caches_dropped {
            "yes (sync; echo 3 > /proc/sys/vm/drop_caches)"
        } else {
            "no (reads may be served from the page cache)"
        }
    );
    let _ = writeln!(md, "- Quick mode (--quick, shrunken sizes): {}", if report.quick { "yes" } else { "no" });
    let _ = writeln!(md, "- Raw data: `results.json` (every run's full report)\n");
    let _ = writeln!(md, "| target | location | file system |");
    let _ = writeln!(md, "|---|---|---|");
    for target in &report.targets {
        let _ = writeln!(md, "| {} | `{}` | {} |", target.label, target.location, target.file_system);
    }
    for figure in &report.figures {
        let _ = writeln!(md, "\n## {}\n", figure.title);
        let _ = writeln!(md, "![{}]({}.svg)\n", figure.title, figure.id);
        let mut xs: Vec<(f64, String)> =
            figure.series.iter().flat_map(|s| s.points.iter().map(|p| (p.x, p.x_label.clone()))).collect();
        xs.sort_by(|a, b| a.0.total_cmp(&b.0));
        xs.dedup_by(|a, b| a.0 == b.0);
        let _ = write!(md, "| {} |", figure.x_label);
        for series in &figure.series {
            let _ = write!(md, " {} ({}) |", series.label, figure.y_label);
        }
        let _ = writeln!(md);
        let _ = writeln!(md, "|---|{}", "---:|".repeat(figure.series.len()));
        for (x, x_label) in &xs {
            let _ = write!(md, "| {x_label} |");
            for series in &figure.series {
                match series.points.iter().find(|p| p.x == *x) {
                    Some(p) => {
                        let _ = write!(md, " {} |", svg::format_number(p.y));
                    }
                    None => md.push_str(" |"),
                }
            }
            let _ = writeln!(md);
        }
    }
    let _ = writeln!(md, "\n## Runs\n");
    let _ = writeln!(md, "Each point is one of these commands (run with the target's path):\n");
    for run in &report.runs {
        let _ = writeln!(md, "- {}: `{}`", run.target, run.command);
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> SweepArgs {
        crate::parse_options("sweep", args)
    }

    #[test]
    fn parses_targets_and_values() {
        let args = parse(&["--preset", "tasks", "--target", "a=/x", "--target", "b=braid://h:1/y", "--out", "o"]);
        let targets = args.parse_targets().unwrap();
        assert_eq!(targets[0].0, "a");
        assert_eq!(targets[1].1.api, Api::Native);
        let dup = parse(&["--preset", "tasks", "--target", "a=/x", "--target", "a=/y", "--out", "o"]);
        assert!(dup.parse_targets().unwrap_err().to_string().contains("twice"));
        let bad = parse(&["--preset", "tasks", "--target", "x", "--out", "o"]);
        assert!(bad.parse_targets().is_err());
        let counts = parse(&["--preset", "tasks", "--target", "a=/x", "--out", "o", "--max-tasks", "6"]);
        assert_eq!(counts.task_counts().unwrap(), vec![1, 2, 4, 6]);
        let values = parse(&["--preset", "tasks", "--target", "a=/x", "--out", "o", "--values", "1,3"]);
        assert_eq!(values.task_counts().unwrap(), vec![1, 3]);
        let sizes = parse(&["--preset", "blocksize", "--target", "a=/x", "--out", "o", "--values", "4k,1m"]);
        assert_eq!(sizes.sizes(&[], &[]).unwrap(), vec![4096, 1 << 20]);
        assert!(SweepArgs::try_parse_from(["sweep", "--preset", "nope", "--target", "a=/x", "--out", "o"]).is_err());
        assert!(
            SweepArgs::try_parse_from(["sweep", "--preset", "tasks", "--out", "o"]).is_err(),
            "a target is required"
        );
    }

    #[test]
    fn markdown_has_tables_and_images() {
        let report = SweepReport {
            tool: "braid bench sweep",
            began: "now".into(),
            command: "braid bench sweep".into(),
            machine: Machine::detect(),
            preset: Preset::Tasks,
            description: Preset::Tasks.describe(),
            quick: true,
            caches_dropped: false,
            targets: vec![SweepTarget { label: "local".into(), location: "/x".into(), file_system: "ext4".into() }],
            figures: vec![Figure {
                id: "tasks".into(),
                title: "T".into(),
                x_label: "tasks".into(),
                y_label: "MiB/s".into(),
                x_axis: XAxis::Log2,
                series: vec![FigureSeries {
                    label: "local write".into(),
                    points: vec![
                        FigurePoint { x: 1.0, x_label: "1".into(), y: 10.5 },
                        FigurePoint { x: 2.0, x_label: "2".into(), y: 20.0 },
                    ],
                }],
            }],
            runs: vec![],
        };
        let md = render_markdown(&report);
        assert!(md.contains("![T](tasks.svg)"));
        assert!(md.contains("| 1 | 10.5 |"));
        assert!(md.contains("Caches dropped before every phase: no"));
        assert!(md.contains("cores"));
    }
}
