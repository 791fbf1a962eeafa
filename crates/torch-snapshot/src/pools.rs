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

use super::format::MemorySnapshot;
#[cfg(feature = "graph-pools")]
use super::format::{Action, Trace};
#[cfg(feature = "graph-pools")]
use std::collections::BTreeMap;

/// The default pools' id.
pub const DEFAULT_POOL: (u64, u64) = (0, 0);

/// The stream the allocator serves a request of `stream` in `pool` from:
/// `stream` itself in the default pools, else a key of the pair with the
/// top bit set (streams are 0 or addresses, which never have it).
#[cfg(feature = "graph-pools")]
pub fn allocator_stream(stream: u64, pool: (u64, u64)) -> u64 {
    if pool == DEFAULT_POOL {
        return stream;
    }
    vramlab_core::hash::mix3(stream, pool.0, pool.1) | 1 << 63
}

/// Without the `graph-pools` feature a private pool's recording is
/// refused before it replays: every request is the default pools'.
#[cfg(not(feature = "graph-pools"))]
pub fn allocator_stream(stream: u64, _pool: (u64, u64)) -> u64 {
    stream
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
    /// (event index, pool) of each request a private pool served, in
    /// event order.
    private: Vec<(usize, (u64, u64))>,
    /// (event index, pool): from there on the pool is freeable (its graphs
    /// are gone): the start of the run of releases that first gives back a
    /// segment or page of it, in event order.
    freeable: Vec<(usize, (u64, u64))>,
    /// Every private pool's blocks on a stream: (the allocator's stream
    /// key, the recorded stream, the pool).
    keys: Vec<(u64, u64, (u64, u64))>,
}

/// What one walk of a trace finds.
#[cfg(feature = "graph-pools")]
#[derive(Default)]
struct Walked {
    private: Vec<(usize, (u64, u64))>,
    freeable: Vec<(usize, (u64, u64))>,
}

#[cfg(feature = "graph-pools")]
/// A private pool's segment: its end, its pool, and the event that last
/// makes it (`None`: it is there from the start).
#[derive(Clone, Copy, Debug)]
struct Span {
    end: u64,
    pool: (u64, u64),
    made: Option<usize>,
}

#[cfg(feature = "graph-pools")]
type Spans = BTreeMap<u64, Span>;

#[cfg(feature = "graph-pools")]
/// The pool of the span holding `address`, if a span holds it.
fn span_at(spans: &Spans, address: u64) -> Option<(u64, u64)> {
    match spans.range(..=address).next_back() {
        Some((_, span)) if address < span.end => Some(span.pool),
        _ => None,
    }
}

#[cfg(feature = "graph-pools")]
/// A stream's first and last request of one pool, by event index.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Stretch {
    stream: u64,
    pool: (u64, u64),
    first: usize,
    last: usize,
}

#[cfg(feature = "graph-pools")]
/// The most stretches a recording keeps (one with more, which no real
/// one has, routes the others' requests by segments alone, so a file
/// cannot make the walk slow).
const MOST_STRETCHES: usize = 16;

#[cfg(feature = "graph-pools")]
/// Every request's stretches: each (stream, pool)'s first and last.
fn stretches(trace: &Trace, direct: &[(usize, (u64, u64))]) -> Vec<Stretch> {
    let mut out: Vec<Stretch> = Vec::new();
    for &(i, pool) in direct {
        let (_, _, stream) = trace.place(i);
        let full = out.len() >= MOST_STRETCHES;
        match out
            .iter_mut()
            .find(|s| s.stream == stream && s.pool == pool)
        {
            Some(s) => s.last = i,
            None if !full => out.push(Stretch {
                stream,
                pool,
                first: i,
                last: i,
            }),
            None => {}
        }
    }
    out
}

