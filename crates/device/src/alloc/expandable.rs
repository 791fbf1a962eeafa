//! PyTorch's caching allocator with `expandable_segments:True`
//! (Note [Expandable Segments], `ExpandableSegment`, `find_expandable_block`,
//! `try_allocate_expandable_block`, `map_block`, `unmap_block` in
//! `c10/cuda/CUDACachingAllocator.cpp`).
//!
//! Each pool (small, large) of each stream reserves one virtual address
//! range of 1⅛ times the GPU's memory (an `ExpandableSegment` per stream
//! and pool, made at the first request there: `find_expandable_block`) and
//! maps physical pages into it on demand: 2 MiB pages
//! for the small pool, 20 MiB for the large. A request that no free block
//! fits goes to the lowest address where free and unmapped space together
//! hold it (a free block just before the first unmapped page counts), and
//! the pages it needs are mapped (one `segment_map`, one
//! `num_device_alloc`). Every pool splits whenever at least 512 bytes
//! remain, so a segment never strands a large tail. Freed blocks stay
//! mapped; `empty_cache` (and the retry before an OOM) unmaps every whole
//! free page, even inside a partly used range. Mapped memory counts in
//! `reserved_bytes`; the `segment` and `inactive_split` counters leave it
//! out, as upstream does.
//!
//! Not taken from upstream: a second expandable segment when one pool's
//! address range is too fragmented (it is 1⅛ of the device, so this needs
//! pathological fragmentation), `max_split_size_mb` and the age-based
//! garbage collection (which skips expandable blocks upstream anyway).

use super::caching::{
    allocation_size, pool_for_size, round_size, CachingConfig, LARGE_BUFFER, MIN_BLOCK_SIZE,
};
use super::private_pools::PrivatePools;
use super::{
    AllocError, Allocator, AllocatorStats, BlockId, BlockState, BlockView, OutOfMemory, PoolKind,
    SegmentView, Slab, Trace, TraceAction, TraceEvent,
};
use crate::device::Device;
#[cfg(debug_assertions)]
use space::check_space;
use space::{Piece, PieceId, Space};
#[cfg(debug_assertions)]
use vramlab_core::error::Broken;
use vramlab_core::units::round_up;

/// Where the first pool's address range starts (virtual: the device's own
/// addresses back the pages).
const FIRST_BASE: u64 = 0x7c00_0000_0000;

/// PyTorch's caching allocator with expandable segments.
#[derive(Debug)]
pub struct ExpandableAllocator {
    config: CachingConfig,
    device_total: u64,
    /// Each stream's small and large pools' ranges, in the order they were
    /// made (at their first allocation).
    spaces: Vec<Space>,
    next_base: u64,
    /// Live blocks: their space and piece.
    blocks: Slab<(usize, PieceId)>,
    stats: AllocatorStats,
    trace: Trace,
    allowed_maximum: Option<u64>,
    /// CUDA graphs' private pools among the streams.
    private_pools: PrivatePools,
}

impl ExpandableAllocator {
    pub fn new(config: CachingConfig, device_total: u64) -> Self {
        let allowed_maximum = config.allowed_maximum(device_total);
        Self {
            config,
            device_total,
            spaces: Vec::new(),
            next_base: FIRST_BASE,
            blocks: Slab::default(),
            stats: AllocatorStats::default(),
            trace: Trace::default(),
            allowed_maximum,
            private_pools: PrivatePools::default(),
        }
    }

    /// Where the next pool's address range starts (a recording's replay
    /// puts each range where the recording had it).
    pub fn place_next_range(&mut self, base: u64) {
        if self.fits(base) {
            self.next_base = base;
        }
    }

    /// Which streams' blocks are CUDA graphs' private pools, and whether
    /// each is freeable.
    pub fn private_pools_mut(&mut self) -> &mut PrivatePools {
        &mut self.private_pools
    }

    /// Whether a pool's range (and the next one's) can start at `base`
    /// without running past the end of the address space.
    fn fits(&self, base: u64) -> bool {
        base.checked_add(4 * self.device_total + 4 * LARGE_BUFFER)
            .is_some()
    }

    /// A block of `size` bytes (`requested` asked) is now live.
    fn count_allocated(&mut self, size: u64, requested: u64) {
        let s = &mut self.stats;
        s.allocated_bytes.increase(size);
        s.active_bytes.increase(size);
        s.requested_bytes.increase(requested);
        s.allocation.increase(1);
        s.active.increase(1);
    }

