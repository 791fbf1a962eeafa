//! A window of a recording: events `i..j` as a recording of their own, so
//! that a file too large to open (memory_viz stops at about a gigabyte)
//! can be looked at a stretch at a time. The trace is cut to the window;
//! the segment list is the recording's own state after its last event
//! (the dump's, with the later events undone), each live block with the
//! stack of the event that allocated it, the free space between as
//! inactive blocks. `replay` follows it from its first event, rebuilding
//! the state there as for any recording that starts mid-run.

use super::format::{Action, Block, BlockState, MemorySnapshot, Segment, Stack};
use super::initial::{state_before, SeedSegment};
use super::replay::{replay_exact, replay_what_if};
use super::{SnapshotError, Trace};
use std::collections::HashMap;
use std::ops::Range;
use vramlab_device::alloc::PoolKind;

/// Events `range` of `device`'s trace (its end cut to the trace's).
pub fn window(
    snapshot: &MemorySnapshot,
    device: usize,
    range: Range<usize>,
) -> Result<MemorySnapshot, SnapshotError> {
    let recorded = snapshot.trace(device);
    let end = range.end.min(recorded.len());
    if range.start >= end {
        return Err(SnapshotError::Replay(format!(
            "events {}..{} hold none of the trace's {} events",
            range.start,
            range.end,
            recorded.len()
        )));
    }
    let state = state_before(snapshot, device, end)?;
    // Each live block's stack: the last allocation at its address before
    // the window's end, or the dump's when it was live all along.
    let mut origin: HashMap<u64, usize> = HashMap::new();
    for (k, e) in recorded.iter().enumerate().take(end) {
        match e.action {
            Action::Alloc => _ = origin.insert(e.addr, k),
            Action::FreeCompleted => _ = origin.remove(&e.addr),
            _ => {}
        }
    }
    let dumped: HashMap<u64, &Stack> = (snapshot.segments.iter())
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state.is_active())
        .map(|b| (b.address, &b.frames))
        .collect();
    let frames = |address: u64| match origin.get(&address) {
        Some(&k) => recorded.frames(k).clone(),
        None => dumped.get(&address).map(|&f| f.clone()).unwrap_or_default(),
    };
    let segments = (state.segments.values())
        .map(|s| segment(s, device, &frames))
        .collect();
    let mut trace = Trace::default();
    for e in recorded.iter().take(end).skip(range.start) {
        trace.push(e).map_err(|e| SnapshotError::Replay(e.0))?;
    }
    let mut device_traces = vec![Trace::default(); device + 1];
    device_traces[device] = trace;
    Ok(MemorySnapshot {
        segments,
        device_traces,
        allocator_settings: snapshot.allocator_settings.clone(),
    })
}

/// The events `n` either side of the moment allocated memory peaks (in
/// the exact replay, or under the recorded settings where the recording
/// cannot be replayed exactly), and that moment.
pub fn around_peak(
    snapshot: &MemorySnapshot,
    device: usize,
    n: usize,
) -> Result<(Range<usize>, usize), SnapshotError> {
    let run = match replay_exact(snapshot, device) {
        Ok(run) => run,
        Err(_) => replay_what_if(snapshot, device, &Default::default())?,
    };
    // The first event at the peak.
    let peak = (run.timeline.iter())
        .max_by_key(|p| (p.allocated_bytes, std::cmp::Reverse(p.event)))
        .map_or(0, |p| p.event);
    Ok((peak.saturating_sub(n)..peak.saturating_add(n + 1), peak))
}

/// A segment of the state, its live blocks and the gaps between them.
fn segment(s: &SeedSegment, device: usize, frames: &impl Fn(u64) -> Stack) -> Segment {
    let mut blocks = Vec::new();
    let mut at = s.address;
    let end = s.address + s.size;
    let gap = |from: u64, to: u64| Block {
        address: from,
        size: to - from,
        state: BlockState::Inactive,
        ..Block::default()
    };
    for (&address, &(size, requested)) in &s.blocks {
        if address > at {
            blocks.push(gap(at, address));
        }
        blocks.push(Block {
            address,
            size,
            requested_size: requested,
            state: BlockState::ActiveAllocated,
            frames: frames(address),
        });
        at = address + size;
    }
    if end > at {
        blocks.push(gap(at, end));
    }
    Segment {
        device: device as u32,
        address: s.address,
        total_size: s.size,
        stream: s.stream,
        segment_type: match s.pool {
            PoolKind::Small => "small",
            _ => "large",
        }
        .into(),
        is_expandable: s.expandable,
        segment_pool_id: s.pool_id,
        blocks,
        ..Segment::default()
    }
    .summed()
}
