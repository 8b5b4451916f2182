//! `braid tier`, the tiering service, through real processes: an MGS, an MDS, an OSS
//! of two plain OSTs (pool `hot`) and one of two OSTs emulating a slow disk (pool
//! `cool`), a FUSE mount, native clients and the service itself, killed and restarted
//! in the middle of a copy.

use std::time::Duration;

use testkit::{field, pattern, wait_for, Cluster, ClusterSpec, Daemon, Mount};

const WAIT: Duration = Duration::from_secs(60);

fn cluster() -> Cluster {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_braid"));
    let mut c = Cluster::start(bin, ClusterSpec { osts_per_oss: vec![2], ..Default::default() });
    let slow: Vec<String> =
        (2..4).map(|k| format!("{}:class=hdd,bw=4M,lat=1ms", c.dir.path().join(format!("ost{k}")).display())).collect();
    c.add_oss_with("oss-cool", &slow);
    c.wait_placement(4, Duration::from_secs(30));
    let cl = c.url("/");
    for (name, osts) in [("braid.hot", "0-1"), ("braid.cool", "2-3")] {
        c.braid_ok(&["pool", "create", name, "--cluster", &cl]);
        c.braid_ok(&["pool", "add", name, osts, "--cluster", &cl]);
    }
    c
}

/// The pools of `file`'s mirrors, in mirror order, and whether each is in sync.
fn copies(c: &Cluster, file: &str) -> Vec<(String, bool)> {
    let text = c.braid_ok(&["getstripe", &c.url(file)]);
    if !text.contains("lcme_id:") {
        return vec![(field(&text, "lmm_pool").unwrap_or("").to_string(), true)];
    }
    let mut out: Vec<(u16, String, bool)> = Vec::new();
    for comp in text.split("lcme_id:").skip(1) {
        let m: u16 = field(comp, "lcme_mirror_id").unwrap().parse().unwrap();
        let stale = field(comp, "lcme_flags").unwrap().contains("stale");
        let pool = field(comp, "lmm_pool").unwrap_or("").to_string();
        match out.iter_mut().find(|o| o.0 == m) {
            Some(o) => o.2 &= !stale,
            None => out.push((m, pool, !stale)),
        }
    }
    out.into_iter().map(|(_, p, s)| (p, s)).collect()
}

fn tier(c: &Cluster, policy: &std::path::Path) -> Daemon {
    let log = c.dir.path().join("tier.log");
    let args = ["tier", "run", "--policy", policy.to_str().unwrap(), "--secret-file", c.secret.to_str().unwrap()];
    let url = c.url("/");
    let mut all: Vec<&str> = args.to_vec();
    all.push(&url);
    Daemon::start(&c.bin, &all, &[], &log, "tiering").expect("braid tier run starts")
}

