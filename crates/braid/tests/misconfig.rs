//! Misconfiguration an admin meets, each said in one message that says what to do
//! (issue 42, item 4), through real processes: a wrong cluster secret, an MGS that
//! does not answer, two OSS processes on one OST (a copied directory), a target of
//! another file system, a port in use; and structured logs (`--log-format json`).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::{free_port, output_within, stderr, Cluster, ClusterSpec, TempDir};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

/// Runs `braid ARGS`, killed after `within`; what it printed on stderr, and whether it
/// ended by itself.
fn braid(args: &[&str], within: Duration) -> (String, bool) {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    match output_within(&mut cmd, within) {
        Ok(o) => (stderr(&o), true),
        Err(o) => (stderr(&o), false),
    }
}

fn oss_args<'a>(secret: &'a str, mgs: &'a str, ost: &'a str, listen: &'a str) -> Vec<&'a str> {
    vec!["oss", "--secret-file", secret, "--listen", listen, "--mgs", mgs, "--ost", ost]
}

#[test]
fn each_misconfiguration_is_one_message_that_says_what_to_do() {
    let c = Cluster::start(bin(), ClusterSpec { osts_per_oss: vec![1], ..Default::default() });
    let dir = TempDir::new("misconfig");
    let secret = c.secret.to_string_lossy().into_owned();
    let mgs = c.mgs_addr.clone();
    let listen = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let p = |name: &str| dir.path().join(name).to_string_lossy().into_owned();

    // A wrong secret.
    let other = p("other.secret");
    assert!(Command::new(bin()).args(["gen-secret", &other]).status().unwrap().success());
    let (err, ended) = braid(&oss_args(&other, &mgs, &p("ost-a"), &listen), Duration::from_secs(60));
    assert!(ended && err.contains("wrong cluster secret") && err.contains("same secret file"), "{err}");

    // An MGS that does not answer: said at once, not after the 30 s of retries.
    let nowhere = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let (err, ended) = braid(&oss_args(&secret, &nowhere, &p("ost-b"), &listen), Duration::from_secs(6));
    assert!(!ended, "still retrying after 6 s: {err}");
    assert!(err.contains(&format!("the MGS at {nowhere} does not answer yet")), "{err}");

    // A second OSS on a copy of a served OST's directory.
    let copy = p("ost0-copy");
    let cp = Command::new("cp").args(["-a"]).arg(c.ost_dir(0)).arg(&copy).status().unwrap();
    assert!(cp.success());
    let (err, ended) = braid(&oss_args(&secret, &mgs, &copy, &listen), Duration::from_secs(90));
    assert!(ended, "the second OSS gives up: {err}");
    assert!(err.contains("OST0000") && err.contains("second OSS") && err.contains("Stop one"), "{err}");
    // ... and the first still serves it.
    c.put("/still-served", b"data");
    assert_eq!(c.get("/still-served"), b"data");

    // A server of another file system: its name is not the MGS's.
    let (err, ended) = braid(
        &[&oss_args(&secret, &mgs, &p("ost-c"), &listen)[..], &["--fsname", "elsewhere"]].concat(),
        Duration::from_secs(60),
    );
    assert!(ended && err.contains("'elsewhere'") && err.contains("--fsname braid"), "{err}");
    assert_eq!(err.matches("this MGS serves").count(), 1, "said once: {err}");

    // A target directory of this file system, started for another one.
    let (err, ended) = braid(
        &[&oss_args(&secret, &mgs, &c.ost_dir(0).to_string_lossy(), &listen)[..], &["--fsname", "elsewhere"]].concat(),
        Duration::from_secs(60),
    );
    assert!(ended && err.contains("belongs to file system 'braid'") && err.contains("--fsname braid"), "{err}");

    // A port in use.
    let (err, ended) = braid(&oss_args(&secret, &mgs, &p("ost-d"), &mgs), Duration::from_secs(60));
    assert!(ended && err.contains("in use") && err.contains("--listen"), "{err}");
}

#[test]
fn json_logs_are_one_object_a_line_with_level_target_and_fields() {
    let dir = TempDir::new("json-logs");
    let listen = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let data = dir.path().join("mgs");
    let args = ["--log-format", "json", "mgs", "--insecure", "--listen", &listen, "--data", &data.to_string_lossy()];
    let (err, ended) = braid(&args, Duration::from_secs(3));
    assert!(!ended, "the MGS serves until stopped: {err}");
    let lines: Vec<serde_json::Value> =
        err.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"))).collect();
    assert!(lines.len() >= 2, "{err}");
    for l in &lines {
        assert!(l["timestamp"].is_string() && l["level"].is_string() && l["target"].is_string(), "{l}");
        assert!(l["fields"]["message"].is_string(), "{l}");
    }
    assert!(lines
        .iter()
        .any(|l| l["level"] == "WARN" && l["fields"]["message"].as_str().unwrap().contains("insecure")));
    assert!(lines.iter().any(|l| l["fields"]["fsname"] == "braid"), "an event's own fields are kept: {err}");
    // The same from the environment; an unknown format is refused.
    let mut cmd = Command::new(bin());
    cmd.args(["mgs", "--insecure", "--listen", &listen, "--data", &data.to_string_lossy()]);
    cmd.env("BRAID_LOG_FORMAT", "json");
    let o = output_within(&mut cmd, Duration::from_secs(3)).unwrap_or_else(|o| o);
    assert!(stderr(&o).lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()), "{}", stderr(&o));
    let (err, ended) = braid(&["--log-format", "xml", "mgs", "--insecure"], Duration::from_secs(10));
    assert!(ended && err.contains("--log-format xml"), "{err}");
}
