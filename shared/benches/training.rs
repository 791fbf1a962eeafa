//! One training step on the simulated GPU: the default model (4 x 1024,
//! batch 64, Adam) shape-only and with its arithmetic on the CPU, and an
//! 8 x 8192 model at batch 1024 shape-only; a GPT-2-small-sized transformer
//! (12 layers, 768 wide, 12 heads, vocabulary 50257) at batch 8, sequence
//! 1024, with eager and fused attention, with checkpointing and with LoRA of
//! rank 16; a CNN. Each
//! iteration is one `train {"steps":1}` command through the engine, event
//! log included.
//!
//! `cargo bench -p vramlab-shared --bench training`

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use vramlab_shared::units::GIB;
use vramlab_shared::Engine;

fn engine(layers: u32, width: u64, compute: bool) -> Engine {
    let model = json!({"cmd":"model","name":"model","layers":layers,"width":width});
    let mut e = built(model, json!({"cmd":"data","name":"data"}));
    e.set_arithmetic_flop_limit(if compute { u64::MAX } else { 0 });
    e
}

/// A fresh 141 GB PyTorch process with `model`, Adam and `data`.
fn built(model: serde_json::Value, data: serde_json::Value) -> Engine {
    let mut e = Engine::new_simulated();
    for cmd in [
        json!({"cmd":"restart","framework":"pytorch","device_total_bytes": 141 * GIB}),
        model,
        json!({"cmd":"optimizer","name":"opt","model":"model","kind":"adam"}),
        data,
    ] {
        assert!(e.run_line(&cmd.to_string()).ok);
    }
    e
}

/// GPT-2 small, with LoRA adapters of rank `lora_rank` if not 0.
fn gpt2(lora_rank: u64) -> Engine {
    let mut model = json!({"cmd":"model","name":"model","kind":"transformer","layers":12,"width":768,"heads":12,"seq_len":1024,"vocab":50257});
    if lora_rank > 0 {
        model["lora_rank"] = json!(lora_rank);
    }
    built(
        model,
        json!({"cmd":"data","name":"data","features":1024,"classes":50257}),
    )
}

fn step(e: &mut Engine, batch: u64) {
    step_with(e, batch, json!({}));
}

/// One step with the options in `extra` (`attention`, `checkpointing`).
fn step_with(e: &mut Engine, batch: u64, extra: serde_json::Value) {
    let mut cmd = json!({"cmd":"train","model":"model","optimizer":"opt","data":"data","steps":1,"batch_size":batch});
    for (k, v) in extra.as_object().expect("an object") {
        cmd[k] = v.clone();
    }
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
    let mut e = gpt2(0);
    for (name, extra) in [
        ("eager attention", json!({})),
        ("fused attention", json!({"attention":"sdpa"})),
        ("checkpointing", json!({"checkpointing":true})),
    ] {
        group.bench_function(
            format!("transformer 12x768 batch 8 seq 1024, {name}"),
            |b| b.iter(|| step_with(&mut e, 8, extra.clone())),
        );
    }
    let mut e = gpt2(16);
    group.bench_function("transformer 12x768 batch 8 seq 1024, LoRA rank 16", |b| {
        b.iter(|| step(&mut e, 8))
    });
    group.bench_function(
        "transformer 12x768 batch 8 seq 1024, LoRA rank 16, bfloat16 autocast",
        |b| b.iter(|| step_with(&mut e, 8, json!({"amp":"bfloat16"}))),
    );
    let mut e = built(
        json!({"cmd":"model","name":"model","kind":"cnn","channels":3,"image_size":224,"blocks":5,"width":64,"classes":1000}),
        json!({"cmd":"data","name":"data","features":3 * 224 * 224,"classes":1000}),
    );
    group.bench_function("CNN 5 blocks on 224x224 batch 64", |b| {
        b.iter(|| step(&mut e, 64))
    });
    group.bench_function(
        "CNN 5 blocks on 224x224 batch 64, checkpointed, float16 autocast",
        |b| b.iter(|| step_with(&mut e, 64, json!({"checkpointing":true,"amp":"float16"}))),
    );
    group.sample_size(10);
    let mut e = engine(4, 1024, true);
    group.bench_function("4x1024 batch 64, with arithmetic", |b| {
        b.iter(|| step(&mut e, 64))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
