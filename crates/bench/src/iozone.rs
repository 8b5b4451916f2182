//! `braid bench iozone`: IOzone's record-size x file-size grid. For every file size and every
//! record size that fits in it, one process writes the file, rewrites it, reads it, rereads
//! it, reads and writes it at random records and reads it with a stride (17 records, as seed
//! 000's strided test). A reread shows the client cache; a small record shows per-call cost.
//! Like IOzone without `-t`, it runs in a single process: the driver itself.

use clap::Parser;
use serde::Serialize;

use crate::backend::{read_full_at, write_all_at, AlignedBuf, Api, FileBackend, NativeConnect, OpenFlags, Target};
use crate::clock::{monotonic_ns, seconds_between};
use crate::error::{usage, BenchError, Result};
use crate::machine::{self, RunHeader};
use crate::offsets::{AccessPattern, SplitMix64, TransferOrder};
use crate::progress::Progress;
use crate::units::{format_size, mib_per_s, parse_size};

/// Largest record: one buffer of this size is allocated.
pub const MAX_RECORD_BYTES: u64 = 64 << 20;
/// Most cells in one grid.
pub const MAX_CELLS: usize = 4096;

/// Options of `braid bench iozone`; short names are IOzone's.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "iozone", about = "IOzone-style record size x file size grid")]
pub struct IozoneArgs {
    /// I/O interface: posix (any mounted directory) or native (braid://HOST:PORT/path).
    #[arg(long = "api", value_enum, default_value = "posix")]
    pub api: Api,
    /// Test file (IOzone -f).
    #[arg(short = 'f', long = "file", default_value = "iozone.tmp")]
    pub file: String,
    /// Automatic mode: file sizes from -n to -g and records from -y to -q, doubling (IOzone -a).
    #[arg(short = 'a', long = "auto")]
    pub auto: bool,
    /// File sizes, comma separated (IOzone -s).
    #[arg(short = 's', long = "file-size", value_parser = parse_size, value_delimiter = ',')]
    pub file_sizes: Vec<u64>,
    /// Record sizes, comma separated (IOzone -r).
    #[arg(short = 'r', long = "record-size", value_parser = parse_size, value_delimiter = ',')]
    pub record_sizes: Vec<u64>,
    /// Smallest file in automatic mode (IOzone -n).
    #[arg(short = 'n', long = "min-file-size", value_parser = parse_size, default_value = "64k")]
    pub min_file_bytes: u64,
    /// Largest file in automatic mode (IOzone -g).
    #[arg(short = 'g', long = "max-file-size", value_parser = parse_size, default_value = "512m")]
    pub max_file_bytes: u64,
    /// Smallest record in automatic mode (IOzone -y).
    #[arg(short = 'y', long = "min-record-size", value_parser = parse_size, default_value = "4k")]
    pub min_record_bytes: u64,
    /// Largest record in automatic mode (IOzone -q).
    #[arg(short = 'q', long = "max-record-size", value_parser = parse_size, default_value = "16m")]
    pub max_record_bytes: u64,
    /// Tests: 0 write/rewrite, 1 read/reread, 2 random read/write, 5 stride read (IOzone -i).
    /// Write always runs first, since the others need the file.
    #[arg(short = 'i', long = "test", value_delimiter = ',')]
    pub tests: Vec<u8>,
    /// O_DIRECT (IOzone -I); records and files multiples of 4k.
    #[arg(short = 'I', long = "direct")]
    pub direct: bool,
    /// Include fsync in the write timings (IOzone -e).
    #[arg(short = 'e', long = "fsync")]
    pub fsync: bool,
    /// Stride of the stride read, in records (IOzone -j).
    #[arg(short = 'j', long = "stride", default_value_t = 17)]
    pub stride_records: u64,
    /// Seed of the random record order.
    #[arg(long = "seed", default_value_t = 1)]
    pub seed: u64,
    /// Record size of the random tests, if not the cell's (seed 003's Table 2: 64k
    /// sequential, 4k random records on the same file).
    #[arg(long = "random-record-size", value_parser = parse_size)]
    pub random_record_bytes: Option<u64>,
    /// sync and drop the page cache before every read test (root): reads then come
    /// from the storage (or the SSD cache), not from memory.
    #[arg(long = "drop-caches")]
    pub drop_caches: bool,
    /// Print the results as JSON instead of text.
    #[arg(long = "json")]
    pub json: bool,
    /// No progress display.
    #[arg(long = "quiet")]
    pub quiet: bool,
}

