//! A replicated MDT (`braid mds --replicas`, the `mds::replica` module): three MDS
//! processes replicate MDT 0 through Raft; a change is acknowledged only once a
//! majority holds it; a real mount keeps working while the leader is SIGKILLed
//! twice (a change made during each failover lands, a lock
//! the mount holds is replayed to the new leader, a killed replica comes back and
//! catches up), and the namespace checker finds every replica's database
//! consistent. Strangers are refused, and the group serves on: Raft messages from a
//! client, for another group, or that do not decode; a replica started on another
//! group's directory; a replica with another cluster secret or file system name.

use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::{output_within, setlk, stderr, Cluster, ClusterSpec, Daemon, Mount};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

const WAIT: Duration = Duration::from_secs(60);

fn spec() -> ClusterSpec {
    ClusterSpec { mdt_replicas: 3, osts_per_oss: vec![2], ..Default::default() }
}

/// Kills the replica serving the MDT, writes `name` through `m` (the write waits
/// through the failover) and returns the killed replica and how long the write took.
fn fail_over(c: &mut Cluster, m: &Mount, name: &str) -> (String, Duration) {
    let leader = c.mdt_leader(WAIT);
    c.kill(&leader);
    let start = Instant::now();
    std::fs::write(m.path(name), name.as_bytes()).expect("a write across the failover");
    let took = start.elapsed();
    eprintln!("{leader} killed: a write waited {took:?} for the next leader");
    (leader, took)
}

fn replica_dirs(c: &Cluster) -> Vec<PathBuf> {
    (0..3).map(|k| c.dir.path().join(format!("mdt0-r{k}"))).collect()
}

#[test]
fn a_replicated_mdt_serves_through_the_loss_of_its_leaders() {
    let mut c = Cluster::start(bin(), spec());
    let m = Mount::new(&c, "");
    let m2 = Mount::new(&c, "");
    std::fs::create_dir(m.path("d")).unwrap();
    for i in 0..20 {
        std::fs::write(m.path(&format!("d/f{i}")), format!("file {i}")).unwrap();
    }
    std::fs::rename(m.path("d/f0"), m.path("renamed")).unwrap();
    std::os::unix::fs::symlink("renamed", m.path("link")).unwrap();
    std::fs::write(m.path("locked"), b"locked").unwrap();
    let locked = std::fs::OpenOptions::new().read(true).write(true).open(m.path("locked")).unwrap();
    assert_eq!(setlk(locked.as_raw_fd(), libc::F_WRLCK), 0);

    // A change is acknowledged only once a majority holds it: with both followers
    // stopped, a create waits; it completes once they go on.
    let leader = c.mdt_leader(WAIT);
    let followers: Vec<u32> = (0..3)
        .map(|k| format!("mds{k}"))
        .filter(|n| *n != leader)
        .map(|n| c.servers[&n].pid().expect("running"))
        .collect();
    let signal = |sig: i32| {
        for pid in &followers {
            // SAFETY: kill(2) of server processes this test started.
            unsafe { libc::kill(*pid as i32, sig) };
        }
    };
    signal(libc::SIGSTOP);
    let path = m.path("majority");
    // With fsync: the mount may answer a create in a directory it holds the lease on
    // itself and flush it after close (the client's `async_create`); fsync returns
    // once the MDS acknowledged it.
    let create = std::thread::spawn(move || {
        let mut f = std::fs::File::create(path)?;
        std::io::Write::write_all(&mut f, b"majority")?;
        f.sync_all()
    });
    std::thread::sleep(Duration::from_millis(1500));
    let waited = !create.is_finished();
    signal(libc::SIGCONT);
    assert!(waited, "a create was acknowledged while no follower could hold it");
    create.join().unwrap().expect("the create completes once the followers go on");
    assert_eq!(std::fs::read_to_string(m2.path("majority")).unwrap(), "majority");

    let (first, _) = fail_over(&mut c, &m, "during1");
    // The lock the mount held was replayed to the new leader: the other mount is
    // refused it.
    let other = std::fs::OpenOptions::new().read(true).write(true).open(m2.path("locked")).unwrap();
    assert_eq!(setlk(other.as_raw_fd(), libc::F_WRLCK), libc::EAGAIN, "the lock survived the failover");
    // Everything acknowledged before is there, through both mounts.
    for mount in [&m, &m2] {
        assert_eq!(std::fs::read_to_string(mount.path("d/f19")).unwrap(), "file 19");
        assert_eq!(std::fs::read_to_string(mount.path("link")).unwrap(), "file 0");
        assert_eq!(std::fs::read_to_string(mount.path("during1")).unwrap(), "during1");
    }

    // The killed replica comes back and catches up; with one replica down again,
    // every commit now needs it.
    c.restart(&first);
    for i in 0..20 {
        std::fs::write(m.path(&format!("d/g{i}")), format!("again {i}")).unwrap();
    }
    std::fs::remove_file(m.path("d/f1")).unwrap();
    let (second, _) = fail_over(&mut c, &m, "during2");
    assert_ne!(first, second, "the next leader is another replica");
    assert_eq!(std::fs::read_to_string(m2.path("d/g19")).unwrap(), "again 19");
    assert!(!m2.path("d/f1").exists(), "an unlink before the failover stays done");
    assert_eq!(std::fs::read_dir(m2.path("d")).unwrap().count(), 18 + 20);
    c.restart(&second);
    std::fs::write(m.path("after"), b"after").unwrap();
    assert_eq!(std::fs::read_to_string(m2.path("after")).unwrap(), "after");
    drop(other);
    drop(locked);

    // Every replica's database is a consistent namespace.
    m.umount().unwrap();
    m2.umount().unwrap();
    for k in 0..3 {
        c.stop(&format!("mds{k}"));
    }
    for dir in replica_dirs(&c) {
        let out = c.braid(&["check-namespace", "--mdt", &dir.display().to_string()]);
        assert!(out.status.success(), "{}: {}{}", dir.display(), testkit::stdout(&out), stderr(&out));
    }
}

