//! The trace record: one client operation in 64 bytes (seed 001's Table 2 record,
//! with the fields of Darshan DXT and Lustre's jobstats), little-endian, the same in
//! the ring, on the wire and on disk.

use proto::Fid;

/// Bytes of one record.
pub const RECORD_BYTES: usize = 64;

/// A record's FID when the operation had none (statfs).
pub const NO_FID: Fid = Fid { seq: 0, oid: 0, ver: 0 };

/// A record's job when the calling process had none (or the table of job names was
/// full).
pub const NO_JOB: u32 = u32::MAX;

macro_rules! ops {
    ($($name:ident = $code:literal, $text:literal;)*) => {
        /// What a client did.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Op {
            $($name = $code,)*
        }

        impl Op {
            pub const ALL: &'static [Op] = &[$(Op::$name,)*];

            pub fn from_code(code: u8) -> Option<Op> {
                match code {
                    $($code => Some(Op::$name),)*
                    _ => None,
                }
            }

            /// The name `braid trace` prints and filters on.
            pub fn name(self) -> &'static str {
                match self {
                    $(Op::$name => $text,)*
                }
            }

            pub fn from_name(name: &str) -> Option<Op> {
                match name {
                    $($text => Some(Op::$name),)*
                    _ => None,
                }
            }
        }
    };
}

ops! {
    Lookup = 1, "lookup";
    Getattr = 2, "getattr";
    Setattr = 3, "setattr";
    Open = 4, "open";
    Create = 5, "create";
    Close = 6, "close";
    Read = 7, "read";
    Write = 8, "write";
    Fsync = 9, "fsync";
    Flush = 10, "flush";
    Readdir = 11, "readdir";
    Mkdir = 12, "mkdir";
    Mknod = 13, "mknod";
    Unlink = 14, "unlink";
    Rmdir = 15, "rmdir";
    Rename = 16, "rename";
    Link = 17, "link";
    Symlink = 18, "symlink";
    Readlink = 19, "readlink";
    Getxattr = 20, "getxattr";
    Setxattr = 21, "setxattr";
    Listxattr = 22, "listxattr";
    Removexattr = 23, "removexattr";
    Lock = 24, "lock";
    Statfs = 25, "statfs";
    Fallocate = 26, "fallocate";
    Opendir = 27, "opendir";
    Access = 28, "access";
}

impl Op {
    /// Operations that move file data (the rest are metadata).
    pub fn is_data(self) -> bool {
        matches!(self, Op::Read | Op::Write)
    }
}

/// The server an operation went to, as far as the client knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    None,
    Mdt(u16),
    Ost(u16),
}

impl Target {
    const INDEX_BITS: u16 = 14;
    const INDEX_MASK: u16 = (1 << Self::INDEX_BITS) - 1;

    fn encode(self) -> u16 {
        match self {
            Target::None => 0,
            Target::Mdt(i) => (1 << Self::INDEX_BITS) | (i & Self::INDEX_MASK),
            Target::Ost(i) => (2 << Self::INDEX_BITS) | (i & Self::INDEX_MASK),
        }
    }

    fn decode(v: u16) -> Option<Target> {
        let i = v & Self::INDEX_MASK;
        match v >> Self::INDEX_BITS {
            0 if i == 0 => Some(Target::None),
            1 => Some(Target::Mdt(i)),
            2 => Some(Target::Ost(i)),
            _ => None,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::None => write!(f, "-"),
            Target::Mdt(i) => write!(f, "MDT{i:04x}"),
            Target::Ost(i) => write!(f, "OST{i:04x}"),
        }
    }
}

/// One client operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// When it started, nanoseconds since the Unix epoch.
    pub start_ns: u64,
    /// How long it took, nanoseconds (at most `u32::MAX`, about 4.3 s: longer ones
    /// show that).
    pub dur_ns: u32,
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub fid: Fid,
    pub offset: u64,
    pub len: u64,
    /// Index of the job's name in the client's job table, or [`NO_JOB`].
    pub job: u32,
    pub op: Op,
    /// 0 for success, else the errno (255 stands for any errno above 254).
    pub errno: u8,
    pub target: Target,
}

