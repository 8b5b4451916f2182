//! TLS files for tests: a cluster CA and node certificates signed by it (good, expired,
//! or signed by another CA), in the directory shape `rpc::tls` reads (`ca.pem`,
//! `cert.pem`, `key.pem`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, Certificate, CertificateParams, IsCa, KeyPair, SanType};

/// A certificate authority.
pub struct Ca {
    cert: Certificate,
    key: KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("self-signed CA");
        Ca { cert, key }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A node certificate for `names` (IP addresses and DNS names), valid now, or
    /// expired since 2020 with `expired`.
    pub fn node(&self, names: &[&str], expired: bool) -> (String, String) {
        let key = KeyPair::generate().expect("node key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("node params");
        params.distinguished_name.push(rcgen::DnType::CommonName, names.first().copied().unwrap_or("braid"));
        for n in names {
            params.subject_alt_names.push(match n.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*n).try_into().expect("a DNS name")),
            });
        }
        if expired {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        }
        let cert = params.signed_by(&key, &self.cert, &self.key).expect("signed node certificate");
        (cert.pem(), key.serialize_pem())
    }
}

/// Writes a TLS directory at `dir`: `trust` as its CA, and `node`'s certificate and key.
pub fn write_dir(dir: &Path, trust: &Ca, node: (String, String)) -> PathBuf {
    std::fs::create_dir_all(dir).expect("create TLS dir");
    std::fs::write(dir.join("ca.pem"), trust.pem()).expect("write ca.pem");
    std::fs::write(dir.join("cert.pem"), node.0).expect("write cert.pem");
    std::fs::write(dir.join("key.pem"), node.1).expect("write key.pem");
    dir.to_path_buf()
}

/// Every loopback address tests use, as certificate names.
pub fn loopback_names() -> Vec<String> {
    let mut names: Vec<String> = (1..=40).map(|i| format!("127.0.0.{i}")).collect();
    names.push("localhost".into());
    names
}
