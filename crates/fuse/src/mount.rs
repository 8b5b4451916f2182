//! Putting the file system on a mount point and taking it off again: the fuser
//! session and its kernel mount options, the mount's read-ahead, and an unmount that
//! always finishes (it aborts the FUSE connection when the kernel waits on requests
//! the mount cannot answer).
//!
//! This is the one place that knows how a FUSE mount is made; `braid mount` and
//! `braid local --mount` both come through [`mount`]. A mount's source is
//! `braid@MGS_ADDRESS` (from [`MountOptions::fsname`]) and its type `fuse.braid`, so
//! [`mountinfo`] tells which cluster a path belongs to.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use client::Client;

use crate::{BraidFs, MountOptions};

/// A file system on its mount point, not yet serving: [`Mounted::run`] answers the
/// kernel until the mount is taken off.
pub struct Mounted {
    session: fuser::Session<BraidFs>,
}

/// Takes a [`Mounted`] file system off its mount point from another thread; its
/// [`Mounted::run`] then returns.
pub struct Unmounter(fuser::SessionUnmounter);

impl Unmounter {
    pub fn unmount(&mut self) -> io::Result<()> {
        self.0.unmount()
    }
}

impl Mounted {
    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter(self.session.unmount_callable())
    }

    /// Serves the kernel's requests on this thread (and the session's own threads)
    /// until the file system is unmounted.
    pub fn run(self) -> io::Result<()> {
        self.session.run()
    }
}

/// Mounts `client`'s file system at `mountpoint` with `opts`, `rt` running the
/// client's requests, and sets the mount's read-ahead. It serves once
/// [`Mounted::run`] is called.
pub fn mount(client: Client, rt: tokio::runtime::Handle, mountpoint: &Path, opts: MountOptions) -> io::Result<Mounted> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(opts.fsname.clone()),
        fuser::MountOption::Subtype("braid".into()),
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
        // See the crate comment: cached dentries bypass the MDS's search-bit check.
        fuser::MountOption::DefaultPermissions,
    ];
    if opts.read_only {
        config.mount_options.push(fuser::MountOption::RO);
    }
    if opts.no_exec {
        config.mount_options.push(fuser::MountOption::NoExec);
    }
    if opts.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    let readahead_kb = opts.readahead_kb;
    let fs = BraidFs::new(client, rt, opts);
    let notifier = fs.notifier.clone();
    let session = fuser::Session::new(fs, mountpoint, &config)?;
    let _ = notifier.set(session.notifier());
    tune_readahead(mountpoint, readahead_kb);
    Ok(Mounted { session })
}

/// Sets the kernel read-ahead of the mount at `mountpoint`. FUSE keeps its bdi at the
/// kernel default (128 KiB) whatever read-ahead the file system asks for, so sequential
/// reads arrive as 128 KiB requests; measured here, 4 MiB makes a single reader ~6x
/// faster. Best effort: a failure is logged and the mount works as before.
pub fn tune_readahead(mountpoint: &Path, kb: u32) {
    let target = std::fs::canonicalize(mountpoint).unwrap_or(mountpoint.to_path_buf());
    let Some(dev) = mountinfo::device_of(&target) else {
        tracing::warn!("cannot find {} in mountinfo to set its read-ahead", target.display());
        return;
    };
    let knob = Path::new("/sys/class/bdi").join(&dev).join("read_ahead_kb");
    if let Err(e) = std::fs::write(&knob, kb.to_string()) {
        tracing::warn!("cannot set {} to {kb}: {e}", knob.display());
    }
}

/// How an [`unmount`] went.
#[derive(Debug)]
pub struct Unmounted {
    /// The kernel still waited on requests after the grace time, so the FUSE
    /// connection was aborted (those requests fail with an error).
    pub aborted: bool,
    pub result: io::Result<()>,
}

