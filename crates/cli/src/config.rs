//! `braid.toml`: one file per node with a section per role. Every option also has a
//! command-line flag, which wins. `dist/braid.toml` documents every key (a test in
//! `crates/braid/tests/admin.rs` holds it to the fields below).
//!
//! ```toml
//! fsname = "braid"
//! secret_file = "/etc/braid/cluster.secret"
//! heartbeat_ms = 1000
//! tls_dir = "/etc/braid/tls"   # optional: ca.pem, cert.pem, key.pem (see `braid --help` of a role)
//! tls_required = true          # optional: refuse clients that do not speak TLS
//!
//! [mgs]
//! listen = "10.0.0.1:9400"
//! metrics = "127.0.0.1:9500"      # optional, in every server section: Prometheus metrics
//! data = "/srv/braid/mgs"
//! root_squash = "65534:65534"              # optional: root on clients acts as this user
//! nosquash_nids = "10.0.0.5, 10.0.1.0/24"  # clients whose root stays root
//!
//! [mds]
//! listen = "10.0.0.2:9401"
//! mgs = "10.0.0.1:9400"
//! mdts = ["/srv/braid/mdt0"]
//! default_layout = "seed-table4"   # optional: the file system's default layout
//!
//! [oss]
//! listen = "10.0.0.3:9402"
//! mgs = "10.0.0.1:9400"
//! osts = ["/srv/braid/ost0", "/srv/braid/ost1:class=hdd,bw=150M,lat=4ms"]   # as --ost
//! short_circuit_uids = [1000]    # optional: users besides root and the OSS's own
//!
//! [nbd]                                # braid nbd serve
//! url = "braid://10.0.0.1:9400/"
//! listen = "127.0.0.1:10809"           # without TLS no authentication: loopback or trusted hosts only
//! exports = ["disk=/vm/disk.img,size=20G", "iso=/images/a.iso,ro"]   # as --export
//! max_connections = 16
//! max_inflight_bytes = "256M"
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::serve::Common;
use crate::ServerOpts;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub fsname: Option<String>,
    pub secret_file: Option<PathBuf>,
    #[serde(default)]
    pub insecure: bool,
    pub heartbeat_ms: Option<u64>,
    /// Directory of this node's TLS files (as `--tls-dir`).
    pub tls_dir: Option<PathBuf>,
    /// Servers refuse clients that do not speak TLS (as `--tls-required`).
    #[serde(default)]
    pub tls_required: bool,
    #[serde(default)]
    pub mgs: MgsSection,
    #[serde(default)]
    pub mds: MdsSection,
    #[serde(default)]
    pub oss: OssSection,
    #[serde(default)]
    pub nbd: NbdSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MgsSection {
    pub listen: Option<String>,
    pub data: Option<PathBuf>,
    pub target_timeout_ms: Option<u64>,
    /// `UID:GID` root on clients acts as (see `braid mgs --root-squash`).
    pub root_squash: Option<String>,
    /// Clients whose root stays root: addresses and CIDR ranges.
    pub nosquash_nids: Option<String>,
    /// As `--metrics`: serve Prometheus metrics at this HOST:PORT.
    pub metrics: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MdsSection {
    pub listen: Option<String>,
    pub advertise: Option<String>,
    pub mgs: Option<String>,
    #[serde(default)]
    pub mdts: Vec<PathBuf>,
    pub default_stripe_count: Option<i64>,
    pub default_stripe_size: Option<String>,
    /// A built-in layout template by name (e.g. "seed-table4").
    pub default_layout: Option<String>,
    /// Largest Data-on-MDT component (e.g. "1M"; "0" turns DoM off).
    pub dom_max: Option<String>,
    pub checkpoint_ms: Option<u64>,
    pub sync_journal: Option<bool>,
    /// Stripe the root over this many MDTs while it is empty.
    pub root_stripes: Option<u32>,
    /// As `--failover`, `--standby` and `--mmp-interval-ms`.
    pub failover: Option<bool>,
    pub standby: Option<bool>,
    pub mmp_interval_ms: Option<u64>,
    /// As `--replicas`, `--raft-heartbeat-ms`, `--raft-election-ms` and
    /// `--raft-snapshot-entries`.
    #[serde(default)]
    pub replicas: Vec<String>,
    pub raft_heartbeat_ms: Option<u64>,
    pub raft_election_ms: Option<u64>,
    pub raft_snapshot_entries: Option<u64>,
    /// As `--metrics`: serve Prometheus metrics at this HOST:PORT.
    pub metrics: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OssSection {
    pub listen: Option<String>,
    pub advertise: Option<String>,
    pub mgs: Option<String>,
    /// As `--ost`: `DIR` or `DIR:class=hdd,bw=150M,lat=4ms`.
    #[serde(default)]
    pub osts: Vec<String>,
    /// Users besides root and the OSS's own allowed short-circuit I/O.
    #[serde(default)]
    pub short_circuit_uids: Vec<u32>,
    /// Short-circuit I/O on a cluster without a secret.
    #[serde(default)]
    pub short_circuit_insecure: bool,
    /// As `--metrics`: serve Prometheus metrics at this HOST:PORT.
    pub metrics: Option<String>,
}

/// `braid nbd serve`: each key as the flag of the same name (`exports` as `--export`,
/// checked by the same code).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NbdSection {
    /// The file system, `braid://MGS/`.
    pub url: Option<String>,
    pub listen: Option<String>,
    /// `NAME=PATH[,ro][,size=SIZE]` each; the first is the default export.
    #[serde(default)]
    pub exports: Vec<String>,
    pub sync: Option<bool>,
    pub page_cache: Option<String>,
    pub poll_us: Option<u64>,
    pub short_circuit: Option<bool>,
    pub max_connections: Option<usize>,
    pub max_inflight_bytes: Option<String>,
    /// As `--tls-dir`: offer TLS with the x509 files there.
    pub tls_dir: Option<PathBuf>,
    /// As `--tls-required`.
    pub tls_required: Option<bool>,
}

/// Reads the configuration file, if one is given.
pub fn load(path: Option<&Path>) -> Result<FileConfig> {
    let Some(path) = path else {
        return Ok(FileConfig::default());
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid configuration in {}", path.display()))
}

/// Settings shared by the roles, flags over file.
pub fn common(opts: &ServerOpts, file: &FileConfig) -> Result<Common> {
    let secret =
        crate::server_secret(opts.secret_file.clone().or(file.secret_file.clone()), opts.insecure || file.insecure)?;
    let heartbeat_ms = opts.heartbeat_ms.or(file.heartbeat_ms).unwrap_or(1000);
    if heartbeat_ms == 0 {
        anyhow::bail!("heartbeat interval must be positive");
    }
    let required = opts.tls_required || file.tls_required;
    let tls = crate::server_tls(opts.tls_dir.as_deref().or(file.tls_dir.as_deref()), required)?;
    Ok(Common {
        fsname: opts.fsname.clone().or(file.fsname.clone()).unwrap_or_else(|| "braid".into()),
        secret,
        heartbeat: Duration::from_millis(heartbeat_ms),
        in_process: false,
        tls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example at the top of this file, as a file would hold it.
    fn example() -> String {
        let doc = include_str!("config.rs");
        let start = doc.find("//! ```toml\n").expect("example") + "//! ```toml\n".len();
        let end = start + doc[start..].find("//! ```\n").expect("end of example");
        doc[start..end].lines().map(|l| l.trim_start_matches("//!").trim_start()).collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn the_documented_example_parses_and_its_root_squash_is_valid() {
        let file: FileConfig = toml::from_str(&example()).expect("the example parses");
        assert_eq!(file.mds.mdts.len(), 1);
        let rule = crate::serve::SquashOpts::default().rule(&file.mgs).unwrap().expect("a rule");
        assert_eq!(rule.to_string(), "65534:65534 (nosquash 10.0.0.5,10.0.1.0/24)");
        let flags = crate::serve::SquashOpts { root_squash: Some("0:0".into()), nosquash_nids: None };
        assert_eq!(flags.rule(&file.mgs).unwrap(), None, "flags win, and 0:0 turns squash off");
        let only_list = MgsSection { nosquash_nids: Some("10.0.0.1".into()), ..Default::default() };
        assert!(crate::serve::SquashOpts::default().rule(&only_list).is_err());
    }
}
