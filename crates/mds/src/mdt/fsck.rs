//! An MDT's half of `braid fsck` (online, with the file system in use, as LFSCK):
//! its tables read page by page for the checker, which holds the namespace of every
//! MDT and the objects of every OST and compares them; and the repairs it asks for,
//! applied as any other change (journaled, replicated, answered once) and only if
//! what they correct is still so when they arrive.

use proto::msg::{FsckFix, FsckRows, FsckTable, Response};
use proto::Errno;

use super::error::fail;
use super::{OpResult, Tbl, Writer};

/// The most rows one page holds.
pub const SCAN_MAX: u32 = 4096;

fn table(t: FsckTable) -> Tbl {
    match t {
        FsckTable::Inodes => Tbl::Inodes,
        FsckTable::Dentries => Tbl::Dentries,
        FsckTable::Orphans => Tbl::Orphans,
        FsckTable::Destroy => Tbl::Destroy,
    }
}

/// A page of table `t` after `after`, from `mdt`'s view of now.
pub(crate) fn scan(mdt: &crate::target::Mdt, t: FsckTable, after: Option<Vec<u8>>, max: u32) -> rpc::server::Answer {
    let max = max.clamp(1, SCAN_MAX) as usize;
    let page = (|| -> OpResult<FsckRows> {
        let view = mdt.view()?;
        let from = match &after {
            Some(k) => std::ops::Bound::Excluded(&k[..]),
            None => std::ops::Bound::Unbounded,
        };
        let mut page = FsckRows::default();
        for row in view.scan(table(t), from)? {
            page.rows.push(row?);
            if page.rows.len() >= max {
                return Ok(page);
            }
        }
        page.done = true;
        Ok(page)
    })();
    match page.map(|p| proto::msg::encode(&p)) {
        Ok(Ok(b)) => (Response::Data, vec![bytes::Bytes::from(b)]),
        Ok(Err(e)) => (Response::error(Errno::Io, format!("cannot encode an fsck page: {e}")), vec![]),
        Err(e) => (crate::target::op_error(e), vec![]),
    }
}

impl Writer<'_> {
    /// Applies `fix` if the namespace is still as the checker saw it; `Ok` either
    /// way, with [`Response::Ok`] when applied and an `EAGAIN`-free `Exist` error when
    /// the namespace moved on (the checker reports it as not repaired).
    pub(crate) fn fsck_fix(&mut self, creds: &proto::msg::Creds, fix: &FsckFix) -> OpResult<Response> {
        if creds.uid != 0 {
            return fail(Errno::Perm, "fsck repairs are root's");
        }
        let moved = || fail(Errno::Exist, "changed since fsck looked: not repaired");
        match fix {
            &FsckFix::LinkCount { fid, was, nlink } => {
                let mut ino = self.view.must_inode(fid)?;
                if ino.attr.nlink != was {
                    return moved();
                }
                ino.attr.nlink = nlink;
                self.put_inode(fid, &ino)?;
            }
            &FsckFix::Parent { fid, was, parent } => {
                let mut ino = self.view.must_inode(fid)?;
                if ino.parent != was {
                    return moved();
                }
                ino.parent = Some(parent);
                self.put_inode(fid, &ino)?;
            }
            FsckFix::DropEntry { parent, name, child } => {
                let key = super::schema::dentry_key(*parent, name);
                let names = self.view.with(Tbl::Dentries, &key, super::schema::decode_dentry)?;
                if names.map(|(c, _)| c) != Some(*child)
                    || (child.mdt() == self.mdt_index && self.view.inode(*child)?.is_some())
                {
                    return moved();
                }
                self.del(Tbl::Dentries, &key)?;
            }
        }
        tracing::info!(mdt = self.mdt_index, ?fix, "fsck: repaired");
        Ok(Response::Ok)
    }
}
