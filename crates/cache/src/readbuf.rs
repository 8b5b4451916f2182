//! Page-aligned buffers that cached reads land in, kept for reuse.
//!
//! Why: a cached read is an `O_DIRECT` read into a page-aligned buffer that then
//! becomes the answer itself, with no copy. A fresh buffer per read cost a zeroing,
//! page faults, and at its free an unmap that interrupts every core (a TLB shootdown):
//! at 1 MiB transfers that was about a fifth of the mount's CPU. An answer gives its
//! buffer back here when the last of its bytes is dropped. The pool is bounded; past
//! the bound buffers are freed as usual.

use std::sync::{Arc, Mutex};

use crate::index::PAGE;

/// Buffers of at least this many bytes are pooled; smaller ones cost little to make.
const POOLED_MIN: usize = 64 << 10;
/// Sizes are rounded up to this, so that a buffer fits reads of nearby sizes.
const GRAIN: usize = 256 << 10;
/// Bytes the pool keeps, at most.
const POOL_BYTES: usize = 64 << 20;

#[derive(Default)]
pub(crate) struct Pool {
    free: Mutex<Vec<Vec<u8>>>,
}

/// `len` page-aligned bytes (their contents are whatever was there: every byte of
/// them is read over before use).
pub(crate) struct Buf {
    raw: Vec<u8>,
    at: usize,
    len: usize,
    pool: Option<Arc<Pool>>,
}

impl Pool {
    pub(crate) fn take(self: &Arc<Self>, len: usize) -> Buf {
        let need = len + PAGE as usize;
        if need < POOLED_MIN {
            return Buf::new(vec![0; need], len, None);
        }
        let reused = {
            let mut free = self.free.lock().expect("read buffer pool");
            // The smallest that fits, and not one far larger than needed.
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.len() >= need && b.len() <= 2 * need.max(GRAIN))
                .min_by_key(|(_, b)| b.len())
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        };
        let raw = reused.unwrap_or_else(|| vec![0; need.div_ceil(GRAIN) * GRAIN]);
        Buf::new(raw, len, Some(self.clone()))
    }

    fn give_back(&self, raw: Vec<u8>) {
        let mut free = self.free.lock().expect("read buffer pool");
        let held: usize = free.iter().map(Vec::len).sum();
        if held + raw.len() <= POOL_BYTES {
            free.push(raw);
        }
    }
}

impl Buf {
    fn new(raw: Vec<u8>, len: usize, pool: Option<Arc<Pool>>) -> Buf {
        let at = raw.as_ptr().align_offset(PAGE as usize);
        debug_assert!(at + len <= raw.len());
        Buf { raw, at, len, pool }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.at..self.at + self.len]
    }
}

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        &self.raw[self.at..self.at + self.len]
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give_back(std::mem::take(&mut self.raw));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_sized_and_reused() {
        let pool = Arc::new(Pool::default());
        let mut b = pool.take(1 << 20);
        assert_eq!(b.as_mut_slice().len(), 1 << 20);
        assert_eq!(b.as_ref().as_ptr() as usize % PAGE as usize, 0);
        let first = b.as_ref().as_ptr();
        drop(b);
        let b = pool.take(1 << 20);
        assert_eq!(b.as_ref().as_ptr(), first, "the freed buffer is handed out again");
        let small = pool.take(4096);
        assert_eq!(small.as_ref().len(), 4096);
        assert_eq!(small.as_ref().as_ptr() as usize % PAGE as usize, 0);
        drop(small);
        assert!(pool.free.lock().unwrap().is_empty(), "small buffers are not kept");
        drop(b);
        let huge: Vec<Buf> = (0..100).map(|_| pool.take(1 << 20)).collect();
        drop(huge);
        let held: usize = pool.free.lock().unwrap().iter().map(Vec::len).sum();
        assert!(held <= POOL_BYTES, "the pool stays within its bound ({held} bytes)");
    }
}
