//! The block arena under every caching allocator: segments from the driver,
//! each tiled by a doubly linked list of blocks in address order, the free
//! blocks of each pool ordered by (size, address), the `DeviceStats`
//! counters and the trace. It knows how to split, coalesce, release a whole
//! segment, draw the segment map and check its invariants; which block to
//! take, when to split and when to go to the driver is the policy of the
//! allocator above it (`caching`, `bfc`).

use super::Mismatch;
use super::{
    AllocatorStats, BlockId, BlockState, BlockView, OutOfMemory, PoolKind, SegmentView, Slab,
    Trace, TraceAction, NIL,
};
use crate::device::Device;
use std::collections::{BTreeMap, BTreeSet};
#[cfg(debug_assertions)]
use vramlab_core::error::Broken;

/// One block: a range of a segment, allocated or free.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub address: u64,
    pub size: u64,
    /// What the caller asked for (0 while free).
    pub requested: u64,
    pub pool: PoolKind,
    /// The CUDA stream its segment was allocated for: blocks serve only
    /// requests on their own stream (`BlockComparatorSize` orders by stream
    /// first).
    pub stream: u64,
    pub allocated: bool,
    pub prev: BlockId,
    pub next: BlockId,
    /// The pool's lookup count when the block became free (PyTorch's
    /// `gc_count_base`): its age is the lookups since.
    pub stamp: u64,
}

impl Block {
    /// Shares its segment with other blocks (`Block::is_split`).
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
}

/// The free blocks of one pool, by (size, address): best fit is the first
/// at or after the request.
#[derive(Clone, Debug, Default)]
pub(crate) struct FreeBlocks {
    pub blocks: BTreeSet<(u64, u64, BlockId)>,
    /// `get_free_blocks_call_count`.
    pub lookups: u64,
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    head: BlockId,
    size: u64,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Arena {
    blocks: Slab<Block>,
    /// Free blocks by pool, indexed by [`PoolKind::index`].
    free: [FreeBlocks; PoolKind::COUNT],
    /// Segment base address to its first block.
    segments: BTreeMap<u64, Segment>,
    pub stats: AllocatorStats,
    pub trace: Trace,
}

impl Arena {
    #[inline]
    pub fn block(&self, id: BlockId) -> &Block {
        self.blocks.get(id)
    }

    pub fn free_blocks(&self, pool: PoolKind) -> &FreeBlocks {
        &self.free[pool.index()]
    }

    pub fn free_blocks_mut(&mut self, pool: PoolKind) -> &mut FreeBlocks {
        &mut self.free[pool.index()]
    }

    /// The smallest free block of `pool` on `stream` of at least `size`
    /// bytes, lowest address first: `(size, id)`. It stays free.
    pub fn best_fit(&self, pool: PoolKind, size: u64, stream: u64) -> Option<(u64, BlockId)> {
        self.free_blocks(pool)
            .blocks
            .range((size, 0, 0)..)
            .find(|&&(_, _, id)| self.blocks.get(id).stream == stream)
            .map(|&(found, _, id)| (found, id))
    }

    /// Puts a free block into its pool, stamped with the pool's lookup count.
    pub fn insert_free(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let (key, pool) = ((b.size, b.address, id), b.pool);
        let free = &mut self.free[pool.index()];
        let inserted = free.blocks.insert(key);
        debug_assert!(inserted, "block already in its pool");
        let stamp = free.lookups;
        self.blocks.get_mut(id).stamp = stamp;
    }

    /// Takes a free block out of its pool (to allocate or release it).
    pub fn take_free(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let removed = self.free[b.pool.index()]
            .blocks
            .remove(&(b.size, b.address, id));
        debug_assert!(removed, "block not in its pool");
    }

    /// A new segment from the driver at `address`, as one free block that is
    /// not yet in its pool.
    pub fn add_segment(&mut self, address: u64, size: u64, pool: PoolKind, stream: u64) -> BlockId {
        self.stats.num_device_alloc += 1;
        self.stats.segment.increase(1);
        self.stats.reserved_bytes.increase(size);
        let head = self.blocks.insert(Block {
            address,
            size,
            requested: 0,
            pool,
            stream,
            allocated: false,
            prev: NIL,
            next: NIL,
            stamp: 0,
        });
        self.segments.insert(address, Segment { head, size });
        self.trace
            .record(TraceAction::SegmentAlloc, address, size, None);
        head
    }

