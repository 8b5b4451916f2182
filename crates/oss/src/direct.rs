//! Large aligned object I/O with `O_DIRECT`, past the OSS's page cache.
//!
//! A streaming write through the page cache costs the OSS a page-cache fill per byte
//! on top of the client's, and on a machine whose free memory is slow to fault in
//! (this project's VMs hand it back to the host) that fill is the bottleneck; a
//! streaming read from disk likewise fills the cache with pages nobody reads again.
//! As Lustre's OSS does for large I/O (its read cache stops at a file size), transfers
//! of at least [`DIRECT_MIN`] at aligned offsets go straight between the disk and an
//! aligned buffer; small and unaligned ones stay buffered. Linux keeps the two
//! coherent (a direct read first writes back dirty cached pages of its range, a
//! direct write drops them). A file system that refuses `O_DIRECT` (tmpfs) falls back
//! to buffered I/O.

use std::alloc::Layout;
use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;

/// Smallest transfer done with `O_DIRECT`.
pub const DIRECT_MIN: usize = 1 << 20;
/// Alignment of offsets, lengths and buffers (the largest logical block size in use).
pub const ALIGN: usize = 4096;
/// Largest write buffer a thread keeps for reuse (warm memory, no page faults).
const KEEP_MAX: usize = 4 << 20;

/// Whether a transfer of `len` bytes at `offset` goes direct.
pub fn eligible(offset: u64, len: usize) -> bool {
    len >= DIRECT_MIN && offset.is_multiple_of(ALIGN as u64) && len.is_multiple_of(ALIGN)
}

/// A heap buffer aligned to [`ALIGN`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: the buffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// An uninitialised buffer of `cap` bytes (`cap` > 0, a multiple of [`ALIGN`]).
    fn new(cap: usize) -> Option<AlignedBuf> {
        let layout = Layout::from_size_align(cap, ALIGN).ok()?;
        if cap == 0 {
            return None;
        }
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) })?;
        Some(AlignedBuf { ptr, len: 0, cap })
    }

    fn layout(&self) -> Layout {
        Layout::from_size_align(self.cap, ALIGN).expect("checked at allocation")
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes were written (by a copy or by pread).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout()) }
    }
}

thread_local! {
    static WRITE_BUF: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

fn open_direct(path: &Path, write: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    if write {
        o.write(true).create(true).truncate(false);
    } else {
        o.read(true);
    }
    o.custom_flags(libc::O_DIRECT).open(path)
}

/// Whether an error means "this file system or request cannot do O_DIRECT".
fn unsupported(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::InvalidInput || e.raw_os_error() == Some(libc::EOPNOTSUPP)
}

/// Writes `data` at `offset` of the object at `path` with `O_DIRECT`. `Ok(false)`: the
/// file system cannot, write it buffered instead.
pub fn write(path: &Path, offset: u64, data: &[u8]) -> std::io::Result<bool> {
    let f = match open_direct(path, true) {
        Ok(f) => f,
        Err(e) if unsupported(&e) => return Ok(false),
        Err(e) => return Err(e),
    };
    WRITE_BUF.with(|cell| {
        let mut slot = cell.borrow_mut();
        let mut buf = match slot.take() {
            Some(b) if b.cap >= data.len() => b,
            _ => {
                AlignedBuf::new(data.len()).ok_or_else(|| std::io::Error::other("cannot allocate an aligned buffer"))?
            }
        };
        // SAFETY: `buf` holds at least `data.len()` bytes; the regions do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.ptr.as_ptr(), data.len()) };
        buf.len = data.len();
        let r = f.write_all_at(buf.as_ref(), offset);
        if buf.cap <= KEEP_MAX {
            *slot = Some(buf);
        }
        match r {
            Ok(()) => Ok(true),
            Err(e) if unsupported(&e) => Ok(false),
            Err(e) => Err(e),
        }
    })
}

/// Reads up to `len` bytes at `offset` of the object at `path` with `O_DIRECT` (fewer
/// at its end). `Ok(None)`: the file system cannot, read it buffered instead.
pub fn read(path: &Path, offset: u64, len: usize) -> std::io::Result<Option<AlignedBuf>> {
    let f = match open_direct(path, false) {
        Ok(f) => f,
        Err(e) if unsupported(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut buf = AlignedBuf::new(len).ok_or_else(|| std::io::Error::other("cannot allocate an aligned buffer"))?;
    while buf.len < len {
        // SAFETY: pread writes at most `len - buf.len` bytes inside the allocation; the
        // file offset stays aligned until the short read at the end of the object.
        let n = unsafe {
            libc::pread(
                f.as_raw_fd(),
                buf.ptr.as_ptr().add(buf.len).cast(),
                len - buf.len,
                (offset + buf.len as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                ErrorKind::Interrupted => continue,
                _ if unsupported(&e) && buf.len == 0 => return Ok(None),
                _ => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        buf.len += n as usize;
        if !buf.len.is_multiple_of(ALIGN) {
            break; // the end of the object
        }
    }
    Ok(Some(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_and_buffered_io_see_each_other() {
        let dir = std::env::temp_dir().join(format!("braid-direct-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("obj");
        let big: Vec<u8> = (0..DIRECT_MIN + ALIGN).map(|i| (i % 251) as u8).collect();
        if !write(&p, ALIGN as u64, &big).unwrap() {
            std::fs::remove_dir_all(&dir).unwrap();
            return; // this file system has no O_DIRECT: nothing to check here
        }
        // A buffered write over part of it, then a direct read must see both.
        std::fs::OpenOptions::new().write(true).open(&p).unwrap().write_all_at(b"buffered", 10_000).unwrap();
        let total = ALIGN + big.len();
        let got = read(&p, 0, total + ALIGN).unwrap().expect("direct read");
        assert_eq!(got.as_ref().len(), total, "short read at the end of the object");
        assert!(got.as_ref()[..ALIGN].iter().all(|&b| b == 0), "hole before the first write");
        let mut want = big.clone();
        want[10_000 - ALIGN..10_000 - ALIGN + 8].copy_from_slice(b"buffered");
        assert!(got.as_ref()[ALIGN..] == want[..], "bytes differ");
        assert!(eligible(0, DIRECT_MIN) && !eligible(512, DIRECT_MIN) && !eligible(0, DIRECT_MIN - 1));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
