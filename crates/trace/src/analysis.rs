//! Answers from a stored trace: the one-line-per-operation listing (seed 001's
//! `OPLOG:` lines), exports, and statistics per operation, job, user and file with
//! each file's read pattern and write pattern (the questions Darshan and Lustre's
//! jobstats answer).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use proto::Fid;

use crate::record::Op;
use crate::store::Entry;

/// Which entries a tool looks at; every field set must match.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub job: Option<String>,
    pub uid: Option<u32>,
    pub fid: Option<Fid>,
    pub op: Option<Op>,
    pub client: Option<String>,
    /// Started at or after, nanoseconds since the epoch.
    pub since_ns: Option<u64>,
    /// Started before.
    pub until_ns: Option<u64>,
}

impl Filter {
    pub fn matches(&self, e: &Entry) -> bool {
        let r = &e.record;
        self.job.as_deref().is_none_or(|j| e.job.as_deref() == Some(j))
            && self.uid.is_none_or(|u| r.uid == u)
            && self.fid.is_none_or(|f| r.fid == f)
            && self.op.is_none_or(|o| r.op == o)
            && self.client.as_deref().is_none_or(|c| &*e.client == c)
            && self.since_ns.is_none_or(|t| r.start_ns >= t)
            && self.until_ns.is_none_or(|t| r.start_ns < t)
    }
}

/// Parses a FID as braid prints it, `[0x200000401:0x1:0x0]` (brackets optional).
pub fn parse_fid(s: &str) -> Option<Fid> {
    let s = s.trim().trim_start_matches('[').trim_end_matches(']');
    let mut it = s.split(':').map(|p| {
        let p = p.trim();
        match p.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None => p.parse().ok(),
        }
    });
    let (seq, oid, ver) = (it.next()??, it.next()??, it.next()??);
    if it.next().is_some() {
        return None;
    }
    Some(Fid { seq, oid: u32::try_from(oid).ok()?, ver: u32::try_from(ver).ok()? })
}

fn errno_text(e: u8) -> String {
    if e == 0 {
        "0".into()
    } else {
        format!("-{e}")
    }
}

/// One operation as `braid trace show` prints it: seed 001's `OPLOG:` line (time in
/// seconds and microseconds, handle, operation, offset, length, uid, gid), then what
/// braid records besides.
pub fn oplog_line(e: &Entry) -> String {
    let r = &e.record;
    format!(
        "OPLOG: time[{}]:[{:06}], handle [{}], operation [{}], offset [{}] len [{}] uid [{}] gid [{}] pid [{}] job [{}] client [{}] duration_us [{:.3}] result [{}] target [{}]",
        r.start_ns / 1_000_000_000,
        r.start_ns % 1_000_000_000 / 1_000,
        r.fid,
        r.op.name(),
        r.offset,
        r.len,
        r.uid,
        r.gid,
        r.pid,
        e.job.as_deref().unwrap_or("-"),
        e.client,
        r.dur_ns as f64 / 1_000.0,
        errno_text(r.errno),
        r.target,
    )
}

/// One column of an exported operation: a number, a text, or a text that may be
/// absent (the job).
enum Value {
    Number(u64),
    Text(String),
    Maybe(Option<String>),
}

