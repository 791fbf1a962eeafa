//! PyTorch's caching allocator with `expandable_segments:True`
//! (Note [Expandable Segments], `ExpandableSegment`, `find_expandable_block`,
//! `try_allocate_expandable_block`, `map_block`, `unmap_block` in
//! `c10/cuda/CUDACachingAllocator.cpp`).
//!
//! Each pool (small, large) reserves one virtual address range of 1⅛ times
//! the GPU's memory and maps physical pages into it on demand: 2 MiB pages
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
    SMALL_BUFFER,
};
use super::{
    device_malloc, AllocError, Allocator, AllocatorStats, BlockId, BlockState, BlockView,
    OutOfMemory, PoolKind, SegmentView, Slab, Trace, TraceAction, TraceEvent,
};
use crate::device::Device;
use crate::units::round_up;
use std::collections::{BTreeMap, BTreeSet};

/// Where the first pool's address range starts (virtual: the device's own
/// addresses back the pages).
const FIRST_BASE: u64 = 0x7c00_0000_0000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Piece {
    Unmapped,
    Free,
    Allocated { id: BlockId, requested: u64 },
}

/// One pool's expandable segment: its address range tiled by pieces.
#[derive(Debug)]
struct Space {
    pool: PoolKind,
    base: u64,
    size: u64,
    page: u64,
    /// Address → (size, piece); the pieces tile `[base, base + size)`.
    pieces: BTreeMap<u64, (u64, Piece)>,
    /// Free pieces by (size, address).
    free: BTreeSet<(u64, u64)>,
    /// Unmapped pieces by address.
    unmapped: BTreeSet<u64>,
    /// Mapped pages by address, with the device memory behind each.
    pages: BTreeMap<u64, u64>,
}

impl Space {
    fn new(pool: PoolKind, base: u64, device_total: u64) -> Self {
        let page = if pool == PoolKind::Small {
            SMALL_BUFFER
        } else {
            LARGE_BUFFER
        };
        let size = round_up(device_total + device_total / 8, page);
        Space {
            pool,
            base,
            size,
            page,
            pieces: BTreeMap::from([(base, (size, Piece::Unmapped))]),
            free: BTreeSet::new(),
            unmapped: BTreeSet::from([base]),
            pages: BTreeMap::new(),
        }
    }

    fn piece(&self, address: u64) -> (u64, Piece) {
        self.pieces[&address]
    }

    fn set(&mut self, address: u64, size: u64, piece: Piece) {
        if let Some(old) = self.pieces.insert(address, (size, piece)) {
            self.unindex(address, old);
        }
        match piece {
            Piece::Free => _ = self.free.insert((size, address)),
            Piece::Unmapped => _ = self.unmapped.insert(address),
            Piece::Allocated { .. } => {}
        }
    }

    fn remove(&mut self, address: u64) -> (u64, Piece) {
        let old = self.pieces.remove(&address).expect("a piece");
        self.unindex(address, old);
        old
    }

    fn unindex(&mut self, address: u64, (size, piece): (u64, Piece)) {
        match piece {
            Piece::Free => _ = self.free.remove(&(size, address)),
            Piece::Unmapped => _ = self.unmapped.remove(&address),
            Piece::Allocated { .. } => {}
        }
    }

    fn prev(&self, address: u64) -> Option<(u64, u64, Piece)> {
        let (&a, &(s, p)) = self.pieces.range(..address).next_back()?;
        Some((a, s, p))
    }

    fn next(&self, address: u64) -> Option<(u64, u64, Piece)> {
        let (&a, &(s, p)) = self.pieces.range(address + 1..).next()?;
        Some((a, s, p))
    }

    /// Merges the piece at `address` with neighbours in the same state
    /// (free with free, unmapped with unmapped); returns its address.
    fn merge(&mut self, address: u64) -> u64 {
        let (mut start, (mut size, state)) = (address, self.piece(address));
        if matches!(state, Piece::Allocated { .. }) {
            return address;
        }
        if let Some((a, s, p)) = self.prev(start) {
            if p == state {
                self.remove(a);
                self.remove(start);
                (start, size) = (a, s + size);
                self.set(start, size, state);
            }
        }
        if let Some((a, s, p)) = self.next(start) {
            if p == state {
                self.remove(a);
                size += s;
                self.set(start, size, state);
            }
        }
        start
    }

