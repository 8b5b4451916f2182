//! Test harness for integration tests: starts real `braid mgs`, `braid mds` and
//! `braid oss` processes on 127.0.0.x addresses with temporary directories, kills and
//! restarts them, and runs the CLI against them; or a whole cluster inside the test
//! process ([`InProcessCluster`]) for fast tests of namespace rules through the
//! native client. [`client`] holds what client-side tests share: a runtime, a
//! connected client, errnos out of results.
//!
//! Everything is cleaned up in `Drop` — processes are killed by PID and the directory
//! removed — also when a test panics; a failing test prints the tail of each server's
//! log first.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub mod client;
pub mod in_process;
pub mod tls;

pub use client::{
    client_config, client_errno, code, connect, errno, last_errno, runtime, setlk, within, MountedCluster, WAIT,
};
pub use in_process::{InProcessCluster, InProcessSpec};

/// A directory removed on drop.
pub struct TempDir(PathBuf);

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let base = std::env::var_os("BRAID_TEST_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let p = base.join(format!("braid-{tag}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create test directory");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // BRAID_KEEP_TEST_DIR=1 keeps logs and data for a post-mortem.
        if std::env::var_os("BRAID_KEEP_TEST_DIR").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A free TCP port on `ip` (bound then released).
pub fn free_port(ip: &str) -> u16 {
    TcpListener::bind((ip, 0)).expect("bind a free port").local_addr().expect("local addr").port()
}

/// One server process.
pub struct Server {
    pub name: String,
    pub args: Vec<String>,
    pub log: PathBuf,
    /// Environment variables it is started with (e.g. `BRAID_FAULT`).
    pub env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Server {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    fn kill(&mut self, signal: i32) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: plain kill(2) of a child we started and have not reaped.
            unsafe { libc::kill(c.id() as i32, signal) };
            let _ = c.wait();
        }
    }
}

/// A server that is not in a cluster's table (e.g. one whose restart panicked, not
/// printing "listening on" in time) is still killed.
impl Drop for Server {
    fn drop(&mut self) {
        self.kill(libc::SIGKILL);
    }
}

/// How to shape a test cluster.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    pub mdts: usize,
    /// OSTs per OSS process.
    pub osts_per_oss: Vec<usize>,
    pub heartbeat_ms: u64,
    pub target_timeout_ms: u64,
    /// Extra arguments for the MGS.
    pub mgs_args: Vec<String>,
    /// Extra arguments for the MDS.
    pub mds_args: Vec<String>,
    /// Extra arguments for each OSS.
    pub oss_args: Vec<String>,
    /// Servers run `--insecure` (no cluster secret) instead of with `secret`.
    pub insecure: bool,
    /// Environment of the CLI runs ([`Cluster::braid`]), e.g. `BRAID_TLS_DIR`.
    pub cli_env: Vec<(String, String)>,
    /// More than 1: MDT 0 is served by this many MDS processes replicating it
    /// through Raft (`braid mds --replicas`), named `mds0`, `mds1`, ... instead of
    /// one `mds`.
    pub mdt_replicas: usize,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            mdts: 1,
            osts_per_oss: vec![4],
            heartbeat_ms: 200,
            target_timeout_ms: 1500,
            mgs_args: vec![],
            mds_args: vec![],
            oss_args: vec![],
            insecure: false,
            cli_env: vec![],
            mdt_replicas: 1,
        }
    }
}

/// `BRAID_TEST_ROOT_STRIPES=N` (N > 1) runs the tests' clusters with the root striped
/// over N MDTs (each in its own `braid mds` for [`Cluster`], all in the process for
/// [`LocalCluster`]): the same tests, names spread over MDTs (`scripts/test.sh` runs
/// the mount tests so a second time).
pub fn striped_root() -> usize {
    std::env::var("BRAID_TEST_ROOT_STRIPES").ok().and_then(|v| v.parse().ok()).unwrap_or(1)
}

/// `BRAID_TEST_SHORT_CIRCUIT=1` mounts every separate `braid mount` of the tests with
/// `-o short_circuit`: its reads and writes of objects go through descriptors its
/// OSS hands over (every OSS of a test cluster is on this machine), so the same tests
/// check that path (`scripts/test.sh` runs the mount tests so a second time).
pub fn short_circuit() -> bool {
    std::env::var("BRAID_TEST_SHORT_CIRCUIT").is_ok_and(|v| v == "1")
}

/// The longest a single CLI run may take before a test calls it hung.
pub const CLI_WATCHDOG: Duration = Duration::from_secs(120);