/// The columns of an exported operation, in order.
fn columns(e: &Entry) -> [(&'static str, Value); 13] {
    use Value::*;
    let r = &e.record;
    [
        ("start_ns", Number(r.start_ns)),
        ("duration_ns", Number(r.dur_ns as u64)),
        ("client", Text(e.client.to_string())),
        ("pid", Number(r.pid as u64)),
        ("job", Maybe(e.job.as_deref().map(str::to_string))),
        ("uid", Number(r.uid as u64)),
        ("gid", Number(r.gid as u64)),
        ("fid", Text(r.fid.to_string())),
        ("op", Text(r.op.name().to_string())),
        ("offset", Number(r.offset)),
        ("len", Number(r.len)),
        ("errno", Number(r.errno as u64)),
        ("target", Text(r.target.to_string())),
    ]
}

pub const CSV_HEADER: &str = "start_ns,duration_ns,client,pid,job,uid,gid,fid,op,offset,len,errno,target";

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One operation as a CSV row (columns as [`CSV_HEADER`]).
pub fn csv_line(e: &Entry) -> String {
    let cells: Vec<String> = columns(e)
        .into_iter()
        .map(|(_, v)| match v {
            Value::Number(n) => n.to_string(),
            Value::Text(t) => csv_field(&t),
            Value::Maybe(t) => csv_field(t.as_deref().unwrap_or("")),
        })
        .collect();
    cells.join(",")
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One operation as a JSON object on one line (JSON Lines).
pub fn json_line(e: &Entry) -> String {
    let fields: Vec<String> = columns(e)
        .into_iter()
        .map(|(name, v)| {
            let v = match v {
                Value::Number(n) => n.to_string(),
                Value::Text(t) => json_string(&t),
                Value::Maybe(t) => t.as_deref().map_or("null".to_string(), json_string),
            };
            format!("\"{name}\":{v}")
        })
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// Darshan's access-size bins.
pub const SIZE_BINS: [(u64, &str); 10] = [
    (100, "0-100"),
    (1 << 10, "100-1K"),
    (10 << 10, "1K-10K"),
    (100 << 10, "10K-100K"),
    (1 << 20, "100K-1M"),
    (4 << 20, "1M-4M"),
    (10 << 20, "4M-10M"),
    (100 << 20, "10M-100M"),
    (1 << 30, "100M-1G"),
    (u64::MAX, "1G+"),
];

fn size_bin(len: u64) -> usize {
    SIZE_BINS.iter().position(|(top, _)| len < *top).unwrap_or(SIZE_BINS.len() - 1)
}

/// Counts, bytes and latencies of a group of operations.
#[derive(Debug, Clone, Default)]
pub struct Group {
    pub ops: u64,
    pub errors: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    durations: Vec<u32>,
}

impl Group {
    fn add(&mut self, e: &Entry) {
        let r = &e.record;
        self.ops += 1;
        self.errors += (r.errno != 0) as u64;
        match r.op {
            Op::Read => self.bytes_read += r.len,
            Op::Write => self.bytes_written += r.len,
            _ => {}
        }
        self.durations.push(r.dur_ns);
    }

    /// The `p`-th percentile (0..=100) of the durations, in nanoseconds.
    pub fn percentile(&mut self, p: f64) -> u32 {
        if self.durations.is_empty() {
            return 0;
        }
        self.durations.sort_unstable();
        let i = ((p / 100.0) * (self.durations.len() - 1) as f64).round() as usize;
        self.durations[i.min(self.durations.len() - 1)]
    }
}

/// How a file was accessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// Each transfer starts where the one before ended.
    Sequential,
    /// Transfers a fixed distance apart (start to start), not adjacent.
    Strided {
        stride: i64,
    },
    Random,
    /// Too few transfers to tell.
    Single,
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pattern::Sequential => write!(f, "sequential"),
            Pattern::Strided { stride } => write!(f, "strided (stride {stride})"),
            Pattern::Random => write!(f, "random"),
            Pattern::Single => write!(f, "single"),
        }
    }
}

/// The pattern of one kind of transfer (reads, or writes) of a file, and how
/// many transfers of that kind it had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    pub pattern: Pattern,
    pub transfers: u64,
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, {} transfers", self.pattern, self.transfers)
    }
}

/// A file's read pattern and write pattern; `None` for a kind it had none of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilePatterns {
    pub read: Option<Access>,
    pub write: Option<Access>,
}

/// Share of transitions that must agree for a pattern to be named.
const PATTERN_SHARE: f64 = 0.8;

