//! POSIX test suites through real braid mounts: pjdfstest (crates.io `pjdfstest` 0.2.2,
//! the Rust rewrite: a few hundred test cases of every namespace and attribute
//! system call, switching users) and fsx (crates.io `fsx`, fsx-rs: random reads,
//! writes, truncates, mmap, fallocate, hole punching, sendfile and copy_file_range on
//! one file, every read checked against a model of the file). Each runs through
//! `braid local --mount` (its mount reaches the servers in-process) and through a
//! separate `braid mount` process reaching a cluster of processes over TCP, both
//! mounted with `-o allow_other` (pjdfstest switches to the users `nobody` and `tests`).
//!
//! `scripts/test.sh` installs both tools and creates the user `tests`; when either tool
//! is missing the tests fail saying so. Run as root:
//! `cargo test -p braid --test posix_suites -- --nocapture --test-threads=1`
//! (`BRAID_KEEP_TEST_DIR=1` keeps pjdfstest's full output, fsx's artifacts and the logs).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use testkit::{output_within, stderr, stdout, Cluster, ClusterSpec, LocalCluster, Mount, TempDir, CLI_WATCHDOG};

const INSTALL_HINT: &str =
    "run scripts/test.sh (it installs them), or `cargo install --locked pjdfstest@0.2.2 fsx@0.3.2` and `useradd -U -M tests`";

/// A whole pjdfstest run takes seconds on a local disk; longer means it hung.
const PJDFSTEST_TIMEOUT: Duration = Duration::from_secs(300);

/// One fsx run takes under a minute (the slowest, mmap over TCP, 30 s); longer means it hung.
const FSX_TIMEOUT: Duration = Duration::from_secs(300);

/// The directory pjdfstest runs in, at the root of the mount.
const PJDFSTEST_DIR: &str = "pjd";

/// At most this many lines of pjdfstest failures are printed.
const MAX_FAILURE_LINES: usize = 200;

/// The test cases pjdfstest 0.2.2 runs with `pjdfstest.toml`: each of them once, over
/// the two runs (see [`run_pjdfstest`]). Another number means another pjdfstest, or
/// settings that no longer select what they did: look at what changed.
const PJDFSTEST_CASES: usize = 398;

/// Of them, those run in the second run alone (a remount read-only: EROFS).
const PJDFSTEST_EROFS_CASES: usize = 13;

/// Every test case pjdfstest skips through a braid mount, and pjdfstest's reason: the
/// same through every mount and layout the tests use. A case skipped that is not here
/// fails the test, and so does one here that ran: a suite that quietly stopped running
/// part of itself would otherwise still pass.
const PJDFSTEST_SKIPS: &[(&str, &str)] = &[
    // pathconf(_PC_LINK_MAX) has glibc look the limit up by the file system's magic
    // number, and FUSE's is not in its table: -1, "no limit known". It says nothing
    // of braid (whose limit is u32::MAX links; `link_count_max` would need hours).
    ("link::link_count_max", "Cannot get value for LINK_MAX: filesystem limit is unknown"),
];

fn braid_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

/// A file of this directory (`crates/braid/tests`).
fn data_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(name)
}

