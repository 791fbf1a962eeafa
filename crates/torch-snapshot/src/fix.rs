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
use super::replay::{replay_exact, what_if_settings, Replay, ReplayRun};
use super::what_if::parse_what_if;
use super::SnapshotError;
use serde::{Deserialize, Serialize};
use vramlab_core::units::format_size;
use vramlab_device::alloc::caching::allocation_size;
use vramlab_device::device::DEFAULT_CONTEXT_BYTES;
use vramlab_device::framework::RestartSettings;
use vramlab_device::gpu::GpuModel;

/// `max_split_size_mb` values tried.
const MAX_SPLITS_MB: [u64; 4] = [512, 256, 128, 64];
/// `roundup_power2_divisions` values tried.
const DIVISIONS: [u64; 2] = [4, 8];
/// `garbage_collection_threshold` values tried, where the recording ran
/// under a memory fraction of its own: PyTorch collects cached blocks by
/// that threshold only then (`set_fraction` in `malloc`).
const GC_THRESHOLDS: [&str; 2] = ["0.6", "0.8"];
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
    /// The user's code line that asked for it (its innermost frame outside
    /// PyTorch), where the recording kept frames.
    #[serde(default)]
    pub at: Option<String>,
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
    /// The out-of-memory and its remedy in plain words, first: where it
    /// ran out, what it asked for with how much live in how much room;
    /// the allocator setting that runs it through, or that none does and
    /// by how much the live tensors exceed the room (and the smallest GPU
    /// that runs it); the frames holding the most.
    pub fn headline(&self) -> String {
        let at = self
            .at
            .as_deref()
            .map_or(String::new(), |a| format!(" at {a}"));
        let room = match self.room_exact {
            true => format_size(self.room_bytes),
            false => format!("at least {}", format_size(self.room_bytes)),
        };
        let mut out = format!(
            "Ran out of memory{at} asking for {} with {} live, of {room} the process could hold.",
            format_size(self.request_bytes),
            format_size(self.allocated_bytes),
        );
        let setting = (self.ranked().into_iter()).find(|c| c.alloc_conf.is_some());
        match (setting, self.smallest_gpu()) {
            (Some(c), _) => out.push_str(&format!(
                " PYTORCH_CUDA_ALLOC_CONF={} runs it through (peak reserved {}): the memory was free, in pieces the request could not use.",
                c.alloc_conf.as_deref().unwrap_or_default(),
                format_size(c.peak_reserved_bytes)
            )),
            (None, gpu) => {
                out.push_str(&format!(
                    " No allocator setting helps: the live tensors and the request exceed the room by {}; hold less (a smaller batch, gradient checkpointing, freeing what the step no longer needs)",
                    format_size(self.shortfall_bytes())
                ));
                match gpu {
                    Some(g) => out.push_str(&format!(
                        " or use a GPU with more room ({} runs it).",
                        g.what_if.trim_start_matches("gpu=")
                    )),
                    None => out.push('.'),
                }
            }
        }
        let holders: Vec<String> = (self.holders.iter().take(3))
            .map(|(frame, bytes)| format!("{frame} ({})", format_size(*bytes)))
            .collect();
        if !holders.is_empty() {
            out.push_str(&format!(" Held most by {}.", holders.join(", ")));
        }
        out
    }

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

    /// The what-if that replays candidate `c` as the search did (an
    /// allocator setting in the room; a GPU as it is).
    pub fn what_if(&self, c: &FixCandidate) -> Result<RestartSettings, SnapshotError> {
        in_room(&c.what_if, c.alloc_conf.as_ref().map(|_| self.room_bytes))
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
    let Some(event) = first_oom(snapshot, device) else {
        return Ok(None);
    };
    let oom = trace
        .get(event)
        .ok_or_else(|| SnapshotError::Replay("no such event".into()))?;
    let exact = replay_exact(snapshot, device)?;
    let at = exact.timeline.get(event).copied();
    let at =
        at.ok_or_else(|| SnapshotError::Replay("the trace ends before its out-of-memory".into()))?;
    let Room {
        bytes: room,
        exact: room_exact,
    } = room(snapshot, device, &exact)
        .ok_or_else(|| SnapshotError::Replay("the trace ends before its out-of-memory".into()))?;
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
    if !room_exact {
        // The process's own limit is the room: the fraction of a GPU of
        // the room and the context that leaves the room.
        let fraction = room as f64 / (room + DEFAULT_CONTEXT_BYTES) as f64;
        for t in GC_THRESHOLDS {
            candidates.push(in_room(
                &format!(
                    "garbage_collection_threshold={t},per_process_memory_fraction={fraction:.4}"
                ),
                Some(format!("garbage_collection_threshold:{t}")),
            )?);
        }
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
        at: oom_line(snapshot, device),
        room_bytes: room,
        room_exact,
        allocated_bytes: at.allocated_bytes,
        recorded: baseline,
        candidates,
        holders,
    }))
}

