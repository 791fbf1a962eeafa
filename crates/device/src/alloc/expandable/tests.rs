//! Expandable segments, pinned by exact values.

use super::*;
use crate::device::{SimDevice, SimDeviceConfig};
use vramlab_core::units::{GIB, MIB};

fn setup(total: u64, context: u64) -> (ExpandableAllocator, SimDevice) {
    let dev = SimDevice::new(SimDeviceConfig {
        total_bytes: total,
        context_bytes: context,
        ..Default::default()
    });
    (
        ExpandableAllocator::new(CachingConfig::default(), total),
        dev,
    )
}

fn ok(a: &mut ExpandableAllocator, dev: &mut SimDevice, bytes: u64) -> BlockId {
    let id = a.malloc(dev, bytes).unwrap().unwrap();
    a.check_invariants(dev).unwrap();
    id
}

/// Lesson 5's fragmentation OOM does not happen: the three 100 MiB holes
/// are whole 20 MiB pages, unmapped on the retry, and the 150 MiB tensor
/// maps 160 MiB at the end of the range.
#[test]
fn holes_are_unmapped_and_the_space_grows_at_its_end() {
    let (mut a, mut dev) = setup(GIB, 300 * MIB);
    let big = ok(&mut a, &mut dev, 700 * MIB);
    assert_eq!(a.stats().reserved_bytes.current, 700 * MIB);
    assert_eq!(a.stats().num_device_alloc, 1);
    assert_eq!(dev.segment_bytes(), 700 * MIB);
    a.free(&mut dev, big);
    let t: Vec<BlockId> = (0..7).map(|_| ok(&mut a, &mut dev, 100 * MIB)).collect();
    assert_eq!(a.stats().reserved_bytes.current, 700 * MIB);
    for i in [0, 2, 4] {
        a.free(&mut dev, t[i]);
    }
    assert_eq!(a.stats().inactive_split_bytes.current, 0);
    let z = ok(&mut a, &mut dev, 150 * MIB);
    let s = a.stats();
    assert_eq!(a.block_size(z), 150 * MIB);
    assert_eq!(s.allocated_bytes.current, 550 * MIB);
    assert_eq!(s.reserved_bytes.current, 560 * MIB);
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!((s.num_device_alloc, s.num_device_free), (2, 3));
    assert_eq!(s.segment.current, 0);
    // Mapped ranges: [b], [d], [f, g, z and 10 MiB free].
    let segments = a.segments();
    let sizes: Vec<u64> = segments.iter().map(|s| s.total_size / MIB).collect();
    assert_eq!(sizes, vec![100, 100, 360]);
    assert_eq!(segments[2].address, FIRST_BASE + 400 * MIB + 100 * MIB);
}

/// Small requests map 2 MiB pages; a block splits whenever 512 bytes
/// remain; `empty_cache` unmaps whole free pages, also in a range that
/// still holds a live block, and keeps partial ones.
#[test]
fn empty_cache_unmaps_every_whole_free_page() {
    let (mut a, mut dev) = setup(GIB, 0);
    let x = ok(&mut a, &mut dev, 1000);
    assert_eq!(a.block_size(x), 1024);
    assert_eq!(a.stats().reserved_bytes.current, 2 * MIB);
    // 30 MiB in the large pool: two 20 MiB pages, 10 MiB left free.
    let y = ok(&mut a, &mut dev, 30 * MIB);
    let z = ok(&mut a, &mut dev, 5 * MIB);
    assert_eq!(a.stats().reserved_bytes.current, 42 * MIB);
    assert_eq!(a.block_size(y) + a.block_size(z), 35 * MIB);
    a.free(&mut dev, y);
    // Free: [0, 30 MiB) of the large range; z lives at [30, 35).
    assert_eq!(a.empty_cache(&mut dev), Some(20 * MIB));
    assert_eq!(a.stats().reserved_bytes.current, 22 * MIB);
    assert_eq!(dev.segment_bytes(), 22 * MIB);
    a.check_invariants(&dev).unwrap();
    a.free(&mut dev, z);
    a.free(&mut dev, x);
    assert_eq!(a.empty_cache(&mut dev), Some(22 * MIB));
    assert_eq!(a.stats().reserved_bytes.current, 0);
    assert!(a.segments().is_empty());
    a.check_invariants(&dev).unwrap();
}

/// No device memory for the pages: release, retry, then the OOM, with
/// the sizes PyTorch reports.
#[test]
fn out_of_memory_after_one_retry() {
    let (mut a, mut dev) = setup(100 * MIB, 0);
    let _x = ok(&mut a, &mut dev, 50 * MIB);
    let err = a.malloc(&mut dev, 60 * MIB).unwrap_err();
    let oom = err.out_of_memory().unwrap();
    assert_eq!((oom.requested, oom.alloc_size), (60 * MIB, 60 * MIB));
    let s = a.stats();
    assert_eq!((s.num_ooms, s.num_alloc_retries), (1, 1));
    assert_eq!(s.reserved_bytes.current, 60 * MIB);
    a.check_invariants(&dev).unwrap();
}

