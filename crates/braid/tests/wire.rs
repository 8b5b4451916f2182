//! The wire and its guards on real server processes: the cluster secret (refusal to
//! start without one, wrong and missing secrets), garbage and truncated frames before
//! authentication, hostile frames after it, and the harness's own cleanup promise.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use proto::auth::{client_handshake, Secret};
use proto::frame::{encode_frame, read_frame, write_frame, FrameKind, FrameLimits, MAGIC, VERSION};
use testkit::{free_port, output_within, pattern, stderr, stdout, Cluster, ClusterSpec, Daemon, TempDir};
use tokio::io::AsyncWriteExt;

const WAIT: Duration = Duration::from_secs(30);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

fn log_of(c: &Cluster, name: &str) -> String {
    std::fs::read_to_string(&c.servers[name].log).unwrap_or_default()
}

/// Runs a server command that must exit at once; `None` if it kept running.
fn run_briefly(args: &[&str], env_secret: Option<&Path>) -> Option<std::process::Output> {
    let mut cmd = Command::new(bin());
    cmd.args(args).env_remove("BRAID_SECRET_FILE");
    if let Some(s) = env_secret {
        cmd.env("BRAID_SECRET_FILE", s);
    }
    output_within(&mut cmd, WAIT).ok()
}

#[test]
fn servers_refuse_to_start_without_a_secret_unless_insecure() {
    let dir = TempDir::new("nosecret");
    let d = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let (mgs, mdt, ost) = (d("mgs"), d("mdt"), d("ost"));
    let roles: [Vec<&str>; 3] = [
        vec!["mgs", "--listen", "127.0.0.1:0", "--data", &mgs],
        vec!["mds", "--listen", "127.0.0.1:0", "--mgs", "127.0.0.1:9", "--mdt", &mdt],
        vec!["oss", "--listen", "127.0.0.1:0", "--mgs", "127.0.0.1:9", "--ost", &ost],
    ];
    for args in &roles {
        let out = run_briefly(args, None).unwrap_or_else(|| panic!("{args:?} started without a secret"));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("no cluster secret") && err.contains("--insecure"), "{args:?}: {err}");
        assert!(err.contains("braid gen-secret"), "{args:?}: {err}");
        assert!(!stdout(&out).contains("listening on"), "{args:?}");
    }
    // A secret too short to be one, or a missing file, is refused with its reason.
    let short = dir.path().join("short.secret");
    std::fs::write(&short, "tooshort\n").expect("write secret");
    let out = run_briefly(&["mgs", "--listen", "127.0.0.1:0", "--data", &mgs], Some(&short)).expect("exits");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("at least 16 are required"), "{}", stderr(&out));
    let missing = d("missing.secret");
    let out = run_briefly(&["mgs", "--listen", "127.0.0.1:0", "--data", &mgs, "--secret-file", &missing], None)
        .expect("exits");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("cannot read secret file"), "{}", stderr(&out));

    // With --insecure a whole cluster runs and a client without a secret uses it.
    let mgs_addr = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let log = |n: &str| dir.path().join(format!("{n}.log"));
    let start = |args: &[&str], name: &str| {
        Daemon::start(bin(), args, &[], &log(name), "listening on")
            .unwrap_or_else(|l| panic!("insecure {name} did not start:\n{l}"))
    };
    let common = ["--insecure", "--heartbeat-ms", "200"];
    let mut a = vec!["mgs", "--listen", &mgs_addr, "--data", &mgs, "--target-timeout-ms", "1500"];
    a.extend(common);
    let _mgs = start(&a, "mgs");
    let mut a = vec!["mds", "--listen", "127.0.0.1:0", "--mgs", &mgs_addr, "--mdt", &mdt];
    a.extend(common);
    let _mds = start(&a, "mds");
    let mut a = vec!["oss", "--listen", "127.0.0.1:0", "--mgs", &mgs_addr, "--ost", &ost];
    a.extend(common);
    let _oss = start(&a, "oss");
    assert!(std::fs::read_to_string(log("mgs")).unwrap_or_default().contains("without authentication"));
    let src = dir.path().join("src");
    let data = pattern(200 << 10, 41);
    std::fs::write(&src, &data).expect("write source");
    let url = format!("braid://{mgs_addr}/f");
    let cli = |args: &[&str]| {
        let mut cmd = Command::new(bin());
        cmd.args(args).env_remove("BRAID_SECRET_FILE");
        output_within(&mut cmd, testkit::CLI_WATCHDOG).expect("braid finished")
    };
    // The new MDS learns the OST a heartbeat after it registers: retry the upload.
    testkit::wait_for("an upload to the insecure cluster", WAIT, || {
        cli(&["cp", "--timeout-s", "2", src.to_str().expect("utf-8"), &url]).status.success()
    });
    let back = dir.path().join("back");
    let out = cli(&["cp", &url, back.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read(&back).expect("read back") == data);
}

