//! One training step on the simulated GPU: the default model (4 x 1024,
//! batch 64, Adam) shape-only and with its arithmetic on the CPU, and an
//! 8 x 8192 model at batch 1024 shape-only. Each iteration is one
//! `train {"steps":1}` command through the engine, event log included.
//!
//! `cargo bench -p vramlab-shared --bench training`

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use vramlab_shared::units::GIB;
use vramlab_shared::Engine;

fn engine(layers: u32, width: u64, compute: bool) -> Engine {
    let mut e = Engine::new_simulated();
    for cmd in [
        json!({"cmd":"restart","framework":"pytorch","device_total_bytes": 141 * GIB}),
        json!({"cmd":"model","name":"model","layers":layers,"width":width}),
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
        json!({"cmd":"data","name":"data"}),
    ] {
        assert!(e.run_line(&cmd.to_string()).ok);
    }
    e.set_arithmetic_flop_limit(if compute { u64::MAX } else { 0 });
    e
}

fn step(e: &mut Engine, batch: u64) {
    let cmd = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"batch_size":batch});
    let r = e.run_line(&cmd.to_string());
    assert!(r.ok, "{:?}", r.error);
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("training step");
    let mut e = engine(4, 1024, false);
    group.bench_function("4x1024 batch 64, shape-only", |b| {
        b.iter(|| step(&mut e, 64))
    });
    let mut e = engine(8, 8192, false);
    group.bench_function("8x8192 batch 1024, shape-only", |b| {
        b.iter(|| step(&mut e, 1024))
    });
    group.sample_size(10);
    let mut e = engine(4, 1024, true);
    group.bench_function("4x1024 batch 64, with arithmetic", |b| {
        b.iter(|| step(&mut e, 64))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
