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

use super::{
    Allocator, AllocatorStats, BlockId, BlockState, BlockView, OutOfMemory, SegmentView, Slab,
    Trace, TraceAction, TraceEvent, NIL,
};
use crate::device::Device;
use crate::units::{round_up, MIB};
use std::collections::{BTreeMap, BTreeSet};

/// `kMinAllocationSize`.
pub const MIN_ALLOCATION_SIZE: u64 = 256;
/// `kNumBins`.
pub const NUM_BINS: u32 = 21;
/// Default `max_internal_fragmentation_bytes_`.
pub const MAX_INTERNAL_FRAGMENTATION: u64 = 128 * MIB;
/// First region under `allow_growth`.
pub const INITIAL_GROWTH_REGION: u64 = 2 * MIB;

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

#[derive(Clone, Debug)]
struct Chunk {
    address: u64,
    size: u64,
    requested: u64,
    in_use: bool,
    prev: BlockId,
    next: BlockId,
}

impl Chunk {
    fn has_neighbour(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
}

#[derive(Debug)]
pub struct BfcAllocator {
    config: BfcConfig,
    curr_region_allocation_bytes: u64,
    chunks: Slab<Chunk>,
    /// Free chunks by (size, address): the bins' order, flattened.
    free: BTreeSet<(u64, u64, BlockId)>,
    /// Region base address to (first chunk, region size).
    regions: BTreeMap<u64, (BlockId, u64)>,
    stats: AllocatorStats,
    trace: Trace,
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
            chunks: Slab::default(),
            free: BTreeSet::new(),
            regions: BTreeMap::new(),
            stats: AllocatorStats::default(),
            trace: Trace::default(),
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

    fn insert_free(&mut self, id: BlockId) {
        let c = self.chunks.get(id);
        self.free.insert((c.size, c.address, id));
    }

    fn remove_free(&mut self, id: BlockId) {
        let c = self.chunks.get(id);
        let removed = self.free.remove(&(c.size, c.address, id));
        debug_assert!(removed, "free chunk missing from its bin");
    }

    /// `Extend`: a new region from the driver.
    fn extend(&mut self, device: &mut dyn Device, rounded: u64) -> bool {
        let available = (self.config.memory_limit - self.stats.reserved_bytes.current)
            / MIN_ALLOCATION_SIZE
            * MIN_ALLOCATION_SIZE;
        if rounded > available {
            return false;
        }
        let mut increased = false;
        while rounded > self.curr_region_allocation_bytes {
            self.curr_region_allocation_bytes *= 2;
            increased = true;
        }
        let mut bytes = self.curr_region_allocation_bytes.min(available);
        let mut address = device.malloc(bytes);
        while address.is_none() {
            // kBackpedalFactor is a float: the product is computed in single precision.
            let smaller = rounded_bytes(((bytes as f32) * 0.9f32) as u64);
            if smaller < rounded || smaller >= bytes {
                return false;
            }
            bytes = smaller;
            address = device.malloc(bytes);
        }
        let Some(address) = address else {
            return false;
        };
        if !increased {
            self.curr_region_allocation_bytes *= 2;
        }
        self.stats.num_device_alloc += 1;
        self.stats.reserved_bytes.increase(bytes);
        self.stats.segment.increase(1);
        self.trace
            .record(TraceAction::SegmentAlloc, address, bytes, None);
        let id = self.chunks.insert(Chunk {
            address,
            size: bytes,
            requested: 0,
            in_use: false,
            prev: NIL,
            next: NIL,
        });
        self.regions.insert(address, (id, bytes));
        self.insert_free(id);
        true
    }

    /// `FindChunkPtr` + `AllocateChunkFromLowEnd`.
    fn find_chunk(&mut self, rounded: u64, requested: u64) -> Option<BlockId> {
        let &(size, address, id) = self.free.range((rounded, 0, 0)..).next()?;
        self.free.remove(&(size, address, id));
        let mut split = self.split_contribution(id, -1);
        if size >= rounded * 2 || size - rounded >= MAX_INTERNAL_FRAGMENTATION {
            // `SplitChunk`: the remainder becomes a free chunk after this one.
            let next = self.chunks.get(id).next;
            let rest = self.chunks.insert(Chunk {
                address: address + rounded,
                size: size - rounded,
                requested: 0,
                in_use: false,
                prev: id,
                next,
            });
            if next != NIL {
                self.chunks.get_mut(next).prev = rest;
            }
            let c = self.chunks.get_mut(id);
            c.next = rest;
            c.size = rounded;
            self.insert_free(rest);
            let (n, b) = self.split_contribution(rest, 1);
            split = (split.0 + n, split.1 + b);
        }
        self.stats.inactive_split.apply(split.0);
        self.stats.inactive_split_bytes.apply(split.1);
        let c = self.chunks.get_mut(id);
        c.in_use = true;
        c.requested = requested;
        let (address, size) = (c.address, c.size);
        self.stats.allocated_bytes.increase(size);
        self.stats.active_bytes.increase(size);
        self.stats.requested_bytes.increase(requested);
        self.stats.allocation.increase(1);
        self.stats.active.increase(1);
        self.trace
            .record(TraceAction::Alloc, address, requested, Some(id));
        Some(id)
    }