/// Classifies one stream of transfers `(offset, len)` in time order.
pub fn classify(transfers: &[(u64, u64)]) -> Pattern {
    if transfers.len() < 2 {
        return Pattern::Single;
    }
    let pairs = transfers.len() - 1;
    let adjacent = transfers.windows(2).filter(|w| w[1].0 == w[0].0 + w[0].1).count();
    if adjacent as f64 >= PATTERN_SHARE * pairs as f64 {
        return Pattern::Sequential;
    }
    let mut strides: HashMap<i64, usize> = HashMap::new();
    for w in transfers.windows(2) {
        *strides.entry(w[1].0 as i64 - w[0].0 as i64).or_default() += 1;
    }
    match strides.into_iter().max_by_key(|&(s, n)| (n, -s.abs())) {
        Some((stride, n)) if stride != 0 && n as f64 >= PATTERN_SHARE * pairs as f64 => Pattern::Strided { stride },
        _ => Pattern::Random,
    }
}

/// One process's reads (or writes) of one file: (file, client, pid, operation).
type StreamKey = (Fid, String, u32, Op);

/// The heading of the file table's read-pattern column.
const READ_PATTERN: &str = "read pattern";

/// What `braid trace stats` reports.
#[derive(Debug, Default)]
pub struct Stats {
    pub first_ns: u64,
    pub last_ns: u64,
    pub by_op: BTreeMap<Op, Group>,
    pub by_job: BTreeMap<String, Group>,
    pub by_uid: BTreeMap<u32, Group>,
    pub by_file: BTreeMap<Fid, Group>,
    /// Reads and writes per access-size bin.
    pub read_sizes: [u64; SIZE_BINS.len()],
    pub write_sizes: [u64; SIZE_BINS.len()],
    /// Each stream's (file, client, pid, op) transfers, in time order.
    streams: HashMap<StreamKey, Vec<(u64, u64, u64)>>,
}

impl Stats {
    pub fn add(&mut self, e: &Entry) {
        let r = &e.record;
        if self.by_op.is_empty() || r.start_ns < self.first_ns {
            self.first_ns = r.start_ns;
        }
        self.last_ns = self.last_ns.max(r.end_ns());
        self.by_op.entry(r.op).or_default().add(e);
        self.by_job.entry(e.job.as_deref().unwrap_or("-").to_string()).or_default().add(e);
        self.by_uid.entry(r.uid).or_default().add(e);
        if r.fid != crate::record::NO_FID {
            self.by_file.entry(r.fid).or_default().add(e);
        }
        if r.op.is_data() && r.errno == 0 {
            let bins = if r.op == Op::Read { &mut self.read_sizes } else { &mut self.write_sizes };
            bins[size_bin(r.len)] += 1;
            self.streams
                .entry((r.fid, e.client.to_string(), r.pid, r.op))
                .or_default()
                .push((r.start_ns, r.offset, r.len));
        }
    }

    /// Each file's access pattern, for its reads and for its writes apart (as
    /// Darshan keeps its read and write counters apart): a file written in order
    /// and then read at random is both, and one pattern for the two would hide one.
    /// Each kind's streams (one process's reads, or writes, of the file) are
    /// classified, and the kind gets the pattern that covers most of its transfers.
    pub fn patterns(&self) -> BTreeMap<Fid, FilePatterns> {
        let mut votes: BTreeMap<(Fid, Op), HashMap<Pattern, u64>> = BTreeMap::new();
        for ((fid, _, _, op), v) in &self.streams {
            let mut v = v.clone();
            v.sort_unstable();
            let transfers: Vec<(u64, u64)> = v.iter().map(|&(_, o, l)| (o, l)).collect();
            *votes.entry((*fid, *op)).or_default().entry(classify(&transfers)).or_default() += transfers.len() as u64;
        }
        let mut files: BTreeMap<Fid, FilePatterns> = BTreeMap::new();
        for ((fid, op), v) in votes {
            let transfers = v.values().sum();
            // Ties go to a named pattern over "single", then to the pattern's text,
            // so the answer does not depend on the hash map's order.
            let (pattern, _) = v
                .into_iter()
                .max_by_key(|(p, n)| (*n, *p != Pattern::Single, std::cmp::Reverse(p.to_string())))
                .expect("a kind with a stream");
            let access = Some(Access { pattern, transfers });
            let file = files.entry(fid).or_default();
            match op {
                Op::Read => file.read = access,
                Op::Write => file.write = access,
                other => unreachable!("only reads and writes have streams, not {}", other.name()),
            }
        }
        files
    }

