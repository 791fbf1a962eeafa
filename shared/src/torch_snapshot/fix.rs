//! `--fix`: which allocator settings, or which larger GPU, would have run a
//! recording through its out-of-memory.
//!
//! The room the process had is read from the recording's first
//! out-of-memory: what the process held then (after the cache the failure
//! released) plus what the driver still had free (`device_free`). Where the
//! driver had the segment the request needed, the process hit a limit of
//! its own (a memory fraction): the room is then the most it had held, a
//! lower bound. Each candidate replays the recorded requests in that room
//! (as a what-if) and, at the out-of-memory, asks again for what failed
//! (given back at once: what the program did next is not in the trace).
//! Those that run through are ranked by peak reserved, with the
//! `PYTORCH_CUDA_ALLOC_CONF` to set. When none does, the live tensors and
//! the request exceed the room: by how much, and the frames holding most.

use super::format::{Action, MemorySnapshot};
use super::replay::{replay_exact, what_if_settings, Replay};
use super::what_if::parse_what_if;
use super::SnapshotError;
use crate::alloc::caching::allocation_size;
use crate::device::DEFAULT_CONTEXT_BYTES;
use crate::gpu::GpuModel;
use serde::{Deserialize, Serialize};

/// `max_split_size_mb` values tried.
const MAX_SPLITS_MB: [u64; 4] = [512, 256, 128, 64];
/// `roundup_power2_divisions` values tried.
const DIVISIONS: [u64; 2] = [4, 8];
/// The frames named as holding the memory.
const HOLDERS: usize = 5;

/// One setting tried.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FixCandidate {
    /// As `--what-if` writes it.
    pub what_if: String,
    /// The `PYTORCH_CUDA_ALLOC_CONF` line, for allocator settings.
    pub alloc_conf: Option<String>,
    /// Whether every request, the failed one included, was served.
    pub runs: bool,
    pub peak_reserved_bytes: u64,
    /// Where it ran out of memory instead, when it did.
    pub out_of_memory_at: Option<usize>,
}

/// The search's outcome for a recording with an out-of-memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FixReport {
    /// The first recorded out-of-memory: its event and request.
    pub event: usize,
    pub request_bytes: u64,
    /// The bytes the process could have held, and whether that is what
    /// the driver said (else a lower bound: the process's own limit).
    pub room_bytes: u64,
    pub room_exact: bool,
    /// Allocated just before the failed request.
    pub allocated_bytes: u64,
    /// The recorded settings in that room, then each candidate.
    pub recorded: FixCandidate,
    pub candidates: Vec<FixCandidate>,
    /// The frames whose blocks held the most at the out-of-memory.
    pub holders: Vec<(String, u64)>,
}

impl FixReport {
    /// Those that run, fewest peak reserved bytes first.
    pub fn ranked(&self) -> Vec<&FixCandidate> {
        let mut runs: Vec<&FixCandidate> = self.candidates.iter().filter(|c| c.runs).collect();
        runs.sort_by_key(|c| c.peak_reserved_bytes);
        runs
    }

    /// The GPU with the least memory among those that run it.
    pub fn smallest_gpu(&self) -> Option<&FixCandidate> {
        (self.candidates.iter())
            .filter(|c| c.runs && c.alloc_conf.is_none())
            .min_by_key(|c| self.gpu_free_bytes(c))
    }

    /// A GPU candidate's room: its memory less its context.
    pub fn gpu_free_bytes(&self, c: &FixCandidate) -> u64 {
        let id = c.what_if.trim_start_matches("gpu=");
        GpuModel::from_id(id).map_or(u64::MAX, |g| {
            let spec = g.spec();
            spec.total_bytes.saturating_sub(spec.context_bytes)
        })
    }

    /// When nothing runs: the bytes the live tensors and the request lack.
    pub fn shortfall_bytes(&self) -> u64 {
        (self.allocated_bytes + self.request_bytes).saturating_sub(self.room_bytes)
    }
}

