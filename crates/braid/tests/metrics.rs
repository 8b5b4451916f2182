//! Metrics of a real cluster (issue 42, items 1 and 2): the MGS, MDS, OSS and a mount,
//! each a process of its own with `--metrics` (`-o metrics=` for the mount), scraped
//! over HTTP after work from a job (`SLURM_JOB_ID`); what they serve passes
//! `promtool check metrics` and counts that job's bytes on the OSTs it wrote; `braid
//! stats` and `braid top` read the same numbers through the cluster's RPCs; garbage
//! and silent scrapers leave file service alone; bad metrics settings are refused.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use metrics::parse::{parse, Sample};
use testkit::{free_port, stderr, Cluster, ClusterSpec, Mount};

fn endpoint() -> String {
    format!("127.0.0.1:{}", free_port("127.0.0.1"))
}

/// `GET path` at `addr`: the status code and body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to the metrics endpoint {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("not HTTP: {raw:?}"));
    (head.split(' ').nth(1).unwrap().parse().unwrap(), body.to_string())
}

fn scrape(addr: &str) -> (String, Vec<Sample>) {
    let (code, body) = get(addr, "/metrics");
    assert_eq!(code, 200, "{body}");
    let samples = parse(&body).unwrap_or_else(|e| panic!("the metrics of {addr} do not parse: {e}\n{body}"));
    (body, samples)
}

/// `promtool check metrics` on `text`: Prometheus' own linter.
fn promtool_check(what: &str, text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool (Debian package prometheus; scripts/test.sh installs it)");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics of the {what}:\n{said}");
}

/// The sum of the samples named `name` whose labels include `labels`.
fn sum(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
        .map(|s| s.value)
        .sum()
}

