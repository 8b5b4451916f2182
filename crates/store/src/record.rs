//! Versioned records: every value an owner keeps on disk starts with one version
//! byte, checked on every read.
//!
//! A release that adds a field to a record (DoM data in an inode, flags in a mirror,
//! an MDT index in a directory entry) bumps that record's version and teaches
//! [`Record::upgrade`] the older bodies, with a test; a record of a version newer than
//! the release knows is refused with [`StoreError::FutureVersion`] instead of being
//! misread (postcard has no field names: a body read with the wrong struct decodes
//! into nonsense, or fails far from the cause).
//!
//! Layout: `[version: u8][body]`; version 0 is never written (the first braid
//! format had no version byte: its databases are upgraded as a whole when opened,
//! see the owners' `format` functions).

use serde::{de::DeserializeOwned, Serialize};

use crate::StoreError;

/// A kind of record kept on disk, encoded with postcard after its version byte.
pub trait Record: Serialize + DeserializeOwned {
    /// What the record is, for errors ("inode", "target").
    const WHAT: &'static str;
    /// The version this release writes.
    const VERSION: u8;

    /// Decodes a body written at an older `version` (below [`Record::VERSION`]).
    /// None exist yet: every record is at its first version.
    fn upgrade(version: u8, _body: &[u8]) -> Result<Self, StoreError> {
        Err(StoreError::Corrupt { what: Self::WHAT, detail: format!("no upgrade from version {version}") })
    }
}

/// Encodes `r` as a record of its current version.
pub fn encode_record<R: Record>(r: &R) -> Vec<u8> {
    postcard::to_extend(r, vec![R::VERSION]).expect("postcard encoding of an in-memory record cannot fail")
}

/// Decodes a record, upgrading an older version and refusing a newer one.
pub fn decode_record<R: Record>(bytes: &[u8]) -> Result<R, StoreError> {
    let (version, body) = open_record(R::WHAT, R::VERSION, bytes)?;
    if version == R::VERSION {
        crate::decode_exact(body, R::WHAT)
    } else {
        R::upgrade(version, body)
    }
}

/// Puts a version byte in front of a body the owner encodes itself.
pub fn seal(version: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(1 + body.len());
    v.push(version);
    v.extend_from_slice(body);
    v
}

/// Splits a record into its version and body; a version above `known` (what this
/// release writes) is refused.
pub fn open_record<'a>(what: &'static str, known: u8, bytes: &'a [u8]) -> Result<(u8, &'a [u8]), StoreError> {
    match bytes.split_first() {
        None => Err(StoreError::Corrupt { what, detail: "empty record".into() }),
        Some((0, _)) => Err(StoreError::Corrupt { what, detail: "version 0 is never written".into() }),
        Some((&v, _)) if v > known => Err(StoreError::FutureVersion { what, found: v, known }),
        Some((&v, body)) => Ok((v, body)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Thing {
        a: u32,
        b: String,
    }
    impl Record for Thing {
        const WHAT: &'static str = "thing";
        const VERSION: u8 = 2;
        fn upgrade(version: u8, body: &[u8]) -> Result<Thing, StoreError> {
            match version {
                1 => Ok(Thing { a: crate::decode_exact(body, "thing")?, b: String::new() }),
                _ => Err(StoreError::Corrupt { what: "thing", detail: format!("version {version}") }),
            }
        }
    }

    #[test]
    fn current_older_and_future_versions() {
        let t = Thing { a: 7, b: "x".into() };
        let bytes = encode_record(&t);
        assert_eq!(bytes[0], 2);
        assert_eq!(decode_record::<Thing>(&bytes).unwrap(), t);
        let old = seal(1, &crate::encode(&9u32));
        assert_eq!(decode_record::<Thing>(&old).unwrap(), Thing { a: 9, b: String::new() });
        let future = seal(3, &bytes[1..]);
        let err = decode_record::<Thing>(&future).unwrap_err();
        assert!(matches!(err, StoreError::FutureVersion { what: "thing", found: 3, known: 2 }), "{err}");
        assert!(err.to_string().contains("newer than this braid reads"), "{err}");
        assert!(decode_record::<Thing>(&[]).is_err());
        assert!(decode_record::<Thing>(&seal(0, &bytes[1..])).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_record::<Thing>(&longer).is_err(), "trailing bytes are corruption");
    }
}
