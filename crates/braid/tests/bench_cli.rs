//! End-to-end runs of `braid bench` through the real binary: task processes, barriers, JSON,
//! the sweep's report and plots, and `-R` catching a byte changed on disk. Sizes are KiB to a
//! few MiB so the whole file runs in seconds; nothing here asserts a timing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// A directory under the system temp dir, removed when the test ends, pass or fail.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("braid-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    fn join(&self, name: &str) -> String {
        self.0.join(name).to_str().expect("utf-8 temp path").to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn braid(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_braid"))
        .arg("bench")
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .env("BRAID_TIMEOUT_S", "2")
        .output()
        .expect("run braid")
}

fn ok_json(args: &[&str]) -> Value {
    let out = braid(args);
    assert!(out.status.success(), "braid bench {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", String::from_utf8_lossy(&out.stdout)))
}

fn dir_is_empty(path: &Path) -> bool {
    std::fs::read_dir(path).expect("read dir").next().is_none()
}

#[test]
fn ior_shared_and_per_process_files_report_json() {
    let dir = TempDir::new("ior");
    for layout in [&["-s", "2"][..], &["-F", "-C", "-z"][..], &["-F", "--stride", "3"][..]] {
        let file = dir.join("testFile");
        let mut args = vec!["ior", "-N", "3", "-b", "64k", "-t", "4k", "-i", "2", "-R", "-o", &file, "--json"];
        args.extend_from_slice(layout);
        let report = ok_json(&args);
        assert_eq!(report["tasks"], 3);
        let segments = report["segments"].as_u64().unwrap();
        assert_eq!(report["aggregate_bytes"].as_u64().unwrap(), 3 * 64 * 1024 * segments);
        let results = report["results"].as_array().unwrap();
        assert_eq!(results.len(), 4, "write and read, 2 iterations");
        for sample in results {
            assert_eq!(sample["bytes"].as_u64().unwrap(), 3 * 64 * 1024 * segments, "every byte moved: {sample}");
            assert!(sample["bandwidth_mib_s"].as_f64().unwrap() > 0.0);
            assert!(sample["seconds"].as_f64().unwrap() >= sample["task_seconds_max"].as_f64().unwrap());
        }
        let summary = report["summary"].as_array().unwrap();
        assert_eq!(summary[0]["operation"], "write");
        assert_eq!(summary[1]["operation"], "read");
        assert_eq!(summary[1]["bandwidth_mib_s"]["count"], 2);
        assert_eq!(report["verify_errors"], 0);
        assert!(report["machine"]["cores"].as_u64().unwrap() >= 1);
        assert!(report["command"].as_str().unwrap().contains("ior"));
        assert_eq!(report["caches_dropped"], false);
        assert!(dir_is_empty(&dir.0), "files removed without -k");
    }
}

