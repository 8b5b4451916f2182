//! The cluster-wide operations of [`Client`]: every target's usage, asked of the
//! target itself, the file system's statfs summed from it, and changes to OST pools.

use proto::msg::{PoolOp, Request, Response};

use crate::*;

impl Client {
    /// Changes an OST pool on the MGS (`braid pool`), and takes the configuration
    /// that results.
    pub async fn pool_change(&self, pool: &str, op: PoolOp, osts: Vec<u32>) -> Result<ClusterConfig> {
        self.observe("pool_change", None, 0, 0, async {
            let fsname = self.config().fsname;
            let req = Request::MgsPool { fsname, pool: pool.to_string(), op, osts };
            match self.inner.mgs.call(&req, vec![]).await?.response {
                Response::Ok => {}
                r => return Err(unexpected("pool change", &r)),
            }
            // Every MDS places by the new pools once this returns (as Lustre's
            // `lctl pool_*` waits for the change to reach the servers); one that does
            // not answer soon learns it at its next look at the configuration.
            let config = self.load_config().await?;
            let mut addresses: Vec<&str> = config.mdts.iter().filter(|t| t.up).map(|t| t.address.as_str()).collect();
            addresses.sort_unstable();
            addresses.dedup();
            for a in addresses {
                let server = self.server(a);
                match tokio::time::timeout(USAGE_WAIT, server.call(&Request::MdsRefreshConfig, vec![])).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!("the MDS at {a} did not take the pool change yet: {e}"),
                    Err(_) => {
                        tracing::warn!("the MDS at {a} did not answer; it takes the pool change within its refresh")
                    }
                }
            }
            Ok(config)
        })
        .await
    }

    /// The opens MDT `mdt` logged after number `after` (see
    /// [`Request::MdsOpenLog`]): the oldest number it holds, the next one, and the
    /// opens.
    pub async fn open_log(&self, mdt: u32, after: u64) -> Result<(u64, u64, Vec<proto::msg::LoggedOpen>)> {
        self.observe("open_log", None, 0, 0, async {
            let config = self.config();
            let Some(t) = config.mdts.iter().find(|t| t.index == mdt) else {
                return Err(ClientError::Errno(Errno::NoEnt, format!("no MDT {mdt} in the configuration")));
            };
            match self.server(&t.address).call(&Request::MdsOpenLog { mdt, after }, vec![]).await?.response {
                Response::OpenLog { first, next, opens } => Ok((first, next, opens)),
                r => Err(unexpected("open log", &r)),
            }
        })
        .await
    }

    /// Usage of every target, asked of the target itself; `Err` for one that does not
    /// answer.
    pub async fn target_usage(&self) -> Result<Vec<(TargetInfo, std::result::Result<Usage, String>)>> {
        self.observe("target_usage", None, 0, 0, async {
            // Without its MGS, a client shows the targets it knows of (`df` on a mount
            // goes on working, as Lustre's does).
            let config = self.config_or_last(USAGE_WAIT).await;
            let mut out = Vec::new();
            for t in config.mdts.iter().chain(config.osts.iter()) {
                let req = match t.kind {
                    TargetKind::Mdt => Request::MdsStatfs { mdt: t.index },
                    TargetKind::Ost => Request::OstStatfs { ost: t.index },
                };
                let u = if !t.up {
                    Err("inactive device".to_string())
                } else {
                    // The connection every other request uses (a connection per call
                    // cost a handshake each, and `df` in a loop piled them up); a target
                    // that does not answer soon is shown as such, not waited for.
                    let server = self.server(&t.address);
                    match tokio::time::timeout(USAGE_WAIT, server.call(&req, vec![])).await {
                        Ok(Ok(r)) => match r.response {
                            Response::Usage(u) => Ok(u),
                            other => Err(format!("unexpected answer {other:?}")),
                        },
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err(format!("no answer within {} s", USAGE_WAIT.as_secs())),
                    }
                };
                out.push((t.clone(), u));
            }
            Ok(out)
        })
        .await
    }

    /// File system totals (statfs): space from the OSTs, inodes from the MDTs. Targets
    /// that do not answer are left out, as Lustre's client leaves out inactive OSTs;
    /// when no OST (or no MDT) answers, the totals would be made up, so it is an error.
    pub async fn statfs(&self) -> Result<Usage> {
        self.observe("statfs", None, 0, 0, async {
            let mut total = Usage::default();
            let usage = self.target_usage().await?;
            for kind in [TargetKind::Mdt, TargetKind::Ost] {
                let of_kind: Vec<_> = usage.iter().filter(|(t, _)| t.kind == kind).collect();
                if !of_kind.is_empty() && of_kind.iter().all(|(_, u)| u.is_err()) {
                    let why = of_kind.iter().filter_map(|(t, u)| {
                        u.as_ref().err().map(|e| format!("{}{:04x}: {e}", t.kind.name(), t.index))
                    });
                    return Err(ClientError::Errno(
                        Errno::Io,
                        format!("statfs: no {} answered ({})", kind.name(), why.collect::<Vec<_>>().join("; ")),
                    ));
                }
            }
            for (t, u) in usage {
                let Ok(u) = u else { continue };
                match t.kind {
                    TargetKind::Ost => {
                        total.total_bytes += u.total_bytes;
                        total.free_bytes += u.free_bytes;
                        total.avail_bytes += u.avail_bytes;
                    }
                    TargetKind::Mdt => {
                        total.total_inodes += u.total_inodes;
                        total.free_inodes += u.free_inodes;
                    }
                }
            }
            Ok(total)
        })
        .await
    }
}