    /// On a device that holds values (a GPU's virtual memory), the pool's
    /// address range reserved from the driver (`cuMemAddressReserve`) at
    /// its first allocation, where the driver puts it.
    #[cfg(feature = "device-values")]
    fn reserve(
        &mut self,
        device: &mut dyn Device,
        stream: u64,
        pool: PoolKind,
    ) -> Result<(), AllocError> {
        if self.find(stream, pool).is_some() {
            return Ok(());
        }
        let hint = self.next_base;
        let i = self.space(stream, pool);
        let size = self.spaces[i].size;
        let base = device
            .reserve(size, hint)
            .map_err(|e| AllocError::Driver(e.to_string()))?;
        if base != hint {
            self.spaces[i] = Space::new((stream, pool), base, self.device_total);
            self.next_base = round_up(base + size, LARGE_BUFFER);
        }
        Ok(())
    }

    /// Where the range of `pool` on `stream` is, if it was made.
    fn find(&self, stream: u64, pool: PoolKind) -> Option<usize> {
        (self.spaces.iter()).position(|s| s.stream == stream && s.pool == pool)
    }

    /// The expandable segment of `pool` on `stream`, reserved at its first
    /// use.
    fn space(&mut self, stream: u64, pool: PoolKind) -> usize {
        if let Some(i) = self.find(stream, pool) {
            return i;
        }
        let space = Space::new((stream, pool), self.next_base, self.device_total);
        self.next_base = round_up(self.next_base + space.size, LARGE_BUFFER);
        self.spaces.push(space);
        self.spaces.len() - 1
    }

    /// Hands out `size` bytes of the free piece `at`, splitting when at
    /// least 512 bytes remain.
    fn allocate_at(&mut self, i: usize, at: PieceId, size: u64, requested: u64) -> BlockId {
        let id = self.blocks.insert((i, at));
        let space = &mut self.spaces[i];
        let (address, whole) = (space.node(at).address, space.node(at).size);
        let size = if whole - size >= MIN_BLOCK_SIZE {
            size
        } else {
            whole
        };
        space.split(at, size, Piece::Free);
        space.set(at, Piece::Allocated { id, requested });
        self.count_allocated(size, requested);
        self.trace
            .record(TraceAction::Alloc, address, size, Some(id));
        id
    }

    /// `try_allocate_expandable_block`: maps the pages the candidate needs.
    /// `Ok(None)`: no address space or no device memory for them.
    fn expand(
        &mut self,
        device: &mut dyn Device,
        i: usize,
        size: u64,
    ) -> Result<Option<PieceId>, AllocError> {
        let Some(mut at) = self.spaces[i].expandable_candidate(size) else {
            return Ok(None);
        };
        loop {
            let space = &self.spaces[i];
            let (have, piece) = (space.node(at).size, space.node(at).piece);
            if piece == Piece::Free && have >= size {
                return Ok(Some(at));
            }
            let target = if piece == Piece::Unmapped {
                (at, size.min(have))
            } else {
                let next = space.next(at).expect("unmapped space after the candidate");
                (next, (size - have).min(space.node(next).size))
            };
            match self.map(device, i, target.0, target.1)? {
                Some(merged) => at = merged,
                None => return Ok(None),
            }
        }
    }

    /// `map_block`: maps whole pages from the start of an unmapped piece to
    /// cover `len` bytes; the mapped part merges with a free piece before
    /// it. Returns the merged free piece, or `None` (and maps nothing) when
    /// the device is out of memory.
    fn map(
        &mut self,
        device: &mut dyn Device,
        i: usize,
        at: PieceId,
        len: u64,
    ) -> Result<Option<PieceId>, AllocError> {
        let space = &self.spaces[i];
        let (address, piece_size, page) = (space.node(at).address, space.node(at).size, space.page);
        let bytes = round_up(len, page).min(piece_size);
        let mut mapped = Vec::new();
        for offset in (0..bytes).step_by(page as usize) {
            match pages::map(device, address + offset, page) {
                Ok(Some(memory)) => mapped.push((address + offset, memory)),
                failed => {
                    for &(at, memory) in &mapped {
                        pages::unmap(device, at, memory, page);
                    }
                    return failed.map(|_| None);
                }
            }
        }
        let space = &mut self.spaces[i];
        space.pages.extend(mapped);
        space.split(at, bytes, Piece::Unmapped);
        space.set(at, Piece::Free);
        let merged = space.merge(at);
        self.stats.reserved_bytes.increase(bytes);
        self.stats.num_device_alloc += 1;
        self.trace
            .record(TraceAction::SegmentAlloc, address, bytes, None);
        Ok(Some(merged))
    }

