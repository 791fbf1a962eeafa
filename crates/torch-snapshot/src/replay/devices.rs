//! Which GPU's trace of a recording to look at.

use crate::format::{Action, MemorySnapshot};

/// The device (trace index) with the most events.
pub fn busiest_device(snapshot: &MemorySnapshot) -> usize {
    (0..snapshot.device_traces.len())
        .max_by_key(|&d| (snapshot.device_traces[d].len(), usize::MAX - d))
        .unwrap_or(0)
}

/// Out-of-memory events in one device's trace.
pub fn recorded_ooms(snapshot: &MemorySnapshot, device: usize) -> usize {
    let trace = snapshot.trace(device);
    (0..trace.len())
        .filter(|&i| trace.action(i) == Action::Oom)
        .count()
}

/// The device to look at first: the first whose trace shows an
/// out-of-memory (what the user came for), else the busiest.
pub fn default_device(snapshot: &MemorySnapshot) -> usize {
    (0..snapshot.device_traces.len())
        .find(|&d| recorded_ooms(snapshot, d) > 0)
        .unwrap_or_else(|| busiest_device(snapshot))
}
