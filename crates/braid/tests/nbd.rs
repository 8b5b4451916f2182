//! The NBD export through real processes and real NBD clients: `braid nbd serve` (a
//! braid client of a cluster of MGS, MDS and OSS processes) driven by `nbdinfo`,
//! `nbdcopy`, `nbdfuse`, `nbdsh`, `qemu-img` and `qemu-io` (Debian's libnbd-bin,
//! python3-libnbd and qemu-utils), and by hand-written hostile clients over TCP.

use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testkit::{pattern, Cluster, ClusterSpec, Daemon};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

/// `braid nbd serve` with `exports` on a free port; its address.
fn serve(c: &Cluster, exports: &[&str], extra: &[&str]) -> (Daemon, String) {
    serve_with(c, exports, extra, &[])
}

/// [`serve`] with environment variables (`BRAID_CLIENT_OPTIONS`).
fn serve_with(c: &Cluster, exports: &[&str], extra: &[&str], env: &[(&str, &Path)]) -> (Daemon, String) {
    let mut args = vec!["nbd".to_string(), "serve".into(), c.url("/"), "--listen".into(), "127.0.0.1:0".into()];
    for e in exports {
        args.push("--export".into());
        args.push(e.to_string());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("--secret-file".into());
    args.push(c.secret.to_string_lossy().into_owned());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let log = c.dir.path().join(format!("nbd-{}.log", exports[0].split('=').next().unwrap()));
    let d = Daemon::start(bin(), &argv, env, &log, "NBD server at").expect("braid nbd serve starts");
    let addr = d.banner.last().unwrap().split_whitespace().nth(3).unwrap().trim_end_matches(',').to_string();
    (d, addr)
}

fn run(cmd: &mut Command) -> std::process::Output {
    testkit::output_within(cmd, Duration::from_secs(120)).expect("a client that ends")
}

/// `qemu-io` on `uri` running `cmds` in order.
fn qemu_io(uri: &str, cmds: &[&str]) -> std::process::Output {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw"]);
    for c in cmds {
        cmd.args(["-c", c]);
    }
    run(cmd.arg(uri))
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(out.status.success(), "{cmd:?}: {}{}", testkit::stdout(&out), testkit::stderr(&out));
    testkit::stdout(&out)
}

#[test]
fn real_nbd_clients_copy_read_and_write_a_braid_file_through_the_export() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    c.braid_ok(&["setstripe", "-c", "4", "-S", "1M", &c.url("/disk.img")]);
    let (_server, addr) = serve(&c, &["disk=/disk.img,size=64M", "iso=/disk.img,ro"], &[]);
    let uri = |name: &str| format!("nbd://{addr}/{name}");
    // What the export says of itself.
    let info = ok(Command::new("nbdinfo").arg(uri("disk")));
    for line in [
        "export-size: 67108864",
        "can_multi_conn: true",
        "can_flush: true",
        "can_fua: true",
        "can_trim: true",
        "is_read_only: false",
    ] {
        assert!(info.contains(line), "no '{line}' in:\n{info}");
    }
    let list = ok(Command::new("nbdinfo").arg("--list").arg(format!("nbd://{addr}")));
    assert!(list.contains("export=\"disk\"") && list.contains("export=\"iso\""), "{list}");
    assert!(ok(Command::new("nbdinfo").arg(uri("iso"))).contains("is_read_only: true"));
    assert!(ok(Command::new("qemu-img").args(["info", "-f", "raw"]).arg(uri("disk"))).contains("virtual size: 64 MiB"));
    // A 64 MiB image copied in over four connections and out again, byte for byte;
    // and it is the braid file's bytes.
    let work = c.dir.path();
    let image = pattern(64 << 20, 5);
    std::fs::write(work.join("in.img"), &image).unwrap();
    ok(Command::new("nbdcopy").arg("--connections=4").arg(work.join("in.img")).arg(uri("disk")));
    ok(Command::new("nbdcopy").arg(uri("disk")).arg(work.join("out.img")));
    assert!(std::fs::read(work.join("out.img")).unwrap() == image, "the copy out differs from the copy in");
    assert!(c.get("/disk.img") == image, "the braid file holds other bytes");
    // qemu-io: a pattern written and read back, unaligned too; zeroes and discards.
    let io = |cmd: &str| ok(Command::new("qemu-io").args(["-f", "raw", "-c", cmd]).arg(uri("disk")));
    io("write -P 0xab 4096 8192");
    io("read -P 0xab 4096 8192");
    io("write -P 0x11 1000 333");
    io("read -P 0x11 1000 333");
    io("write -z 1048576 65536");
    io("read -P 0 1048576 65536");
    io("discard 2097152 1048576");
    io("read -P 0 2097152 1048576");
    io("write -P 0x5a -f 3145728 4096");
    io("flush");
    // qemu will not open the read-only export for writing (the server's own EPERM is
    // the nbdsh test's).
    let out = run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -P 1 0 4096"]).arg(uri("iso")));
    let said = testkit::stderr(&out);
    assert!(!out.status.success() && said.contains("Could not open image: Permission denied"), "{said}");
    // And what the braid file holds now agrees.
    let now = c.get("/disk.img");
    assert!(now[4096..12288].iter().all(|&b| b == 0xab));
    assert!(now[1000..1333].iter().all(|&b| b == 0x11));
    assert!(now[1048576..1048576 + 65536].iter().all(|&b| b == 0));
    assert!(now[2097152..3145728].iter().all(|&b| b == 0));
    assert!(now[3145728..3149824].iter().all(|&b| b == 0x5a));
    assert!(now[8 << 20..] == image[8 << 20..], "bytes nobody wrote changed");
}