    /// The report as text.
    pub fn render(&mut self) -> String {
        let mut out = String::new();
        let secs = self.last_ns.saturating_sub(self.first_ns) as f64 / 1e9;
        let total: u64 = self.by_op.values().map(|g| g.ops).sum();
        let _ = writeln!(out, "operations: {total} over {secs:.3} s");
        let table = |out: &mut String, title: &str, rows: Vec<(String, &mut Group)>| {
            let _ = writeln!(
                out,
                "\n{title:<24} {:>10} {:>8} {:>14} {:>14} {:>10} {:>10} {:>10} {:>10}",
                "ops", "errors", "bytes_read", "bytes_written", "p50_us", "p95_us", "p99_us", "max_us"
            );
            for (name, g) in rows {
                let (p50, p95, p99, max) =
                    (g.percentile(50.0), g.percentile(95.0), g.percentile(99.0), g.percentile(100.0));
                let us = |n: u32| n as f64 / 1e3;
                let _ = writeln!(
                    out,
                    "{name:<24} {:>10} {:>8} {:>14} {:>14} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                    g.ops,
                    g.errors,
                    g.bytes_read,
                    g.bytes_written,
                    us(p50),
                    us(p95),
                    us(p99),
                    us(max)
                );
            }
        };
        table(&mut out, "operation", self.by_op.iter_mut().map(|(k, g)| (k.name().to_string(), g)).collect());
        table(&mut out, "job", self.by_job.iter_mut().map(|(k, g)| (k.clone(), g)).collect());
        table(&mut out, "uid", self.by_uid.iter_mut().map(|(k, g)| (k.to_string(), g)).collect());
        let patterns = self.patterns();
        let cell = |a: Option<Access>| a.map_or("-".to_string(), |a| a.to_string());
        let rows: Vec<(&Fid, &Group, String, String)> = self
            .by_file
            .iter()
            .map(|(fid, g)| {
                let p = patterns.get(fid).copied().unwrap_or_default();
                (fid, g, cell(p.read), cell(p.write))
            })
            .collect();
        let read_width = rows.iter().map(|r| r.2.len()).chain([READ_PATTERN.len()]).max().unwrap_or_default();
        let _ = writeln!(
            out,
            "\n{:<32} {:>10} {:>14} {:>14}  {READ_PATTERN:<read_width$}  write pattern",
            "file", "ops", "bytes_read", "bytes_written"
        );
        for (fid, g, read, write) in rows {
            let _ = writeln!(
                out,
                "{:<32} {:>10} {:>14} {:>14}  {read:<read_width$}  {write}",
                fid.to_string(),
                g.ops,
                g.bytes_read,
                g.bytes_written
            );
        }
        let _ = writeln!(out, "\n{:<12} {:>10} {:>10}", "size", "reads", "writes");
        for (i, (_, name)) in SIZE_BINS.iter().enumerate() {
            if self.read_sizes[i] + self.write_sizes[i] > 0 {
                let _ = writeln!(out, "{name:<12} {:>10} {:>10}", self.read_sizes[i], self.write_sizes[i]);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Record, Target, NO_JOB};
    use std::sync::Arc;

    fn entry(op: Op, fid: u32, pid: u32, start: u64, offset: u64, len: u64, job: Option<&str>) -> Entry {
        Entry {
            record: Record {
                start_ns: start,
                dur_ns: 1_000 * (1 + start as u32 % 7),
                pid,
                uid: 1000 + pid % 2,
                gid: 100,
                fid: Fid { seq: 0x200000401, oid: fid, ver: 0 },
                offset,
                len,
                job: NO_JOB,
                op,
                errno: 0,
                target: Target::Ost(0),
            },
            client: Arc::from("n1:/mnt"),
            job: job.map(Arc::from),
        }
    }

    #[test]
    fn patterns_are_told_apart() {
        let seq: Vec<(u64, u64)> = (0..20).map(|i| (i * 4096, 4096)).collect();
        assert_eq!(classify(&seq), Pattern::Sequential);
        let strided: Vec<(u64, u64)> = (0..20).map(|i| (i * 65536, 4096)).collect();
        assert_eq!(classify(&strided), Pattern::Strided { stride: 65536 });
        let backwards: Vec<(u64, u64)> = (0..20).rev().map(|i| (i * 8192, 4096)).collect();
        assert_eq!(classify(&backwards), Pattern::Strided { stride: -8192 });
        let mut x = 7u64;
        let random: Vec<(u64, u64)> = (0..50)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((x >> 20) % 10_000 * 4096, 4096)
            })
            .collect();
        assert_eq!(classify(&random), Pattern::Random);
        assert_eq!(classify(&[(0, 1)]), Pattern::Single);
    }

