//! Reading and replaying a PyTorch memory snapshot of 8.8 MB with
//! 40,000 trace events: a seeded random run of allocations and frees from
//! 1 KB to 32 MB made by the caching allocator, one stack frame on every
//! event (CPython's pickler shares repeated strings, which this writer does
//! not, so a real recording of that size holds more frames).
//!
//! `cargo bench -p vramlab-shared --bench snapshots`

use criterion::{criterion_group, criterion_main, Criterion};
use vramlab_shared::torch_snapshot::{self, replay::replay_exact};

mod common;

const EVENTS: usize = 40_000;

fn bench(c: &mut Criterion) {
    let bytes = torch_snapshot::write_pickle(&common::recording(EVENTS));
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
