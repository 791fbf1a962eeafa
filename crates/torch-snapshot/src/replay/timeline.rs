//! Memory after each trace event, and the few points a chart draws.

use serde::{Deserialize, Serialize};

/// Timeline points a chart needs.
const TIMELINE_POINTS: usize = 2000;

/// Memory after one trace event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelinePoint {
    pub event: usize,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
}

/// At most [`TIMELINE_POINTS`] of a timeline, for a chart: in each stretch, the point where allocated
/// peaks and the one where reserved peaks.
pub fn thin(points: &[TimelinePoint]) -> Vec<TimelinePoint> {
    if points.len() <= TIMELINE_POINTS {
        return points.to_vec();
    }
    let stretch = points.len().div_ceil(TIMELINE_POINTS / 2);
    let mut out = Vec::with_capacity(TIMELINE_POINTS);
    for chunk in points.chunks(stretch) {
        let a = chunk
            .iter()
            .max_by_key(|p| p.allocated_bytes)
            .expect("non-empty");
        let r = chunk
            .iter()
            .max_by_key(|p| p.reserved_bytes)
            .expect("non-empty");
        let (first, second) = if a.event <= r.event { (a, r) } else { (r, a) };
        out.push(*first);
        if second.event != first.event {
            out.push(*second);
        }
    }
    out
}
