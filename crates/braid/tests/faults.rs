//! Failures of real server processes: targets that stop heartbeating, SIGKILL of
//! each role in the middle of a workload, durability of fsync'd data, clients that
//! block across a restart and give a clean error after their timeout, and servers and
//! a mount killed at random under everyday work through the mount (issue 39).

mod everyday;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use everyday::{check_acked, everyday_goes_on, finish_everyday_workload, start_everyday_workload, Acked};
use layout::LayoutSpec;
use proto::msg::OpenFlags;
use proto::Fid;
use testkit::{
    getstripe_objects, output_within, pattern, runtime, stderr, stdout, wait_for, within, Cluster, ClusterSpec, WAIT,
};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

fn two_oss() -> ClusterSpec {
    ClusterSpec { osts_per_oss: vec![2, 2], ..Default::default() }
}

/// The OSTs of a file's stripes, sorted (round-robin placement rotates the start).
fn osts_of(c: &Cluster, remote: &str) -> Vec<u32> {
    let gs = c.braid_ok(&["getstripe", &c.url(remote)]);
    let mut osts: Vec<u32> = getstripe_objects(&gs).iter().map(|r| r.0).collect();
    osts.sort();
    osts
}

/// The `braid df` row of `tag` (e.g. `[OST:2]`), if df ran.
fn df_row(c: &Cluster, tag: &str) -> Option<String> {
    let out = c.braid(&["df", &c.url("/"), "--timeout-s", "5"]);
    if !out.status.success() {
        return None;
    }
    stdout(&out).lines().find(|l| l.ends_with(tag)).map(str::to_string)
}

