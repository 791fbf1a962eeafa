//! CUDA graphs' private memory pools in a replay. PyTorch keeps each
//! private pool's blocks apart from the default pools' (a `BlockPool` of
//! its own per `MempoolId_t`) and sends a request to one while a graph is
//! captured on the request's stream (`captures_underway`), or while
//! `torch.compile`'s CUDA graph trees allocate to it; the trace does not
//! record either. A replay reads it from where the recording placed the
//! block: a request whose block lies in a segment the snapshot names as a
//! private pool's (`segment_pool_id`) was that pool's. Each (stream, pool)
//! pair is a stream of its own to the allocator, which keeps streams'
//! blocks apart as PyTorch keeps pools'.

use super::format::{Action, MemorySnapshot, Trace};
use std::collections::{BTreeMap, HashMap};

/// The default pools' id.
pub const DEFAULT_POOL: (u64, u64) = (0, 0);

/// The stream the allocator serves a request of `stream` in `pool` from:
/// `stream` itself in the default pools, else a key of the pair with the
/// top bit set (streams are 0 or addresses, which never have it).
pub fn allocator_stream(stream: u64, pool: (u64, u64)) -> u64 {
    if pool == DEFAULT_POOL {
        return stream;
    }
    // FNV-1a over the three words: stable, and spread over 63 bits.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for word in [stream, pool.0, pool.1] {
        for b in word.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h | 1 << 63
}

/// Which private pool served each recorded request that a private pool
/// served, worked out before the replay:
/// - a block inside a segment the dump names as a private pool's was
///   that pool's (from the segment's last `segment_alloc`: its address
///   may have held a default pool's segment before);
/// - a capture sends a stream's requests to its pool from its first to
///   its last: a request between a stream's first and last requests of
///   one pool (as the first rule finds them) was that pool's too, and so
///   is the segment it made, and every later block inside it.
///
/// Anything else was the default pools' (a private pool's segment freed
/// before the dump and never used inside such a stretch cannot be known).
#[derive(Clone, Debug, Default)]
pub struct PoolRoutes {
    /// Event index → the private pool of its request.
    private: HashMap<usize, (u64, u64)>,
}

type Spans = BTreeMap<u64, (u64, (u64, u64))>;

/// The pool of the span holding `address`, if a span holds it.
fn span_at(spans: &Spans, address: u64) -> Option<(u64, u64)> {
    match spans.range(..=address).next_back() {
        Some((_, &(end, pool))) if address < end => Some(pool),
        _ => None,
    }
}

/// Each stream's stretches: a pool's first and last request on it, by
/// event index.
type Stretches = HashMap<u64, Vec<(usize, usize, (u64, u64))>>;

/// The most stretches a stream keeps (a recording with more, which no
/// real one has, routes that stream's requests by segments alone, so a
/// file cannot make the walk slow).
const MOST_STRETCHES: usize = 64;

/// The trace's requests a private pool served: by the segment holding
/// each block (a dumped private segment from when the trace last makes
/// it, or from the start when it never does; a segment made for a private
/// pool's request), else by the stretches.
fn walk(trace: &Trace, dumped: &Spans, stretches: &Stretches) -> HashMap<usize, (u64, u64)> {
    let mut last_made: HashMap<u64, usize> = HashMap::new();
    for (i, e) in trace.iter().enumerate() {
        if e.action == Action::SegmentAlloc && dumped.contains_key(&e.addr) {
            last_made.insert(e.addr, i);
        }
    }
    let mut known: Spans = (dumped.iter())
        .filter(|(a, _)| !last_made.contains_key(a))
        .map(|(&a, &span)| (a, span))
        .collect();
    let in_stretch = |stream: u64, i: usize| {
        let of_stream = stretches.get(&stream)?;
        (of_stream.iter())
            .find(|&&(first, last, _)| first <= i && i <= last)
            .map(|&(_, _, pool)| pool)
    };
    let mut made: Vec<(u64, u64)> = Vec::new();
    let mut private = HashMap::new();
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            Action::SegmentAlloc if last_made.get(&e.addr) == Some(&i) => {
                known.insert(e.addr, dumped[&e.addr]);
            }
            Action::SegmentAlloc => made.push((e.addr, e.size)),
            Action::SegmentFree => {
                known.remove(&e.addr);
            }
            Action::Alloc => {
                let pool = span_at(&known, e.addr).or_else(|| in_stretch(e.stream, i));
                if let Some(pool) = pool {
                    private.insert(i, pool);
                    for (address, size) in made.drain(..) {
                        known.insert(address, (address.saturating_add(size), pool));
                    }
                }
                made.clear();
            }
            _ => {}
        }
    }
    private
}