    /// `release_blocks` for expandable segments: `unmap_block` on every free
    /// piece, large pool first, each pool's blocks in its order (stream,
    /// then size, then address), a live CUDA graph's private pool's
    /// kept. Returns the bytes unmapped.
    fn release_cached(&mut self, device: &mut dyn Device) -> u64 {
        let mut released = 0;
        for pool in [PoolKind::Large, PoolKind::Small] {
            let releasable = |s: &Space| s.pool == pool && self.private_pools.releasable(s.stream);
            let mut spaces: Vec<usize> = (0..self.spaces.len())
                .filter(|&i| releasable(&self.spaces[i]))
                .collect();
            spaces.sort_by_key(|&i| self.spaces[i].stream);
            for i in spaces {
                // Unmapping merges only unmapped pieces: the other free
                // pieces keep their slots.
                for at in self.spaces[i].free_pieces() {
                    released += self.unmap(device, i, at);
                }
            }
        }
        released
    }

    /// `unmap_block`: unmaps the whole pages inside a free piece; what is
    /// left on either side stays mapped and free.
    fn unmap(&mut self, device: &mut dyn Device, i: usize, at: PieceId) -> u64 {
        let space = &mut self.spaces[i];
        let (address, size) = (space.node(at).address, space.node(at).size);
        let (page, base) = (space.page, space.base);
        // Pages are counted from the start of the range.
        let start = base + round_up(address - base, page);
        let end = base + (address + size - base) / page * page;
        if end <= start {
            return 0;
        }
        let pages: Vec<(u64, u64)> = space
            .pages
            .range(start..end)
            .map(|(&a, &m)| (a, m))
            .collect();
        for (a, memory) in pages {
            space.pages.remove(&a);
            pages::unmap(device, a, memory, page);
        }
        let middle = if start > address {
            space
                .split(at, start - address, Piece::Free)
                .expect("a free head")
        } else {
            at
        };
        space.split(middle, end - start, Piece::Free);
        space.set(middle, Piece::Unmapped);
        space.merge(middle);
        let bytes = end - start;
        self.stats.reserved_bytes.decrease(bytes);
        self.stats.num_device_free += 1;
        self.trace
            .record(TraceAction::SegmentFree, start, bytes, None);
        bytes
    }

    fn out_of_memory(&mut self, device: &dyn Device, requested: u64, size: u64) -> AllocError {
        self.stats.num_ooms += 1;
        let sizes = (requested, size, allocation_size(size));
        let oom = OutOfMemory::at(device, sizes, &self.stats, self.allowed_maximum, None);
        self.trace
            .record(TraceAction::Oom, oom.device_free, size, None);
        AllocError::OutOfMemory(oom)
    }

    /// The per-process memory fraction refuses growth past its maximum
    /// (`alloc_block`, which compares the segment size it would ask for).
    fn over_fraction(&self, size: u64) -> bool {
        self.allowed_maximum.is_some_and(|allowed| {
            self.stats.reserved_bytes.current + allocation_size(size) > allowed
        })
    }
}

impl ExpandableAllocator {
    /// A request of `requested` bytes on `stream`: served from that
    /// stream's ranges only, as upstream's pools serve a stream's blocks.
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
        let pool = pool_for_size(size);
        #[cfg(feature = "device-values")]
        self.reserve(device, stream, pool)?;
        let i = self.space(stream, pool);
        if let Some(at) = self.spaces[i].best_fit(size) {
            return Ok(Some(self.allocate_at(i, at, size, requested)));
        }
        let mut found = None;
        if !self.over_fraction(size) {
            found = self.expand(device, i, size)?;
        }
        if found.is_none() {
            // `release_cached_blocks`, then `alloc_block` once more.
            self.release_cached(device);
            self.stats.num_alloc_retries += 1;
            if !self.over_fraction(size) {
                found = self.expand(device, i, size)?;
            }
        }
        match found {
            Some(at) => Ok(Some(self.allocate_at(i, at, size, requested))),
            None => Err(self.out_of_memory(device, requested, size)),
        }
    }
}

impl Allocator for ExpandableAllocator {
    fn malloc(
        &mut self,
        device: &mut dyn Device,
        requested: u64,
    ) -> Result<Option<BlockId>, AllocError> {
        self.malloc_on(device, requested, 0)
    }

    fn free(&mut self, _device: &mut dyn Device, block: BlockId) {
        let (i, at) = self.blocks.remove(block);
        let space = &mut self.spaces[i];
        let (address, size, piece) = (
            space.node(at).address,
            space.node(at).size,
            space.node(at).piece,
        );
        let Piece::Allocated { requested, .. } = piece else {
            unreachable!("a live block is allocated");
        };
        space.set(at, Piece::Free);
        space.merge(at);
        let s = &mut self.stats;
        s.allocated_bytes.decrease(size);
        s.active_bytes.decrease(size);
        s.requested_bytes.decrease(requested);
        s.allocation.decrease(1);
        s.active.decrease(1);
        self.trace
            .record(TraceAction::Free, address, size, Some(block));
    }

