//! Root squash, Lustre's `root_squash` and `nosquash_nids`: root on a client that is
//! not in the exempt list acts on the file system as an unprivileged user, so a
//! machine whose root the site does not trust cannot read or change other users'
//! files through its mount.
//!
//! The rule travels in the configuration the MGS hands out ([`crate::msg::ClusterConfig`]),
//! so every MDS enforces the same rule and every client applies it to what it answers
//! itself (an unlink or a create under a directory lease) before the MDS sees it.
//! An MDS judges a request by the address it came from; a client by the address it
//! reaches the MGS from.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// Who root is squashed to, and the clients exempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootSquash {
    pub uid: u32,
    pub gid: u32,
    /// Clients whose root stays root (Lustre's `nosquash_nids`).
    pub nosquash: Vec<AddrRange>,
}

/// An address or a CIDR range of addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddrRange {
    pub addr: IpAddr,
    /// Leading bits that must match.
    pub prefix: u8,
}

impl AddrRange {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                masked(u32::from(a).into(), 32, self.prefix) == masked(u32::from(b).into(), 32, self.prefix)
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                masked(u128::from(a), 128, self.prefix) == masked(u128::from(b), 128, self.prefix)
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for AddrRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let full = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix == full {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

/// An IPv4 address mapped into IPv6 (a dual-stack listener's peers) as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

fn masked(bits: u128, width: u32, prefix: u8) -> u128 {
    let keep = u32::from(prefix).min(width);
    if keep == 0 {
        return 0;
    }
    bits >> (width - keep)
}

impl RootSquash {
    /// Parses `UID:GID` (`root_squash`) and a list of addresses and CIDR ranges
    /// separated by commas or spaces (`nosquash_nids`). `0:0` squashes nobody, as in
    /// Lustre: it gives `None`.
    pub fn parse(squash: &str, nosquash: &str) -> Result<Option<RootSquash>, String> {
        let (uid, gid) = squash
            .split_once(':')
            .and_then(|(u, g)| Some((u.trim().parse::<u32>().ok()?, g.trim().parse::<u32>().ok()?)))
            .ok_or_else(|| format!("root squash {squash:?}: want UID:GID, e.g. 65534:65534"))?;
        let nosquash = nosquash
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(parse_range)
            .collect::<Result<Vec<_>, _>>()?;
        if uid == 0 && gid == 0 {
            return Ok(None);
        }
        Ok(Some(RootSquash { uid, gid, nosquash }))
    }

    /// Whether root on a client at `ip` stays root.
    pub fn exempt(&self, ip: IpAddr) -> bool {
        self.nosquash.iter().any(|r| r.contains(ip))
    }

    /// Whether a request of `uid` from `ip` is squashed: root's, unless exempt (see
    /// `Creds::squash`).
    pub fn squashes(&self, uid: u32, ip: IpAddr) -> bool {
        uid == 0 && !self.exempt(ip)
    }
}

impl std::fmt::Display for RootSquash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.uid, self.gid)?;
        if !self.nosquash.is_empty() {
            let list: Vec<String> = self.nosquash.iter().map(|r| r.to_string()).collect();
            write!(f, " (nosquash {})", list.join(","))?;
        }
        Ok(())
    }
}

fn parse_range(s: &str) -> Result<AddrRange, String> {
    let bad = |why: &str| format!("nosquash address {s:?}: {why} (want an IP address or ADDR/PREFIX)");
    let (addr, prefix) = match s.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    };
    let addr: IpAddr = addr.parse().map_err(|_| bad("not an IP address"))?;
    let full = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => full,
        Some(p) => p.parse::<u8>().ok().filter(|p| *p <= full).ok_or_else(|| bad("bad prefix length"))?,
    };
    Ok(AddrRange { addr, prefix })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn root_from_a_client_not_exempt_is_squashed() {
        let rule = RootSquash::parse("65534:65533", "10.0.0.0/24, 127.0.0.7").unwrap().unwrap();
        assert!(rule.squashes(0, ip("10.0.1.5")));
        for exempt in ["10.0.0.1", "10.0.0.255", "127.0.0.7", "::ffff:10.0.0.9"] {
            assert!(!rule.squashes(0, ip(exempt)), "{exempt}");
        }
        assert!(!rule.squashes(1000, ip("10.0.1.5")), "only root is squashed");
        assert!(!rule.exempt(ip("127.0.0.8")));
        assert_eq!(rule.to_string(), "65534:65533 (nosquash 10.0.0.0/24,127.0.0.7)");
    }

    #[test]
    fn parsing_refuses_what_it_cannot_read() {
        assert_eq!(RootSquash::parse("0:0", "").unwrap(), None, "0:0 squashes nobody");
        assert!(RootSquash::parse("0:0", "nonsense").is_err(), "a bad list is refused all the same");
        for bad in ["65534", "a:b", "65534:", "-1:0", ""] {
            assert!(RootSquash::parse(bad, "").unwrap_err().contains("UID:GID"), "{bad}");
        }
        for bad in ["10.0.0.0/33", "host.example", "10.0.0.1/x", "::1/129"] {
            assert!(RootSquash::parse("1:1", bad).unwrap_err().contains("nosquash address"), "{bad}");
        }
        let all = RootSquash::parse("1:1", "0.0.0.0/0 ::/0").unwrap().unwrap();
        assert!(all.exempt(ip("192.168.1.1")) && all.exempt(ip("fe80::1")));
    }
}
