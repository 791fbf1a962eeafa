//! A vramlab session as a PyTorch memory snapshot: its segments and blocks
//! (each live block's one frame names the tensor and its category, which
//! memory_viz shows as the block's stack) and its event log as the device
//! trace. A `restart` ends a process, so only events after the last one
//! are written. The log keeps a bounded window; when it dropped older
//! events the trace starts mid-run, as a real recording often does.

use super::format::{
    Action, AllocatorSettings, Block, BlockState, Frame, MemorySnapshot, Segment, TraceEntry,
};
use vramlab_device::alloc::BlockState as EngineState;
use vramlab_process::snapshot::{Event, EventAction, Snapshot};

/// What a memory snapshot holds of a vramlab snapshot.
pub fn from_session(session: &Snapshot) -> MemorySnapshot {
    let segments = session.segments.iter().map(segment).collect();
    let since_restart = session
        .events
        .iter()
        .rposition(|e| e.action == EventAction::Restart)
        .map_or(0, |i| i + 1);
    let events = &session.events[since_restart..];
    let causes = segment_causes(events);
    // PyTorch records a free with the size its caller asked for.
    let mut requested = std::collections::HashMap::new();
    let mut trace = Vec::new();
    for (e, cause) in events.iter().zip(causes) {
        let size = match e.action {
            EventAction::Alloc => {
                requested.insert(e.address, e.size);
                e.size
            }
            EventAction::Free => requested.remove(&e.address).unwrap_or(e.size),
            _ => e.size,
        };
        trace.extend(trace_entries(e, size, cause));
    }
    MemorySnapshot {
        segments,
        device_traces: vec![trace.into()],
        allocator_settings: None,
    }
}

fn segment(s: &vramlab_process::snapshot::SegmentSnapshot) -> Segment {
    let blocks: Vec<Block> = s
        .blocks
        .iter()
        .map(|b| Block {
            address: b.address,
            size: b.size,
            requested_size: b.requested_size,
            state: match b.state {
                EngineState::ActiveAllocated => BlockState::ActiveAllocated,
                EngineState::Inactive => BlockState::Inactive,
            },
            frames: b
                .owner
                .iter()
                .map(|owner| owner_frame(owner, b.category))
                .collect(),
        })
        .collect();
    Segment {
        address: s.address,
        total_size: s.total_size,
        segment_type: if s.pool == "small" { "small" } else { "large" }.into(),
        blocks,
        ..Segment::default()
    }
    .summed()
}

fn owner_frame(owner: &str, category: Option<vramlab_core::types::Category>) -> Frame {
    Frame {
        filename: "vramlab".into(),
        line: 0,
        name: match category {
            Some(c) => format!("{owner} ({})", c.name()).into(),
            None => owner.into(),
        },
    }
}

/// A freed block is `free_requested` then `free_completed` (one stream:
/// nothing waits).
/// A session whose allocator ran with expandable segments, as PyTorch
/// writes one: each mapping and unmapping of pages a `segment_map` or
/// `segment_unmap`, each mapped range an expandable segment, and
/// `allocator_settings` saying so.
pub fn with_expandable_segments(mut s: MemorySnapshot) -> MemorySnapshot {
    for segment in &mut s.segments {
        segment.is_expandable = true;
    }
    for trace in &mut s.device_traces {
        let entries: Vec<TraceEntry> = trace
            .iter()
            .map(|mut e| {
                e.action = match e.action {
                    Action::SegmentAlloc => Action::SegmentMap,
                    Action::SegmentFree => Action::SegmentUnmap,
                    other => other,
                };
                e
            })
            .collect();
        *trace = entries.into();
    }
    s.allocator_settings = Some(AllocatorSettings {
        alloc_conf: "expandable_segments:True".into(),
        max_split_size: -1,
        expandable_segments: true,
        ..AllocatorSettings::default()
    });
    s
}

/// Whose stack each segment event carries, as PyTorch records it: the
/// request that made it or released the cache before retrying (the next
/// allocation of the same command; `malloc` gathers its context once),
/// else the program's `empty_cache()`.
fn segment_causes(events: &[Event]) -> Vec<Option<&str>> {
    let mut causes = vec![None; events.len()];
    let mut next_alloc: Option<(u64, &str)> = None;
    for (i, e) in events.iter().enumerate().rev() {
        match e.action {
            EventAction::Alloc => next_alloc = e.name.as_deref().map(|n| (e.step, n)),
            EventAction::SegmentAlloc | EventAction::SegmentFree => {
                causes[i] = match next_alloc {
                    Some((step, name)) if step == e.step => Some(name),
                    _ if e.action == EventAction::SegmentFree => Some(EMPTY_CACHE),
                    _ => None,
                }
            }
            _ => {}
        }
    }
    causes
}

/// The frame of a release no request made.
const EMPTY_CACHE: &str = "torch.cuda.empty_cache()";

fn trace_entries(e: &Event, size: u64, cause: Option<&str>) -> Vec<TraceEntry> {
    let name = e.name.as_deref().or(cause);
    let entry = |action: Action| TraceEntry {
        action,
        addr: e.address,
        size,
        stream: 0,
        device_free: None,
        time_us: None,
        frames: name.iter().map(|n| owner_frame(n, None)).collect(),
    };
    match e.action {
        EventAction::Alloc => vec![entry(Action::Alloc)],
        EventAction::Free => vec![entry(Action::FreeRequested), entry(Action::FreeCompleted)],
        EventAction::SegmentAlloc => vec![entry(Action::SegmentAlloc)],
        EventAction::SegmentFree => vec![entry(Action::SegmentFree)],
        // The log keeps the driver's free bytes where the address goes.
        EventAction::Oom => vec![TraceEntry {
            addr: 0,
            device_free: Some(e.address),
            ..entry(Action::Oom)
        }],
        EventAction::Restart => Vec::new(),
    }
}