/// A recording that starts mid-run: a mapped range seeded where it was,
/// a live block carved in it; then the allocator goes on from that state
/// (a 4 MiB request takes the free 20 MiB before the block, whose
/// "expandable size" is smaller than the 12 MiB's after it, which
/// unmapped space follows).
#[test]
fn a_seeded_range_and_block_are_the_state_it_goes_on_from() {
    let (mut a, mut dev) = setup(GIB, 0);
    let base = 0x7f00_0000_0000;
    a.seed_range(&mut dev, (PoolKind::Large, 0, base), base, 40 * MIB)
        .unwrap();
    let live = a
        .seed_block(
            (PoolKind::Large, 0),
            base + 20 * MIB,
            (8 * MIB, 8 * MIB - 100),
        )
        .unwrap();
    a.check_invariants(&dev).unwrap();
    assert_eq!(a.stats().reserved_bytes.current, 40 * MIB);
    assert_eq!(a.stats().allocated_bytes.current, 8 * MIB);
    assert_eq!(a.stats().requested_bytes.current, 8 * MIB - 100);
    assert_eq!(a.block_size(live), 8 * MIB);
    let next = ok(&mut a, &mut dev, 4 * MIB);
    let at = |a: &ExpandableAllocator, id| {
        (a.segments().iter().flat_map(|s| s.blocks.clone()))
            .find(|b| b.id == Some(id))
            .map(|b| b.address)
    };
    assert_eq!(at(&a, next), Some(base));
    assert_eq!(at(&a, live), Some(base + 20 * MIB));
    // Outside mapped free space, or not whole pages: refused.
    assert!(a
        .seed_block((PoolKind::Large, 0), base + 36 * MIB, (8 * MIB, 8 * MIB))
        .is_err());
    assert!(a
        .seed_range(&mut dev, (PoolKind::Large, 0, base), base + 50 * MIB, MIB)
        .is_err());
    assert!(a
        .seed_range(
            &mut dev,
            (PoolKind::Large, 0, base),
            base + 20 * MIB,
            20 * MIB
        )
        .is_err());
}

/// Each stream has ranges of its own (`find_expandable_block` makes an
/// expandable segment per stream and pool): a block freed on one stream
/// is not handed to another, whose first request maps pages in a new
/// range after the first; `empty_cache` unmaps both, the default stream's
/// first.
#[test]
fn each_stream_has_its_own_ranges() {
    let (mut a, mut dev) = setup(GIB, 0);
    let x = a.malloc_on(&mut dev, 40 * MIB, 0).unwrap().unwrap();
    a.free(&mut dev, x);
    let y = a.malloc_on(&mut dev, 40 * MIB, 7).unwrap().unwrap();
    a.check_invariants(&dev).unwrap();
    let range = round_up(GIB + GIB / 8, LARGE_BUFFER);
    let second = round_up(FIRST_BASE + range, LARGE_BUFFER);
    assert_eq!(a.stats().reserved_bytes.current, 80 * MIB);
    let by_stream: Vec<(u64, u64, u64)> = (a.segments().iter())
        .map(|s| (s.stream, s.address, s.total_size / MIB))
        .collect();
    assert_eq!(by_stream, vec![(0, FIRST_BASE, 40), (7, second, 40)]);
    // The same stream again: its own free block, nothing mapped.
    let z = a.malloc_on(&mut dev, 40 * MIB, 0).unwrap().unwrap();
    assert_eq!(a.stats().reserved_bytes.current, 80 * MIB);
    assert_eq!(a.segments()[0].blocks[0].id, Some(z));
    a.free(&mut dev, z);
    a.free(&mut dev, y);
    a.set_tracing(true);
    let mut events = Vec::new();
    a.drain_trace(&mut events);
    events.clear();
    assert_eq!(a.empty_cache(&mut dev), Some(80 * MIB));
    a.drain_trace(&mut events);
    let unmapped: Vec<(TraceAction, u64)> = events.iter().map(|e| (e.action, e.address)).collect();
    assert_eq!(
        unmapped,
        vec![
            (TraceAction::SegmentFree, FIRST_BASE),
            (TraceAction::SegmentFree, second)
        ]
    );
    a.check_invariants(&dev).unwrap();
}

/// A live CUDA graph's private pool keeps its mapped pages through
/// `empty_cache()` (upstream releases `graph_pools_freeable` only); its
/// own range is made at its first request, as `find_expandable_block`
/// makes one per pool and stream.
#[test]
fn a_live_private_pools_pages_stay_mapped_until_freeable() {
    let (mut a, mut dev) = setup(GIB, 0);
    let private = 1 << 63 | 9;
    a.private_pools_mut().set(private, false);
    let x = a.malloc_on(&mut dev, 30 * MIB, private).unwrap().unwrap();
    let y = ok(&mut a, &mut dev, 30 * MIB);
    assert_eq!(a.segments().len(), 2, "a range of its own");
    a.free(&mut dev, x);
    a.free(&mut dev, y);
    assert_eq!(a.empty_cache(&mut dev), Some(40 * MIB));
    assert_eq!(a.stats().reserved_bytes.current, 40 * MIB);
    a.private_pools_mut().set(private, true);
    assert_eq!(a.empty_cache(&mut dev), Some(40 * MIB));
    assert_eq!(a.stats().reserved_bytes.current, 0);
    a.check_invariants(&dev).unwrap();
}
