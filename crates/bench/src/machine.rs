//! What every report must state to be honest: the machine (cores, memory, kernel), the file
//! system under test, the exact command, when it ran, and whether caches were dropped. Also
//! the one privileged action a benchmark takes, dropping the page cache.

use serde::Serialize;

use crate::backend::{Api, Target};

/// What a report of `ior`, `mdtest` and `iozone` opens with: which tool ran, when,
/// how, on what machine, against what. Flattened into each report, so their JSON
/// keeps these fields at the top level.
#[derive(Debug, Clone, Serialize)]
pub struct RunHeader {
    pub tool: &'static str,
    pub began: String,
    pub command: String,
    pub machine: Machine,
    pub target: String,
    pub file_system: String,
    pub caches_dropped: bool,
    pub api: &'static str,
}

impl RunHeader {
    /// The header of a run of `tool` that began at `began` (see [`utc_now`]) against
    /// `target`; the command line and the machine are this process's.
    pub fn new(tool: &'static str, began: String, target: &Target, caches_dropped: bool) -> RunHeader {
        RunHeader {
            tool,
            began,
            command: command_line(),
            machine: Machine::detect(),
            target: target.display(),
            file_system: file_system(target),
            caches_dropped,
            api: target.api.label(),
        }
    }
}

impl RunHeader {
    /// The opening lines of a text report: when, how and where, as `Label : value`
    /// with the labels padded to `width` (each tool's own column).
    pub fn write_opening(&self, out: &mut String, width: usize) {
        use std::fmt::Write;
        let _ = writeln!(out, "{:<width$}: {}", "Began", self.began);
        let _ = writeln!(out, "{:<width$}: {}", "Command line", self.command);
        let _ = writeln!(out, "{:<width$}: {}", "Machine", self.machine.describe());
    }
}

/// The file system under `target`: its type for a path, the native client otherwise.
pub fn file_system(target: &Target) -> String {
    if target.api == Api::Posix {
        fs_type(&target.path)
    } else {
        "braid (native client)".into()
    }
}

/// The machine a benchmark ran on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub hostname: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cores: usize,
    pub memory_bytes: u64,
}

impl Machine {
    pub fn detect() -> Machine {
        let read = |path: &str| {
            std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_else(|_| "unknown".into())
        };
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_bytes = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024);
        Machine {
            hostname: read("/proc/sys/kernel/hostname"),
            kernel: format!(
                "{} {} {}",
                read("/proc/sys/kernel/ostype"),
                read("/proc/sys/kernel/osrelease"),
                std::env::consts::ARCH
            ),
            cpu_model,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_bytes,
        }
    }

    /// One line for text reports.
    pub fn describe(&self) -> String {
        format!(
            "{}, {} cores ({}), {:.1} GiB memory, host {}",
            self.kernel,
            self.cores,
            self.cpu_model,
            self.memory_bytes as f64 / (1u64 << 30) as f64,
            self.hostname
        )
    }
}

/// The command line as typed, quoted so it can be pasted back into a shell.
pub fn command_line() -> String {
    let mut args = std::env::args();
    let program = args
        .next()
        .map(|p| std::path::Path::new(&p).file_name().map_or(p.clone(), |n| n.to_string_lossy().into_owned()));
    program.into_iter().chain(args).map(|a| shell_quote(&a)).collect::<Vec<_>>().join(" ")
}

pub fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty() && arg.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// The file system type of the mount holding `path` (longest mount point prefix in
/// /proc/self/mounts), e.g. `ext4`, `tmpfs`, `fuse.braid`.
pub fn fs_type(path: &str) -> String {
    let absolute = std::fs::canonicalize(path)
        .or_else(|_| std::fs::canonicalize(crate::backend::parent(path)))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| path.to_string());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut best: Option<(usize, String)> = None;
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 3 {
            continue;
        }
        let mount_point = fields[1].replace("\\040", " ");
        let inside = absolute == mount_point || mount_point == "/" || absolute.starts_with(&format!("{mount_point}/"));
        let longer = best.as_ref().is_none_or(|(len, _)| mount_point.len() >= *len);
        if inside && longer {
            best = Some((mount_point.len(), fields[2].to_string()));
        }
    }
    best.map_or_else(|| "unknown".into(), |(_, fs)| fs)
}

/// Now, as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc_now() -> String {
    let seconds = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// Checks up front that caches can be dropped, so a long run does not fail at its first
/// phase.
pub fn check_drop_caches() -> crate::error::Result<()> {
    std::fs::OpenOptions::new().write(true).open("/proc/sys/vm/drop_caches").map(drop).map_err(|e| {
        crate::error::BenchError::Usage(format!("--drop-caches needs root (writing /proc/sys/vm/drop_caches: {e})"))
    })
}

/// `sync; echo 3 > /proc/sys/vm/drop_caches`: page cache, dentries and inodes. On one machine
/// this also empties the caches of servers running on it.
pub fn drop_caches() -> crate::error::Result<()> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")
        .map_err(|e| crate::error::BenchError::io("write", "/proc/sys/vm/drop_caches", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_this_machine() {
        let machine = Machine::detect();
        assert!(machine.cores >= 1);
        assert!(machine.memory_bytes > 0);
        assert!(machine.kernel.contains("Linux"));
        assert!(machine.describe().contains("cores"));
        assert_ne!(fs_type("/"), "unknown");
    }

    #[test]
    fn quotes_for_the_shell() {
        assert_eq!(shell_quote("-b"), "-b");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn utc_dates_look_right() {
        let now = utc_now();
        assert_eq!(now.len(), "2026-11-21 09:42:00 UTC".len(), "{now}");
        assert!(now.starts_with("20"), "{now}");
    }
}