#[test]
fn wrong_or_missing_secret_gets_a_clear_error_on_both_sides() {
    let c = Cluster::start(bin(), ClusterSpec { osts_per_oss: vec![1], ..Default::default() });
    c.put("/f", b"guarded");
    let other = c.dir.path().join("other.secret");
    let out = c.braid(&["gen-secret", other.to_str().expect("utf-8")]);
    assert!(out.status.success());

    let url = c.url("/");
    let mut cmd = Command::new(bin());
    cmd.args(["ls", "--timeout-s", "30", &url]).env("BRAID_SECRET_FILE", &other);
    let out = output_within(&mut cmd, WAIT).expect("a denied client stops");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("authentication with") && err.contains("wrong cluster secret"), "{err}");
    assert!(!stdout(&out).contains('f'), "nothing listed: {}", stdout(&out));
    // --secret-file wins over the environment and is checked the same way.
    let mut cmd = Command::new(bin());
    cmd.args(["ls", "--secret-file", other.to_str().expect("utf-8"), &url]).env("BRAID_SECRET_FILE", &c.secret);
    let out = output_within(&mut cmd, WAIT).expect("a denied client stops");
    assert!(stderr(&out).contains("wrong cluster secret"), "{}", stderr(&out));

    let mut cmd = Command::new(bin());
    cmd.args(["ls", "--timeout-s", "30", &url]).env_remove("BRAID_SECRET_FILE");
    let out = output_within(&mut cmd, WAIT).expect("a client without secret stops");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("requires the cluster secret") && err.contains("--secret-file"), "{err}");

    // A client that holds the secret must also refuse a server that does not.
    let impostor_dir = TempDir::new("impostor");
    let impostor = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let data = impostor_dir.path().join("mgs").to_string_lossy().into_owned();
    let args = ["mgs", "--listen", &impostor, "--data", &data, "--secret-file", other.to_str().expect("utf-8")];
    let _mgs = Daemon::start(bin(), &args, &[], &impostor_dir.path().join("mgs.log"), "listening on")
        .unwrap_or_else(|l| panic!("impostor MGS did not start:\n{l}"));
    let out = c.braid(&["ls", "--timeout-s", "30", &format!("braid://{impostor}/")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("cluster secret"), "{}", stderr(&out));

    // The servers logged why, and keep serving clients with the right secret.
    let mgs_log = log_of(&c, "mgs");
    assert!(mgs_log.contains("authentication failed: wrong cluster secret"), "{mgs_log}");
    assert!(mgs_log.contains("the client has no cluster secret"), "{mgs_log}");
    assert_eq!(c.get("/f"), b"guarded");
}

/// Reads until the peer closes; `true` if it closed (EOF or reset) within `WAIT`.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(WAIT)).expect("read timeout");
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

fn handshake_header(msg_len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(28);
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&[VERSION, FrameKind::Handshake as u8, 0, 0]);
    h.extend_from_slice(&0u64.to_le_bytes());
    h.extend_from_slice(&msg_len.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h
}

