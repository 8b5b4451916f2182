//! File identifiers (FIDs) and OST object names.
//!
//! A FID is `(sequence, object id, version)` as in Lustre. The upper 32 bits of the
//! sequence name the MDT that allocated it, so any node can route a FID to its MDT
//! without asking anyone; the lower 32 bits count sequences within that MDT. Inode
//! numbers shown to users are a hash-free packing of the FID, unique by construction.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Fid {
    pub seq: u64,
    pub oid: u32,
    pub ver: u32,
}

/// The first sequence number an MDT allocates from (Lustre's `FID_SEQ_NORMAL` spirit:
/// small sequence numbers stay reserved).
pub const FIRST_SEQ: u32 = 1;

impl Fid {
    pub const fn new(mdt: u32, seq_in_mdt: u32, oid: u32) -> Fid {
        Fid { seq: ((mdt as u64) << 32) | seq_in_mdt as u64, oid, ver: 0 }
    }

    /// The root directory of the file system, on MDT 0.
    pub const ROOT: Fid = Fid::new(0, FIRST_SEQ, 1);

    pub fn mdt(&self) -> u32 {
        (self.seq >> 32) as u32
    }

    /// Inode number: 16 bits of MDT, 16 bits of sequence, 32 bits of object id.
    /// Unique while an MDT allocates fewer than 65,536 sequences of 2^32 objects each.
    pub fn ino(&self) -> u64 {
        ((self.mdt() as u64 & 0xffff) << 48) | ((self.seq & 0xffff) << 32) | self.oid as u64
    }

    /// Inverse of [`Fid::ino`] (version 0).
    pub fn from_ino(ino: u64) -> Fid {
        let mdt = (ino >> 48) as u32;
        Fid::new(mdt, ((ino >> 32) & 0xffff) as u32, ino as u32)
    }

    /// Fixed-width big-endian key: FIDs sort by MDT, then sequence, then object id.
    pub fn to_key(&self) -> [u8; 16] {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&self.seq.to_be_bytes());
        k[8..12].copy_from_slice(&self.oid.to_be_bytes());
        k[12..].copy_from_slice(&self.ver.to_be_bytes());
        k
    }

    pub fn from_key(k: &[u8]) -> Option<Fid> {
        if k.len() < 16 {
            return None;
        }
        Some(Fid {
            seq: u64::from_be_bytes(k[..8].try_into().ok()?),
            oid: u32::from_be_bytes(k[8..12].try_into().ok()?),
            ver: u32::from_be_bytes(k[12..16].try_into().ok()?),
        })
    }
}

impl fmt::Display for Fid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#x}:{:#x}:{:#x}]", self.seq, self.oid, self.ver)
    }
}

impl From<layout::ObjectsFid> for Fid {
    fn from(f: layout::ObjectsFid) -> Fid {
        Fid { seq: f.seq, oid: f.oid, ver: f.ver }
    }
}

impl From<Fid> for layout::ObjectsFid {
    fn from(f: Fid) -> layout::ObjectsFid {
        layout::ObjectsFid { seq: f.seq, oid: f.oid, ver: f.ver }
    }
}

/// The FID file `file`'s OST objects are named by under `layout`: its own, or the
/// one it had before it moved to another MDT ([`layout::Layout::objects`]).
pub fn objects_fid(file: Fid, layout: &layout::Layout) -> Fid {
    layout.objects.map_or(file, Fid::from)
}

/// The name of one OST object: the file, the layout component and the stripe. The
/// client derives it from the layout alone, so a file create needs no OST round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectId {
    pub fid: Fid,
    pub component: u32,
    pub stripe: u32,
}

impl ObjectId {
    /// Object `stripe` of component `component` of file `file` with `layout`.
    pub fn of(file: Fid, layout: &layout::Layout, component: u32, stripe: u32) -> ObjectId {
        ObjectId { fid: objects_fid(file, layout), component, stripe }
    }

    /// The object id `getstripe` prints: unique per OST, stable, derived from the name.
    pub fn objid(&self) -> u64 {
        ((self.fid.seq & 0xffff) << 48)
            | ((self.fid.oid as u64) << 16)
            | ((self.component as u64 & 0xff) << 8)
            | (self.stripe as u64 & 0xff)
    }

    /// The object's file name on its OST.
    pub fn file_name(&self) -> String {
        format!("{:x}-{:x}-{:x}-{:x}-{:x}", self.fid.seq, self.fid.oid, self.fid.ver, self.component, self.stripe)
    }

    /// The object a [`ObjectId::file_name`] names; `None` for any other name.
    pub fn from_file_name(name: &str) -> Option<ObjectId> {
        let mut parts = name.split('-').map(|p| u64::from_str_radix(p, 16).ok());
        let mut next = || parts.next().flatten();
        let (seq, oid, ver, component, stripe) = (next()?, next()?, next()?, next()?, next()?);
        if parts.next().is_some() {
            return None;
        }
        let small = |v: u64| u32::try_from(v).ok();
        let o = ObjectId {
            fid: Fid { seq, oid: small(oid)?, ver: small(ver)? },
            component: small(component)?,
            stripe: small(stripe)?,
        };
        // Only the spelling `file_name` writes (no leading zeros, lower case).
        (o.file_name() == name).then_some(o)
    }

    /// Fan-out directory (256 of them) so no directory of an OST grows huge.
    pub fn bucket(&self) -> String {
        let h = self.fid.oid ^ (self.fid.seq as u32).rotate_left(8) ^ self.stripe.rotate_left(16);
        format!("{:02x}", (h ^ (h >> 8) ^ (h >> 16) ^ (h >> 24)) & 0xff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_file_name_parses_back_and_nothing_else_does() {
        let o = ObjectId { fid: Fid::new(3, 7, 42), component: 2, stripe: 5 };
        assert_eq!(ObjectId::from_file_name(&o.file_name()), Some(o));
        for bad in ["", "x", "1-2-3-4", "1-2-3-4-5-6", "1-2-3-4-g", "01-2-3-4-5", "1-2-3-4-100000000", "A-2-3-4-5"] {
            assert_eq!(ObjectId::from_file_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn fid_key_roundtrip_and_routing() {
        let f = Fid::new(3, 7, 42);
        assert_eq!(f.mdt(), 3);
        assert_eq!(Fid::from_key(&f.to_key()), Some(f));
        assert_ne!(Fid::new(0, 1, 2).ino(), Fid::new(1, 1, 2).ino());
        assert_ne!(Fid::new(0, 1, 2).ino(), Fid::new(0, 2, 2).ino());
        assert!(Fid::from_key(&[1, 2, 3]).is_none());
        for f in [Fid::ROOT, Fid::new(3, 0xffff, u32::MAX), Fid::new(0xffff, 1, 0)] {
            assert_eq!(Fid::from_ino(f.ino()), f);
        }
    }
}
