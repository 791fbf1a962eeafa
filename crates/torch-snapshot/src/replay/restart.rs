//! A what-if: the recorded requests replayed as a restart under other
//! settings, its start the blocks live at the recording's first event.

use super::ReplayRun;
use super::{what_if_settings, Replay, UNBOUNDED};
use crate::format::MemorySnapshot;
use crate::initial::{initial_state, InitialState};
use crate::SnapshotError;
use vramlab_core::units::{format_size, MIB};
use vramlab_device::framework::{RestartSettings, Settings};

/// Replays `device`'s trace under the recorded settings changed by
/// `what_if` (a `restart` command's fields: `expandable_segments`,
/// `max_split_size_mb`, `gpu`, …).
///
/// When what was live at the recording's start does not fit the chosen
/// device, the error says how much was live and the smallest device (in
/// MiB, with the same CUDA context) that holds it.
pub fn replay_what_if(
    snapshot: &MemorySnapshot,
    device: usize,
    what_if: &RestartSettings,
) -> Result<ReplayRun, SnapshotError> {
    let settings = what_if_settings(snapshot, what_if)?;
    let state = initial_state(snapshot, device)?;
    let mut replay = Replay::bare(snapshot, device, settings.clone(), false);
    if let Err(refused) = replay.seed_live(&state) {
        let smallest = smallest_device_mib(snapshot, device, &settings, &state);
        let context = match settings.context_bytes {
            0 => String::new(),
            c => format!(" with its {} CUDA context", format_size(c)),
        };
        return Err(SnapshotError::Settings(format!(
            "{} on this {} device{context}. The smallest that holds them: {smallest} MiB; try at least that, or a larger GPU",
            refused.message(),
            format_mib(settings.device_total_bytes),
        )));
    }
    Replay::new(snapshot, device, settings, false)?.run()
}

/// "3815 MiB", as the what-if's field takes it.
fn format_mib(bytes: u64) -> String {
    format!("{} MiB", bytes / MIB)
}

/// The fewest MiB of device memory in which the state at the trace's
/// start can be allocated anew under `settings`.
fn smallest_device_mib(
    snapshot: &MemorySnapshot,
    device: usize,
    settings: &Settings,
    state: &InitialState,
) -> String {
    let fits = |mib: u64| {
        let mut s = settings.clone();
        s.device_total_bytes = mib * MIB;
        Replay::bare(snapshot, device, s, false)
            .seed_live(state)
            .is_ok()
    };
    let (mut low, mut high) = (
        settings.device_total_bytes / MIB,
        settings.device_total_bytes / MIB,
    );
    while !fits(high) {
        low = high;
        high = high.saturating_mul(2).max(1);
        if high >= UNBOUNDED / MIB {
            return "more than 1 PiB".into();
        }
    }
    // `low` does not fit, `high` does.
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        match fits(mid) {
            true => high = mid,
            false => low = mid,
        }
    }
    high.to_string()
}
