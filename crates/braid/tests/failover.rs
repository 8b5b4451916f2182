//! MDS failover with multiple-mount protection (`braid mds --failover`, `--standby`;
//! Lustre's failover pairs with MMP) through separate processes and a real mount: a
//! second MDS refuses an MDT another serves; a standby waits while it is served, takes
//! it over once its MDS is killed, the MGS sends clients there, and a mount carries
//! on, a change made during the failover included, and its locks and a file unlinked
//! while open replayed to the standby; the first MDS, started again, refuses the MDT
//! the standby now serves.

use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::{free_port, output_within, setlk, stderr, wait_for, Cluster, ClusterSpec, Daemon, Mount};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

/// The MMP interval of these tests, in milliseconds.
const INTERVAL_MS: &str = "200";

/// `args` of an MDS, listening on a free port of `ip` instead, with `extra`.
fn elsewhere(args: &[String], ip: &str, extra: &[&str]) -> Vec<String> {
    let mut a = args.to_vec();
    let i = a.iter().position(|x| x == "--listen").expect("--listen");
    a[i + 1] = format!("{ip}:{}", free_port(ip));
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Runs an MDS with `args` that must refuse to start; what it said.
fn refused(args: &[String]) -> String {
    let out = output_within(Command::new(bin()).args(args), Duration::from_secs(60)).expect("the MDS exits");
    assert!(!out.status.success(), "an MDS for a served MDT started");
    stderr(&out)
}

#[test]
fn a_standby_mds_takes_the_mdt_over_and_a_mount_follows() {
    let spec = ClusterSpec {
        mds_args: vec!["--failover".into(), "--mmp-interval-ms".into(), INTERVAL_MS.into()],
        ..Default::default()
    };
    let mut c = Cluster::start(bin(), spec);
    let m = Mount::new(&c, "");
    std::fs::write(m.path("before"), b"before").unwrap();
    // What the mount holds across the failover: a lock, and a file unlinked while open.
    std::fs::write(m.path("locked"), b"locked").unwrap();
    let locked = std::fs::OpenOptions::new().read(true).write(true).open(m.path("locked")).unwrap();
    assert_eq!(setlk(locked.as_raw_fd(), libc::F_WRLCK), 0);
    std::fs::write(m.path("orphan"), b"orphan").unwrap();
    let orphan = std::fs::File::open(m.path("orphan")).unwrap();
    std::fs::remove_file(m.path("orphan")).unwrap();
    let args = c.server_args("mds");

    // A second MDS for the MDT, not a standby, is refused while the first serves it.
    let said = refused(&elsewhere(&args, "127.0.0.33", &[]));
    assert!(said.contains("is served by the MDS at"), "{said}");

    // A standby waits while the first serves the MDT.
    let standby = elsewhere(&args, "127.0.0.34", &["--standby"]);
    let argv: Vec<&str> = standby.iter().map(String::as_str).collect();
    let log = c.dir.path().join("standby.log");
    let _standby = Daemon::start(bin(), &argv, &[("BRAID_LOG", Path::new("info"))], &log, "standing by")
        .expect("the standby starts");
    let took = || std::fs::read_to_string(&log).unwrap_or_default().contains("took the MDT");
    wait_for("the standby to see the MDT served", Duration::from_secs(30), || {
        std::fs::read_to_string(&log).unwrap_or_default().contains("standing by: the MDT")
    });
    std::fs::write(m.path("served"), b"served").unwrap();
    assert!(!took(), "the standby took an MDT its MDS still served");

    // The first is killed: the standby takes over, and a change made meanwhile lands.
    let at = Instant::now();
    c.kill("mds");
    let during = m.path("during");
    let writer = std::thread::spawn(move || std::fs::write(during, b"during"));
    writer.join().expect("the writer").expect("a change made across the failover");
    eprintln!("failover: {:?} from the kill to the change answered", at.elapsed());
    assert!(took(), "the standby serves the MDT");
    assert!(m.log_text().contains("the MDT moved"), "the mount followed the MDT");
    let fresh = Mount::new(&c, "");
    for (name, data) in [("before", &b"before"[..]), ("served", b"served"), ("during", b"during")] {
        assert_eq!(std::fs::read(m.path(name)).unwrap(), data, "{name} through the mount");
        assert_eq!(std::fs::read(fresh.path(name)).unwrap(), data, "{name} through a new mount");
    }
    // The lock is the mount's still (another client is refused it), and the file
    // unlinked while open is there for its handle (past the reaper's first passes).
    let theirs = std::fs::OpenOptions::new().read(true).write(true).open(fresh.path("locked")).unwrap();
    assert_eq!(setlk(theirs.as_raw_fd(), libc::F_WRLCK), libc::EAGAIN, "the lock after the failover");
    std::thread::sleep(Duration::from_secs(3));
    let mut back = String::new();
    std::io::Read::read_to_string(&mut &orphan, &mut back).unwrap();
    assert_eq!(back, "orphan", "the unlinked file through its handle after the failover");
    drop(locked);
    assert_eq!(setlk(theirs.as_raw_fd(), libc::F_WRLCK), 0, "the lock once released");

    // The first MDS, started again, refuses the MDT the standby serves now.
    let said = refused(&args);
    assert!(said.contains("is served by the MDS at 127.0.0.34"), "{said}");
}
