//! A long fault test on separate nodes (`scripts/netns-cluster.sh`): one MDS, two
//! OSSs and two clients, each in a network namespace of its own, with a mount on each
//! client. While the everyday workload (`everyday`: files created, written, chowned,
//! chmodded, their mtime set, fsynced; a third of them then renamed into another
//! directory, a third removed) runs through both mounts, each in its own directory,
//! for the whole test, the MDS is killed with SIGKILL 20 times at random moments and
//! started again on its node after a random pause of up to a second (an MDT has one
//! MDS today: that is its failover), and 3 times its node is cut off the network for
//! 1 to 5 s and healed. The faults come in a random order, from a seeded generator
//! whose seed is printed (`BRAID_SEED=N` runs the same schedule again); between two
//! faults both workloads go through a few more files.
//!
//! A probe process per client creates and removes a file through its mount every
//! 50 ms, in a directory no client holds a lease on (so each probe is answered by
//! the MDS, not by the mount), and logs when each started and was answered. How long
//! the clients stalled after each fault is read off those logs: from the moment the
//! fault is in effect (the MDS dead, the link down) until the first probe started
//! after it is answered; also from the MDS's restart (it listens again) or the heal.
//! The test prints the median and worst of each, per kind of fault; it asserts no
//! timing.
//!
//! Afterwards the workloads stop, and every change an fsync acknowledged to either
//! client is checked through both mounts (the file there, under its new name once
//! the rename was acknowledged, with its length, owner, mode and mtime; a removed
//! one gone); neither the workloads nor the probes may have met an error. The mounts
//! come off, the MDS is stopped and `braid check-namespace` must find its MDT
//! consistent. Then `down` must leave no process, mount or namespace behind.
//!
//! A second test runs the same with MDT 0 replicated by three MDS nodes
//! (`--mdt-replicas 3`): each kill and cut hits the replica that leads at the time
//! (the killed one is started again once another leads, and rejoins as a
//! follower), the stall is then the failover as a client sees it, every replica's database must be consistent,
//! and no two replicas may have served in one term.
//!
//! Each takes about a minute and a half, so they run only with `BRAID_LONG_TESTS=1`
//! (and as root); otherwise it says it was skipped and passes:
//!
//! ```sh
//! BRAID_LONG_TESTS=1 cargo test -p braid --test netns_faults -- --nocapture
//! ```
//!
//! A guard tears the cluster down when the test ends, also when it fails (after the
//! servers' and mounts' log tails), and a watcher of the script does if the test
//! process is killed; the workloads and probes are stopped by PID.

mod everyday;
mod netns_common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use everyday::{check_acked_all, everyday_progress, finish_everyday_workload, start_everyday_workload, Acked};
use netns_common::{bin, netns_exists, started, NetnsCluster};
use testkit::{is_mounted, output_within, stderr, stdout};

/// SIGKILLs of the MDS.
const KILLS: usize = 20;
/// Cuts of the MDS's node off the network.
const CUTS: usize = 3;
/// Files each workload goes through after a fault before the next one.
const PROGRESS: u64 = 3;
/// Longest wait for what must follow a fault (the probes answered, the workloads
/// going on): well past the recovery window and the longest cut, and past the
/// mount's own recovery timeout (60 s), after which it fails a call rather than
/// wait on.
const BOUND: Duration = Duration::from_secs(90);
/// The faults must be over by then (they take about a minute and a half).
const DEADLINE: Duration = Duration::from_secs(480);

/// A probe of one mount: every 50 ms (start to start; at once after a slow one),
/// a file created and removed in DIR, its start and end (µs since the epoch) and
/// `ok` or `err` appended to LOG, until STOP exists.
const PROBE: &str = r#"
dir=$1 log=$2 stop=$3
exec 4>>"$log"
i=0
while [ ! -e "$stop" ]; do
    s=${EPOCHREALTIME/[.,]/}
    f="$dir/p$i"
    if : >"$f" && rm -f -- "$f"; then r=ok; else r=err; fi
    e=${EPOCHREALTIME/[.,]/}
    echo "$s $e $r" >&4
    i=$((i + 1))
    t=${EPOCHREALTIME/[.,]/}
    left=$((s + 50000 - t))
    if [ "$left" -gt 0 ]; then sleep "0.$(printf %06d "$left")"; fi
