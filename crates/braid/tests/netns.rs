//! A cluster of separate nodes on one machine (`scripts/netns-cluster.sh`): the MGS,
//! one MDS, two OSSs and two clients, each in a network namespace of its own with its
//! own address, on links with 1 ms of netem delay (on a kernel without netem, a tbf
//! rate limit instead). Checks that every server runs in its own namespace; that a
//! file striped over both OSSs and written through client0's mount reads back byte
//! for byte through client1's; that root squash goes by the client's address (the
//! MGS exempts client0 only): root through client0 may give a file away, root
//! through client1 may not and what it creates is 65534:65534, also as client0 sees
//! it and for the CLI run from each node; that `status` shows every process alive;
//! and that `down` leaves no process, mount or namespace behind (and may run twice).
//! A guard runs `down` when the test ends, also when it fails.

mod netns_common;

use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use netns_common::{started, NetnsCluster, SCRIPT};
use testkit::{code, getstripe_objects, is_mounted, objects_in, output_within, pattern, stderr, stdout};

const NOBODY: u32 = 65534;

fn chown(p: &Path, uid: u32, gid: u32) -> i32 {
    code(std::os::unix::fs::chown(p, Some(uid), Some(gid)))
}

fn owner(p: &Path) -> (u32, u32) {
    let m = fs::metadata(p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display()));
    (m.uid(), m.gid())
}

/// The link of `/proc/PID/ns/net`: which network namespace a process is in.
fn netns_of(pid: &str) -> String {
    fs::read_link(format!("/proc/{pid}/ns/net")).expect("read a network namespace link").to_string_lossy().into_owned()
}

/// Whether the kernel takes netem (the script's `check` tries it).
fn netem_available() -> bool {
    let mut c = Command::new("bash");
    c.arg(SCRIPT).arg("check");
    let out = output_within(&mut c, Duration::from_secs(60)).expect("netns-cluster.sh check finished");
    assert!(out.status.success(), "netns-cluster.sh check failed: {}{}", stdout(&out), stderr(&out));
    stdout(&out).lines().any(|l| l.starts_with("netem: yes"))
}