/// `nbdfuse DIR URI` as a child process: unmounted, then killed by PID and reaped on
/// drop, also when the test panics.
struct NbdFuse {
    dir: PathBuf,
    log: PathBuf,
    child: Child,
}

impl NbdFuse {
    /// Mounts `uri` on a fresh `dir` and waits (up to 30 s) until `dir/nbd` has `size` bytes.
    fn mount(dir: PathBuf, uri: &str, size: u64) -> NbdFuse {
        std::fs::create_dir_all(&dir).unwrap();
        let dir = std::fs::canonicalize(&dir).unwrap();
        let log = dir.with_extension("log");
        let err = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new("nbdfuse");
        cmd.arg(&dir).arg(uri).stdin(Stdio::null()).stdout(Stdio::null()).stderr(err);
        let child = testkit::die_with_parent(&mut cmd).spawn().expect("start nbdfuse");
        let mut m = NbdFuse { dir, log, child };
        let start = Instant::now();
        while std::fs::metadata(m.dir.join("nbd")).map(|md| md.len()).ok() != Some(size) {
            let log = || std::fs::read_to_string(&m.log).unwrap_or_default();
            if let Ok(Some(st)) = m.child.try_wait() {
                panic!("nbdfuse exited with {st}:\n{}", log());
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no {size}-byte nbd file after 30 s:\n{}", log());
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }
}

impl Drop for NbdFuse {
    fn drop(&mut self) {
        if testkit::is_mounted(&self.dir) {
            let _ =
                testkit::output_within(Command::new("fusermount3").arg("-u").arg(&self.dir), Duration::from_secs(30));
        }
        testkit::detach_mount(&self.dir);
        // An unmounted nbdfuse exits by itself; give it a moment.
        let start = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn nbdsh_and_nbdfuse_write_through_the_export_into_the_braid_file_and_read_only_refuses() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    c.braid_ok(&["setstripe", "-c", "4", "-S", "1M", &c.url("/disk.img")]);
    let (_server, addr) = serve(&c, &["disk=/disk.img,size=16M", "ro=/disk.img,ro"], &[]);
    let uri = |name: &str| format!("nbd://{addr}/{name}");
    // nbdsh runs `python3 -m nbd` from PATH; the nbd module is Debian's python3's, which
    // a python3 earlier in PATH (pyenv, a venv) would not have.
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let nbdsh =
        |name: &str, py: &str| ok(Command::new("nbdsh").env("PATH", &path).arg("-u").arg(uri(name)).arg("-c").arg(py));
    // What the export says; a pattern across a stripe boundary at an odd offset, written,
    // flushed and read back; a zeroed range inside it; a FUA write.
    let said = nbdsh(
        "disk",
        r#"
assert h.get_size() == 16 << 20, h.get_size()
assert h.can_multi_conn() and h.can_fua() and h.can_flush() and not h.is_read_only()
buf = bytes((i * 7 + 3) % 251 for i in range(300000))
off = (1 << 20) - 12345
h.pwrite(buf, off)
h.flush()
assert h.pread(len(buf), off) == buf, "read back differs"
h.zero(65613, off + 1000)
got = h.pread(len(buf), off)
assert got[:1000] == buf[:1000] and got[66613:] == buf[66613:], "bytes around the zeroes changed"
assert got[1000:66613] == bytes(65613), "not zeroed"
h.pwrite(b"fua!" * 1024, 5 << 20, nbd.CMD_FLAG_FUA)
# Zeroes that must be written, not punched, over more than one of the server's pieces.
span = bytes((i * 13 + 1) % 253 for i in range(3 << 20))
h.pwrite(span, 8 << 20)
h.zero((5 << 19) + 3, (8 << 20) + 7, nbd.CMD_FLAG_NO_HOLE)
got = h.pread(3 << 20, 8 << 20)
assert got[:7] == span[:7] and got[(5 << 19) + 10:] == span[(5 << 19) + 10:], "bytes around the written zeroes changed"
assert got[7:(5 << 19) + 10] == bytes((5 << 19) + 3), "not zeroed without a hole"
print("nbdsh ok")
"#,
    );
    assert!(said.contains("nbdsh ok"), "{said}");
    let buf: Vec<u8> = (0..300000u32).map(|i| ((i * 7 + 3) % 251) as u8).collect();
    let off = (1 << 20) - 12345;
    let mut want = buf.clone();
    want[1000..66613].fill(0);
    let now = c.get("/disk.img");
    assert!(now[off..off + want.len()] == want[..], "the braid file lacks nbdsh's bytes");
    assert!(now[5 << 20..(5 << 20) + 4096].chunks(4).all(|b| b == b"fua!"));
    // The read-only export refuses writes with EPERM: in libnbd (strict mode) and, with
    // the check off, from the server.
    let said = nbdsh(
        "ro",
        r#"
import errno
assert h.is_read_only()
for strict in (h.get_strict_mode(), 0):
    h.set_strict_mode(strict)
    try:
        h.pwrite(b"x" * 512, 0)
    except nbd.Error as e:
        assert e.errnum == errno.EPERM and e.errno == "EPERM", (strict, e.errnum, e.string)
        print("refused", strict, e)
    else:
        raise AssertionError("a read-only export took a write")
"#,
    );
    assert_eq!(said.matches("refused").count(), 2, "{said}");
    assert!(!said.contains("refused 0 nbd_pwrite: server does not"), "libnbd, not the server, refused: {said}");
    // nbdfuse: the export as a file, written and fsynced with std::fs, read back there,
    // and found in the braid file.
    let fuse = NbdFuse::mount(c.dir.path().join("nbdfuse"), &uri("disk"), 16 << 20);
    let file = fuse.dir.join("nbd");
    let data = pattern(3 << 20, 11);
    let at = (7 << 20) + 4321;
    let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut back = vec![0u8; data.len()];
    let mut f = std::fs::File::open(&file).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut back).unwrap();
    assert!(back == data, "nbdfuse reads back other bytes");
    let now = c.get("/disk.img");
    let at = at as usize;
    assert!(now[at..at + data.len()] == data[..], "the braid file lacks nbdfuse's bytes");
    assert!(now[off..off + want.len()] == want[..], "nbdfuse changed bytes it did not write");
    let dir = fuse.dir.clone();
    drop(fuse);
    assert!(!testkit::is_mounted(&dir), "nbdfuse still mounted");
}

/// The server's greeting and a fixed newstyle client's answer (no zeroes).
fn greet(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    assert_eq!(&hello[8..16], b"IHAVEOPT");
    s.write_all(&3u32.to_be_bytes()).unwrap();
    s
}

fn option(s: &mut TcpStream, opt: u32, data: &[u8]) {
    let mut b = b"IHAVEOPT".to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).unwrap();
}

/// Reads one option reply: (option, reply type, data).
fn option_reply(s: &mut TcpStream) -> (u32, u32, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(u64::from_be_bytes(h[..8].try_into().unwrap()), 0x3e889045565a9);
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
    let mut d = vec![0u8; len];
    s.read_exact(&mut d).unwrap();
    (u32::from_be_bytes(h[8..12].try_into().unwrap()), u32::from_be_bytes(h[12..16].try_into().unwrap()), d)
}

/// Opens `name` with NBD_OPT_GO; the reply types seen until the ACK.
fn go(s: &mut TcpStream, name: &str) -> Vec<u32> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&0u16.to_be_bytes());
    option(s, 7, &d);
    let mut kinds = Vec::new();
    loop {
        let (_, kind, _) = option_reply(s);
        kinds.push(kind);
        if kind != 3 {
            return kinds;
        }
    }
}

