//! PyTorch's CUDA caching allocator, native backend, one device, one stream.
//!
//! Follows `DeviceCachingAllocator` in `c10/cuda/CUDACachingAllocator.cpp`:
//! `round_size`, `get_pool`, `get_allocation_size`, `get_free_block`,
//! `should_split`, `alloc_found_block`, `free_block` / `try_merge_blocks`,
//! `alloc_block`, `release_available_cached_blocks`, `release_cached_blocks`,
//! `garbage_collect_cached_blocks` and the OOM path of `malloc`, with the
//! statistics of `DeviceStats`. Expandable segments and streams other than
//! the default one are not modelled.

use super::{
    Allocator, AllocatorStats, BlockId, BlockState, BlockView, OutOfMemory, SegmentView, Slab,
    Trace, TraceAction, TraceEvent, NIL,
};
use crate::device::Device;
use crate::units::{round_up, MIB};
use std::collections::{BTreeMap, BTreeSet};

/// Every size is rounded to a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest request served by the small pool, inclusive (`kSmallSize`).
pub const SMALL_SIZE: u64 = MIB;
/// Segment size for small-pool requests (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// Segment size for requests between 1 MiB and 10 MiB (`kLargeBuffer`).
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Requests of at least this get a segment of their own (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Rounding of large segments (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 * MIB;

/// `round_size` with the default `roundup_power2_divisions` (off).
pub fn round_size(size: u64) -> u64 {
    if size < MIN_BLOCK_SIZE {
        MIN_BLOCK_SIZE
    } else {
        round_up(size, MIN_BLOCK_SIZE)
    }
}

/// `get_allocation_size`: how big a new segment is for a rounded size.
pub fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        round_up(size, ROUND_LARGE)
    }
}

/// The two block pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pool {
    Small,
    Large,
}

impl Pool {
    pub fn for_size(rounded: u64) -> Self {
        if rounded <= SMALL_SIZE {
            Pool::Small
        } else {
            Pool::Large
        }
    }

    fn name(self) -> &'static str {
        match self {
            Pool::Small => "small",
            Pool::Large => "large",
        }
    }
}

/// `PYTORCH_CUDA_ALLOC_CONF` options and `set_per_process_memory_fraction`.
#[derive(Clone, Debug, PartialEq)]
pub struct CachingConfig {
    /// `max_split_size_mb` in bytes; `u64::MAX` when unset.
    pub max_split_size: u64,
    /// `garbage_collection_threshold`, 0 when off.
    pub garbage_collection_threshold: f64,
    /// `torch.cuda.set_per_process_memory_fraction`.
    pub memory_fraction: Option<f64>,
}

impl Default for CachingConfig {
    fn default() -> Self {
        Self {
            max_split_size: u64::MAX,
            garbage_collection_threshold: 0.0,
            memory_fraction: None,
        }
    }
}

#[derive(Clone, Debug)]
struct Block {
    address: u64,
    size: u64,
    requested: u64,
    pool: Pool,
    allocated: bool,
    prev: BlockId,
    next: BlockId,
    /// Pool's `get_free_blocks_call_count` when the block entered the pool.
    gc_count_base: u64,
}

impl Block {
    fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
}

/// Free blocks ordered by (size, address): `BlockComparatorSize` on one stream.
#[derive(Clone, Debug, Default)]
struct BlockPool {
    blocks: BTreeSet<(u64, u64, BlockId)>,
    get_free_blocks_call_count: u64,
}

/// The caching allocator of one device.
#[derive(Debug)]
pub struct CachingAllocator {
    config: CachingConfig,
    blocks: Slab<Block>,
    small: BlockPool,
    large: BlockPool,
    /// Segment base address to the block at that address.
    segments: BTreeMap<u64, BlockId>,
    /// `allowed_memory_maximum`, when a fraction is set.
    allowed_maximum: Option<u64>,
    stats: AllocatorStats,
    trace: Trace,
}

impl CachingAllocator {
    pub fn new(config: CachingConfig, device_total: u64) -> Self {
        let allowed_maximum = config
            .memory_fraction
            .map(|f| (f * device_total as f64) as u64);
        Self {
            config,
            blocks: Slab::default(),
            small: BlockPool::default(),
            large: BlockPool::default(),
            segments: BTreeMap::new(),
            allowed_maximum,
            stats: AllocatorStats::default(),
            trace: Trace::default(),
        }
    }