/// Runs `cmd` to completion with stdin closed, killing it (by PID) if it is still
/// running after `timeout`. `Err` carries what it printed until it was killed.
pub fn output_within(cmd: &mut Command, timeout: Duration) -> Result<Output, Output> {
    let mut child = die_with_parent(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a command");
    let collect = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = collect(child.stdout.take().map(|r| Box::new(r) as _));
    let err = collect(child.stderr.take().map(|r| Box::new(r) as _));
    let start = Instant::now();
    let (status, finished) = loop {
        if let Some(st) = child.try_wait().expect("wait for a command") {
            break (st, true);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            break (child.wait().expect("reap a killed command"), false);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = Output { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() };
    if finished {
        Ok(output)
    } else {
        Err(output)
    }
}

/// Makes the child get SIGKILL when the thread that starts it exits (Linux
/// `PR_SET_PDEATHSIG`), so servers never outlive a test process that is itself killed
/// (a timeout, Ctrl-C) before its `Drop` runs. Start long-lived processes from the
/// test's own thread, not from a helper thread that ends first.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure only calls prctl(2), which is
    // async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// A command's stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command's stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Polls `ready` every 100 ms until it holds; panics after `timeout` saying `what`
/// was never reached. For state that changes asynchronously (heartbeats, queues).
pub fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A long-running process (e.g. `braid local`) killed by PID on drop. It is ready
/// once it printed a line containing the marker given to [`Daemon::start`].
pub struct Daemon {
    pub log: PathBuf,
    /// Lines the process printed on stdout before it became ready.
    pub banner: Vec<String>,
    child: Option<Child>,
}

impl Daemon {
    /// Starts `bin args` with stderr into `log` and waits (up to 30 s) for `marker`
    /// on stdout. `Err` holds the log when it exits or stays silent instead.
    pub fn start(bin: &Path, args: &[&str], env: &[(&str, &Path)], log: &Path, marker: &str) -> Result<Daemon, String> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("open log");
        let mut cmd = Command::new(bin);
        cmd.args(args).env_remove("BRAID_SECRET_FILE").env("BRAID_LOG", "debug");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = die_with_parent(&mut cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(file)
            .spawn()
            .expect("start a daemon");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        let marker = marker.to_string();
        std::thread::spawn(move || {
            let mut banner = Vec::new();
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !sent {
                    let done = line.contains(&marker);
                    banner.push(line);
                    if done {
                        let _ = tx.send(std::mem::take(&mut banner));
                        sent = true;
                    }
                }
            }
        });
        let mut d = Daemon { log: log.to_path_buf(), banner: Vec::new(), child: Some(child) };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(banner) => {
                d.banner = banner;
                Ok(d)
            }
            Err(_) => {
                d.kill(libc::SIGKILL);
                Err(tail(log))
            }
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Sends `signal` and reaps the process.
    pub fn kill(&mut self, signal: i32) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: plain kill(2) of a child we started and have not reaped.
            unsafe { libc::kill(c.id() as i32, signal) };
            let _ = c.wait();
        }
    }

    /// Sends SIGTERM, as `systemctl stop` does, and returns how the process exited
    /// within `grace`; `None` if it had not, and was then SIGKILLed (by PID).
    pub fn terminate(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let c = self.child.as_mut()?;
        // SAFETY: plain kill(2) of a child we started and have not reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < grace {
            if let Ok(Some(status)) = c.try_wait() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill(libc::SIGKILL);
        None
    }

    /// Sends SIGTERM and waits up to `grace` for the process to exit, then SIGKILLs it
    /// (by PID) and reaps it: a process that hangs on its way out never hangs a test.
    pub fn stop(&mut self, grace: Duration) {
        let Some(c) = self.child.as_mut() else { return };
        // SAFETY: plain kill(2) of a child we started and have not reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while matches!(c.try_wait(), Ok(None)) && start.elapsed() < grace {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill(libc::SIGKILL);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- daemon log (tail) ----\n{}", tail(&self.log));
        }
        self.kill(libc::SIGKILL);
    }
}

/// A cluster of real processes.
pub struct Cluster {
    pub bin: PathBuf,
    pub dir: TempDir,
    pub mgs_addr: String,
    pub secret: PathBuf,
    pub spec: ClusterSpec,
    pub servers: BTreeMap<String, Server>,
    next_ip: u8,
}

impl Cluster {
    /// Starts an MGS, one MDS and the OSSs of `spec`, and waits until every OST is up
    /// and the MDS places new files on OSTs.
    pub fn start(bin: &Path, spec: ClusterSpec) -> Cluster {
        let osts = spec.osts_per_oss.iter().sum();
        let mut c = Cluster::start_unready(bin, spec);
        c.wait_placement(osts, Duration::from_secs(30));
        let striped = striped_root();
        if striped > 1 && c.spec.mdts == 1 {
            // The same tests over a root striped over several MDTs, each in its own MDS.
            for k in 1..striped {
                let dir = c.dir.path().join(format!("mdt{k}"));
                c.add_mds(&format!("mds{k}"), std::slice::from_ref(&dir));
            }
            c.wait_mdts_up(striped, WAIT);
            wait_for("the root to be striped", WAIT, || {
                c.braid(&["getdirstripe", "-c", &c.url("/")]).stdout.starts_with(striped.to_string().as_bytes())
            });
        }
        c
    }