/// `name` on `PATH` or in cargo's bin directory.
fn find_program(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// The installed `name`, or a failure that says how to install it: a missing suite
/// never passes silently.
fn tool(name: &str) -> PathBuf {
    find_program(name).unwrap_or_else(|| panic!("`{name}` is not installed: {INSTALL_HINT}"))
}

fn require_root() {
    // SAFETY: geteuid(2) has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "the POSIX suites run as root (mounts with allow_other; pjdfstest switches users)");
}

fn require_user(name: &str) {
    let c = std::ffi::CString::new(name).expect("user name");
    // SAFETY: getpwnam(3) with a valid C string; only the pointer is looked at.
    let found = !unsafe { libc::getpwnam(c.as_ptr()) }.is_null();
    assert!(found, "pjdfstest needs the user `{name}`: {INSTALL_HINT}");
}

/// A braid mount to run a suite through, and what keeps it up. Fields drop in order:
/// the mount, then its servers, then the directory holding the mount point (and for
/// `braid local`, its data and log).
struct Target {
    label: &'static str,
    /// The root of the mounted file system.
    root: PathBuf,
    secret: PathBuf,
    _mount: Option<Mount>,
    _cluster: Option<Cluster>,
    _local: Option<LocalCluster>,
    /// Scratch space on the local disk: pjdfstest's second file system, fsx's
    /// artifacts, outputs.
    work: TempDir,
}

/// A scratch directory with a short path. pjdfstest makes Unix sockets 55 bytes below
/// the directory it is given (two temporary directories and a 32-character name), and
/// a socket's whole path must fit in `sun_path` (107 bytes): mount points live here.
fn short_work_dir() -> TempDir {
    let work = TempDir::new("px");
    let longest = work.path().join("local-mnt").join(PJDFSTEST_DIR).as_os_str().len() + 55;
    assert!(
        longest <= 107,
        "{} is too long a path for pjdfstest's Unix sockets ({longest} > 107 bytes): use a shorter BRAID_TEST_DIR",
        work.path().display()
    );
    work
}

/// `braid local --mount -o allow_other`: the mount's client reaches its servers in
/// the same process.
fn local_mount() -> Target {
    let work = short_work_dir();
    let l = LocalCluster::start(braid_bin(), work.path(), &["-o", "allow_other"]);
    Target {
        label: "braid local --mount (in-process)",
        root: l.mnt.clone(),
        secret: l.secret(),
        _mount: None,
        _cluster: None,
        _local: Some(l),
        work,
    }
}

/// A `braid mount -o allow_other` process over TCP to a cluster of MGS, MDS and OSS
/// processes (4 OSTs).
fn tcp_mount() -> Target {
    tcp_mount_with("braid mount (TCP)", |_| "allow_other".to_string())
}

/// As [`tcp_mount`], with the options `opts` makes from the scratch directory.
fn tcp_mount_with(label: &'static str, opts: impl Fn(&Path) -> String) -> Target {
    let work = short_work_dir();
    let c = Cluster::start(braid_bin(), ClusterSpec::default());
    let m = Mount::of(braid_bin(), &c.url("/"), &c.secret, work.path(), &opts(work.path()));
    Target {
        label,
        root: m.dir.clone(),
        secret: c.secret.clone(),
        _mount: Some(m),
        _cluster: Some(c),
        _local: None,
        work,
    }
}

impl Target {
    /// A new directory in the file system, open to every user. With the root
    /// striped over several MDTs (`BRAID_TEST_ROOT_STRIPES`), striped as the root and
    /// with a default that stripes every directory made below it: every name of the
    /// suite lands on the MDT its hash picks, and renames cross MDTs.
    fn dir(&self, name: &str) -> PathBuf {
        let d = self.root.join(name);
        let stripes = testkit::striped_root();
        if stripes > 1 {
            let (n, path) = (stripes.to_string(), d.to_string_lossy().into_owned());
            self.braid_ok(&["mkdir", "-c", &n, &path]);
            self.braid_ok(&["setdirstripe", "-D", "-c", &n, &path]);
        } else {
            fs::create_dir(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
        }
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).expect("chmod 755");
        d
    }

    /// Runs the braid CLI with the cluster's secret; panics when it fails.
    fn braid_ok(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(braid_bin());
        cmd.args(args).env("BRAID_SECRET_FILE", &self.secret);
        let out =
            output_within(&mut cmd, CLI_WATCHDOG).unwrap_or_else(|o| panic!("braid {args:?} hung: {}", stderr(&o)));
        assert!(out.status.success(), "braid {args:?} failed: {}{}", stdout(&out), stderr(&out));
        stdout(&out)
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---------------------------------------------------------------------------------------
// pjdfstest
// ---------------------------------------------------------------------------------------

/// One test case as pjdfstest printed it: its name, its result and the lines under it
/// (a failure's panic message).
struct Case {
    name: String,
    status: String,
    message: Vec<String>,
}

const STATUSES: [&str; 5] = ["ok", "FAILED", "skipped", "failed as expected", "PASSED UNEXPECTEDLY"];

/// pjdfstest's output: a line `NAME   STATUS` per test case, indented lines under it,
/// and a closing `Summary: N failed, N skipped, N passed, N expected failures, N total`.
fn parse_pjdfstest(text: &str) -> (Vec<Case>, Option<String>) {
    let mut cases: Vec<Case> = Vec::new();
    let mut summary = None;
    for line in text.lines() {
        if line.starts_with("Summary:") {
            summary = Some(line.trim().to_string());
            continue;
        }
        if !line.starts_with(char::is_whitespace) {
            if let Some((name, status)) = line.split_once(' ') {
                let status = status.trim();
                if STATUSES.contains(&status) {
                    cases.push(Case { name: name.to_string(), status: status.to_string(), message: Vec::new() });
                    continue;
                }
            }
        }
        if let Some(c) = cases.last_mut() {
            if !line.trim().is_empty() {
                c.message.push(line.trim_end().to_string());
            }
        }
    }
    (cases, summary)
}

/// The number before `what` in pjdfstest's summary line.
fn summary_count(summary: &str, what: &str) -> Option<usize> {
    summary
        .trim_start_matches("Summary:")
        .split(',')
        .find_map(|part| part.trim().strip_suffix(what).and_then(|n| n.trim().parse().ok()))
}

/// One pjdfstest process: the test cases it ran, its summary line and exit status.
struct PjdRun {
    cases: Vec<Case>,
    summary: String,
    status: std::process::ExitStatus,
}

/// Runs pjdfstest with `config` in `dir`, on the test cases whose names contain one of
/// `patterns` (all when empty); its output is saved as `work/pjdfstest-TAG.out`.
fn pjdfstest_once(t: &Target, tag: &str, config: &Path, dir: &Path, patterns: &[&str]) -> PjdRun {
    let pjdfstest = tool("pjdfstest");
    // The EXDEV cases link and rename onto another file system: a fresh local directory.
    let other_fs = t.work.path().join(format!("secondary-fs-{tag}"));
    fs::create_dir_all(&other_fs).expect("create the second file system's directory");
    fs::set_permissions(&other_fs, fs::Permissions::from_mode(0o755)).expect("chmod 755");
    // The EROFS cases remount the mount read-only and back with `mount -o remount,ro
    // MNT`. For a FUSE mount mount(8) hands that to fuse3's mount.fuse helper, which
    // cannot remount (it runs the mount's source, `braid@MGS`, as a program); the
    // kernel remounts a FUSE mount well by itself: pjdfstest's `mount` is
    // `mount -i` (no helpers).
    let real_mount = find_program("mount").expect("mount(8) is not installed (util-linux `mount` package)");
    let bin_dir = t.work.path().join("bin");
    fs::create_dir_all(&bin_dir).expect("create a bin directory");
    let wrapper = bin_dir.join("mount");
    fs::write(&wrapper, format!("#!/bin/sh\nexec '{}' -i \"$@\"\n", real_mount.display()))
        .expect("write mount wrapper");
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).expect("chmod 755");
    let mut path = std::ffi::OsString::from(&bin_dir);
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    let mut cmd = Command::new(&pjdfstest);
    cmd.env("PATH", path).arg("-c").arg(config).arg("-p").arg(dir).arg("-s").arg(&other_fs).args(patterns);
    // Not inside the mount, which must unmount afterwards.
    cmd.current_dir(t.work.path()).env("NO_COLOR", "1").env("RUST_BACKTRACE", "0").env("RUST_LIB_BACKTRACE", "0");
    let start = Instant::now();
    let (out, finished) = match output_within(&mut cmd, PJDFSTEST_TIMEOUT) {
        Ok(o) => (o, true),
        Err(o) => (o, false),
    };
    let elapsed = start.elapsed();
    let text = stdout(&out);
    let saved = t.work.path().join(format!("pjdfstest-{tag}.out"));
    let _ = fs::write(&saved, format!("{text}{}", stderr(&out)));
    let (cases, summary) = parse_pjdfstest(&text);
    eprintln!(
        "pjdfstest ({tag}) through {} finished in {:.1} s: {} (output in {})",
        t.label,
        elapsed.as_secs_f64(),
        summary.as_deref().unwrap_or("no summary line"),
        saved.display()
    );
    if !finished {
        panic!(
            "pjdfstest ({tag}) through {} still running after {PJDFSTEST_TIMEOUT:?}; killed. Last output:\n{}\n{}",
            t.label,
            tail(&text, 40),
            tail(&stderr(&out), 20)
        );
    }
    let Some(summary) = summary else {
        panic!(
            "pjdfstest ({tag}) through {} exited with {} without a summary. Last output:\n{}\n{}",
            t.label,
            out.status,
            tail(&text, 40),
            tail(&stderr(&out), 20)
        );
    };
    let passed = cases.iter().filter(|c| c.status == "ok").count();
    assert_eq!(summary_count(&summary, "passed"), Some(passed), "parsed pjdfstest's output wrongly: {summary}");
    assert_eq!(summary_count(&summary, "total"), Some(cases.len()), "parsed pjdfstest's output wrongly: {summary}");
    PjdRun { cases, summary, status: out.status }
}

/// pjdfstest through `t`, in two processes: every test case but the EROFS ones
/// (`pjdfstest.toml`, `allow_remount = false`), then the EROFS ones alone (the same
/// settings with `allow_remount = true`). Together they run every test case once.
/// Apart, because a remount read-only fails (EBUSY) while any file of the mount is open
/// for writing, and pjdfstest leaves such descriptors open (e.g.
/// `posix_fallocate::affected_only_create_flags` never closes its file): in one
/// process every EROFS case after it fails, on ext4 as on braid.
/// With `dom`, the directory's files (and those of its subdirectories, which copy
/// the default) keep their first 64 KiB on the MDT (Data-on-MDT), the rest striped.
fn run_pjdfstest(t: &Target, dom: bool) {
    let dir = t.dir(PJDFSTEST_DIR);
    if dom {
        t.braid_ok(&["setstripe", "-E", "64K", "-L", "mdt", "-E", "-1", "-c", "-1", &dir.to_string_lossy()]);
    }
    let config = data_file("pjdfstest.toml");
    let text = fs::read_to_string(&config).expect("read pjdfstest.toml");
    assert!(text.contains("\nallow_remount = false\n"), "pjdfstest.toml must say `allow_remount = false`");
    let remount_config = t.work.path().join("pjdfstest-erofs.toml");
    fs::write(&remount_config, text.replace("\nallow_remount = false\n", "\nallow_remount = true\n"))
        .expect("write the EROFS settings");

    let main = pjdfstest_once(t, "main", &config, &dir, &[]);
    let erofs = pjdfstest_once(t, "erofs", &remount_config, &dir, &["erofs"]);
    let is_erofs = |c: &Case| c.name.contains("erofs");
    assert!(!erofs.cases.is_empty(), "pjdfstest ran no EROFS test case: {}", erofs.summary);
    assert!(
        main.cases.iter().filter(|c| is_erofs(c)).all(|c| c.status == "skipped"),
        "the first pjdfstest run was to skip the EROFS test cases"
    );
    let cases: Vec<&Case> = main.cases.iter().filter(|c| !is_erofs(c)).chain(erofs.cases.iter()).collect();
    let failed: Vec<&Case> =
        cases.iter().copied().filter(|c| c.status == "FAILED" || c.status == "PASSED UNEXPECTEDLY").collect();
    let skipped: Vec<&Case> = cases.iter().copied().filter(|c| c.status == "skipped").collect();
    let passed = cases.iter().filter(|c| c.status == "ok").count();
    let totals =
        format!("{} failed, {} skipped, {passed} passed, {} test cases", failed.len(), skipped.len(), cases.len());
    eprintln!("pjdfstest through {}: {totals}", t.label);
    let skips: BTreeMap<&str, String> = skipped
        .iter()
        .map(|c| (c.name.as_str(), c.message.iter().map(|m| m.trim()).collect::<Vec<_>>().join(" ")))
        .collect();
    for (name, why) in &skips {
        eprintln!("skipped {name}: {why}");
    }
    if failed.is_empty() && main.status.success() && erofs.status.success() {
        let expected: BTreeMap<&str, String> = PJDFSTEST_SKIPS.iter().map(|&(n, why)| (n, why.to_string())).collect();
        assert_eq!(skips, expected, "pjdfstest through {} skipped other test cases than PJDFSTEST_SKIPS", t.label);
        assert_eq!(
            (main.cases.len(), erofs.cases.len()),
            (PJDFSTEST_CASES, PJDFSTEST_EROFS_CASES),
            "pjdfstest through {}: not the test cases of pjdfstest 0.2.2 with pjdfstest.toml ({totals})",
            t.label
        );
        assert_eq!(cases.len(), PJDFSTEST_CASES, "each test case runs once, in one of the two runs");
        assert_eq!(passed, PJDFSTEST_CASES - PJDFSTEST_SKIPS.len(), "{totals}");
        return;
    }
    let mut by_syscall: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &failed {
        *by_syscall.entry(c.name.split("::").next().unwrap_or("")).or_default() += 1;
    }
    let mut lines = vec![format!("pjdfstest through {}: {totals}", t.label)];
    lines.push(format!(
        "failed test cases by system call: {}",
        by_syscall.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
    ));
    for c in &failed {
        lines.push(format!("{} {}", c.status, c.name));
        lines.extend(c.message.iter().take(6).map(|m| format!("    {}", m.trim())));
    }
    if lines.len() > MAX_FAILURE_LINES {
        let more = lines.len() - MAX_FAILURE_LINES;
        lines.truncate(MAX_FAILURE_LINES);
        lines.push(format!("... and {more} more lines"));
    }
    eprintln!("{}", lines.join("\n"));
    panic!(
        "pjdfstest through {}: {} test cases failed ({totals}; exit status {} and {})",
        t.label,
        failed.len(),
        main.status,
        erofs.status
    );
}

#[test]
fn pjdfstest_through_braid_local_mount() {
    require_root();
    tool("pjdfstest");
    require_user("tests");
    run_pjdfstest(&local_mount(), false);
}

/// Through the separate mount process, on Data-on-MDT files: the same POSIX rules.
#[test]
fn pjdfstest_through_a_braid_mount_process_on_dom_files() {
    require_root();
    tool("pjdfstest");
    require_user("tests");
    run_pjdfstest(&tcp_mount(), true);
}

/// Through the separate mount process with the default layout (one stripe on an
/// OST): creates there are answered by the mount on the OSTs of the last file the
/// MDS placed (the client's `async_create`), with the same POSIX rules.
#[test]
fn pjdfstest_through_a_braid_mount_process() {
    require_root();
    tool("pjdfstest");
    require_user("tests");
    run_pjdfstest(&tcp_mount(), false);
}

// ---------------------------------------------------------------------------------------
// fsx
// ---------------------------------------------------------------------------------------

/// One fsx run: its settings file (`fsx.toml` with mmap, `fsx-nommap.toml` without),
/// whether the file is opened `O_DIRECT` (fsx-rs has no such option: the
/// `fsx_odirect.c` shim adds it to every open of the file, close/reopen included), and
/// the layout of the directory the file lives in.
struct FsxRun {
    name: &'static str,
    config: &'static str,
    direct: bool,
    dir: FsxDir,
    seed: u64,
}

/// Where an fsx file lives.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FsxDir {
    /// The root's default layout: one stripe of 1 MiB.
    Plain,
    /// Striped 64 KiB wide over every OST.
    Striped,
    /// Data-on-MDT for the first 64 KiB (fsx's files grow to 256 KiB), then striped
    /// 64 KiB wide over every OST: writes, truncates and mmap cross the two.
    Dom,
}

const FSX_RUNS: [FsxRun; 8] = [
    FsxRun { name: "mmap-striped", config: "fsx.toml", direct: false, dir: FsxDir::Striped, seed: 1 },
    FsxRun { name: "mmap", config: "fsx.toml", direct: false, dir: FsxDir::Plain, seed: 2 },
    FsxRun { name: "nommap-striped", config: "fsx-nommap.toml", direct: false, dir: FsxDir::Striped, seed: 3 },
    FsxRun { name: "odirect-striped", config: "fsx-nommap.toml", direct: true, dir: FsxDir::Striped, seed: 4 },
    FsxRun { name: "odirect", config: "fsx-nommap.toml", direct: true, dir: FsxDir::Plain, seed: 5 },
    // mmap of a file opened O_DIRECT, as a local file system allows.
    FsxRun { name: "odirect-mmap-striped", config: "fsx.toml", direct: true, dir: FsxDir::Striped, seed: 6 },
    FsxRun { name: "mmap-dom", config: "fsx.toml", direct: false, dir: FsxDir::Dom, seed: 7 },
    FsxRun { name: "odirect-dom", config: "fsx-nommap.toml", direct: true, dir: FsxDir::Dom, seed: 8 },
];

/// Operations per run: 8 runs through each of 2 mounts, 136,000 in all.
const FSX_OPS: u64 = 8_500;

/// What to show of a failed fsx run's log: its complaint (the lines before the
/// `LOG DUMP` of the last operations, at most 30) and the last 40 operations.
fn fsx_excerpt(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    match lines.iter().position(|l| l.contains("LOG DUMP")) {
        Some(i) => {
            let head = &lines[i.saturating_sub(30)..=i];
            let ops = &lines[i + 1..];
            let skipped = ops.len().saturating_sub(40);
            let mut out = head.join("\n");
            if skipped > 0 {
                out.push_str(&format!("\n    ... {skipped} earlier operations ..."));
            }
            out.push('\n');
            out.push_str(&ops[skipped..].join("\n"));
            out
        }
        None => tail(log, 60),
    }
}

/// Builds the O_DIRECT shim into `work`.
fn build_odirect_shim(work: &Path) -> PathBuf {
    let so = work.join("fsx_odirect.so");
    let mut cmd = Command::new("cc");
    cmd.args(["-shared", "-fPIC", "-O2", "-o"]).arg(&so).arg(data_file("fsx_odirect.c")).arg("-ldl");
    match output_within(&mut cmd, Duration::from_secs(60)) {
        Ok(o) if o.status.success() => so,
        Ok(o) => panic!("cannot build the O_DIRECT shim for fsx with cc: {}", stderr(&o)),
        Err(o) => panic!("cc hung building the O_DIRECT shim: {}", stderr(&o)),
    }
}

fn run_fsx(t: &Target, seed_base: u64) {
    let fsx = tool("fsx");
    let shim = build_odirect_shim(t.work.path());
    let plain = t.dir("fsx");
    let striped = t.dir("fsx-striped");
    t.braid_ok(&["setstripe", "-c", "-1", "-S", "65536", &striped.to_string_lossy()]);
    let dom = t.dir("fsx-dom");
    t.braid_ok(&["setstripe", "-E", "64K", "-L", "mdt", "-E", "-1", "-c", "-1", "-S", "64K", &dom.to_string_lossy()]);
    let mut failures = Vec::new();
    for run in &FSX_RUNS {
        let dir = match run.dir {
            FsxDir::Plain => &plain,
            FsxDir::Striped => &striped,
            FsxDir::Dom => &dom,
        };
        let file = dir.join(format!("fsx-{}", run.name));
        let artifacts = t.work.path().join(format!("fsx-{}", run.name));
        fs::create_dir_all(&artifacts).expect("create fsx's artifact directory");
        let seed = seed_base + run.seed;
        let mut cmd = Command::new(&fsx);
        cmd.arg("-f").arg(data_file(run.config)).arg("-N").arg(FSX_OPS.to_string()).arg("-S").arg(seed.to_string());
        cmd.arg("-P").arg(&artifacts).arg(&file).current_dir(t.work.path());
        let mut shown = format!("fsx -f crates/braid/tests/{} -N {FSX_OPS} -S {seed} {}", run.config, file.display());
        cmd.env("RUST_BACKTRACE", "0");
        if run.direct {
            cmd.env("LD_PRELOAD", &shim).env("FSX_ODIRECT_PATH", &file);
            shown = format!("LD_PRELOAD=fsx_odirect.so FSX_ODIRECT_PATH={} {shown}", file.display());
        }
        let start = Instant::now();
        let result = output_within(&mut cmd, FSX_TIMEOUT);
        let elapsed = start.elapsed().as_secs_f64();
        let problem = match &result {
            Err(_) => Some(format!("still running after {FSX_TIMEOUT:?}; killed")),
            Ok(o) if !o.status.success() => Some(format!("exited with {}", o.status)),
            Ok(o) if run.direct && !stderr(o).contains("fsx_odirect: opening") => {
                Some("the O_DIRECT shim did not take effect".to_string())
            }
            Ok(_) => None,
        };
        let o: &Output = match &result {
            Ok(o) | Err(o) => o,
        };
        eprintln!(
            "fsx through {} [{}] {:.1} s: {}\n    {shown}",
            t.label,
            run.name,
            elapsed,
            problem.as_deref().unwrap_or("ok")
        );
        if let Some(problem) = problem {
            failures.push(format!(
                "---- fsx [{}] {problem} (artifacts in {}): {shown}\n{}\n{}",
                run.name,
                artifacts.display(),
                fsx_excerpt(&stderr(o)),
                tail(&stdout(o), 10)
            ));
        }
        let _ = fs::remove_file(&file);
    }
    if !failures.is_empty() {
        eprintln!("{}", failures.join("\n"));
        panic!("fsx through {}: {} of {} runs failed", t.label, failures.len(), FSX_RUNS.len());
    }
}

#[test]
fn fsx_through_braid_local_mount() {
    require_root();
    tool("fsx");
    run_fsx(&local_mount(), 0);
}

#[test]
fn fsx_through_a_braid_mount_process() {
    require_root();
    tool("fsx");
    let t = tcp_mount();
    run_fsx(&t, 100);
    if testkit::short_circuit() {
        // The runs went through the OSTs' descriptors, not only over TCP.
        let log = t._mount.as_ref().map(|m| fs::read_to_string(&m.log).unwrap_or_default()).unwrap_or_default();
        assert!(log.contains("short-circuit I/O with OST"), "the mount never read or wrote an object itself");
    }
}

/// With the SSD read cache: every read fsx checks may come from the cache, and every
/// write, truncate, hole punch and mmap store must leave nothing stale in it. The cache
/// is small (2 MiB), so extents are evicted and their blocks reused all along.
#[test]
fn fsx_through_a_braid_mount_process_with_the_ssd_cache() {
    require_root();
    tool("fsx");
    let t = tcp_mount_with("braid mount (TCP, SSD cache)", |work| {
        format!("allow_other,cache_dir={},cache_size=2M", work.join("ssd-cache").display())
    });
    run_fsx(&t, 200);
    // The cache took part: fsx's reads were served from it and refilled it.
    let status = t.braid_ok(&["cache", "status", "--json", &t.root.to_string_lossy()]);
    let s: serde_json::Value = serde_json::from_str(&status).expect("cache status is JSON");
    for key in ["hits", "fills", "evictions", "invalidations"] {
        assert!(s[key].as_u64().unwrap_or(0) > 0, "no {key} in the SSD cache during fsx: {s}");
    }
    assert_eq!(s["damaged"].as_u64(), Some(0), "{s}");
}
