//! `braid mount`, `braid umount`, and finding the cluster behind a path inside a mount.
//!
//! A mount's source is `braid@MGS_ADDRESS` and its type `fuse` (or `fuse.braid`), so any tool can
//! tell from `/proc/self/mountinfo` which cluster a path belongs to. The mount also
//! records the secret file it used under `/run/braid/` (readable by root only), so
//! tools run on a mounted path find the secret without being told.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use client::{BlockingClient, ClientConfig};

use crate::url::BraidPath;

/// Where mounts record the secret file they use.
const RUN_DIR: &str = "/run/braid";

/// Parsed `-o` options of `braid mount`.
#[derive(Debug, Clone)]
pub struct MountSettings {
    pub fuse: fuse::MountOptions,
    pub timeout_s: u64,
    /// Kernel read-ahead of the mount, in KiB (the bdi's `read_ahead_kb`).
    pub readahead_kb: u32,
    /// Directory leases (see the client's `lease` module): on unless `dir_leases=0`.
    pub dir_leases: bool,
}

impl MountSettings {
    /// The client settings of a mount of the cluster at `mgs`.
    pub fn client_config(&self, mgs: &str, secret: client::Secret) -> ClientConfig {
        let mut cfg = ClientConfig::new(mgs, secret);
        cfg.rpc.recovery_timeout = Duration::from_secs(self.timeout_s);
        cfg.dir_leases = self.dir_leases;
        cfg
    }
}

pub fn parse_options(list: &[String]) -> Result<MountSettings> {
    let mut s =
        MountSettings { fuse: fuse::MountOptions::default(), timeout_s: 60, readahead_kb: 4096, dir_leases: true };
    for opt in list.iter().flat_map(|o| o.split(',')).filter(|o| !o.is_empty()) {
        let (k, v) = opt.split_once('=').map_or((opt, None), |(k, v)| (k, Some(v)));
        let num = |v: Option<&str>| -> Result<f64> {
            v.context(format!("option {k} needs a value"))?
                .parse::<f64>()
                .with_context(|| format!("option {opt}: not a number"))
        };
        match k {
            "attr_timeout" => s.fuse.attr_ttl = Duration::from_secs_f64(num(v)?.max(0.0)),
            "entry_timeout" => s.fuse.entry_ttl = Duration::from_secs_f64(num(v)?.max(0.0)),
            "allow_other" => s.fuse.allow_other = true,
            "direct_io" => s.fuse.direct_io = true,
            "ro" => s.fuse.read_only = true,
            "rw" => s.fuse.read_only = false,
            "threads" => s.fuse.threads = (num(v)? as usize).clamp(1, 64),
            "timeout" => s.timeout_s = (num(v)? as u64).max(1),
            "max_write" => s.fuse.max_write_bytes = (num(v)? as u32).clamp(4096, 1 << 20),
            "readahead_kb" => s.readahead_kb = (num(v)? as u32).clamp(4, 1 << 20),
            "dir_leases" => {
                s.dir_leases = match v {
                    None | Some("1") | Some("on") => true,
                    Some("0") | Some("off") => false,
                    Some(_) => bail!("option {opt}: dir_leases=1 or dir_leases=0"),
                }
            }
            _ => bail!("unknown mount option '{opt}' (known: attr_timeout=S, entry_timeout=S, allow_other, direct_io, ro, rw, threads=N, timeout=S, max_write=BYTES, readahead_kb=KIB, dir_leases=0|1)"),
        }
    }
    Ok(s)
}

fn secret_record(mgs: &str) -> PathBuf {
    Path::new(RUN_DIR).join(format!("{}.secret-file", mgs.replace([':', '/'], "_")))
}

fn record_secret(mgs: &str, secret_file: Option<&Path>) {
    if let Some(f) = secret_file {
        record_secret_file(mgs, f);
    }
}

/// Records which secret file the mount of `mgs` uses.
pub fn record_secret_file(mgs: &str, f: &Path) {
    let Ok(abs) = std::fs::canonicalize(f) else { return };
    if std::fs::create_dir_all(RUN_DIR).is_ok() {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(RUN_DIR, std::fs::Permissions::from_mode(0o700));
        let _ = std::fs::write(secret_record(mgs), abs.to_string_lossy().as_bytes());
    }
}

/// The secret file a mount of `mgs` recorded, if any.
pub fn recorded_secret(mgs: &str) -> Option<PathBuf> {
    std::fs::read_to_string(secret_record(mgs)).ok().map(|s| PathBuf::from(s.trim()))
}