#[test]
fn silent_target_is_inactive_avoided_and_used_again_when_back() {
    let mut c = Cluster::start(bin(), two_oss());
    c.kill("oss1");
    wait_for("df to show OST 2 and 3 inactive", WAIT, || {
        [2, 3].iter().all(|i| df_row(&c, &format!("[OST:{i}]")).is_some_and(|r| r.contains("inactive")))
    });
    for i in [0, 1] {
        let row = df_row(&c, &format!("[OST:{i}]")).expect("df runs");
        assert!(!row.contains("inactive"), "{row}");
    }

    // The MDS learns of the state from the MGS: probe until new files avoid them.
    let mut n = 0;
    wait_for("new files to avoid the down OSTs", WAIT, || {
        n += 1;
        let name = format!("/probe-down{n}");
        c.braid_ok(&["setstripe", "-c", "-1", &c.url(&name)]);
        osts_of(&c, &name) == [0, 1]
    });
    // Asking for four stripes gets the two live OSTs, and I/O works.
    c.braid_ok(&["setstripe", "-c", "4", "-S", "64K", &c.url("/while-down")]);
    assert_eq!(osts_of(&c, "/while-down"), [0, 1]);
    let data = pattern(400 << 10, 11);
    c.put("/while-down", &data);
    assert_eq!(c.get("/while-down"), data);
    // An explicit list naming a down OST is refused with a clear error.
    let out = c.braid(&["setstripe", "-o", "2", &c.url("/on-down")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("OST 2 is down"), "{}", stderr(&out));

    c.restart("oss1");
    c.wait_osts_up(4, WAIT);
    let mut n = 0;
    wait_for("new files to use the returned OSTs", WAIT, || {
        n += 1;
        let name = format!("/probe-up{n}");
        c.braid_ok(&["setstripe", "-c", "-1", &c.url(&name)]);
        osts_of(&c, &name) == [0, 1, 2, 3]
    });
    c.braid_ok(&["setstripe", "-c", "-1", "-S", "64K", &c.url("/after")]);
    let data = pattern(600 << 10, 12);
    c.put("/after", &data);
    assert_eq!(c.get("/after"), data);
    assert!(!c.ost_objects(3).is_empty(), "OST 3 holds data again");
    assert_eq!(c.get("/while-down").len(), 400 << 10);
}

/// Runs the CLI outside a `Cluster` borrow (from a workload thread).
fn cli(bin: &Path, secret: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(bin);
    cmd.args(args).env("BRAID_SECRET_FILE", secret);
    output_within(&mut cmd, testkit::CLI_WATCHDOG).expect("braid finished")
}

/// Copies files in while `role` is killed with SIGKILL and restarted; every command
/// must succeed (clients block and retry) and every file read back whole.
fn sigkill_mid_workload(role: &str) {
    let mut c = Cluster::start(bin(), two_oss());
    const FILES: usize = 10;
    let src: Vec<PathBuf> = (0..FILES)
        .map(|i| {
            let p = c.dir.path().join(format!("src{i}"));
            std::fs::write(&p, pattern((64 << 10) * (i + 1) + i, 100 + i as u64)).expect("write a source file");
            p
        })
        .collect();
    c.braid_ok(&["mkdir", &c.url("/w")]);
    c.braid_ok(&["setstripe", "-c", "-1", "-S", "64K", &c.url("/w")]);
    let done = Arc::new(AtomicUsize::new(0));
    let workload = {
        let (bin, secret, done) = (bin().to_path_buf(), c.secret.clone(), done.clone());
        let urls: Vec<String> = (0..FILES).map(|i| c.url(&format!("/w/f{i}"))).collect();
        let dir_url = c.url("/w");
        let src = src.clone();
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            for (s, url) in src.iter().zip(&urls) {
                let s = s.to_str().expect("utf-8 path");
                for args in [
                    vec!["cp", "--timeout-s", "60", s, url.as_str()],
                    vec!["ls", "--timeout-s", "60", dir_url.as_str()],
                ] {
                    let out = cli(&bin, &secret, &args);
                    if !out.status.success() {
                        failures.push(format!("{args:?}: {}", stderr(&out)));
                    }
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
            failures
        })
    };
    wait_for("the workload to get going", WAIT, || done.load(Ordering::SeqCst) >= 2);
    c.kill(role);
    assert!(!c.alive(role));
    std::thread::sleep(Duration::from_millis(700));
    c.restart(role);
    let failures = workload.join().expect("workload thread");
    assert!(failures.is_empty(), "commands failed across the restart: {failures:#?}");

    c.wait_osts_up(4, WAIT);
    let ls = c.braid_ok(&["ls", &c.url("/w")]);
    let mut names: Vec<&str> = ls.split_whitespace().collect();
    names.sort();
    let mut want: Vec<String> = (0..FILES).map(|i| format!("f{i}")).collect();
    want.sort();
    assert_eq!(names, want, "each file exactly once");
    for (i, s) in src.iter().enumerate() {
        let expected = std::fs::read(s).expect("read source");
        assert!(c.get(&format!("/w/f{i}")) == expected, "bytes of /w/f{i}");
    }
    for name in c.servers.keys().cloned().collect::<Vec<_>>() {
        assert!(c.alive(&name), "{name} is running");
    }
}

#[test]
fn sigkill_of_the_mgs_mid_workload_then_restart() {
    sigkill_mid_workload("mgs");
}

#[test]
fn sigkill_of_the_mds_mid_workload_then_restart() {
    sigkill_mid_workload("mds");
}

#[test]
fn sigkill_of_an_oss_mid_workload_then_restart() {
    sigkill_mid_workload("oss1");
}

/// Descriptors process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn statfs_in_a_loop_leaves_no_connections_behind_and_fails_when_no_ost_answers() {
    // Each statfs used to connect to every target afresh and never close those
    // connections: a client running `df` (or stress-ng, which calls statfs all the
    // time) piled up sockets until it and the servers ran out of descriptors.
    let mut c = Cluster::start(bin(), two_oss());
    let rt = runtime();
    let client = c.connect(&rt);
    let servers = ["mds", "oss0", "oss1"];
    let pid = |c: &Cluster, name: &str| c.servers[name].pid().expect("server running");
    let first = rt.block_on(client.statfs()).expect("statfs");
    assert!(first.total_bytes > 0 && first.total_inodes > 0, "{first:?}");
    let before: Vec<usize> = servers.iter().map(|s| open_fds(pid(&c, s))).collect();
    for _ in 0..200 {
        rt.block_on(client.statfs()).expect("statfs");
    }
    let after: Vec<usize> = servers.iter().map(|s| open_fds(pid(&c, s))).collect();
    for ((name, b), a) in servers.iter().zip(&before).zip(&after) {
        assert!(*a <= b + 4, "{name} holds {a} descriptors after 200 statfs calls, {b} before");
    }

    // Every OST down: the totals would be made up, so statfs says it cannot tell.
    c.kill("oss0");
    c.kill("oss1");
    let err = within(&rt, "statfs with every OST down", async {
        loop {
            match client.statfs().await {
                Ok(u) if u.total_bytes > 0 => tokio::time::sleep(Duration::from_millis(200)).await,
                other => break other,
            }
        }
    });
    let e = err.expect_err("statfs with every OST down");
    assert!(e.to_string().contains("no OST answered"), "{e}");
}

