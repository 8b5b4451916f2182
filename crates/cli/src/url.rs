//! `braid://HOST:PORT/path` addresses of files in a cluster.

use anyhow::{bail, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BraidPath {
    /// MGS address.
    pub mgs: String,
    /// Absolute path inside the file system.
    pub path: String,
}

impl BraidPath {
    pub fn parse(s: &str) -> Result<Option<BraidPath>> {
        let Some(rest) = s.strip_prefix("braid://") else {
            return Ok(None);
        };
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if host.is_empty() || !host.contains(':') {
            bail!("{s}: expected braid://HOST:PORT/path");
        }
        Ok(Some(BraidPath { mgs: host.to_string(), path: path.to_string() }))
    }

    pub fn url(&self) -> String {
        format!("braid://{}{}", self.mgs, self.path)
    }

    /// The path with `name` appended.
    pub fn join(&self, name: &str) -> BraidPath {
        let mut p = self.path.trim_end_matches('/').to_string();
        p.push('/');
        p.push_str(name);
        BraidPath { mgs: self.mgs.clone(), path: p }
    }
}

/// Parses a path that must be a braid path.
pub fn require(s: &str) -> Result<BraidPath> {
    match BraidPath::parse(s)? {
        Some(p) => Ok(p),
        None => bail!("{s}: not a braid path (expected braid://HOST:PORT/path)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        let p = BraidPath::parse("braid://127.0.0.1:9400/a/b").unwrap().unwrap();
        assert_eq!(p.mgs, "127.0.0.1:9400");
        assert_eq!(p.path, "/a/b");
        assert_eq!(BraidPath::parse("braid://h:1").unwrap().unwrap().path, "/");
        assert!(BraidPath::parse("/local").unwrap().is_none());
        assert!(BraidPath::parse("braid:///x").is_err());
        assert_eq!(p.join("c").path, "/a/b/c");
    }
}