/// Unmounts the mount at `mountpoint`. If the kernel waits on requests the mount
/// cannot answer (a server is down), the FUSE connection is aborted after `grace`
/// so the unmount always finishes; `fusermount3 -u` is the last resort when
/// `umount2` itself fails (an unprivileged user).
pub fn unmount(mountpoint: &Path, grace: Duration) -> Unmounted {
    let target = std::fs::canonicalize(mountpoint).unwrap_or(mountpoint.to_path_buf());
    let Ok(c) = std::ffi::CString::new(target.as_os_str().as_encoded_bytes()) else {
        let result = Err(io::Error::new(io::ErrorKind::InvalidInput, "bad mount point"));
        return Unmounted { aborted: false, result };
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // SAFETY: umount2 with a valid C string.
        let rc = unsafe { libc::umount2(c.as_ptr(), 0) };
        let _ = tx.send(if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) });
    });
    let mut aborted = false;
    let result = match rx.recv_timeout(grace) {
        Ok(r) => r,
        Err(_) => {
            aborted = abort_connection(&target);
            rx.recv_timeout(grace).unwrap_or_else(|_| Err(io::Error::other("unmount still blocked")))
        }
    };
    let result = result.or_else(|e| {
        let status = std::process::Command::new("fusermount3").arg("-u").arg(&target).status();
        match status {
            Ok(s) if s.success() => Ok(()),
            _ => Err(e),
        }
    });
    Unmounted { aborted, result }
}

/// Aborts the FUSE connection of the mount at `target` (through fusectl); true if
/// it was found and aborted.
fn abort_connection(target: &Path) -> bool {
    let Some(dev) = mountinfo::device_of(target) else { return false };
    let Some((_, minor)) = dev.split_once(':') else { return false };
    let ctl = Path::new("/sys/fs/fuse/connections");
    if !ctl.join(minor).exists() {
        // fusectl may not be mounted yet.
        let _ = std::process::Command::new("mount").args(["-t", "fusectl", "fusectl"]).arg(ctl).status();
    }
    std::fs::write(ctl.join(minor).join("abort"), "1").is_ok()
}

/// `/proc/self/mountinfo`: which mounts this machine has.
pub mod mountinfo {
    use super::*;

    /// One line of mountinfo.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Entry {
        /// `MAJOR:MINOR` of the mounted device (for FUSE, the connection).
        pub device: String,
        pub mountpoint: PathBuf,
        pub fstype: String,
        pub source: String,
    }

    /// Every mount of this machine, as this process sees them.
    pub fn entries() -> Vec<Entry> {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        text.lines().filter_map(parse_line).collect()
    }

    /// The device of the mount at `target` (canonical), if it is a mount point.
    pub fn device_of(target: &Path) -> Option<String> {
        entries().into_iter().find(|e| e.mountpoint == target).map(|e| e.device)
    }

    /// Parses one line: `ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTS... - FSTYPE SOURCE SUPER_OPTS`.
    pub fn parse_line(line: &str) -> Option<Entry> {
        let (left, right) = line.split_once(" - ")?;
        let mut l = left.split(' ');
        let device = l.nth(2)?;
        let mountpoint = l.nth(1)?;
        let mut r = right.split(' ');
        let fstype = r.next()?;
        let source = r.next()?;
        Some(Entry {
            device: device.to_string(),
            mountpoint: PathBuf::from(unescape(mountpoint)),
            fstype: fstype.to_string(),
            source: unescape(source),
        })
    }

    /// mountinfo escapes space, tab, newline and backslash as `\ooo`.
    fn unescape(s: &str) -> String {
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

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn lines() {
            let l = "36 35 0:44 / /mnt/my\\040fs rw,nosuid shared:1 - fuse.braid braid@127.0.0.1:9400 rw,user_id=0";
            let e = parse_line(l).unwrap();
            assert_eq!(e.device, "0:44");
            assert_eq!(e.mountpoint, PathBuf::from("/mnt/my fs"));
            assert_eq!(e.fstype, "fuse.braid");
            assert_eq!(e.source, "braid@127.0.0.1:9400");
            assert!(parse_line("no separator").is_none());
        }
    }
}