fn run_as_job(job: &str, script: &str, dir: &Path) {
    let out = Command::new("sh").arg("-c").arg(script).current_dir(dir).env("SLURM_JOB_ID", job).output().unwrap();
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn every_process_serves_metrics_that_promtool_accepts_and_that_count_jobs() {
    let (mgs_m, mds_m, oss_m, mount_m) = (endpoint(), endpoint(), endpoint(), endpoint());
    let spec = ClusterSpec {
        osts_per_oss: vec![2],
        mgs_args: vec!["--metrics".into(), mgs_m.clone()],
        mds_args: vec!["--metrics".into(), mds_m.clone()],
        oss_args: vec!["--metrics".into(), oss_m.clone()],
        ..Default::default()
    };
    let c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), spec);
    let cache = c.dir.path().join("ssd-cache");
    let m = Mount::new(&c, &format!("metrics={mount_m},cache_dir={},cache_size=64M", cache.display()));
    std::fs::create_dir(m.path("work")).unwrap();
    c.braid_ok(&["setstripe", "-c", "2", "-S", "1M", &m.path("work").to_string_lossy()]);
    // Job 4711 writes 8 MiB striped over both OSTs, and reads it back without the
    // page cache; another job makes small files.
    run_as_job("4711", "dd if=/dev/zero of=big bs=1M count=8 oflag=direct 2>&1", &m.path("work"));
    run_as_job("4711", "dd if=big of=/dev/null bs=1M iflag=direct 2>&1", &m.path("work"));
    run_as_job("small-files", "for i in 1 2 3 4 5 6 7 8 9 10; do echo $i > f$i; done; rm f1", &m.path("work"));
    // A native client (`braid cp`) run in job native-77 counts for it too.
    let local = c.dir.path().join("native.dat");
    std::fs::write(&local, vec![7u8; 3 << 20]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_braid"))
        .args(["cp", &local.to_string_lossy(), &c.url("/native.dat")])
        .env("BRAID_SECRET_FILE", &c.secret)
        .env("SLURM_JOB_ID", "native-77")
        .output()
        .unwrap();
    assert!(out.status.success(), "braid cp: {}", stderr(&out));

    let mut served = String::new();
    for (what, addr) in [("MGS", &mgs_m), ("MDS", &mds_m), ("OSS", &oss_m), ("mount", &mount_m)] {
        let (text, samples) = scrape(addr);
        served.push_str(&text);
        promtool_check(what, &text);
        assert_eq!(sum(&samples, "braid_process_info", &[]), 1.0, "{what}: one process line");
        match what {
            "OSS" => {
                let written = sum(&samples, "braid_job_bytes_total", &[("job", "4711"), ("op", "ost_write")]);
                assert_eq!(written, (8 << 20) as f64, "job 4711's writes on the OSTs:\n{text}");
                let native = sum(&samples, "braid_job_bytes_total", &[("job", "native-77"), ("op", "ost_write")]);
                assert_eq!(native, (3 << 20) as f64, "the native client's writes in its job:\n{text}");
                let read = sum(&samples, "braid_job_bytes_total", &[("job", "4711"), ("op", "ost_read")]);
                assert!(read >= (8 << 20) as f64, "job 4711's reads on the OSTs: {read}\n{text}");
                for ost in ["OST0000", "OST0001"] {
                    let on = sum(&samples, "braid_rpc_received_bytes_total", &[("target", ost), ("op", "ost_write")]);
                    assert!(on >= (4 << 20) as f64, "{ost} took half the striped file: {on}");
                    assert!(sum(&samples, "braid_target_size_bytes", &[("target", ost)]) > 0.0, "{ost} size");
                    let count = sum(
                        &samples,
                        "braid_rpc_request_duration_seconds_count",
                        &[("target", ost), ("op", "ost_write")],
                    );
                    let total = sum(&samples, "braid_rpc_requests_total", &[("target", ost), ("op", "ost_write")]);
                    assert!(count > 0.0 && count == total, "{ost}: every write timed once ({count} of {total})");
                }
            }
            "MDS" => {
                let creates =
                    sum(&samples, "braid_job_requests_total", &[("job", "small-files"), ("target", "MDT0000")]);
                assert!(creates >= 10.0, "the small-files job's metadata requests on MDT0000: {creates}\n{text}");
                assert!(sum(&samples, "braid_mdt_batch_operations_count", &[("target", "MDT0000")]) > 0.0);
                assert!(sum(&samples, "braid_rpc_requests_total", &[("target", "MDT0000")]) > 0.0);
                assert!(
                    text.contains("braid_mdt_commit_queue_operations{target=\"MDT0000\"}"),
                    "the MDT's commit queue depth:\n{text}"
                );
            }
            "MGS" => assert!(sum(&samples, "braid_rpc_requests_total", &[("op", "mgs_heartbeat")]) > 0.0),
            _ => {
                let writes = sum(&samples, "braid_fuse_requests_total", &[("op", "write")]);
                assert!(writes >= 8.0, "the mount's FUSE writes: {writes}\n{text}");
                assert!(sum(&samples, "braid_fuse_request_duration_seconds_count", &[("op", "create")]) >= 10.0);
                assert_eq!(sum(&samples, "braid_cache_size_bytes", &[]), (64 << 20) as f64, "the SSD cache's size");
                // Job 4711's reader went through the file in order: from its third
                // read on, the read-ahead had the bytes fetched.
                let ahead = sum(&samples, "braid_readahead_hit_bytes_total", &[]);
                assert!(ahead >= (1 << 20) as f64, "bytes served by read-ahead: {ahead}\n{text}");
                assert!(sum(&samples, "braid_readahead_miss_bytes_total", &[]) > 0.0, "its first reads missed");
                for queue in ["flush", "unlink"] {
                    let line = format!("braid_client_queued_operations{{queue=\"{queue}\"}}");
                    assert!(text.contains(&line), "the mount's {queue} queue depth:\n{text}");
                }
            }
        }
    }

    dashboard_asks_only_for_what_is_served(&served);

    // braid stats: the same numbers through the cluster's own RPCs, while a job works.
    let url = c.url("/");
    // The job writes until the view is taken (a flag file ends its loop), so that it
    // is at work through the whole interval.
    let done = m.path("work/stats-done");
    let writer = {
        let dir = m.path("work");
        std::thread::spawn(move || {
            run_as_job(
                "stats-job",
                "while [ ! -e stats-done ]; do dd if=/dev/zero of=streamed bs=1M count=8 oflag=direct 2>&1; done",
                &dir,
            )
        })
    };
    let json = c.braid_ok(&["stats", &url, "--json", "--interval", "2"]);
    std::fs::write(&done, b"").unwrap();
    writer.join().unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(v["processes"], 3, "MGS, MDS and OSS, each once: {json}");
    let jobs = v["jobs"].as_array().unwrap();
    assert!(
        jobs.iter().any(|j| j["job"] == "stats-job" && j["target"].as_str().unwrap().starts_with("OST")),
        "braid stats shows the job writing to the OSTs: {json}"
    );
    let ops = v["ops"].as_array().unwrap();
    let write = ops.iter().find(|r| r["op"] == "ost_write").unwrap_or_else(|| panic!("{json}"));
    assert!(write["bytes_per_s"].as_f64().unwrap() > 0.0 && write["p99_s"].as_f64().is_some(), "{json}");
    let text = c.braid_ok(&["stats", &url, "MDT", "--interval", "0.5"]);
    assert!(text.contains("TARGET") && !text.contains("OST000"), "only the MDTs asked for:\n{text}");
    let top = c.braid_ok(&["top", "-n", "2", "--interval", "0.3", "--sort", "latency", &url]);
    assert_eq!(top.matches("server process(es)").count(), 2, "{top}");
    let bad = c.braid(&["stats", &url, "--sort", "colour"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("--sort colour"));
}

/// The Grafana dashboard shipped in dist/grafana: every query is PromQL that
/// `promtool check rules` accepts, and names only metrics the processes serve.
fn dashboard_asks_only_for_what_is_served(served: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/grafana/braid.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_string()))
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    for e in &exprs {
        let names = e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("braid_"));
        for name in names {
            assert!(
                served.lines().any(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' '])),
                "the dashboard's query {e} names {name}, which no process serves"
            );
        }
    }
    let dir = testkit::TempDir::new("dashboard");
    let rules = dir.path().join("rules.yml");
    let mut yaml = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        yaml.push_str(&format!("      - record: braid:dashboard:{i}\n        expr: '{}'\n", e.replace('\'', "''")));
    }
    std::fs::write(&rules, yaml).unwrap();
    let out = Command::new("promtool").arg("check").arg("rules").arg(&rules).output().expect("run promtool");
    assert!(
        out.status.success(),
        "promtool check rules of the dashboard's queries:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn garbage_and_silent_scrapers_do_not_stop_file_service() {
    let oss_m = endpoint();
    let spec =
        ClusterSpec { osts_per_oss: vec![1], oss_args: vec!["--metrics".into(), oss_m.clone()], ..Default::default() };
    let c = Cluster::start(Path::new(env!("CARGO_BIN_EXE_braid")), spec);
    let m = Mount::new(&c, "");
    for garbage in [&b"\x16\x03\x01\x02\x00\r\n\r\n"[..], b"DELETE /metrics HTTP/1.1\r\n\r\n", &[b'A'; 70_000][..]] {
        let mut s = TcpStream::connect(&oss_m).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let _ = s.write_all(garbage);
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 4"), "garbage gets a 4xx: {answer:?}");
    }
    assert_eq!(get(&oss_m, "/nothing").0, 404);
    // Scrapers that connect and never ask hold every slot; files are still written
    // and read meanwhile, and scrapes are answered again once they time out.
    let silent: Vec<TcpStream> = (0..64).map(|_| TcpStream::connect(&oss_m).unwrap()).collect();
    let data = testkit::pattern(3 << 20, 9);
    std::fs::write(m.path("during"), &data).unwrap();
    assert!(std::fs::read(m.path("during")).unwrap() == data);
    drop(silent);
    testkit::wait_for("a scrape answered again", Duration::from_secs(30), || {
        TcpStream::connect(&oss_m).is_ok()
            && std::panic::catch_unwind(|| get(&oss_m, "/metrics").0 == 200).unwrap_or(false)
    });
    // A thousand scrapes in a row while a file is copied.
    let copier = {
        let (src, dst) = (m.path("during"), m.path("copy"));
        std::thread::spawn(move || std::fs::copy(src, dst).unwrap())
    };
    for _ in 0..1000 {
        assert_eq!(get(&oss_m, "/metrics").0, 200);
    }
    copier.join().unwrap();
    assert!(std::fs::read(m.path("copy")).unwrap() == data);
}