    #[test]
    fn stats_group_and_classify_per_process_stream() {
        let mut s = Stats::default();
        // Two processes write a shared file in interleaved 1 MiB segments (IOR's
        // strided shared file): each process's stream is strided by 2 MiB.
        for i in 0..10u64 {
            s.add(&entry(Op::Write, 1, 1, i * 10, (2 * i) << 20, 1 << 20, Some("77")));
            s.add(&entry(Op::Write, 1, 2, i * 10 + 5, (2 * i + 1) << 20, 1 << 20, Some("77")));
        }
        // A file read sequentially in 4 KiB transfers by one process.
        for i in 0..30u64 {
            s.add(&entry(Op::Read, 2, 3, 1000 + i, i * 4096, 4096, None));
        }
        s.add(&entry(Op::Open, 2, 3, 999, 0, 0, None));
        let p = s.patterns();
        let strided = Access { pattern: Pattern::Strided { stride: 2 << 20 }, transfers: 20 };
        assert_eq!(p[&fid(1)], FilePatterns { read: None, write: Some(strided) });
        let sequential = Access { pattern: Pattern::Sequential, transfers: 30 };
        assert_eq!(p[&fid(2)], FilePatterns { read: Some(sequential), write: None });
        assert_eq!(s.by_op[&Op::Write].bytes_written, 20 << 20);
        assert_eq!(s.by_op[&Op::Read].ops, 30);
        assert_eq!(s.by_job["77"].ops, 20);
        assert_eq!(s.by_job["-"].ops, 31);
        assert_eq!(s.write_sizes[size_bin(1 << 20)], 20);
        assert_eq!(SIZE_BINS[size_bin(1 << 20)].1, "1M-4M");
        assert_eq!(s.read_sizes[size_bin(4096)], 30);
        let text = s.render();
        assert_eq!(file_row(&text, fid(1)), ("-".into(), "strided (stride 2097152), 20 transfers".into()), "{text}");
        assert_eq!(file_row(&text, fid(2)), ("sequential, 30 transfers".into(), "-".into()), "{text}");
        assert!(text.contains("operations: 51"), "{text}");
        let g = s.by_op.get_mut(&Op::Read).unwrap();
        assert!(g.percentile(50.0) <= g.percentile(99.0));
    }

    fn fid(oid: u32) -> Fid {
        Fid { seq: 0x200000401, oid, ver: 0 }
    }

    /// The read-pattern and write-pattern cells of `fid`'s row in the report's
    /// file table, found under the table's headings.
    fn file_row(text: &str, fid: Fid) -> (String, String) {
        let header = text.lines().find(|l| l.starts_with("file ")).expect("a file table");
        let (read_at, write_at) = (
            header.find("read pattern").expect("a read column"),
            header.find("write pattern").expect("a write column"),
        );
        let row = text.lines().find(|l| l.starts_with(&fid.to_string())).expect("a row for the file");
        (row[read_at..write_at].trim().to_string(), row[write_at..].trim().to_string())
    }