fn request(s: &mut TcpStream, kind: u16, cookie: u64, offset: u64, len: u32, payload: &[u8]) {
    let mut b = 0x25609513u32.to_be_bytes().to_vec();
    b.extend_from_slice(&0u16.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(payload);
    s.write_all(&b).unwrap();
}

/// A simple reply's (error, cookie).
fn simple(s: &mut TcpStream) -> (u32, u64) {
    let mut h = [0u8; 16];
    s.read_exact(&mut h).unwrap();
    assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), 0x67446698);
    (u32::from_be_bytes(h[4..8].try_into().unwrap()), u64::from_be_bytes(h[8..16].try_into().unwrap()))
}

fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(_) => return true,
        }
    }
}

#[test]
fn hostile_and_careless_clients_get_errors_and_the_export_is_unharmed() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    let (mut server, addr) = serve(&c, &["d=/d.img,size=1M"], &[]);
    // Unknown options are refused and the handshake goes on; an unknown export too.
    let mut s = greet(&addr);
    option(&mut s, 999, b"whatever");
    assert_eq!(option_reply(&mut s).1, (1 << 31) + 1, "NBD_REP_ERR_UNSUP");
    option(&mut s, 5, &[]);
    assert!(option_reply(&mut s).1 >= 1 << 31, "STARTTLS is refused cleanly");
    assert_eq!(go(&mut s, "nope"), vec![(1 << 31) + 6], "NBD_REP_ERR_UNKNOWN");
    option(&mut s, 7, &[0, 0, 0, 9, 1]);
    assert_eq!(option_reply(&mut s).1, (1 << 31) + 3, "a short GO is NBD_REP_ERR_INVALID");
    assert_eq!(go(&mut s, "").last(), Some(&1), "the default export");
    // Requests: a write and its read, one past the end, an unknown command; a burst
    // of pipelined reads answered by cookie.
    request(&mut s, 1, 7, 4096, 5, b"hello");
    assert_eq!(simple(&mut s), (0, 7));
    request(&mut s, 0, 8, 4096, 5, &[]);
    assert_eq!(simple(&mut s), (0, 8));
    let mut got = [0u8; 5];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello");
    request(&mut s, 0, 9, (1 << 20) - 2, 4, &[]);
    assert_eq!(simple(&mut s), (22, 9), "EINVAL past the end");
    request(&mut s, 1, 10, 1 << 20, 1, b"x");
    assert_eq!(simple(&mut s), (28, 10), "ENOSPC writing past the end");
    request(&mut s, 77, 11, 0, 0, &[]);
    assert_eq!(simple(&mut s), (22, 11), "EINVAL for an unknown command");
    for cookie in 100..164u64 {
        request(&mut s, 0, cookie, cookie * 16, 16, &[]);
    }
    let mut cookies = Vec::new();
    for _ in 0..64 {
        let (err, cookie) = simple(&mut s);
        assert_eq!(err, 0);
        let mut d = [0u8; 16];
        s.read_exact(&mut d).unwrap();
        cookies.push(cookie);
    }
    cookies.sort_unstable();
    assert_eq!(cookies, (100..164).collect::<Vec<_>>());
    request(&mut s, 2, 12, 0, 0, &[]);
    assert!(closed(&mut s), "DISC closes");
    // Garbage in place of an option, a huge option, a bad request magic, a client
    // gone in the middle of a write's payload: each closes its connection only.
    let mut g = greet(&addr);
    g.write_all(b"this is not an option at all").unwrap();
    assert!(closed(&mut g));
    let mut g = greet(&addr);
    g.write_all(b"IHAVEOPT").unwrap();
    g.write_all(&7u32.to_be_bytes()).unwrap();
    g.write_all(&u32::MAX.to_be_bytes()).unwrap();
    assert_eq!(option_reply(&mut g).1, (1 << 31) + 9, "NBD_REP_ERR_TOO_BIG");
    assert!(closed(&mut g));
    let mut g = greet(&addr);
    go(&mut g, "d");
    g.write_all(&[0x55; 28]).unwrap();
    assert!(closed(&mut g));
    let mut g = greet(&addr);
    go(&mut g, "d");
    request(&mut g, 1, 1, 0, 65536, &[0xee; 1000]);
    drop(g);
    let mut g = TcpStream::connect(&addr).unwrap();
    g.write_all(&[1, 2]).unwrap();
    drop(g);
    // Flags a client may not send.
    let mut g = TcpStream::connect(&addr).unwrap();
    let mut hello = [0u8; 18];
    g.read_exact(&mut hello).unwrap();
    g.write_all(&0xffu32.to_be_bytes()).unwrap();
    assert!(closed(&mut g));
    // The server is alive and the export holds what was written, nothing else.
    let mut s = greet(&addr);
    go(&mut s, "d");
    request(&mut s, 0, 1, 4090, 20, &[]);
    assert_eq!(simple(&mut s), (0, 1));
    let mut d = [0u8; 20];
    s.read_exact(&mut d).unwrap();
    assert_eq!(&d[6..11], b"hello");
    assert!(d[..6].iter().chain(&d[11..]).all(|&b| b == 0), "{d:?}");
    assert!(server.pid().is_some_and(|p| unsafe { libc::kill(p as i32, 0) } == 0));
    server.stop(Duration::from_secs(5));
    // Bad exports on the command line are clear errors, each its own.
    for (exports, says) in BAD_EXPORTS {
        assert_eq!(serve_fails(&c, exports, None), format!("braid: {says}"), "{exports:?}");
    }
}