done
"#;

/// Microseconds since the epoch: the probes' clock (bash's `EPOCHREALTIME`).
fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("a clock after 1970").as_micros() as u64
}

/// Asks a background process to stop (its stop file), and kills it by PID if it has
/// not within `grace`.
fn end_child(stop: &Path, child: &mut Child, grace: Duration) {
    let _ = fs::write(stop, b"");
    let start = Instant::now();
    while start.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The everyday workload in one mount; stopped on drop if the test did not finish it.
struct Workload {
    node: &'static str,
    /// Its directory, as the workload sees it (under its own mount).
    root: PathBuf,
    stop: PathBuf,
    child: Option<Child>,
}

impl Workload {
    fn start(node: &'static str, root: PathBuf, state: &Path) -> Workload {
        fs::create_dir(&root).unwrap_or_else(|e| panic!("mkdir {}: {e}", root.display()));
        let stop = state.join(format!("workload-{node}.stop"));
        let child = Some(start_everyday_workload(&root, &stop));
        Workload { node, root, stop, child }
    }

    fn progress(&self) -> u64 {
        everyday_progress(&self.stop)
    }

    /// What the workload's processes are doing (where they wait), for a report.
    fn doing(&self) -> String {
        let pids = self.child.as_ref().map(|c| tree(c.id())).unwrap_or_default();
        let lines: Vec<String> = pids.into_iter().map(describe).collect();
        format!("workload on {} at file {}:\n{}", self.node, self.progress(), lines.join("\n"))
    }

    fn finish(&mut self) -> (Vec<Acked>, Vec<String>) {
        finish_everyday_workload(&self.stop, self.child.take().expect("a running workload"))
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            end_child(&self.stop, &mut child, Duration::from_secs(5));
        }
    }
}

/// When one probe started and was answered (µs since the epoch), and whether it
/// succeeded.
#[derive(Clone, Copy, Debug)]
struct Answer {
    start: u64,
    end: u64,
    ok: bool,
}

/// A probe process ([`PROBE`]) on one mount.
struct Probe {
    node: &'static str,
    log: PathBuf,
    errors: PathBuf,
    stop: PathBuf,
    child: Option<Child>,
}

impl Probe {
    fn start(node: &'static str, dir: &Path, state: &Path) -> Probe {
        let (log, errors, stop) = (
            state.join(format!("probe-{node}.log")),
            state.join(format!("probe-{node}.err")),
            state.join(format!("probe-{node}.stop")),
        );
        let mut cmd = Command::new("bash");
        cmd.args(["-c", PROBE, "probe"])
            .arg(dir)
            .arg(&log)
            .arg(&stop)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&errors).expect("the probe's error file"));
        let child = Some(testkit::die_with_parent(&mut cmd).spawn().expect("start a probe"));
        Probe { node, log, errors, stop, child }
    }

    /// Every probe logged so far (complete lines only).
    fn answers(&self) -> Vec<Answer> {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete
            .lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split(' ').collect();
                match w[..] {
                    [s, e, r] => Some(Answer { start: s.parse().ok()?, end: e.parse().ok()?, ok: r == "ok" }),
                    _ => None,
                }
            })
            .collect()
    }

    /// The first probe that started at `t` or later and has been answered.
    fn first_from(&self, t: u64) -> Option<Answer> {
        self.answers().into_iter().find(|a| a.start >= t)
    }

    /// Stops the probe: how many probes it made, and the errors it met.
    fn finish(&mut self) -> (usize, Vec<String>) {
        if let Some(mut child) = self.child.take() {
            end_child(&self.stop, &mut child, BOUND);
        }
        let answers = self.answers();
        let mut errors: Vec<String> =
            fs::read_to_string(&self.errors).unwrap_or_default().lines().map(str::to_string).collect();
        let failed = answers.iter().filter(|a| !a.ok).count();
        if failed > 0 && errors.is_empty() {
            errors.push(format!("{failed} probes failed without a word"));
        }
        (answers.len(), errors)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            end_child(&self.stop, &mut child, Duration::from_secs(5));
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    /// SIGKILL of the MDS, which is started again after a pause.
    Kill,
    /// The MDS's node cut off the network, and healed.
    Cut,
}

