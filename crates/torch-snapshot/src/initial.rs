//! The allocator's state just before a trace's first event. A recording
//! usually starts mid-run, so the segment list at the dump is walked back
//! through the trace, newest event first: an `alloc` is undone by freeing
//! its block, a `free_completed` by bringing its block back, a
//! `segment_alloc` by removing the segment, a `segment_free` by restoring
//! it. Any event that does not fit the state (a free of a block that is
//! not there, a segment removed under live blocks) is reported. A block
//! live before the trace and freed during it has no size in the trace
//! (its free says what was asked for): it is its rounded request, or
//! more where the allocator would not have split the rest off, and it
//! ends no later than where a block is allocated right after it while it
//! lives (an allocation takes the start of a free block: what lay before
//! was not free).

use super::format::{Action, MemorySnapshot, TraceEntry};
use super::pools::{allocator_stream, DEFAULT_POOL};
use super::{SnapshotError, Unexpected};
use std::collections::{BTreeMap, HashMap};
use vramlab_device::alloc::caching::{
    pool_for_size, round_size, MIN_BLOCK_SIZE, SMALL_BUFFER, SMALL_SIZE,
};
use vramlab_device::alloc::PoolKind;

/// A segment as it was before the first event, with its live blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedSegment {
    pub address: u64,
    pub size: u64,
    pub stream: u64,
    pub pool: PoolKind,
    /// A CUDA graph's private pool (`segment_pool_id`), or the default
    /// pools' `(0, 0)`.
    pub pool_id: (u64, u64),
    /// A mapped range of an expandable segment.
    pub expandable: bool,
    /// Live blocks by address: (size, requested).
    pub blocks: BTreeMap<u64, (u64, u64)>,
}

impl SeedSegment {
    /// The stream the allocator keeps its blocks under (its pool's).
    pub fn allocator_stream(&self) -> u64 {
        allocator_stream(self.stream, self.pool_id)
    }
}

/// Every segment of one device before its trace's first event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InitialState {
    pub segments: BTreeMap<u64, SeedSegment>,
}

/// A live block whose size is not yet known (allocated before the trace
/// began, freed during it).
const UNKNOWN: u64 = 0;

/// Walks `device`'s trace back from the dump's segment list.
pub fn initial_state(
    snapshot: &MemorySnapshot,
    device: usize,
) -> Result<InitialState, SnapshotError> {
    state_before(snapshot, device, 0)
}

/// The state just before event `first`: the dump's segment list with the
/// events from `first` on undone.
pub fn state_before(
    snapshot: &MemorySnapshot,
    device: usize,
    first: usize,
) -> Result<InitialState, SnapshotError> {
    let mut state = final_state(snapshot, device)?;
    let mut ends = Ends::new();
    let trace = snapshot.trace(device).iter().enumerate().skip(first);
    for (index, event) in trace.rev() {
        ends.note(&state, &event);
        undo(&mut state, &event).map_err(|why| {
            SnapshotError::Replay(format!(
                "the trace contradicts its segment list at event {index} ({} at {:#x}, {} bytes): {why}",
                event.action.name(),
                event.addr,
                event.size
            ))
        })?;
    }
    estimate_unknown_sizes(&mut state, &ends.0)?;
    Ok(state)
}

/// Where each block of unknown size must end at the latest: the nearest
/// address allocated right after it (no live block between) while it
/// lived, by the block's address.
struct Ends(HashMap<u64, u64>);

impl Ends {
    fn new() -> Ends {
        Ends(HashMap::new())
    }

    /// Before `e` is undone (the state is the one just after it).
    fn note(&mut self, state: &InitialState, e: &TraceEntry) {
        match e.action {
            // The block that was at this address is another one before.
            Action::FreeCompleted => _ = self.0.remove(&e.addr),
            Action::Alloc => {
                self.0.remove(&e.addr);
                let before = (state.segments.range(..=e.addr).next_back())
                    .and_then(|(_, s)| s.blocks.range(..e.addr).next_back());
                if let Some((&at, &(UNKNOWN, _))) = before {
                    let end = self.0.entry(at).or_insert(e.addr);
                    *end = (*end).min(e.addr);
                }
            }
            _ => {}
        }
    }
}