#[test]
fn replicas_refuse_strangers_and_serve_on() {
    use proto::msg::{RaftRpc, Request};
    let mut c = Cluster::start(bin(), spec());
    let m = Mount::new(&c, "");
    std::fs::write(m.path("before"), b"before").unwrap();
    let list: Vec<String> = (0..3).map(|k| c.addr(&format!("mds{k}"))).collect();
    let group = mds::replica::ReplicaConfig {
        dir: PathBuf::new(),
        replicas: list.clone(),
        me: 0,
        fsname: "braid".into(),
        heartbeat: Duration::ZERO,
        election_timeout: Duration::ZERO,
        snapshot_entries: 0,
    }
    .group();
    let rt = testkit::runtime();
    let secret = proto::auth::Secret::load(&c.secret).expect("the cluster secret");
    let refusal = |role: &str, group: &str, payload: &[u8]| -> String {
        let rpc =
            rpc::RpcClient::new(c.addr("mds1"), rpc::Identity::new(role, secret.clone()), rpc::RpcOptions::default());
        let req = Request::MdtRaft { fsname: "braid".into(), group: group.into(), kind: RaftRpc::AppendEntries };
        let r = rt.block_on(rpc.call(&req, vec![bytes::Bytes::copy_from_slice(payload)]));
        format!("{:?}", r.expect_err("a stranger's Raft message is refused"))
    };
    let said = refusal("client", &group, b"");
    assert!(said.contains("MDS replicas only"), "{said}");
    let said = refusal("mds", "mdt-replicas-0000000000000000", b"");
    assert!(said.contains("group"), "{said}");
    for garbage in [&b""[..], &b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"[..], &[7u8; 3000][..]] {
        let said = refusal("mds", &group, garbage);
        assert!(said.contains("does not decode"), "{said}");
    }

    // A replica started on a directory of another group (another replica list).
    c.kill("mds2");
    let mut args = c.server_args("mds2");
    let i = args.iter().position(|a| a == "--replicas").unwrap();
    args[i + 1] = [list[2].clone(), list[0].clone(), list[1].clone()].join(",");
    let out = output_within(Command::new(bin()).args(&args), WAIT).expect("the replica exits");
    assert!(!out.status.success());
    assert!(stderr(&out).contains("belongs to replica group"), "{}", stderr(&out));

    // A replica with another cluster secret cannot take part: the others refuse
    // its messages, and the group (two of three) serves on.
    let other = c.dir.path().join("other.secret");
    assert!(Command::new(bin()).arg("gen-secret").arg(&other).status().unwrap().success());
    let mut args = c.server_args("mds2");
    let i = args.iter().position(|a| a == "--secret-file").unwrap();
    args[i + 1] = other.display().to_string();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let log = c.dir.path().join("impostor.log");
    let mut impostor = Daemon::start(bin(), &argv, &[], &log, "listening on").expect("the impostor starts");
    std::thread::sleep(Duration::from_secs(2));
    for i in 0..10 {
        std::fs::write(m.path(&format!("f{i}")), b"x").unwrap();
    }
    assert_eq!(std::fs::read_to_string(m.path("before")).unwrap(), "before");
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(said.contains("authentication") || said.contains("secret"), "the impostor says why:\n{said}");
    assert!(!said.contains("served by this replica"), "the impostor never leads");
    impostor.stop(Duration::from_secs(5));

    // A replica of another file system name: refused too, and says so.
    let mut args = c.server_args("mds2");
    args.extend(["--fsname".into(), "other".into()]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let log = c.dir.path().join("other-fs.log");
    let mut impostor = Daemon::start(bin(), &argv, &[], &log, "listening on").expect("the replica starts");
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(m.path("g"), b"g").unwrap();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(said.contains("this replica is of file system 'braid'"), "the replica says why:\n{said}");
    assert!(!said.contains("served by this replica"), "it never leads");
    impostor.stop(Duration::from_secs(5));

    // The replica itself comes back and catches up: once the leader is killed,
    // nothing commits without it.
    c.restart("mds2");
    let (killed, _) = fail_over(&mut c, &m, "last");
    assert_ne!(killed, "mds2");
    assert_eq!(std::fs::read_to_string(m.path("f9")).unwrap(), "x");
    assert_eq!(std::fs::read_to_string(m.path("last")).unwrap(), "last");
}

/// Operations that span MDTs (renames and links between the replicated MDT 0 and
/// a plain MDT 1) stay whole while MDT 0's leader is killed among them: every
/// acknowledged one is done, and MDT 1 with each replica of MDT 0 is a consistent
/// namespace.
#[test]
fn operations_across_mdts_stay_whole_through_a_failover() {
    let mut c = Cluster::start(bin(), spec());
    let mdt1 = c.dir.path().join("mdt1");
    c.add_mds("mdsx", std::slice::from_ref(&mdt1));
    c.wait_mdts_up(2, WAIT);
    c.braid_ok(&["mkdir", "-i", "1", &c.url("/r")]);
    let m = Mount::new(&c, "");
    for i in 0..40 {
        std::fs::write(m.path(&format!("f{i}")), format!("{i}")).unwrap();
    }
    let root = m.path("");
    let worker = std::thread::spawn(move || {
        // Moves every file into /r (MDT 1) and links it back under another name.
        let mut done = Vec::new();
        for i in 0..40 {
            std::fs::rename(root.join(format!("f{i}")), root.join(format!("r/f{i}"))).expect("a rename across MDTs");
            std::fs::hard_link(root.join(format!("r/f{i}")), root.join(format!("l{i}"))).expect("a link across MDTs");
            done.push(i);
            std::thread::sleep(Duration::from_millis(50));
        }
        done
    });
    std::thread::sleep(Duration::from_millis(600));
    let (killed, _) = fail_over(&mut c, &m, "during");
    let done = worker.join().expect("every operation across MDTs succeeds");
    assert_eq!(done.len(), 40);
    for i in 0..40 {
        assert!(!m.path(&format!("f{i}")).exists(), "f{i} moved");
        assert_eq!(std::fs::read_to_string(m.path(&format!("r/f{i}"))).unwrap(), format!("{i}"));
        assert_eq!(std::fs::read_to_string(m.path(&format!("l{i}"))).unwrap(), format!("{i}"));
    }
    c.restart(&killed);
    std::fs::write(m.path("after"), b"after").unwrap();
    m.umount().unwrap();
    // Checkpoints and the followers' flushes put everything in the databases.
    std::thread::sleep(Duration::from_secs(3));
    for k in 0..3 {
        c.stop(&format!("mds{k}"));
    }
    c.stop("mdsx");
    for dir in replica_dirs(&c) {
        let out =
            c.braid(&["check-namespace", "--mdt", &dir.display().to_string(), "--mdt", &mdt1.display().to_string()]);
        assert!(out.status.success(), "{}: {}{}", dir.display(), testkit::stdout(&out), stderr(&out));
    }
}

/// A replica away while the group trimmed its log catches up from a snapshot of
/// the MDT, and then takes part: with it and one other left, the group serves on.
#[test]
fn a_replica_away_past_the_log_catches_up_from_a_snapshot() {
    let spec = ClusterSpec { mds_args: vec!["--raft-snapshot-entries".into(), "20".into()], ..spec() };
    let mut c = Cluster::start(bin(), spec);
    let m = Mount::new(&c, "");
    let leader = c.mdt_leader(WAIT);
    let away = (0..3).map(|k| format!("mds{k}")).find(|n| *n != leader).unwrap();
    c.kill(&away);
    // Many entries (one create each, alone), past a checkpoint, so that a snapshot
    // is built from the database and the log trimmed behind it.
    for round in 0..3 {
        for i in 0..60 {
            std::fs::write(m.path(&format!("f{round}-{i}")), format!("{round} {i}")).unwrap();
        }
        std::thread::sleep(Duration::from_millis(1500));
    }
    c.restart(&away);
    testkit::wait_for("the returning replica to install a snapshot", WAIT, || {
        c.log_text(&away).contains("snapshot installed")
    });
    // Now the returning replica is needed for every commit.
    let (killed, _) = fail_over(&mut c, &m, "after");
    assert_eq!(killed, leader);
    for round in 0..3 {
        for i in [0, 59] {
            assert_eq!(std::fs::read_to_string(m.path(&format!("f{round}-{i}"))).unwrap(), format!("{round} {i}"));
        }
    }
    assert_eq!(std::fs::read_dir(m.path("")).unwrap().count(), 3 * 60 + 1);
}
