//! "Will it fit?" answered as the CLI and the planner's page ask it
//! (`ask::answer_text`): Llama-3.1-8B on an RTX 4090, its `generate`
//! (1 x 512 + 64 tokens), a LoRA step and a QLoRA step of 1 x 2048
//! tokens, each with the largest batch and the longest sequence searched.
//!
//! `cargo bench -p vramlab-hf --bench planner`

use criterion::{criterion_group, criterion_main, Criterion};
use vramlab_hf::ask::answer_text;

const ASKS: [(&str, &str); 3] = [
    (
        "generate 1 x 512 + 64",
        r#"{"model":"Llama-3.1-8B","gpu":"rtx-4090","task":"generate","batch":1,"prompt":512,"new_tokens":64}"#,
    ),
    (
        "LoRA 1 x 2048, checkpointing",
        r#"{"model":"Llama-3.1-8B","gpu":"rtx-4090","task":"lora","seq":2048,"checkpointing":true}"#,
    ),
    (
        "QLoRA 1 x 2048",
        r#"{"model":"Llama-3.1-8B","gpu":"rtx-4090","task":"qlora","seq":2048}"#,
    ),
];

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("will it fit: Llama-3.1-8B on an RTX 4090");
    group.sample_size(10);
    for (name, ask) in ASKS {
        assert!(answer_text(ask).contains("peak"), "{name} answers");
        group.bench_function(name, |b| b.iter(|| answer_text(ask)));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