#[cfg(feature = "graph-pools")]
/// The trace's requests a private pool served: by the segment (or mapped
/// range) holding each block (a dumped private segment from when the trace
/// last makes it, or from the start; one made for a private pool's
/// request), else by the stretches. And where each pool first gives
/// memory back.
fn walk(trace: &Trace, dumped: &Spans, stretches: &[Stretch]) -> Walked {
    let mut known = Spans::new();
    known.extend(
        dumped
            .iter()
            .filter(|(_, s)| s.made.is_none())
            .map(|(&a, &s)| (a, s)),
    );
    let mut made: Vec<(u64, u64)> = Vec::new();
    let mut out = Walked::default();
    let mut releases_from = None;
    for i in 0..trace.len() {
        let (addr, size, stream) = trace.place(i);
        let action = trace.action(i);
        if !matches!(action, Action::SegmentFree | Action::SegmentUnmap) {
            releases_from = None;
        }
        let mut released = |pool: Option<(u64, u64)>| {
            let from = *releases_from.get_or_insert(i);
            if let Some(pool) = pool.filter(|p| !out.freeable.iter().any(|(_, q)| q == p)) {
                out.freeable.push((from, pool));
            }
        };
        match action {
            Action::SegmentAlloc => match dumped.get(&addr) {
                Some(&span) if span.made == Some(i) => _ = known.insert(addr, span),
                _ => made.push((addr, size)),
            },
            Action::SegmentMap => made.push((addr, size)),
            Action::SegmentFree => released(known.remove(&addr).map(|s| s.pool)),
            // An expandable range stays its pool's, mapped or not.
            Action::SegmentUnmap => released(span_at(&known, addr)),
            Action::Alloc => {
                let stretch = || {
                    (stretches.iter())
                        .find(|s| s.stream == stream && s.first <= i && i <= s.last)
                        .map(|s| s.pool)
                };
                if let Some(pool) = span_at(&known, addr).or_else(stretch) {
                    out.private.push((i, pool));
                    for (address, size) in made.drain(..) {
                        add_span(&mut known, (address, address.saturating_add(size)), pool, i);
                    }
                }
                made.clear();
            }
            _ => {}
        }
    }
    out.freeable.sort_unstable();
    out
}

#[cfg(feature = "graph-pools")]
/// `start..end`, made at event `made` for `pool`: a span of its own, or
/// the growth of the pool's span it starts inside (an expandable range
/// mapped further).
fn add_span(known: &mut Spans, (start, end): (u64, u64), pool: (u64, u64), made: usize) {
    if let Some((_, span)) = known.range_mut(..=start).next_back() {
        if start < span.end && span.pool == pool {
            span.end = span.end.max(end);
            return;
        }
    }
    let made = Some(made);
    known.insert(start, Span { end, pool, made });
}

impl PoolRoutes {
    /// The routes of `device`'s trace in `snapshot` (none without the
    /// `graph-pools` feature: such a recording is refused before).
    #[cfg(not(feature = "graph-pools"))]
    pub fn of(_snapshot: &MemorySnapshot, _device: usize) -> Self {
        Self::default()
    }

    /// The routes of `device`'s trace in `snapshot`.
    #[cfg(feature = "graph-pools")]
    pub fn of(snapshot: &MemorySnapshot, device: usize) -> Self {
        let mut dumped = Spans::new();
        for s in &snapshot.segments {
            if s.device as usize == device && s.segment_pool_id != DEFAULT_POOL {
                let end = s.address.saturating_add(s.total_size);
                let span = Span {
                    end,
                    pool: s.segment_pool_id,
                    made: None,
                };
                dumped.insert(s.address, span);
            }
        }
        if dumped.is_empty() {
            return Self::default();
        }
        let trace = snapshot.trace(device);
        for i in 0..trace.len() {
            if trace.action(i) == Action::SegmentAlloc {
                let (at, _, _) = trace.place(i);
                if let Some(span) = dumped.get_mut(&at) {
                    span.made = Some(i);
                }
            }
        }
        let direct = walk(trace, &dumped, &[]).private;
        let walked = walk(trace, &dumped, &stretches(trace, &direct));
        let mut keys: Vec<(u64, u64, (u64, u64))> = Vec::new();
        let streams = (walked.private.iter()).map(|&(i, pool)| (trace.place(i).2, pool));
        let dumped_streams = (snapshot.segments.iter())
            .filter(|s| s.device as usize == device && s.segment_pool_id != DEFAULT_POOL)
            .map(|s| (s.stream, s.segment_pool_id));
        for (stream, pool) in streams.chain(dumped_streams) {
            let key = allocator_stream(stream, pool);
            if !keys.iter().any(|&(k, _, _)| k == key) {
                keys.push((key, stream, pool));
            }
        }
        Self {
            private: walked.private,
            freeable: walked.freeable,
            keys,
        }
    }

