//! Inode records as stored in an MDT, and POSIX permission rules.

use layout::{Layout, LayoutSpec};
use proto::msg::{Attr, Creds, FileKind, Timespec};
use proto::Fid;
use serde::{Deserialize, Serialize};

pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;
pub const S_ISVTX: u32 = 0o1000;

pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXEC: u32 = 1;

/// The stored form of an inode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inode {
    pub kind: FileKind,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub layout: Option<Layout>,
    pub symlink: Option<String>,
    /// Default layout for new files of a directory.
    pub dir_default: Option<LayoutSpec>,
    /// Parent of a directory (for `..` and rename loop checks).
    pub parent: Option<Fid>,
    /// Device number of a character or block device.
    pub rdev: u64,
    /// Bumped by every truncate (see [`Attr::trunc_epoch`]).
    pub trunc_epoch: u64,
}

/// An inode as braid wrote it before special files (no `rdev`, no `trunc_epoch`), read so that an MDT
/// formatted then keeps working.
#[derive(Deserialize)]
struct InodeV0 {
    kind: FileKind,
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    size: u64,
    atime: Timespec,
    mtime: Timespec,
    ctime: Timespec,
    layout: Option<Layout>,
    symlink: Option<String>,
    dir_default: Option<LayoutSpec>,
    parent: Option<Fid>,
}

impl Inode {
    /// Decodes an inode of database format 0 (no version byte), in its last encoding
    /// or the one before `rdev`; only [`crate::mdt::schema::upgrade`] reads these.
    pub fn decode_format0(bytes: &[u8]) -> Result<Inode, store::StoreError> {
        store::decode_exact::<Inode>(bytes, "inode").or_else(|e| {
            let v: InodeV0 = store::decode_exact(bytes, "inode").map_err(|_| e)?;
            Ok(Inode {
                kind: v.kind,
                mode: v.mode,
                nlink: v.nlink,
                uid: v.uid,
                gid: v.gid,
                size: v.size,
                atime: v.atime,
                mtime: v.mtime,
                ctime: v.ctime,
                layout: v.layout,
                symlink: v.symlink,
                dir_default: v.dir_default,
                parent: v.parent,
                rdev: 0,
                trunc_epoch: 0,
            })
        })
    }
}

impl Inode {
    pub fn new(kind: FileKind, mode: u32, creds: &Creds, gid: u32, now: Timespec) -> Inode {
        Inode {
            kind,
            mode: mode & 0o7777,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            uid: creds.uid,
            gid,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            layout: None,
            symlink: None,
            dir_default: None,
            parent: None,
            rdev: 0,
            trunc_epoch: 0,
        }
    }

    pub fn attr(&self, fid: Fid) -> Attr {
        Attr {
            fid,
            kind: self.kind,
            mode: self.mode,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            layout: self.layout.clone(),
            rdev: self.rdev,
            trunc_epoch: self.trunc_epoch,
        }
    }

    /// POSIX access check of `want` (MAY_* bits) by `creds`.
    pub fn may(&self, creds: &Creds, want: u32) -> bool {
        creds.may(self.kind, self.mode, self.uid, self.gid, want)
    }

    pub fn is_owner_or_root(&self, creds: &Creds) -> bool {
        creds.uid == 0 || creds.uid == self.uid
    }
}

/// The sticky-directory rule: in a sticky directory only the owner of the entry, the
/// owner of the directory or root may remove or rename it.
pub fn sticky_allows(dir: &Inode, victim: &Inode, creds: &Creds) -> bool {
    dir.mode & S_ISVTX == 0 || creds.uid == 0 || creds.uid == victim.uid || creds.uid == dir.uid
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(mode: u32, uid: u32, gid: u32) -> Inode {
        let mut i = Inode::new(FileKind::File, mode, &Creds { uid, gid, groups: vec![] }, gid, Timespec::default());
        i.uid = uid;
        i
    }

    #[test]
    fn owner_group_other_bits() {
        let f = file(0o640, 10, 20);
        let owner = Creds { uid: 10, gid: 99, groups: vec![] };
        let member = Creds { uid: 11, gid: 5, groups: vec![20] };
        let other = Creds { uid: 12, gid: 5, groups: vec![] };
        assert!(f.may(&owner, MAY_READ | MAY_WRITE));
        assert!(f.may(&member, MAY_READ) && !f.may(&member, MAY_WRITE));
        assert!(!f.may(&other, MAY_READ));
        assert!(f.may(&Creds::root(), MAY_READ | MAY_WRITE));
        assert!(!f.may(&Creds::root(), MAY_EXEC));
    }

    #[test]
    fn inodes_of_the_earlier_encoding_still_read() {
        // The encoding before rdev and trunc_epoch: the same fields, two fewer at the end.
        let mut now = file(0o644, 7, 8);
        now.size = 4096;
        now.symlink = Some("t".into());
        let old = (
            now.kind,
            now.mode,
            now.nlink,
            now.uid,
            now.gid,
            now.size,
            now.atime,
            now.mtime,
            now.ctime,
            now.layout.clone(),
            now.symlink.clone(),
            now.dir_default.clone(),
            now.parent,
        );
        let bytes = store::encode(&old);
        assert_eq!(Inode::decode_format0(&bytes).unwrap(), now, "read with rdev 0 and epoch 0");
        let mut dev = now.clone();
        (dev.kind, dev.rdev, dev.trunc_epoch) = (FileKind::CharDevice, 0x0103, 9);
        assert_eq!(Inode::decode_format0(&store::encode(&dev)).unwrap(), dev, "today's encoding");
        let mut longer = store::encode(&dev);
        longer.push(0);
        assert!(Inode::decode_format0(&longer).is_err(), "trailing bytes are corruption, not another encoding");
        assert!(Inode::decode_format0(&bytes[..bytes.len() - 1]).is_err(), "a cut record is corruption");
    }

    #[test]
    fn sticky_rule() {
        let mut dir = file(0o1777, 0, 0);
        dir.kind = FileKind::Dir;
        let victim = file(0o644, 10, 10);
        assert!(sticky_allows(&dir, &victim, &Creds { uid: 10, gid: 10, groups: vec![] }));
        assert!(!sticky_allows(&dir, &victim, &Creds { uid: 11, gid: 10, groups: vec![] }));
    }
}