    pub fn config(&self) -> &CachingConfig {
        &self.config
    }

    fn gc_enabled(&self) -> bool {
        self.allowed_maximum.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    fn pool_mut(&mut self, pool: Pool) -> &mut BlockPool {
        match pool {
            Pool::Small => &mut self.small,
            Pool::Large => &mut self.large,
        }
    }

    fn key(&self, id: BlockId) -> (u64, u64, BlockId) {
        let b = self.blocks.get(id);
        (b.size, b.address, id)
    }

    /// `BlockPool::insert_into_blocks`.
    fn insert_into_pool(&mut self, id: BlockId) {
        let pool = self.blocks.get(id).pool;
        let key = self.key(id);
        let p = self.pool_mut(pool);
        let count = p.get_free_blocks_call_count;
        let inserted = p.blocks.insert(key);
        debug_assert!(inserted, "block already in its pool");
        self.blocks.get_mut(id).gc_count_base = count;
    }

    fn remove_from_pool(&mut self, id: BlockId) {
        let pool = self.blocks.get(id).pool;
        let key = self.key(id);
        let removed = self.pool_mut(pool).blocks.remove(&key);
        debug_assert!(removed, "block not in its pool");
    }

    /// `get_free_block`: the smallest cached block that fits, lowest address
    /// first, subject to the oversize rules of `max_split_size`.
    fn get_free_block(&mut self, pool: Pool, size: u64) -> Option<BlockId> {
        let gc = self.gc_enabled();
        let max_split = self.config.max_split_size;
        let p = self.pool_mut(pool);
        if gc {
            p.get_free_blocks_call_count += 1;
        }
        let &(found_size, address, id) = p.blocks.range((size, 0, 0)..).next()?;
        if size < max_split && found_size >= max_split {
            return None;
        }
        if size >= max_split && found_size >= size.saturating_add(LARGE_BUFFER) {
            return None;
        }
        p.blocks.remove(&(found_size, address, id));
        Some(id)
    }

    /// `alloc_block`: a new segment from the driver, as one free block.
    fn alloc_block(
        &mut self,
        device: &mut dyn Device,
        pool: Pool,
        alloc_size: u64,
        is_retry: bool,
    ) -> Option<BlockId> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if let Some(allowed) = self.allowed_maximum {
            if self.stats.reserved_bytes.current + alloc_size > allowed {
                return None;
            }
        }
        let address = device.malloc(alloc_size)?;
        self.stats.num_device_alloc += 1;
        self.stats.segment.increase(1);
        self.stats.reserved_bytes.increase(alloc_size);
        let id = self.blocks.insert(Block {
            address,
            size: alloc_size,
            requested: 0,
            pool,
            allocated: false,
            prev: NIL,
            next: NIL,
            gc_count_base: 0,
        });
        self.segments.insert(address, id);
        self.trace
            .record(TraceAction::SegmentAlloc, address, alloc_size, None);
        Some(id)
    }

    /// `release_block`: `cudaFree` of a whole free segment.
    fn release_block(&mut self, device: &mut dyn Device, id: BlockId) {
        let block = self.blocks.get(id);
        debug_assert!(!block.allocated && !block.is_split());
        let (address, size) = (block.address, block.size);
        self.remove_from_pool(id);
        self.blocks.remove(id);
        self.segments.remove(&address);
        self.stats.num_device_free += 1;
        self.trace
            .record(TraceAction::SegmentFree, address, size, None);
        device.free(address, size);
        self.stats.segment.decrease(1);
        self.stats.reserved_bytes.decrease(size);
    }

    /// `release_blocks` of one pool: every whole free segment, smallest first.
    fn release_pool(&mut self, device: &mut dyn Device, pool: Pool) -> u64 {
        let whole: Vec<BlockId> = match pool {
            Pool::Small => &self.small,
            Pool::Large => &self.large,
        }
        .blocks
        .iter()
        .map(|&(_, _, id)| id)
        .filter(|&id| !self.blocks.get(id).is_split())
        .collect();
        let mut released = 0;
        for id in whole {
            released += self.blocks.get(id).size;
            self.release_block(device, id);
        }
        released
    }

