//! The I/O tracer through real processes: `braid mount` processes record into their
//! trace rings, the collectors they start drain them to a `braid trace serve` process
//! or a trace directory, and `braid trace show|stats|export` read what was stored.
//! Also: on and off at run time, a collector killed and replaced, and bad input (a
//! scribbled ring, a second collector, hostile batches, a damaged store), and that
//! the ring and the stored trace are their owner's alone.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::{Cluster, ClusterSpec, Daemon, Mount};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

fn cluster() -> Cluster {
    Cluster::start(bin(), ClusterSpec::default())
}

fn braid(args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    testkit::output_within(&mut cmd, Duration::from_secs(60)).expect("braid ends")
}

fn braid_ok(args: &[&str]) -> String {
    let out = braid(args);
    assert!(out.status.success(), "braid {args:?}: {}{}", testkit::stdout(&out), testkit::stderr(&out));
    testkit::stdout(&out)
}

/// Runs `script` in `sh` in `dir` as job `job` (`SLURM_JOB_ID`).
fn run_job(dir: &Path, job: &str, script: &str) {
    let out = Command::new("sh").arg("-c").arg(script).current_dir(dir).env("SLURM_JOB_ID", job).output().unwrap();
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
}

fn status(m: &Mount) -> serde_json::Value {
    serde_json::from_str(&braid_ok(&["trace", "status", "--json", &m.dir.to_string_lossy()])).unwrap()
}

