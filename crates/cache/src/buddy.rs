//! The space of the cache's data file, handed out by a buddy allocator (as MAHA-FS's
//! client cache, seed 003, does): blocks of 2^k pages, split on demand and merged with
//! their buddy when both are free, so extents of every size share one file with
//! little fragmentation and no compaction.

use std::collections::BTreeSet;

/// Bytes of one page, the smallest block.
pub const PAGE: u64 = 4096;
/// Largest order: blocks of 2^MAX_ORDER pages (1 MiB).
pub const MAX_ORDER: u32 = 8;

/// A block of the data file: its first page and its order (2^order pages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Block {
    pub page: u64,
    pub order: u32,
}

impl Block {
    pub fn offset(self) -> u64 {
        self.page * PAGE
    }

    pub fn bytes(self) -> u64 {
        PAGE << self.order
    }
}

/// Free blocks by order.
#[derive(Debug)]
pub struct Buddy {
    free: Vec<BTreeSet<u64>>,
    pages: u64,
    used_pages: u64,
}

impl Buddy {
    /// An allocator over `bytes` of file (rounded down to whole top-order blocks), all free.
    pub fn new(bytes: u64) -> Buddy {
        let top = 1u64 << MAX_ORDER;
        let pages = bytes / PAGE / top * top;
        let mut free = vec![BTreeSet::new(); MAX_ORDER as usize + 1];
        free[MAX_ORDER as usize].extend((0..pages).step_by(top as usize));
        Buddy { free, pages, used_pages: 0 }
    }

    /// Bytes the allocator manages.
    pub fn capacity(&self) -> u64 {
        self.pages * PAGE
    }

    /// Bytes handed out and not freed.
    pub fn used(&self) -> u64 {
        self.used_pages * PAGE
    }

    /// A free block of `order`, split from a larger one if need be.
    pub fn alloc(&mut self, order: u32) -> Option<Block> {
        if order > MAX_ORDER {
            return None;
        }
        let from = (order..=MAX_ORDER).find(|&o| !self.free[o as usize].is_empty())?;
        let page = self.free[from as usize].pop_first()?;
        // Split down: the upper halves stay free.
        for o in (order..from).rev() {
            self.free[o as usize].insert(page + (1 << o));
        }
        self.used_pages += 1 << order;
        Some(Block { page, order })
    }

    /// Takes `b` out of the free space (rebuilding the allocator from a saved index).
    /// False if any of it is not free (a block given twice: the caller drops it).
    pub fn claim(&mut self, b: Block) -> bool {
        if b.order > MAX_ORDER || !b.page.is_multiple_of(1 << b.order) || b.page + (1 << b.order) > self.pages {
            return false;
        }
        // The free block containing it, at its order or above.
        for o in b.order..=MAX_ORDER {
            let start = b.page & !((1u64 << o) - 1);
            if self.free[o as usize].remove(&start) {
                // Give back the parts of [start, start + 2^o) outside `b`.
                let mut lo = start;
                for k in (b.order..o).rev() {
                    let half = 1u64 << k;
                    if b.page >= lo + half {
                        self.free[k as usize].insert(lo);
                        lo += half;
                    } else {
                        self.free[k as usize].insert(lo + half);
                    }
                }
                self.used_pages += 1 << b.order;
                return true;
            }
        }
        false
    }

    /// Gives `b` back, merging it with its free buddies.
    pub fn free(&mut self, b: Block) {
        let (mut page, mut order) = (b.page, b.order);
        self.used_pages = self.used_pages.saturating_sub(1 << b.order);
        while order < MAX_ORDER {
            let buddy = page ^ (1 << order);
            if !self.free[order as usize].remove(&buddy) {
                break;
            }
            page = page.min(buddy);
            order += 1;
        }
        self.free[order as usize].insert(page);
    }
}

/// The smallest order whose block holds `bytes`.
pub fn order_for(bytes: u64) -> u32 {
    let pages = bytes.div_ceil(PAGE).max(1);
    pages.next_power_of_two().trailing_zeros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_split_and_merge_back() {
        let mut b = Buddy::new(2 << 20);
        assert_eq!(b.capacity(), 2 << 20);
        let x = b.alloc(0).unwrap();
        let y = b.alloc(0).unwrap();
        assert_ne!(x, y);
        assert_eq!(b.used(), 2 * PAGE);
        let big = b.alloc(MAX_ORDER).unwrap();
        assert!(b.alloc(MAX_ORDER).is_none(), "one 1 MiB block was split, the other taken");
        b.free(x);
        b.free(y);
        b.free(big);
        assert_eq!(b.used(), 0);
        assert!(b.alloc(MAX_ORDER).is_some() && b.alloc(MAX_ORDER).is_some(), "everything merged back");
    }

    #[test]
    fn every_page_is_handed_out_once() {
        let mut b = Buddy::new(1 << 20);
        let mut seen = std::collections::HashSet::new();
        let mut got = vec![];
        for order in [0, 3, 1, 0, 2, 4, 0, 5, 6] {
            let blk = b.alloc(order).unwrap();
            for p in blk.page..blk.page + (1 << order) {
                assert!(seen.insert(p), "page {p} handed out twice");
            }
            got.push(blk);
        }
        for blk in got {
            b.free(blk);
        }
        assert_eq!(b.used(), 0);
        assert_eq!(b.alloc(MAX_ORDER).map(|x| x.page), Some(0));
    }

    #[test]
    fn claims_rebuild_the_free_space_and_refuse_overlaps() {
        let mut b = Buddy::new(2 << 20);
        assert!(b.claim(Block { page: 5, order: 0 }));
        assert!(b.claim(Block { page: 8, order: 3 }));
        assert!(!b.claim(Block { page: 8, order: 0 }), "inside a claimed block");
        assert!(!b.claim(Block { page: 3, order: 1 }), "misaligned");
        assert!(!b.claim(Block { page: 512, order: MAX_ORDER + 1 }));
        assert!(!b.claim(Block { page: 1 << 20, order: 0 }), "past the end");
        assert_eq!(b.used(), 9 * PAGE);
        // Everything else is free: 256 - 9 pages of the first MiB, and the second MiB.
        let mut n = 0;
        while let Some(x) = b.alloc(0) {
            assert!(x.page != 5 && !(8..16).contains(&x.page));
            n += 1;
        }
        assert_eq!(n, 256 * 2 - 9);
    }

    #[test]
    fn orders_fit_their_bytes() {
        assert_eq!(order_for(1), 0);
        assert_eq!(order_for(4096), 0);
        assert_eq!(order_for(4097), 1);
        assert_eq!(order_for(1 << 20), MAX_ORDER);
        assert_eq!(order_for(100 << 10), 5);
    }
}
