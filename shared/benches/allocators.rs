//! 1,000,000 random malloc/free operations with up to 10,000 live blocks, on
//! each allocator. Sizes are log-uniform from 1 B to 64 MiB; the simulated
//! device is large enough that nothing runs out of memory. Event recording
//! is off, as a long-running server would keep only a window of it.
//!
//! `cargo bench -p vramlab-shared --bench allocators`; the time reported is
//! for the whole million, so nanoseconds per operation = time / 1e6.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use vramlab_shared::alloc::bfc::{BfcAllocator, BfcConfig};
use vramlab_shared::alloc::caching::{CachingAllocator, CachingConfig};
use vramlab_shared::alloc::expandable::ExpandableAllocator;
use vramlab_shared::alloc::{Allocator, BlockId};
use vramlab_shared::device::{SimDevice, SimDeviceConfig};
use vramlab_shared::units::GIB;

const OPS: usize = 1_000_000;
const MAX_LIVE: usize = 10_000;
const DEVICE: u64 = 1024 * 1024 * GIB;

#[derive(Clone, Copy)]
enum Op {
    Malloc(u64),
    /// Free the live block at this index (modulo the live count).
    Free(usize),
}

/// A fixed, seeded sequence (xorshift64*), the same for every allocator.
fn ops() -> Vec<Op> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut live = 0usize;
    (0..OPS)
        .map(|_| {
            let r = next();
            let malloc = live == 0 || (live < MAX_LIVE && r % 2 == 0);
            if malloc {
                live += 1;
                let bits = (next() % 26) as u32; // up to 64 MiB
                let lo = 1u64 << bits;
                Op::Malloc(lo + next() % lo)
            } else {
                live -= 1;
                Op::Free(next() as usize)
            }
        })
        .collect()
}

fn play(allocator: &mut dyn Allocator, device: &mut SimDevice, ops: &[Op]) -> usize {
    let mut live: Vec<BlockId> = Vec::with_capacity(MAX_LIVE);
    for op in ops {
        match *op {
            Op::Malloc(bytes) => {
                let id = allocator
                    .malloc(device, bytes)
                    .expect("no OOM")
                    .expect("non-zero");
                live.push(id);
            }
            Op::Free(i) => {
                let id = live.swap_remove(i % live.len());
                allocator.free(device, id);
            }
        }
    }
    live.len()
}

fn device() -> SimDevice {
    SimDevice::new(SimDeviceConfig {
        total_bytes: DEVICE,
        context_bytes: 0,
        other_processes_bytes: 0,
        ..Default::default()
    })
}

fn bench(c: &mut Criterion) {
    let ops = ops();
    let mut group = c.benchmark_group("1M random malloc+free, <=10k live");
    group.sample_size(10);
    group.throughput(Throughput::Elements(OPS as u64));
    group.bench_function("pytorch caching allocator", |b| {
        b.iter_batched(
            || {
                let mut a = CachingAllocator::new(CachingConfig::default(), DEVICE);
                a.set_tracing(false);
                (a, device())
            },
            |(mut a, mut d)| play(&mut a, &mut d, &ops),
            BatchSize::PerIteration,
        )
    });
    group.bench_function("pytorch expandable segments", |b| {
        b.iter_batched(
            || {
                let mut a = ExpandableAllocator::new(CachingConfig::default(), DEVICE);
                a.set_tracing(false);
                (a, device())
            },
            |(mut a, mut d)| play(&mut a, &mut d, &ops),
            BatchSize::PerIteration,
        )
    });
    for (name, allow_growth) in [
        ("tensorflow bfc (allow_growth)", true),
        ("jax bfc (preallocated)", false),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let mut a = BfcAllocator::new(BfcConfig {
                        memory_limit: DEVICE / 2,
                        allow_growth,
                        garbage_collection: true,
                    });
                    a.set_tracing(false);
                    (a, device())
                },
                |(mut a, mut d)| play(&mut a, &mut d, &ops),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