#[test]
fn create_right_after_startup_waits_for_the_ost_list() {
    // Slow heartbeats: the MDS fetched the configuration before any OST registered
    // and asks the MGS again only 3 s later. A create in between is told "again"
    // (EAGAIN) and must succeed on a retry once the MDS knows the OSTs.
    let c = Cluster::start_unready(
        bin(),
        ClusterSpec { heartbeat_ms: 3000, target_timeout_ms: 10_000, ..Default::default() },
    );
    let out = c.braid(&["setstripe", "-c", "1", "--timeout-s", "20", &c.url("/early")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let data = pattern(100 << 10, 31);
    c.put("/early", &data);
    assert_eq!(c.get("/early"), data);
}

#[test]
fn fsynced_data_and_metadata_survive_sigkill_of_every_server() {
    let mut c = Cluster::start(bin(), two_oss());
    let rt = runtime();
    let creds = client::process_creds();
    let data = pattern((1 << 20) + 333, 21);
    let rw = OpenFlags { read: true, write: true, truncate: false };
    {
        let client = c.connect(&rt);
        rt.block_on(async {
            let dir = client.mkdir(&creds, Fid::ROOT, "kept", 0o750).await?;
            let spec = Some(LayoutSpec::raid0(Some(-1), Some(64 << 10)));
            let (f, _, _) = client.create(&creds, dir.fid, "file", 0o640, true, rw, spec).await?;
            client.write(&f, 0, Bytes::from(data.clone())).await?;
            client.fsync(&f).await?;
            // The handle is never closed: fsync alone must have made it durable.
            std::mem::forget(f);
            client::Result::Ok(())
        })
        .expect("write and fsync");
    }
    for name in ["oss0", "oss1", "mds", "mgs"] {
        c.kill(name);
    }
    for name in ["mgs", "mds", "oss0", "oss1"] {
        c.restart(name);
    }
    c.wait_osts_up(4, WAIT);
    let st = c.braid_ok(&["stat", &c.url("/kept/file")]);
    assert!(st.contains(&format!("Size: {}", data.len())), "{st}");
    assert!(st.contains("(0640/-rw-r-----)"), "{st}");
    assert!(c.get("/kept/file") == data, "bytes after SIGKILL of every server");
    let st = c.braid_ok(&["stat", &c.url("/kept")]);
    assert!(st.contains("directory") && st.contains("(0750/"), "{st}");
    assert_eq!(osts_of(&c, "/kept/file"), [0, 1, 2, 3]);
}

#[test]
fn client_blocks_across_a_restart_and_fails_cleanly_after_its_timeout() {
    let mut c = Cluster::start(bin(), ClusterSpec::default());
    c.put("/f", b"before the restart");

    // Blocks while the MDS is down, succeeds once it is back.
    c.kill("mds");
    let waiting = {
        let (bin, secret, url) = (c.bin.clone(), c.secret.clone(), c.url("/"));
        std::thread::spawn(move || cli(&bin, &secret, &["ls", "--timeout-s", "60", &url]))
    };
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!waiting.is_finished(), "ls returned while the MDS was down");
    c.restart("mds");
    let out = waiting.join().expect("ls thread");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "f");

    // With the MDS gone for good, the client gives up after --timeout-s with a
    // clean error naming the server.
    c.kill("mds");
    let mds = c.addr("mds");
    let out = c.braid(&["ls", "--timeout-s", "2", &c.url("/")]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains(&mds), "{err}");
    assert!(err.contains("recovery timeout of 2000 ms"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // Same for the MGS, which a client asks first.
    c.kill("mgs");
    let out = c.braid(&["ls", "--timeout-s", "2", &c.url("/")]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("cannot connect to the cluster"), "{err}");
    assert!(err.contains(&c.mgs_addr), "{err}");
}

#[test]
fn targets_stay_up_and_placeable_across_an_mgs_restart() {
    // Heartbeats every 2 s: a restarted MGS must not report live targets down (nor
    // let the MDS refuse creates) while it waits for their next heartbeat.
    let mut c =
        Cluster::start(bin(), ClusterSpec { heartbeat_ms: 2000, target_timeout_ms: 6000, ..Default::default() });
    c.kill("mgs");
    c.restart("mgs");
    let df = c.braid_ok(&["df", &c.url("/")]);
    assert!(!df.contains("inactive"), "live targets shown inactive after an MGS restart:\n{df}");
    let out = c.braid(&["setstripe", "-c", "-1", "--timeout-s", "20", &c.url("/after-mgs-restart")]);
    assert!(out.status.success(), "create after an MGS restart: {}", stderr(&out));
    assert_eq!(osts_of(&c, "/after-mgs-restart"), [0, 1, 2, 3]);
}

#[test]
fn acknowledged_operations_survive_sigkill_of_the_mds_before_any_checkpoint() {
    acknowledged_operations_survive_sigkill_of_the_mds(false);
}

/// The same with every file's bytes on the MDT (Data-on-MDT): they too are only in the
/// redo log when the MDS is killed.
#[test]
fn acknowledged_dom_bytes_survive_sigkill_of_the_mds_before_any_checkpoint() {
    acknowledged_operations_survive_sigkill_of_the_mds(true);
}

fn acknowledged_operations_survive_sigkill_of_the_mds(dom: bool) {
    // No checkpoint in the test's lifetime: everything the MDS acknowledged lives only in
    // its non-durable redb commits and its redo log when it is killed, and must come
    // back from the log, twice over (the second run appends after a replay).
    let spec = ClusterSpec { mds_args: vec!["--checkpoint-ms".into(), "3600000".into()], ..Default::default() };
    let mut c = Cluster::start(bin(), spec);
    let rt = runtime();
    let creds = client::process_creds();
    let rw = OpenFlags { read: true, write: true, truncate: false };
    for round in 0..2 {
        {
            let client = c.connect(&rt);
            rt.block_on(async {
                let dir = client.mkdir(&creds, Fid::ROOT, &format!("d{round}"), 0o755).await?;
                if dom {
                    let table5 = LayoutSpec::template("seed-table5").expect("a built-in template");
                    client.set_dir_layout(&creds, dir.fid, Some(table5)).await?;
                }
                for i in 0..200 {
                    let (f, _, _) = client.create(&creds, dir.fid, &format!("f{i}"), 0o644, true, rw, None).await?;
                    client.write(&f, 0, Bytes::from(format!("file {i} of round {round}"))).await?;
                    client.close(f).await?;
                }
                for i in (0..200).step_by(2) {
                    client.unlink(&creds, dir.fid, &format!("f{i}")).await?;
                }
                client.rename(&creds, dir.fid, "f1", dir.fid, "renamed", proto::msg::RenameFlags::default()).await?;
                client::Result::Ok(())
            })
            .expect("metadata workload");
        }
        c.kill("mds");
        c.restart("mds");
        c.wait_osts_up(4, WAIT);
        for r in 0..=round {
            let names = c.braid_ok(&["ls", &c.url(&format!("/d{r}"))]);
            let mut got: Vec<&str> = names.lines().collect();
            got.sort_unstable();
            let mut want: Vec<String> = (3..200).step_by(2).map(|i| format!("f{i}")).collect();
            want.push("renamed".into());
            want.sort_unstable();
            assert_eq!(got, want, "names in /d{r} after kill {round}");
            assert_eq!(c.get(&format!("/d{r}/f199")), format!("file 199 of round {r}").as_bytes());
            assert_eq!(c.get(&format!("/d{r}/renamed")), format!("file 1 of round {r}").as_bytes());
            if dom {
                let gs = c.braid_ok(&["getstripe", &c.url(&format!("/d{r}/f199"))]);
                assert!(gs.contains("lmm_pattern:       mdt"), "the bytes were on the MDT:\n{gs}");
            }
        }
    }
}

#[test]
fn torn_or_garbled_redo_log_tail_is_cut_and_the_mds_serves_what_came_before() {
    // A machine crash can leave half a record at the end of the log, a bad disk a
    // garbled one. The MDS must start, replay every whole record before it, and serve.
    let spec = ClusterSpec { mds_args: vec!["--checkpoint-ms".into(), "3600000".into()], ..Default::default() };
    let mut c = Cluster::start(bin(), spec);
    let rt = runtime();
    let creds = client::process_creds();
    let rw = OpenFlags { read: true, write: true, truncate: false };
    let wal = c.dir.path().join("mdt0").join("mdt.wal");
    let workload = |c: &Cluster, dir: &str| {
        let client = c.connect(&rt);
        rt.block_on(async {
            let d = client.mkdir(&creds, Fid::ROOT, dir, 0o755).await?;
            for i in 0..50 {
                let (f, _, _) = client.create(&creds, d.fid, &format!("f{i}"), 0o644, true, rw, None).await?;
                client.write(&f, 0, Bytes::from(format!("{dir} {i}"))).await?;
                client.close(f).await?;
            }
            client::Result::Ok(())
        })
        .expect("metadata workload");
    };

    // Half a record: the last create's size publish is lost at worst, nothing before it.
    workload(&c, "torn");
    c.kill("mds");
    let len = std::fs::metadata(&wal).expect("the MDT has a redo log").len();
    assert!(len > 1000, "the log holds the workload ({len} bytes)");
    std::fs::OpenOptions::new().write(true).open(&wal).unwrap().set_len(len - 7).unwrap();
    c.restart("mds");
    c.wait_osts_up(4, WAIT);
    let names = c.braid_ok(&["ls", &c.url("/torn")]);
    assert!(names.lines().count() >= 49, "all but at most the last create survive:\n{names}");
    for i in 0..49 {
        assert_eq!(c.get(&format!("/torn/f{i}")), format!("torn {i}").as_bytes());
    }

    // Garbage after the last record: cut off the same way.
    workload(&c, "garbled");
    c.kill("mds");
    let mut f = std::fs::OpenOptions::new().append(true).open(&wal).unwrap();
    std::io::Write::write_all(&mut f, &pattern(5000, 3)).unwrap();
    drop(f);
    c.restart("mds");
    c.wait_osts_up(4, WAIT);
    assert_eq!(c.braid_ok(&["ls", &c.url("/garbled")]).lines().count(), 50);
    assert_eq!(c.get("/garbled/f49"), b"garbled 49");
    assert_eq!(c.braid_ok(&["ls", &c.url("/torn")]).lines().count(), names.lines().count());
}

/// A `braid local` killed with SIGKILL and started again on its data: its servers
/// listen where they did before, so a separate `braid mount` that outlived it (it
/// learned the servers' addresses once, from the MGS) carries on, and every byte it
/// had fsynced or closed before the kill is there.
#[test]
fn a_mount_outlives_a_restart_of_braid_local() {
    let dir = testkit::TempDir::new("local-restart");
    let data = dir.path().join("data");
    let listen = format!("127.0.0.1:{}", testkit::free_port("127.0.0.1"));
    let data_arg = data.to_str().expect("utf-8 path").to_string();
    let args = ["local", "--data", &data_arg, "--listen", &listen, "--osts", "2"];
    let start = || {
        testkit::Daemon::start(bin(), &args, &[], &dir.path().join("local.log"), "MGS at")
            .unwrap_or_else(|log| panic!("braid local did not come up:\n{log}"))
    };
    let mut local = start();
    let url = format!("braid://{listen}/");
    let m = testkit::Mount::of(bin(), &url, &data.join("cluster.secret"), dir.path(), "");
    std::fs::create_dir(m.path("job")).unwrap();
    let before: Vec<Vec<u8>> = (0..20).map(|i| pattern(if i % 2 == 0 { 4096 } else { 200 << 10 }, i)).collect();
    for (i, bytes) in before.iter().enumerate() {
        let mut f = std::fs::File::create(m.path(&format!("job/f{i}"))).unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
        if i % 3 == 0 {
            f.sync_all().unwrap();
        }
    }

    local.kill(libc::SIGKILL);
    let _local = start();

    // The mount's next operations reach the restarted servers.
    std::fs::write(m.path("job/after"), b"written after the restart").unwrap();
    assert_eq!(std::fs::read(m.path("job/after")).unwrap(), b"written after the restart");
    let other = testkit::Mount::of(bin(), &url, &data.join("cluster.secret"), dir.path(), "");
    for (i, bytes) in before.iter().enumerate() {
        let got = std::fs::read(other.path(&format!("job/f{i}"))).unwrap();
        assert!(&got == bytes, "f{i} has {} bytes after the restart", got.len());
    }
    drop(other);
    drop(m);
}

#[test]
fn acknowledged_changes_through_a_mount_survive_servers_and_the_mount_killed() {
    let mut c = Cluster::start(bin(), two_oss());
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64;
    eprintln!("seed {seed}");
    let mut rng = seed | 1;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut mount = testkit::Mount::new(&c, "");
    let root = mount.path("work");

    // The servers killed at random under the workload: the mount blocks, resends what
    // the servers had not made durable, and loses nothing it acknowledged.
    std::fs::create_dir_all(&root).expect("the workload's root");
    let stop = c.dir.path().join("workload.stop");
    let work = start_everyday_workload(&root, &stop);
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(300 + next(700)));
        let role = ["mds", "oss0", "oss1"][next(3) as usize];
        let at = std::time::Instant::now();
        c.kill(role);
        let killed = at.elapsed();
        std::thread::sleep(Duration::from_millis(next(400)));
        c.restart(role);
        eprintln!("killing {role}: {killed:?} to die, {:?} to come back", at.elapsed());
    }
    // Enough files made after the last restart that the checks below mean something.
    everyday_goes_on(&stop, 25);
    let (acked, errors) = finish_everyday_workload(&stop, work);
    assert!(errors.is_empty(), "the mount failed calls across the restarts: {errors:#?}");
    c.wait_osts_up(4, WAIT);
    let files = check_acked(&acked, &root, &root);
    assert!(files > 20, "only {files} files acknowledged");
    // As another client sees them, from the servers.
    let other = testkit::Mount::new(&c, "");
    assert_eq!(check_acked(&acked, &root, &other.path("work")), files);
    let removals = acked.iter().filter(|a| matches!(a, Acked::Gone(_))).count();
    eprintln!("{files} files and {removals} removals checked after 4 server kills");

    // The mount killed under the workload: every change an fsync acknowledged is
    // there, and every name left has its inode.
    std::fs::create_dir_all(mount.path("work2")).expect("the workload's root");
    let work = start_everyday_workload(&mount.path("work2"), &stop);
    everyday_goes_on(&stop, 10);
    std::thread::sleep(Duration::from_millis(next(1000)));
    mount.kill();
    let (acked, _) = finish_everyday_workload(&stop, work);
    let files = check_acked(&acked, &mount.path("work2"), &other.path("work2"));
    assert!(files > 5, "only {files} files acknowledged before the kill");
    for d in std::fs::read_dir(other.path("work2")).expect("list work2") {
        let d = d.expect("an entry").path();
        for e in std::fs::read_dir(&d).expect("list a directory") {
            let p = e.expect("an entry").path();
            std::fs::metadata(&p).unwrap_or_else(|e| panic!("{}: a name without its inode: {e}", p.display()));
        }
    }
    drop(mount);
}

