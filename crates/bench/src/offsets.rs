//! Where each transfer of a task goes. Seed 000 measures three access patterns (sequential,
//! strided with an interval of 17 blocks, random); IOR lays tasks out in segments of one
//! block per task. The order and the layout are kept apart: [`TransferOrder`] is a permutation
//! of a task's transfer indices, [`IorLayout`] maps an index to a byte offset in a file.

use serde::{Deserialize, Serialize};

/// The order a task visits its transfers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum AccessPattern {
    /// 0, 1, 2, ...
    Sequential,
    /// 0, K, 2K, ..., then 1, 1+K, ...: a jump of `stride_transfers` transfers between
    /// consecutive accesses (IOzone's stride read, seed 000's "17 x block size").
    Strided { stride_transfers: u64 },
    /// A seeded shuffle: every transfer once, in random order.
    Random { seed: u64 },
}

impl AccessPattern {
    pub fn label(&self) -> String {
        match self {
            AccessPattern::Sequential => "sequential".into(),
            AccessPattern::Strided { stride_transfers } => format!("strided({stride_transfers})"),
            AccessPattern::Random { .. } => "random".into(),
        }
    }
}

/// A permutation of `0..count`: the transfer indices of one task in visiting order.
#[derive(Debug, Clone)]
pub struct TransferOrder {
    count: u64,
    order: Order,
}

#[derive(Debug, Clone)]
enum Order {
    Sequential,
    Strided(u64),
    /// Random orders are materialized (8 bytes per transfer); `IorOptions` bounds the count.
    Shuffled(Vec<u64>),
}

impl TransferOrder {
    pub fn new(pattern: AccessPattern, count: u64) -> TransferOrder {
        let order = match pattern {
            AccessPattern::Sequential => Order::Sequential,
            AccessPattern::Strided { stride_transfers } => Order::Strided(stride_transfers.max(1)),
            AccessPattern::Random { seed } => {
                let mut indices: Vec<u64> = (0..count).collect();
                let mut rng = SplitMix64::new(seed);
                for i in (1..indices.len()).rev() {
                    let j = rng.below(i as u64 + 1) as usize;
                    indices.swap(i, j);
                }
                Order::Shuffled(indices)
            }
        };
        TransferOrder { count, order }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The transfer indices in visiting order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = u64> + '_> {
        let count = self.count;
        match &self.order {
            Order::Sequential => Box::new(0..count),
            Order::Strided(stride) => {
                let stride = *stride;
                Box::new((0..stride.min(count)).flat_map(move |first| (first..count).step_by(stride as usize)))
            }
            Order::Shuffled(indices) => Box::new(indices.iter().copied()),
        }
    }
}

/// IOR's file layout: `segments` segments, each holding one block per task (shared file) or
/// one block of this task (file per process); a block is `block / transfer` transfers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IorLayout {
    pub block_bytes: u64,
    pub transfer_bytes: u64,
    pub segments: u64,
    pub tasks: u64,
    pub file_per_process: bool,
}

impl IorLayout {
    pub fn transfers_per_block(&self) -> u64 {
        self.block_bytes / self.transfer_bytes
    }

    /// Transfers one task makes per phase.
    pub fn transfers_per_task(&self) -> u64 {
        self.transfers_per_block() * self.segments
    }

    /// Byte offset of transfer `index` of the data owned by `rank`.
    pub fn offset(&self, rank: u64, index: u64) -> u64 {
        let per_block = self.transfers_per_block();
        let segment = index / per_block;
        let within = (index % per_block) * self.transfer_bytes;
        if self.file_per_process {
            segment * self.block_bytes + within
        } else {
            (segment * self.tasks + rank) * self.block_bytes + within
        }
    }

    /// Bytes in one file after a full write phase.
    pub fn file_bytes(&self) -> u64 {
        if self.file_per_process {
            self.block_bytes * self.segments
        } else {
            self.block_bytes * self.segments * self.tasks
        }
    }
}

/// A small, fast, seedable generator (Steele et al.'s SplitMix64); good enough for shuffles
/// and data patterns, and needs no dependency.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (Lemire's multiply-shift; the tiny bias is irrelevant here).
    pub fn below(&mut self, bound: u64) -> u64 {
        ((self.next_u64() as u128 * bound as u128) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn visits_each_once(pattern: AccessPattern, count: u64) {
        let order = TransferOrder::new(pattern, count);
        let mut seen = vec![0u32; count as usize];
        let mut visited = 0;
        for index in order.iter() {
            seen[index as usize] += 1;
            visited += 1;
        }
        assert_eq!(visited, count, "{pattern:?} count {count}");
        assert!(seen.iter().all(|&n| n == 1), "{pattern:?} count {count}");
    }

    #[test]
    fn every_pattern_visits_every_transfer_exactly_once() {
        let patterns = [
            AccessPattern::Sequential,
            AccessPattern::Strided { stride_transfers: 17 },
            AccessPattern::Strided { stride_transfers: 1 },
            AccessPattern::Strided { stride_transfers: 4 },
            AccessPattern::Strided { stride_transfers: 1000 },
            AccessPattern::Random { seed: 7 },
            AccessPattern::Random { seed: 0 },
        ];
        for pattern in patterns {
            for count in [0, 1, 2, 3, 16, 17, 18, 100, 1024, 2049] {
                visits_each_once(pattern, count);
            }
        }
    }

    #[test]
    fn strided_jumps_by_the_stride() {
        let order: Vec<u64> = TransferOrder::new(AccessPattern::Strided { stride_transfers: 17 }, 40).iter().collect();
        assert_eq!(&order[..4], &[0, 17, 34, 1]);
        let sequential: Vec<u64> = TransferOrder::new(AccessPattern::Sequential, 5).iter().collect();
        assert_eq!(sequential, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn random_is_shuffled_and_reproducible() {
        let a: Vec<u64> = TransferOrder::new(AccessPattern::Random { seed: 42 }, 1000).iter().collect();
        let b: Vec<u64> = TransferOrder::new(AccessPattern::Random { seed: 42 }, 1000).iter().collect();
        let c: Vec<u64> = TransferOrder::new(AccessPattern::Random { seed: 43 }, 1000).iter().collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let in_place = a.iter().enumerate().filter(|(i, &v)| *i as u64 == v).count();
        assert!(in_place < 50, "a shuffle of 1000 left {in_place} in place");
    }

    #[test]
    fn shared_file_layout_tiles_the_file() {
        for file_per_process in [false, true] {
            let layout = IorLayout { block_bytes: 4096, transfer_bytes: 1024, segments: 3, tasks: 4, file_per_process };
            let ranks = if file_per_process { 1 } else { layout.tasks };
            let mut covered = vec![false; (layout.file_bytes() / layout.transfer_bytes) as usize];
            for rank in 0..ranks {
                for index in 0..layout.transfers_per_task() {
                    let offset = layout.offset(rank, index);
                    assert_eq!(offset % layout.transfer_bytes, 0);
                    let slot = (offset / layout.transfer_bytes) as usize;
                    assert!(!covered[slot], "offset {offset} written twice");
                    covered[slot] = true;
                }
            }
            assert!(covered.iter().all(|&c| c), "file_per_process={file_per_process}");
        }
        let shared =
            IorLayout { block_bytes: 4096, transfer_bytes: 1024, segments: 2, tasks: 4, file_per_process: false };
        assert_eq!(shared.offset(1, 0), 4096);
        assert_eq!(shared.offset(1, 4), 5 * 4096);
    }
}
