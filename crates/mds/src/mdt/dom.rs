//! Data-on-MDT: the bytes of a file's DoM component, kept in the MDT's `dom` table.
//!
//! The MDT serves a DoM component as an OST serves an object, at the file's own
//! offsets, with the same operations (read, write, trim, cut, size), so the client's
//! object I/O layer sees the MDT as one more target. The bytes are kept in blocks of
//! [`DOM_BLOCK`] (a small write rewrites one block, not the file), each a record with
//! a version byte and a CRC32C of its bytes: a block damaged on disk is reported as
//! corrupt, never served. A block holds its bytes up to the last one written, so the
//! object's size is the end of its last block. Writes, trims and cuts are mutations of
//! the committer's batch: journaled and group-committed with the metadata, answered
//! from the reply cache on a retry.

use std::ops::Deref;

use proto::msg::{FileKind, Response, Timespec};
use proto::{Errno, Fid};
use store::memtable::MemTable;
use store::StoreError;

use super::error::{fail, OpError, OpResult};
use super::schema::Tbl;
use super::view::View;
use super::writer::Writer;

/// Bytes per block of a DoM object.
pub const DOM_BLOCK: u64 = 64 << 10;
/// The version of a DoM block record.
pub const DOM_VERSION: u8 = 1;

/// Key of block `block` of `fid`'s DoM object: the FID, then the block index, so a
/// file's blocks are one range in order.
pub(super) fn dom_key(fid: Fid, block: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(24);
    k.extend_from_slice(&fid.to_key());
    k.extend_from_slice(&block.to_be_bytes());
    k
}

fn block_of(fid: Fid, key: &[u8]) -> OpResult<u64> {
    key.get(16..24)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| corrupt(fid, "a block key is not FID + index"))
}

fn corrupt(fid: Fid, detail: &str) -> OpError {
    OpError::Store(StoreError::Corrupt { what: "DoM data", detail: format!("{fid}: {detail}") })
}

fn encode_block(data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + data.len());
    v.push(DOM_VERSION);
    v.extend_from_slice(&crc32c::crc32c(data).to_le_bytes());
    v.extend_from_slice(data);
    v
}

fn decode_block(fid: Fid, v: &[u8]) -> OpResult<Vec<u8>> {
    let (_, body) = store::open_record("DoM block", DOM_VERSION, v)?;
    if body.len() < 4 || body.len() - 4 > DOM_BLOCK as usize {
        return Err(corrupt(fid, "a block record has a bad length"));
    }
    let (crc, data) = body.split_at(4);
    if crc32c::crc32c(data).to_le_bytes() != crc {
        return Err(corrupt(fid, "a block's checksum does not match its bytes"));
    }
    Ok(data.to_vec())
}

impl<M: Deref<Target = MemTable>> View<M> {
    /// One block of `fid`'s DoM object, if it has bytes.
    fn dom_block(&self, fid: Fid, block: u64) -> OpResult<Option<Vec<u8>>> {
        self.with(Tbl::Dom, &dom_key(fid, block), |v| decode_block(fid, v))
    }

    /// The size of `fid`'s DoM object: the end of its last block.
    pub fn dom_size(&self, fid: Fid) -> OpResult<u64> {
        let prefix = fid.to_key();
        let mut last = None;
        for row in self.scan_prefix(Tbl::Dom, &prefix)? {
            let (k, v) = row?;
            last = Some((k, v));
        }
        match last {
            Some((k, v)) => Ok(block_of(fid, &k)? * DOM_BLOCK + decode_block(fid, &v)?.len() as u64),
            None => Ok(0),
        }
    }

    /// `len` bytes of `fid`'s DoM object from `offset`; fewer at the object's end, and
    /// zeros where nothing was written.
    pub fn dom_read(&self, fid: Fid, offset: u64, len: u64) -> OpResult<Vec<u8>> {
        let size = self.dom_size(fid)?;
        let end = offset.saturating_add(len).min(size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        for block in offset / DOM_BLOCK..=(end - 1) / DOM_BLOCK {
            let Some(data) = self.dom_block(fid, block)? else { continue };
            let base = block * DOM_BLOCK;
            let from = offset.max(base);
            let to = end.min(base + data.len() as u64);
            if from < to {
                out[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&data[(from - base) as usize..(to - base) as usize]);
            }
        }
        Ok(out)
    }

    /// Every block of `fid`'s DoM object that has bytes, in order (a file moving to
    /// another MDT takes them along).
    pub fn dom_blocks(&self, fid: Fid) -> OpResult<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        for row in self.scan_prefix(Tbl::Dom, &fid.to_key())? {
            let (k, v) = row?;
            out.push((block_of(fid, &k)?, decode_block(fid, &v)?));
        }
        Ok(out)
    }

    /// Checks that `fid` is a file with a DoM component; returns where it ends. A
    /// file that moved to another MDT is answered with where it went.
    pub fn dom_end(&self, fid: Fid) -> OpResult<u64> {
        let ino = self.handle_inode(fid)?;
        if ino.attr.kind != FileKind::File {
            return fail(Errno::Inval, format!("{fid} is not a regular file"));
        }
        self.takes_changes(&ino)?;
        match ino.attr.layout.as_ref().and_then(|l| l.dom_end()) {
            Some(end) => Ok(end),
            None => fail(Errno::Inval, format!("{fid} has no Data-on-MDT component")),
        }
    }
}