    /// `DeallocateFreeRegions`: the garbage-collection path.
    fn deallocate_free_regions(&mut self, device: &mut dyn Device, rounded: u64) -> bool {
        if !self.config.garbage_collection {
            return false;
        }
        let mut free_regions = Vec::new();
        let mut total_free = 0;
        for (&address, &(head, size)) in &self.regions {
            let mut id = head;
            let mut any_use = false;
            while id != NIL {
                let c = self.chunks.get(id);
                if c.in_use {
                    any_use = true;
                    break;
                }
                id = c.next;
            }
            if !any_use {
                free_regions.push((address, head, size));
                total_free += size;
            }
        }
        if total_free == 0 {
            return false;
        }
        let available = self.config.memory_limit - self.stats.reserved_bytes.current + total_free;
        if rounded > available {
            return false;
        }
        for (address, head, size) in free_regions {
            // A wholly free region is a single free chunk (free chunks coalesce).
            self.remove_free(head);
            self.chunks.remove(head);
            self.regions.remove(&address);
            self.stats.num_device_free += 1;
            self.trace
                .record(TraceAction::SegmentFree, address, size, None);
            device.free(address, size);
            self.stats.reserved_bytes.decrease(size);
            self.stats.segment.decrease(1);
        }
        true
    }

    /// What a free chunk adds to the inactive-split counters (PyTorch's
    /// definition: a free chunk that shares its region with others). The BFC
    /// allocator keeps no such statistic itself; it is kept so the views of
    /// all frameworks compare.
    fn split_contribution(&self, id: BlockId, sign: i64) -> (i64, i64) {
        let c = self.chunks.get(id);
        if c.has_neighbour() {
            (sign, sign * c.size as i64)
        } else {
            (0, 0)
        }
    }
}

impl Allocator for BfcAllocator {
    fn malloc(
        &mut self,
        device: &mut dyn Device,
        bytes: u64,
    ) -> Result<Option<BlockId>, Box<OutOfMemory>> {
        if bytes == 0 {
            return Ok(None);
        }
        let rounded = rounded_bytes(bytes);
        let found = self.find_chunk(rounded, bytes).or_else(|| {
            if self.extend(device, rounded) {
                self.find_chunk(rounded, bytes)
            } else {
                None
            }
        });
        let found = found.or_else(|| {
            if self.deallocate_free_regions(device, rounded) && self.extend(device, rounded) {
                self.find_chunk(rounded, bytes)
            } else {
                None
            }
        });
        match found {
            Some(id) => Ok(Some(id)),
            None => {
                let (device_free, device_total) = device.mem_get_info();
                self.trace
                    .record(TraceAction::Oom, device_free, rounded, None);
                self.stats.num_ooms += 1;
                Err(Box::new(OutOfMemory {
                    requested: bytes,
                    rounded,
                    alloc_size: rounded,
                    device_free,
                    device_total,
                    process_used: device.process_used_bytes(),
                    other_processes: device.other_processes_bytes(),
                    allocated: self.stats.allocated_bytes.current,
                    reserved: self.stats.reserved_bytes.current,
                    allowed: None,
                    memory_limit: Some(self.config.memory_limit),
                }))
            }
        }
    }

    fn free(&mut self, _device: &mut dyn Device, id: BlockId) {
        let c = self.chunks.get_mut(id);
        debug_assert!(c.in_use, "double free");
        c.in_use = false;
        let (address, size, requested) = (c.address, c.size, c.requested);
        c.requested = 0;
        self.stats.allocated_bytes.decrease(size);
        self.stats.active_bytes.decrease(size);
        self.stats.requested_bytes.decrease(requested);
        self.stats.allocation.decrease(1);
        self.stats.active.decrease(1);
        self.trace
            .record(TraceAction::Free, address, size, Some(id));
        // `TryToCoalesce`: merge the next chunk into this one, then this one
        // into the previous.
        let mut id = id;
        let mut split = (0, 0);
        let next = self.chunks.get(id).next;
        if next != NIL && !self.chunks.get(next).in_use {
            split = self.split_contribution(next, -1);
            self.remove_free(next);
            let n = self.chunks.remove(next);
            let c = self.chunks.get_mut(id);
            c.size += n.size;
            c.next = n.next;
            if n.next != NIL {
                self.chunks.get_mut(n.next).prev = id;
            }
        }
        let prev = self.chunks.get(id).prev;
        if prev != NIL && !self.chunks.get(prev).in_use {
            let (n, b) = self.split_contribution(prev, -1);
            split = (split.0 + n, split.1 + b);
            self.remove_free(prev);
            let c = self.chunks.remove(id);
            let p = self.chunks.get_mut(prev);
            p.size += c.size;
            p.next = c.next;
            if c.next != NIL {
                self.chunks.get_mut(c.next).prev = prev;
            }
            id = prev;
        }
        self.insert_free(id);
        let (n, b) = self.split_contribution(id, 1);
        self.stats.inactive_split.apply(split.0 + n);
        self.stats.inactive_split_bytes.apply(split.1 + b);
    }