#[test]
fn the_service_mirrors_idle_files_purges_the_coldest_above_the_watermark_and_stages_what_is_read_again() {
    let c = cluster();
    let policy = c.dir.path().join("tier.toml");
    std::fs::write(
        &policy,
        "hot_pool = \"hot\"\ncool_pool = \"cool\"\nmirror_age_s = 1\nscan_interval_ms = 300\n\
         high_watermark = 60\nlow_watermark = 30\nhot_capacity = \"4M\"\n",
    )
    .unwrap();
    let mut svc = tier(&c, &policy);
    let m = Mount::new(&c, "");
    // New files land in the hot pool (the service set the root's default).
    let files: Vec<(String, Vec<u8>)> = (0..3).map(|i| (format!("f{i}"), pattern(1 << 20, i))).collect();
    for (name, data) in &files {
        std::fs::write(m.path(name), data).unwrap();
        assert_eq!(copies(&c, &format!("/{name}"))[0].0, "hot", "{name} lands in the hot pool");
        std::thread::sleep(Duration::from_millis(50)); // an LRU order, to the millisecond
    }
    // Idle for a second, each gets a cool copy; 3 MiB of a 4 MiB hot pool is above
    // 60%, so the two least recently used lose their hot copy (down to 30%), also
    // if the first of them were mirrored a pass before the others.
    wait_for("two files purged to cool and one kept hot", WAIT, || {
        let now: Vec<Vec<(String, bool)>> = files.iter().map(|(n, _)| copies(&c, &format!("/{n}"))).collect();
        now[0] == [("cool".to_string(), true)]
            && now[1] == [("cool".to_string(), true)]
            && now[2].len() == 2
            && now[2].iter().all(|(_, s)| *s)
    });
    // A read of a purged file is served from cool at once; the service learns of it
    // (the MDS's open log) and stages the file back to hot.
    assert!(c.get("/f0") == files[0].1, "f0 whole from the cool pool");
    wait_for("f0 staged back to hot", WAIT, || copies(&c, "/f0").iter().any(|(p, s)| p == "hot" && *s));
    assert!(c.get("/f0") == files[0].1);
    let status = c.braid_ok(&["tier", "status", "--policy", policy.to_str().unwrap()]);
    assert!(status.contains("hot pool 'hot':") && status.contains("purging above 60% down to 30%"), "{status}");
    for what in ["mirror /f0", "purge /f0", "stage /f0"] {
        assert!(status.contains(what), "'{what}' in the latest moves:\n{status}");
    }

    // Killed in the middle of a copy (8 MiB to the 4 MiB/s cool pool), the service
    // leaves the file as it was: one copy, whole; restarted, it finishes the job.
    let big = pattern(8 << 20, 9);
    std::fs::write(m.path("big"), &big).unwrap();
    let cool_objects = || (2..4).map(|k| testkit::objects_in(&c.ost_dir(k)).len()).sum::<usize>();
    let before = cool_objects();
    wait_for("the cool copy of big to be under way", WAIT, || cool_objects() > before);
    svc.kill(libc::SIGKILL);
    assert_eq!(copies(&c, "/big"), vec![("hot".to_string(), true)], "no half-made mirror");
    assert!(c.get("/big") == big);
    let mut svc = tier(&c, &policy);
    // (8 MiB of a 4 MiB hot pool: its hot copy goes as soon as the cool one is whole.)
    wait_for("big mirrored after the restart", WAIT, || copies(&c, "/big").iter().any(|(p, s)| p == "cool" && *s));
    c.braid_ok(&["mirror", "verify", &c.url("/big")]);
    assert!(c.get("/big") == big);
    svc.kill(libc::SIGKILL);

    // Explicit moves (burst-buffer staging), with the service stopped.
    let p = policy.to_str().unwrap();
    std::fs::write(m.path("job"), pattern(300_000, 4)).unwrap();
    c.braid_ok(&["tier", "flush", "--policy", p, &c.url("/job")]);
    assert_eq!(copies(&c, "/job").len(), 2, "flushed: a cool copy beside the hot one");
    c.braid_ok(&["tier", "purge", "--policy", p, &c.url("/job")]);
    assert_eq!(copies(&c, "/job"), vec![("cool".to_string(), true)]);
    let out = c.braid_ok(&["tier", "stage", "--policy", p, &c.url("/job")]);
    assert!(out.contains("hot copy made"), "{out}");
    assert!(copies(&c, "/job").iter().any(|(p, s)| p == "hot" && *s));
    assert!(std::fs::read(m.path("job")).unwrap() == pattern(300_000, 4));
    for (name, data) in &files {
        assert!(c.get(&format!("/{name}")) == *data, "{name} whole wherever it is");
    }

    // A policy with a typo is a clear error, and nothing runs.
    let bad = c.dir.path().join("bad.toml");
    std::fs::write(&bad, "hot_pool = \"hot\"\ncool_pool = \"cool\"\nhigh_watermrk = 90\n").unwrap();
    let out = c.braid(&["tier", "run", "--policy", bad.to_str().unwrap(), &c.url("/")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field `high_watermrk`"));
    let out = c.braid(&["tier", "stage", "--policy", p, &c.url("/")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("moves regular files"));
}
