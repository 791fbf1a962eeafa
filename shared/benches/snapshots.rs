//! Reading and replaying a PyTorch memory snapshot of 8.8 MB with
//! 40,000 trace events: a seeded random run of allocations and frees from
//! 1 KB to 32 MB made by the caching allocator, one stack frame on every
//! event (CPython's pickler shares repeated strings, which this writer does
//! not, so a real recording of that size holds more frames).
//!
//! `cargo bench -p vramlab-shared --bench snapshots`

use criterion::{criterion_group, criterion_main, Criterion};
use vramlab_shared::alloc::caching::{CachingAllocator, CachingConfig};
use vramlab_shared::alloc::{Allocator, TraceAction};
use vramlab_shared::device::{SimDevice, SimDeviceConfig};
use vramlab_shared::torch_snapshot::replay::replay_exact;
use vramlab_shared::torch_snapshot::{
    self, Action, Frame, MemorySnapshot, Segment, Stack, TraceEntry,
};

const EVENTS: usize = 40_000;

/// A recording from the process's start, made by the caching allocator
/// itself on a simulated device: up to 2,000 live tensors of 1 KB to 32 MB.
fn recording() -> MemorySnapshot {
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
    while events.len() < EVENTS {
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

fn bench(c: &mut Criterion) {
    let bytes = torch_snapshot::write_pickle(&recording());
    eprintln!("snapshot: {} bytes", bytes.len());
    c.bench_function("read a 40,000-event snapshot", |b| {
        b.iter(|| torch_snapshot::read(&bytes).unwrap())
    });
    let snapshot = torch_snapshot::read(&bytes).unwrap();
    let run = replay_exact(&snapshot, 0).unwrap();
    assert_eq!(run.exact, Some(true), "{:?}", run.first_difference);
    c.bench_function("replay 40,000 events", |b| {
        b.iter(|| replay_exact(&snapshot, 0).unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
