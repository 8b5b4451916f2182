//! A target's side of its relation with the MGS: its identity on disk, registration,
//! and the heartbeat that keeps it "up". Shared by the MDS (for MDTs) and the OSS (for
//! OSTs).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use proto::msg::{Media, Request, Response, TargetKind, Usage};
use proto::{Errno, RpcError};

use crate::client::RpcClient;

/// A target's directory with its persistent identity.
#[derive(Debug, Clone)]
pub struct TargetDir {
    pub kind: TargetKind,
    pub dir: PathBuf,
    pub uuid: String,
    /// Index given by the MGS, once registered.
    pub index: Option<u32>,
    /// The Raft term of a replicated MDT's leader (see `Request::MgsRegister`); 0
    /// otherwise.
    pub epoch: u64,
}

impl TargetDir {
    /// Opens `dir`, creating it and a new uuid on first use.
    pub fn open(kind: TargetKind, dir: &Path) -> std::io::Result<TargetDir> {
        std::fs::create_dir_all(dir)?;
        let uuid_path = dir.join("target.uuid");
        let uuid = match std::fs::read_to_string(&uuid_path) {
            Ok(s) => s.trim().to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut b = [0u8; 16];
                getrandom::fill(&mut b).map_err(|e| std::io::Error::other(e.to_string()))?;
                let u: String = b.iter().map(|x| format!("{x:02x}")).collect();
                write_durably(&uuid_path, &u)?;
                u
            }
            Err(e) => return Err(e),
        };
        if uuid.is_empty() {
            return Err(std::io::Error::other(format!("{} is empty", uuid_path.display())));
        }
        let index = match std::fs::read_to_string(dir.join("target.index")) {
            Ok(s) => Some(s.trim().parse().map_err(|_| {
                std::io::Error::other(format!("{} does not hold a number", dir.join("target.index").display()))
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        Ok(TargetDir { kind, dir: dir.to_path_buf(), uuid, index, epoch: 0 })
    }

    /// Registers with the MGS (retrying while it is unreachable) and records the index.
    /// A target keeps the name of its file system (`target.fsname`, written at its
    /// first registration): one started for another file system is refused here,
    /// before the MGS is asked.
    pub async fn register(&mut self, mgs: &RpcClient, address: &str, fsname: &str) -> Result<u32, RpcError> {
        let fsname_path = self.dir.join("target.fsname");
        let local = |reason: String| RpcError::Protocol { addr: mgs.addr().to_string(), reason };
        let recorded = match std::fs::read_to_string(&fsname_path) {
            Ok(s) => Some(s.trim().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(local(format!("cannot read {}: {e}", fsname_path.display()))),
        };
        if let Some(theirs) = recorded.as_deref().filter(|r| *r != fsname) {
            return Err(RpcError::Remote(proto::RemoteError::new(
                Errno::Inval,
                format!(
                    "{} belongs to file system '{theirs}', not '{fsname}': start it with --fsname {theirs}, \
                     or give this server an empty directory for '{fsname}'",
                    self.dir.display()
                ),
            )));
        }
        let reply = mgs
            .call(
                &Request::MgsRegister {
                    kind: self.kind,
                    uuid: self.uuid.clone(),
                    index: self.index,
                    address: address.to_string(),
                    fsname: fsname.to_string(),
                    epoch: self.epoch,
                },
                vec![],
            )
            .await?;
        let Response::Registered { index } = reply.response else {
            return Err(RpcError::Protocol {
                addr: mgs.addr().to_string(),
                reason: "unexpected answer to register".into(),
            });
        };
        if self.index != Some(index) {
            write_durably(&self.dir.join("target.index"), &index.to_string()).map_err(|e| RpcError::Protocol {
                addr: mgs.addr().to_string(),
                reason: format!("cannot record index in {}: {e}", self.dir.display()),
            })?;
            self.index = Some(index);
        }
        if recorded.is_none() {
            write_durably(&fsname_path, fsname).map_err(|e| {
                local(format!("cannot record the file system's name in {}: {e}", fsname_path.display()))
            })?;
        }
        Ok(index)
    }
}

fn write_durably(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{text}\n"))?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Usage of the file system holding `dir` (statvfs).
pub fn dir_usage(dir: &Path) -> Usage {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return Usage::default();
    };
    // SAFETY: statvfs writes into the zeroed struct we own; the path is a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Usage::default();
    }
    let f = s.f_frsize;
    Usage {
        total_bytes: s.f_blocks * f,
        free_bytes: s.f_bfree * f,
        avail_bytes: s.f_bavail * f,
        total_inodes: s.f_files,
        free_inodes: s.f_ffree,
    }
}

/// What a heartbeat tells of a target: its usage, and the medium it emulates.
pub type TargetReport = Arc<dyn Fn(&TargetDir) -> (Usage, Option<Media>) + Send + Sync>;

/// Heartbeats every `interval` for each target, with what `report` says of it (its
/// usage, and the medium it emulates); re-registers a target the MGS no
/// longer knows (e.g. after the MGS lost its registry). Runs until the process ends.
pub fn spawn_heartbeat(
    mgs: Arc<RpcClient>,
    mut targets: Vec<TargetDir>,
    address: String,
    fsname: String,
    interval: Duration,
    report: TargetReport,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut away = false;
        loop {
            tick.tick().await;
            for t in targets.iter_mut() {
                let Some(index) = t.index else { continue };
                let (usage, media) = report(t);
                crate::stats::target_usage(t.kind, index, &usage);
                let req = Request::MgsHeartbeat { kind: t.kind, index, uuid: t.uuid.clone(), usage, media };
                // Given up after a few intervals: the next heartbeat tries again.
                let patience = interval.max(Duration::from_secs(1)) * 3;
                let r = match tokio::time::timeout(patience, mgs.call(&req, vec![])).await {
                    Ok(r) => r,
                    Err(_) => {
                        Err(RpcError::Timeout { addr: mgs.addr().to_string(), timeout_ms: patience.as_millis() as u64 })
                    }
                };
                match (&r, away) {
                    (Err(RpcError::Remote(_)), _) | (Ok(_), false) => {}
                    (Ok(_), true) => tracing::info!("the MGS at {} answers again", mgs.addr()),
                    (Err(e), false) => tracing::warn!(
                        "the MGS at {} does not answer ({e}): serving on as configured; the MGS shows \
                         this server down until it is back",
                        mgs.addr()
                    ),
                    (Err(_), true) => {}
                }
                away = r.as_ref().is_err_and(|e| !matches!(e, RpcError::Remote(_)));
                match r {
                    Ok(_) => {}
                    Err(RpcError::Remote(e)) if e.code == Errno::Stale => {
                        tracing::warn!("MGS forgot {}{index:04x}; registering again", t.kind.name());
                        if let Err(e) = t.register(&mgs, &address, &fsname).await {
                            tracing::warn!("re-registration failed: {e}");
                        }
                    }
                    Err(_) => {}
                }
            }
        }
    });
}