#[test]
fn garbage_and_truncated_frames_before_authentication_are_dropped() {
    let mut c = Cluster::start(bin(), ClusterSpec { osts_per_oss: vec![1], ..Default::default() });
    c.put("/f", b"still here");
    // Peers that never speak are dropped after the handshake timeout.
    let mut silent: Vec<(&str, TcpStream)> =
        ["mgs", "mds", "oss0"].map(|n| (n, TcpStream::connect(c.addr(n)).expect("connect"))).into();
    for name in ["mgs", "mds", "oss0"] {
        let addr = c.addr(name);
        let connect = || TcpStream::connect(&addr).expect("connect");

        let mut http = connect();
        http.write_all(b"GET / HTTP/1.1\r\nHost: braid\r\nUser-Agent: curl\r\n\r\n").expect("send");
        assert!(closed_by_peer(&mut http), "{name} keeps a connection that sent HTTP");

        let mut random = connect();
        random.write_all(&pattern(4096, 51)).expect("send");
        assert!(closed_by_peer(&mut random), "{name} keeps a connection that sent noise");

        // A header promising 100 bytes, then 10 and end of stream.
        let mut truncated = connect();
        let mut frame = handshake_header(100);
        frame.extend_from_slice(&[7u8; 10]);
        truncated.write_all(&frame).expect("send");
        truncated.shutdown(std::net::Shutdown::Write).expect("shutdown");
        assert!(closed_by_peer(&mut truncated), "{name} keeps a truncated handshake");

        // A handshake claiming 1 GiB: refused on the header, nothing allocated.
        let mut huge = connect();
        huge.write_all(&handshake_header(1 << 30)).expect("send");
        assert!(closed_by_peer(&mut huge), "{name} keeps an oversized handshake");

        // A request frame before any handshake.
        let mut early = connect();
        early.write_all(&encode_frame(FrameKind::Request, 1, &[0], &[])).expect("send");
        assert!(closed_by_peer(&mut early), "{name} serves a request before authentication");

        assert!(c.alive(name), "{name} died");
    }
    for (name, s) in &mut silent {
        assert!(closed_by_peer(s), "{name} keeps a silent connection");
    }
    for name in ["mgs", "mds", "oss0"] {
        // The server drops a timed-out connection before it logs why: the line may
        // come a moment after the close was seen.
        let said = |log: &str| log.contains("authentication failed") && log.contains("handshake timed out");
        let start = std::time::Instant::now();
        while !said(&log_of(&c, name)) && start.elapsed() < WAIT {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let log = log_of(&c, name);
        assert!(said(&log), "{name}:\n{log}");
    }
    assert_eq!(c.get("/f"), b"still here");
    c.put("/g", b"and new files too");
    assert_eq!(c.get("/g"), b"and new files too");
}

/// A postcard-encoded [`proto::msg::Response::Error`]: variant 1, then the errno's
/// variant index, then the message. Checked by hand because the braid crate does not
/// depend on postcard.
fn error_reply(msg: &[u8]) -> Option<(u8, String)> {
    if msg.first() != Some(&1) || msg.len() < 3 {
        return None;
    }
    Some((msg[1], String::from_utf8_lossy(&msg[2..]).into_owned()))
}

async fn authenticated(addr: &str, secret: &Secret) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    client_handshake(&mut s, secret, 4242, "client").await.expect("handshake");
    s
}

/// Sends `frame` after authenticating; returns the answers until the server closes
/// (or, if it keeps the connection, the first answer and `false`).
async fn send_hostile(addr: &str, secret: &Secret, frame: &[u8], expect_close: bool) -> (Vec<Vec<u8>>, bool) {
    let mut s = authenticated(addr, secret).await;
    s.write_all(frame).await.expect("send");
    let limits = FrameLimits::default();
    let mut answers = Vec::new();
    loop {
        match tokio::time::timeout(WAIT, read_frame(&mut s, &limits)).await {
            Ok(Ok(Some(f))) => {
                answers.push(f.msg.to_vec());
                if !expect_close {
                    return (answers, false);
                }
            }
            Ok(Ok(None)) | Ok(Err(_)) => return (answers, true),
            Err(_) => return (answers, false),
        }
    }
}

