//! PyTorch's CUDA caching allocator, native backend, one device, one stream.
//!
//! Follows `DeviceCachingAllocator` in `c10/cuda/CUDACachingAllocator.cpp`:
//! `round_size`, `get_pool`, `get_allocation_size`, `get_free_block`,
//! `should_split`, `alloc_found_block`, `free_block` / `try_merge_blocks`,
//! `alloc_block`, `release_available_cached_blocks`, `release_cached_blocks`,
//! `garbage_collect_cached_blocks` and the OOM path of `malloc`, with the
//! statistics of `DeviceStats`. Expandable segments and streams other than
//! the default one are not modelled.

use super::arena::{Arena, Block};
use super::private_pools::PrivatePools;
use super::roundup::RoundupDivisions;
use super::Mismatch;
use super::{
    device_malloc, AllocError, Allocator, AllocatorStats, BlockId, PoolKind, SegmentView,
    TraceEvent,
};
use crate::device::Device;
#[cfg(debug_assertions)]
use vramlab_core::error::Broken;
use vramlab_core::units::{round_up, MIB};

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

/// `round_size`: at least 512 bytes; with `roundup_power2_divisions` set
/// for the size's interval (`divisions` > 1) and a size above 512 ×
/// divisions, up to the next of `divisions` equal steps between the powers
/// of two around it (`roundup_power2_next_division`); else up to a multiple
/// of 512.
pub fn round_size(size: u64, roundup: &RoundupDivisions) -> u64 {
    let divisions = roundup.for_size(size);
    if size < MIN_BLOCK_SIZE {
        MIN_BLOCK_SIZE
    } else if divisions > 1 && size > MIN_BLOCK_SIZE * divisions {
        roundup_power2_next_division(size, divisions)
    } else {
        round_up(size, MIN_BLOCK_SIZE)
    }
}