#[test]
fn a_mount_and_the_servers_go_on_while_the_mgs_is_away_and_say_so() {
    let mut c = Cluster::start(bin(), ClusterSpec::default());
    let m = testkit::Mount::new(&c, "");
    std::fs::write(m.path("before"), b"1").unwrap();
    c.kill("mgs");

    // Everything a mount does goes on without the MGS.
    std::fs::create_dir(m.path("d")).unwrap();
    let data = pattern(2 << 20, 3);
    std::fs::write(m.path("d/f"), &data).unwrap();
    assert!(std::fs::read(m.path("d/f")).unwrap() == data);
    std::fs::rename(m.path("d/f"), m.path("d/g")).unwrap();
    std::fs::remove_file(m.path("before")).unwrap();
    // statfs (df on the mount) shows the targets the mount knows of.
    let dir = std::ffi::CString::new(m.dir.to_string_lossy().as_bytes()).unwrap();
    // SAFETY: statvfs into a zeroed struct we own, on a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(dir.as_ptr(), &mut st) }, 0, "statfs without the MGS");
    assert!(st.f_blocks > 0);
    // And each says so, once.
    wait_for("the mount to say the MGS is away", Duration::from_secs(30), || m.log_text().contains("does not answer"));
    wait_for("the MDS and OSS to say the MGS is away", Duration::from_secs(60), || {
        ["mds", "oss0"].iter().all(|s| c.log_text(s).contains("does not answer"))
    });
    let said = c.log_text("mds").matches("does not answer").count();
    assert!(said <= 2, "the MDS says it once per outage (its refresh and its heartbeat), not {said} times");

    c.restart("mgs");
    wait_for("the mount to say the MGS is back", Duration::from_secs(30), || m.log_text().contains("answers again"));
    // A new client, which needs the MGS, works again.
    let fresh = testkit::Mount::new(&c, "");
    assert!(std::fs::read(fresh.path("d/g")).unwrap() == data);
}