/// Export lists that must not be served, and the error each gives.
const BAD_EXPORTS: &[(&[&str], &str)] = &[
    (&["d"], "export 'd': an export is NAME=PATH[,ro][,size=SIZE]"),
    (&["d=relative"], "export 'd=relative': the path must be absolute within the file system (e.g. d=/vm/disk.img)"),
    (&["d=/x,size=big"], "export 'd=/x,size=big': size=big is not a size (bytes with an optional K, M, G or T)"),
    (&["d=/x,bogus"], "export 'd=/x,bogus': unknown option 'bogus' (known: ro, size=SIZE)"),
    (&["d=/a,size=1M", "e=/b,size=1M", "d=/c,size=1M"], "two exports are named 'd'"),
    (&["d=/missing"], "cannot open /missing: no such file (size=SIZE creates it)"),
    (&["d=/nodir/x,size=1M"], "cannot open /nodir/x: no such directory /nodir"),
];

/// `braid nbd serve` of `exports` as flags, or with `config` as braid.toml and no
/// `--export`: it must fail; its stderr, trimmed.
fn serve_fails(c: &Cluster, exports: &[&str], config: Option<&Path>) -> String {
    let url = c.url("/");
    let mut args = vec!["nbd", "serve", &url, "--listen", "127.0.0.1:0"];
    for e in exports {
        args.extend(["--export", e]);
    }
    let config = config.map(|p| p.to_string_lossy().into_owned());
    if let Some(path) = &config {
        args.extend(["--config", path]);
    }
    let out = c.braid(&args);
    let err = testkit::stderr(&out).trim().to_string();
    assert!(!out.status.success(), "{args:?} was served: {err}");
    err
}