    /// Like [`Cluster::start`] without waiting for the MDS to learn the OST list:
    /// for tests of what clients see while a cluster comes up.
    pub fn start_unready(bin: &Path, spec: ClusterSpec) -> Cluster {
        let dir = TempDir::new("cluster");
        let secret = dir.path().join("cluster.secret");
        let out = Command::new(bin).arg("gen-secret").arg(&secret).output().expect("run braid gen-secret");
        assert!(out.status.success(), "gen-secret failed: {}", String::from_utf8_lossy(&out.stderr));
        let mgs_addr = format!("127.0.0.2:{}", free_port("127.0.0.2"));
        let mut c = Cluster {
            bin: bin.to_path_buf(),
            dir,
            mgs_addr,
            secret,
            spec: spec.clone(),
            servers: BTreeMap::new(),
            next_ip: 3,
        };
        let mgs_data = c.dir.path().join("mgs");
        let mut args = vec!["mgs".to_string(), "--listen".into(), c.mgs_addr.clone(), "--data".into(), path(&mgs_data)];
        args.extend(["--target-timeout-ms".into(), spec.target_timeout_ms.to_string()]);
        args.extend(spec.mgs_args.iter().cloned());
        c.add_server("mgs", args);
        if spec.mdt_replicas > 1 {
            c.add_replicas(spec.mdt_replicas);
        } else {
            c.add_single_mds();
        }
        let mut ost = 0;
        for (i, n) in spec.osts_per_oss.iter().enumerate() {
            let dirs: Vec<PathBuf> = (ost..ost + n).map(|k| c.dir.path().join(format!("ost{k}"))).collect();
            ost += n;
            c.add_oss(&format!("oss{i}"), &dirs);
        }
        c.wait_osts_up(ost, Duration::from_secs(30));
        c
    }

    /// The MDS of [`ClusterSpec::mdts`] MDTs, named `mds`.
    fn add_single_mds(&mut self) {
        let spec = self.spec.clone();
        let c = self;
        let mut args = c.role_args("mds");
        for i in 0..spec.mdts {
            args.extend(["--mdt".into(), path(&c.dir.path().join(format!("mdt{i}")))]);
        }
        args.extend(spec.mds_args.iter().cloned());
        if striped_root() > 1 && spec.mdts == 1 {
            args.extend(["--root-stripes".into(), striped_root().to_string()]);
        }
        c.add_server("mds", args);
    }

    /// `n` MDS processes replicating MDT 0, `mds0` to `mds{n-1}`, each on its own
    /// address with its own directory (`mdt0-r{k}`); replica 0 forms the group.
    fn add_replicas(&mut self, n: usize) {
        let args: Vec<Vec<String>> = (0..n).map(|_| self.role_args("mds")).collect();
        let listen = |a: &Vec<String>| a[a.iter().position(|x| x == "--listen").expect("--listen") + 1].clone();
        let list = args.iter().map(listen).collect::<Vec<_>>().join(",");
        for (k, mut a) in args.into_iter().enumerate() {
            a.extend(["--mdt".into(), path(&self.dir.path().join(format!("mdt0-r{k}")))]);
            a.extend(["--replicas".into(), list.clone()]);
            a.extend(self.spec.mds_args.iter().cloned());
            self.add_server(&format!("mds{k}"), a);
        }
    }