    /// The pool that served the request of event `index`.
    pub fn pool_of(&self, index: usize) -> (u64, u64) {
        match self.private.binary_search_by_key(&index, |&(i, _)| i) {
            Ok(k) => self.private[k].1,
            Err(_) => DEFAULT_POOL,
        }
    }

    /// The allocator's stream for the request of event `index` on
    /// `stream`.
    pub fn stream_for(&self, index: usize, stream: u64) -> u64 {
        allocator_stream(stream, self.pool_of(index))
    }

    /// Each private pool's stream keys, and the event from which the pool
    /// is freeable (`None`: never in the trace).
    pub fn private_keys(&self) -> impl Iterator<Item = (u64, Option<usize>)> + '_ {
        self.keys.iter().map(|&(key, _, pool)| {
            let from = self.freeable.iter().find(|&&(_, p)| p == pool);
            (key, from.map(|&(i, _)| i))
        })
    }

    /// The recorded stream and pool of the allocator's stream `key`.
    pub fn recorded(&self, key: u64) -> (u64, (u64, u64)) {
        match self.keys.iter().find(|&&(k, _, _)| k == key) {
            Some(&(_, stream, pool)) => (stream, pool),
            None => (key, DEFAULT_POOL),
        }
    }
}

#[cfg(all(test, feature = "graph-pools"))]
mod tests {
    use super::*;
    use crate::format::{Segment, TraceEntry};

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

    /// Expandable segments: a range mapped for a private pool's request
    /// is the pool's, and so is the growth mapped on after it; an unmap
    /// leaves the range the pool's. A pool is freeable from the run of
    /// releases that first gives memory of it back.
    #[test]
    fn mapped_ranges_follow_their_pool_and_releases_make_it_freeable() {
        let map = |addr, size| segment_event(Action::SegmentMap, addr, size, 5);
        let unmap = |addr, stream| segment_event(Action::SegmentUnmap, addr, 0x1000, stream);
        let trace = vec![
            alloc(0x4000, 5),    // 0: (1, 0), dumped
            map(0x5000, 0x1000), // 1
            alloc(0x4800, 5),    // 2: (1, 0), its range grown
            unmap(0x1000, 0),    // 3: default
            unmap(0x5000, 5),    // 4: (1, 0)'s growth
            alloc(0x1000, 0),    // 5: default
            map(0x5000, 0x1000), // 6
            alloc(0x5000, 5),    // 7: (1, 0), unmapped and mapped again
            alloc(0x5400, 5),    // 8: (1, 0)
        ];
        let expandable = |address, size, pool| Segment {
            is_expandable: true,
            stream: 5,
            ..segment(address, size, pool)
        };
        let snapshot = MemorySnapshot {
            segments: vec![
                segment(0x1000, 0x1000, DEFAULT_POOL),
                expandable(0x4000, 0x1000, (1, 0)),
            ],
            device_traces: vec![trace.into()],
            ..MemorySnapshot::default()
        };
        let routes = PoolRoutes::of(&snapshot, 0);
        let pools: Vec<(u64, u64)> = (0..9).map(|i| routes.pool_of(i)).collect();
        let (d, g) = (DEFAULT_POOL, (1, 0));
        assert_eq!(pools, [g, d, g, d, d, d, d, g, g]);
        let key = allocator_stream(5, g);
        assert_eq!(routes.private_keys().collect::<Vec<_>>(), [(key, Some(3))]);
        assert_eq!(routes.recorded(key), (5, g));
        assert_eq!(routes.recorded(5), (5, d), "a stream of the default pools");
    }
}