/// The event of `device`'s first recorded out-of-memory.
fn first_oom(snapshot: &MemorySnapshot, device: usize) -> Option<usize> {
    let trace = snapshot.trace(device);
    (0..trace.len()).find(|&i| trace.action(i) == Action::Oom)
}

/// The memory a recording's process could hold, read from its first
/// out-of-memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    pub bytes: u64,
    /// What the process held then and the driver still had free; else the
    /// process hit a limit of its own, and this is the most it held (a
    /// lower bound).
    pub exact: bool,
}

/// The room `device`'s process had, from its first out-of-memory and the
/// exact replay `exact` of its trace (none without one).
pub fn room(snapshot: &MemorySnapshot, device: usize, exact: &ReplayRun) -> Option<Room> {
    let trace = snapshot.trace(device);
    let event = first_oom(snapshot, device)?;
    let oom = trace.get(event)?;
    let at = exact.timeline.get(event)?;
    let held_most = (exact.timeline.iter().take(event + 1))
        .map(|p| p.reserved_bytes)
        .max()
        .unwrap_or(0);
    let device_free = oom.device_free.unwrap_or(0);
    // The driver was asked for a segment (or pages) of the allocator's
    // size for the request, not the request itself.
    let exact = device_free < allocation_size(oom.size);
    let bytes = match exact {
        true => (at.reserved_bytes + device_free).max(held_most),
        false => held_most,
    };
    Some(Room { bytes, exact })
}

/// A what-if in `room`: a GPU of the room and the simulator's default
/// context, nothing else on it (as the fix replays its settings); a
/// what-if that names a card or a size keeps it.
pub fn in_the_room(mut settings: RestartSettings, room: Room) -> RestartSettings {
    if settings.gpu.is_none() && settings.device_total_bytes.is_none() {
        settings.device_total_bytes = Some(room.bytes + DEFAULT_CONTEXT_BYTES);
        settings.context_bytes = Some(DEFAULT_CONTEXT_BYTES);
        settings.other_processes_bytes = Some(0);
    }
    settings
}

/// The first out-of-memory of `device`'s trace in words, from the trace
/// alone (no replay): where it ran out and what it asked for.
pub fn first_oom_words(snapshot: &MemorySnapshot, device: usize) -> Option<String> {
    let trace = snapshot.trace(device);
    let event = first_oom(snapshot, device)?;
    let size = trace.get(event)?.size;
    let at = oom_line(snapshot, device).map_or(String::new(), |a| format!(" at {a}"));
    Some(format!(
        "Ran out of memory{at} asking for {} (event {event}).",
        format_size(size)
    ))
}