    /// `release_cached_blocks`: large pool, then small pool.
    fn release_cached_blocks(&mut self, device: &mut dyn Device) -> u64 {
        self.release_pool(device, Pool::Large) + self.release_pool(device, Pool::Small)
    }

    /// `release_available_cached_blocks`: only with `max_split_size_mb` set,
    /// frees one cached oversize block big enough for the request, or the
    /// largest oversize blocks until their sizes cover it.
    fn release_available_cached_blocks(
        &mut self,
        device: &mut dyn Device,
        pool: Pool,
        size: u64,
    ) -> bool {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key_size = size.max(max_split);
        let p = match pool {
            Pool::Small => &self.small,
            Pool::Large => &self.large,
        };
        // Only whole segments can go back to the driver; an oversize block is
        // never split by a request, so this matches PyTorch in practice.
        if let Some(&(_, _, id)) = p.blocks.range((key_size, 0, 0)..).next() {
            if !self.blocks.get(id).is_split() {
                self.release_block(device, id);
                return true;
            }
            return false;
        }
        let candidates: Vec<(u64, BlockId)> = p
            .blocks
            .range(..(key_size, 0, 0))
            .rev()
            .take_while(|&&(s, _, _)| s >= max_split)
            .map(|&(s, _, id)| (s, id))
            .collect();
        let mut released = 0;
        for (s, id) in candidates {
            if released >= key_size {
                break;
            }
            if !self.blocks.get(id).is_split() {
                self.release_block(device, id);
                released += s;
            }
        }
        released >= key_size
    }

    /// `garbage_collect_cached_blocks`: frees whole free large-pool segments
    /// of at least average age until reserved falls under the threshold.
    fn garbage_collect(&mut self, device: &mut dyn Device) {
        let Some(allowed) = self.allowed_maximum else {
            return;
        };
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        let reserved = self.stats.reserved_bytes.current;
        if reserved <= threshold {
            return;
        }
        let target = reserved - threshold;
        let now = self.large.get_free_blocks_call_count;
        let age = |b: &Block| now - b.gc_count_base;
        let mut total_age = 0u64;
        let mut freeable = 0u64;
        for &(_, _, id) in &self.large.blocks {
            let b = self.blocks.get(id);
            if !b.is_split() {
                total_age += age(b);
                freeable += 1;
            }
        }
        if freeable == 0 {
            return;
        }
        let mut reclaimed = 0;
        let mut block_freed = true;
        while reclaimed < target && block_freed && freeable > 0 {
            let age_threshold = total_age as f64 / freeable as f64;
            block_freed = false;
            let victims: Vec<BlockId> = self
                .large
                .blocks
                .iter()
                .map(|&(_, _, id)| id)
                .filter(|&id| {
                    let b = self.blocks.get(id);
                    !b.is_split() && age(b) as f64 >= age_threshold
                })
                .collect();
            for id in victims {
                let b = self.blocks.get(id);
                block_freed = true;
                reclaimed += b.size;
                total_age -= age(b);
                freeable -= 1;
                self.release_block(device, id);
            }
        }
    }