impl PoolRoutes {
    /// The routes of `device`'s trace in `snapshot`.
    pub fn of(snapshot: &MemorySnapshot, device: usize) -> Self {
        let dumped: Spans = snapshot
            .segments
            .iter()
            .filter(|s| s.device as usize == device && s.segment_pool_id != DEFAULT_POOL)
            .map(|s| {
                (
                    s.address,
                    (s.address.saturating_add(s.total_size), s.segment_pool_id),
                )
            })
            .collect();
        if dumped.is_empty() {
            return Self::default();
        }
        let trace = snapshot.trace(device);
        let direct = walk(trace, &dumped, &HashMap::new());
        // Each (stream, pool)'s first and last request the segments place.
        let mut spans: BTreeMap<(u64, (u64, u64)), (usize, usize)> = BTreeMap::new();
        for (i, e) in trace.iter().enumerate() {
            if let Some(&pool) = direct.get(&i) {
                let s = spans.entry((e.stream, pool)).or_insert((i, i));
                s.1 = i;
            }
        }
        let mut stretches: Stretches = HashMap::new();
        for ((stream, pool), (first, last)) in spans {
            stretches
                .entry(stream)
                .or_default()
                .push((first, last, pool));
        }
        stretches.retain(|_, s| s.len() <= MOST_STRETCHES);
        Self {
            private: walk(trace, &dumped, &stretches),
        }
    }

    /// The pool that served the request of event `index`.
    pub fn pool_of(&self, index: usize) -> (u64, u64) {
        self.private.get(&index).copied().unwrap_or(DEFAULT_POOL)
    }

    /// The allocator's stream for the request of event `index` on
    /// `stream`.
    pub fn stream_for(&self, index: usize, stream: u64) -> u64 {
        allocator_stream(stream, self.pool_of(index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torch_snapshot::format::{Segment, TraceEntry};

    fn segment(address: u64, size: u64, pool: (u64, u64)) -> Segment {
        Segment {
            address,
            total_size: size,
            segment_pool_id: pool,
            ..Segment::default()
        }
    }

    fn alloc(addr: u64, stream: u64) -> TraceEntry {
        TraceEntry {
            addr,
            size: 512,
            stream,
            ..TraceEntry::new(Action::Alloc)
        }
    }

    fn segment_event(action: Action, addr: u64, size: u64, stream: u64) -> TraceEntry {
        TraceEntry {
            addr,
            size,
            stream,
            ..TraceEntry::new(action)
        }
    }

    #[test]
    fn a_request_is_its_blocks_segments_pool_or_its_captures() {
        let trace = vec![
            alloc(0x1000, 5),                                       // 0: default
            alloc(0x4000, 5),                                       // 1: in (1, 0)'s segment
            segment_event(Action::SegmentAlloc, 0xa000, 0x1000, 5), // 2
            alloc(0xa000, 5), // 3: made a segment, mid-capture
            alloc(0x4200, 5), // 4: (1, 0) again
            alloc(0xa200, 5), // 5: inside the made segment
            segment_event(Action::SegmentFree, 0xa000, 0x1000, 5), // 6
            alloc(0x1200, 5), // 7: default again
            segment_event(Action::SegmentAlloc, 0xa000, 0x1000, 0), // 8: the address reused
            alloc(0xa000, 0), // 9: default
            alloc(0x8000, 9), // 10: (0, 1)
        ];
        let snapshot = MemorySnapshot {
            segments: vec![
                segment(0x1000, 0x1000, (0, 0)),
                segment(0x4000, 0x2000, (1, 0)),
                segment(0x8000, 0x1000, (0, 1)),
            ],
            device_traces: vec![trace.into()],
            ..MemorySnapshot::default()
        };
        let routes = PoolRoutes::of(&snapshot, 0);
        let pools: Vec<(u64, u64)> = (0..11).map(|i| routes.pool_of(i)).collect();
        let (d, g, c) = ((0, 0), (1, 0), (0, 1));
        assert_eq!(pools, [d, g, d, g, g, g, d, d, d, d, c]);
        assert_eq!(
            routes.stream_for(0, 5),
            5,
            "the default pools keep the stream"
        );
        let private = routes.stream_for(1, 5);
        assert!(private >> 63 == 1, "never a real stream");
        assert_eq!(private, allocator_stream(5, (1, 0)));
        assert_ne!(private, allocator_stream(6, (1, 0)), "per stream");
        assert_ne!(private, allocator_stream(5, (0, 1)), "per pool");
        assert_eq!(
            PoolRoutes::of(&snapshot, 1).pool_of(1),
            d,
            "another device's"
        );
    }
}