#[test]
fn hostile_frames_after_authentication_get_an_error_and_the_server_keeps_serving() {
    let mut c = Cluster::start(bin(), ClusterSpec { osts_per_oss: vec![1], ..Default::default() });
    c.put("/f", b"before");
    let secret = Secret::load(&c.secret).expect("secret");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let proto_errno = proto::Errno::Proto as u8;
    for name in ["mgs", "mds", "oss0"] {
        let addr = c.addr(name);
        rt.block_on(async {
            // A client connected before all this must be served throughout.
            let mut bystander = authenticated(&addr, &secret).await;
            // An unknown operation (variant 200) and a known one cut short: each gets an
            // error answer to its request id, and the connection keeps working.
            let mut s = authenticated(&addr, &secret).await;
            let limits = FrameLimits::default();
            for (id, msg) in [(7u64, vec![0xc8, 0x01]), (8, vec![5]), (9, vec![0xff; 40])] {
                write_frame(&mut s, FrameKind::Request, id, &msg, &[]).await.expect("send");
                let f = read_frame(&mut s, &limits).await.expect("answer").expect("not closed");
                assert_eq!(f.request_id, id, "{name}");
                let (code, text) = error_reply(&f.msg).unwrap_or_else(|| panic!("{name}: {:?}", f.msg));
                assert_eq!(code, proto_errno, "{name}: {text}");
                assert!(text.contains("malformed or unknown request"), "{name}: {text}");
            }
            write_frame(&mut s, FrameKind::Request, 10, &[0], &[]).await.expect("send ping");
            let f = read_frame(&mut s, &limits).await.expect("answer").expect("not closed");
            assert_eq!((f.request_id, &f.msg[..]), (10, &[0u8][..]), "{name}: ping answered Ok");

            // Frames that break framing: an error answer, then the connection closes.
            let ping = encode_frame(FrameKind::Request, 11, &[0], &[]);
            let mut bad_crc = ping.clone();
            bad_crc[24] ^= 0x5a;
            let mut long_msg = ping.clone();
            long_msg[16..20].copy_from_slice(&(2u32 << 20).to_le_bytes());
            let mut long_payload = ping.clone();
            long_payload[20..24].copy_from_slice(&(17u32 << 20).to_le_bytes());
            let mut bad_magic = ping.clone();
            bad_magic[..4].copy_from_slice(b"HTTP");
            let response_kind = encode_frame(FrameKind::Response, 12, &[0], &[]);
            let cases: [(&str, &[u8], &str); 5] = [
                ("bad CRC", &bad_crc, "checksum mismatch"),
                ("2 MiB message", &long_msg, "exceeds the limit"),
                ("17 MiB payload", &long_payload, "exceeds the limit"),
                ("bad magic", &bad_magic, "bad magic"),
                ("response frame", &response_kind, "expected a request frame"),
            ];
            for (what, frame, why) in cases {
                let (answers, closed) = send_hostile(&addr, &secret, frame, true).await;
                assert!(closed, "{name} keeps the connection after a {what}");
                let text = answers.iter().filter_map(|m| error_reply(m)).map(|(_, t)| t).collect::<Vec<_>>().join("; ");
                assert!(text.contains(why), "{name}, {what}: answers {text:?}");
            }
            // A frame cut off in the middle of its payload, then end of stream: at most
            // an error answer saying so, then the server closes.
            let frame = encode_frame(FrameKind::Request, 13, &[0], &[1u8; 1000]);
            let mut s = authenticated(&addr, &secret).await;
            s.write_all(&frame[..500]).await.expect("send");
            s.shutdown().await.expect("shutdown");
            loop {
                match tokio::time::timeout(WAIT, read_frame(&mut s, &limits)).await {
                    Ok(Ok(Some(f))) => {
                        let text = error_reply(&f.msg).map(|e| e.1).unwrap_or_default();
                        assert!(text.contains("truncated"), "{name}: {text:?}");
                    }
                    Ok(Ok(None)) | Ok(Err(_)) => break,
                    Err(_) => panic!("{name} keeps a truncated frame's connection open"),
                }
            }

            // A fresh connection is served, and so is the one that was open all along.
            let mut s = authenticated(&addr, &secret).await;
            for (id, conn) in [(14, &mut s), (15, &mut bystander)] {
                write_frame(conn, FrameKind::Request, id, &[0], &[]).await.expect("send ping");
                let f = read_frame(conn, &limits).await.expect("answer").expect("not closed");
                assert_eq!((f.request_id, &f.msg[..]), (id, &[0u8][..]), "{name}");
            }
        });
        assert!(c.alive(name), "{name} died");
    }
    assert_eq!(c.get("/f"), b"before");
    c.put("/g", b"after");
    assert_eq!(c.get("/g"), b"after");
}

#[test]
fn cluster_processes_and_directory_are_cleaned_up_when_a_test_panics() {
    let seen = std::sync::Mutex::new((Vec::new(), std::path::PathBuf::new()));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let c = Cluster::start(bin(), ClusterSpec { osts_per_oss: vec![1], ..Default::default() });
        *seen.lock().expect("lock") = (c.pids(), c.dir.path().to_path_buf());
        panic!("a failing test");
    }));
    assert!(r.is_err());
    let (pids, dir) = seen.into_inner().expect("lock");
    assert_eq!(pids.len(), 3, "mgs, mds, oss");
    assert!(!dir.exists(), "{} left behind", dir.display());
    for pid in pids {
        // The harness reaped its children, so none of them exists any more.
        // SAFETY: kill(2) with signal 0 only checks for existence.
        let exists = unsafe { libc::kill(pid as i32, 0) } == 0;
        assert!(!exists, "server {pid} still running");
    }
}

/// The state letter of process `pid` (`Z` for a zombie), `None` once it is gone.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().next()?.chars().next()
}

#[test]
fn servers_die_with_a_test_that_is_killed_before_its_cleanup() {
    let dir = TempDir::new("orphan");
    let addr = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let data = dir.path().join("mgs").to_string_lossy().into_owned();
    let log = dir.path().join("mgs.log");
    let pid = std::thread::spawn(move || {
        let args = ["mgs", "--insecure", "--listen", &addr, "--data", &data];
        let d = Daemon::start(bin(), &args, &[], &log, "listening on").expect("start an MGS");
        let pid = d.pid().expect("pid");
        // As if the test were killed: no Drop runs, only the thread ends.
        std::mem::forget(d);
        pid
    })
    .join()
    .expect("starter thread");
    testkit::wait_for("the abandoned MGS to be killed", WAIT, || matches!(process_state(pid), None | Some('Z')));
    // SAFETY: reaping our own (now dead) child.
    unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), libc::WNOHANG) };
}