    /// `release_block`: gives a whole free segment (one free block, in its
    /// pool) back to the driver. Returns its size.
    pub fn release_segment(&mut self, device: &mut dyn Device, id: BlockId) -> u64 {
        let b = self.blocks.get(id);
        debug_assert!(!b.allocated && !b.is_split(), "only whole free segments");
        let (address, size) = (b.address, b.size);
        self.take_free(id);
        self.blocks.remove(id);
        self.segments.remove(&address);
        self.stats.num_device_free += 1;
        self.trace
            .record(TraceAction::SegmentFree, address, size, None);
        device.free(address, size);
        self.stats.segment.decrease(1);
        self.stats.reserved_bytes.decrease(size);
        size
    }

    /// Segments that are one free block, by address.
    pub fn whole_free_segments(&self) -> impl Iterator<Item = (BlockId, u64)> + '_ {
        self.segments.values().filter_map(|s| {
            let b = self.blocks.get(s.head);
            (!b.allocated && b.next == NIL).then_some((s.head, s.size))
        })
    }

    /// Allocates exactly `[address, address + size)`, which must lie inside
    /// one free block: the free space before and after it stays free. This
    /// rebuilds a recorded allocator state (a snapshot's live blocks), not
    /// a policy of any allocator.
    pub fn carve(&mut self, address: u64, size: u64, requested: u64) -> Result<BlockId, Mismatch> {
        let id = self.free_block_containing(address, size).ok_or_else(|| {
            Mismatch(format!(
                "no free space for a block of {size} bytes at {address:#x}"
            ))
        })?;
        self.take_free(id);
        let mut net = self.split_contribution(id, -1);
        let offset = address - self.blocks.get(id).address;
        let target = if offset > 0 {
            let rest = self.split_off(id, offset);
            self.take_free(rest);
            self.insert_free(id);
            net = add(net, self.split_contribution(id, 1));
            rest
        } else {
            id
        };
        // `allocate` takes out the target's own share, which it never had.
        net = add(net, self.split_contribution(target, 1));
        self.stats.inactive_split.apply(net.0);
        self.stats.inactive_split_bytes.apply(net.1);
        let split = self.blocks.get(target).size > size;
        Ok(self.allocate(target, size, requested, split))
    }

    fn free_block_containing(&self, address: u64, size: u64) -> Option<BlockId> {
        let (_, segment) = self.segments.range(..=address).next_back()?;
        let (id, b) = self
            .segment_blocks(segment.head)
            .find(|(_, b)| b.address <= address && address < b.address + b.size)?;
        (!b.allocated && address + size <= b.address + b.size).then_some(id)
    }

