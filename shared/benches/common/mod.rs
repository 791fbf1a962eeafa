//! A synthetic recording, for the snapshot benchmark and the
//! `synthetic_snapshot` example (a file of any size to measure with).

use vramlab_shared::alloc::caching::{CachingAllocator, CachingConfig};
use vramlab_shared::alloc::{Allocator, TraceAction};
use vramlab_shared::device::{SimDevice, SimDeviceConfig};
use vramlab_shared::torch_snapshot::{Action, Frame, MemorySnapshot, Segment, Stack, TraceEntry};

/// A recording of `events` trace events from the process's start, made by
/// the caching allocator itself on a simulated device: up to 2,000 live
/// tensors of 1 KB to 32 MB, one stack frame on every event.
pub fn recording(events_wanted: usize) -> MemorySnapshot {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let frames: Stack = (0..1)
        .map(|i| Frame {
            filename: format!(
                "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module{i}.py"
            )
            .into(),
            line: 1500 + i,
            name: format!("_call_impl_{i}").into(),
        })
        .collect();
    let mut device = SimDevice::new(SimDeviceConfig {
        total_bytes: 1 << 50,
        context_bytes: 0,
        ..Default::default()
    });
    let mut allocator = CachingAllocator::new(CachingConfig::default(), 1 << 50);
    allocator.set_tracing(true);
    let (mut live, mut events) = (Vec::new(), Vec::new());
    while events.len() < events_wanted {
        if live.is_empty() || (live.len() < 2000 && next() % 2 == 0) {
            let size = 1024 << (next() % 16);
            live.push(allocator.malloc(&mut device, size).unwrap().unwrap());
        } else {
            let victim = live.swap_remove((next() % live.len() as u64) as usize);
            allocator.free(&mut device, victim);
        }
        allocator.drain_trace(&mut events);
    }
    let trace = events
        .iter()
        .map(|e| TraceEntry {
            action: match e.action {
                TraceAction::Alloc => Action::Alloc,
                TraceAction::Free => Action::FreeCompleted,
                TraceAction::SegmentAlloc => Action::SegmentAlloc,
                TraceAction::SegmentFree => Action::SegmentFree,
                TraceAction::Oom => Action::Oom,
            },
            addr: e.address,
            size: e.size,
            stream: 0,
            device_free: None,
            time_us: None,
            frames: frames.clone(),
        })
        .collect();
    MemorySnapshot {
        segments: (allocator.segments().iter())
            .map(|s| Segment::from_view(s, |_| Stack::default()))
            .collect(),
        device_traces: vec![trace],
        allocator_settings: None,
    }
}
