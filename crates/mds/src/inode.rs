//! Inode records as stored in an MDT, and POSIX permission rules.
//!
//! An inode is the attributes the wire carries ([`Attr`], its own FID included) and
//! what only the MDT needs: a symlink's target, a directory's default layout and its
//! parent. One struct for the attributes, so a field added for clients (DoM size, a
//! mirror's state) is stored by adding it once.

use layout::{Component, ComponentSpec, Layout, LayoutSpec, Pattern};
use proto::msg::{Attr, Creds, DirStripes, FileKind, Timespec};
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
    /// What a client sees of it (`getattr`).
    pub attr: Attr,
    pub symlink: Option<String>,
    /// Default layout for new files of a directory.
    pub dir_default: Option<LayoutSpec>,
    /// Parent of a directory (for `..` and rename loop checks).
    pub parent: Option<Fid>,
}

/// A layout request as records of version 1 stored it (directory defaults), before
/// components had a pattern (Data-on-MDT). Frozen: the decoding of old records must
/// not follow later changes of [`LayoutSpec`].
#[derive(Deserialize)]
struct LayoutSpecV1 {
    components: Vec<ComponentSpecV1>,
}

#[derive(Deserialize)]
struct ComponentSpecV1 {
    extent_end: u64,
    stripe_count: Option<i64>,
    stripe_size: Option<u64>,
    stripe_offset: Option<u32>,
    ost_list: Option<Vec<u32>>,
    pool: Option<String>,
}

impl From<LayoutSpecV1> for LayoutSpec {
    fn from(v: LayoutSpecV1) -> LayoutSpec {
        let components = v
            .components
            .into_iter()
            .map(|c| ComponentSpec {
                extent_end: c.extent_end,
                stripe_count: c.stripe_count,
                stripe_size: c.stripe_size,
                stripe_offset: c.stripe_offset,
                ost_list: c.ost_list,
                pool: c.pool,
                pattern: Pattern::Raid0,
            })
            .collect();
        LayoutSpec { components }
    }
}

/// A file's layout as records of versions 1 to 4 stored it, before mirrors (FLR):
/// components without a mirror id and flags. Frozen, as [`LayoutSpecV1`].
#[derive(Deserialize)]
struct LayoutV1 {
    generation: u32,
    components: Vec<ComponentV1>,
}

#[derive(Deserialize)]
struct ComponentV1 {
    id: u32,
    extent_start: u64,
    extent_end: u64,
    pattern: Pattern,
    stripe_size: u64,
    osts: Vec<u32>,
    stripe_count_wanted: i64,
    pool: Option<String>,
}

impl From<LayoutV1> for Layout {
    fn from(v: LayoutV1) -> Layout {
        let components = v
            .components
            .into_iter()
            .map(|c| Component {
                id: c.id,
                extent_start: c.extent_start,
                extent_end: c.extent_end,
                pattern: c.pattern,
                stripe_size: c.stripe_size,
                osts: c.osts,
                stripe_count_wanted: c.stripe_count_wanted,
                pool: c.pool,
                mirror: 0,
                flags: 0,
            })
            .collect();
        Layout { generation: v.generation, components, objects: None }
    }
}

/// The attributes as records of versions 1 and 2 stored them, before striped
/// directories. Frozen, as [`LayoutSpecV1`].
#[derive(Deserialize)]
struct AttrV2 {
    fid: Fid,
    kind: FileKind,
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    size: u64,
    atime: Timespec,
    mtime: Timespec,
    ctime: Timespec,
    layout: Option<LayoutV1>,
    rdev: u64,
    trunc_epoch: u64,
}

impl From<AttrV2> for Attr {
    fn from(a: AttrV2) -> Attr {
        let AttrV2 { fid, kind, mode, nlink, uid, gid, size, atime, mtime, ctime, layout, rdev, trunc_epoch } = a;
        let stripes = None;
        let data_version = 0;
        Attr {
            fid,
            kind,
            mode,
            nlink,
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
            layout: layout.map(Layout::from),
            rdev,
            trunc_epoch,
            data_version,
            stripes,
        }
    }
}

/// The attributes as records of version 3 stored them, before data versions. Frozen,
/// as [`LayoutSpecV1`].
#[derive(Deserialize)]
struct AttrV3 {
    fid: Fid,
    kind: FileKind,
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    size: u64,
    atime: Timespec,
    mtime: Timespec,
    ctime: Timespec,
    layout: Option<LayoutV1>,
    rdev: u64,
    trunc_epoch: u64,
    stripes: Option<Box<DirStripes>>,
}

impl From<AttrV3> for Attr {
    fn from(a: AttrV3) -> Attr {
        let AttrV3 { fid, kind, mode, nlink, uid, gid, size, atime, mtime, ctime, layout, rdev, trunc_epoch, stripes } =
            a;
        let data_version = 0;
        Attr {
            fid,
            kind,
            mode,
            nlink,
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
            layout: layout.map(Layout::from),
            rdev,
            trunc_epoch,
            data_version,
            stripes,
        }
    }
}