fn final_state(snapshot: &MemorySnapshot, device: usize) -> Result<InitialState, SnapshotError> {
    let mut state = InitialState::default();
    for s in snapshot
        .segments
        .iter()
        .filter(|s| s.device as usize == device)
    {
        #[cfg(not(feature = "graph-pools"))]
        if s.segment_pool_id != DEFAULT_POOL {
            return Err(SnapshotError::Replay(format!(
                "segment {:#x} is in a CUDA graph's private pool {:?}: `vramlab replay` replays it, the page alone does not",
                s.address, s.segment_pool_id
            )));
        }
        let pool = if s.segment_type == "small" {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        let blocks = vramlab_core::collections::map_of(
            s.blocks
                .iter()
                .filter(|b| b.state.is_active())
                .map(|b| (b.address, (b.size, b.requested_size))),
        );
        let seed = SeedSegment {
            address: s.address,
            size: s.total_size,
            stream: s.stream,
            pool,
            pool_id: s.segment_pool_id,
            expandable: s.is_expandable,
            blocks,
        };
        state.segments.insert(s.address, seed);
    }
    Ok(state)
}

fn undo(state: &mut InitialState, e: &TraceEntry) -> Result<(), Unexpected> {
    if e.addr.checked_add(e.size).is_none() {
        return Err("the range runs past the end of the address space".into());
    }
    match e.action {
        Action::Alloc => {
            let segment = segment_of(state, e.addr)?;
            segment
                .blocks
                .remove(&e.addr)
                .map(drop)
                .ok_or_else(|| "no live block there at the end of it".into())
        }
        Action::FreeCompleted => {
            let segment = segment_of(state, e.addr)?;
            if segment.blocks.insert(e.addr, (UNKNOWN, e.size)).is_some() {
                return Err("a live block is already there".into());
            }
            Ok(())
        }
        Action::SegmentAlloc => match state.segments.remove(&e.addr) {
            Some(s) if s.blocks.is_empty() => Ok(()),
            Some(_) => Err("the segment still has live blocks".into()),
            None => Err("no such segment".into()),
        },
        Action::SegmentFree => {
            let pool = if e.size == SMALL_BUFFER {
                PoolKind::Small
            } else {
                PoolKind::Large
            };
            let seed = SeedSegment {
                address: e.addr,
                size: e.size,
                stream: e.stream,
                pool,
                pool_id: DEFAULT_POOL,
                expandable: false,
                blocks: BTreeMap::new(),
            };
            match state.segments.insert(e.addr, seed) {
                None => Ok(()),
                Some(_) => Err("a segment is already there".into()),
            }
        }
        Action::SegmentMap => unmap_range(state, e.addr, e.size),
        Action::SegmentUnmap => map_range(state, e),
        Action::FreeRequested | Action::Snapshot | Action::Oom | Action::Other(_) => Ok(()),
    }
}

fn segment_of(state: &mut InitialState, address: u64) -> Result<&mut SeedSegment, Unexpected> {
    state
        .segments
        .range_mut(..=address)
        .next_back()
        .map(|(_, s)| s)
        .filter(|s| address < s.address.saturating_add(s.size))
        .ok_or_else(|| "no segment holds that address".into())
}

/// Before a `segment_map`, its pages were not mapped: the range leaves the
/// mapped segment that holds it (which may split in two).
fn unmap_range(state: &mut InitialState, address: u64, size: u64) -> Result<(), Unexpected> {
    let segment = segment_of(state, address)?;
    let (start, end) = (
        segment.address,
        segment.address.saturating_add(segment.size),
    );
    if address.saturating_add(size) > end {
        return Err("the mapped range runs past its segment".into());
    }
    if segment
        .blocks
        .range(address..address + size)
        .next()
        .is_some()
    {
        return Err("live blocks sit in pages that were not yet mapped".into());
    }
    let mut whole = state.segments.remove(&start).expect("found above");
    let right_blocks = whole.blocks.split_off(&(address + size));
    for (from, to, blocks) in [
        (start, address, whole.blocks.clone()),
        (address + size, end, right_blocks),
    ] {
        if to > from {
            let part = SeedSegment {
                address: from,
                size: to - from,
                blocks,
                ..whole.clone()
            };
            state.segments.insert(from, part);
        }
    }
    whole.blocks.clear();
    Ok(())
}

/// Before a `segment_unmap`, its pages were mapped: the range joins the
/// mapped segments on either side.
fn map_range(state: &mut InitialState, e: &TraceEntry) -> Result<(), Unexpected> {
    if segment_of(state, e.addr).is_ok() {
        return Err("the pages are mapped already".into());
    }
    let mut joined = SeedSegment {
        address: e.addr,
        size: e.size,
        stream: e.stream,
        pool: if e.size <= SMALL_BUFFER {
            PoolKind::Small
        } else {
            PoolKind::Large
        },
        pool_id: DEFAULT_POOL,
        expandable: true,
        blocks: BTreeMap::new(),
    };
    let before = state
        .segments
        .range(..e.addr)
        .next_back()
        .map(|(_, s)| s.clone());
    if let Some(left) =
        before.filter(|s| s.expandable && s.address.checked_add(s.size) == Some(e.addr))
    {
        state.segments.remove(&left.address);
        joined.blocks.extend(left.blocks);
        joined.pool = left.pool;
        (joined.address, joined.size) = (left.address, left.size + e.size);
    }
    if let Some(right) = state.segments.remove(&e.addr.saturating_add(e.size)) {
        if right.expandable {
            joined.size = joined.size.saturating_add(right.size);
            joined.blocks.extend(right.blocks);
        } else {
            state.segments.insert(right.address, right);
        }
    }
    state.segments.insert(joined.address, joined);
    Ok(())
}

/// A block that was live before the trace and freed during it: its size is
/// its rounded request, or up to the next live block (or the nearest
/// block allocated after it while it lived: [`Ends`]) when the rest would
/// have been too small to split off (`should_split`). Segments that
/// overlap, or live blocks outside their segment or over each other, are
/// no state an allocator can rebuild.
fn estimate_unknown_sizes(
    state: &mut InitialState,
    ends: &HashMap<u64, u64>,
) -> Result<(), SnapshotError> {
    let mut segments_end = 0;
    for segment in state.segments.values_mut() {
        let overlap = || {
            SnapshotError::Replay(format!(
                "segment {:#x} overlaps another, or a live block in it does",
                segment.address
            ))
        };
        let end = segment.address.checked_add(segment.size);
        let end = end.filter(|&e| segment.address >= segments_end && e > segment.address);
        let end = end.ok_or_else(overlap)?;
        segments_end = end;
        let starts: Vec<u64> = segment.blocks.keys().copied().collect();
        // Where the blocks so far end.
        let mut at = segment.address;
        for (i, &address) in starts.iter().enumerate() {
            if address < at || address >= end {
                return Err(overlap());
            }
            let (mut size, requested) = segment.blocks[&address];
            if size == UNKNOWN {
                let next = starts.get(i + 1).copied().unwrap_or(end);
                let next = ends.get(&address).map_or(next, |&e| e.clamp(address, next));
                let room = next - address;
                let rounded = round_size(requested, &Default::default()).min(room);
                let keep_whole = match pool_for_size(rounded) {
                    PoolKind::Small => room - rounded < MIN_BLOCK_SIZE,
                    _ => room - rounded <= SMALL_SIZE,
                };
                size = if keep_whole { room } else { rounded };
                segment.blocks.insert(address, (size, requested));
            }
            at = address.saturating_add(size);
        }
        if at > end {
            return Err(overlap());
        }
    }
    Ok(())
}