    #[test]
    fn reads_and_writes_of_one_file_have_their_own_patterns() {
        let mut s = Stats::default();
        // One process writes the file in order, 64 KiB at a time (a checkpoint)...
        for i in 0..16u64 {
            s.add(&entry(Op::Write, 7, 4, i, i * 65536, 65536, None));
        }
        // ...and another reads 4 KiB pieces of it at random (an analysis).
        let mut x = 11u64;
        for i in 0..40u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            s.add(&entry(Op::Read, 7, 5, 100 + i, (x >> 20) % 256 * 4096, 4096, None));
        }
        let p = s.patterns()[&fid(7)];
        assert_eq!(p.write, Some(Access { pattern: Pattern::Sequential, transfers: 16 }));
        assert_eq!(p.read, Some(Access { pattern: Pattern::Random, transfers: 40 }));
        // Merged, the file would have one pattern over 56 transfers; each column
        // counts its own kind only.
        let text = s.render();
        assert_eq!(
            file_row(&text, fid(7)),
            ("random, 40 transfers".into(), "sequential, 16 transfers".into()),
            "{text}"
        );
        assert!(!text.contains("56 transfers"), "{text}");
    }

    #[test]
    fn one_process_reading_and_writing_a_file_is_two_streams() {
        // A process that writes a block and reads it back, block after block: one
        // stream of both kinds would see each read land where the write began,
        // neither adjacent nor strided, and call it random.
        let mut s = Stats::default();
        for i in 0..20u64 {
            s.add(&entry(Op::Write, 8, 6, 2 * i, i * 8192, 8192, None));
            s.add(&entry(Op::Read, 8, 6, 2 * i + 1, i * 8192, 8192, None));
        }
        let p = s.patterns()[&fid(8)];
        let sequential = Some(Access { pattern: Pattern::Sequential, transfers: 20 });
        assert_eq!(p, FilePatterns { read: sequential, write: sequential });
    }

    #[test]
    fn lines_filters_and_fids() {
        let mut e = entry(Op::Read, 5, 9, 1_213_067_665_450_805_000, 81920, 4096, Some("job,\"x\""));
        e.record.errno = 2;
        let line = oplog_line(&e);
        assert!(
            line.starts_with("OPLOG: time[1213067665]:[450805], handle [[0x200000401:0x5:0x0]], operation [read], offset [81920] len [4096] uid [1001] gid [100]"),
            "{line}"
        );
        assert!(line.contains("result [-2]"));
        assert_eq!(
            csv_line(&e).split(',').count(),
            CSV_HEADER.split(',').count() + 1,
            "the job quoted, with its comma"
        );
        assert!(csv_line(&e).contains("\"job,\"\"x\"\"\""));
        let j = json_line(&e);
        assert!(j.contains("\"job\":\"job,\\\"x\\\"\""), "{j}");
        let names: Vec<&str> = columns(&e).iter().map(|(n, _)| *n).collect();
        assert_eq!(names.join(","), CSV_HEADER, "the header names the columns in order");
        assert!(j.starts_with("{\"start_ns\":1213067665450805000,") && j.ends_with("\"target\":\"OST0000\"}"), "{j}");
        let mut none = e.clone();
        none.job = None;
        assert!(json_line(&none).contains("\"job\":null"));
        let fid = parse_fid("[0x200000401:0x5:0x0]").unwrap();
        assert_eq!(fid, e.record.fid);
        assert_eq!(parse_fid(&fid.to_string()), Some(fid));
        assert_eq!(parse_fid("1:2"), None);
        assert_eq!(parse_fid("[1:2:0x100000000]"), None);
        let f = Filter { fid: Some(fid), op: Some(Op::Read), job: Some("job,\"x\"".into()), ..Filter::default() };
        assert!(f.matches(&e));
        assert!(!Filter { uid: Some(0), ..Filter::default() }.matches(&e));
        assert!(!Filter { until_ns: Some(e.record.start_ns), ..Filter::default() }.matches(&e));
        assert!(Filter { since_ns: Some(e.record.start_ns), ..Filter::default() }.matches(&e));
    }
}