/// Waits until the mount's collector has taken every record written so far, and its
/// batch has gone out.
fn wait_collected(m: &Mount) {
    let start = Instant::now();
    loop {
        let s = status(m);
        if s["collected"] == s["written"] {
            std::thread::sleep(Duration::from_millis(400));
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "the collector did not keep up: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The stored trace as JSON lines, waiting (up to 20 s) until `ready` holds of it.
fn stored(dir: &Path, ready: impl Fn(&[serde_json::Value]) -> bool) -> Vec<serde_json::Value> {
    let start = Instant::now();
    loop {
        let out = braid(&["trace", "export", "--json", "--dir", &dir.to_string_lossy()]);
        let v: Vec<serde_json::Value> = if out.status.success() {
            testkit::stdout(&out).lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
        } else {
            vec![]
        };
        if ready(&v) {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "the trace never got there: {} records", v.len());
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn alive(pid: u64) -> bool {
    // SAFETY: signal 0 only asks whether the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

fn ops<'a>(v: &'a [serde_json::Value], op: &str) -> Vec<&'a serde_json::Value> {
    v.iter().filter(|r| r["op"] == op).collect()
}

#[test]
fn a_traced_mount_records_every_operation_through_a_collection_server() {
    let c = cluster();
    let store = c.dir.path().join("trace-store");
    let log = c.dir.path().join("trace-serve.log");
    let secret = c.secret.to_string_lossy().to_string();
    let server = Daemon::start(
        bin(),
        &["trace", "serve", "--dir", &store.to_string_lossy(), "--listen", "127.0.0.1:0", "--secret-file", &secret],
        &[],
        &log,
        "trace server at",
    )
    .expect("trace server starts");
    let addr = server.banner.last().unwrap().split_whitespace().nth(3).unwrap().trim_end_matches(',').to_string();
    let m = Mount::new(&c, &format!("trace,trace_server={addr}"));
    assert_eq!(status(&m)["enabled"], true);
    run_job(
        &m.dir,
        "4242",
        "mkdir d && dd if=/dev/zero of=d/seq bs=64k count=16 conv=fsync status=none && \
         cat d/seq > /dev/null && mv d/seq d/seq2 && ln -s seq2 d/link && ls -l d > /dev/null && \
         rm d/link d/seq2 && rmdir d && ! cat nothing-here 2> /dev/null",
    );
    wait_collected(&m);
    let all = stored(&store, |v| ops(v, "rmdir").len() == 1);
    // The job's processes, told apart from others at the mount (this test's `braid
    // trace status` looks the mount's root up, without a job).
    let (v, others): (Vec<_>, Vec<_>) = all.into_iter().partition(|r| r["job"] == "4242");
    assert!(others.iter().all(|r| r["job"].is_null()), "{others:?}");
    assert!(!others.is_empty());
    for op in [
        "mkdir", "create", "write", "fsync", "close", "open", "read", "rename", "symlink", "readdir", "unlink",
        "lookup",
    ] {
        assert!(!ops(&v, op).is_empty(), "no {op} in the trace");
    }
    // Every operation of the job names it, root as the caller, and a place.
    for r in &v {
        assert_eq!((r["uid"].as_u64(), r["gid"].as_u64()), (Some(0), Some(0)), "{r}");
        assert!(r["pid"].as_u64().unwrap() > 1);
        assert!(r["client"].as_str().unwrap().ends_with(&*m.dir.to_string_lossy()), "{r}");
    }
    // The 16 writes of 64 KiB, in order, to one OST object of one file.
    let writes = ops(&v, "write");
    assert_eq!(writes.len(), 16, "{writes:?}");
    for (i, w) in writes.iter().enumerate() {
        assert_eq!((w["offset"].as_u64(), w["len"].as_u64()), (Some(i as u64 * 65536), Some(65536)));
        assert!(w["target"].as_str().unwrap().starts_with("OST"), "{w}");
        assert_eq!(w["fid"], writes[0]["fid"]);
        assert_eq!(w["errno"], 0);
    }
    assert!(ops(&v, "mkdir")[0]["target"].as_str().unwrap().starts_with("MDT"));
    // The lookup of a name that is not there failed with ENOENT, and says so.
    assert!(ops(&v, "lookup").iter().any(|r| r["errno"] == libc::ENOENT), "no failed lookup");
    // The tools.
    let fid = writes[0]["fid"].as_str().unwrap().to_string();
    let dir = store.to_string_lossy().to_string();
    let shown = braid_ok(&["trace", "show", "--dir", &dir, "--op", "write", "--fid", &fid]);
    assert_eq!(shown.lines().count(), 16);
    assert!(shown
        .lines()
        .all(|l| l.starts_with("OPLOG: time[") && l.contains("operation [write]") && l.contains("job [4242]")));
    let stats = braid_ok(&["trace", "stats", "--dir", &dir, "--job", "4242"]);
    assert!(stats.contains(&format!("{fid:<32}")), "{stats}");
    // The file's reads and writes each have their own pattern, under their own
    // headings: dd's 16 writes in order, and cat's reads (as many as reached the
    // mount past the kernel's page cache), or none.
    let header = stats.lines().find(|l| l.starts_with("file ")).unwrap();
    let (read_at, write_at) = (header.find("read pattern").unwrap(), header.find("write pattern").unwrap());
    let line = stats.lines().find(|l| l.starts_with(&fid)).unwrap();
    assert_eq!(line[write_at..].trim(), "sequential, 16 transfers", "{stats}");
    let reads = ops(&v, "read").iter().filter(|r| r["fid"] == fid.as_str() && r["errno"] == 0).count();
    let read_cell = line[read_at..write_at].trim();
    if reads == 0 {
        assert_eq!(read_cell, "-", "{stats}");
    } else {
        assert!(read_cell.ends_with(&format!(", {reads} transfers")), "{reads} reads: {stats}");
    }
    let csv = braid_ok(&["trace", "export", "--csv", "--dir", &dir, "--op", "rename"]);
    assert_eq!(csv.lines().count(), 2, "{csv}");
    assert!(csv.starts_with("start_ns,duration_ns,client,pid,job"));
    assert!(braid_ok(&["trace", "show", "--dir", &dir, "--job", "other"]).is_empty());
    let plots = c.dir.path().join("plots");
    braid_ok(&["trace", "plot", "--dir", &dir, "--out", &plots.to_string_lossy()]);
    let offsets = std::fs::read_to_string(plots.join("offsets.svg")).unwrap();
    assert!(offsets.contains(&format!("{fid} write")), "the written file is drawn");
    assert!(offsets.matches("<circle").count() >= 16);
    assert!(std::fs::read_to_string(plots.join("jobs.svg")).unwrap().contains("job 4242"));
    drop(m);
}

#[test]
fn tracing_turns_on_and_off_at_run_time_and_a_killed_collector_is_replaced() {
    let c = cluster();
    let store = c.dir.path().join("trace-dir");
    let m = Mount::new(&c, &format!("trace_dir={}", store.display()));
    let mnt = m.dir.to_string_lossy().to_string();
    let s = status(&m);
    assert_eq!((s["enabled"].as_bool(), s["collector_pid"].as_u64()), (Some(false), None), "{s}");
    let write = |name: &str, len: usize| std::fs::write(m.path(name), vec![7u8; len]).unwrap();
    write("before", 11_111);
    braid_ok(&["trace", "on", &mnt]);
    let first = status(&m)["collector_pid"].as_u64().expect("a collector runs");
    write("during1", 12_345);
    wait_collected(&m);
    // SIGKILL the collector: the mount starts another, which goes on from the ring.
    // SAFETY: kill(2) of the collector the mount started for this test.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    let start = Instant::now();
    let second = loop {
        if let Some(p) = status(&m)["collector_pid"].as_u64().filter(|&p| p != first) {
            break p;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no new collector");
        std::thread::sleep(Duration::from_millis(100));
    };
    write("during2", 33_333);
    wait_collected(&m);
    braid_ok(&["trace", "off", &mnt]);
    assert_eq!(status(&m)["enabled"], false);
    write("after", 22_222);
    let v = stored(&store, |v| ops(v, "write").iter().any(|w| w["len"] == 33_333));
    let lens: Vec<u64> = ops(&v, "write").iter().map(|w| w["len"].as_u64().unwrap()).collect();
    assert!(lens.contains(&12_345), "{lens:?}");
    assert!(!lens.contains(&11_111) && !lens.contains(&22_222), "recorded while off: {lens:?}");
    assert_eq!(status(&m)["dropped"], 0);
    // Only root may switch it.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin())
        .args(["trace", "on", &mnt])
        .output();
    if let Ok(out) = out {
        assert!(!out.status.success(), "a user turned tracing on");
    }
    // At unmount the collector drains what is left and ends, and the ring goes.
    let ring = PathBuf::from(status(&m)["ring"].as_str().unwrap());
    drop(m);
    let start = Instant::now();
    while ring.exists() || alive(second) {
        assert!(start.elapsed() < Duration::from_secs(10), "the collector or its ring outlived the mount");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn bad_rings_second_collectors_hostile_batches_and_damaged_stores_are_refused() {
    let work = testkit::TempDir::new("trace-bad");
    let dir = work.path().join("store");
    // A file that is not a ring (a private one: a file others may open is refused
    // before it is read).
    let junk = work.path().join("junk.ring");
    std::fs::write(&junk, vec![0x5a; 100_000]).unwrap();
    std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = braid(&["trace", "collect", "--ring", &junk.to_string_lossy(), "--dir", &dir.to_string_lossy()]);
    assert!(!out.status.success());
    assert!(testkit::stderr(&out).contains("not a braid trace ring"), "{}", testkit::stderr(&out));
    // A live ring (this process writes it) and a collector on it: a second is refused.
    let ring = work.path().join("live.ring");
    let w = trace::ring::RingWriter::create(&ring, 1024, "test", true).unwrap();
    let job = w.job("77");
    let rec = |i: u64| trace::Record {
        start_ns: 1_700_000_000_000_000_000 + i,
        dur_ns: 10,
        pid: 1,
        uid: 2,
        gid: 3,
        fid: proto::Fid { seq: 0x200000401, oid: 5, ver: 0 },
        offset: i * 4096,
        len: 4096,
        job,
        op: trace::Op::Read,
        errno: 0,
        target: trace::Target::Ost(3),
    };
    for i in 0..100 {
        assert!(w.push(&rec(i)));
    }
    let mut first = Command::new(bin())
        .args(["trace", "collect", "--ring", &ring.to_string_lossy(), "--dir", &dir.to_string_lossy()])
        .spawn()
        .unwrap();
    let start = Instant::now();
    while w.stats().collected < 100 {
        assert!(start.elapsed() < Duration::from_secs(10), "the collector took nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = braid(&["trace", "collect", "--ring", &ring.to_string_lossy(), "--dir", &dir.to_string_lossy()]);
    assert!(!out.status.success());
    assert!(testkit::stderr(&out).contains("already has a collector"), "{}", testkit::stderr(&out));
    std::thread::sleep(Duration::from_millis(400));
    let _ = first.kill();
    let _ = first.wait();
    let shown = braid_ok(&["trace", "show", "--dir", &dir.to_string_lossy(), "--job", "77"]);
    assert_eq!(shown.lines().count(), 100, "{shown}");
    // A damaged segment: what is intact is shown, and the damage is reported.
    let seg = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "trace"))
        .expect("a segment");
    let mut raw = std::fs::read(&seg).unwrap();
    let n = raw.len();
    raw[n - 100] ^= 0xff;
    std::fs::write(&seg, &raw).unwrap();
    let out = braid(&["trace", "show", "--dir", &dir.to_string_lossy()]);
    assert!(out.status.success());
    assert!(testkit::stderr(&out).contains("damaged"), "{}", testkit::stderr(&out));
    // Bad filters are clear errors.
    for (args, says) in [
        (["--op", "bogus"], "unknown operation"),
        (["--fid", "junk"], "not a FID"),
        (["--since=-5", "--op=read"], "not a time"),
    ] {
        let mut a = vec!["trace", "show", "--dir"];
        let d = dir.to_string_lossy().to_string();
        a.push(&d);
        a.extend(args);
        let out = braid(&a);
        assert!(!out.status.success() && testkit::stderr(&out).contains(says), "{a:?}: {}", testkit::stderr(&out));
    }
    // A collection server: hostile batches get an error and it keeps serving.
    let secret = work.path().join("secret");
    assert!(Command::new(bin()).args(["gen-secret", &secret.to_string_lossy()]).status().unwrap().success());
    let sdir = work.path().join("served");
    let log = work.path().join("serve.log");
    let _server = Daemon::start(
        bin(),
        &[
            "trace",
            "serve",
            "--dir",
            &sdir.to_string_lossy(),
            "--listen",
            "127.0.0.1:0",
            "--secret-file",
            &secret.to_string_lossy(),
        ],
        &[],
        &log,
        "trace server at",
    )
    .expect("trace server starts");
    let addr = _server.banner.last().unwrap().split_whitespace().nth(3).unwrap().trim_end_matches(',').to_string();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let id = rpc::Identity::new("test", proto::auth::Secret::load(&secret).unwrap());
    let c = rpc::RpcClient::new(addr.clone(), id, rpc::RpcOptions::default());
    let send =
        |payload: Vec<u8>| rt.block_on(c.call(&proto::msg::Request::TraceBatch, vec![bytes::Bytes::from(payload)]));
    let mut good =
        trace::store::Batch { client: "n1:/mnt".into(), jobs: vec![(job, "77".into())], lost: 0, records: vec![] };
    for i in 0..10 {
        let mut b = [0u8; trace::RECORD_BYTES];
        rec(i).encode(&mut b);
        good.records.extend_from_slice(&b);
    }
    let bytes = good.encode();
    for hostile in [vec![], vec![1, 2, 3], bytes[..bytes.len() - 1].to_vec(), vec![0xff; 4096]] {
        let e = send(hostile).expect_err("a hostile batch is refused");
        assert!(e.to_string().contains("trace batch"), "{e}");
    }
    assert_eq!(send(bytes).unwrap().response, proto::msg::Response::Ok);
    let start = Instant::now();
    while braid_ok(&["trace", "show", "--dir", &sdir.to_string_lossy()]).lines().count() != 10 {
        assert!(start.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(100));
    }
    // Without the secret: refused.
    let stranger = rpc::RpcClient::new(
        addr,
        rpc::Identity::new("test", proto::auth::Secret::create_file(&work.path().join("other.secret")).unwrap()),
        rpc::RpcOptions { recovery_timeout: Duration::from_secs(1), ..Default::default() },
    );
    assert!(rt.block_on(stranger.call(&proto::msg::Request::TraceBatch, vec![])).is_err());
}

/// Unmounts a small file system made for a test, also when the test fails.
struct SmallFs(PathBuf);

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_trace_store_whose_disk_is_full_costs_the_mount_nothing_and_drops_are_counted() {
    let c = cluster();
    let small = c.dir.path().join("small-fs");
    std::fs::create_dir_all(&small).unwrap();
    let made = Command::new("mount").args(["-t", "tmpfs", "-o", "size=16k", "tmpfs"]).arg(&small).status().unwrap();
    assert!(made.success(), "mount a 16 KiB tmpfs");
    let _guard = SmallFs(small.clone());
    // A ring of 64 records, so that it fills soon once the collector cannot store.
    let m = Mount::new(&c, &format!("trace,trace_ring=64,trace_dir={}", small.display()));
    let data = vec![3u8; 4096];
    let start = Instant::now();
    let mut n = 0;
    while status(&m)["dropped"].as_u64().unwrap_or(0) == 0 {
        for _ in 0..50 {
            let p = m.path(&format!("f{n}"));
            std::fs::write(&p, &data).unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), data, "the mount works on");
            n += 1;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "nothing was dropped: {}", status(&m));
    }
    let s = status(&m);
    assert!(s["collector_pid"].as_u64().is_some(), "the collector keeps trying: {s}");
    assert_eq!(std::fs::read_dir(m.dir.clone()).unwrap().count(), n);
}

/// A process holding a close-on-exec file open on a traced mount forks, and the child
/// execs. The exec closes that file, a FLUSH, and the FLUSH's record asked for the
/// child's job by reading its `/proc/PID/environ`, which waits until the exec is over:
/// the two waited on each other for good (this suite's own tests hung that way while
/// another test thread held a file open). The job is now read on a thread of its own.
#[test]
fn a_fork_and_exec_with_a_file_open_on_a_traced_mount_goes_through() {
    let c = cluster();
    let m = Mount::new(&c, "trace");
    assert_eq!(status(&m)["enabled"], true);
    let path = std::ffi::CString::new(m.path("held-open").to_string_lossy().as_bytes()).unwrap();
    // SAFETY: open(2) of a path we own.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC, 0o644) };
    assert!(fd >= 0, "open on the mount");
    // SAFETY: one byte from a live buffer to our descriptor.
    assert_eq!(unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) }, 1);
    let prog = c"/bin/true";
    let argv = [prog.as_ptr(), std::ptr::null()];
    for round in 0..3 {
        // SAFETY: the child calls only execv and _exit, which are async-signal-safe.
        let child = unsafe {
            let pid = libc::fork();
            if pid == 0 {
                libc::execv(prog.as_ptr(), argv.as_ptr());
                libc::_exit(127);
            }
            pid
        };
        assert!(child > 0, "fork");
        let start = Instant::now();
        let mut status = 0;
        let done = loop {
            // SAFETY: waitpid on our own child.
            if unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == child {
                break true;
            }
            if start.elapsed() > Duration::from_secs(20) {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if !done {
            // SAFETY: as above. Not waited for: a child stuck in its exec may not die
            // until the mount is gone, which the test's end brings about.
            unsafe {
                libc::kill(child, libc::SIGKILL);
                libc::close(fd);
            }
            panic!("round {round}: the child's exec did not finish in 20 s");
        }
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "round {round}: /bin/true ran");
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
}

/// `cmd` run as user nobody: its stderr, and whether it succeeded.
fn as_nobody(cmd: &mut Command) -> (bool, String) {
    let out = testkit::output_within(cmd.uid(65534).gid(65534), Duration::from_secs(30)).expect("ends");
    (out.status.success(), testkit::stderr(&out))
}

/// The ring a traced mount writes (uids, pids, jobs, FIDs, offsets) is its owner's
/// alone, 0600 from the start: another user cannot open it. So is what its collector
/// stores: a directory of 0700, segments of 0600, even in a trace directory others
/// may enter.
#[test]
fn a_trace_ring_and_the_stored_trace_are_for_their_owner_only() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: opening the ring as another user (nobody) needs root");
        return;
    }
    let shared = testkit::TempDir::new("trace-shared");
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = shared.path().join("traces");
    let c = cluster();
    let m = Mount::new(&c, &format!("trace,trace_dir={}", store.display()));
    let ring = PathBuf::from(status(&m)["ring"].as_str().unwrap());
    let meta = std::fs::symlink_metadata(&ring).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o600, 0), "{}", ring.display());
    let (ok, err) = as_nobody(Command::new("cat").arg(&ring));
    assert!(!ok && err.contains("Permission denied"), "another user read the ring: {err}");
    std::fs::write(m.path("f"), vec![1u8; 100_000]).unwrap();
    wait_collected(&m);

    // The collector's store under the trace directory.
    let start = Instant::now();
    let segment = loop {
        let found = std::fs::read_dir(&store)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "trace"));
        if let Some(p) = found {
            break p;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no segment stored");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(segment.parent().unwrap()), 0o700, "the collector's store");
    assert_eq!(mode(&segment), 0o600, "{}", segment.display());
    let (ok, err) = as_nobody(Command::new("ls").arg(segment.parent().unwrap()));
    assert!(!ok && err.contains("Permission denied"), "another user listed the store: {err}");
    drop(m);
}