/// The tests of one cell, in IOzone's column order.
const TESTS: [&str; 7] = ["write", "rewrite", "read", "reread", "random read", "random write", "stride read"];

impl IozoneArgs {
    /// The (file size, record size) cells, checked.
    pub fn grid(&self) -> Result<Vec<(u64, u64)>> {
        for test in &self.tests {
            if ![0, 1, 2, 5].contains(test) {
                usage!(
                    "-i {test}: supported tests are 0 (write/rewrite), 1 (read/reread), 2 (random), 5 (stride read)"
                );
            }
        }
        if self.stride_records == 0 {
            usage!("-j must be at least 1 record");
        }
        let doubling = |from: u64, to: u64| {
            let mut sizes = Vec::new();
            let mut size = from.max(1);
            while size <= to {
                sizes.push(size);
                size *= 2;
            }
            sizes
        };
        let (files, records) = if self.auto {
            if !self.file_sizes.is_empty() || !self.record_sizes.is_empty() {
                usage!("-a builds its own grid from -n -g -y -q; leave out -s and -r");
            }
            (doubling(self.min_file_bytes, self.max_file_bytes), doubling(self.min_record_bytes, self.max_record_bytes))
        } else {
            let or_default = |sizes: &Vec<u64>, default: u64| {
                if sizes.is_empty() {
                    vec![default]
                } else {
                    sizes.clone()
                }
            };
            (or_default(&self.file_sizes, 512 << 10), or_default(&self.record_sizes, 4 << 10))
        };
        let mut cells = Vec::new();
        for &file in &files {
            for &record in &records {
                if record == 0 || file == 0 {
                    usage!("sizes must be greater than 0");
                }
                if record > MAX_RECORD_BYTES {
                    usage!("record {} is larger than {}", format_size(record), format_size(MAX_RECORD_BYTES));
                }
                if self.direct && (record % 4096 != 0 || file % 4096 != 0) {
                    if self.auto {
                        continue;
                    }
                    usage!("-I (O_DIRECT) needs records and files that are multiples of 4k");
                }
                if record > file {
                    if self.auto {
                        continue;
                    }
                    usage!("record {} is larger than file {}", format_size(record), format_size(file));
                }
                if file % record != 0 {
                    usage!("file {} is not a whole number of {} records", format_size(file), format_size(record));
                }
                if let Some(r) = self.random_record_bytes {
                    if r == 0 || r > MAX_RECORD_BYTES || file % r != 0 || (self.direct && r % 4096 != 0) {
                        usage!(
                            "--random-record-size {}: the file {} must be a whole number of them (4k multiples with -I)",
                            format_size(r),
                            format_size(file)
                        );
                    }
                }
                cells.push((file, record));
            }
        }
        if cells.is_empty() {
            usage!("the grid is empty (is -n above -g, or -y above -q?)");
        }
        if cells.len() > MAX_CELLS {
            usage!("{} cells: at most {MAX_CELLS}", cells.len());
        }
        Ok(cells)
    }

    fn runs(&self, test: u8) -> bool {
        self.tests.is_empty() || self.tests.contains(&test)
    }
}

/// Bandwidths of one (file, record) cell in MiB/s; `None` for tests not run.
#[derive(Debug, Clone, Serialize)]
pub struct IozoneCell {
    pub file_bytes: u64,
    pub record_bytes: u64,
    pub write: Option<f64>,
    pub rewrite: Option<f64>,
    pub read: Option<f64>,
    pub reread: Option<f64>,
    pub random_read: Option<f64>,
    pub random_write: Option<f64>,
    pub stride_read: Option<f64>,
}