    /// `alloc_found_block`: split if worth it and hand out the low part.
    fn alloc_found_block(&mut self, id: BlockId, size: u64, requested: u64) -> BlockId {
        let max_split = self.config.max_split_size;
        let block = self.blocks.get(id);
        let remaining = block.size - size;
        let split = match block.pool {
            Pool::Small => remaining >= MIN_BLOCK_SIZE,
            Pool::Large => size < max_split && remaining > SMALL_SIZE,
        };
        let already_split = block.is_split();
        if split {
            let (pool, address, next) = (block.pool, block.address, block.next);
            let rest = self.blocks.insert(Block {
                address: address + size,
                size: remaining,
                requested: 0,
                pool,
                allocated: false,
                prev: id,
                next,
                gc_count_base: 0,
            });
            if next != NIL {
                self.blocks.get_mut(next).prev = rest;
            }
            let b = self.blocks.get_mut(id);
            b.next = rest;
            b.size = size;
            self.insert_into_pool(rest);
            if already_split {
                // An inactive split block shrinks by `size`.
                self.stats.inactive_split_bytes.decrease(size);
            } else {
                // A new inactive split block of `remaining` bytes appears.
                self.stats.inactive_split_bytes.increase(remaining);
                self.stats.inactive_split.increase(1);
            }
        } else if already_split {
            let size = self.blocks.get(id).size;
            self.stats.inactive_split_bytes.decrease(size);
            self.stats.inactive_split.decrease(1);
        }
        let b = self.blocks.get_mut(id);
        b.allocated = true;
        b.requested = requested;
        let (address, block_size) = (b.address, b.size);
        self.stats.allocation.increase(1);
        self.stats.allocated_bytes.increase(block_size);
        self.stats.active.increase(1);
        self.stats.active_bytes.increase(block_size);
        self.stats.requested_bytes.increase(requested);
        self.trace
            .record(TraceAction::Alloc, address, requested, Some(id));
        id
    }

    /// `free_block`: merge with free neighbours, back into the pool.
    fn free_block(&mut self, id: BlockId) {
        let (size, requested) = {
            let b = self.blocks.get(id);
            (b.size, b.requested)
        };
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        let mut id = id;
        // Previous neighbour: the lower block absorbs this one.
        let prev = self.blocks.get(id).prev;
        if prev != NIL && !self.blocks.get(prev).allocated {
            self.remove_from_pool(prev);
            let b = self.blocks.remove(id);
            let p = self.blocks.get_mut(prev);
            net_blocks -= 1;
            net_bytes -= p.size as i64;
            p.size += b.size;
            p.next = b.next;
            if b.next != NIL {
                self.blocks.get_mut(b.next).prev = prev;
            }
            id = prev;
        }
        // Next neighbour: this block absorbs it.
        let next = self.blocks.get(id).next;
        if next != NIL && !self.blocks.get(next).allocated {
            self.remove_from_pool(next);
            let n = self.blocks.remove(next);
            net_blocks -= 1;
            net_bytes -= n.size as i64;
            let b = self.blocks.get_mut(id);
            b.size += n.size;
            b.next = n.next;
            if n.next != NIL {
                self.blocks.get_mut(n.next).prev = id;
            }
        }
        self.insert_into_pool(id);
        let b = self.blocks.get(id);
        if b.is_split() {
            net_blocks += 1;
            net_bytes += b.size as i64;
        }
        self.stats.inactive_split.apply(net_blocks);
        self.stats.inactive_split_bytes.apply(net_bytes);
        self.stats.active.decrease(1);
        self.stats.active_bytes.decrease(size);
        self.stats.requested_bytes.decrease(requested);
    }

    fn out_of_memory(
        &mut self,
        device: &dyn Device,
        requested: u64,
        size: u64,
        alloc_size: u64,
    ) -> Box<OutOfMemory> {
        let (device_free, device_total) = device.mem_get_info();
        self.trace.record(TraceAction::Oom, device_free, size, None);
        self.stats.num_ooms += 1;
        Box::new(OutOfMemory {
            requested,
            rounded: size,
            alloc_size,
            device_free,
            device_total,
            process_used: device.process_used_bytes(),
            other_processes: device.other_processes_bytes(),
            allocated: self.stats.allocated_bytes.current,
            reserved: self.stats.reserved_bytes.current,
            allowed: self.allowed_maximum,
            memory_limit: None,
        })
    }
}

impl Allocator for CachingAllocator {
    fn malloc(
        &mut self,
        device: &mut dyn Device,
        requested: u64,
    ) -> Result<Option<BlockId>, Box<OutOfMemory>> {
        if requested == 0 {
            return Ok(None);
        }
        let size = round_size(requested);
        let pool = Pool::for_size(size);
        let alloc_size = allocation_size(size);
        let id = match self.get_free_block(pool, size) {
            Some(id) => id,
            None => {
                if self.gc_enabled() {
                    self.garbage_collect(device);
                }
                let got = match self.alloc_block(device, pool, alloc_size, false) {
                    Some(id) => Some(id),
                    None if self.release_available_cached_blocks(device, pool, size) => {
                        self.alloc_block(device, pool, alloc_size, false)
                    }
                    None => None,
                };
                let got = match got {
                    Some(id) => Some(id),
                    None => {
                        self.release_cached_blocks(device);
                        self.alloc_block(device, pool, alloc_size, true)
                    }
                };
                match got {
                    Some(id) => id,
                    None => return Err(self.out_of_memory(device, requested, size, alloc_size)),
                }
            }
        };
        Ok(Some(self.alloc_found_block(id, size, requested)))
    }