#[test]
fn separate_nodes_stripe_share_and_squash_by_address() {
    // SAFETY: geteuid(2) has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "network namespaces need root (scripts/test.sh runs as root)");
    let start = Instant::now();
    let shaping: &[&str] = if netem_available() {
        &["--delay", "1"]
    } else {
        eprintln!("this kernel has no netem (sch_netem): the links get --rate 1gbit (tbf) instead of --delay 1");
        &["--rate", "1gbit"]
    };
    let mut args = vec!["--mdss", "1", "--osss", "2", "--osts-per-oss", "2", "--clients", "2"];
    args.extend_from_slice(shaping);
    args.extend_from_slice(&["--mgs-args", "--root-squash 65534:65534 --nosquash-nids {client0}"]);
    let c = NetnsCluster::up(&args);
    eprintln!("up after {:?}", start.elapsed());

    // Six nodes, each with its own address on one /24; each server in a network
    // namespace of its own, none of them ours; the links shaped as asked.
    let names: Vec<&str> = c.nodes.keys().map(String::as_str).collect();
    assert_eq!(names, ["client0", "client1", "mds0", "mgs", "oss0", "oss1"]);
    let subnet = |ip: &str| ip.rsplit_once('.').map(|(net, _)| net.to_string()).expect("an IPv4 address");
    let mut ips: Vec<&String> = c.nodes.values().collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 6, "every node has its own address: {:?}", c.nodes);
    assert!(c.nodes.values().all(|ip| subnet(ip) == subnet(c.ip("mgs"))), "one /24: {:?}", c.nodes);
    let mut spaces = vec![netns_of("self")];
    for server in ["mgs", "mds0", "oss0", "oss1"] {
        spaces.push(netns_of(&c.pid(server).to_string()));
    }
    let mut distinct = spaces.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), spaces.len(), "each server in a network namespace of its own: {spaces:?}");
    let mgs_cmd = fs::read(c.state.path().join("cmd/mgs")).expect("the MGS's command");
    let mgs_cmd: Vec<&[u8]> = mgs_cmd.split(|&b| b == 0).collect();
    let exempt = mgs_cmd.iter().position(|a| *a == b"--nosquash-nids").map(|i| mgs_cmd[i + 1]);
    assert_eq!(exempt, Some(c.ip("client0").as_bytes()), "the MGS exempts client0's address");
    let qdisc = c.ok("exec", &["client0", "--", "tc", "qdisc", "show", "dev", "eth0"]);
    let kind = if shaping[0] == "--delay" { "netem" } else { "tbf" };
    assert!(qdisc.contains(kind), "client0's link is shaped by {kind}: {qdisc}");

    let m0 = c.mount("client0", "allow_other");
    let m1 = c.mount("client1", "allow_other");

    // A file striped over all four OSTs (both OSSs), written through client0 and read
    // through client1.
    c.braid_ok("client0", &["setstripe", "-c", "4", &c.url("/striped")]);
    let layout = c.braid_ok("client0", &["getstripe", &c.url("/striped")]);
    let mut osts: Vec<u32> = getstripe_objects(&layout).iter().map(|&(ost, _)| ost).collect();
    osts.sort();
    assert_eq!(osts, [0, 1, 2, 3], "striped over every OST:\n{layout}");
    let data = pattern(6 << 20, 41);
    fs::write(m0.join("striped"), &data).expect("write through client0");
    let read = fs::read(m1.join("striped")).expect("read through client1");
    assert_eq!(read.len(), data.len(), "the size client1 sees");
    assert!(read == data, "client1 reads other bytes than client0 wrote");
    for oss in ["oss0", "oss1"] {
        let bytes: u64 = (0..2)
            .flat_map(|k| objects_in(&c.state.path().join(format!("data/{oss}/ost{k}"))))
            .map(|o| fs::metadata(o).map(|m| m.len()).unwrap_or(0))
            .sum();
        assert!(bytes >= 1 << 20, "{oss} holds {bytes} bytes of the file's objects");
    }

    // Root squash by address: client0 is exempt, client1 is not.
    fs::create_dir(m0.join("shared")).unwrap();
    fs::set_permissions(m0.join("shared"), fs::Permissions::from_mode(0o777)).unwrap();
    File::create(m0.join("shared/given")).unwrap();
    File::create(m0.join("shared/roots")).unwrap();
    assert_eq!(owner(&m0.join("shared/roots")), (0, 0), "root's file through client0");
    assert_eq!(chown(&m0.join("shared/given"), 1000, 1000), 0, "chown by root through client0");
    assert_eq!(owner(&m1.join("shared/given")), (1000, 1000), "the chown as client1 sees it");
    assert_eq!(chown(&m1.join("shared/roots"), 1000, 1000), libc::EPERM, "chown by root through client1");
    assert_eq!(owner(&m0.join("shared/roots")), (0, 0), "the refused chown changed nothing");
    File::create(m1.join("shared/squashed")).unwrap();
    assert_eq!(owner(&m1.join("shared/squashed")), (NOBODY, NOBODY), "root's new file through client1");
    assert_eq!(owner(&m0.join("shared/squashed")), (NOBODY, NOBODY), "client1's file as client0 sees it");
    assert_eq!(chown(&m1.join("shared/squashed"), 1000, 1000), libc::EPERM, "chown of its own file by squashed root");
    assert_eq!(code(File::create(m1.join("in-root"))), libc::EACCES, "squashed root in root's 0755 directory");
    // The CLI from each node: the MDS goes by the address a request comes from.
    c.braid_ok("client0", &["setstripe", "-c", "1", &c.url("/shared/cli0")]);
    c.braid_ok("client1", &["setstripe", "-c", "1", &c.url("/shared/cli1")]);
    assert_eq!(owner(&m0.join("shared/cli0")), (0, 0), "a CLI create from client0");
    assert_eq!(owner(&m0.join("shared/cli1")), (NOBODY, NOBODY), "a CLI create from client1");

    // Every process the script started is alive.
    let status = c.ok("status", &[]);
    for node in ["mgs", "mds0", "oss0", "oss1", "client0", "client1"] {
        let line = status
            .lines()
            .find(|l| l.starts_with(&format!("{node} ")))
            .unwrap_or_else(|| panic!("{node} in:\n{status}"));
        assert!(line.contains(" alive") && !line.contains("dead"), "{node} alive:\n{status}");
    }
    assert_eq!(status.matches(" alive").count(), 7, "4 servers, 2 mounts and the watcher alive:\n{status}");

    // down stops every process, unmounts and deletes every namespace it made; twice.
    let procs: Vec<(u32, Option<String>)> =
        ["mgs", "mds0", "oss0", "oss1", "mount-0", "mount-1"].iter().map(|n| (c.pid(n), started(c.pid(n)))).collect();
    assert!(procs.iter().all(|(_, s)| s.is_some()), "every recorded process runs: {procs:?}");
    let spaces = c.namespaces();
    assert_eq!(spaces.len(), 7, "six nodes and the switch: {spaces:?}");
    c.ok("down", &[]);
    c.ok("down", &[]);
    for (pid, start) in procs {
        assert!(started(pid) != start, "process {pid} still runs after down");
    }
    assert!(!is_mounted(&m0) && !is_mounted(&m1), "mounts left after down");
    for ns in spaces {
        assert!(!Path::new("/run/netns").join(&ns).exists(), "namespace {ns} left after down");
    }
    eprintln!("done after {:?}", start.elapsed());
}