/// Searches the settings for `device`'s trace; `None` when it records no
/// out-of-memory.
pub fn search_fix(
    snapshot: &MemorySnapshot,
    device: usize,
) -> Result<Option<FixReport>, SnapshotError> {
    let trace = snapshot.trace(device);
    let Some(event) = (0..trace.len()).find(|&i| trace.action(i) == Action::Oom) else {
        return Ok(None);
    };
    let oom = trace
        .get(event)
        .ok_or_else(|| SnapshotError("no such event".into()))?;
    let exact = replay_exact(snapshot, device)?;
    let point = |i: usize| exact.timeline.get(i).copied();
    let at = point(event)
        .ok_or_else(|| SnapshotError("the trace ends before its out-of-memory".into()))?;
    let held_most = (exact.timeline.iter().take(event + 1))
        .map(|p| p.reserved_bytes)
        .max()
        .unwrap_or(0);
    let device_free = oom.device_free.unwrap_or(0);
    // The driver was asked for a segment (or pages) of the allocator's
    // size for the request, not the request itself.
    let room_exact = device_free < allocation_size(oom.size);
    let room = match room_exact {
        true => (at.reserved_bytes + device_free).max(held_most),
        false => held_most,
    };
    let in_room = |what_if: &str, conf: Option<String>| {
        candidate(snapshot, device, (what_if, Some(room)), conf)
    };
    let mut candidates = vec![in_room(
        "expandable_segments=true",
        Some("expandable_segments:True".into()),
    )?];
    for mb in MAX_SPLITS_MB {
        candidates.push(in_room(
            &format!("max_split_size_mb={mb}"),
            Some(format!("max_split_size_mb:{mb}")),
        )?);
    }
    for d in DIVISIONS {
        candidates.push(in_room(
            &format!("roundup_power2_divisions={d}"),
            Some(format!("roundup_power2_divisions:{d}")),
        )?);
    }
    for gpu in GpuModel::ALL {
        let spec = gpu.spec();
        if spec.total_bytes.saturating_sub(spec.context_bytes) > room {
            let what_if = format!("gpu={}", gpu.id());
            candidates.push(candidate(snapshot, device, (&what_if, None), None)?);
        }
    }
    let baseline = in_room("", None)?;
    let holders = holders(snapshot, device, event)?;
    Ok(Some(FixReport {
        event,
        request_bytes: oom.size,
        room_bytes: room,
        room_exact,
        allocated_bytes: at.allocated_bytes,
        recorded: baseline,
        candidates,
        holders,
    }))
}

/// The recorded requests replayed under `what_if`, in `room` bytes (a
/// recording does not say how large the GPU was: the room and a context
/// of the simulator's default; an expandable segment's range is 1⅛ of
/// the GPU), or on the GPU it names.
fn candidate(
    snapshot: &MemorySnapshot,
    device: usize,
    (what_if, room): (&str, Option<u64>),
    alloc_conf: Option<String>,
) -> Result<FixCandidate, SnapshotError> {
    let mut settings = what_if_settings(snapshot, &parse_what_if(what_if)?)?;
    if let Some(room) = room {
        settings.device_total_bytes = room + DEFAULT_CONTEXT_BYTES;
        settings.context_bytes = DEFAULT_CONTEXT_BYTES;
        settings.other_processes_bytes = 0;
    }
    let run = Replay::new(snapshot, device, settings, false)?.run_probing()?;
    Ok(FixCandidate {
        what_if: what_if.to_string(),
        alloc_conf,
        runs: run.ooms.is_empty(),
        peak_reserved_bytes: run.peak_reserved_bytes,
        out_of_memory_at: run.ooms.first().map(|o| o.event),
    })
}

/// The frames whose live blocks hold the most at `event`.
fn holders(
    snapshot: &MemorySnapshot,
    device: usize,
    event: usize,
) -> Result<Vec<(String, u64)>, SnapshotError> {
    let mut frames = super::diff::live_by_frame(snapshot, device, event)?;
    frames.truncate(HOLDERS);
    Ok(frames)
}
