//! What an admin installs from `dist/`: the systemd units and the documented
//! `braid.toml` run a real cluster, and clients mount it as `/etc/fstab` and systemd
//! mount units do, through mount(8) and its helper convention (`mount -t
//! fuse.braid`, see the `cli::mount_helper` module).
//!
//! No systemd runs here (the tests run in containers too): `systemd-analyze verify`
//! checks the units, and their `ExecStart=` lines are run as systemd runs them.
//! mount(8) looks for helpers in `/sbin` only and drops the caller's `PATH`, so the
//! mount tests run it in a private mount namespace (`unshare --mount`) where
//! `mount.fuse.braid` is overlaid on `/usr/sbin`, or `braid` bound on
//! `/usr/local/bin`: the machine's directories are never written to, and the mounts
//! are seen only inside.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use testkit::{free_port, output_within, pattern, stderr, stdout, Cluster, ClusterSpec, Daemon, TempDir};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_braid"))
}

/// The repository's `dist/` directory.
fn dist() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist")
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// `text` with each `(from, to)` replaced, every `from` required to be there: a
/// rewrite that silently missed would test the wrong file.
fn rewrite(text: &str, swaps: &[(&str, &str)]) -> String {
    let mut out = text.to_string();
    for (from, to) in swaps {
        assert!(out.contains(from), "{from} is not in the file any more; update this test:\n{text}");
        out = out.replace(from, to);
    }
    out
}

/// The value of `key=` in a unit file (the first such line).
fn unit_value(unit: &str, key: &str) -> String {
    let prefix = format!("{key}=");
    let line = unit.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {key}= in\n{unit}"));
    line[prefix.len()..].trim().to_string()
}

// ---------------------------------------------------------------------------------
// Mounts in a private mount namespace.
// ---------------------------------------------------------------------------------

/// The start of every namespace script: on exit, whatever happened, the mount is taken
/// off and the mount process it started (its pid, once known, in `$pid`) is killed.
const SCRIPT_PROLOGUE: &str = r#"
set -u
pid=
cleanup() {
  if mountpoint -q "$MNT"; then umount "$MNT" 2>/dev/null || umount -l "$MNT"; fi
  if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null; fi
}
trap cleanup EXIT
"#;

/// Mounts with the mount command in `$MOUNT_CMD` (word-split), runs `$AGAIN_CMD`
/// (a second mount of the same) and counts the mounts, then copies `$SRC` in and
/// compares it, unmounts with umount(8) and waits for the mount process to end.
/// Each step says how it went on stdout.
const SCRIPT_MOUNT_COPY_UNMOUNT: &str = r#"
out=$($MOUNT_CMD) || { echo "MOUNT FAILED rc=$?: $out"; exit 1; }
echo "$out"
pid=$(sed -n 's/.*(pid \([0-9]*\),.*/\1/p' <<<"$out")
[ -n "$pid" ] || { echo "NO PID in mount's output"; exit 1; }
grep " $MNT " /proc/self/mountinfo
again=$($AGAIN_CMD 2>&1)
echo "again rc=$?: $again"
echo "mounts on MNT: $(grep -c " $MNT " /proc/self/mountinfo)"
cp "$SRC" "$MNT/file" && cmp "$SRC" "$MNT/file" && echo "COPIED"
umount "$MNT" && echo "UNMOUNTED"
for _ in $(seq 100); do
  kill -0 "$pid" 2>/dev/null || { echo "MOUNT PROCESS EXITED"; pid=; break; }
  sleep 0.1
done
"#;

/// Runs `script` with bash in a private mount namespace, with `env`; bounded.
fn in_mount_namespace(script: &str, env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "bash", "-c", script]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = output_within(&mut cmd, Duration::from_secs(180))
        .unwrap_or_else(|o| panic!("namespace script still running after 180 s:\n{}{}", stdout(&o), stderr(&o)));
    eprintln!("---- namespace script ----\n{}{}", stdout(&out), stderr(&out));
    out
}

/// Kills, on drop, any mount process still serving `mountpoint` (found by its
/// command line, `braid mount -f URL MOUNTPOINT`, and killed by pid): the scripts
/// end their own, this covers a script killed half way.
struct MountProcesses {
    mountpoint: PathBuf,
}