/// A braid.toml of one `[nbd]` section: `exports` and the `keys` lines.
fn nbd_toml(c: &Cluster, name: &str, exports: &[&str], keys: &str) -> PathBuf {
    let list: Vec<String> = exports.iter().map(|e| format!("{e:?}")).collect();
    let text = format!("[nbd]\nexports = [{}]\n{keys}\n", list.join(", "));
    let path = c.dir.path().join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Exports in braid.toml: served as `--export` serves them, flags over the file, and
/// a bad one fails with the very error the same `--export` gives.
#[test]
fn exports_in_braid_toml_are_served_and_bad_ones_fail_as_the_flag_does() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    // The file alone: its url, listen, exports and limits.
    let keys = format!("url = {:?}\nlisten = \"127.0.0.1:0\"\nmax_connections = 1", c.url("/"));
    let config = nbd_toml(&c, "good", &["cfg=/cfg.img,size=2M", "cro=/cfg.img,ro"], &keys);
    let config_s = config.to_string_lossy().into_owned();
    let secret = c.secret.to_string_lossy().into_owned();
    let argv = ["nbd", "serve", "--config", &config_s, "--secret-file", &secret];
    let log = c.dir.path().join("nbd-config.log");
    let mut d = Daemon::start(bin(), &argv, &[], &log, "NBD server at").expect("served from braid.toml");
    let addr = d.banner.last().unwrap().split_whitespace().nth(3).unwrap().trim_end_matches(',').to_string();
    let info = ok(Command::new("nbdinfo").arg(format!("nbd://{addr}/cfg")));
    assert!(info.contains("export-size: 2097152") && info.contains("is_read_only: false"), "{info}");
    let info = ok(Command::new("nbdinfo").arg(format!("nbd://{addr}/cro")));
    assert!(info.contains("is_read_only: true"), "{info}");
    d.stop(Duration::from_secs(5));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("connections_max=1"), "max_connections from the file: {text}");
    // Flags win: --export and --max-connections over the file's.
    let argv = [&argv[..], &["--export", "flag=/flag.img,size=1M", "--max-connections", "3"]].concat();
    let log = c.dir.path().join("nbd-config-flags.log");
    let mut d = Daemon::start(bin(), &argv, &[], &log, "NBD server at").expect("served with flags over the file");
    assert!(d.banner.last().unwrap().ends_with("exports: flag"), "{:?}", d.banner);
    d.stop(Duration::from_secs(5));
    assert!(std::fs::read_to_string(&log).unwrap().contains("connections_max=3"));
    // Each bad export list: in the file, the flag's error, said to be in the file.
    for (i, (exports, says)) in BAD_EXPORTS.iter().enumerate() {
        let flag = serve_fails(&c, exports, None);
        assert_eq!(flag, format!("braid: {says}"), "{exports:?}");
        let config = nbd_toml(&c, &format!("bad{i}"), exports, "");
        let file = serve_fails(&c, &[], Some(&config));
        assert!(file.ends_with(says), "{exports:?} in braid.toml: {file}");
        assert!(says.starts_with("cannot open") || file.contains("[nbd] exports of"), "{file}");
    }
    // Neither flags nor the file name an export.
    let none = nbd_toml(&c, "none", &[], "");
    let err = serve_fails(&c, &[], Some(&none));
    assert!(err.contains("give at least one --export NAME=PATH"), "{err}");
}

/// Past `--max-connections`, a client is refused in its handshake with why, the
/// server logs why, and the clients it serves go on; one gone, a new one is served.
#[test]
fn a_client_past_max_connections_is_refused_and_the_others_go_on() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    let (server, addr) = serve(&c, &["d=/d.img,size=1M"], &["--max-connections", "2"]);
    let mut first = greet(&addr);
    assert_eq!(go(&mut first, "d").last(), Some(&1));
    let mut second = greet(&addr);
    assert_eq!(go(&mut second, "d").last(), Some(&1));
    let uri = format!("nbd://{addr}/d");
    // nbdinfo is refused; libnbd's debug output carries the server's reason.
    let out = run(Command::new("nbdinfo").env("LIBNBD_DEBUG", "1").arg(&uri));
    let said = testkit::stderr(&out);
    assert!(!out.status.success(), "a third client was served: {}", testkit::stdout(&out));
    assert!(said.contains("the server has 2 connections already (its --max-connections)"), "{said}");
    // A raw third client: the greeting, then NBD_REP_ERR_POLICY to its options.
    let mut third = greet(&addr);
    assert_eq!(go(&mut third, "d"), vec![(1 << 31) + 2], "NBD_REP_ERR_POLICY");
    let log = std::fs::read_to_string(&server.log).unwrap();
    let why = "connections already (--max-connections)";
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("NBD: refusing connection from 127.0.0.1:")).collect();
    assert!(refused.len() == 2 && refused.iter().all(|l| l.contains(&format!(": 2 {why}"))), "{log}");
    // The two served go on.
    for (s, cookie, word) in [(&mut first, 1, b"first"), (&mut second, 2, b"secnd")] {
        request(s, 1, cookie, cookie * 4096, 5, word);
        assert_eq!(simple(s), (0, cookie));
    }
    request(&mut first, 0, 3, 8192, 5, &[]);
    assert_eq!(simple(&mut first), (0, 3));
    let mut got = [0u8; 5];
    first.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"secnd", "the first reads what the second wrote");
    // One leaves: a new client is served (once the server has seen it go).
    request(&mut second, 2, 4, 0, 0, &[]);
    assert!(closed(&mut second));
    let start = Instant::now();
    loop {
        let out = run(Command::new("nbdinfo").arg(&uri));
        if out.status.success() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "still refused: {}", testkit::stderr(&out));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// With a byte budget far below what the clients send at once, large writes from
