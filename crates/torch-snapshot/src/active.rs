//! memory_viz's "Active Memory Timeline": every allocation a band over the
//! events it lived, the live ones stacked in the order they were made, so
//! that a band drops when one below it is freed and the stack's top is
//! the memory allocated. The largest allocations are bands of their own
//! (each with the event that made it, for its stack); the rest are summed
//! into one band on top, as memory_viz summarizes small tensors.
//! Allocations live when the trace starts begin at event 0, below the
//! others.

use super::initial::initial_state;
use super::Action;
use super::{MemorySnapshot, SnapshotError};

/// One allocation's band: its size, the events it lived (`end`: freed
/// there, or the trace's end), and its offset from the bottom where it
/// changed (`(event, bytes below it)`, the first at `start`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Band {
    /// The event that made it (`None`: live when the trace starts).
    pub made: Option<usize>,
    pub size: u64,
    pub start: usize,
    pub end: usize,
    pub below: Vec<(usize, u64)>,
}

/// The timeline: the bands, and the rest of what was allocated (`(event,
/// bytes)` where it changed), drawn on top of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActiveTimeline {
    pub bands: Vec<Band>,
    pub rest: Vec<(usize, u64)>,
    /// Allocations summed into the rest.
    pub summarized: usize,
    pub events: usize,
    /// The most allocated at once.
    pub top: u64,
}

/// An allocation: when it was made and freed, and how large.
struct Lived {
    made: Option<usize>,
    start: usize,
    end: usize,
    size: u64,
}

/// `device`'s trace as memory_viz's active memory timeline, with the
/// `bands` largest allocations drawn one by one.
pub fn active_timeline(
    snapshot: &MemorySnapshot,
    device: usize,
    bands: usize,
) -> Result<ActiveTimeline, SnapshotError> {
    let events = snapshot.trace(device).len();
    active_timeline_in(snapshot, device, bands, 0..events)
}

/// The timeline zoomed to the events `range` (memory_viz's zoom): the
/// `bands` largest allocations alive in it drawn one by one, each clipped
/// to it, events counted from its start (a band's `made` stays the
/// trace's own event).
pub fn active_timeline_in(
    snapshot: &MemorySnapshot,
    device: usize,
    bands: usize,
    range: std::ops::Range<usize>,
) -> Result<ActiveTimeline, SnapshotError> {
    let lived = lifetimes(snapshot, device)?;
    let events = snapshot.trace(device).len();
    let (from, to) = (range.start.min(events), range.end.min(events));
    let span = to.saturating_sub(from);
    let lived: Vec<Lived> = (lived.into_iter())
        .filter(|l| l.start < to.max(from + 1) && l.end > from)
        .map(|l| Lived {
            start: l.start.max(from) - from,
            end: l.end.min(to).max(from) - from,
            ..l
        })
        .collect();
    // The largest are bands; ties go to the earlier.
    let mut order: Vec<usize> = (0..lived.len()).collect();
    order.sort_by_key(|&k| std::cmp::Reverse(lived[k].size));
    let mut chosen = vec![false; lived.len()];
    for &k in order.iter().take(bands) {
        chosen[k] = true;
    }
    Ok(stack(&lived, &chosen, span))
}

/// Every allocation of `device`'s trace, in the order it started (those
/// live when the trace starts first).
fn lifetimes(snapshot: &MemorySnapshot, device: usize) -> Result<Vec<Lived>, SnapshotError> {
    let trace = snapshot.trace(device);
    let events = trace.len();
    let mut open: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut lived: Vec<Lived> = Vec::new();
    let start = initial_state(snapshot, device)?;
    for s in start.segments.values() {
        for (&address, &(size, _)) in &s.blocks {
            open.insert(address, lived.len());
            lived.push(Lived {
                made: None,
                start: 0,
                end: events,
                size,
            });
        }
    }
    for i in 0..events {
        let (address, size, _) = trace.place(i);
        match trace.action(i) {
            Action::Alloc => {
                open.insert(address, lived.len());
                lived.push(Lived {
                    made: Some(i),
                    start: i,
                    end: events,
                    size,
                });
            }
            Action::FreeCompleted => {
                if let Some(k) = open.remove(&address) {
                    lived[k].end = i;
                }
            }
            _ => {}
        }
    }
    Ok(lived)
}