impl Writer<'_> {
    pub(super) fn put_block(&mut self, fid: Fid, block: u64, data: &[u8]) -> OpResult<()> {
        self.put(Tbl::Dom, &dom_key(fid, block), &encode_block(data))
    }

    /// Writes the first bytes of file `fid`, just made: there is nothing to merge
    /// them with.
    pub(super) fn dom_fill_new(&mut self, fid: Fid, data: &[u8]) -> OpResult<()> {
        for (block, bytes) in data.chunks(DOM_BLOCK as usize).enumerate() {
            self.put_block(fid, block as u64, bytes)?;
        }
        Ok(())
    }

    /// Writes `data` at `offset` of `fid`'s DoM object; with `publish`, also the size
    /// and mtime (see `Request::MdsDomWrite`).
    pub(super) fn dom_write(
        &mut self,
        fid: Fid,
        offset: u64,
        data: &[u8],
        publish: Option<u64>,
        now: Timespec,
    ) -> OpResult<Response> {
        let dom_end = self.view.dom_end(fid)?;
        let end = offset.checked_add(data.len() as u64).filter(|&e| e <= dom_end).ok_or_else(|| {
            OpError::Errno(
                Errno::Inval,
                format!(
                    "a write of {} bytes at {offset} passes the end of {fid}'s DoM component ({dom_end})",
                    data.len()
                ),
            )
        })?;
        if data.is_empty() {
            return Ok(Response::DomWritten { bytes: 0, size_published: false });
        }
        for block in offset / DOM_BLOCK..=(end - 1) / DOM_BLOCK {
            let base = block * DOM_BLOCK;
            let from = offset.max(base);
            let to = end.min(base + DOM_BLOCK);
            let mut bytes = self.view.dom_block(fid, block)?.unwrap_or_default();
            if bytes.len() < (to - base) as usize {
                bytes.resize((to - base) as usize, 0);
            }
            bytes[(from - base) as usize..(to - base) as usize]
                .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
            self.put_block(fid, block, &bytes)?;
        }
        let mut size_published = false;
        if let Some(epoch) = publish {
            let mut ino = self.view.must_inode(fid)?;
            if ino.attr.trunc_epoch == epoch {
                ino.attr.size = ino.attr.size.max(end);
                ino.attr.mtime = now;
                ino.attr.ctime = now;
                ino.attr.data_version += 1;
                self.put_inode(fid, &ino)?;
                size_published = true;
            }
        }
        Ok(Response::DomWritten { bytes: data.len() as u64, size_published })
    }

    /// Deallocates `[offset, offset+len)` of `fid`'s DoM object: whole blocks inside
    /// it go (the last block stays, zeroed, so the size is kept), partial ones are
    /// zeroed.
    pub(super) fn dom_trim(&mut self, fid: Fid, offset: u64, len: u64) -> OpResult<Response> {
        self.view.dom_end(fid)?;
        let size = self.view.dom_size(fid)?;
        let end = offset.saturating_add(len).min(size);
        if offset >= end {
            return Ok(Response::Ok);
        }
        let last = (size - 1) / DOM_BLOCK;
        // One block in memory at a time, whatever the size of the component.
        for block in offset / DOM_BLOCK..=(end - 1) / DOM_BLOCK {
            let Some(mut bytes) = self.view.dom_block(fid, block)? else { continue };
            let base = block * DOM_BLOCK;
            let from = offset.max(base);
            let to = end.min(base + bytes.len() as u64);
            if from >= to {
                continue;
            }
            if from == base && to == base + bytes.len() as u64 && block != last {
                self.del(Tbl::Dom, &dom_key(fid, block))?;
            } else {
                bytes[(from - base) as usize..(to - base) as usize].fill(0);
                self.put_block(fid, block, &bytes)?;
            }
        }
        Ok(Response::Ok)
    }

    /// Cuts `fid`'s DoM object to at most `size` bytes.
    pub(super) fn dom_cut(&mut self, fid: Fid, size: u64) -> OpResult<Response> {
        self.view.dom_end(fid)?;
        self.drop_dom_from(fid, size)?;
        Ok(Response::Ok)
    }

    /// Removes every byte of `fid`'s DoM object at or past `size` (all of it for 0):
    /// a truncate, or the inode going away.
    pub(super) fn drop_dom_from(&mut self, fid: Fid, size: u64) -> OpResult<()> {
        let old_size = self.view.dom_size(fid)?;
        if old_size <= size {
            return Ok(());
        }
        let mut kept_end = 0;
        // Blocks at or past the cut, one in memory at a time.
        for block in size / DOM_BLOCK..=(old_size - 1) / DOM_BLOCK {
            let Some(mut bytes) = self.view.dom_block(fid, block)? else { continue };
            let base = block * DOM_BLOCK;
            if base >= size {
                self.del(Tbl::Dom, &dom_key(fid, block))?;
            } else {
                if base + bytes.len() as u64 > size {
                    bytes.truncate((size - base) as usize);
                    self.put_block(fid, block, &bytes)?;
                }
                kept_end = base + bytes.len() as u64;
            }
        }
        // Cut inside a hole (a trimmed range): the object still ends at `size`, as a
        // sparse OST object does, so a zeroed tail marks where.
        if size > 0 && kept_end < size {
            let block = (size - 1) / DOM_BLOCK;
            let base = block * DOM_BLOCK;
            let mut bytes = self.view.dom_block(fid, block)?.unwrap_or_default();
            if bytes.len() as u64 != size - base {
                bytes.resize((size - base) as usize, 0);
                self.put_block(fid, block, &bytes)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_record_refuses_damage() {
        let fid = Fid::new(1, 2, 0);
        let v = encode_block(b"hello");
        assert_eq!(decode_block(fid, &v).unwrap(), b"hello");
        let mut bad = v.clone();
        *bad.last_mut().unwrap() ^= 1;
        let e = decode_block(fid, &bad).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
        let mut newer = v;
        newer[0] = DOM_VERSION + 1;
        assert!(decode_block(fid, &newer).is_err());
        assert!(decode_block(fid, &[DOM_VERSION, 1]).is_err());
    }
}