/// The attributes as records of versions 4 and 5 stored them, with the layouts of
/// their version (`L`: before mirrors, then before `Layout::objects`). Frozen, as
/// [`LayoutSpecV1`].
#[derive(Deserialize)]
struct AttrV4<L> {
    fid: Fid,
    kind: FileKind,
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    size: u64,
    atime: Timespec,
    mtime: Timespec,
    ctime: Timespec,
    layout: Option<L>,
    rdev: u64,
    trunc_epoch: u64,
    data_version: u64,
    stripes: Option<Box<DirStripes>>,
}

impl<L: Into<Layout>> From<AttrV4<L>> for Attr {
    fn from(a: AttrV4<L>) -> Attr {
        let AttrV4 {
            fid,
            kind,
            mode,
            nlink,
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
            layout,
            rdev,
            trunc_epoch,
            data_version,
            stripes,
        } = a;
        Attr {
            fid,
            kind,
            mode,
            nlink,
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
            layout: layout.map(Into::into),
            rdev,
            trunc_epoch,
            data_version,
            stripes,
        }
    }
}

/// An inode record of version 1: the directory default without patterns.
#[derive(Deserialize)]
struct InodeV1 {
    attr: AttrV2,
    symlink: Option<String>,
    dir_default: Option<LayoutSpecV1>,
    parent: Option<Fid>,
}

/// An inode record of version 2: attributes without a shard table.
#[derive(Deserialize)]
struct InodeV2 {
    attr: AttrV2,
    symlink: Option<String>,
    dir_default: Option<LayoutSpec>,
    parent: Option<Fid>,
}

/// An inode record of version 3: attributes without a data version.
#[derive(Deserialize)]
struct InodeV3 {
    attr: AttrV3,
    symlink: Option<String>,
    dir_default: Option<LayoutSpec>,
    parent: Option<Fid>,
}

/// An inode record of version 4: layouts without mirrors.
#[derive(Deserialize)]
struct InodeV4 {
    attr: AttrV4<LayoutV1>,
    symlink: Option<String>,
    dir_default: Option<LayoutSpec>,
    parent: Option<Fid>,
}

/// A file's layout as records of version 5 stored it, before objects named by a
/// FID other than the file's (`Layout::objects`). Its components are today's (the
/// change after them freezes their encoding here too).
#[derive(Deserialize)]
struct LayoutV5 {
    generation: u32,
    components: Vec<Component>,
}

impl From<LayoutV5> for Layout {
    fn from(l: LayoutV5) -> Layout {
        Layout { generation: l.generation, components: l.components, objects: None }
    }
}

/// An inode record of version 5: layouts naming their objects by the file's FID.
#[derive(Deserialize)]
struct InodeV5 {
    attr: AttrV4<LayoutV5>,
    symlink: Option<String>,
    dir_default: Option<LayoutSpec>,
    parent: Option<Fid>,
}

/// An inode as database format 0 stored it (no version byte, no FID), in its last
/// encoding: the one before special files and truncate epochs, then those two.
/// (postcard writes a nested struct as its fields in order, so this reads the same
/// bytes as the flat struct braid wrote.)
#[derive(Deserialize)]
struct InodeFormat0 {
    before: InodeV0,
    rdev: u64,
    trunc_epoch: u64,
}

/// An inode as braid wrote it before special files.
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
    layout: Option<LayoutV1>,
    symlink: Option<String>,
    dir_default: Option<LayoutSpecV1>,
    parent: Option<Fid>,
}

impl Inode {
    /// Decodes the inode `fid` of database format 0, in its last encoding or the one
    /// before `rdev`; only [`crate::mdt::schema::upgrade`] reads these.
    pub fn decode_format0(fid: Fid, bytes: &[u8]) -> Result<Inode, store::StoreError> {
        let InodeFormat0 { before: v, rdev, trunc_epoch } = store::decode_exact::<InodeFormat0>(bytes, "inode")
            .or_else(|e| {
                let before: InodeV0 = store::decode_exact(bytes, "inode").map_err(|_| e)?;
                Ok::<_, store::StoreError>(InodeFormat0 { before, rdev: 0, trunc_epoch: 0 })
            })?;
        Ok(Inode {
            attr: Attr {
                fid,
                kind: v.kind,
                mode: v.mode,
                nlink: v.nlink,
                uid: v.uid,
                gid: v.gid,
                size: v.size,
                atime: v.atime,
                mtime: v.mtime,
                ctime: v.ctime,
                layout: v.layout.map(Layout::from),
                rdev,
                trunc_epoch,
                data_version: 0,
                stripes: None,
            },
            symlink: v.symlink,
            dir_default: v.dir_default.map(LayoutSpec::from),
            parent: v.parent,
        })
    }

    /// Decodes the body of an inode record of version 1 (see [`InodeV1`]).
    pub fn decode_v1(body: &[u8]) -> Result<Inode, store::StoreError> {
        let v: InodeV1 = store::decode_exact(body, "inode")?;
        Ok(Inode {
            attr: v.attr.into(),
            symlink: v.symlink,
            dir_default: v.dir_default.map(LayoutSpec::from),
            parent: v.parent,
        })
    }