#[test]
fn bad_metrics_settings_are_refused_with_what_to_do() {
    let bin = Path::new(env!("CARGO_BIN_EXE_braid"));
    let dir = testkit::TempDir::new("metrics-bad");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    let mgs = |metrics: &str| {
        let mut cmd = Command::new(bin);
        cmd.args(["mgs", "--insecure", "--listen", &endpoint(), "--data"]).arg(dir.path().join("mgs"));
        cmd.args(["--metrics", metrics]);
        testkit::output_within(&mut cmd, Duration::from_secs(20)).unwrap_or_else(|o| o)
    };
    let out = mgs(&taken_addr);
    assert!(!out.status.success());
    let err = testkit::stderr(&out);
    assert!(err.contains(&taken_addr) && err.contains("in use"), "{err}");
    let out = mgs("no-port-here");
    assert!(!out.status.success() && testkit::stderr(&out).contains("no-port-here"), "{}", testkit::stderr(&out));
    let out = Command::new(bin)
        .args(["mount", "-f", "braid://127.0.0.1:1/"])
        .arg(dir.path())
        .args(["-o", "metrics=nonsense"])
        .output()
        .unwrap();
    assert!(testkit::stderr(&out).contains("metrics=HOST:PORT"), "{}", testkit::stderr(&out));
    let out = Command::new(bin)
        .args(["mount", "-f", "braid://127.0.0.1:1/"])
        .arg(dir.path())
        .args(["-o", "jobid_var=A=B"])
        .output()
        .unwrap();
    assert!(testkit::stderr(&out).contains("jobid_var"), "{}", testkit::stderr(&out));
}