/// Mounts and serves in this process until unmounted or signalled.
pub fn mount_foreground(
    url: &str,
    mountpoint: &Path,
    settings: MountSettings,
    secret_file: Option<PathBuf>,
) -> Result<()> {
    let p = crate::url::require(url)?;
    let cfg = settings.client_config(&p.mgs, crate::client_secret(&secret_file)?);
    let bc = BlockingClient::connect(cfg, 4).with_context(|| format!("cannot connect to the cluster at {}", p.mgs))?;
    if p.path != "/" {
        bail!("mounting a subdirectory is not supported; mount braid://{}/", p.mgs);
    }
    let mut fuse_opts = settings.fuse.clone();
    fuse_opts.fsname = format!("braid@{}", p.mgs);
    let mut session = fuse::session(bc.client.clone(), bc.handle(), mountpoint, fuse_opts).with_context(|| {
        format!(
            "cannot mount on {} (is fuse3 installed and {} an empty directory?)",
            mountpoint.display(),
            mountpoint.display()
        )
    })?;
    record_secret(
        &p.mgs,
        secret_file.clone().or_else(|| std::env::var_os("BRAID_SECRET_FILE").map(PathBuf::from)).as_deref(),
    );
    tune_readahead(mountpoint, settings.readahead_kb);
    let mut unmounter = session.unmount_callable();
    let mp = mountpoint.to_path_buf();
    let handle = bc.handle();
    std::thread::spawn(move || {
        if let Ok(sig) = handle.block_on(crate::serve::until_signal()) {
            tracing::info!("unmounting {} on {sig}", mp.display());
            if let Err(e) = unmounter.unmount() {
                tracing::warn!("unmount of {} failed: {e}", mp.display());
            }
        }
    });
    println!("braid mounted {} on {}", p.url(), mountpoint.display());
    use std::io::Write;
    let _ = std::io::stdout().flush();
    session.run().context("FUSE session failed")?;
    Ok(())
}

/// Starts `braid mount -f` in the background and waits until the mount is ready.
pub fn mount_background(
    url: &str,
    mountpoint: &Path,
    options: &[String],
    secret_file: Option<PathBuf>,
    log: Option<PathBuf>,
) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the braid executable")?;
    let log = log.unwrap_or_else(|| std::env::temp_dir().join(format!("braid-mount-{}.log", std::process::id())));
    let log_file = std::fs::File::create(&log).with_context(|| format!("cannot create log {}", log.display()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("mount").arg("-f").arg(url).arg(mountpoint);
    for o in options {
        cmd.arg("-o").arg(o);
    }
    if let Some(s) = &secret_file {
        cmd.arg("--secret-file").arg(s);
    }
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(log_file);
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid only detaches the child from our session; it is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start the mount process")?;
    let start = Instant::now();
    let target = std::fs::canonicalize(mountpoint).unwrap_or(mountpoint.to_path_buf());
    loop {
        if braid_mounts().iter().any(|m| m.mountpoint == target) {
            println!("braid mounted {url} on {} (pid {}, log {})", mountpoint.display(), child.id(), log.display());
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            bail!("mount process exited with {status}:\n{text}");
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("mount not ready after 60 s; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long `umount` waits before aborting the FUSE connection.
const UMOUNT_WAIT: Duration = Duration::from_secs(10);

/// Sets the kernel read-ahead of the mount at `mountpoint`. FUSE keeps its bdi at the
/// kernel default (128 KiB) whatever read-ahead the file system asks for, so sequential
/// reads arrive as 128 KiB requests; measured here, 4 MiB makes a single reader ~6x
/// faster. Best effort: a failure is logged and the mount works as before.
pub fn tune_readahead(mountpoint: &Path, kb: u32) {
    let target = std::fs::canonicalize(mountpoint).unwrap_or(mountpoint.to_path_buf());
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let dev = text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 4 && Path::new(&unescape(f[4])) == target).then(|| f[2].to_string())
    });
    let Some(dev) = dev else {
        tracing::warn!("cannot find {} in mountinfo to set its read-ahead", target.display());
        return;
    };
    let knob = Path::new("/sys/class/bdi").join(&dev).join("read_ahead_kb");
    if let Err(e) = std::fs::write(&knob, kb.to_string()) {
        tracing::warn!("cannot set {} to {kb}: {e}", knob.display());
    }
}

/// Unmounts a braid mount. If the kernel waits on requests the mount cannot answer
/// (a server is down), the FUSE connection is aborted after a while so the unmount
/// always finishes; those requests fail with an error.
pub fn umount(mountpoint: &Path) -> Result<()> {
    let target = std::fs::canonicalize(mountpoint).unwrap_or(mountpoint.to_path_buf());
    let c = std::ffi::CString::new(target.as_os_str().as_encoded_bytes()).context("bad mount point")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // SAFETY: umount2 with a valid C string.
        let rc = unsafe { libc::umount2(c.as_ptr(), 0) };
        let _ = tx.send(if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) });
    });
    let result = match rx.recv_timeout(UMOUNT_WAIT) {
        Ok(r) => r,
        Err(_) => {
            if abort_connection(&target) {
                eprintln!(
                    "braid: {} did not unmount in {UMOUNT_WAIT:?}; aborted its FUSE connection",
                    target.display()
                );
            }
            rx.recv_timeout(UMOUNT_WAIT).unwrap_or_else(|_| Err(std::io::Error::other("unmount still blocked")))
        }
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) => {
            let status = std::process::Command::new("fusermount3").arg("-u").arg(&target).status();
            match status {
                Ok(s) if s.success() => Ok(()),
                _ => bail!("cannot unmount {}: {e}", target.display()),
            }
        }
    }
}