/// several connections and clients wait for it (the server says so) and all land.
/// The image is on two OSTs emulating 40 MiB/s each: writes past the client's dirty
/// limit wait for them, so the server holds its budget long enough for others to
/// queue behind it however fast this machine is.
#[test]
fn writes_past_max_inflight_bytes_wait_and_all_land() {
    let mut c = Cluster::start(bin(), ClusterSpec::default());
    let slow: Vec<String> =
        (4..6).map(|k| format!("{}:bw=40M", c.dir.path().join(format!("ost{k}")).display())).collect();
    c.add_oss_with("oss-slow", &slow);
    c.wait_placement(6, Duration::from_secs(30));
    c.braid_ok(&["setstripe", "-c", "2", "-o", "4,5", "-S", "1M", &c.url("/b.img")]);
    let (server, addr) = serve(&c, &["b=/b.img,size=64M"], &["--max-inflight-bytes", "4M"]);
    let uri = format!("nbd://{addr}/b");
    let work = c.dir.path();
    // nbdcopy: 32 MiB in over four connections of 8 MiB requests (each one larger than
    // the budget, so each goes alone)...
    let image = pattern(32 << 20, 21);
    std::fs::write(work.join("b-in.img"), &image).unwrap();
    let mut copy = Command::new("nbdcopy");
    copy.args(["--connections=4", "--requests=16", "--request-size=8388608"]).arg(work.join("b-in.img")).arg(&uri);
    let copy = std::thread::spawn(move || run(&mut copy));
    // ... while nbdsh writes 32 MiB after it from three connections, 1 MiB writes,
    // 32 in flight on each in all, then reads it all back.
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let py = format!(
        r#"
hs = [nbd.NBD() for _ in range(3)]
for x in hs:
    x.connect_uri("{uri}")
def block(i):
    return bytes([(i * 13 + 7) % 256]) * (1 << 20)
todo = []
for i in range(32):
    todo.append(hs[i % 3].aio_pwrite(block(i), (32 + i) << 20))
while any(x.aio_in_flight() for x in hs):
    for x in hs:
        if x.aio_in_flight():
            x.poll(10)
for i, c in enumerate(todo):
    assert hs[i % 3].aio_command_completed(c), i
for x in hs:
    x.flush()
for i in range(32):
    assert hs[0].pread(1 << 20, (32 + i) << 20) == block(i), i
print("nbdsh ok")
"#
    );
    let said = ok(Command::new("nbdsh").env("PATH", &path).arg("-c").arg(py));
    assert!(said.contains("nbdsh ok"), "{said}");
    let out = copy.join().unwrap();
    assert!(out.status.success(), "nbdcopy: {}", testkit::stderr(&out));
    let f = c.get("/b.img");
    assert!(f[..32 << 20] == image[..], "nbdcopy's bytes");
    for i in 0..32usize {
        let at = (32 + i) << 20;
        assert!(f[at..at + (1 << 20)].iter().all(|&b| b as usize == (i * 13 + 7) % 256), "nbdsh's MiB {i}");
    }
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(log.contains("waits for the byte budget (4194304 bytes)"), "no request waited: {log}");
}

#[test]
fn an_oss_killed_under_writes_gives_eio_and_what_was_flushed_survives() {
    let mut c = Cluster::start(bin(), ClusterSpec::default());
    c.braid_ok(&["setstripe", "-c", "4", "-S", "1M", &c.url("/f.img")]);
    // The export gives up on an unreachable OST after 3 s instead of a minute.
    let env = [("BRAID_CLIENT_OPTIONS", Path::new("timeout=3"))];
    let (_server, addr) = serve_with(&c, &["f=/f.img,size=16M"], &[], &env);
    let uri = format!("nbd://{addr}/f");
    let io = |cmds: &[&str]| qemu_io(&uri, cmds);
    let out = io(&["write -P 0x61 0 8M", "flush"]);
    assert!(out.status.success(), "{}", testkit::stderr(&out));
    c.kill("oss0");
    let out = io(&["write -P 0x62 0 1M", "flush"]);
    let said = format!("{}{}", testkit::stdout(&out), testkit::stderr(&out));
    assert!(said.contains("Input/output error"), "no EIO with the OSS down: {said}");
    c.restart("oss0");
    c.wait_osts_up(4, Duration::from_secs(30));
    let out = io(&["read -P 0x61 1M 7M"]);
    assert!(
        out.status.success(),
        "the flushed bytes after recovery: {}{}",
        testkit::stdout(&out),
        testkit::stderr(&out)
    );
    assert!(c.get("/f.img")[1 << 20..8 << 20].iter().all(|&b| b == 0x61));
}

/// The number after `key=` in the last line of `log` that has it.
fn logged(log: &Path, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text.lines().rev().find(|l| l.contains(&format!(" {key}=")))?;
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..].split(|ch: char| !ch.is_ascii_digit()).next()?.parse().ok()
}

/// `--short-circuit` beside the OSS: the export reads and writes the object files
/// itself, and what NBD clients see is what braid clients over TCP see.
#[test]
fn an_export_beside_its_oss_reads_and_writes_the_object_files_itself() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    c.braid_ok(&["setstripe", "-c", "4", "-S", "1M", &c.url("/sc.img")]);
    let (mut server, addr) = serve(&c, &["sc=/sc.img,size=32M"], &["--short-circuit"]);
    let uri = format!("nbd://{addr}/sc");
    let work = c.dir.path();
    let image = pattern(32 << 20, 9);
    std::fs::write(work.join("sc-in.img"), &image).unwrap();
    ok(Command::new("nbdcopy").arg("--connections=4").arg(work.join("sc-in.img")).arg(&uri));
    ok(Command::new("nbdcopy").arg(&uri).arg(work.join("sc-out.img")));
    assert!(std::fs::read(work.join("sc-out.img")).unwrap() == image, "the copy out differs from the copy in");
    assert!(c.get("/sc.img") == image, "a client over TCP reads other bytes");
    // Simple replies too (nbdcopy asks for structured ones): a long read across
    // stripes at an odd offset.
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let simple = work.join("sc-simple.img");
    let py = format!(
        "h.set_request_structured_replies(False)\nh.connect_uri('{uri}')\nassert not h.get_structured_replies_negotiated()\nopen('{}', 'wb').write(h.pread(3 << 20, (1 << 20) - 777))",
        simple.display()
    );
    ok(Command::new("nbdsh").env("PATH", &path).arg("-c").arg(py));
    assert!(
        std::fs::read(&simple).unwrap()[..] == image[(1 << 20) - 777..(4 << 20) - 777],
        "a read with a simple reply"
    );
    // Written over TCP, read through the export (which keeps no copy of local bytes).
    let mut f = image.clone();
    f[(5 << 20) + 100..(5 << 20) + 4196].fill(0x77);
    c.put("/sc.img", &f);
    let out = qemu_io(&uri, &["read -P 0x77 5242980 4096", "write -P 0x78 9M 8k", "flush"]);
    assert!(out.status.success() && !testkit::stdout(&out).contains("fail"), "{}", testkit::stdout(&out));
    assert!(c.get("/sc.img")[9 << 20..(9 << 20) + 8192].iter().all(|&b| b == 0x78));
    server.stop(Duration::from_secs(10));
    let local = logged(&server.log, "local").expect("the export's requests at exit in its log");
    assert!(local >= 64, "{local} reads and writes through descriptors: fewer than the copies made");
}

