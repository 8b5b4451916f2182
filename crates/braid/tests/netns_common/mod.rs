//! What the tests on separate nodes share: [`NetnsCluster`], a cluster brought up by
//! `scripts/netns-cluster.sh` (each server and client in a network namespace of its
//! own) and torn down by a guard, also when the test fails.

// Each test file that includes this module uses its own part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use testkit::{is_mounted, output_within, stderr, stdout, TempDir};

pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/netns-cluster.sh");
/// The longest one run of the script may take (`up` waits up to 60 s itself).
pub const SCRIPT_WATCHDOG: Duration = Duration::from_secs(150);

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_braid")
}

/// A cluster brought up by the script in a fresh state directory; `down` runs on
/// drop (after the log tails, when the test is failing), then the directory goes.
pub struct NetnsCluster {
    pub state: TempDir,
    pub nodes: BTreeMap<String, String>,
}

impl NetnsCluster {
    /// `up` with `args`. The guard exists before `up` runs: a half-failed `up` is
    /// torn down too. `--tied-to` the test's process: a watcher runs `down` if the
    /// test process dies without unwinding.
    pub fn up(args: &[&str]) -> NetnsCluster {
        let mut c = NetnsCluster { state: TempDir::new("netns"), nodes: BTreeMap::new() };
        let pid = std::process::id().to_string();
        let mut all = vec!["--bin", bin(), "--tied-to", &pid, "--timeout", "60"];
        all.extend_from_slice(args);
        c.ok("up", &all);
        let text = fs::read_to_string(c.state.path().join("nodes")).expect("the nodes file");
        for line in text.lines() {
            let (name, ip) = line.split_once(' ').expect("NAME ADDRESS lines");
            c.nodes.insert(name.to_string(), ip.to_string());
        }
        c
    }

    /// Runs `netns-cluster.sh CMD --state DIR ARGS...`.
    pub fn script(&self, cmd: &str, args: &[&str]) -> Output {
        let mut c = Command::new("bash");
        c.arg(SCRIPT).arg(cmd).arg("--state").arg(self.state.path()).args(args);
        output_within(&mut c, SCRIPT_WATCHDOG).unwrap_or_else(|o| {
            panic!("netns-cluster.sh {cmd} {args:?} still running after {SCRIPT_WATCHDOG:?}: {}", stderr(&o))
        })
    }

    /// The script's stdout; panics with what it said if it failed.
    pub fn ok(&self, cmd: &str, args: &[&str]) -> String {
        let out = self.script(cmd, args);
        assert!(
            out.status.success(),
            "netns-cluster.sh {cmd} {args:?} failed ({}):\n{}{}",
            out.status,
            stdout(&out),
            stderr(&out)
        );
        stdout(&out)
    }

    /// The braid CLI run on `node` (in its network namespace).
    pub fn braid(&self, node: &str, args: &[&str]) -> Output {
        let mut all = vec![node, "--", bin()];
        all.extend_from_slice(args);
        self.script("exec", &all)
    }

    pub fn braid_ok(&self, node: &str, args: &[&str]) -> String {
        let out = self.braid(node, args);
        assert!(out.status.success(), "braid {args:?} on {node} failed: {}{}", stdout(&out), stderr(&out));
        stdout(&out)
    }

    pub fn ip(&self, node: &str) -> &str {
        self.nodes.get(node).unwrap_or_else(|| panic!("no node {node} in {:?}", self.nodes))
    }

    /// `braid://MGS/path`.
    pub fn url(&self, path: &str) -> String {
        format!("braid://{}:9400{path}", self.ip("mgs"))
    }

    /// Mounts the cluster on `node` at a new directory of the state directory.
    pub fn mount(&self, node: &str, opts: &str) -> PathBuf {
        let dir = self.state.path().join(format!("mnt-{node}"));
        let mut args = vec![node, dir.to_str().expect("UTF-8 path")];
        if !opts.is_empty() {
            args.extend_from_slice(&["-o", opts]);
        }
        self.ok("mount", &args);
        assert!(is_mounted(&dir), "{} is not a mount point after mount", dir.display());
        dir
    }

    /// The PID recorded for `name` (a node's server, or `mount-K`).
    pub fn pid(&self, name: &str) -> u32 {
        let text = fs::read_to_string(self.state.path().join(format!("pids/{name}.pid"))).expect("a PID file");
        text.split_whitespace().next().and_then(|p| p.parse().ok()).expect("a PID")
    }

    /// Every namespace the script recorded as its own.
    pub fn namespaces(&self) -> Vec<String> {
        fs::read_to_string(self.state.path().join("namespaces"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for NetnsCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let status = self.script("status", &[]);
            eprintln!("---- netns-cluster.sh status ----\n{}{}", stdout(&status), stderr(&status));
            if let Ok(logs) = fs::read_dir(self.state.path().join("logs")) {
                for log in logs.flatten() {
                    let text = fs::read_to_string(log.path()).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    let tail = lines[lines.len().saturating_sub(30)..].join("\n");
                    eprintln!("---- {} (tail) ----\n{tail}", log.file_name().to_string_lossy());
                }
            }
        }
        let out = self.script("down", &[]);
        if !out.status.success() {
            eprintln!("netns-cluster.sh down failed ({}):\n{}{}", out.status, stdout(&out), stderr(&out));
        }
    }
}

/// When process `pid` started (field 22 of `/proc/PID/stat`), if it runs (a zombie
/// not yet reaped by init does not): tells it from a later process with that PID.
pub fn started(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    match fields.first() {
        Some(&"Z") | Some(&"X") | None => None,
        Some(_) => fields.get(19).map(|s| s.to_string()),
    }
}

/// Whether namespace `ns` exists (`ip netns` keeps them under /run/netns).
pub fn netns_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}