/// Aborts the FUSE connection of the mount at `target` (through fusectl); true if
/// it was found and aborted.
fn abort_connection(target: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let Some(dev) = text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 4 && Path::new(&unescape(f[4])) == target).then(|| f[2].to_string())
    }) else {
        return false;
    };
    let Some((_, minor)) = dev.split_once(':') else { return false };
    let ctl = Path::new("/sys/fs/fuse/connections");
    if !ctl.join(minor).exists() {
        // fusectl may not be mounted yet.
        let _ = std::process::Command::new("mount").args(["-t", "fusectl", "fusectl"]).arg(ctl).status();
    }
    std::fs::write(ctl.join(minor).join("abort"), "1").is_ok()
}

#[derive(Debug, Clone, PartialEq)]
pub struct MountEntry {
    pub mountpoint: PathBuf,
    pub mgs: String,
}

/// Every braid mount of this machine.
pub fn braid_mounts() -> Vec<MountEntry> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines().filter_map(parse_mountinfo_line).collect()
}

fn unescape(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push(((b[i + 1] - b'0') << 6) | ((b[i + 2] - b'0') << 3) | (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let mountpoint = left.split(' ').nth(4)?;
    let mut r = right.split(' ');
    let fstype = r.next()?;
    let source = r.next()?;
    // The subtype is not always recorded (mount(2) without fusermount gives "fuse").
    if fstype != "fuse.braid" && fstype != "fuse" {
        return None;
    }
    let mgs = source.strip_prefix("braid@")?;
    Some(MountEntry { mountpoint: PathBuf::from(unescape(mountpoint)), mgs: mgs.to_string() })
}

/// Turns a path inside a braid mount into a braid path.
pub fn resolve_mounted(path: &str) -> Result<Option<BraidPath>> {
    let Ok(abs) = std::fs::canonicalize(path).or_else(|e| {
        // A path that does not exist yet (setstripe on a new file): canonicalize its parent.
        let p = Path::new(path);
        match (p.parent(), p.file_name()) {
            (Some(parent), Some(name)) => {
                let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
                std::fs::canonicalize(parent).map(|d| d.join(name))
            }
            _ => Err(e),
        }
    }) else {
        return Ok(None);
    };
    let best = braid_mounts()
        .into_iter()
        .filter(|m| abs.starts_with(&m.mountpoint))
        .max_by_key(|m| m.mountpoint.as_os_str().len());
    let Some(m) = best else { return Ok(None) };
    let rel = abs.strip_prefix(&m.mountpoint).expect("prefix checked");
    Ok(Some(BraidPath { mgs: m.mgs, path: format!("/{}", rel.to_string_lossy()) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let l = "36 35 0:44 / /mnt/my\\040fs rw,nosuid,nodev shared:1 - fuse.braid braid@127.0.0.1:9400 rw,user_id=0";
        let m = parse_mountinfo_line(l).unwrap();
        assert_eq!(m.mountpoint, PathBuf::from("/mnt/my fs"));
        assert_eq!(m.mgs, "127.0.0.1:9400");
        assert!(parse_mountinfo_line("22 1 8:1 / / rw - ext4 /dev/vda rw").is_none());
    }

    #[test]
    fn options() {
        let s = parse_options(&["attr_timeout=0.5,ro".into(), "threads=4".into()]).unwrap();
        assert_eq!(s.fuse.attr_ttl, Duration::from_millis(500));
        assert!(s.fuse.read_only);
        assert_eq!(s.fuse.threads, 4);
        assert_eq!(s.readahead_kb, 4096);
        assert_eq!(parse_options(&["readahead_kb=1024".into()]).unwrap().readahead_kb, 1024);
        assert!(parse_options(&["bogus".into()]).is_err());
        assert!(parse_options(&[]).unwrap().dir_leases);
        assert!(!parse_options(&["dir_leases=0".into()]).unwrap().dir_leases);
        assert!(parse_options(&["dir_leases=maybe".into()]).is_err());
        assert!(parse_options(&["threads=x".into()]).is_err());
    }
}