/// The first out-of-memory of `device`'s trace: the user's code line
/// that asked for it, if the recording kept frames.
pub fn oom_line(snapshot: &MemorySnapshot, device: usize) -> Option<String> {
    let trace = snapshot.trace(device);
    let event = first_oom(snapshot, device)?;
    let frames = trace.get(event)?.frames;
    super::frame::user_frame(&frames).map(|f| f.label())
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
    let settings = what_if_settings(snapshot, &in_room(what_if, room)?)?;
    let run = Replay::new(snapshot, device, settings, false)?.run_probing()?;
    Ok(FixCandidate {
        what_if: what_if.to_string(),
        alloc_conf,
        runs: run.ooms.is_empty(),
        peak_reserved_bytes: run.peak_reserved_bytes,
        out_of_memory_at: run.ooms.first().map(|o| o.event),
    })
}

/// `what_if` in `room` bytes: a GPU of the room and the simulator's
/// default context, nothing else on it.
fn in_room(what_if: &str, room: Option<u64>) -> Result<RestartSettings, SnapshotError> {
    let settings = parse_what_if(what_if)?;
    Ok(match room {
        Some(bytes) => in_the_room(settings, Room { bytes, exact: true }),
        None => settings,
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

/// What `vramlab replay --fix` prints and the snapshot page shows: the
/// settings that run the recording through its first out-of-memory, or
/// the shortfall and who held the memory.
pub fn fix_lines(fix: Option<&FixReport>) -> Vec<String> {
    let mut out = Vec::new();
    let Some(fix) = fix else {
        out.push("fix: the recording shows no out-of-memory; nothing to fix".to_string());
        return out;
    };
    out.push(format!(
        "fix for the out-of-memory at event {} (a request of {}):",
        fix.event,
        format_size(fix.request_bytes)
    ));
    let room = match fix.room_exact {
        true => "what the process held and the driver still had free",
        false => "the most the process held: it hit a limit of its own (a memory fraction), so at least this",
    };
    out.push(format!("  room: {}, {room}", format_size(fix.room_bytes)));
    if fix.room_exact {
        out.push("  garbage_collection_threshold: not tried: PyTorch collects by it only under torch.cuda.set_per_process_memory_fraction, and this process ran without one".to_string());
    }
    let recorded = match fix.recorded.out_of_memory_at {
        Some(at) => format!("out of memory at event {at}"),
        None => "runs through: the recorded failure does not happen in this room".into(),
    };
    out.push(format!("  the recorded settings in that room: {recorded}"));
    let ranked = fix.ranked();
    if !ranked.is_empty() {
        out.push("  runs through, fewest bytes reserved first:".to_string());
    }
    for c in ranked.iter().filter(|c| c.alloc_conf.is_some()) {
        let conf = c.alloc_conf.as_deref().unwrap_or_default();
        out.push(format!(
            "    PYTORCH_CUDA_ALLOC_CONF={conf}: peak reserved {}",
            format_size(c.peak_reserved_bytes)
        ));
    }
    if let Some(gpu) = fix.smallest_gpu() {
        out.push(format!("    as recorded, on a GPU with more room: the smallest, {} ({} free): peak reserved {}",
            gpu.what_if.trim_start_matches("gpu="),
            format_size(fix.gpu_free_bytes(gpu)),
            format_size(gpu.peak_reserved_bytes)
        ));
    }
    let failing: Vec<String> = (fix.candidates.iter())
        .filter(|c| !c.runs && c.alloc_conf.is_some())
        .map(|c| {
            format!(
                "{} (event {})",
                c.what_if,
                c.out_of_memory_at.unwrap_or(fix.event)
            )
        })
        .collect();
    if !failing.is_empty() {
        out.push(format!("  still out of memory: {}", failing.join(", ")));
    }
    if !ranked.iter().any(|c| c.alloc_conf.is_some()) {
        out.push(format!("  no allocator setting runs it: the live tensors ({}) and the request ({}) exceed the room by {}; the frames holding the most then:",
            format_size(fix.allocated_bytes),
            format_size(fix.request_bytes),
            format_size(fix.shortfall_bytes())
        ));
        for (frame, bytes) in &fix.holders {
            out.push(format!("    {}  {frame}", format_size(*bytes)));
        }
    }
    out
}