    /// Decodes the body of an inode record of version 2 (see [`InodeV2`]).
    pub fn decode_v2(body: &[u8]) -> Result<Inode, store::StoreError> {
        let v: InodeV2 = store::decode_exact(body, "inode")?;
        Ok(Inode { attr: v.attr.into(), symlink: v.symlink, dir_default: v.dir_default, parent: v.parent })
    }

    /// Decodes the body of an inode record of version 3 (see [`InodeV3`]).
    pub fn decode_v3(body: &[u8]) -> Result<Inode, store::StoreError> {
        let v: InodeV3 = store::decode_exact(body, "inode")?;
        Ok(Inode { attr: v.attr.into(), symlink: v.symlink, dir_default: v.dir_default, parent: v.parent })
    }

    /// Decodes the body of an inode record of version 4 (see [`InodeV4`]).
    pub fn decode_v4(body: &[u8]) -> Result<Inode, store::StoreError> {
        let v: InodeV4 = store::decode_exact(body, "inode")?;
        Ok(Inode { attr: v.attr.into(), symlink: v.symlink, dir_default: v.dir_default, parent: v.parent })
    }

    /// Decodes the body of an inode record of version 5 (see [`InodeV5`]).
    pub fn decode_v5(body: &[u8]) -> Result<Inode, store::StoreError> {
        let v: InodeV5 = store::decode_exact(body, "inode")?;
        Ok(Inode { attr: v.attr.into(), symlink: v.symlink, dir_default: v.dir_default, parent: v.parent })
    }

    pub fn new(fid: Fid, kind: FileKind, mode: u32, creds: &Creds, gid: u32, now: Timespec) -> Inode {
        Inode {
            attr: Attr::new_inode(fid, kind, mode, creds, gid, now),
            symlink: None,
            dir_default: None,
            parent: None,
        }
    }

    /// POSIX access check of `want` (MAY_* bits) by `creds`.
    pub fn may(&self, creds: &Creds, want: u32) -> bool {
        self.attr.may(creds, want)
    }

    pub fn is_owner_or_root(&self, creds: &Creds) -> bool {
        creds.uid == 0 || creds.uid == self.attr.uid
    }
}

/// The sticky-directory rule: in a sticky directory only the owner of the entry, the
/// owner of the directory or root may remove or rename it.
pub fn sticky_allows(dir: &Inode, victim: &Inode, creds: &Creds) -> bool {
    sticky_allows_attr(dir, &victim.attr, creds)
}

/// [`sticky_allows`] with the victim's attributes only (its inode is on another MDT).
pub fn sticky_allows_attr(dir: &Inode, victim: &Attr, creds: &Creds) -> bool {
    dir.attr.mode & S_ISVTX == 0 || creds.uid == 0 || creds.uid == victim.uid || creds.uid == dir.attr.uid
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(mode: u32, uid: u32, gid: u32) -> Inode {
        let creds = Creds { uid, gid, groups: vec![] };
        Inode::new(Fid::new(0, 0x400, 9), FileKind::File, mode, &creds, gid, Timespec::default())
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
    fn inodes_of_both_format_0_encodings_read() {
        let mut now = file(0o644, 7, 8);
        now.attr.size = 4096;
        now.symlink = Some("t".into());
        let a = &now.attr;
        let head = (a.kind, a.mode, a.nlink, a.uid, a.gid, a.size, a.atime, a.mtime, a.ctime, a.layout.clone());
        let tail = (now.symlink.clone(), now.dir_default.clone(), now.parent);
        // The encoding before rdev and trunc_epoch: the same fields, two fewer at the end.
        let v0 = store::encode(&(head.clone(), tail.clone()));
        assert_eq!(Inode::decode_format0(a.fid, &v0).unwrap(), now, "read with rdev 0 and epoch 0");
        let mut dev = now.clone();
        (dev.attr.kind, dev.attr.rdev, dev.attr.trunc_epoch) = (FileKind::CharDevice, 0x0103, 9);
        let d = &dev.attr;
        let head = (d.kind, d.mode, d.nlink, d.uid, d.gid, d.size, d.atime, d.mtime, d.ctime, d.layout.clone());
        let v1 = store::encode(&(head, tail, d.rdev, d.trunc_epoch));
        assert_eq!(Inode::decode_format0(a.fid, &v1).unwrap(), dev, "the last format-0 encoding");
        let mut longer = v1.clone();
        longer.push(0);
        assert!(Inode::decode_format0(a.fid, &longer).is_err(), "trailing bytes are corruption, not another encoding");
        assert!(Inode::decode_format0(a.fid, &v0[..v0.len() - 1]).is_err(), "a cut record is corruption");
    }

    #[test]
    fn sticky_rule() {
        let mut dir = file(0o1777, 0, 0);
        dir.attr.kind = FileKind::Dir;
        let victim = file(0o644, 10, 10);
        assert!(sticky_allows(&dir, &victim, &Creds { uid: 10, gid: 10, groups: vec![] }));
        assert!(!sticky_allows(&dir, &victim, &Creds { uid: 11, gid: 10, groups: vec![] }));
    }
}