    fn empty_cache(&mut self, _device: &mut dyn Device) -> Option<u64> {
        None
    }

    fn stats(&self) -> &AllocatorStats {
        &self.stats
    }

    fn reset_peak_stats(&mut self) {
        self.stats.reset_peaks();
    }

    fn block_size(&self, block: BlockId) -> u64 {
        self.chunks.get(block).size
    }

    fn segments(&self) -> Vec<SegmentView> {
        self.regions
            .iter()
            .map(|(&address, &(head, size))| {
                let mut blocks = Vec::new();
                let mut id = head;
                while id != NIL {
                    let c = self.chunks.get(id);
                    blocks.push(BlockView {
                        id: c.in_use.then_some(id),
                        address: c.address,
                        size: c.size,
                        requested_size: c.requested,
                        state: if c.in_use {
                            BlockState::ActiveAllocated
                        } else {
                            BlockState::Inactive
                        },
                    });
                    id = c.next;
                }
                SegmentView {
                    address,
                    total_size: size,
                    pool: "region",
                    blocks,
                }
            })
            .collect()
    }

    fn drain_trace(&mut self, out: &mut Vec<TraceEvent>) {
        out.append(&mut self.trace.events);
    }

    fn set_tracing(&mut self, on: bool) {
        self.trace.on = on;
    }

    fn check_invariants(&self, device: &dyn Device) -> Result<(), String> {
        let s = &self.stats;
        let (mut pool, mut in_use, mut requested, mut n_in_use) = (0, 0, 0, 0);
        let (mut split_bytes, mut n_split, mut n_free) = (0, 0, 0);
        for (&address, &(head, size)) in &self.regions {
            let (mut id, mut expect, mut prev, mut prev_free) = (head, address, NIL, false);
            while id != NIL {
                let c = self.chunks.get(id);
                if c.address != expect || c.prev != prev {
                    return Err(format!("chunks do not tile region {address:#x}"));
                }
                if c.size % MIN_ALLOCATION_SIZE != 0 {
                    return Err(format!("chunk size {} is not a multiple of 256", c.size));
                }
                if c.in_use {
                    in_use += c.size;
                    requested += c.requested;
                    n_in_use += 1;
                    prev_free = false;
                } else {
                    if prev_free {
                        return Err(format!("two adjacent free chunks in region {address:#x}"));
                    }
                    prev_free = true;
                    n_free += 1;
                    if !self.free.contains(&(c.size, c.address, id)) {
                        return Err("a free chunk is missing from its bin".into());
                    }
                    if c.has_neighbour() {
                        split_bytes += c.size;
                        n_split += 1;
                    }
                }
                expect = c.address + c.size;
                prev = id;
                id = c.next;
            }
            if expect - address != size {
                return Err(format!(
                    "region {address:#x} chunks do not add up to its size"
                ));
            }
            pool += size;
        }
        if n_free != self.free.len() {
            return Err("a bin holds a chunk that is in no region".into());
        }
        let checks = [
            ("pool_bytes", s.reserved_bytes.current, pool),
            ("bytes_in_use", s.allocated_bytes.current, in_use),
            ("requested_bytes", s.requested_bytes.current, requested),
            ("allocation", s.allocation.current, n_in_use),
            ("segment", s.segment.current, self.regions.len() as u64),
            (
                "inactive_split_bytes",
                s.inactive_split_bytes.current,
                split_bytes,
            ),
            ("inactive_split", s.inactive_split.current, n_split),
            ("device segment bytes", device.segment_bytes(), pool),
        ];
        for (name, stat, actual) in checks {
            if stat != actual {
                return Err(format!(
                    "{name} is {stat} but the chunks add up to {actual}"
                ));
            }
        }
        if pool > self.config.memory_limit {
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
    use crate::units::{GIB, KIB};

    fn setup(limit: u64, allow_growth: bool) -> (BfcAllocator, SimDevice) {
        let dev = SimDevice::new(SimDeviceConfig {
            total_bytes: 4 * GIB,
            context_bytes: 0,
            other_processes_bytes: 0,
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

    /// allocators.md §3.5 worked example: allow_growth, 1000 B then 3 MiB.
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

    /// §3.5: a 100 MiB request with curr = 8 MiB doubles curr to 128 MiB,
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
        let oom = a.malloc(&mut dev, 4 * MIB).unwrap_err();
        assert_eq!(oom.rounded, 4 * MIB);
        assert_eq!(oom.memory_limit, Some(8 * MIB));
        assert_eq!(a.stats().num_ooms, 1);
        a.check_invariants(&dev).unwrap();
    }
}