#[test]
fn rereads_come_from_the_exports_memory_and_what_clients_write_is_what_they_read() {
    let mut c = Cluster::start(bin(), ClusterSpec::default());
    c.braid_ok(&["setstripe", "-c", "4", "-S", "1M", &c.url("/m.img")]);
    // The export gives up on an unreachable OST after 3 s; its page cache is on (the
    // default).
    let env = [("BRAID_CLIENT_OPTIONS", Path::new("timeout=3"))];
    let (server, addr) = serve_with(&c, &["m=/m.img,size=8M"], &[], &env);
    let uri = format!("nbd://{addr}/m");
    let io = |cmds: &[&str]| {
        let out = qemu_io(&uri, cmds);
        (out.status.success(), format!("{}{}", testkit::stdout(&out), testkit::stderr(&out)))
    };
    let must = |cmds: &[&str]| {
        let (ok, said) = io(cmds);
        assert!(ok && !said.contains("error") && !said.contains("Pattern verification failed"), "{cmds:?}: {said}");
    };
    must(&["write -P 0x41 0 8M", "flush"]);
    // Read (into the cache), then changed inside what was read, by a write, a zeroing
    // and a trim: each read after shows the change, never the cached bytes before it.
    must(&["read -P 0x41 0 4M"]);
    must(&["write -P 0x42 1M 4k", "read -P 0x42 1M 4k", "read -P 0x41 0 1M", "read -P 0x41 1052672 3141632"]);
    must(&["read -P 0x41 2M 1M", "write -z 2M 64k", "read -P 0 2M 64k", "read -P 0x41 2162688 983040"]);
    must(&["read -P 0x41 3M 64k", "discard 3M 64k", "read -P 0 3M 64k"]);
    // With every OSS gone, what the export read last is still served, from its memory;
    // a range it never read fails.
    must(&["read -P 0x41 0 1M"]);
    c.kill("oss0"); // all four OSTs
    must(&["read -P 0x41 0 1M", "read -P 0x42 1M 4k"]);
    let (ok, said) = io(&["read 6M 4k"]);
    assert!(
        !ok && said.contains("read failed: Input/output error"),
        "a read of bytes only the OSTs have, with them gone: {said}"
    );
    c.restart("oss0");
    c.wait_osts_up(4, Duration::from_secs(30));
    must(&["read -P 0x41 4M 4M"]);
    drop(server);
    let f = c.get("/m.img");
    assert!(f[1 << 20..(1 << 20) + 4096].iter().all(|&b| b == 0x42));
    assert!(f[2 << 20..(2 << 20) + 65536].iter().all(|&b| b == 0));
    assert!(f[4 << 20..].iter().all(|&b| b == 0x41));
}

/// The numbers of a Markdown table row (its x label is text, or a number that
/// `values` leaves out by position).
fn cells(line: &str) -> Vec<f64> {
    line.split('|').skip(2).filter_map(|c| c.trim().parse::<f64>().ok()).collect()
}

#[test]
fn bench_sweep_nbd_preset_measures_an_export_through_the_protocol_and_plots_it() {
    let c = Cluster::start(bin(), ClusterSpec::default());
    c.braid_ok(&["setstripe", "-c", "4", "-S", "1M", &c.url("/disk.img")]);
    let (_server, addr) = serve(&c, &["disk=/disk.img,size=64M", "ro=/disk.img,ro"], &[]);
    let out = c.dir.path().join("sweep");
    let out_s = out.to_string_lossy().into_owned();
    let target = format!("braid=nbd://{addr}/disk");
    c.braid_ok(&["bench", "sweep", "--preset", "nbd", "--quick", "-q", "--target", &target, "--out", &out_s]);
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    for id in ["nbd-latency", "nbd-sequential", "nbd-write-model", "nbd-depth"] {
        let svg = std::fs::read_to_string(out.join(format!("{id}.svg"))).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("braid"), "{id}.svg");
        assert!(md.contains(&format!("({id}.svg)")), "{id} in the report");
    }
    // Every row of every figure has a measured, positive value for each series:
    // Table 1's four sizes (reads and writes), figure 1's three transfers, figure 3's
    // two amounts (measured and model), figure 4's six depths (writes and reads).
    let rows = [
        ("| 512 |", 2),
        ("| 1k |", 2),
        ("| 4k |", 2),
        ("| 64k |", 2),
        ("| write |", 1),
        ("| write, FUA |", 1),
        ("| read |", 1),
        ("| 16m |", 2),
        ("| 64m |", 2),
        ("| 1 |", 2),
        ("| 32 |", 2),
    ];
    for (row, width) in rows {
        let line = md.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no row {row}: {md}"));
        let values = cells(line);
        assert!(values.len() == width && values.iter().all(|&v| v > 0.0), "{line}");
    }
    // The sweep wrote through the export: the braid file holds its pattern now.
    let data = c.get("/disk.img");
    assert_eq!(data.len(), 64 << 20);
    assert!(data[..4096].iter().any(|&b| b != 0));
    // Bad targets are refused before anything runs.
    for (bad, why) in [
        (format!("ro=nbd://{addr}/ro"), "read-only"),
        (format!("x=nbd://{addr}/nope"), "refused"),
        ("x=/tmp".to_string(), "nbd://"),
    ] {
        let o = c.braid(&["bench", "sweep", "--preset", "nbd", "--quick", "-q", "--target", &bad, "--out", &out_s]);
        assert!(!o.status.success() && testkit::stderr(&o).contains(why), "{bad}: {}", testkit::stderr(&o));
    }
}

