//! A what-if replay written as a memory snapshot: the allocator's own
//! trace under the new settings (each event with the stream and stack
//! frames of the recorded request that caused it), its segments at the
//! end, and the settings it ran with, so that memory_viz draws it and an
//! exact replay follows it.

use super::{what_if_settings, Replay};
use crate::format::{Action, AllocatorSettings, MemorySnapshot, Segment, Stack, TraceEntry};
use crate::{SnapshotError, Trace};
use std::collections::HashMap;
use vramlab_device::alloc::{SegmentView, TraceAction, TraceEvent};
use vramlab_device::framework::{RestartSettings, Settings};

/// Replays `device`'s trace under `what_if` and writes that run as a
/// snapshot.
pub fn export_what_if(
    snapshot: &MemorySnapshot,
    device: usize,
    what_if: &RestartSettings,
) -> Result<MemorySnapshot, SnapshotError> {
    let settings = what_if_settings(snapshot, what_if)?;
    let mut replay = Replay::new(snapshot, device, settings.clone(), false)?;
    replay.process.allocator().set_tracing(true);
    let (mut trace, mut drained) = (Trace::default(), Vec::new());
    let record = |trace: &mut Trace, drained: &mut Vec<TraceEvent>, cause: &TraceEntry| {
        for t in drained.drain(..) {
            for e in entries(&t, cause, &settings) {
                trace.push(e).map_err(|e| SnapshotError::Replay(e.0))?;
            }
        }
        Ok::<_, SnapshotError>(())
    };
    let recorded = replay.trace;
    for (index, e) in recorded.iter().enumerate() {
        replay.step(index, &e);
        replay.process.allocator().drain_trace(&mut drained);
        record(&mut trace, &mut drained, &e)?;
    }
    let frames: HashMap<_, _> = replay
        .blocks
        .values()
        .map(|&(id, origin)| (id, origin.map(|i| recorded.frames(i).clone())))
        .collect();
    let segments = replay
        .process
        .allocator()
        .segments()
        .into_iter()
        .map(|s| {
            let (stream, segment_pool_id) = replay.routes.recorded(s.stream);
            Segment {
                stream,
                segment_pool_id,
                ..segment(s, &frames, device, settings.expandable_segments)
            }
        })
        .collect();
    let mut device_traces = vec![Trace::default(); device + 1];
    device_traces[device] = trace;
    Ok(MemorySnapshot {
        segments,
        device_traces,
        allocator_settings: Some(allocator_settings(&settings)),
    })
}

/// What PyTorch records for one allocator event caused by the recorded
/// `cause`: sizes of blocks as the caller asked (the recorded request),
/// an expandable range's growth as `segment_map`.
fn entries(t: &TraceEvent, cause: &TraceEntry, settings: &Settings) -> Vec<TraceEntry> {
    let entry = |action: Action, size: u64| TraceEntry {
        addr: t.address,
        size,
        stream: cause.stream,
        frames: cause.frames.clone(),
        ..TraceEntry::new(action)
    };
    let expandable = settings.expandable_segments;
    match t.action {
        TraceAction::Alloc => vec![entry(Action::Alloc, cause.size)],
        TraceAction::Free => vec![
            entry(Action::FreeRequested, cause.size),
            entry(Action::FreeCompleted, cause.size),
        ],
        TraceAction::SegmentAlloc if expandable => vec![entry(Action::SegmentMap, t.size)],
        TraceAction::SegmentAlloc => vec![entry(Action::SegmentAlloc, t.size)],
        TraceAction::SegmentFree if expandable => vec![entry(Action::SegmentUnmap, t.size)],
        TraceAction::SegmentFree => vec![entry(Action::SegmentFree, t.size)],
        TraceAction::Oom => vec![TraceEntry {
            addr: 0,
            device_free: Some(t.address),
            ..entry(Action::Oom, t.size)
        }],
    }
}

fn segment(
    s: SegmentView,
    frames: &HashMap<vramlab_device::alloc::BlockId, Option<Stack>>,
    device: usize,
    expandable: bool,
) -> Segment {
    Segment {
        device: device as u32,
        is_expandable: expandable,
        ..Segment::from_view(&s, |id| {
            frames.get(&id).cloned().flatten().unwrap_or_default()
        })
    }
}

/// `allocator_settings` as PyTorch writes them for these settings.
fn allocator_settings(s: &Settings) -> AllocatorSettings {
    let mut conf = Vec::new();
    if s.expandable_segments {
        conf.push("expandable_segments:True".to_string());
    }
    if let Some(mb) = s.max_split_size_mb {
        conf.push(format!("max_split_size_mb:{mb}"));
    }
    if s.garbage_collection_threshold > 0.0 {
        conf.push(format!(
            "garbage_collection_threshold:{}",
            s.garbage_collection_threshold
        ));
    }
    let divisions = s.roundup_power2_divisions.per_interval();
    AllocatorSettings {
        alloc_conf: conf.join(","),
        max_split_size: s
            .max_split_size_mb
            .map_or(-1, |mb| i64::try_from(mb << 20).unwrap_or(i64::MAX)),
        garbage_collection_threshold: s.garbage_collection_threshold,
        expandable_segments: s.expandable_segments,
        roundup_power2_divisions: (divisions.iter().enumerate())
            .map(|(i, &d)| ((1u64 << i).to_string(), d))
            .collect(),
    }
}