    /// Splits the piece at `address` so that it is `size` long; the rest
    /// becomes a piece of `rest` state.
    fn split(&mut self, address: u64, size: u64, rest: Piece) {
        let (whole, piece) = self.piece(address);
        if whole > size {
            self.set(address, size, piece);
            self.set(address + size, whole - size, rest);
        }
    }

    /// `get_free_block`: the smallest free block that fits, lowest address
    /// first; a later one whose size plus the unmapped space after it (its
    /// "expandable size") is smaller wins over it.
    fn best_fit(&self, size: u64) -> Option<u64> {
        let expandable = |(s, a): (u64, u64)| match self.next(a) {
            Some((_, n, Piece::Unmapped)) => s + n,
            _ => s,
        };
        let mut candidates = self.free.range((size, 0)..).copied();
        let mut best = candidates.next()?;
        for next in candidates {
            if expandable(next) < expandable(best) {
                best = next;
            } else {
                break;
            }
        }
        Some(best.1)
    }

    /// `find_expandable_block`: the lowest unmapped piece (or the free piece
    /// just before it) from which free and unmapped space reach `size`.
    fn expandable_candidate(&self, size: u64) -> Option<u64> {
        for &u in &self.unmapped {
            let start = match self.prev(u) {
                Some((a, _, Piece::Free)) => a,
                _ => u,
            };
            let mut room = 0;
            for (_, &(s, p)) in self.pieces.range(start..) {
                if matches!(p, Piece::Allocated { .. }) || room >= size {
                    break;
                }
                room += s;
            }
            if room >= size {
                return Some(start);
            }
        }
        None
    }
}

/// PyTorch's caching allocator with expandable segments.
#[derive(Debug)]
pub struct ExpandableAllocator {
    config: CachingConfig,
    device_total: u64,
    /// Small pool, large pool: created at their first allocation.
    spaces: [Option<Space>; 2],
    next_base: u64,
    /// Live blocks: their pool and address.
    blocks: Slab<(PoolKind, u64)>,
    stats: AllocatorStats,
    trace: Trace,
    allowed_maximum: Option<u64>,
}

fn slot(pool: PoolKind) -> usize {
    usize::from(pool == PoolKind::Large)
}

impl ExpandableAllocator {
    pub fn new(config: CachingConfig, device_total: u64) -> Self {
        let allowed_maximum = config
            .memory_fraction
            .map(|f| (f * device_total as f64) as u64);
        Self {
            config,
            device_total,
            spaces: [None, None],
            next_base: FIRST_BASE,
            blocks: Slab::default(),
            stats: AllocatorStats::default(),
            trace: Trace::default(),
            allowed_maximum,
        }
    }

    /// The pool's expandable segment, reserved at its first use.
    fn space(&mut self, pool: PoolKind) -> &mut Space {
        let i = slot(pool);
        if self.spaces[i].is_none() {
            let space = Space::new(pool, self.next_base, self.device_total);
            self.next_base = round_up(self.next_base + space.size, LARGE_BUFFER);
            self.spaces[i] = Some(space);
        }
        self.spaces[i].as_mut().expect("just reserved")
    }

    /// Hands out `size` bytes of the free piece at `address`, splitting
    /// when at least 512 bytes remain.
    fn allocate_at(&mut self, pool: PoolKind, address: u64, size: u64, requested: u64) -> BlockId {
        let id = self.blocks.insert((pool, address));
        let space = self.space(pool);
        let (whole, _) = space.piece(address);
        let size = if whole - size >= MIN_BLOCK_SIZE {
            size
        } else {
            whole
        };
        space.split(address, size, Piece::Free);
        space.set(address, size, Piece::Allocated { id, requested });
        let s = &mut self.stats;
        s.allocated_bytes.increase(size);
        s.active_bytes.increase(size);
        s.requested_bytes.increase(requested);
        s.allocation.increase(1);
        s.active.increase(1);
        self.trace
            .record(TraceAction::Alloc, address, size, Some(id));
        id
    }