/// The most points the rest keeps (the largest in each stretch).
const REST_POINTS: usize = 4000;

/// Stacks the chosen allocations in the order they were made; the others
/// are summed on top.
fn stack(lived: &[Lived], chosen: &[bool], events: usize) -> ActiveTimeline {
    // Allocations come in the order they start; frees sorted by event.
    let mut ends: Vec<(usize, usize)> = (lived.iter().enumerate())
        .filter(|(_, l)| l.end < events)
        .map(|(k, l)| (l.end, k))
        .collect();
    ends.sort_unstable();
    let (mut next_start, mut next_end) = (0, 0);
    // The chosen allocations' bands, by allocation (a few hundred of
    // millions, perhaps).
    let mut out: Vec<Band> = Vec::new();
    let mut band_of: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    // The live chosen allocations, bottom first.
    let mut live: Vec<usize> = Vec::new();
    let (mut rest, mut rest_now, mut stacked, mut top) = (Vec::new(), 0u64, 0u64, 0u64);
    for t in 0..events {
        let mut dropped = false;
        while next_end < ends.len() && ends[next_end].0 == t {
            let k = ends[next_end].1;
            next_end += 1;
            if chosen[k] {
                if let Some(at) = live.iter().position(|&x| x == k) {
                    live.remove(at);
                    stacked -= lived[k].size;
                    dropped = true;
                }
            } else {
                rest_now -= lived[k].size;
            }
        }
        if dropped {
            // Those above a freed band drop to their new offsets.
            let mut below = 0;
            for &k in &live {
                let b = &mut out[band_of[&k]];
                if b.below.last().map(|&(_, o)| o) != Some(below) {
                    b.below.push((t, below));
                }
                below += lived[k].size;
            }
        }
        while next_start < lived.len() && lived[next_start].start == t {
            let k = next_start;
            next_start += 1;
            if chosen[k] {
                band_of.insert(k, out.len());
                out.push(Band {
                    made: lived[k].made,
                    size: lived[k].size,
                    start: t,
                    end: lived[k].end,
                    below: vec![(t, stacked)],
                });
                live.push(k);
                stacked += lived[k].size;
            } else {
                rest_now += lived[k].size;
            }
        }
        if rest.last().map(|&(_, b)| b) != Some(rest_now) {
            rest.push((t, rest_now));
        }
        top = top.max(stacked + rest_now);
    }
    let summarized = chosen.iter().filter(|&&c| !c).count();
    ActiveTimeline {
        bands: out,
        rest: at_most(rest, REST_POINTS),
        summarized,
        events,
        top,
    }
}

/// `steps` kept to about `n` points: in each stretch, its largest value
/// (a summary that never hides a peak).
fn at_most(steps: Vec<(usize, u64)>, n: usize) -> Vec<(usize, u64)> {
    if steps.len() <= n {
        return steps;
    }
    let per = steps.len().div_ceil(n);
    steps
        .chunks(per)
        .map(|c| (c[0].0, c.iter().map(|&(_, b)| b).max().unwrap_or(0)))
        .collect()
}

impl ActiveTimeline {
    /// The bytes stacked after event `t` (the chosen bands and the rest):
    /// the memory allocated then.
    pub fn stacked_at(&self, t: usize) -> u64 {
        let bands: u64 = (self.bands.iter())
            .filter(|b| b.start <= t && t < b.end)
            .map(|b| b.size)
            .sum();
        let rest = (self.rest.iter())
            .take_while(|&&(e, _)| e <= t)
            .last()
            .map_or(0, |&(_, b)| b);
        bands + rest
    }