#[test]
fn ior_text_has_the_summary_table() {
    let dir = TempDir::new("iortext");
    let file = dir.join("f");
    let out = braid(&["ior", "-b", "32k", "-t", "8k", "-o", &file, "-k"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in ["Summary of all tests:", "Max(MiB)", "Mean(s)", "write", "read", "Machine", "Caches dropped"] {
        assert!(text.contains(needle), "missing {needle} in:\n{text}");
    }
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 32 * 1024, "-k keeps the file");
}

#[test]
fn ior_check_read_catches_a_byte_changed_on_disk() {
    let dir = TempDir::new("verify");
    let file = dir.join("data");
    let write = braid(&["ior", "-N", "2", "-F", "-b", "64k", "-t", "16k", "-o", &file, "-w", "-k", "-q"]);
    assert!(write.status.success(), "{}", String::from_utf8_lossy(&write.stderr));
    let clean = braid(&["ior", "-N", "2", "-F", "-b", "64k", "-t", "16k", "-o", &file, "-r", "-R", "-C", "-k"]);
    assert!(clean.status.success(), "unchanged data verifies: {}", String::from_utf8_lossy(&clean.stderr));

    // Flip one byte in the middle of the second task's file.
    let victim = format!("{file}.00000001");
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[40_000] ^= 0xff;
    std::fs::write(&victim, &bytes).unwrap();

    let out = braid(&["ior", "-N", "2", "-F", "-b", "64k", "-t", "16k", "-o", &file, "-r", "-R", "-C", "-k"]);
    assert!(!out.status.success(), "a corrupted byte must fail the run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // With -C task 0 reads task 1's file.
    assert!(stderr.contains("task 0"), "{stderr}");
    assert!(stderr.contains("offset 40000"), "{stderr}");
    assert!(stderr.contains("1 corrupted bytes"), "{stderr}");
}

#[test]
fn ior_stonewall_reads_only_what_was_written() {
    let dir = TempDir::new("stonewall");
    let file = dir.join("sw");
    // A 1-second stonewall on a write that cannot finish in time: 2 tasks x 1 GiB in 16-byte
    // transfers (64 Mi system calls each), so only some MiB are written. The read phase reads
    // at most what each task wrote, and verifies it.
    let report = ok_json(&["ior", "-N", "2", "-F", "-b", "1g", "-t", "16", "-D", "1", "-R", "-o", &file, "--json"]);
    let results = report["results"].as_array().unwrap();
    let (write, read) = (&results[0], &results[1]);
    assert_eq!(write["stonewalled"], true, "{write}");
    assert!(write["transfers"].as_u64().unwrap() > 0);
    assert!(read["transfers"].as_u64().unwrap() <= write["transfers"].as_u64().unwrap());
    assert_eq!(report["verify_errors"], 0);
    assert!(dir_is_empty(&dir.0));
}

#[test]
fn impossible_options_get_clear_errors() {
    let dir = TempDir::new("errors");
    let file = dir.join("f");
    let cases: [(&[&str], &str); 5] = [
        (&["ior", "-b", "1m", "-t", "300k", "-o", &file], "multiple of the transfer size"),
        (&["ior", "-C", "-o", &file], "-C needs at least 2 tasks"),
        (&["ior", "-a", "native", "-o", "braid://localhost:1/f"], "localhost:1"),
        (&["mdtest", "-n", "0", "-N", "4", "-d", &file], "4 tasks"),
        (&["iozone", "-s", "4k", "-r", "8k", "-f", &file], "larger than file"),
    ];
    for (args, needle) in cases {
        let out = braid(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    // A sweep target that does not exist is named once, in plain words; nothing is made.
    let missing = dir.join("missing");
    let target = format!("x={missing}");
    let out = braid(&["sweep", "--preset", "tasks", "--target", &target, "--out", &dir.join("out")]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("target {target}: the directory does not exist")), "{stderr}");
    assert_eq!(stderr.matches("No such file").count(), 0, "no OS error text, repeated or not: {stderr}");
    assert!(!Path::new(&missing).exists());
    // And an OS error reached through the bench engine is printed once, not once per
    // level of the error chain.
    let out = braid(&["ior", "-o", &dir.join("no/such/dir/f")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.matches("No such file or directory").count() <= 1, "{stderr}");
}

#[test]
fn mdtest_runs_every_phase_and_cleans_up() {
    let dir = TempDir::new("mdtest");
    let md = dir.join("md");
    for unique in [false, true] {
        let mut args = vec!["mdtest", "-n", "20", "-N", "2", "-d", &md, "-w", "3901", "-e", "3901", "--json"];
        if unique {
            args.push("-u");
        }
        let report = ok_json(&args);
        let operations: Vec<&str> =
            report["summary"].as_array().unwrap().iter().map(|row| row["operation"].as_str().unwrap()).collect();
        for op in [
            "Directory creation",
            "Directory stat",
            "Directory removal",
            "File creation",
            "File stat",
            "File read",
            "File removal",
        ] {
            assert!(operations.contains(&op), "{op} missing from {operations:?}");
        }
        assert_eq!(operations.contains(&"Tree creation"), unique);
        for sample in report["results"].as_array().unwrap() {
            assert!(sample["ops_per_s"].as_f64().unwrap() > 0.0, "{sample}");
            match sample["operation"].as_str().unwrap() {
                "File creation" | "File read" => assert_eq!(sample["bytes"], 2 * 20 * 3901),
                op if op.starts_with("Tree") => assert_eq!(sample["items"], 2),
                _ => assert_eq!(sample["items"], 40),
            }
        }
        assert!(dir_is_empty(Path::new(&md)), "mdtest removes what it created");
    }
    let text = braid(&["mdtest", "-n", "5", "-d", &md, "-F"]);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(stdout.contains("SUMMARY rate: (of 1 iterations)"), "{stdout}");
    assert!(stdout.contains("File creation") && !stdout.contains("Directory creation"));
}

#[test]
fn iozone_fills_the_grid() {
    let dir = TempDir::new("iozone");
    let file = dir.join("iozone.tmp");
    let report = ok_json(&["iozone", "-s", "64k,256k", "-r", "4k,64k", "-f", &file, "--json"]);
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4);
    for cell in cells {
        for test in ["write", "rewrite", "read", "reread", "random_read", "random_write", "stride_read"] {
            assert!(cell[test].as_f64().unwrap() > 0.0, "{test} in {cell}");
        }
    }
    let only_read = ok_json(&["iozone", "-s", "64k", "-r", "4k", "-i", "1", "-f", &file, "--json"]);
    assert!(only_read["cells"][0]["write"].is_null());
    assert!(only_read["cells"][0]["reread"].as_f64().unwrap() > 0.0);
    assert!(dir_is_empty(&dir.0));
}

#[test]
fn sweeps_write_report_svg_and_json() {
    let dir = TempDir::new("sweep");
    std::fs::create_dir_all(dir.0.join("a")).unwrap();
    std::fs::create_dir_all(dir.0.join("b")).unwrap();
    let (a, b) = (format!("one={}", dir.join("a")), format!("two={}", dir.join("b")));
    let cases: [(&str, &[&str], &[&str]); 6] = [
        ("tasks", &["--values", "1,2", "--size", "256k"], &["tasks"]),
        ("blocksize", &["--values", "4k,64k", "--size", "256k"], &["blocksize"]),
        ("tracer", &["--values", "4k,64k", "--size", "256k"], &["tracer-read", "tracer-write"]),
        ("cache", &["--size", "1m"], &["cache-sequential", "cache-random"]),
        ("pattern", &["--size", "4m"], &["pattern"]),
        (
            "metadata",
            &["--values", "1,2", "--items", "10"],
            &["metadata-shared-files", "metadata-shared-dirs", "metadata-unique-files", "metadata-unique-dirs"],
        ),
    ];
    for (preset, extra, figures) in cases {
        let out_dir = dir.join(&format!("out-{preset}"));
        let mut args =
            vec!["sweep", "--preset", preset, "--quick", "--target", &a, "--target", &b, "--out", &out_dir, "-q"];
        args.extend_from_slice(extra);
        let out = braid(&args);
        assert!(out.status.success(), "{preset}: {}", String::from_utf8_lossy(&out.stderr));
        let report = std::fs::read_to_string(format!("{out_dir}/report.md")).unwrap();
        for needle in [
            "Machine:",
            "cores",
            "Command: `braid bench sweep",
            "Caches dropped before every phase: no",
            "| one |",
            "| two |",
        ] {
            assert!(report.contains(needle), "{preset}: {needle} missing:\n{report}");
        }
        for figure in figures {
            assert!(report.contains(&format!("({figure}.svg)")), "{preset}: no {figure} in report");
            let svg = std::fs::read_to_string(format!("{out_dir}/{figure}.svg")).unwrap();
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
            assert!(svg.contains(">one") && svg.contains(">two"), "a line per target");
            assert!(svg.contains("MiB/s") || svg.contains("ops/s"), "y axis has units");
        }
        let json: Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{out_dir}/results.json")).unwrap()).unwrap();
        assert_eq!(json["figures"].as_array().unwrap().len(), figures.len());
        for figure in json["figures"].as_array().unwrap() {
            for series in figure["series"].as_array().unwrap() {
                for point in series["points"].as_array().unwrap() {
                    assert!(point["y"].as_f64().unwrap() > 0.0, "{preset}: {point}");
                }
            }
        }
        assert!(!json["runs"].as_array().unwrap().is_empty());
        assert!(dir_is_empty(&dir.0.join("a")), "{preset}: sweep leaves the target clean");
    }
}
