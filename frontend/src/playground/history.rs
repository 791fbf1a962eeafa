//! The timeline's points: one per command (the state after it, with the
//! peak during it), and the live samples a long command sends while it
//! runs (its point replaces them). A restart starts the timeline again:
//! the old process's numbers are gone with it.

use vramlab_shared::snapshot::Stats;

/// One point of the timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub allocated: u64,
    pub reserved: u64,
    pub device: u64,
    /// The most allocated at any moment while the command ran.
    pub peak: u64,
    /// The command that ended here, with its step number; none for a live
    /// sample.
    pub label: Option<(u64, String)>,
}

impl Point {
    pub fn new(stats: &Stats, peak: u64, label: Option<(u64, String)>) -> Self {
        Point {
            allocated: stats.allocated_bytes,
            reserved: stats.reserved_bytes,
            device: stats.device_used_bytes,
            peak: peak.max(stats.allocated_bytes),
            label,
        }
    }

    fn same_numbers(&self, other: &Point) -> bool {
        (self.allocated, self.reserved, self.device)
            == (other.allocated, other.reserved, other.device)
    }
}

/// The most points kept (the oldest go first).
pub const MAX_POINTS: usize = 2000;

/// Adds a command's point; a restart clears what came before. The live
/// samples shown while it ran give way to it: each command is one slot,
/// with the peak during it.
pub fn push_result(history: &mut Vec<Point>, point: Point, restart: bool) {
    if restart {
        history.clear();
    }
    while history.last().is_some_and(|p| p.label.is_none()) {
        history.pop();
    }
    push(history, point);
}

/// Adds a live sample, unless nothing moved since the last point.
pub fn push_sample(history: &mut Vec<Point>, point: Point) {
    if history.last().is_some_and(|last| last.same_numbers(&point)) {
        return;
    }
    push(history, point);
}

fn push(history: &mut Vec<Point>, point: Point) {
    history.push(point);
    if history.len() > MAX_POINTS {
        let extra = history.len() - MAX_POINTS;
        history.drain(..extra);
    }
}