    /// Band `b`'s offset after event `t`.
    pub fn below_at(&self, b: &Band, t: usize) -> u64 {
        (b.below.iter())
            .take_while(|&&(e, _)| e <= t)
            .last()
            .map_or(0, |&(_, o)| o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TraceEntry;
    use vramlab_core::units::MIB;

    fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
        TraceEntry {
            addr,
            size,
            ..TraceEntry::new(action)
        }
    }

    /// a (4 MiB), b (2 MiB), c (1 MiB) made in turn; a freed: b and c drop
    /// by 4 MiB at that event; with two bands, c is the rest on top.
    #[test]
    fn a_freed_band_lets_the_ones_above_it_drop() {
        use Action::*;
        const A: u64 = 0x1000_0000;
        let trace = vec![
            entry(SegmentAlloc, A, 20 * MIB),
            entry(Alloc, A, 4 * MIB),
            entry(Alloc, A + 4 * MIB, 2 * MIB),
            entry(Alloc, A + 6 * MIB, MIB),
            entry(FreeRequested, A, 4 * MIB),
            entry(FreeCompleted, A, 4 * MIB),
        ];
        let s = MemorySnapshot {
            segments: vec![crate::format::Segment {
                address: A,
                total_size: 20 * MIB,
                segment_type: "large".into(),
                blocks: vec![
                    crate::format::Block {
                        address: A,
                        size: 4 * MIB,
                        requested_size: 0,
                        state: crate::format::BlockState::Inactive,
                        frames: Default::default(),
                    },
                    crate::format::Block {
                        address: A + 4 * MIB,
                        size: 2 * MIB,
                        requested_size: 2 * MIB,
                        state: crate::format::BlockState::ActiveAllocated,
                        frames: Default::default(),
                    },
                    crate::format::Block {
                        address: A + 6 * MIB,
                        size: MIB,
                        requested_size: MIB,
                        state: crate::format::BlockState::ActiveAllocated,
                        frames: Default::default(),
                    },
                    crate::format::Block {
                        address: A + 7 * MIB,
                        size: 13 * MIB,
                        requested_size: 0,
                        state: crate::format::BlockState::Inactive,
                        frames: Default::default(),
                    },
                ],
                ..Default::default()
            }],
            device_traces: vec![trace.into()],
            allocator_settings: None,
        };
        let all = active_timeline(&s, 0, 10).unwrap();
        let mib = |b: &Band| Band {
            size: b.size / MIB,
            below: b.below.iter().map(|&(e, o)| (e, o / MIB)).collect(),
            ..b.clone()
        };
        let band = |made, size, (start, end), below: &[(usize, u64)]| Band {
            made: Some(made),
            size,
            start,
            end,
            below: below.to_vec(),
        };
        assert_eq!(
            all.bands.iter().map(mib).collect::<Vec<_>>(),
            vec![
                band(1, 4, (1, 5), &[(1, 0)]),
                band(2, 2, (2, 6), &[(2, 4), (5, 0)]),
                band(3, 1, (3, 6), &[(3, 6), (5, 2)]),
            ]
        );
        assert_eq!(all.top, 7 * MIB);
        assert_eq!(
            (0..6).map(|t| all.stacked_at(t) / MIB).collect::<Vec<_>>(),
            vec![0, 4, 6, 7, 7, 3]
        );
        let two = active_timeline(&s, 0, 2).unwrap();
        assert_eq!(two.bands.len(), 2);
        assert_eq!(two.summarized, 1);
        assert_eq!(two.rest, vec![(0, 0), (3, MIB)]);
        assert_eq!(two.stacked_at(5), 3 * MIB);
        // Zoomed to events 3..6: a is freed in it, b and c live through;
        // the same bytes at each event, counted from 3.
        let zoomed = active_timeline_in(&s, 0, 10, 3..6).unwrap();
        assert_eq!(
            zoomed.bands.iter().map(mib).collect::<Vec<_>>(),
            vec![
                band(1, 4, (0, 2), &[(0, 0)]),
                band(2, 2, (0, 3), &[(0, 4), (2, 0)]),
                band(3, 1, (0, 3), &[(0, 6), (2, 2)]),
            ]
        );
        assert_eq!(
            (0..3).map(|t| zoomed.stacked_at(t)).collect::<Vec<_>>(),
            (3..6).map(|t| all.stacked_at(t)).collect::<Vec<_>>()
        );
        // With one band in the window, the largest alive in it.
        let one = active_timeline_in(&s, 0, 1, 5..6).unwrap();
        assert_eq!(one.bands[0].made, Some(2));
        assert_eq!(active_timeline_in(&s, 0, 10, 0..6).unwrap(), all);
    }
}