    /// `try_allocate_expandable_block`: maps the pages the candidate needs.
    /// `Ok(None)`: no address space or no device memory for them.
    fn expand(
        &mut self,
        device: &mut dyn Device,
        pool: PoolKind,
        size: u64,
    ) -> Result<Option<u64>, AllocError> {
        let Some(mut at) = self.space(pool).expandable_candidate(size) else {
            return Ok(None);
        };
        loop {
            let (have, piece) = self.space(pool).piece(at);
            if piece == Piece::Free && have >= size {
                return Ok(Some(at));
            }
            let target = if piece == Piece::Unmapped {
                (at, size.min(have))
            } else {
                let next = have + at;
                (next, (size - have).min(self.space(pool).piece(next).0))
            };
            match self.map(device, pool, target.0, target.1)? {
                Some(merged) => at = merged,
                None => return Ok(None),
            }
        }
    }

    /// `map_block`: maps whole pages from the start of an unmapped piece to
    /// cover `len` bytes; the mapped part merges with a free piece before
    /// it. Returns the merged free piece's address, or `None` (and maps
    /// nothing) when the device is out of memory.
    fn map(
        &mut self,
        device: &mut dyn Device,
        pool: PoolKind,
        address: u64,
        len: u64,
    ) -> Result<Option<u64>, AllocError> {
        let space = self.space(pool);
        let (piece_size, page) = (space.piece(address).0, space.page);
        let bytes = round_up(len, page).min(piece_size);
        let mut mapped = Vec::new();
        for offset in (0..bytes).step_by(page as usize) {
            match device_malloc(device, page) {
                Ok(Some(memory)) => mapped.push((address + offset, memory)),
                failed => {
                    for &(_, memory) in &mapped {
                        device.free(memory, page);
                    }
                    return failed.map(|_| None);
                }
            }
        }
        let space = self.space(pool);
        space.pages.extend(mapped);
        space.split(address, bytes, Piece::Unmapped);
        space.set(address, bytes, Piece::Free);
        let merged = space.merge(address);
        self.stats.reserved_bytes.increase(bytes);
        self.stats.num_device_alloc += 1;
        self.trace
            .record(TraceAction::SegmentAlloc, address, bytes, None);
        Ok(Some(merged))
    }

    /// `release_blocks` for expandable segments: `unmap_block` on every free
    /// piece, large pool first. Returns the bytes unmapped.
    fn release_cached(&mut self, device: &mut dyn Device) -> u64 {
        let mut released = 0;
        for pool in [PoolKind::Large, PoolKind::Small] {
            let Some(space) = self.spaces[slot(pool)].as_ref() else {
                continue;
            };
            let free: Vec<u64> = space
                .pieces
                .iter()
                .filter(|(_, &(_, p))| p == Piece::Free)
                .map(|(&a, _)| a)
                .collect();
            for address in free {
                released += self.unmap(device, pool, address);
            }
        }
        released
    }

    /// `unmap_block`: unmaps the whole pages inside a free piece; what is
    /// left on either side stays mapped and free.
    fn unmap(&mut self, device: &mut dyn Device, pool: PoolKind, address: u64) -> u64 {
        let space = self.spaces[slot(pool)].as_mut().expect("a space");
        let (size, page, base) = (space.piece(address).0, space.page, space.base);
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
            device.free(memory, page);
        }
        if start > address {
            space.split(address, start - address, Piece::Free);
        }
        space.split(start, end - start, Piece::Free);
        space.set(start, end - start, Piece::Unmapped);
        space.merge(start);
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

impl Allocator for ExpandableAllocator {
    fn malloc(
        &mut self,
        device: &mut dyn Device,
        requested: u64,
    ) -> Result<Option<BlockId>, AllocError> {
        if requested == 0 {
            return Ok(None);
        }
        let size = round_size(requested, self.config.roundup_power2_divisions);
        let pool = pool_for_size(size);
        if let Some(at) = self.space(pool).best_fit(size) {
            return Ok(Some(self.allocate_at(pool, at, size, requested)));
        }
        let mut found = None;
        if !self.over_fraction(size) {
            found = self.expand(device, pool, size)?;
        }
        if found.is_none() {
            // `release_cached_blocks`, then `alloc_block` once more.
            self.release_cached(device);
            self.stats.num_alloc_retries += 1;
            if !self.over_fraction(size) {
                found = self.expand(device, pool, size)?;
            }
        }
        match found {
            Some(at) => Ok(Some(self.allocate_at(pool, at, size, requested))),
            None => Err(self.out_of_memory(device, requested, size)),
        }
    }

