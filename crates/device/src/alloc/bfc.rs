//! The best-fit-with-coalescing allocator of TensorFlow and XLA (JAX):
//! `tsl::BFCAllocator` in `xla/tsl/framework/bfc_allocator.cc`.
//!
//! Sizes are rounded to 256 bytes; a request takes the smallest free chunk
//! that fits (lowest address on ties), which is what walking the 21 size bins
//! in order gives; a chunk is split when it is at least twice the request or
//! the slack reaches `max_internal_fragmentation_bytes` (128 MiB); freed chunks
//! merge with free neighbours of the same region. The pool grows by `Extend`
//! (regions that double under `allow_growth`, or the whole memory limit at
//! once) and gives memory back to the driver only through the garbage
//! collection path (`DeallocateFreeRegions`) just before an OOM.

use super::arena::Arena;
use super::{
    device_malloc, AllocError, Allocator, AllocatorStats, BlockId, PoolKind, SegmentView,
    TraceEvent,
};
use crate::device::Device;
#[cfg(debug_assertions)]
use vramlab_core::error::Broken;
use vramlab_core::units::{round_up, MIB};

/// `kMinAllocationSize`.
pub const MIN_ALLOCATION_SIZE: u64 = 256;
/// `kNumBins`.
pub const NUM_BINS: u32 = 21;
/// Default `max_internal_fragmentation_bytes_`.
pub const MAX_INTERNAL_FRAGMENTATION: u64 = 128 * MIB;
/// First region under `allow_growth`.
pub const INITIAL_GROWTH_REGION: u64 = 2 * MIB;

/// `kBackpedalFactor`: a failed region request is retried at 90%.
pub const BACKPEDAL_FACTOR: f32 = 0.9;

/// `RoundedBytes`.
pub fn rounded_bytes(bytes: u64) -> u64 {
    round_up(bytes, MIN_ALLOCATION_SIZE)
}

/// `BinNumForSize`: bin b holds chunks in [256 * 2^b, 256 * 2^(b+1)).
pub fn bin_for_size(bytes: u64) -> u32 {
    let v = bytes.max(MIN_ALLOCATION_SIZE) >> 8;
    (63 - v.leading_zeros()).min(NUM_BINS - 1)
}

#[derive(Clone, Debug, PartialEq)]
pub struct BfcConfig {
    /// `bytes_limit`: the most the pool may hold.
    pub memory_limit: u64,
    /// Grow in doubling regions instead of taking the limit at once.
    pub allow_growth: bool,
    /// `TF_ENABLE_GPU_GARBAGE_COLLECTION` (on by default for GPUs).
    pub garbage_collection: bool,
}

/// The BFC allocator: the policy over a block arena of regions.
#[derive(Debug)]
pub struct BfcAllocator {
    config: BfcConfig,
    curr_region_allocation_bytes: u64,
    arena: Arena,
}

impl BfcAllocator {
    pub fn new(config: BfcConfig) -> Self {
        let curr_region_allocation_bytes = if config.allow_growth {
            rounded_bytes(config.memory_limit.min(INITIAL_GROWTH_REGION))
        } else {
            rounded_bytes(config.memory_limit)
        };
        Self {
            config,
            curr_region_allocation_bytes,
            arena: Arena::default(),
        }
    }

    pub fn config(&self) -> &BfcConfig {
        &self.config
    }

    /// The size the next region will be asked for (before doubling for a
    /// large request).
    pub fn next_region_bytes(&self) -> u64 {
        self.curr_region_allocation_bytes
    }

    /// `Extend`: a new region from the driver; a refused request is retried
    /// at 90% while that still fits the request.
    fn extend(&mut self, device: &mut dyn Device, rounded: u64) -> Result<bool, AllocError> {
        let available = (self.config.memory_limit - self.arena.stats.reserved_bytes.current)
            / MIN_ALLOCATION_SIZE
            * MIN_ALLOCATION_SIZE;
        if rounded > available {
            return Ok(false);
        }
        let mut increased = false;
        while rounded > self.curr_region_allocation_bytes {
            self.curr_region_allocation_bytes *= 2;
            increased = true;
        }
        let mut bytes = self.curr_region_allocation_bytes.min(available);
        let address = loop {
            if let Some(address) = device_malloc(device, bytes)? {
                break address;
            }
            // kBackpedalFactor is a float: the product is computed in single precision.
            let smaller = rounded_bytes(((bytes as f32) * BACKPEDAL_FACTOR) as u64);
            if smaller < rounded || smaller >= bytes {
                return Ok(false);
            }
            bytes = smaller;
        };
        if !increased {
            self.curr_region_allocation_bytes *= 2;
        }
        let id = self.arena.add_segment(address, bytes, PoolKind::Region, 0);
        self.arena.insert_free(id);
        Ok(true)
    }