impl IozoneCell {
    pub fn values(&self) -> [Option<f64>; 7] {
        [self.write, self.rewrite, self.read, self.reread, self.random_read, self.random_write, self.stride_read]
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct IozoneReport {
    #[serde(flatten)]
    pub header: RunHeader,
    pub units: &'static str,
    pub options: IozoneArgs,
    pub cells: Vec<IozoneCell>,
}

/// One timed pass over the file: open, every record in `order`, optional fsync, close.
struct Pass<'a> {
    backend: &'a mut dyn FileBackend,
    path: &'a str,
    buffer: &'a mut AlignedBuf,
    direct: bool,
}

impl Pass<'_> {
    fn run(&mut self, write: bool, fsync: bool, order: &TransferOrder, create: bool) -> Result<f64> {
        let record = self.buffer.len() as u64;
        let flags = if write {
            OpenFlags { write: true, create, truncate: create, direct: self.direct, ..OpenFlags::default() }
        } else {
            OpenFlags::read_only().with_direct(self.direct)
        };
        let start = monotonic_ns();
        let file = self.backend.open(self.path, flags).map_err(|e| BenchError::io("open", self.path, e))?;
        for index in order.iter() {
            let offset = index * record;
            if write {
                write_all_at(self.backend, file, self.buffer, offset)
                    .map_err(|e| BenchError::io("write", self.path, e))?;
            } else {
                let got = read_full_at(self.backend, file, self.buffer, offset)
                    .map_err(|e| BenchError::io("read", self.path, e))?;
                if got as u64 != record {
                    return Err(BenchError::Other(format!(
                        "short read of {} at offset {offset}: {got} of {record} bytes",
                        self.path
                    )));
                }
            }
        }
        if write && fsync {
            self.backend.fsync(file).map_err(|e| BenchError::io("fsync", self.path, e))?;
        }
        self.backend.close(file).map_err(|e| BenchError::io("close", self.path, e))?;
        Ok(seconds_between(start, monotonic_ns()))
    }
}

/// Runs the grid described by `args`.
pub fn execute(args: &IozoneArgs, native: Option<NativeConnect>, progress: &mut Progress) -> Result<IozoneReport> {
    let cells = args.grid()?;
    if args.drop_caches {
        machine::check_drop_caches()?;
    }
    let drop_caches = || if args.drop_caches { machine::drop_caches() } else { Ok(()) };
    let target = Target::parse(args.api, &args.file)?;
    let mut backend = target.connect(native)?;
    let began = machine::utc_now();
    let mut results = Vec::with_capacity(cells.len());
    for (n, &(file_bytes, record_bytes)) in cells.iter().enumerate() {
        progress.status(&format!(
            "iozone: cell {}/{}: file {} record {}",
            n + 1,
            cells.len(),
            format_size(file_bytes),
            format_size(record_bytes)
        ));
        let mut buffer = AlignedBuf::new(record_bytes as usize);
        let mut rng = SplitMix64::new(args.seed);
        for byte in buffer.iter_mut() {
            *byte = rng.next_u64() as u8;
        }
        let records = file_bytes / record_bytes;
        let sequential = TransferOrder::new(AccessPattern::Sequential, records);
        let random_record = args.random_record_bytes.unwrap_or(record_bytes);
        let mut random_buffer = AlignedBuf::new(random_record as usize);
        for byte in random_buffer.iter_mut() {
            *byte = rng.next_u64() as u8;
        }
        let random = TransferOrder::new(AccessPattern::Random { seed: args.seed }, file_bytes / random_record);
        let strided = TransferOrder::new(AccessPattern::Strided { stride_transfers: args.stride_records }, records);
        let mut pass = Pass { backend: backend.as_mut(), path: &target.path, buffer: &mut buffer, direct: args.direct };
        let mib = |seconds: f64| Some(mib_per_s(file_bytes, seconds));
        let mut cell = IozoneCell {
            file_bytes,
            record_bytes,
            write: mib(pass.run(true, args.fsync, &sequential, true)?),
            rewrite: None,
            read: None,
            reread: None,
            random_read: None,
            random_write: None,
            stride_read: None,
        };
        if args.runs(0) {
            cell.rewrite = mib(pass.run(true, args.fsync, &sequential, false)?);
        }
        if args.runs(1) {
            drop_caches()?;
            cell.read = mib(pass.run(false, false, &sequential, false)?);
            drop_caches()?;
            cell.reread = mib(pass.run(false, false, &sequential, false)?);
        }
        if args.runs(2) {
            let mut rpass =
                Pass { backend: backend.as_mut(), path: &target.path, buffer: &mut random_buffer, direct: args.direct };
            drop_caches()?;
            cell.random_read = mib(rpass.run(false, false, &random, false)?);
            cell.random_write = mib(rpass.run(true, args.fsync, &random, false)?);
            pass = Pass { backend: backend.as_mut(), path: &target.path, buffer: &mut buffer, direct: args.direct };
        }
        if args.runs(5) {
            drop_caches()?;
            cell.stride_read = mib(pass.run(false, false, &strided, false)?);
        }
        if !args.runs(0) {
            // The write ran to create the file; only report it when asked for.
            cell.write = None;
        }
        backend.unlink(&target.path).map_err(|e| BenchError::io("unlink", &target.path, e))?;
        results.push(cell);
    }
    progress.clear();
    Ok(IozoneReport {
        header: RunHeader::new("braid bench iozone", began, &target, false),
        units: "MiB/s",
        options: args.clone(),
        cells: results,
    })
}