    /// Hands out a free block (already taken out of its pool) for a request
    /// of `requested` bytes rounded to `size`; with `split`, the rest past
    /// `size` becomes a free block of its own (`alloc_found_block`,
    /// `SplitChunk`).
    pub fn allocate(&mut self, id: BlockId, size: u64, requested: u64, split: bool) -> BlockId {
        let mut net = self.split_contribution(id, -1);
        if split {
            let rest = self.split_off(id, size);
            let added = self.split_contribution(rest, 1);
            net = (net.0 + added.0, net.1 + added.1);
        }
        self.stats.inactive_split.apply(net.0);
        self.stats.inactive_split_bytes.apply(net.1);
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

    /// Cuts block `id` at `size`; the upper part becomes a free block in the
    /// pool. Returns the new block.
    fn split_off(&mut self, id: BlockId, size: u64) -> BlockId {
        let b = self.blocks.get(id);
        let (address, remaining, pool, next) = (b.address, b.size - size, b.pool, b.next);
        let stream = b.stream;
        let rest = self.blocks.insert(Block {
            address: address + size,
            size: remaining,
            requested: 0,
            pool,
            stream,
            allocated: false,
            prev: id,
            next,
            stamp: 0,
        });
        if next != NIL {
            self.blocks.get_mut(next).prev = rest;
        }
        let b = self.blocks.get_mut(id);
        b.next = rest;
        b.size = size;
        self.insert_free(rest);
        rest
    }

    /// Frees an allocated block: it merges with free neighbours (`free_block`,
    /// `TryToCoalesce`) and goes back into its pool. Returns the free block
    /// it ends in.
    pub fn free(&mut self, id: BlockId) -> BlockId {
        let b = self.blocks.get_mut(id);
        debug_assert!(b.allocated, "double free");
        b.allocated = false;
        let (address, size, requested) = (b.address, b.size, b.requested);
        b.requested = 0;
        self.stats.allocation.decrease(1);
        self.stats.allocated_bytes.decrease(size);
        self.trace
            .record(TraceAction::Free, address, size, Some(id));
        let mut net = (0, 0);
        let mut id = id;
        let prev = self.blocks.get(id).prev;
        if prev != NIL && !self.blocks.get(prev).allocated {
            net = add(net, self.split_contribution(prev, -1));
            self.take_free(prev);
            self.absorb_next(prev);
            id = prev;
        }
        let next = self.blocks.get(id).next;
        if next != NIL && !self.blocks.get(next).allocated {
            net = add(net, self.split_contribution(next, -1));
            self.take_free(next);
            self.absorb_next(id);
        }
        self.insert_free(id);
        net = add(net, self.split_contribution(id, 1));
        self.stats.inactive_split.apply(net.0);
        self.stats.inactive_split_bytes.apply(net.1);
        self.stats.active.decrease(1);
        self.stats.active_bytes.decrease(size);
        self.stats.requested_bytes.decrease(requested);
        id
    }

    /// Block `id` takes in the block after it.
    fn absorb_next(&mut self, id: BlockId) {
        let next = self.blocks.get(id).next;
        let n = self.blocks.remove(next);
        if n.next != NIL {
            self.blocks.get_mut(n.next).prev = id;
        }
        let b = self.blocks.get_mut(id);
        b.size += n.size;
        b.next = n.next;
    }

    /// What a free block adds to the inactive-split counters: one block and
    /// its bytes when it shares its segment.
    fn split_contribution(&self, id: BlockId, sign: i64) -> (i64, i64) {
        let b = self.blocks.get(id);
        if b.is_split() {
            (sign, sign * b.size as i64)
        } else {
            (0, 0)
        }
    }

    /// The facts of a failed request, counted and traced as an OOM.
    pub fn out_of_memory(
        &mut self,
        device: &dyn Device,
        request: (u64, u64, u64),
        allowed: Option<u64>,
        memory_limit: Option<u64>,
    ) -> Box<OutOfMemory> {
        self.stats.num_ooms += 1;
        let oom = OutOfMemory::at(device, request, &self.stats, allowed, memory_limit);
        self.trace
            .record(TraceAction::Oom, oom.device_free, oom.rounded, None);
        oom
    }

    /// Every segment with its blocks, by address.
    pub fn segments(&self) -> Vec<SegmentView> {
        self.segments
            .iter()
            .map(|(&address, s)| SegmentView {
                address,
                total_size: s.size,
                pool: self.blocks.get(s.head).pool,
                stream: self.blocks.get(s.head).stream,
                blocks: self
                    .segment_blocks(s.head)
                    .map(|(id, b)| view(id, b))
                    .collect(),
            })
            .collect()
    }

    fn segment_blocks(&self, head: BlockId) -> impl Iterator<Item = (BlockId, &Block)> + '_ {
        std::iter::successors(Some(head), |&id| {
            Some(self.blocks.get(id).next).filter(|&n| n != NIL)
        })
        .map(|id| (id, self.blocks.get(id)))
    }

    #[cfg(debug_assertions)]
    /// The arena's invariants: blocks tile their segments, links agree, no
    /// two free neighbours, every free block is in its pool and nothing
    /// else is, sizes are multiples of `granularity`, and every counter
    /// equals what the blocks add up to.
    pub fn check_invariants(&self, device: &dyn Device, granularity: u64) -> Result<(), Broken> {
        let mut sums = Sums::default();
        for (&address, s) in &self.segments {
            self.check_segment(address, s, granularity, &mut sums)?;
        }
        let pooled: usize = self.free.iter().map(|f| f.blocks.len()).sum();
        if sums.free as usize != pooled {
            return Err("a pool holds a block that is not in any segment".into());
        }
        self.check_counters(device, &sums)
    }