    /// `FindChunkPtr` + `AllocateChunkFromLowEnd`: the smallest free chunk
    /// that fits, split when it is at least twice the request or the slack
    /// reaches `max_internal_fragmentation_bytes`.
    fn find_chunk(&mut self, rounded: u64, requested: u64) -> Option<BlockId> {
        let (size, id) = self.arena.best_fit(PoolKind::Region, rounded, 0)?;
        self.arena.take_free(id);
        let split = size >= rounded * 2 || size - rounded >= MAX_INTERNAL_FRAGMENTATION;
        Some(self.arena.allocate(id, rounded, requested, split))
    }

    /// `DeallocateFreeRegions`: the garbage-collection path.
    fn deallocate_free_regions(&mut self, device: &mut dyn Device, rounded: u64) -> bool {
        if !self.config.garbage_collection {
            return false;
        }
        let free_regions: Vec<(BlockId, u64)> = self.arena.whole_free_segments().collect();
        let total_free: u64 = free_regions.iter().map(|&(_, size)| size).sum();
        if total_free == 0 {
            return false;
        }
        let reserved = self.arena.stats.reserved_bytes.current;
        if rounded > self.config.memory_limit - reserved + total_free {
            return false;
        }
        for (id, _) in free_regions {
            self.arena.release_segment(device, id);
        }
        true
    }

    /// A chunk after `Extend`, and after the garbage-collection path.
    fn find_or_grow(
        &mut self,
        device: &mut dyn Device,
        rounded: u64,
        bytes: u64,
    ) -> Result<Option<BlockId>, AllocError> {
        if let Some(id) = self.find_chunk(rounded, bytes) {
            return Ok(Some(id));
        }
        if self.extend(device, rounded)? {
            if let Some(id) = self.find_chunk(rounded, bytes) {
                return Ok(Some(id));
            }
        }
        if self.deallocate_free_regions(device, rounded) && self.extend(device, rounded)? {
            return Ok(self.find_chunk(rounded, bytes));
        }
        Ok(None)
    }
}

impl Allocator for BfcAllocator {
    fn malloc(
        &mut self,
        device: &mut dyn Device,
        bytes: u64,
    ) -> Result<Option<BlockId>, AllocError> {
        if bytes == 0 {
            return Ok(None);
        }
        let rounded = rounded_bytes(bytes);
        match self.find_or_grow(device, rounded, bytes)? {
            Some(id) => Ok(Some(id)),
            None => Err(AllocError::OutOfMemory(self.arena.out_of_memory(
                device,
                (bytes, rounded, rounded),
                None,
                Some(self.config.memory_limit),
            ))),
        }
    }

    fn free(&mut self, _device: &mut dyn Device, id: BlockId) {
        self.arena.free(id);
    }

    fn empty_cache(&mut self, _device: &mut dyn Device) -> Option<u64> {
        None
    }

    fn stats(&self) -> &AllocatorStats {
        &self.arena.stats
    }

    fn reset_peak_stats(&mut self) {
        self.arena.stats.reset_peaks();
    }

    fn block_size(&self, block: BlockId) -> u64 {
        self.arena.block(block).size
    }

    #[cfg(feature = "device-values")]
    fn block_address(&self, block: BlockId) -> u64 {
        self.arena.block(block).address
    }

    fn segments(&self) -> Vec<SegmentView> {
        self.arena.segments()
    }

    fn drain_trace(&mut self, out: &mut Vec<TraceEvent>) {
        out.append(&mut self.arena.trace.events);
    }

    fn set_tracing(&mut self, on: bool) {
        self.arena.trace.on = on;
    }