    fn free(&mut self, _device: &mut dyn Device, id: BlockId) {
        let b = self.blocks.get_mut(id);
        debug_assert!(b.allocated, "double free");
        b.allocated = false;
        let (address, size) = (b.address, b.size);
        self.stats.allocation.decrease(1);
        self.stats.allocated_bytes.decrease(size);
        self.trace
            .record(TraceAction::Free, address, size, Some(id));
        self.free_block(id);
    }

    fn empty_cache(&mut self, device: &mut dyn Device) -> Option<u64> {
        Some(self.release_cached_blocks(device))
    }

    fn stats(&self) -> &AllocatorStats {
        &self.stats
    }

    fn reset_peak_stats(&mut self) {
        self.stats.reset_peaks();
    }

    fn block_size(&self, id: BlockId) -> u64 {
        self.blocks.get(id).size
    }

    fn segments(&self) -> Vec<SegmentView> {
        self.segments
            .iter()
            .map(|(&address, &head)| {
                let mut blocks = Vec::new();
                let mut total = 0;
                let mut id = head;
                let pool = self.blocks.get(head).pool;
                while id != NIL {
                    let b = self.blocks.get(id);
                    total += b.size;
                    blocks.push(BlockView {
                        id: b.allocated.then_some(id),
                        address: b.address,
                        size: b.size,
                        requested_size: if b.allocated { b.requested } else { 0 },
                        state: if b.allocated {
                            BlockState::ActiveAllocated
                        } else {
                            BlockState::Inactive
                        },
                    });
                    id = b.next;
                }
                SegmentView {
                    address,
                    total_size: total,
                    pool: pool.name(),
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
        let mut reserved = 0;
        let mut allocated = 0;
        let mut requested = 0;
        let mut n_alloc = 0;
        let mut inactive_split = 0;
        let mut n_inactive_split = 0;
        let mut free_in_pools = 0;
        for (&address, &head) in &self.segments {
            let mut id = head;
            let mut expect = address;
            let mut prev = NIL;
            let mut prev_free = false;
            let pool = self.blocks.get(head).pool;
            while id != NIL {
                let b = self.blocks.get(id);
                if b.address != expect {
                    return Err(format!("blocks do not tile segment {address:#x}"));
                }
                if b.prev != prev {
                    return Err(format!("broken prev link in segment {address:#x}"));
                }
                if b.pool != pool {
                    return Err("a segment mixes pools".into());
                }
                if b.size % MIN_BLOCK_SIZE != 0 {
                    return Err(format!("block size {} is not a multiple of 512", b.size));
                }
                if b.allocated {
                    allocated += b.size;
                    requested += b.requested;
                    n_alloc += 1;
                    if b.requested > b.size {
                        return Err("requested size exceeds block size".into());
                    }
                    if Pool::for_size(round_size(b.requested)) != b.pool {
                        return Err("a block serves a request of the other pool".into());
                    }
                    prev_free = false;
                } else {
                    if prev_free {
                        return Err(format!("two adjacent free blocks in segment {address:#x}"));
                    }
                    prev_free = true;
                    free_in_pools += 1;
                    let key = (b.size, b.address, id);
                    let in_pool = match b.pool {
                        Pool::Small => self.small.blocks.contains(&key),
                        Pool::Large => self.large.blocks.contains(&key),
                    };
                    if !in_pool {
                        return Err("a free block is missing from its pool".into());
                    }
                    if b.is_split() {
                        inactive_split += b.size;
                        n_inactive_split += 1;
                    }
                }
                expect = b.address + b.size;
                prev = id;
                id = b.next;
            }
            reserved += expect - address;
        }
        if free_in_pools != self.small.blocks.len() + self.large.blocks.len() {
            return Err("a pool holds a block that is not in any segment".into());
        }
        let checks = [
            ("reserved_bytes", s.reserved_bytes.current, reserved),
            ("allocated_bytes", s.allocated_bytes.current, allocated),
            ("active_bytes", s.active_bytes.current, allocated),
            ("requested_bytes", s.requested_bytes.current, requested),
            ("allocation", s.allocation.current, n_alloc),
            ("segment", s.segment.current, self.segments.len() as u64),
            (
                "inactive_split_bytes",
                s.inactive_split_bytes.current,
                inactive_split,
            ),
            ("inactive_split", s.inactive_split.current, n_inactive_split),
            ("device segment bytes", device.segment_bytes(), reserved),
        ];
        for (name, stat, actual) in checks {
            if stat != actual {
                return Err(format!(
                    "{name} is {stat} but the blocks add up to {actual}"
                ));
            }
        }
        if !(s.requested_bytes.current <= s.allocated_bytes.current
            && s.allocated_bytes.current <= s.active_bytes.current
            && s.active_bytes.current <= s.reserved_bytes.current)
        {
            return Err("requested <= allocated <= active <= reserved does not hold".into());
        }
        for stat in [&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes] {
            if stat.peak < stat.current {
                return Err("a peak is below its current value".into());
            }
        }
        if let Some(allowed) = self.allowed_maximum {
            if s.reserved_bytes.current > allowed {
                return Err("reserved exceeds the per-process memory fraction".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{SimDevice, SimDeviceConfig};
    use crate::units::GIB;

    fn setup(total: u64) -> (CachingAllocator, SimDevice) {
        let dev = SimDevice::new(SimDeviceConfig {
            total_bytes: total,
            context_bytes: 0,
            other_processes_bytes: 0,
        });
        (CachingAllocator::new(CachingConfig::default(), total), dev)
    }

    fn block_sizes(a: &CachingAllocator) -> Vec<Vec<(u64, bool)>> {
        a.segments()
            .iter()
            .map(|s| {
                s.blocks
                    .iter()
                    .map(|b| (b.size, b.state == BlockState::ActiveAllocated))
                    .collect()
            })
            .collect()
    }

    /// allocators.md §1.4: request, rounded, pool, new segment, split, block handed out.
    #[test]
    fn worked_examples_of_section_1_4() {
        let cases: [(u64, u64, Pool, u64, bool, u64); 7] = [
            (1, 512, Pool::Small, 2 * MIB, true, 512),
            (1_000_000, 1_000_448, Pool::Small, 2 * MIB, true, 1_000_448),
            (MIB, MIB, Pool::Small, 2 * MIB, true, MIB),
            (MIB + 1, MIB + 512, Pool::Large, 20 * MIB, true, MIB + 512),
            (5 * MIB, 5 * MIB, Pool::Large, 20 * MIB, true, 5 * MIB),
            (
                10 * MIB + MIB / 2,
                10 * MIB + MIB / 2,
                Pool::Large,
                12 * MIB,
                true,
                10 * MIB + MIB / 2,
            ),
            (15 * MIB, 15 * MIB, Pool::Large, 16 * MIB, false, 16 * MIB),
        ];
        for (request, rounded, pool, segment, split, handed) in cases {
            assert_eq!(round_size(request), rounded, "round_size({request})");
            assert_eq!(Pool::for_size(rounded), pool, "pool of {request}");
            assert_eq!(allocation_size(rounded), segment, "segment for {request}");
            let (mut a, mut dev) = setup(GIB);
            let id = a.malloc(&mut dev, request).unwrap().unwrap();
            assert_eq!(a.block_size(id), handed, "block for {request}");
            assert_eq!(a.stats().reserved_bytes.current, segment);
            assert_eq!(a.stats().allocated_bytes.current, handed);
            assert_eq!(a.stats().requested_bytes.current, request);
            let segs = a.segments();
            assert_eq!(
                segs[0].blocks.len(),
                if split { 2 } else { 1 },
                "split of {request}"
            );
            assert_eq!(a.stats().inactive_split_bytes.current, segment - handed);
            a.check_invariants(&dev).unwrap();
        }
    }

    #[test]
    fn zero_bytes_touch_nothing() {
        let (mut a, mut dev) = setup(GIB);
        assert_eq!(a.malloc(&mut dev, 0).unwrap(), None);
        assert_eq!(a.stats(), &AllocatorStats::default());
    }

    #[test]
    fn best_fit_takes_smallest_then_lowest_address() {
        let (mut a, mut dev) = setup(GIB);
        // Three 12 MiB segments, then free the first and third: equal sizes, so the
        // lower address wins.
        let x = a.malloc(&mut dev, 12 * MIB).unwrap().unwrap();
        let y = a.malloc(&mut dev, 12 * MIB).unwrap().unwrap();
        let z = a.malloc(&mut dev, 12 * MIB).unwrap().unwrap();
        let addr = |a: &CachingAllocator, id| {
            a.segments()
                .iter()
                .flat_map(|s| s.blocks.clone())
                .find(|b| b.id == Some(id))
                .unwrap()
                .address
        };
        let x_addr = addr(&a, x);
        a.free(&mut dev, z);
        a.free(&mut dev, x);
        let w = a.malloc(&mut dev, 11 * MIB).unwrap().unwrap();
        assert_eq!(addr(&a, w), x_addr);
        let _ = y;
        a.check_invariants(&dev).unwrap();
    }

    #[test]
    fn free_merges_neighbours_and_keeps_the_segment() {
        let (mut a, mut dev) = setup(GIB);
        let x = a.malloc(&mut dev, 512).unwrap().unwrap();
        let y = a.malloc(&mut dev, 512).unwrap().unwrap();
        assert_eq!(
            block_sizes(&a),
            vec![vec![(512, true), (512, true), (2 * MIB - 1024, false)]]
        );
        a.free(&mut dev, x);
        assert_eq!(a.stats().inactive_split_bytes.current, 2 * MIB - 512);
        assert_eq!(a.stats().inactive_split.current, 2);
        a.free(&mut dev, y);
        assert_eq!(block_sizes(&a), vec![vec![(2 * MIB, false)]]);
        assert_eq!(a.stats().inactive_split_bytes.current, 0);
        assert_eq!(a.stats().allocated_bytes.current, 0);
        assert_eq!(a.stats().reserved_bytes.current, 2 * MIB);
        a.check_invariants(&dev).unwrap();
    }

    #[test]
    fn empty_cache_releases_only_whole_free_segments() {
        let (mut a, mut dev) = setup(GIB);
        let x = a.malloc(&mut dev, 5 * MIB).unwrap().unwrap(); // 20 MiB segment
        let _y = a.malloc(&mut dev, 512).unwrap().unwrap(); // 2 MiB segment, stays live
        let z = a.malloc(&mut dev, 30 * MIB).unwrap().unwrap(); // 30 MiB segment
        a.free(&mut dev, x);
        a.free(&mut dev, z);
        assert_eq!(a.stats().reserved_bytes.current, 52 * MIB);
        assert_eq!(a.empty_cache(&mut dev), Some(50 * MIB));
        assert_eq!(a.stats().reserved_bytes.current, 2 * MIB);
        assert_eq!(a.stats().allocated_bytes.current, 512);
        // The free tail of the live small segment stays as inactive split.
        assert_eq!(a.stats().inactive_split_bytes.current, 2 * MIB - 512);
        assert_eq!(dev.segment_bytes(), 2 * MIB);
        a.check_invariants(&dev).unwrap();
    }

    #[test]
    fn release_and_retry_once_then_oom() {
        let (mut a, mut dev) = setup(100 * MIB);
        let x = a.malloc(&mut dev, 40 * MIB).unwrap().unwrap();
        let _y = a.malloc(&mut dev, 40 * MIB).unwrap().unwrap();
        a.free(&mut dev, x);
        // 60 MiB: nothing cached fits, cudaMalloc fails (20 MiB free), release frees
        // the 40 MiB segment, the retry succeeds.
        let z = a.malloc(&mut dev, 60 * MIB).unwrap().unwrap();
        assert_eq!(a.stats().num_alloc_retries, 1);
        assert_eq!(a.stats().num_ooms, 0);
        assert_eq!(a.block_size(z), 60 * MIB);
        // Now nothing can be released: one more retry, then OOM.
        let oom = a.malloc(&mut dev, 10 * MIB).unwrap_err();
        assert_eq!(a.stats().num_alloc_retries, 2);
        assert_eq!(a.stats().num_ooms, 1);
        assert_eq!(oom.alloc_size, 10 * MIB);
        assert_eq!(oom.device_free, 0);
        a.check_invariants(&dev).unwrap();
    }

    #[test]
    fn oom_despite_enough_free_plus_cached_memory() {
        // Fragmentation: two 1 MiB holes inside a live segment cannot hold 2 MiB.
        let (mut a, mut dev) = setup(20 * MIB);
        let ids: Vec<_> = (0..4)
            .map(|_| a.malloc(&mut dev, 4 * MIB).unwrap().unwrap())
            .collect();
        // One 20 MiB segment: 4 x 4 MiB used, 4 MiB free at the end.
        a.free(&mut dev, ids[0]);
        a.free(&mut dev, ids[2]);
        // 12 MiB free in three 4 MiB holes, device has nothing left.
        let oom = a.malloc(&mut dev, 6 * MIB).unwrap_err();
        assert_eq!(oom.alloc_size, 20 * MIB);
        assert_eq!(oom.reserved - oom.allocated, 12 * MIB);
        a.check_invariants(&dev).unwrap();
    }

    #[test]
    fn memory_fraction_limits_reserved_without_calling_the_driver() {
        let dev_total = GIB;
        let mut dev = SimDevice::new(SimDeviceConfig {
            total_bytes: dev_total,
            context_bytes: 0,
            other_processes_bytes: 0,
        });
        let mut a = CachingAllocator::new(
            CachingConfig {
                memory_fraction: Some(0.5),
                ..Default::default()
            },
            dev_total,
        );
        a.malloc(&mut dev, 500 * MIB).unwrap();
        let oom = a.malloc(&mut dev, 100 * MIB).unwrap_err();
        assert_eq!(oom.allowed, Some(512 * MIB));
        assert_eq!(a.stats().num_device_alloc, 1);
        a.check_invariants(&dev).unwrap();
    }

    #[test]
    fn max_split_size_keeps_oversize_blocks_whole() {
        let (mut a, mut dev) = setup(GIB);
        a.config.max_split_size = 20 * MIB;
        let x = a.malloc(&mut dev, 100 * MIB).unwrap().unwrap();
        a.free(&mut dev, x);
        // A small request never gets the oversize block: a new 20 MiB segment.
        let y = a.malloc(&mut dev, 5 * MIB).unwrap().unwrap();
        assert_eq!(a.stats().reserved_bytes.current, 120 * MIB);
        // A large request within 20 MiB of it reuses it whole, unsplit.
        let z = a.malloc(&mut dev, 90 * MIB).unwrap().unwrap();
        assert_eq!(a.block_size(z), 100 * MIB);
        let _ = y;
        a.check_invariants(&dev).unwrap();
    }

    #[test]
    fn garbage_collection_threshold_frees_old_segments() {
        let dev_total = GIB;
        let mut dev = SimDevice::new(SimDeviceConfig {
            total_bytes: dev_total,
            context_bytes: 0,
            other_processes_bytes: 0,
        });
        let mut a = CachingAllocator::new(
            CachingConfig {
                memory_fraction: Some(1.0),
                garbage_collection_threshold: 0.5,
                ..Default::default()
            },
            dev_total,
        );
        let ids: Vec<_> = (0..6)
            .map(|_| a.malloc(&mut dev, 100 * MIB).unwrap().unwrap())
            .collect();
        for id in ids {
            a.free(&mut dev, id);
        }
        assert_eq!(a.stats().reserved_bytes.current, 600 * MIB);
        // Needs a new segment: reserved (600 MiB) > 0.5 x 1 GiB, so GC frees
        // free segments before asking the driver.
        a.malloc(&mut dev, 200 * MIB).unwrap();
        assert!(a.stats().reserved_bytes.current <= 512 * MIB + 200 * MIB);
        assert!(a.stats().num_device_free > 0);
        a.check_invariants(&dev).unwrap();
    }
}