#[test]
fn a_mount_follows_its_mdt_when_the_mds_comes_back_on_another_address() {
    let mut c = Cluster::start(bin(), ClusterSpec::default());
    let m = testkit::Mount::new(&c, "");
    std::fs::write(m.path("before"), b"before").unwrap();
    c.kill("mds");
    // A change made while the MDS is away...
    let during = m.path("during");
    let writer = std::thread::spawn(move || std::fs::write(during, b"during"));
    std::thread::sleep(Duration::from_millis(500));
    // ...is answered by the MDS come back on another address, as on a failover node.
    let ip = "127.0.0.31";
    let addr = format!("{ip}:{}", testkit::free_port(ip));
    c.edit_args("mds", |a| {
        let i = a.iter().position(|x| x == "--listen").expect("--listen");
        a[i + 1] = addr.clone();
    });
    c.restart("mds");
    writer.join().expect("the writer").expect("the change made across the move");
    assert_eq!(std::fs::read(m.path("during")).unwrap(), b"during");
    assert_eq!(std::fs::read(m.path("before")).unwrap(), b"before");
    std::fs::write(m.path("after"), b"after").unwrap();
    assert!(m.log_text().contains("the MDT moved"), "the mount says where it went");
    let fresh = testkit::Mount::new(&c, "");
    for (name, data) in [("before", &b"before"[..]), ("during", b"during"), ("after", b"after")] {
        assert_eq!(std::fs::read(fresh.path(name)).unwrap(), data, "{name} through another mount");
    }
}