    /// The replica that serves the replicated MDT now (the last to log that it
    /// serves it, among those running), waiting up to `timeout` for one.
    pub fn mdt_leader(&mut self, timeout: Duration) -> String {
        let start = Instant::now();
        loop {
            let mut best: Option<(String, String)> = None;
            for k in 0..self.spec.mdt_replicas {
                let name = format!("mds{k}");
                if !self.alive(&name) {
                    continue;
                }
                let log = self.log_text(&name);
                let last_start = log.rfind("MDS replica ").unwrap_or(0);
                // "served by this replica term=N" after this process's last start.
                if let Some(line) = log[last_start..].lines().rev().find(|l| l.contains("served by this replica")) {
                    let term = line.rsplit("term=").next().unwrap_or("0").trim().to_string();
                    let newer = best
                        .as_ref()
                        .is_none_or(|(_, t)| term.parse::<u64>().unwrap_or(0) > t.parse::<u64>().unwrap_or(0));
                    if newer {
                        best = Some((name, term));
                    }
                }
            }
            if let Some((name, _)) = best {
                return name;
            }
            assert!(start.elapsed() < timeout, "no replica serves the MDT after {timeout:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn role_args(&mut self, role: &str) -> Vec<String> {
        let ip = format!("127.0.0.{}", self.next_ip);
        self.next_ip += 1;
        let listen = format!("{ip}:{}", free_port(&ip));
        vec![
            role.to_string(),
            "--listen".into(),
            listen,
            "--mgs".into(),
            self.mgs_addr.clone(),
            "--heartbeat-ms".into(),
            self.spec.heartbeat_ms.to_string(),
        ]
        .into_iter()
        .chain(self.secret_args())
        .collect()
    }

    /// How a server gets the cluster's secret, or runs without one.
    fn secret_args(&self) -> Vec<String> {
        if self.spec.insecure {
            vec!["--insecure".into()]
        } else {
            vec!["--secret-file".into(), path(&self.secret)]
        }
    }

    /// Starts an OSS process named `name` serving `dirs`.
    pub fn add_oss(&mut self, name: &str, dirs: &[PathBuf]) {
        let osts: Vec<String> = dirs.iter().map(|d| path(d)).collect();
        self.add_oss_with(name, &osts);
    }

    /// Starts an OSS process named `name` with these `--ost` arguments (a directory,
    /// or one with an emulated medium: `DIR:class=hdd,bw=50M`).
    pub fn add_oss_with(&mut self, name: &str, osts: &[String]) {
        let mut args = self.role_args("oss");
        for o in osts {
            args.extend(["--ost".into(), o.clone()]);
        }
        args.extend(self.spec.oss_args.iter().cloned());
        self.add_server(name, args);
    }

    fn add_server(&mut self, name: &str, mut args: Vec<String>) {
        if name == "mgs" {
            args.extend(self.secret_args());
        }
        let log = self.dir.path().join(format!("{name}.log"));
        let mut s = Server { name: name.to_string(), args, log, env: vec![], child: None };
        // The port was free when chosen, but another process may have taken it since
        // (tests run side by side): a first start gets another port.
        for attempt in 1.. {
            match self.try_spawn(&mut s) {
                Ok(()) => break,
                Err(log) if attempt < 5 && log.contains("Address already in use") => {
                    s.kill(libc::SIGKILL);
                    let i = s.args.iter().position(|a| a == "--listen").expect("servers are started with --listen");
                    let ip = s.args[i + 1].rsplit_once(':').map(|(ip, _)| ip.to_string()).expect("IP:PORT");
                    s.args[i + 1] = format!("{ip}:{}", free_port(&ip));
                    if name == "mgs" {
                        self.mgs_addr = s.args[i + 1].clone();
                    }
                }
                Err(log) => panic!("{name} did not start; log:\n{log}"),
            }
        }
        self.servers.insert(name.to_string(), s);
    }

    fn spawn(&self, s: &mut Server) {
        if let Err(log) = self.try_spawn(s) {
            panic!("{} did not start; log:\n{log}", s.name);
        }
    }

    /// Starts server `s`; the tail of its log if it did not come up.
    fn try_spawn(&self, s: &mut Server) -> Result<(), String> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&s.log).expect("open log");
        let mut child = die_with_parent(&mut Command::new(&self.bin))
            .args(&s.args)
            .env("BRAID_LOG", "debug")
            .envs(s.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start braid server");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.contains("listening on") {
                    let _ = tx.send(line);
                }
            }
        });
        s.child = Some(child);
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(_) => Ok(()),
            Err(_) => Err(tail(&s.log)),
        }
    }

    /// Kills a server with SIGKILL.
    pub fn kill(&mut self, name: &str) {
        self.servers.get_mut(name).unwrap_or_else(|| panic!("no server {name}")).kill(libc::SIGKILL);
    }

    /// Stops a server with SIGTERM.
    pub fn stop(&mut self, name: &str) {
        self.servers.get_mut(name).unwrap_or_else(|| panic!("no server {name}")).kill(libc::SIGTERM);
    }

    /// Starts another MDS process, named `name`, serving new MDTs in `dirs` (their
    /// indices come from the MGS, in registration order).
    pub fn add_mds(&mut self, name: &str, dirs: &[PathBuf]) {
        let mut args = self.role_args("mds");
        for d in dirs {
            args.extend(["--mdt".into(), path(d)]);
        }
        args.extend(self.spec.mds_args.iter().cloned());
        self.add_server(name, args);
    }

    /// A cluster of two MDTs in separate processes: an MGS, an OSS, MDT 0 in process
    /// `mds` and MDT 1 in process `mds1`; and the two MDTs' directories.
    pub fn start_two_mdts(bin: &Path) -> (Cluster, Vec<PathBuf>) {
        let mut c = Cluster::start(bin, ClusterSpec::default());
        let mdt1 = c.dir.path().join("mdt1");
        c.add_mds("mds1", std::slice::from_ref(&mdt1));
        c.wait_mdts_up(2, WAIT);
        let mdts = vec![c.dir.path().join("mdt0"), mdt1];
        (c, mdts)
    }

    /// `braid check-namespace` over the MDT directories `mdts` (their MDSs stopped).
    pub fn check_namespace(&self, mdts: &[PathBuf]) -> Output {
        let mut args = vec!["check-namespace".to_string()];
        for m in mdts {
            args.extend(["--mdt".into(), path(m)]);
        }
        self.braid(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Of a [`Cluster::start_two_mdts`]: stops both MDSs, runs the namespace checker,
    /// and starts them again; the checker's output, or what it found.
    pub fn check_two_mdts(&mut self, mdts: &[PathBuf]) -> Result<String, String> {
        self.stop("mds");
        self.stop("mds1");
        let out = self.check_namespace(mdts);
        self.restart("mds");
        self.restart("mds1");
        self.wait_mdts_up(2, WAIT);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        match out.status.success() {
            true => Ok(text),
            false => Err(format!("{text}{}", stderr(&out))),
        }
    }

    /// [`Cluster::check_two_mdts`] passes within `timeout` (a half a crash left
    /// undecided settles once its participant asks the coordinator).
    pub fn two_mdts_consistent_within(&mut self, mdts: &[PathBuf], timeout: Duration) {
        let start = Instant::now();
        loop {
            match self.check_two_mdts(mdts) {
                Ok(_) => return,
                Err(e) if start.elapsed() > timeout => panic!("the namespace is not consistent:\n{e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }

    /// The environment server `name` gets from its next (re)start on: `value` for
    /// `key`, or without `key` for `None`.
    pub fn set_env(&mut self, name: &str, key: &str, value: Option<&str>) {
        let s = self.servers.get_mut(name).unwrap_or_else(|| panic!("no server {name}"));
        s.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            s.env.push((key.to_string(), v.to_string()));
        }
    }

    /// Waits until server `name` exits by itself (e.g. killed at a fault point);
    /// whether it did within `timeout`.
    pub fn wait_exit(&mut self, name: &str, timeout: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if !self.alive(name) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Waits until `braid df` lists `n` MDTs, all up.
    pub fn wait_mdts_up(&self, n: usize, timeout: Duration) {
        let start = Instant::now();
        loop {
            let out = self.braid(&["df", &self.url("/"), "--timeout-s", "5"]);
            let text = String::from_utf8_lossy(&out.stdout);
            let up = text.lines().filter(|l| l.contains("[MDT:") && !l.contains(" : ")).count();
            if out.status.success() && up >= n {
                return;
            }
            if start.elapsed() > timeout {
                panic!("only {up} of {n} MDTs up after {timeout:?}:\n{text}{}", String::from_utf8_lossy(&out.stderr));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts a killed server again with the same arguments (same address and data).
    pub fn restart(&mut self, name: &str) {
        let mut s = self.servers.remove(name).unwrap_or_else(|| panic!("no server {name}"));
        s.kill(libc::SIGKILL);
        self.spawn(&mut s);
        self.servers.insert(name.to_string(), s);
    }

    /// What server `name` has logged so far.
    pub fn log_text(&self, name: &str) -> String {
        let s = self.servers.get(name).unwrap_or_else(|| panic!("no server {name}"));
        std::fs::read_to_string(&s.log).unwrap_or_default()
    }

    /// The arguments server `name` runs with.
    pub fn server_args(&self, name: &str) -> Vec<String> {
        self.servers.get(name).unwrap_or_else(|| panic!("no server {name}")).args.clone()
    }

    /// Changes the arguments server `name` gets from its next (re)start on.
    pub fn edit_args(&mut self, name: &str, edit: impl FnOnce(&mut Vec<String>)) {
        edit(&mut self.servers.get_mut(name).unwrap_or_else(|| panic!("no server {name}")).args);
    }

    /// The address server `name` listens on.
    pub fn addr(&self, name: &str) -> String {
        let s = self.servers.get(name).unwrap_or_else(|| panic!("no server {name}"));
        let i = s.args.iter().position(|a| a == "--listen").expect("servers are started with --listen");
        s.args[i + 1].clone()
    }

    /// Whether server `name` is running (started and not exited).
    pub fn alive(&mut self, name: &str) -> bool {
        let s = self.servers.get_mut(name).unwrap_or_else(|| panic!("no server {name}"));
        match s.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The PIDs of every running server.
    pub fn pids(&self) -> Vec<u32> {
        self.servers.values().filter_map(Server::pid).collect()
    }

    /// Runs the CLI with the cluster's secret. A run that outlives
    /// [`CLI_WATCHDOG`] is killed and fails the test: no test hangs forever.
    pub fn braid(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args).env("BRAID_SECRET_FILE", &self.secret);
        cmd.envs(self.spec.cli_env.iter().map(|(k, v)| (k, v)));
        output_within(&mut cmd, CLI_WATCHDOG)
            .unwrap_or_else(|o| panic!("braid {args:?} still running after {CLI_WATCHDOG:?}: {}", stderr(&o)))
    }

    /// Runs the CLI and returns stdout, panicking with stderr on failure.
    pub fn braid_ok(&self, args: &[&str]) -> String {
        let out = self.braid(args);
        assert!(
            out.status.success(),
            "braid {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Uploads `data` to `remote` (a path inside the file system) with `braid cp`.
    pub fn put(&self, remote: &str, data: &[u8]) {
        let local = self.scratch(remote);
        std::fs::write(&local, data).expect("write a local file");
        self.braid_ok(&["cp", &path(&local), &self.url(remote)]);
        let _ = std::fs::remove_file(&local);
    }

    /// Downloads `remote` with `braid cp` and returns its bytes.
    pub fn get(&self, remote: &str) -> Vec<u8> {
        let local = self.scratch(remote);
        self.braid_ok(&["cp", &self.url(remote), &path(&local)]);
        let data = std::fs::read(&local).expect("read a downloaded file");
        let _ = std::fs::remove_file(&local);
        data
    }

    /// A fresh local file name under the cluster directory.
    fn scratch(&self, remote: &str) -> PathBuf {
        let name: String = remote.chars().map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' }).collect();
        self.dir.path().join(format!("scratch-{}-{name}", COUNTER.fetch_add(1, Ordering::Relaxed)))
    }

    /// `braid://MGS/path`.
    pub fn url(&self, p: &str) -> String {
        format!("braid://{}{}", self.mgs_addr, p)
    }

    /// Waits until `braid df` shows `n` OSTs without an error.
    pub fn wait_osts_up(&self, n: usize, timeout: Duration) {
        let start = Instant::now();
        loop {
            let out = self.braid(&["df", &self.url("/"), "--timeout-s", "5"]);
            let text = String::from_utf8_lossy(&out.stdout);
            let up = text.lines().filter(|l| l.contains("[OST:") && !l.contains(" : ")).count();
            if out.status.success() && up >= n {
                return;
            }
            if start.elapsed() > timeout {
                panic!("only {up} of {n} OSTs up after {timeout:?}:\n{text}{}", String::from_utf8_lossy(&out.stderr));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the MDS places a new all-OST file on `osts` OSTs: it learns them
    /// from the MGS a heartbeat interval after they register. Each probe is a fresh
    /// CLI client with a short timeout; the probe file is removed again.
    pub fn wait_placement(&self, osts: usize, timeout: Duration) {
        let probe = self.url("/.testkit-probe");
        let start = Instant::now();
        loop {
            let out = self.braid(&["setstripe", "-c", "-1", "--timeout-s", "1", &probe]);
            let mut placed = 0;
            if out.status.success() {
                let layout = self.braid_ok(&["getstripe", &probe]);
                placed = getstripe_objects(&layout).len();
                self.braid_ok(&["rm", &probe]);
                if placed == osts {
                    return;
                }
            }
            if start.elapsed() > timeout {
                panic!("the MDS placed a file on {placed} of {osts} OSTs after {timeout:?}: {}", stderr(&out));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The directory of OST `i` (as started by [`Cluster::start`]).
    pub fn ost_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("ost{i}"))
    }

    /// Every object file under OST `i`.
    pub fn ost_objects(&self, i: usize) -> Vec<PathBuf> {
        objects_in(&self.ost_dir(i))
    }
}

/// Every object file under the OST directory `ost`.
pub fn objects_in(ost: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(buckets) = std::fs::read_dir(ost.join("objects")) else {
        return out;
    };
    for b in buckets.flatten() {
        if let Ok(files) = std::fs::read_dir(b.path()) {
            out.extend(files.flatten().map(|f| f.path()));
        }
    }
    out.sort();
    out
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let failing = std::thread::panicking();
        for s in self.servers.values_mut() {
            s.kill(libc::SIGKILL);
            if failing {
                eprintln!("---- {} log (tail) ----\n{}", s.name, tail(&s.log));
            }
        }
    }
}

/// `len` bytes that differ from any other (offset, seed) pair: a misplaced stripe
/// cannot go unnoticed.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

/// The `(obdidx, objid)` rows of `braid getstripe` output for a plain layout.
pub fn getstripe_objects(text: &str) -> Vec<(u32, u64)> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.contains("obdidx") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let cols: Vec<&str> = line.split_whitespace().collect();
        match (cols.first().map(|c| c.parse()), cols.get(1).map(|c| c.parse())) {
            (Some(Ok(ost)), Some(Ok(objid))) => rows.push((ost, objid)),
            _ => in_table = false,
        }
    }
    rows
}

/// The value after `key` in `key: value` output lines (first occurrence).
pub fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let l = l.trim_start();
        l.strip_prefix(key).and_then(|rest| rest.strip_prefix(':')).map(str::trim)
    })
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn tail(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

// ---------------------------------------------------------------------------------------
// FUSE mounts for tests (`braid mount -f` as a child process).
// ---------------------------------------------------------------------------------------

/// A real FUSE mount of a test cluster: `braid mount -f URL DIR --secret-file S -o OPTS`
/// runs as a child process. Dropping it unmounts (`braid umount`, then `fusermount3 -uz`),
/// kills the mount process by PID and removes the directory, also when a test panics.
pub struct Mount {
    /// The mount point (a fresh empty directory).
    pub dir: PathBuf,
    pub log: PathBuf,
    bin: PathBuf,
    child: Option<Child>,
}

/// Whether `dir` is a mount point now, per `/proc/self/mountinfo`.
pub fn is_mounted(dir: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = dir.to_string_lossy().replace('\\', "\\134").replace(' ', "\\040");
    text.lines().any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

impl Mount {
    /// Mounts `cluster` with `-o opts` (empty for none) and waits (up to 30 s) until the
    /// mount shows in `/proc/self/mountinfo`.
    pub fn new(cluster: &Cluster, opts: &str) -> Mount {
        Mount::of(&cluster.bin, &cluster.url("/"), &cluster.secret, cluster.dir.path(), opts)
    }

    /// Mounts the cluster at `url` (whose secret file is `secret`) on a fresh
    /// directory under `work`, with `-o opts` (empty for none), and `short_circuit`
    /// too when [`short_circuit`] says so.
    pub fn of(bin: &Path, url: &str, secret: &Path, work: &Path, opts: &str) -> Mount {
        let with_sc;
        let opts = if short_circuit() && !opts.split(',').any(|o| o.starts_with("short_circuit")) {
            with_sc = if opts.is_empty() { "short_circuit".to_string() } else { format!("{opts},short_circuit") };
            with_sc.as_str()
        } else {
            opts
        };
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = work.join(format!("mnt{n}"));
        std::fs::create_dir_all(&dir).expect("create mount point");
        // Mount points must not be under another mount's view only: canonicalize.
        let dir = std::fs::canonicalize(&dir).expect("canonical mount point");
        let log = work.join(format!("mount{n}.log"));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("open mount log");
        let mut cmd = Command::new(bin);
        cmd.arg("mount").arg("-f").arg(url).arg(&dir).arg("--secret-file").arg(secret);
        if !opts.is_empty() {
            cmd.arg("-o").arg(opts);
        }
        let child = cmd
            .env("BRAID_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start braid mount");
        let mut m = Mount { dir, log, bin: bin.to_path_buf(), child: Some(child) };
        let start = Instant::now();
        while !is_mounted(&m.dir) {
            if let Some(st) = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("braid mount exited with {st}:\n{}", tail(&m.log));
            }
            if start.elapsed() > Duration::from_secs(30) {
                panic!("mount not ready after 30 s:\n{}", tail(&m.log));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    /// A path inside the mount (`rel` without a leading slash).
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Sends `signal` to the mount process without waiting for it.
    pub fn signal(&self, signal: i32) {
        if let Some(c) = &self.child {
            // SAFETY: plain kill(2) of a child we started and have not reaped.
            unsafe { libc::kill(c.id() as i32, signal) };
        }
    }

    /// Waits up to `timeout` for the mount process to exit; its status if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        loop {
            let c = self.child.as_mut()?;
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                return Some(st);
            }
            if start.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs the mount process (a client that dies) and reaps it. The mount point
    /// stays (as ENOTCONN) until dropped.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: plain kill(2) of a child we started and have not reaped.
            unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
            let _ = c.wait();
        }
    }

    /// Runs `braid umount` on the mount point; `Err` holds its message, or says it
    /// was killed after 30 s.
    pub fn umount(&self) -> Result<(), String> {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("umount").arg(&self.dir);
        run_bounded(&mut cmd, Duration::from_secs(30))
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- mount {} log (tail) ----\n{}", self.dir.display(), tail(&self.log));
        }
        if is_mounted(&self.dir) {
            let _ = self.umount();
        }
        detach_mount(&self.dir);
        if let Some(c) = self.child.as_mut() {
            // A cleanly unmounted session exits by itself; give it a moment.
            let start = Instant::now();
            while matches!(c.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.kill();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Detaches a mount still on `dir` (`fusermount3 -uz`, then `umount2(MNT_DETACH)`),
/// for cleanup after a mount process that did not unmount by itself.
pub fn detach_mount(dir: &Path) {
    if is_mounted(dir) {
        let mut cmd = Command::new("fusermount3");
        cmd.arg("-uz").arg(dir);
        let _ = run_bounded(&mut cmd, Duration::from_secs(30));
    }
    if is_mounted(dir) {
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).expect("mount point");
        // SAFETY: umount2 with a valid C string; MNT_DETACH never blocks.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

// ---------------------------------------------------------------------------------------
// `braid local --mount` as a child process.
// ---------------------------------------------------------------------------------------

/// `braid local --mount` (the README's first command) as a running process: a whole
/// cluster (MGS, one MDT, [`LocalCluster::OSTS`] OSTs) in one process, whose own FUSE
/// mount reaches its servers in-process (`rpc::local`) unless `--tcp` is among the
/// extra arguments. Other clients (a `braid mount` process, the CLI) reach the same
/// servers over TCP at [`LocalCluster::url`]. Dropping it stops the process (SIGTERM
/// unmounts cleanly; SIGKILL by PID if it has not exited after 10 s) and detaches a
/// mount left behind, also when a test panics.
pub struct LocalCluster {
    pub daemon: Daemon,
    /// The mount point of the process's own mount.
    pub mnt: PathBuf,
    /// `--data`: the MGS, MDT and OST directories and `cluster.secret`.
    pub data: PathBuf,
}

impl LocalCluster {
    /// How many OSTs (`--osts`) the cluster has.
    pub const OSTS: usize = 2;

    /// Starts `bin local --mount` with its data and mount point under `dir` and
    /// `extra` arguments (e.g. `--tcp`, `-o allow_other`), and waits until it
    /// printed that it mounted.
    pub fn start(bin: &Path, dir: &Path, extra: &[&str]) -> LocalCluster {
        let data = dir.join("data");
        let mnt = dir.join("local-mnt");
        std::fs::create_dir_all(&mnt).expect("create the mount point");
        let listen = format!("127.0.0.1:{}", free_port("127.0.0.1"));
        let osts = LocalCluster::OSTS.to_string();
        let (data_arg, mnt_arg) = (path(&data), path(&mnt));
        let mut args = vec!["local", "--data", &data_arg, "--listen", &listen, "--osts", &osts];
        args.extend_from_slice(&["--heartbeat-ms", "200", "--mount", &mnt_arg]);
        let striped = striped_root().to_string();
        if striped_root() > 1 {
            args.extend_from_slice(&["--mdts", &striped, "--root-stripes", &striped]);
        }
        args.extend_from_slice(extra);
        let daemon = Daemon::start(bin, &args, &[], &dir.join("local.log"), "mounted on")
            .unwrap_or_else(|log| panic!("braid local --mount did not come up:\n{log}"));
        let l = LocalCluster { daemon, mnt, data };
        if striped_root() > 1 {
            wait_for("the root to be striped", WAIT, || {
                let mut cmd = Command::new(bin);
                cmd.args(["getdirstripe", "-c", &l.url()]).env("BRAID_SECRET_FILE", l.secret());
                output_within(&mut cmd, CLI_WATCHDOG).is_ok_and(|o| o.stdout.starts_with(striped.as_bytes()))
            });
        }
        l
    }

    /// `braid://MGS/` of the cluster, for clients of other processes.
    pub fn url(&self) -> String {
        let mgs = self.daemon.banner.iter().find_map(|l| l.strip_prefix("MGS at ")).expect("MGS address line");
        format!("braid://{}/", mgs.trim())
    }

    /// The cluster's secret file.
    pub fn secret(&self) -> PathBuf {
        self.data.join("cluster.secret")
    }

    /// How many object files the OSTs hold.
    pub fn objects(&self) -> usize {
        (0..LocalCluster::OSTS).map(|i| objects_in(&self.data.join(format!("ost{i}"))).len()).sum()
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        // SIGTERM unmounts cleanly; a mount left behind by a failure is detached.
        self.daemon.stop(Duration::from_secs(10));
        detach_mount(&self.mnt);
    }
}

/// Runs `cmd` with stdin and stdout closed, killing it (by PID) after `timeout`.
/// `Err` holds its stderr when it fails.
fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<(), String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start: {e}"))?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return if st.success() { Ok(()) } else { Err(format!("{st}: {err}")) };
            }
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("still running after {timeout:?}; killed"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("wait failed: {e}")),
        }
    }
}