/// One fault and how the clients went through it.
struct Event {
    fault: Fault,
    /// When the fault was in effect (the kill or cut command returned), µs.
    at: u64,
    /// How long the kill or cut command took (the fault landed within it).
    command: Duration,
    /// How long the MDS was dead or cut off: until its restart command was run (it
    /// listens a little later) or it was healed.
    out: Duration,
    /// When it was back (the start command saw it listen, or the link healed), µs.
    back: u64,
    /// For each client, when the first probe started after `at` was answered, µs.
    answered: Vec<u64>,
}

/// Median and worst of `v`, in seconds.
fn median_worst(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    assert!(n > 0, "no samples");
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    (median, v[n - 1])
}

/// Waits until every workload went through `n` more files, at most [`BOUND`].
fn workloads_go_on(works: &[Workload], n: u64, after: &str) {
    let from: Vec<u64> = works.iter().map(Workload::progress).collect();
    let start = Instant::now();
    while works.iter().zip(&from).any(|(w, f)| w.progress() < f + n) {
        let now: Vec<u64> = works.iter().map(Workload::progress).collect();
        if start.elapsed() > BOUND {
            let stuck: Vec<String> = works.iter().map(Workload::doing).collect();
            panic!(
                "the workloads went from {from:?} to {now:?} files in {BOUND:?} {after} (they should make {n} \
                 more); what they were doing:\n{}",
                stuck.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A line on process `pid`: its state, where in the kernel it waits, its command
/// line, and its kernel stack if readable.
fn describe(pid: u32) -> String {
    let read = |what: &str| fs::read_to_string(format!("/proc/{pid}/{what}")).unwrap_or_default();
    let state = read("stat").rsplit_once(") ").map(|(_, r)| r.split(' ').next().unwrap_or("?").to_string());
    let stack: Vec<String> =
        read("stack").lines().map(|l| l.split_whitespace().nth(1).unwrap_or(l).to_string()).collect();
    format!(
        "  pid {pid} {} in {}: {} [{}]",
        state.unwrap_or_else(|| "gone".into()),
        read("wchan"),
        read("cmdline")
            .split('\0')
            .map(|a| if a.contains('\n') { "SCRIPT" } else { a })
            .collect::<Vec<_>>()
            .join(" ")
            .trim_end(),
        stack.join(" < ")
    )
}

/// Process `pid` and its descendants.
fn tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let parent = all[i];
        let children = fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).unwrap_or_default();
        all.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
        i += 1;
    }
    all
}

/// The xorshift generator of `faults.rs`: `next(n)` is in `0..n`.
fn rng(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed | 1;
    move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    }
}