    #[cfg(debug_assertions)]
    fn check_segment(
        &self,
        address: u64,
        s: &Segment,
        granularity: u64,
        sums: &mut Sums,
    ) -> Result<(), Broken> {
        let (mut expect, mut prev, mut prev_free) = (address, NIL, false);
        let pool = self.blocks.get(s.head).pool;
        for (id, b) in self.segment_blocks(s.head) {
            if b.address != expect || b.prev != prev {
                return Err(Broken(format!("blocks do not tile segment {address:#x}")));
            }
            if b.pool != pool {
                return Err("a segment mixes pools".into());
            }
            if b.size % granularity != 0 {
                return Err(Broken(format!(
                    "block size {} is not a multiple of {granularity}",
                    b.size
                )));
            }
            if b.allocated {
                if b.requested > b.size {
                    return Err("requested size exceeds block size".into());
                }
                sums.allocated += b.size;
                sums.requested += b.requested;
                sums.allocations += 1;
            } else {
                if prev_free {
                    return Err(Broken(format!(
                        "two adjacent free blocks in segment {address:#x}"
                    )));
                }
                if !self.free[b.pool.index()]
                    .blocks
                    .contains(&(b.size, b.address, id))
                {
                    return Err("a free block is missing from its pool".into());
                }
                sums.free += 1;
                if b.is_split() {
                    sums.inactive_split_bytes += b.size;
                    sums.inactive_split += 1;
                }
            }
            prev_free = !b.allocated;
            expect = b.address + b.size;
            prev = id;
        }
        if expect - address != s.size {
            return Err(Broken(format!(
                "blocks of segment {address:#x} do not add up to its size"
            )));
        }
        sums.reserved += s.size;
        Ok(())
    }

    #[cfg(debug_assertions)]
    fn check_counters(&self, device: &dyn Device, sums: &Sums) -> Result<(), Broken> {
        let s = &self.stats;
        let checks = [
            ("reserved_bytes", s.reserved_bytes.current, sums.reserved),
            ("allocated_bytes", s.allocated_bytes.current, sums.allocated),
            ("active_bytes", s.active_bytes.current, sums.allocated),
            ("requested_bytes", s.requested_bytes.current, sums.requested),
            ("allocation", s.allocation.current, sums.allocations),
            ("active", s.active.current, sums.allocations),
            ("segment", s.segment.current, self.segments.len() as u64),
            (
                "inactive_split_bytes",
                s.inactive_split_bytes.current,
                sums.inactive_split_bytes,
            ),
            (
                "inactive_split",
                s.inactive_split.current,
                sums.inactive_split,
            ),
            (
                "device segment bytes",
                device.segment_bytes(),
                sums.reserved,
            ),
        ];
        for (name, stat, actual) in checks {
            if stat != actual {
                return Err(Broken(format!(
                    "{name} is {stat} but the blocks add up to {actual}"
                )));
            }
        }
        for stat in [&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes] {
            if stat.peak < stat.current {
                return Err("a peak is below its current value".into());
            }
        }
        Ok(())
    }
}

#[cfg(debug_assertions)]
/// What the blocks add up to, for [`Arena::check_invariants`].
#[derive(Default)]
struct Sums {
    reserved: u64,
    allocated: u64,
    requested: u64,
    allocations: u64,
    free: u64,
    inactive_split_bytes: u64,
    inactive_split: u64,
}

fn add(a: (i64, i64), b: (i64, i64)) -> (i64, i64) {
    (a.0 + b.0, a.1 + b.1)
}

fn view(id: BlockId, b: &Block) -> BlockView {
    BlockView {
        id: b.allocated.then_some(id),
        address: b.address,
        size: b.size,
        requested_size: b.requested,
        state: if b.allocated {
            BlockState::ActiveAllocated
        } else {
            BlockState::Inactive
        },
    }
}