/// A TLS directory for libnbd and qemu clients (their file names), with a
/// certificate of `ca`.
fn nbd_client_tls(dir: &Path, trust: &testkit::tls::Ca, signer: &testkit::tls::Ca) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let (cert, key) = signer.node(&["client"], false);
    std::fs::write(dir.join("ca-cert.pem"), trust.pem()).unwrap();
    std::fs::write(dir.join("client-cert.pem"), cert).unwrap();
    std::fs::write(dir.join("client-key.pem"), key).unwrap();
    dir.to_path_buf()
}

#[test]
fn an_export_requiring_tls_serves_x509_clients_and_tells_plain_ones_nothing() {
    use testkit::tls::{write_dir, Ca};
    let c = Cluster::start(bin(), ClusterSpec::default());
    c.braid_ok(&["setstripe", "-c", "4", "-S", "1M", &c.url("/tls.img")]);
    let work = c.dir.path().to_path_buf();
    let (ca, other) = (Ca::new("nbd CA"), Ca::new("another CA"));
    let server_tls = write_dir(&work.join("srv-tls"), &ca, ca.node(&["127.0.0.1", "localhost"], false));
    let good = nbd_client_tls(&work.join("cli-tls"), &ca, &ca);
    let foreign = nbd_client_tls(&work.join("foreign-tls"), &ca, &other);
    let srv = server_tls.to_string_lossy().into_owned();
    // Short-circuit: reads of the object files come as file ranges, which over TLS
    // are read and encrypted instead of sent with sendfile.
    let extra = ["--tls-dir", &srv, "--tls-required", "--short-circuit"];
    let (_server, addr) = serve(&c, &["tls=/tls.img,size=16M"], &extra);
    let tls_uri = |dir: &Path| format!("nbds://{addr}/tls?tls-certificates={}", dir.display());

    // libnbd's clients over TLS: what the export is, and a copy in and out.
    let info = ok(Command::new("nbdinfo").arg(tls_uri(&good)));
    assert!(info.contains("export-size: 16777216"), "{info}");
    let image = pattern(16 << 20, 9);
    std::fs::write(work.join("tls-in.img"), &image).unwrap();
    ok(Command::new("nbdcopy").arg(work.join("tls-in.img")).arg(tls_uri(&good)));
    ok(Command::new("nbdcopy").arg(tls_uri(&good)).arg(work.join("tls-out.img")));
    assert!(std::fs::read(work.join("tls-out.img")).unwrap() == image, "the copy out over TLS differs");
    assert!(c.get("/tls.img") == image, "the braid file holds what was copied in over TLS");
    // qemu's over TLS, with its x509 credentials object.
    let (host, port) = addr.rsplit_once(':').unwrap();
    let creds = format!("tls-creds-x509,id=tls0,dir={},endpoint=client", good.display());
    let opts = format!("driver=nbd,host={host},port={port},export=tls,tls-creds=tls0");
    let qinfo = ok(Command::new("qemu-img").args(["info", "--object", &creds, "--image-opts", &opts]));
    assert!(qinfo.contains("virtual size: 16 MiB"), "{qinfo}");
    ok(Command::new("qemu-io").args(["--object", &creds, "--image-opts", "-c", "write -P 0x3c 0 65536", &opts]));
    ok(Command::new("qemu-io").args(["--object", &creds, "--image-opts", "-c", "read -P 0x3c 0 65536", &opts]));

    // A plain client learns no export: neither the list nor one by name.
    let plain = run(Command::new("nbdinfo").arg("--list").arg(format!("nbd://{addr}")));
    assert!(!plain.status.success(), "a plain client is refused");
    assert!(!testkit::stdout(&plain).contains("tls"), "{}", testkit::stdout(&plain));
    let plain = run(Command::new("nbdinfo").env("LIBNBD_DEBUG", "1").arg(format!("nbd://{addr}/tls")));
    assert!(!plain.status.success());
    assert!(testkit::stderr(&plain).contains("requires TLS"), "the refusal says why: {}", testkit::stderr(&plain));
    // A certificate of another CA is refused; the export goes on serving.
    let out = run(Command::new("nbdinfo").arg(tls_uri(&foreign)));
    assert!(!out.status.success(), "a client certificate of another CA is refused");
    assert!(ok(Command::new("nbdinfo").arg(tls_uri(&good))).contains("export-size: 16777216"));
}
