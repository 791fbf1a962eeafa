//! Encoding a full snapshot of a session with 10,000 live blocks, as the
//! server sends it on connect and on request.
//!
//! `cargo bench -p vramlab-server --bench snapshot`

use criterion::{criterion_group, criterion_main, Criterion};
use vramlab_shared::protocol::ServerMessage;
use vramlab_shared::Engine;

fn bench(c: &mut Criterion) {
    let mut e = Engine::new_simulated();
    for i in 0..10_000u64 {
        let size = 512 + (i * 7919) % (3 << 20);
        let line = format!("{{\"cmd\":\"alloc\",\"name\":\"t{i}\",\"bytes\":{size}}}");
        assert!(e.run_line(&line).ok);
    }
    let snapshot = e.snapshot(0);
    let blocks: usize = snapshot.segments.iter().map(|s| s.blocks.len()).sum();
    assert!(blocks >= 10_000, "{blocks} blocks");
    let msg = ServerMessage::Snapshot {
        snapshot: Box::new(snapshot),
    };
    let bytes = serde_json::to_string(&msg).unwrap().len();
    println!(
        "full snapshot: {blocks} blocks, {} objects, {bytes} bytes of JSON",
        10_000
    );
    c.bench_function("encode full snapshot, 10k blocks", |b| {
        b.iter(|| serde_json::to_string(&msg).unwrap())
    });
    c.bench_function("build + encode full snapshot, 10k blocks", |b| {
        b.iter(|| {
            serde_json::to_string(&ServerMessage::Snapshot {
                snapshot: Box::new(e.snapshot(0)),
            })
            .unwrap()
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