/// `roundup_power2_next_division`: a power of two stays; otherwise the
/// interval from the power of two below up to twice it is cut into
/// `divisions` steps (a power of two itself), and the size rounds up to one.
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let rounded_down = size & !(step - 1);
    if rounded_down == size {
        size
    } else {
        rounded_down + step
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

/// `get_pool`: the small pool serves requests up to 1 MiB.
pub fn pool_for_size(rounded: u64) -> PoolKind {
    if rounded <= SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
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
    /// `roundup_power2_divisions`, per size interval.
    pub roundup_power2_divisions: RoundupDivisions,
}

impl CachingConfig {
    /// `allowed_memory_maximum` (`setMemoryFraction`): the fraction of the
    /// device's total memory, when a fraction is set.
    pub fn allowed_maximum(&self, device_total: u64) -> Option<u64> {
        self.memory_fraction
            .map(|f| (f * device_total as f64) as u64)
    }
}

impl Default for CachingConfig {
    fn default() -> Self {
        Self {
            max_split_size: u64::MAX,
            garbage_collection_threshold: 0.0,
            memory_fraction: None,
            roundup_power2_divisions: RoundupDivisions::default(),
        }
    }
}

/// The caching allocator of one device: the policy over a block arena.
#[derive(Clone, Debug)]
pub struct CachingAllocator {
    config: CachingConfig,
    arena: Arena,
    /// `allowed_memory_maximum`, when a fraction is set.
    allowed_maximum: Option<u64>,
    /// CUDA graphs' private pools among the streams.
    private_pools: PrivatePools,
}

impl CachingAllocator {
    pub fn new(config: CachingConfig, device_total: u64) -> Self {
        let allowed_maximum = config.allowed_maximum(device_total);
        Self {
            config,
            arena: Arena::default(),
            allowed_maximum,
            private_pools: PrivatePools::default(),
        }
    }

    pub fn config(&self) -> &CachingConfig {
        &self.config
    }

    /// Which streams' blocks are CUDA graphs' private pools, and whether
    /// each is freeable.
    pub fn private_pools_mut(&mut self) -> &mut PrivatePools {
        &mut self.private_pools
    }

    fn gc_enabled(&self) -> bool {
        self.allowed_maximum.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    /// `get_free_block`: the smallest cached block that fits, lowest address
    /// first, subject to the oversize rules of `max_split_size`.
    fn get_free_block(&mut self, pool: PoolKind, size: u64, stream: u64) -> Option<BlockId> {
        if self.gc_enabled() {
            self.arena.free_blocks_mut(pool).lookups += 1;
        }
        let max_split = self.config.max_split_size;
        let (found_size, id) = self.arena.best_fit(pool, size, stream)?;
        if size < max_split && found_size >= max_split {
            return None;
        }
        if size >= max_split && found_size >= size.saturating_add(LARGE_BUFFER) {
            return None;
        }
        self.arena.take_free(id);
        Some(id)
    }

    /// `alloc_block`: a new segment from the driver, as one free block.
    fn alloc_block(
        &mut self,
        device: &mut dyn Device,
        pool: PoolKind,
        (alloc_size, stream): (u64, u64),
        is_retry: bool,
    ) -> Result<Option<BlockId>, AllocError> {
        if is_retry {
            self.arena.stats.num_alloc_retries += 1;
        }
        if let Some(allowed) = self.allowed_maximum {
            if self.arena.stats.reserved_bytes.current + alloc_size > allowed {
                return Ok(None);
            }
        }
        let Some(address) = device_malloc(device, alloc_size)? else {
            return Ok(None);
        };
        Ok(Some(
            self.arena.add_segment(address, alloc_size, pool, stream),
        ))
    }

    /// `release_blocks` of one pool: every whole free segment, smallest
    /// first, but a live CUDA graph's private pool's.
    fn release_pool(&mut self, device: &mut dyn Device, pool: PoolKind) -> u64 {
        let whole: Vec<BlockId> = self
            .arena
            .free_blocks(pool)
            .blocks
            .iter()
            .map(|&(_, _, id)| id)
            .filter(|&id| !self.arena.block(id).is_split())
            .filter(|&id| self.private_pools.releasable(self.arena.block(id).stream))
            .collect();
        whole
            .into_iter()
            .map(|id| self.arena.release_segment(device, id))
            .sum()
    }

    /// `release_cached_blocks`: large pool, then small pool.
    fn release_cached_blocks(&mut self, device: &mut dyn Device) -> u64 {
        self.release_pool(device, PoolKind::Large) + self.release_pool(device, PoolKind::Small)
    }

    /// `release_available_cached_blocks`: only with `max_split_size_mb` set,
    /// frees one cached oversize block big enough for the request, or the
    /// largest oversize blocks until their sizes cover it.
    fn release_available_cached_blocks(
        &mut self,
        device: &mut dyn Device,
        pool: PoolKind,
        (size, stream): (u64, u64),
    ) -> bool {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key_size = size.max(max_split);
        // Only whole segments can go back to the driver; an oversize block is
        // never split by a request, so this matches PyTorch in practice.
        if let Some((_, id)) = self.arena.best_fit(pool, key_size, stream) {
            if self.arena.block(id).is_split() {
                return false;
            }
            self.arena.release_segment(device, id);
            return true;
        }
        let candidates: Vec<(u64, BlockId)> = self
            .arena
            .free_blocks(pool)
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
            if !self.arena.block(id).is_split() {
                self.arena.release_segment(device, id);
                released += s;
            }
        }
        released >= key_size
    }

    /// `garbage_collect_cached_blocks`: frees whole free large-pool segments
    /// of at least average age until reserved falls under the threshold. A
    /// pass frees every block over the age threshold, even past the target.
    fn garbage_collect(&mut self, device: &mut dyn Device) {
        let Some(allowed) = self.allowed_maximum else {
            return;
        };
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        let reserved = self.arena.stats.reserved_bytes.current;
        if reserved <= threshold {
            return;
        }
        let target = reserved - threshold;
        let large = self.arena.free_blocks(PoolKind::Large);
        let now = large.lookups;
        let age = |b: &Block| now - b.stamp;
        let private_pools = &self.private_pools;
        let whole = |arena: &Arena| -> Vec<BlockId> {
            let large = arena.free_blocks(PoolKind::Large);
            large
                .blocks
                .iter()
                .map(|&(_, _, id)| id)
                .filter(|&id| !arena.block(id).is_split())
                .filter(|&id| private_pools.is_default(arena.block(id).stream))
                .collect()
        };
        let candidates = whole(&self.arena);
        let mut total_age: u64 = candidates.iter().map(|&id| age(self.arena.block(id))).sum();
        let mut freeable = candidates.len() as u64;
        let (mut reclaimed, mut block_freed) = (0, true);
        while reclaimed < target && block_freed && freeable > 0 {
            let age_threshold = total_age as f64 / freeable as f64;
            block_freed = false;
            for id in whole(&self.arena) {
                let b = self.arena.block(id);
                if (age(b) as f64) < age_threshold {
                    continue;
                }
                block_freed = true;
                total_age -= age(b);
                freeable -= 1;
                reclaimed += self.arena.release_segment(device, id);
            }
        }
    }

    /// `should_split` for a found block and a rounded request.
    fn should_split(&self, id: BlockId, size: u64) -> bool {
        let block = self.arena.block(id);
        let remaining = block.size - size;
        match block.pool {
            PoolKind::Small => remaining >= MIN_BLOCK_SIZE,
            _ => size < self.config.max_split_size && remaining > SMALL_SIZE,
        }
    }

    /// A cached block, or a new segment after the release-and-retry steps.
    fn find_or_grow(
        &mut self,
        device: &mut dyn Device,
        (requested, size, stream): (u64, u64, u64),
    ) -> Result<BlockId, AllocError> {
        let pool = pool_for_size(size);
        if let Some(id) = self.get_free_block(pool, size, stream) {
            return Ok(id);
        }
        if self.gc_enabled() {
            self.garbage_collect(device);
        }
        let alloc_size = allocation_size(size);
        let mut got = self.alloc_block(device, pool, (alloc_size, stream), false)?;
        if got.is_none() && self.release_available_cached_blocks(device, pool, (size, stream)) {
            got = self.alloc_block(device, pool, (alloc_size, stream), false)?;
        }
        if got.is_none() {
            self.release_cached_blocks(device);
            got = self.alloc_block(device, pool, (alloc_size, stream), true)?;
        }
        got.ok_or_else(|| {
            AllocError::OutOfMemory(self.arena.out_of_memory(
                device,
                (requested, size, alloc_size),
                self.allowed_maximum,
                None,
            ))
        })
    }
}

impl CachingAllocator {
    /// `malloc` on a given CUDA stream: only that stream's cached blocks
    /// serve it, and a new segment belongs to it.
    pub fn malloc_on(
        &mut self,
        device: &mut dyn Device,
        requested: u64,
        stream: u64,
    ) -> Result<Option<BlockId>, AllocError> {
        if requested == 0 {
            return Ok(None);
        }
        let size = round_size(requested, &self.config.roundup_power2_divisions);
        let id = self.find_or_grow(device, (requested, size, stream))?;
        let split = self.should_split(id, size);
        Ok(Some(self.arena.allocate(id, size, requested, split)))
    }
}

/// Rebuilding a recorded state (a snapshot's segments and live blocks)
/// before replaying what happened after it.
impl CachingAllocator {
    /// A segment of `size` bytes for `pool` and `stream`, where the device
    /// puts its next segment (see `SimDevice::place_next`); returns its
    /// address.
    pub fn seed_segment(
        &mut self,
        device: &mut dyn Device,
        size: u64,
        (pool, stream): (PoolKind, u64),
    ) -> Result<u64, AllocError> {
        let address = device_malloc(device, size)?.ok_or_else(|| {
            AllocError::Driver(format!("the device has no room for a {size}-byte segment"))
        })?;
        let id = self.arena.add_segment(address, size, pool, stream);
        self.arena.insert_free(id);
        Ok(address)
    }

    /// A live block of exactly `size` bytes at `address`, inside free space
    /// of a seeded segment.
    pub fn seed_block(
        &mut self,
        address: u64,
        size: u64,
        requested: u64,
    ) -> Result<BlockId, Mismatch> {
        self.arena.carve(address, size, requested)
    }

    /// `release_block` of the segment at `address`, as a recorded
    /// `segment_free` says happened: it must be one whole free block.
    pub fn release_segment_at(
        &mut self,
        device: &mut dyn Device,
        address: u64,
    ) -> Result<u64, Mismatch> {
        let id = self
            .arena
            .whole_free_segments()
            .find(|&(id, _)| self.arena.block(id).address == address)
            .map(|(id, _)| id)
            .ok_or_else(|| Mismatch(format!("no whole free segment at {address:#x}")))?;
        Ok(self.arena.release_segment(device, id))
    }
}

impl Allocator for CachingAllocator {
    fn malloc(
        &mut self,
        device: &mut dyn Device,
        requested: u64,
    ) -> Result<Option<BlockId>, AllocError> {
        self.malloc_on(device, requested, 0)
    }

    fn free(&mut self, _device: &mut dyn Device, id: BlockId) {
        self.arena.free(id);
    }

    fn empty_cache(&mut self, device: &mut dyn Device) -> Option<u64> {
        Some(self.release_cached_blocks(device))
    }

    fn stats(&self) -> &AllocatorStats {
        &self.arena.stats
    }

    fn reset_peak_stats(&mut self) {
        self.arena.stats.reset_peaks();
    }

    fn block_size(&self, id: BlockId) -> u64 {
        self.arena.block(id).size
    }

    #[cfg(feature = "device-values")]
    fn block_address(&self, id: BlockId) -> u64 {
        self.arena.block(id).address
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

    fn boxed_clone(&self) -> Option<Box<dyn Allocator>> {
        Some(Box::new(self.clone()))
    }

    #[cfg(debug_assertions)]
    fn check_invariants(&self, device: &dyn Device) -> Result<(), Broken> {
        self.arena.check_invariants(device, MIN_BLOCK_SIZE)?;
        for segment in self.arena.segments() {
            for b in segment.blocks.iter().filter(|b| b.id.is_some()) {
                let rounded = round_size(b.requested_size, &self.config.roundup_power2_divisions);
                if pool_for_size(rounded) != segment.pool {
                    return Err("a block serves a request of the other pool".into());
                }
            }
        }
        let s = &self.arena.stats;
        if let Some(allowed) = self.allowed_maximum {
            if s.reserved_bytes.current > allowed {
                return Err("reserved exceeds the per-process memory fraction".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