/// Writes `text` to standard error past the test harness's capture: the skip line and
/// the figures show in a plain `cargo test` too.
fn say(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

#[test]
fn acknowledged_changes_survive_mds_kills_and_cuts_under_two_clients() {
    run(1);
}

/// The same with MDT 0 replicated by three MDS nodes: each fault hits the replica
/// that leads at the time (a killed one is started again, as a follower), and two
/// replicas never serve in the same term.
#[test]
fn acknowledged_changes_survive_leader_kills_and_cuts_of_a_replicated_mdt() {
    run(3);
}

/// The MDS node the faults hit: the one MDS, or the replica that leads.
fn victim(c: &NetnsCluster, replicas: usize) -> String {
    if replicas > 1 {
        c.ok("leader", &["--timeout", "90"]).trim().to_string()
    } else {
        "mds0".to_string()
    }
}

/// The terms each replica logged that it served in: none twice.
fn served_terms(state: &Path, replicas: usize) -> Vec<(String, u64)> {
    let mut all = Vec::new();
    for k in 0..replicas {
        let text = fs::read_to_string(state.join(format!("logs/mds{k}.log"))).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("served by this replica")) {
            if let Some(t) = line.rsplit("term=").next().and_then(|t| t.trim().parse().ok()) {
                all.push((format!("mds{k}"), t));
            }
        }
    }
    all
}