    fn empty_cache(&mut self, device: &mut dyn Device) -> Option<u64> {
        Some(self.release_cached(device))
    }

    fn stats(&self) -> &AllocatorStats {
        &self.stats
    }

    fn reset_peak_stats(&mut self) {
        self.stats.reset_peaks();
    }

    fn block_size(&self, block: BlockId) -> u64 {
        let (i, at) = *self.blocks.get(block);
        self.spaces[i].node(at).size
    }

    #[cfg(feature = "device-values")]
    fn block_address(&self, block: BlockId) -> u64 {
        let (i, at) = *self.blocks.get(block);
        self.spaces[i].node(at).address
    }

    /// One segment per contiguous mapped range (as `_snapshot` reports an
    /// expandable segment).
    fn segments(&self) -> Vec<SegmentView> {
        let mut out = Vec::new();
        for space in &self.spaces {
            let mut current: Option<SegmentView> = None;
            for (
                _,
                &space::Node {
                    address,
                    size,
                    piece,
                    ..
                },
            ) in space.iter()
            {
                let (id, requested, state) = match piece {
                    Piece::Unmapped => {
                        out.extend(current.take());
                        continue;
                    }
                    Piece::Free => (None, 0, BlockState::Inactive),
                    Piece::Allocated { id, requested } => {
                        (Some(id), requested, BlockState::ActiveAllocated)
                    }
                };
                let segment = current.get_or_insert_with(|| SegmentView {
                    address,
                    total_size: 0,
                    pool: space.pool,
                    stream: space.stream,
                    blocks: Vec::new(),
                });
                segment.total_size += size;
                segment.blocks.push(BlockView {
                    id,
                    address,
                    size,
                    requested_size: requested,
                    state,
                });
            }
            out.extend(current);
        }
        vramlab_core::collections::sort_by_u64(&mut out, |s| s.address);
        out
    }

    fn drain_trace(&mut self, out: &mut Vec<TraceEvent>) {
        out.append(&mut self.trace.events);
    }

    fn set_tracing(&mut self, on: bool) {
        self.trace.on = on;
    }

    #[cfg(debug_assertions)]
    fn check_invariants(&self, device: &dyn Device) -> Result<(), Broken> {
        let mut mapped_total = 0;
        let mut allocated = 0;
        for space in &self.spaces {
            let (mapped, used) = check_space(space)?;
            mapped_total += mapped;
            allocated += used;
        }
        let s = &self.stats;
        let checks = [
            ("reserved_bytes", s.reserved_bytes.current, mapped_total),
            ("device segment bytes", device.segment_bytes(), mapped_total),
            ("allocated_bytes", s.allocated_bytes.current, allocated),
            ("segment", s.segment.current, 0),
        ];
        for (name, have, want) in checks {
            if have != want {
                return Err(Broken(format!("{name} is {have}, the segments say {want}")));
            }
        }
        Ok(())
    }
}

mod seed;
mod space;
#[cfg(test)]
mod tests;

/// A page of an expandable segment mapped and unmapped: on a device that
/// holds values, into its reserved range (`Device::map`, `unmap`: a GPU's
/// virtual memory); in the page's engine (a simulated GPU only, and its
/// download budget) each page a segment of its own, which counts the same.
mod pages {
    use super::AllocError;
    use crate::device::Device;

    #[cfg(feature = "device-values")]
    pub fn map(device: &mut dyn Device, at: u64, bytes: u64) -> Result<Option<u64>, AllocError> {
        match device.map(at, bytes) {
            Ok(handle) => Ok(Some(handle)),
            Err(vramlab_core::error::DeviceError::OutOfMemory) => Ok(None),
            Err(e) => Err(AllocError::Driver(e.to_string())),
        }
    }

    #[cfg(not(feature = "device-values"))]
    pub fn map(device: &mut dyn Device, _: u64, bytes: u64) -> Result<Option<u64>, AllocError> {
        crate::alloc::device_malloc(device, bytes)
    }

    #[cfg(feature = "device-values")]
    pub fn unmap(device: &mut dyn Device, at: u64, handle: u64, bytes: u64) {
        device.unmap(at, handle, bytes)
    }

    #[cfg(not(feature = "device-values"))]
    pub fn unmap(device: &mut dyn Device, _: u64, handle: u64, bytes: u64) {
        device.free(handle, bytes)
    }
}