impl Drop for MountProcesses {
    fn drop(&mut self) {
        let want = s(&self.mountpoint);
        let Ok(procs) = fs::read_dir("/proc") else { return };
        for p in procs.flatten() {
            let Ok(pid) = p.file_name().to_string_lossy().parse::<i32>() else { continue };
            let Ok(cmdline) = fs::read(p.path().join("cmdline")) else { continue };
            let args: Vec<String> =
                cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            let ours = args.get(1).is_some_and(|a| a == "mount") && args.contains(&want);
            if ours {
                eprintln!("killing mount process {pid} left on {want}");
                // SAFETY: kill(2) of a process this test started (its mount point is ours).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// A fresh mount point and the guard that ends its mount process.
fn mount_point(work: &Path) -> (PathBuf, MountProcesses) {
    let mnt = work.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let mnt = fs::canonicalize(&mnt).unwrap();
    (mnt.clone(), MountProcesses { mountpoint: mnt })
}

/// Asserts what [`SCRIPT_MOUNT_COPY_UNMOUNT`] reports of a good run on `mnt` of the
/// cluster at `mgs`.
fn assert_mounted_copied_unmounted(out: &Output, mnt: &Path, mgs: &str) {
    let text = stdout(out);
    let all = format!("{text}{}", stderr(out));
    assert!(out.status.success(), "the script failed:\n{all}");
    // The kernel records type `fuse` (fuser mounts with mount(2), without the
    // subtype; see `cli::mount::braid_mount`), the source names the cluster.
    let want = s(mnt);
    let mountinfo = |l: &&str| l.contains(" - ") && l.split(' ').nth(4) == Some(want.as_str());
    let line = text.lines().find(mountinfo).unwrap_or("");
    let fields: Vec<&str> = line.split(" - ").nth(1).unwrap_or("").split(' ').collect();
    let source = format!("braid@{mgs}");
    assert!(
        matches!(fields.first(), Some(&"fuse" | &"fuse.braid")) && fields.get(1) == Some(&source.as_str()),
        "a braid mount of {source} on {} in mountinfo:\n{all}",
        mnt.display()
    );
    for step in ["mounts on MNT: 1", "COPIED", "UNMOUNTED", "MOUNT PROCESS EXITED"] {
        assert!(text.lines().any(|l| l == step), "{step} missing:\n{all}");
    }
}

// ---------------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------------

/// `mount -a` with an fstab line as `docs/admin.md` gives it (and `noexec`), without a
/// `/sbin/mount.fuse.braid`: mount(8) runs fuse3's mount.fuse, which runs `braid
/// SOURCE MOUNTPOINT -o ...` from the default `PATH` (`/usr/local/bin` here). A second
/// `mount -a` finds it mounted (the source is written as the kernel lists it) and
/// mounts nothing. The bytes written through the mount are read back through the
/// cluster.
#[test]
fn fstab_line_mounts_through_mount_fuse() {
    assert!(Path::new("/sbin/mount.fuse").exists(), "fuse3's /sbin/mount.fuse is missing (apt-get install fuse3)");
    if Path::new("/sbin/mount.fuse.braid").exists() {
        eprintln!("note: this machine has /sbin/mount.fuse.braid; mount(8) runs it rather than mount.fuse");
    }
    let c = Cluster::start(bin(), ClusterSpec::default());
    let work = c.dir.path().join("fstab");
    let (mnt, _guard) = mount_point(&work);
    let bin_dir = work.join("bin");
    fs::create_dir_all(&bin_dir).unwrap();
    std::os::unix::fs::symlink(bin(), bin_dir.join("braid")).unwrap();
    let log = work.join("mount.log");
    let fstab = work.join("fstab");
    fs::write(
        &fstab,
        format!(
            "# a comment, as in /etc/fstab\nbraid@{}  {}  fuse.braid  _netdev,nofail,noatime,noexec,x-systemd.mount-timeout=90,secret_file={},log={}  0 0\n",
            c.mgs_addr,
            mnt.display(),
            c.secret.display(),
            log.display()
        ),
    )
    .unwrap();
    let data = pattern(3 << 20, 5);
    let src = work.join("src");
    fs::write(&src, &data).unwrap();
    let script =
        format!("{SCRIPT_PROLOGUE}\nmount --bind \"$BIN_DIR\" /usr/local/bin || exit 1\n{SCRIPT_MOUNT_COPY_UNMOUNT}");
    let env = [
        ("MNT", s(&mnt)),
        ("SRC", s(&src)),
        ("BIN_DIR", s(&bin_dir)),
        ("MOUNT_CMD", format!("mount --all --fstab {}", fstab.display())),
        ("AGAIN_CMD", format!("mount --all --fstab {}", fstab.display())),
    ];
    let out = in_mount_namespace(&script, &env);
    assert_mounted_copied_unmounted(&out, &mnt, &c.mgs_addr);
    assert!(stdout(&out).contains("again rc=0: \n"), "a second mount -a is a quiet no-op:\n{}", stdout(&out));
    let mountinfo = stdout(&out).lines().find(|l| l.contains(" - fuse")).unwrap_or("").to_string();
    let flags = mountinfo.split(' ').nth(5).unwrap_or("");
    assert!(flags.split(',').any(|f| f == "noexec"), "noexec reaches the kernel: {mountinfo}");
    assert!(c.get("/file") == data, "the file written through the fstab mount is in the cluster, whole");
    assert!(log.exists(), "the mount process logged to log= ({})", log.display());
}

/// The documented `dist/braid.toml`, rewritten to this machine's addresses and
/// directories, and each unit's `ExecStart=` run as systemd would: a cluster that
/// serves. A client mounts it with the example mount unit's `What=`, `Type=` and
/// `Options=` through `/sbin/mount.fuse.braid` (overlaid in a private namespace),
/// after a fake mount (`mount -f`) that mounts nothing and a wrong option that
/// fails as mount(8) expects. `systemctl stop` (SIGTERM) ends every server with
/// status 0, which `Restart=on-failure` leaves stopped.
#[test]
fn example_config_and_units_run_a_cluster_mounted_by_mount_helper() {
    let work = TempDir::new("dist");
    let secret = work.path().join("cluster.secret");
    let out = Command::new(bin()).arg("gen-secret").arg(&secret).output().unwrap();
    assert!(out.status.success(), "gen-secret: {}", String::from_utf8_lossy(&out.stderr));
    let addr = |ip: &str| format!("{ip}:{}", free_port(ip));
    let (mgs, mds, oss) = (addr("127.0.0.2"), addr("127.0.0.3"), addr("127.0.0.4"));
    let metrics: Vec<String> = (0..3).map(|_| addr("127.0.0.1")).collect();
    let srv = work.path().join("srv");
    let config = rewrite(
        &read(&dist().join("braid.toml")),
        &[
            ("10.0.0.1:9400", &mgs),
            ("10.0.0.2:9401", &mds),
            ("10.0.0.3:9402", &oss),
            ("127.0.0.1:9500", &metrics[0]),
            ("127.0.0.1:9501", &metrics[1]),
            ("127.0.0.1:9502", &metrics[2]),
            ("/etc/braid/cluster.secret", &s(&secret)),
            ("/srv/braid", &s(&srv)),
        ],
    );
    let config_path = work.path().join("braid.toml");
    fs::write(&config_path, &config).unwrap();

    let mut servers = Vec::new();
    for role in ["mgs", "mds", "oss"] {
        let unit = read(&dist().join(format!("systemd/braid-{role}.service")));
        assert_eq!(unit_value(&unit, "Type"), "exec", "braid-{role}: runs in the foreground");
        assert_eq!(unit_value(&unit, "Restart"), "on-failure", "braid-{role}");
        let argv: Vec<String> = unit_value(&unit, "ExecStart").split_whitespace().map(String::from).collect();
        assert_eq!(argv, ["/usr/local/bin/braid", role, "--config", "/etc/braid/braid.toml"], "braid-{role}");
        let args = [role, "--config", &s(&config_path)];
        let log = work.path().join(format!("{role}.log"));
        let d = Daemon::start(bin(), &args, &[], &log, "listening on")
            .unwrap_or_else(|tail| panic!("braid-{role}.service's command did not serve:\n{tail}"));
        assert!(
            d.banner.iter().any(|l| l.starts_with("metrics on http://")),
            "{role}: metrics = ... taken: {:?}",
            d.banner
        );
        servers.push((role, d));
    }
    let df = || {
        let mut cmd = Command::new(bin());
        cmd.args(["df", &format!("braid://{mgs}/")]).env("BRAID_SECRET_FILE", &secret);
        output_within(&mut cmd, Duration::from_secs(60)).map(|o| stdout(&o)).unwrap_or_default()
    };
    testkit::wait_for("the example's MDT and two OSTs in braid df", Duration::from_secs(30), || {
        let text = df();
        text.contains("[MDT:0]") && text.lines().filter(|l| l.contains("[OST:")).count() == 2
    });

    let unit = read(&dist().join("systemd/mnt-braid.mount"));
    assert_eq!(unit_value(&unit, "Where"), "/mnt/braid", "the unit's name is its mount point's");
    let (mnt, _guard) = mount_point(work.path());
    let log = work.path().join("mount.log");
    let what = rewrite(&unit_value(&unit, "What"), &[("10.0.0.1:9400", &mgs)]);
    let options = rewrite(
        &unit_value(&unit, "Options"),
        &[("/etc/braid/cluster.secret", &s(&secret)), ("/var/log/braid-mount.log", &s(&log))],
    );
    let fstype = unit_value(&unit, "Type");
    let helpers = work.path().join("sbin");
    fs::create_dir_all(&helpers).unwrap();
    std::os::unix::fs::symlink(bin(), helpers.join(format!("mount.{fstype}"))).unwrap();
    let data = pattern(3 << 20, 6);
    let src = work.path().join("src");
    fs::write(&src, &data).unwrap();
    let script = format!(
        r#"{SCRIPT_PROLOGUE}
sbin=$(readlink -f /sbin)
mount -t overlay braid-test-helpers -o "lowerdir=$HELPERS:$sbin" "$sbin" || exit 1
ls -l "$sbin/mount.$FSTYPE"
mount -f -t "$FSTYPE" "$WHAT" "$MNT" -o "$OPTIONS"; echo "fake rc=$?"
mountpoint -q "$MNT" && echo "FAKE MOUNTED"
mount -t "$FSTYPE" "$WHAT" "$MNT" -o "$OPTIONS,bogus_option"; echo "bad option rc=$?"
mountpoint -q "$MNT" && echo "BAD OPTION MOUNTED"
{SCRIPT_MOUNT_COPY_UNMOUNT}"#
    );
    let env = [
        ("MNT", s(&mnt)),
        ("SRC", s(&src)),
        ("HELPERS", s(&helpers)),
        ("FSTYPE", fstype.clone()),
        ("WHAT", what.clone()),
        ("OPTIONS", options.clone()),
        ("MOUNT_CMD", format!("mount -t {fstype} {what} {} -o {options}", mnt.display())),
        ("AGAIN_CMD", format!("mount -t {fstype} {what} {} -o {options}", mnt.display())),
    ];
    let out = in_mount_namespace(&script, &env);
    let text = stdout(&out);
    assert!(text.contains(&format!("-> {}", bin().display())), "mount.{fstype} overlaid:\n{text}");
    assert!(text.contains("fake rc=0") && !text.contains("FAKE MOUNTED"), "mount -f mounts nothing:\n{text}");
    assert!(text.contains("bad option rc=1"), "a wrong option is mount(8)'s usage error (1):\n{text}");
    assert!(!text.contains("BAD OPTION MOUNTED"), "{text}");
    assert!(stderr(&out).contains("unknown mount option 'bogus_option'"), "braid says which:\n{}", stderr(&out));
    assert_mounted_copied_unmounted(&out, &mnt, &mgs);
    assert!(
        stdout(&out).contains("again rc=32: ") && stdout(&out).contains("is already a braid mount"),
        "a second mount on the same point is refused (mount(8)'s 32), not stacked:\n{}",
        stdout(&out)
    );
    assert!(log.exists(), "the mount process logged to log= ({})", log.display());

    let mut cmd = Command::new(bin());
    cmd.args(["cp", &format!("braid://{mgs}/file"), &s(&work.path().join("back"))]).env("BRAID_SECRET_FILE", &secret);
    let o = output_within(&mut cmd, Duration::from_secs(60)).expect("braid cp finishes");
    assert!(o.status.success(), "braid cp: {}", stderr(&o));
    assert!(fs::read(work.path().join("back")).unwrap() == data, "the file is in the cluster, whole");

    // `systemctl stop`, the clients' servers first as After= orders it.
    for (role, mut d) in servers.into_iter().rev() {
        let status = d.terminate(Duration::from_secs(15));
        assert!(status.is_some_and(|s| s.success()), "braid {role} on SIGTERM: {status:?}");
    }
}

/// The units pass `systemd-analyze verify` (unit syntax, known keys, an executable
/// `ExecStart=`, a mount unit named after its mount point) without a word about them.
/// The binary they name is rewritten to this build's; a broken copy proves the check
/// reports what it should on this systemd.
#[test]
fn units_pass_systemd_analyze_verify() {
    let tool = Path::new("/usr/bin/systemd-analyze");
    assert!(tool.exists(), "systemd-analyze is missing (apt-get install systemd; scripts/test.sh does)");
    let work = TempDir::new("units");
    let mut units = Vec::new();
    for entry in fs::read_dir(dist().join("systemd")).unwrap() {
        let path = entry.unwrap().path();
        let text = rewrite(&read(&path), &[("/usr/local/bin/braid", &s(bin()))]);
        let copy = work.path().join(path.file_name().unwrap());
        fs::write(&copy, text).unwrap();
        units.push(copy);
    }
    units.sort();
    let names: Vec<String> = units.iter().map(|u| u.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["braid-mds.service", "braid-mgs.service", "braid-oss.service", "mnt-braid.mount"]);
    let verify = |files: &[PathBuf]| {
        let mut cmd = Command::new(tool);
        cmd.args(["verify", "--man=no"]).args(files);
        output_within(&mut cmd, Duration::from_secs(60)).expect("systemd-analyze verify finishes")
    };
    let about_ours = |o: &Output, names: &[String]| -> Vec<String> {
        let text = format!("{}{}", stdout(o), stderr(o));
        text.lines().filter(|l| names.iter().any(|n| l.contains(n.as_str()))).map(String::from).collect()
    };
    let out = verify(&units);
    let said = about_ours(&out, &names);
    assert!(out.status.success() && said.is_empty(), "systemd-analyze verify:\n{}{}", stdout(&out), stderr(&out));

    // A copy with an unknown key and a missing binary: both reported.
    let broken = work.path().join("braid-broken.service");
    let text = read(&units[1]).replace("LimitNOFILE=", "LimitNOFILES=").replace(&s(bin()), "/nonexistent/braid");
    fs::write(&broken, text).unwrap();
    let out = verify(std::slice::from_ref(&broken));
    let said = about_ours(&out, &["braid-broken.service".to_string()]).join("\n");
    assert!(!out.status.success(), "a missing ExecStart binary fails verify:\n{said}");
    assert!(said.contains("LimitNOFILES"), "an unknown key is reported:\n{said}");
}

/// `dist/braid.toml` parses with braid's own parser, every optional line too once
/// uncommented, and documents every key braid knows (as serde lists them).
#[test]
fn example_config_parses_and_names_every_key() {
    let path = dist().join("braid.toml");
    let file = cli::config::load(Some(&path)).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(file.mgs.listen.as_deref(), Some("10.0.0.1:9400"));
    assert_eq!(file.mds.mgs.as_deref(), Some("10.0.0.1:9400"));
    assert_eq!(file.oss.osts.len(), 2);
    assert!(file.secret_file.is_some() && !file.insecure);

    let text = read(&path);
    let optional = uncomment_settings(&text);
    let work = TempDir::new("config");
    let all = work.path().join("braid.toml");
    fs::write(&all, &optional).unwrap();
    let every = cli::config::load(Some(&all)).unwrap_or_else(|e| panic!("with every optional line: {e:#}"));
    assert!(every.mds.replicas.len() == 3 && every.nbd.exports.len() == 2, "the optional lines were read");

    for (section, header) in [("", ""), ("mgs", "[mgs]\n"), ("mds", "[mds]\n"), ("oss", "[oss]\n"), ("nbd", "[nbd]\n")]
    {
        let probe = work.path().join("probe.toml");
        fs::write(&probe, format!("{header}not_a_key_of_braid = 1\n")).unwrap();
        let err = format!("{:#}", cli::config::load(Some(&probe)).expect_err("an unknown key is refused"));
        let expected = err.split("expected one of").nth(1).unwrap_or_else(|| panic!("serde's list of fields: {err}"));
        let keys: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        assert!(!keys.is_empty(), "{err}");
        let in_section = section_text(&optional, section);
        for key in keys {
            if ["mgs", "mds", "oss", "nbd"].contains(&key) && section.is_empty() {
                continue;
            }
            let documented = in_section.lines().any(|l| l.starts_with(&format!("{key} = ")));
            assert!(documented, "dist/braid.toml does not document `{key}` in [{section}]");
        }
    }
}

/// `text` with every `# key = value` line uncommented (prose comments stay).
fn uncomment_settings(text: &str) -> String {
    let setting = |l: &str| {
        let rest = l.strip_prefix("# ")?;
        let key = rest.split(" = ").next()?;
        (rest.contains(" = ") && !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .then(|| rest.to_string())
    };
    text.lines().map(|l| setting(l).unwrap_or_else(|| l.to_string())).collect::<Vec<_>>().join("\n")
}

/// The lines of `[section]` (the top keys before any section for "").
fn section_text(text: &str, section: &str) -> String {
    let mut current = String::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = name.to_string();
        } else if current == section {
            out.push(line);
        }
    }
    out.join("\n")
}