fn run(replicas: usize) {
    if std::env::var("BRAID_LONG_TESTS").as_deref() != Ok("1") {
        say("netns_faults: skipped (a fault test of about 90 s, as root); run it with \
             BRAID_LONG_TESTS=1 cargo test -p braid --test netns_faults -- --nocapture");
        return;
    }
    // One cluster at a time: the two tests share the machine's two cores, and each
    // measures stalls.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // SAFETY: geteuid(2) has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "network namespaces and mounts need root");
    let began = Instant::now();
    let seed = std::env::var("BRAID_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).expect("a clock").subsec_nanos() as u64);
    say(&format!("netns_faults: seed {seed} (BRAID_SEED={seed} repeats the schedule)"));
    let mut next = rng(seed);

    let mdss = replicas.to_string();
    let layout = if replicas > 1 { "--mdt-replicas" } else { "--mdss" };
    let c = NetnsCluster::up(&[layout, &mdss, "--osss", "2", "--osts-per-oss", "2", "--clients", "2"]);
    let state = c.state.path().to_path_buf();
    eprintln!("up after {:?}", began.elapsed());
    let mounts = [c.mount("client0", ""), c.mount("client1", "")];
    // The probes' directories, made by the CLI: no mount holds a lease on them, so
    // each create and unlink there goes to the MDS.
    c.braid_ok("client0", &["mkdir", &c.url("/probe0"), &c.url("/probe1")]);

    // Declared after the cluster: on a panic they are stopped before it goes down.
    let mut works = vec![
        Workload::start("client0", mounts[0].join("w0"), &state),
        Workload::start("client1", mounts[1].join("w1"), &state),
    ];
    let mut probes = vec![
        Probe::start("client0", &mounts[0].join("probe0"), &state),
        Probe::start("client1", &mounts[1].join("probe1"), &state),
    ];
    workloads_go_on(&works, PROGRESS, "at the start");

    // The faults, in a random order.
    let mut schedule: Vec<Fault> = [vec![Fault::Kill; KILLS], vec![Fault::Cut; CUTS]].concat();
    for i in (1..schedule.len()).rev() {
        schedule.swap(i, next(i as u64 + 1) as usize);
    }
    let mut events: Vec<Event> = Vec::new();
    let (mut kills, mut cuts) = (0, 0);
    for fault in schedule {
        assert!(began.elapsed() < DEADLINE, "still at the faults after {:?}: too slow", began.elapsed());
        // A random moment in the workloads.
        std::thread::sleep(Duration::from_millis(next(1000)));
        let issued = Instant::now();
        let (at, command, out, back) = match fault {
            Fault::Kill => {
                kills += 1;
                let node = victim(&c, replicas);
                c.ok("kill", &[&node, "KILL"]);
                let (at, command) = (now_us(), issued.elapsed());
                std::thread::sleep(Duration::from_millis(next(1000)));
                if replicas > 1 {
                    // Started again once another replica leads: a failover each
                    // time, not a leader that comes back within its term.
                    let waiting = Instant::now();
                    while victim(&c, replicas) == node {
                        assert!(waiting.elapsed() < BOUND, "no other replica leads {BOUND:?} after {node} was killed");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                let out = Duration::from_micros(now_us() - at);
                c.ok("start", &[&node]);
                (at, command, out, now_us())
            }
            Fault::Cut => {
                cuts += 1;
                let node = victim(&c, replicas);
                c.ok("cut", &[&node]);
                let (at, command) = (now_us(), issued.elapsed());
                std::thread::sleep(Duration::from_millis(1000 + next(4001)));
                c.ok("heal", &[&node]);
                let back = now_us();
                (at, command, Duration::from_micros(back - at), back)
            }
        };
        // Each client answered again, and both workloads went on.
        let waiting = Instant::now();
        let answered: Vec<u64> = loop {
            let got: Vec<Option<Answer>> = probes.iter().map(|p| p.first_from(at)).collect();
            if got.iter().all(Option::is_some) {
                break got.into_iter().map(|a| a.expect("an answer").end).collect();
            }
            assert!(
                waiting.elapsed() < BOUND,
                "no probe answer {BOUND:?} after {fault:?} {}: {:?}",
                events.len() + 1,
                probes.iter().map(|p| (p.node, p.first_from(at))).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let e = Event { fault, at, command, out, back, answered };
        let secs = |us: u64| us as f64 / 1e6;
        let label = match fault {
            Fault::Kill => format!("kill {kills}/{KILLS}: MDS dead {:.2} s, listening again", e.out.as_secs_f64()),
            Fault::Cut => format!("cut {cuts}/{CUTS}: MDS cut off {:.2} s, healed", e.out.as_secs_f64()),
        };
        eprintln!(
            "{label} {:.2} s after; first answers {} s after the fault, {} s after it was back (command {:?})",
            secs(e.back - e.at),
            e.answered.iter().map(|a| format!("{:.2}", secs(a - e.at))).collect::<Vec<_>>().join(" / "),
            e.answered.iter().map(|a| format!("{:.2}", secs(a.saturating_sub(e.back)))).collect::<Vec<_>>().join(" / "),
            e.command,
        );
        events.push(e);
        workloads_go_on(&works, PROGRESS, &format!("after fault {}", events.len()));
    }
    let faults_took = began.elapsed();

    // Enough files after the last fault that the checks below mean something; then
    // the probes and the workloads stop.
    workloads_go_on(&works, 10, "after the last fault");
    let mut failures: Vec<String> = Vec::new();
    let mut probed = 0;
    for p in &mut probes {
        let (n, errors) = p.finish();
        probed += n;
        failures.extend(errors.into_iter().map(|e| format!("probe on {}: {e}", p.node)));
    }
    let mut acked = Vec::new();
    for w in &mut works {
        let (a, errors) = w.finish();
        failures.extend(errors.into_iter().map(|e| format!("workload on {}: {e}", w.node)));
        acked.push(a);
    }

    // Every acknowledged change, through both mounts.
    let (mut files, mut removals, mut renames) = (0, 0, 0);
    for (i, w) in works.iter().enumerate() {
        let dir = w.root.file_name().expect("a workload directory");
        removals += acked[i].iter().filter(|a| matches!(a, Acked::Gone(_))).count();
        renames += acked[i].iter().filter(|a| matches!(a, Acked::Moved { .. })).count();
        for (k, m) in mounts.iter().enumerate() {
            let (checked, problems) = check_acked_all(&acked[i], &w.root, &m.join(dir));
            failures
                .extend(problems.into_iter().map(|p| format!("{}'s change through client{k}'s mount: {p}", w.node)));
            if k == i {
                files += checked;
            }
        }
    }

    if files < 100 {
        failures.push(format!("only {files} files acknowledged: the checks above say little"));
    }

    // The figures.
    let secs = |us: u64| us as f64 / 1e6;
    let whom = if replicas > 1 { format!("MDT leader (of {replicas} replicas)") } else { "MDS".to_string() };
    let mut report = vec![format!(
        "netns_faults: seed {seed}, {KILLS} {whom} kills and {CUTS} cuts in {:.0} s; {files} files (of which \
         {renames} renamed) and {removals} removals acknowledged to 2 clients checked through both mounts; \
         {probed} probes",
        faults_took.as_secs_f64()
    )];
    for fault in [Fault::Kill, Fault::Cut] {
        let of: Vec<&Event> = events.iter().filter(|e| e.fault == fault).collect();
        let stall: Vec<f64> = of.iter().flat_map(|e| e.answered.iter().map(|a| secs(a - e.at))).collect();
        let after: Vec<f64> =
            of.iter().flat_map(|e| e.answered.iter().map(|a| secs(a.saturating_sub(e.back)))).collect();
        let out: Vec<f64> = of.iter().map(|e| e.out.as_secs_f64()).collect();
        let command: Vec<f64> = of.iter().map(|e| e.command.as_secs_f64()).collect();
        let ((sm, sw), (am, aw), (om, ow), (cm, cw)) =
            (median_worst(stall), median_worst(after), median_worst(out), median_worst(command));
        let (what, back) = match fault {
            Fault::Kill => ("after an MDS kill", "restart (listening)"),
            Fault::Cut => ("after a cut", "heal"),
        };
        report.push(format!(
            "  {what} ({} x 2 clients): stall median {sm:.2} s, worst {sw:.2} s; from the {back} to the first \
             answer median {am:.2} s, worst {aw:.2} s (MDS out median {om:.2} s, longest {ow:.2} s; the command \
             took median {:.0} ms, worst {:.0} ms)",
            of.len(),
            cm * 1e3,
            cw * 1e3
        ));
    }
    say(&report.join("\n"));

    // The mounts come off (flushing what they deferred), the MDS stops, and its MDT
    // must be consistent.
    for m in &mounts {
        c.ok("umount", &[m.to_str().expect("UTF-8 path")]);
    }
    if replicas > 1 {
        // Two replicas never led in one term. (One replica may serve a term again:
        // a leader killed and started again before another was elected leads on
        // in its term.)
        let terms = served_terms(&state, replicas);
        let mut seen = std::collections::HashMap::new();
        for (node, term) in &terms {
            if let Some(other) = seen.insert(*term, node.clone()).filter(|o| o != node) {
                failures.push(format!("{other} and {node} both served in term {term}"));
            }
        }
        say(&format!("  {} leaderships, in terms {:?}", terms.len(), terms.iter().map(|t| t.1).collect::<Vec<_>>()));
        // Checkpoints and the followers' flushes put everything in the databases.
        std::thread::sleep(Duration::from_secs(3));
    }
    for k in 0..replicas {
        c.ok("kill", &[&format!("mds{k}"), "TERM"]);
    }
    for k in 0..replicas {
        let mdt = state.join(format!("data/mds{k}/mdt"));
        let mut check = Command::new(bin());
        check.arg("check-namespace").arg("--mdt").arg(&mdt);
        let out = output_within(&mut check, Duration::from_secs(120)).expect("check-namespace finished");
        if !out.status.success() {
            failures.push(format!(
                "braid check-namespace of {} ({}):\n{}{}",
                mdt.display(),
                out.status,
                stdout(&out),
                stderr(&out)
            ));
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));

    // down leaves nothing of the cluster behind.
    let procs: Vec<(u32, Option<String>)> =
        ["mgs", "oss0", "oss1"].iter().map(|n| (c.pid(n), started(c.pid(n)))).collect();
    let spaces = c.namespaces();
    c.ok("down", &[]);
    for (pid, start) in procs {
        assert!(start.is_none() || started(pid) != start, "process {pid} still runs after down");
    }
    assert!(mounts.iter().all(|m| !is_mounted(m)), "mounts left after down");
    for ns in spaces {
        assert!(!netns_exists(&ns), "namespace {ns} left after down");
    }
    say(&format!("netns_faults: done in {:.0} s", began.elapsed().as_secs_f64()));
}