/// Why bytes are not a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("unknown operation code {0}")]
    Op(u8),
    #[error("unknown target {0:#06x}")]
    Target(u16),
}

impl Record {
    pub fn encode(&self, out: &mut [u8; RECORD_BYTES]) {
        out[0..8].copy_from_slice(&self.start_ns.to_le_bytes());
        out[8..12].copy_from_slice(&self.dur_ns.to_le_bytes());
        out[12..16].copy_from_slice(&self.pid.to_le_bytes());
        out[16..20].copy_from_slice(&self.uid.to_le_bytes());
        out[20..24].copy_from_slice(&self.gid.to_le_bytes());
        out[24..32].copy_from_slice(&self.fid.seq.to_le_bytes());
        out[32..36].copy_from_slice(&self.fid.oid.to_le_bytes());
        out[36..40].copy_from_slice(&self.fid.ver.to_le_bytes());
        out[40..48].copy_from_slice(&self.offset.to_le_bytes());
        out[48..56].copy_from_slice(&self.len.to_le_bytes());
        out[56..60].copy_from_slice(&self.job.to_le_bytes());
        out[60] = self.op as u8;
        out[61] = self.errno;
        out[62..64].copy_from_slice(&self.target.encode().to_le_bytes());
    }

    pub fn decode(b: &[u8; RECORD_BYTES]) -> Result<Record, RecordError> {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let target = u16::from_le_bytes([b[62], b[63]]);
        Ok(Record {
            start_ns: u64_at(0),
            dur_ns: u32_at(8),
            pid: u32_at(12),
            uid: u32_at(16),
            gid: u32_at(20),
            fid: Fid { seq: u64_at(24), oid: u32_at(32), ver: u32_at(36) },
            offset: u64_at(40),
            len: u64_at(48),
            job: u32_at(56),
            op: Op::from_code(b[60]).ok_or(RecordError::Op(b[60]))?,
            errno: b[61],
            target: Target::decode(target).ok_or(RecordError::Target(target))?,
        })
    }

    pub fn end_ns(&self) -> u64 {
        self.start_ns.saturating_add(self.dur_ns as u64)
    }
}

/// An errno as a record keeps it.
pub fn errno_byte(errno: i32) -> u8 {
    errno.clamp(0, 255) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_bytes_are_refused() {
        let r = Record {
            start_ns: 1_764_000_000_123_456_789,
            dur_ns: 12_345,
            pid: 4242,
            uid: 1000,
            gid: 100,
            fid: Fid { seq: 0x2_0000_0401, oid: 7, ver: 0 },
            offset: 1 << 40,
            len: 4096,
            job: 3,
            op: Op::Write,
            errno: 28,
            target: Target::Ost(513),
        };
        let mut b = [0u8; RECORD_BYTES];
        r.encode(&mut b);
        assert_eq!(Record::decode(&b).unwrap(), r);
        for t in [Target::None, Target::Mdt(0), Target::Mdt(16383), Target::Ost(0)] {
            let mut b2 = b;
            Record { target: t, ..r }.encode(&mut b2);
            assert_eq!(Record::decode(&b2).unwrap().target, t);
        }
        let mut bad = b;
        bad[60] = 0;
        assert_eq!(Record::decode(&bad), Err(RecordError::Op(0)));
        bad = b;
        bad[63] = 0xc0;
        assert!(matches!(Record::decode(&bad), Err(RecordError::Target(_))));
        for op in Op::ALL {
            assert_eq!(Op::from_code(*op as u8), Some(*op));
            assert_eq!(Op::from_name(op.name()), Some(*op));
        }
        assert_eq!(errno_byte(-1), 0);
        assert_eq!(errno_byte(1000), 255);
    }
}