    fn free(&mut self, _device: &mut dyn Device, block: BlockId) {
        let (pool, address) = self.blocks.remove(block);
        let space = self.spaces[slot(pool)]
            .as_mut()
            .expect("a live block's space");
        let (size, piece) = space.piece(address);
        let Piece::Allocated { requested, .. } = piece else {
            unreachable!("a live block is allocated");
        };
        space.set(address, size, Piece::Free);
        space.merge(address);
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
        let (pool, address) = *self.blocks.get(block);
        self.spaces[slot(pool)]
            .as_ref()
            .expect("a space")
            .piece(address)
            .0
    }

    /// One segment per contiguous mapped range (as `_snapshot` reports an
    /// expandable segment).
    fn segments(&self) -> Vec<SegmentView> {
        let mut out = Vec::new();
        for space in self.spaces.iter().flatten() {
            let mut current: Option<SegmentView> = None;
            for (&address, &(size, piece)) in &space.pieces {
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
        out.sort_by_key(|s| s.address);
        out
    }

    fn drain_trace(&mut self, out: &mut Vec<TraceEvent>) {
        out.append(&mut self.trace.events);
    }

    fn set_tracing(&mut self, on: bool) {
        self.trace.on = on;
    }

    fn check_invariants(&self, device: &dyn Device) -> Result<(), String> {
        let mut mapped_total = 0;
        let mut allocated = 0;
        for space in self.spaces.iter().flatten() {
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
                return Err(format!("{name} is {have}, the segments say {want}"));
            }
        }
        Ok(())
    }
}

/// One space's tiling, merge and page invariants; returns (mapped bytes,
/// allocated bytes).
fn check_space(space: &Space) -> Result<(u64, u64), String> {
    let (mut at, mut last, mut mapped, mut used) = (space.base, None, 0, 0);
    for (&address, &(size, piece)) in &space.pieces {
        if address != at || size == 0 {
            return Err(format!("pieces do not tile the range at {address:#x}"));
        }
        let same = |p: Piece| !matches!(p, Piece::Allocated { .. }) && Some(p) == last;
        if same(piece) {
            return Err(format!("two neighbouring pieces alike at {address:#x}"));
        }
        match piece {
            Piece::Unmapped => {}
            Piece::Free => mapped += size,
            Piece::Allocated { .. } => {
                mapped += size;
                used += size;
            }
        }
        last = Some(piece);
        at += size;
    }
    if at != space.base + space.size {
        return Err("pieces do not cover the range".into());
    }
    let pages = space.pages.len() as u64 * space.page;
    if pages != mapped {
        return Err(format!("{pages} bytes of pages back {mapped} mapped bytes"));
    }
    let free: BTreeSet<(u64, u64)> = space
        .pieces
        .iter()
        .filter(|(_, &(_, p))| p == Piece::Free)
        .map(|(&a, &(s, _))| (s, a))
        .collect();
    if free != space.free {
        return Err("the free index is out of date".into());
    }
    let unmapped: BTreeSet<u64> = space
        .pieces
        .iter()
        .filter(|(_, &(_, p))| p == Piece::Unmapped)
        .map(|(&a, _)| a)
        .collect();
    if unmapped != space.unmapped {
        return Err("the unmapped index is out of date".into());
    }
    Ok((mapped, used))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{SimDevice, SimDeviceConfig};
    use crate::units::{GIB, MIB};

    fn setup(total: u64, context: u64) -> (ExpandableAllocator, SimDevice) {
        let dev = SimDevice::new(SimDeviceConfig {
            total_bytes: total,
            context_bytes: context,
            ..Default::default()
        });
        (
            ExpandableAllocator::new(CachingConfig::default(), total),
            dev,
        )
    }

    fn ok(a: &mut ExpandableAllocator, dev: &mut SimDevice, bytes: u64) -> BlockId {
        let id = a.malloc(dev, bytes).unwrap().unwrap();
        a.check_invariants(dev).unwrap();
        id
    }

    /// Lesson 5's fragmentation OOM does not happen: the three 100 MiB holes
    /// are whole 20 MiB pages, unmapped on the retry, and the 150 MiB tensor
    /// maps 160 MiB at the end of the range.
    #[test]
    fn holes_are_unmapped_and_the_space_grows_at_its_end() {
        let (mut a, mut dev) = setup(GIB, 300 * MIB);
        let big = ok(&mut a, &mut dev, 700 * MIB);
        assert_eq!(a.stats().reserved_bytes.current, 700 * MIB);
        assert_eq!(a.stats().num_device_alloc, 1);
        assert_eq!(dev.segment_bytes(), 700 * MIB);
        a.free(&mut dev, big);
        let t: Vec<BlockId> = (0..7).map(|_| ok(&mut a, &mut dev, 100 * MIB)).collect();
        assert_eq!(a.stats().reserved_bytes.current, 700 * MIB);
        for i in [0, 2, 4] {
            a.free(&mut dev, t[i]);
        }
        assert_eq!(a.stats().inactive_split_bytes.current, 0);
        let z = ok(&mut a, &mut dev, 150 * MIB);
        let s = a.stats();
        assert_eq!(a.block_size(z), 150 * MIB);
        assert_eq!(s.allocated_bytes.current, 550 * MIB);
        assert_eq!(s.reserved_bytes.current, 560 * MIB);
        assert_eq!(s.num_alloc_retries, 1);
        assert_eq!((s.num_device_alloc, s.num_device_free), (2, 3));
        assert_eq!(s.segment.current, 0);
        // Mapped ranges: [b], [d], [f, g, z and 10 MiB free].
        let segments = a.segments();
        let sizes: Vec<u64> = segments.iter().map(|s| s.total_size / MIB).collect();
        assert_eq!(sizes, vec![100, 100, 360]);
        assert_eq!(segments[2].address, FIRST_BASE + 400 * MIB + 100 * MIB);
    }

    /// Small requests map 2 MiB pages; a block splits whenever 512 bytes
    /// remain; `empty_cache` unmaps whole free pages, also in a range that
    /// still holds a live block, and keeps partial ones.
    #[test]
    fn empty_cache_unmaps_every_whole_free_page() {
        let (mut a, mut dev) = setup(GIB, 0);
        let x = ok(&mut a, &mut dev, 1000);
        assert_eq!(a.block_size(x), 1024);
        assert_eq!(a.stats().reserved_bytes.current, 2 * MIB);
        // 30 MiB in the large pool: two 20 MiB pages, 10 MiB left free.
        let y = ok(&mut a, &mut dev, 30 * MIB);
        let z = ok(&mut a, &mut dev, 5 * MIB);
        assert_eq!(a.stats().reserved_bytes.current, 42 * MIB);
        assert_eq!(a.block_size(y) + a.block_size(z), 35 * MIB);
        a.free(&mut dev, y);
        // Free: [0, 30 MiB) of the large range; z lives at [30, 35).
        assert_eq!(a.empty_cache(&mut dev), Some(20 * MIB));
        assert_eq!(a.stats().reserved_bytes.current, 22 * MIB);
        assert_eq!(dev.segment_bytes(), 22 * MIB);
        a.check_invariants(&dev).unwrap();
        a.free(&mut dev, z);
        a.free(&mut dev, x);
        assert_eq!(a.empty_cache(&mut dev), Some(22 * MIB));
        assert_eq!(a.stats().reserved_bytes.current, 0);
        assert!(a.segments().is_empty());
        a.check_invariants(&dev).unwrap();
    }

    /// No device memory for the pages: release, retry, then the OOM, with
    /// the sizes PyTorch reports.
    #[test]
    fn out_of_memory_after_one_retry() {
        let (mut a, mut dev) = setup(100 * MIB, 0);
        let _x = ok(&mut a, &mut dev, 50 * MIB);
        let err = a.malloc(&mut dev, 60 * MIB).unwrap_err();
        let oom = err.out_of_memory().unwrap();
        assert_eq!((oom.requested, oom.alloc_size), (60 * MIB, 60 * MIB));
        let s = a.stats();
        assert_eq!((s.num_ooms, s.num_alloc_retries), (1, 1));
        assert_eq!(s.reserved_bytes.current, 60 * MIB);
        a.check_invariants(&dev).unwrap();
    }
}