/// IOzone's table: one row per cell, kB/s (KiB per second) as IOzone prints.
pub fn render_text(report: &IozoneReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "braid bench iozone: IOzone-style file size x record size grid");
    report.header.write_opening(&mut out, 15);
    let _ = writeln!(out, "File           : {} ({})", report.header.target, report.header.file_system);
    let _ = writeln!(out, "O_DIRECT       : {}", if report.options.direct { "yes" } else { "no" });
    let _ = writeln!(out, "fsync in write : {}", if report.options.fsync { "yes" } else { "no" });
    let _ = writeln!(out, "Caches dropped : no (reread measures the cache)");
    let _ = writeln!(out, "Units          : kB/s (1 kB = 1024 bytes), as IOzone prints");
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:>12}{:>8}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "", "", "", "", "", "", "random", "random", "stride"
    );
    let _ = writeln!(
        out,
        "{:>12}{:>8}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "kB", "reclen", "write", "rewrite", "read", "reread", "read", "write", "read"
    );
    for cell in &report.cells {
        let _ = write!(out, "{:>12}{:>8}", cell.file_bytes / 1024, cell.record_bytes / 1024);
        for value in cell.values() {
            match value {
                Some(mib) => {
                    let _ = write!(out, "{:>10.0}", mib * 1024.0);
                }
                None => {
                    let _ = write!(out, "{:>10}", "");
                }
            }
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "Columns: {}", TESTS.join(", "));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> IozoneArgs {
        crate::parse_options("iozone", args)
    }

    #[test]
    fn builds_grids() {
        assert_eq!(parse(&[]).grid().unwrap(), vec![(512 << 10, 4 << 10)]);
        let grid = parse(&["-s", "1m,4m", "-r", "4k,1m"]).grid().unwrap();
        assert_eq!(grid.len(), 4);
        let auto = parse(&["-a", "-n", "64k", "-g", "1m", "-y", "4k", "-q", "256k"]).grid().unwrap();
        // files 64k..1m (5 sizes), records 4k..256k (7), record <= file.
        assert!(auto.iter().all(|(f, r)| r <= f));
        assert_eq!(auto.len(), 5 + 6 + 7 + 7 + 7);
        assert!(parse(&["-i", "0,1,2,5"]).grid().is_ok());
    }

    #[test]
    fn refuses_impossible_options() {
        let message = |args: &[&str]| parse(args).grid().unwrap_err().to_string();
        assert!(message(&["-s", "4k", "-r", "8k"]).contains("larger than file"));
        assert!(message(&["-s", "10k", "-r", "4k"]).contains("whole number"));
        assert!(message(&["-I", "-s", "1m", "-r", "1000"]).contains("4k"));
        assert!(message(&["-i", "3"]).contains("supported tests"));
        assert!(message(&["-a", "-s", "1m"]).contains("-a"));
        assert!(message(&["-j", "0"]).contains("-j"));
        assert!(message(&["-a", "-n", "2m", "-g", "1m"]).contains("empty"));
    }
}
