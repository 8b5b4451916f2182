//! TLS on braid connections (`--tls-dir`, `--tls-required`, `-o tls_dir=`,
//! `BRAID_TLS_DIR`) through a cluster of separate processes and a real mount: a
//! TLS-only cluster serves clients with a certificate of its CA (metadata through the
//! MDS, striped data through the OSSs) and refuses, each with a clear reason, a
//! plain client, a client whose certificate another CA signed, one whose certificate
//! expired, and a client that does not trust the servers' CA; and keeps serving.
//! A cluster that offers TLS without requiring it takes both kinds of client.

use std::path::{Path, PathBuf};

use testkit::tls::{loopback_names, write_dir, Ca};
use testkit::{stderr, Cluster, ClusterSpec, Mount, TempDir};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

/// The TLS directories of the tests: the cluster's nodes (`good`) and clients that
/// must be refused.
struct Dirs {
    _tmp: TempDir,
    good: PathBuf,
    other_ca: PathBuf,
    expired: PathBuf,
    distrustful: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = TempDir::new("tls");
    let (ca, other) = (Ca::new("braid test CA"), Ca::new("another CA"));
    let names = loopback_names();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let good = write_dir(&tmp.path().join("good"), &ca, ca.node(&names, false));
    // A client certificate of another CA, trusting the cluster's.
    let other_ca = write_dir(&tmp.path().join("other-ca"), &ca, other.node(&["127.0.0.1"], false));
    let expired = write_dir(&tmp.path().join("expired"), &ca, ca.node(&["127.0.0.1"], true));
    // A client with a good certificate that trusts another CA than the servers'.
    let distrustful = write_dir(&tmp.path().join("distrustful"), &other, ca.node(&["127.0.0.1"], false));
    Dirs { _tmp: tmp, good, other_ca, expired, distrustful }
}

fn tls_args(d: &Dirs, required: bool) -> Vec<String> {
    let mut args = vec!["--tls-dir".to_string(), d.good.display().to_string()];
    if required {
        args.push("--tls-required".into());
    }
    args
}

fn spec(d: &Dirs, required: bool) -> ClusterSpec {
    ClusterSpec {
        mgs_args: tls_args(d, required),
        mds_args: tls_args(d, required),
        oss_args: tls_args(d, required),
        osts_per_oss: vec![2, 2],
        cli_env: vec![("BRAID_TLS_DIR".into(), d.good.display().to_string())],
        ..Default::default()
    }
}

/// `braid df` of the cluster with the TLS files of `tls` (none: a plain client).
fn df(c: &Cluster, tls: Option<&Path>) -> std::process::Output {
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["df", &c.url("/"), "--timeout-s", "5"]).env("BRAID_SECRET_FILE", &c.secret).env_remove("BRAID_TLS_DIR");
    if let Some(dir) = tls {
        cmd.env("BRAID_TLS_DIR", dir);
    }
    testkit::output_within(&mut cmd, std::time::Duration::from_secs(60)).expect("braid df finishes")
}

fn round_trip(m: &Mount, name: &str) {
    let data = testkit::pattern(3 << 20, name.len() as u64);
    std::fs::write(m.path(name), &data).unwrap();
    assert!(std::fs::read(m.path(name)).unwrap() == data, "{name} read back as written");
}

#[test]
fn a_tls_only_cluster_serves_its_ca_s_clients_and_refuses_the_others() {
    let d = dirs();
    let c = Cluster::start(bin(), spec(&d, true));
    c.braid_ok(&["setstripe", "-c", "4", &c.url("/striped")]);
    let opts = format!("tls_dir={}", d.good.display());
    let m = Mount::new(&c, &opts);
    round_trip(&m, "striped");
    round_trip(&m, "plain-default");

    let plain = df(&c, None);
    assert!(!plain.status.success(), "a plain client is refused");
    assert!(stderr(&plain).contains("TLS connections only"), "a plain client is told why: {}", stderr(&plain));

    for (what, dir) in [("another CA's", &d.other_ca), ("an expired", &d.expired)] {
        let out = df(&c, Some(dir));
        assert!(!out.status.success(), "a client with {what} certificate is refused");
        assert!(
            stderr(&out).contains("refused this client's TLS certificate"),
            "a client with {what} certificate is told why: {}",
            stderr(&out)
        );
    }
    let out = df(&c, Some(&d.distrustful));
    assert!(!out.status.success(), "a client that does not trust the servers' CA does not talk to them");
    assert!(stderr(&out).contains("certificate"), "and says why: {}", stderr(&out));

    // None of that disturbed the cluster.
    assert!(df(&c, Some(&d.good)).status.success());
    round_trip(&m, "after");
}

#[test]
fn a_cluster_offering_tls_takes_plain_and_tls_clients() {
    let d = dirs();
    let c = Cluster::start(bin(), spec(&d, false));
    let plain = Mount::new(&c, "");
    let tls = Mount::new(&c, &format!("tls_dir={}", d.good.display()));
    round_trip(&plain, "by-plain");
    round_trip(&tls, "by-tls");
    assert!(std::fs::read(tls.path("by-plain")).unwrap() == std::fs::read(plain.path("by-plain")).unwrap());
    assert!(df(&c, None).status.success());
    let out = df(&c, Some(&d.expired));
    assert!(!out.status.success(), "an expired certificate is refused even where TLS is optional");
}

#[test]
fn a_tls_only_trace_server_takes_the_records_of_a_tls_mount() {
    let d = dirs();
    let c = Cluster::start(bin(), spec(&d, true));
    let store = c.dir.path().join("trace-store");
    let good = d.good.display().to_string();
    let args = [
        "trace",
        "serve",
        "--dir",
        &store.to_string_lossy(),
        "--listen",
        "127.0.0.1:0",
        "--secret-file",
        &c.secret.to_string_lossy(),
        "--tls-dir",
        &good,
        "--tls-required",
    ];
    let server = testkit::Daemon::start(bin(), &args, &[], &c.dir.path().join("trace-serve.log"), "trace server at")
        .expect("trace server starts");
    let addr = server.banner.last().unwrap().split_whitespace().nth(3).unwrap().trim_end_matches(',').to_string();
    let m = Mount::new(&c, &format!("tls_dir={good},trace,trace_server={addr}"));
    std::fs::write(m.path("traced"), b"bytes").unwrap();
    let start = std::time::Instant::now();
    loop {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(["trace", "export", "--json", "--dir", &store.to_string_lossy()]);
        let out = testkit::output_within(&mut cmd, std::time::Duration::from_secs(60)).expect("export ends");
        if testkit::stdout(&out).lines().any(|l| l.contains("\"create\"")) {
            break;
        }
        assert!(start.elapsed().as_secs() < 30, "the create never reached the TLS trace server");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn a_tls_client_of_a_cluster_without_tls_is_told_why() {
    let d = dirs();
    let c = Cluster::start(bin(), ClusterSpec::default());
    let out = df(&c, Some(&d.good));
    assert!(!out.status.success(), "a TLS client does not fall back to plain");
    assert!(stderr(&out).contains("does it have TLS settings"), "{}", stderr(&out));
    assert!(df(&c, None).status.success());
}