    #[cfg(debug_assertions)]
    fn check_invariants(&self, device: &dyn Device) -> Result<(), Broken> {
        self.arena.check_invariants(device, MIN_ALLOCATION_SIZE)?;
        if self.arena.stats.reserved_bytes.current > self.config.memory_limit {
            return Err("pool_bytes exceeds the memory limit".into());
        }
        if self.config.allow_growth
            && self.curr_region_allocation_bytes
                < INITIAL_GROWTH_REGION.min(rounded_bytes(self.config.memory_limit))
        {
            return Err("the growth region shrank".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{SimDevice, SimDeviceConfig};
    use vramlab_core::units::{GIB, KIB};

    fn setup(limit: u64, allow_growth: bool) -> (BfcAllocator, SimDevice) {
        let dev = SimDevice::new(SimDeviceConfig {
            total_bytes: 4 * GIB,
            context_bytes: 0,
            other_processes_bytes: 0,
            ..Default::default()
        });
        let a = BfcAllocator::new(BfcConfig {
            memory_limit: limit,
            allow_growth,
            garbage_collection: true,
        });
        (a, dev)
    }

    #[test]
    fn bins_cover_powers_of_two() {
        assert_eq!(bin_for_size(1), 0);
        assert_eq!(bin_for_size(256), 0);
        assert_eq!(bin_for_size(511), 0);
        assert_eq!(bin_for_size(512), 1);
        assert_eq!(bin_for_size(256 * MIB - 1), 19);
        assert_eq!(bin_for_size(256 * MIB), 20);
        assert_eq!(bin_for_size(64 * GIB), 20);
    }

    /// The BFC allocator's worked example: allow_growth, 1000 B then 3 MiB.
    #[test]
    fn worked_example_of_section_3_5() {
        let (mut a, mut dev) = setup(GIB, true);
        a.malloc(&mut dev, 1000).unwrap();
        assert_eq!(a.stats().allocated_bytes.current, KIB);
        assert_eq!(a.stats().reserved_bytes.current, 2 * MIB);
        assert_eq!(a.next_region_bytes(), 4 * MIB);
        let y = a.malloc(&mut dev, 3 * MIB).unwrap().unwrap();
        // 4 MiB region; 4 MiB < 2 x 3 MiB and slack 1 MiB < 128 MiB: no split.
        assert_eq!(a.block_size(y), 4 * MIB);
        assert_eq!(a.stats().allocated_bytes.current, KIB + 4 * MIB);
        assert_eq!(a.stats().reserved_bytes.current, 6 * MIB);
        assert_eq!(a.next_region_bytes(), 8 * MIB);
        a.check_invariants(&dev).unwrap();
    }

    /// A 100 MiB request with curr = 8 MiB doubles curr to 128 MiB,
    /// takes a 128 MiB region and leaves curr at 128 MiB.
    #[test]
    fn large_request_doubles_the_region_without_a_second_doubling() {
        let (mut a, mut dev) = setup(GIB, true);
        a.malloc(&mut dev, 1000).unwrap();
        a.malloc(&mut dev, 3 * MIB).unwrap();
        assert_eq!(a.next_region_bytes(), 8 * MIB);
        let z = a.malloc(&mut dev, 100 * MIB).unwrap().unwrap();
        assert_eq!(a.stats().reserved_bytes.current, 6 * MIB + 128 * MIB);
        assert_eq!(a.next_region_bytes(), 128 * MIB);
        // 128 MiB < 2 x 100 MiB and slack 28 MiB < 128 MiB: handed out whole.
        assert_eq!(a.block_size(z), 128 * MIB);
        a.check_invariants(&dev).unwrap();
    }

    #[test]
    fn growth_regions_double() {
        let (mut a, mut dev) = setup(GIB, true);
        let sizes: Vec<u64> = (0..5)
            .map(|_| {
                let before = a.stats().reserved_bytes.current;
                // Each request is larger than any free chunk left.
                a.malloc(&mut dev, a.next_region_bytes()).unwrap();
                a.stats().reserved_bytes.current - before
            })
            .collect();
        assert_eq!(sizes, vec![2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB]);
    }

    #[test]
    fn without_growth_the_first_allocation_takes_the_whole_limit() {
        let limit = GIB + 1000;
        let (mut a, mut dev) = setup(limit, false);
        a.malloc(&mut dev, 1).unwrap();
        // One region of the limit rounded down to 256 bytes.
        assert_eq!(a.stats().reserved_bytes.current, GIB + 768);
        assert_eq!(a.stats().segment.current, 1);
        assert_eq!(a.stats().allocated_bytes.current, 256);
        a.check_invariants(&dev).unwrap();
    }

    #[test]
    fn split_rule_two_x_or_128_mib_slack() {
        let (mut a, mut dev) = setup(2 * GIB, false);
        let x = a.malloc(&mut dev, GIB + GIB / 2).unwrap().unwrap();
        // The 2 GiB region: 2 GiB < 2 x 1.5 GiB, but slack 512 MiB >= 128 MiB: split.
        assert_eq!(a.block_size(x), GIB + GIB / 2);
        a.check_invariants(&dev).unwrap();
    }

    #[test]
    fn coalescing_and_the_pool_never_shrinks() {
        let (mut a, mut dev) = setup(GIB, true);
        let x = a.malloc(&mut dev, 256).unwrap().unwrap();
        let y = a.malloc(&mut dev, 256).unwrap().unwrap();
        a.free(&mut dev, x);
        a.free(&mut dev, y);
        let segs = a.segments();
        assert_eq!(segs.len(), 1);
        assert_eq!(segs[0].blocks.len(), 1);
        assert_eq!(a.stats().allocated_bytes.current, 0);
        assert_eq!(a.stats().reserved_bytes.current, 2 * MIB);
        assert_eq!(a.empty_cache(&mut dev), None);
        a.check_invariants(&dev).unwrap();
    }

    #[test]
    fn garbage_collection_frees_empty_regions_to_fit_a_larger_one() {
        let (mut a, mut dev) = setup(16 * MIB, true);
        let x = a.malloc(&mut dev, 2 * MIB).unwrap().unwrap(); // 2 MiB region
        let y = a.malloc(&mut dev, 4 * MIB).unwrap().unwrap(); // 4 MiB region
        a.free(&mut dev, x);
        a.free(&mut dev, y);
        // pool 6 MiB, limit 16 MiB: a 12 MiB request cannot extend (10 MiB
        // available) until both free regions go back to the driver.
        let z = a.malloc(&mut dev, 12 * MIB).unwrap().unwrap();
        assert_eq!(a.stats().num_device_free, 2);
        assert_eq!(a.block_size(z), 16 * MIB);
        a.check_invariants(&dev).unwrap();
    }

    #[test]
    fn oom_when_the_limit_is_reached() {
        let (mut a, mut dev) = setup(8 * MIB, true);
        let _x = a.malloc(&mut dev, 6 * MIB).unwrap();
        let err = a.malloc(&mut dev, 4 * MIB).unwrap_err();
        let oom = err.out_of_memory().expect("an out-of-memory");
        assert_eq!(oom.rounded, 4 * MIB);
        assert_eq!(oom.memory_limit, Some(8 * MIB));
        assert_eq!(a.stats().num_ooms, 1);
        a.check_invariants(&dev).unwrap();
    }

    #[test]
    fn a_refused_region_is_asked_again_at_ninety_percent() {
        // `Extend` with kBackpedalFactor 0.9 (a float product): 1 GiB is
        // refused by a 900 MiB card, so is 1 GiB x 0.9 = 966,367,744; the
        // second back-off, 869,731,072 bytes, fits.
        let mut dev = SimDevice::new(SimDeviceConfig {
            total_bytes: 900 * MIB,
            context_bytes: 0,
            other_processes_bytes: 0,
            ..Default::default()
        });
        let mut a = BfcAllocator::new(BfcConfig {
            memory_limit: GIB,
            allow_growth: false,
            garbage_collection: true,
        });
        a.malloc(&mut dev, MIB).unwrap().unwrap();
        let sizes: Vec<u64> = a.segments().iter().map(|s| s.total_size).collect();
        assert_eq!(sizes, vec![869_731_072]);
        assert_eq!(a.stats().reserved_bytes.current, 869_731_072);
        a.check_invariants(&dev).unwrap();
    }
}
