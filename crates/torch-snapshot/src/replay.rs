//! Replaying a recorded trace on vramlab's allocators.
//!
//! **Exact**: the allocator starts from the state at the trace's first
//! event ([`super::initial`]) with the recorded settings, on a device large
//! enough never to refuse. New segments go where the trace put them (the
//! driver's choice, `SimDevice::place_next`); a recorded `segment_free`
//! releases that segment at that moment (the driver ran out, or the program
//! called `empty_cache`: the trace does not say how big the GPU was). Every
//! other decision is the allocator's own, and it is checked event by event:
//! whether a request needed a new segment, and which block it took.
//!
//! **What if**: the same requests under other settings and on a chosen
//! GPU; every decision is the allocator's, out-of-memory errors included,
//! and the program's `empty_cache()` calls are repeated ([`release`]).

use super::format::{user_frame, Action, MemorySnapshot, TraceEntry};
use super::initial::initial_state;
use super::pools::PoolRoutes;
use super::trace::Trace;
use super::SnapshotError;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use vramlab_core::types::Framework;
use vramlab_core::units::{format_size, GIB};
use vramlab_device::alloc::roundup::RoundupDivisions;
use vramlab_device::alloc::{AllocError, Allocator, BlockId, SegmentView, TraceAction, TraceEvent};
use vramlab_device::device::{SimDevice, SimDeviceConfig};
use vramlab_device::framework::{RestartSettings, Settings};
use vramlab_process::snapshot::{BlockSnapshot, SegmentSnapshot};

mod devices;
mod kernel;
mod record;
mod release;
mod restart;
mod seed;
mod timeline;

pub use devices::{busiest_device, default_device, recorded_ooms};
use kernel::Process;
pub use record::export_what_if;
pub use restart::replay_what_if;
pub use timeline::{thin, TimelinePoint};

/// A device no recorded run outgrows (1 PiB).
const UNBOUNDED: u64 = 1024 * 1024 * GIB;

/// Where a replay first did something other than the trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Difference {
    /// The trace event's index.
    pub event: usize,
    pub trace: String,
    pub engine: String,
}

/// A request the replay could not serve.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayOom {
    pub event: usize,
    pub requested_bytes: u64,
    pub message: String,
}

/// When fragmentation is measured: at the run's first out-of-memory (the
/// recorded one in an exact replay, the run's own in a what-if), else where
/// allocated memory peaked. (Where reserved peaks says little: a recording
/// that starts mid-run peaks in reserved at its first event, with the
/// cache the run before it left.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fragmentation {
    /// Reserved minus allocated.
    pub bytes: u64,
    pub event: usize,
    /// At an out-of-memory; otherwise at the peak allocated.
    pub at_oom: bool,
}

impl Fragmentation {
    /// "at the out-of-memory (event 12)".
    pub fn moment(&self) -> String {
        match self.at_oom {
            true => format!("at the out-of-memory (event {})", self.event),
            false => format!("at the peak allocated (event {})", self.event),
        }
    }
}

/// One replay's outcome.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplayRun {
    pub settings: Settings,
    pub events: usize,
    /// Exact replays: every recorded event reproduced at the same place.
    pub exact: Option<bool>,
    pub first_difference: Option<Difference>,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    /// Reserved but not allocated at the moment that matters.
    pub fragmentation: Fragmentation,
    /// Out-of-memory errors the recording itself shows.
    pub recorded_ooms: usize,
    pub ooms: Vec<ReplayOom>,
    /// After every event (see [`thin`] for a chart).
    pub timeline: Vec<TimelinePoint>,
    #[serde(skip)]
    pub segments: Vec<SegmentView>,
}

/// The settings a recording was made with (PyTorch, on a device that never
/// refuses).
pub fn recorded_settings(snapshot: &MemorySnapshot) -> Settings {
    let mut s = Settings {
        framework: Framework::Pytorch,
        device_total_bytes: UNBOUNDED,
        context_bytes: 0,
        ..Settings::default()
    };
    if let Some(a) = &snapshot.allocator_settings {
        s.expandable_segments = a.expandable_segments;
        s.max_split_size_mb = u64::try_from(a.max_split_size).ok().map(|b| b >> 20);
        s.garbage_collection_threshold = a.garbage_collection_threshold;
        let mut table = [0; vramlab_device::alloc::roundup::INTERVALS];
        for (i, slot) in table.iter_mut().enumerate() {
            *slot = a
                .roundup_power2_divisions
                .get(&(1u64 << i).to_string())
                .copied()
                .unwrap_or(0);
        }
        s.roundup_power2_divisions = RoundupDivisions::from_table(table).unwrap_or_default();
    }
    s.expandable_segments |= uses_expandable_segments(snapshot);
    s
}

/// Replays `device`'s trace exactly as recorded.
pub fn replay_exact(snapshot: &MemorySnapshot, device: usize) -> Result<ReplayRun, SnapshotError> {
    Replay::new(snapshot, device, recorded_settings(snapshot), true)?.run()
}

/// The segments after trace event `event` (the last one if beyond) in the
/// exact replay (`what_if`: `None`) or a what-if replay; each live block
/// is named by the frame that allocated it ([`super::format::user_frame`]).
/// A `segment_alloc` shows with the request that made it.
pub fn segments_at(
    snapshot: &MemorySnapshot,
    device: usize,
    what_if: Option<&RestartSettings>,
    event: usize,
) -> Result<Vec<SegmentSnapshot>, SnapshotError> {
    let mut replay = match what_if {
        None => Replay::new(snapshot, device, recorded_settings(snapshot), true)?,
        Some(w) => Replay::new(snapshot, device, what_if_settings(snapshot, w)?, false)?,
    };
    let mut last = event.min(replay.trace.len().saturating_sub(1));
    // A segment is made by the request that needs it, the next `alloc`.
    while replay
        .trace
        .get(last)
        .is_some_and(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap))
        && last + 1 < replay.trace.len()
    {
        last += 1;
    }
    let trace = replay.trace;
    for (index, e) in trace.iter().enumerate().take(last + 1) {
        replay.step(index, &e);
    }
    Ok(replay.segment_snapshots())
}

/// Expandable ranges in the segment list or mapping events in a trace
/// (older recordings have no `allocator_settings` to say so).
pub(crate) fn uses_expandable_segments(snapshot: &MemorySnapshot) -> bool {
    snapshot.segments.iter().any(|s| s.is_expandable)
        || snapshot
            .device_traces
            .iter()
            .flat_map(|t| (0..t.len()).map(|i| t.action(i)))
            .any(|a| matches!(a, Action::SegmentMap | Action::SegmentUnmap))
}

/// The recorded settings changed by `what_if` (a PyTorch recording's).
pub(super) fn what_if_settings(
    snapshot: &MemorySnapshot,
    what_if: &RestartSettings,
) -> Result<Settings, SnapshotError> {
    let settings = recorded_settings(snapshot)
        .patched(what_if)
        .map_err(|e| SnapshotError::Settings(e.message))?;
    if settings.framework != Framework::Pytorch {
        return Err(SnapshotError::Settings(
            "a PyTorch recording replays on PyTorch only".into(),
        ));
    }
    Ok(settings)
}

pub(super) struct Replay<'a> {
    trace: &'a Trace,
    exact: bool,
    device: SimDevice,
    process: Process,
    /// Recorded block address → the replay's block and the event that
    /// allocated it (`None`: live when the recording starts).
    blocks: HashMap<u64, (BlockId, Option<usize>)>,
    /// The recorded `segment_alloc`s (or `segment_map`s) the next request
    /// must make.
    expected_segments: Vec<(u64, u64)>,
    /// Expandable segments: what the `empty_cache` replayed for a run of
    /// recorded `segment_unmap`s unmapped and the run has not yet shown.
    unmapped: Option<Vec<(u64, u64)>>,
    /// The end of the run of recorded releases being read (what-if).
    releases_end: Option<usize>,
    /// Private pools that become freeable, by event, not yet reached.
    freeable: std::collections::VecDeque<(usize, u64)>,
    out: ReplayRun,
    drained: Vec<TraceEvent>,
    allocated_peak: u64,
    /// CUDA graphs' private pools: which a request was served from.
    routes: PoolRoutes,
}

impl<'a> Replay<'a> {
    pub(super) fn new(
        snapshot: &'a MemorySnapshot,
        device_index: usize,
        settings: Settings,
        exact: bool,
    ) -> Result<Self, SnapshotError> {
        let mut replay = Self::bare(snapshot, device_index, settings, exact);
        replay.seed(&initial_state(snapshot, device_index)?)?;
        Ok(replay)
    }

    /// A replay on an empty device, its start not yet rebuilt.
    fn bare(
        snapshot: &'a MemorySnapshot,
        device_index: usize,
        settings: Settings,
        exact: bool,
    ) -> Self {
        let trace = snapshot.trace(device_index);
        let device = SimDevice::new(SimDeviceConfig {
            total_bytes: settings.device_total_bytes,
            context_bytes: settings.context_bytes,
            other_processes_bytes: settings.other_processes_bytes,
            ..Default::default()
        });
        let process = Process::new(&settings, &device);
        let out = ReplayRun {
            settings: settings.clone(),
            events: trace.len(),
            exact: exact.then_some(true),
            first_difference: None,
            peak_reserved_bytes: 0,
            peak_allocated_bytes: 0,
            fragmentation: Fragmentation::default(),
            recorded_ooms: 0,
            ooms: Vec::new(),
            timeline: Vec::with_capacity(trace.len()),
            segments: Vec::new(),
        };
        Replay {
            trace,
            exact,
            device,
            process,
            blocks: HashMap::new(),
            expected_segments: Vec::new(),
            unmapped: None,
            releases_end: None,
            freeable: Default::default(),
            out,
            drained: Vec::new(),
            allocated_peak: 0,
            routes: PoolRoutes::of(snapshot, device_index),
        }
        .keeping_private_pools()
    }

    pub(super) fn run(mut self) -> Result<ReplayRun, SnapshotError> {
        let trace = self.trace;
        for (index, e) in trace.iter().enumerate() {
            self.step(index, &e);
            self.sample(index);
        }
        self.finish()
    }

    /// [`Replay::run`], asking again at each recorded out-of-memory for
    /// what failed there (and giving it back at once: what the program did
    /// next is not in the trace): whether this run would have served it.
    pub(super) fn run_probing(mut self) -> Result<ReplayRun, SnapshotError> {
        let trace = self.trace;
        for (index, e) in trace.iter().enumerate() {
            self.step(index, &e);
            if e.action == Action::Oom {
                let ask = TraceEntry {
                    addr: u64::MAX - index as u64,
                    size: e.size,
                    stream: e.stream,
                    ..TraceEntry::new(Action::Alloc)
                };
                self.alloc(index, &ask);
                self.free(index, &ask);
            }
            self.sample(index);
        }
        self.finish()
    }

    fn finish(mut self) -> Result<ReplayRun, SnapshotError> {
        let stats = self.process.allocator().stats().clone();
        self.out.peak_reserved_bytes = stats.reserved_bytes.peak;
        self.out.peak_allocated_bytes = stats.allocated_bytes.peak;
        self.out.segments = self.process.allocator().segments();
        Ok(self.out)
    }

    fn step(&mut self, index: usize, e: &TraceEntry) {
        self.free_private_pools(index);
        if e.action != Action::SegmentUnmap {
            self.end_unmapping(index);
        }
        match e.action {
            Action::Alloc => self.alloc(index, e),
            Action::FreeCompleted => self.free(index, e),
            Action::SegmentAlloc | Action::SegmentMap => self.segment_made(e),
            Action::SegmentFree => self.segment_free(index, e),
            Action::SegmentUnmap if self.exact => self.unmap(index, e),
            Action::SegmentUnmap => self.recorded_release(index),
            Action::Oom => {
                self.out.recorded_ooms += 1;
                if self.exact {
                    self.at_oom(index);
                }
            }
            Action::FreeRequested | Action::Snapshot | Action::Other(_) => {}
        }
    }

    /// A recorded segment (or mapped range) the next request must make,
    /// placed where the recording had it.
    fn segment_made(&mut self, e: &TraceEntry) {
        if !self.exact {
            return;
        }
        match &mut self.process {
            Process::Expandable(a) => a.place_next_range(e.addr),
            _ => _ = self.device.place_next(e.addr, e.size),
        }
        self.expected_segments.push((e.addr, e.size));
    }

    fn alloc(&mut self, index: usize, e: &TraceEntry) {
        let stream = self.routes.stream_for(index, e.stream);
        match self.process.malloc_on(&mut self.device, e.size, stream) {
            Ok(Some(id)) => {
                self.blocks.insert(e.addr, (id, Some(index)));
            }
            Ok(None) => {}
            Err(AllocError::OutOfMemory(oom)) => {
                self.at_oom(index);
                self.out.ooms.push(ReplayOom {
                event: index,
                requested_bytes: e.size,
                message: format!(
                    "CUDA out of memory. Tried to allocate {}. {} reserved by PyTorch, {} allocated.",
                    format_size(oom.rounded),
                    format_size(oom.reserved),
                    format_size(oom.allocated)
                ),
                })
            }
            Err(AllocError::Driver(message)) => {
                self.at_oom(index);
                self.out.ooms.push(ReplayOom {
                    event: index,
                    requested_bytes: e.size,
                    message,
                })
            }
        }
        if self.exact {
            self.check_alloc(index, e);
        }
        self.expected_segments.clear();
    }

    /// Compares what the allocator just did with the recorded request.
    fn check_alloc(&mut self, index: usize, e: &TraceEntry) {
        self.drained.clear();
        self.process.allocator().drain_trace(&mut self.drained);
        let made: Vec<(u64, u64)> = self
            .drained
            .iter()
            .filter(|t| t.action == TraceAction::SegmentAlloc)
            .map(|t| (t.address, t.size))
            .collect();
        let placed = self
            .drained
            .iter()
            .find(|t| t.action == TraceAction::Alloc)
            .map(|t| t.address);
        let expandable = matches!(self.process, Process::Expandable(_));
        let trace = placement(&self.expected_segments, Some(e.addr), expandable);
        let engine = placement(&made, placed, expandable);
        if trace != engine {
            self.differ(index, format!("alloc of {} bytes: {trace}", e.size), engine);
        }
    }

    fn free(&mut self, index: usize, e: &TraceEntry) {
        match self.blocks.remove(&e.addr) {
            Some((id, _)) => self.process.allocator().free(&mut self.device, id),
            None if self.exact => {
                self.differ(
                    index,
                    format!("free_completed of the block at {:#x}", e.addr),
                    "no live block there".into(),
                );
            }
            None => {} // its request ran out of memory in this run
        }
        if self.exact {
            self.process.allocator().drain_trace(&mut self.drained);
        }
    }

    fn segment_free(&mut self, index: usize, e: &TraceEntry) {
        if !self.exact {
            self.recorded_release(index);
            return;
        }
        let Process::Caching(a) = &mut self.process else {
            return;
        };
        let released = a.release_segment_at(&mut self.device, e.addr);
        a.drain_trace(&mut self.drained);
        if let Err(why) = released {
            let trace = format!(
                "segment_free of the {}-byte segment at {:#x}",
                e.size, e.addr
            );
            self.differ(index, trace, why.0);
        }
    }

    /// One recorded `segment_unmap` of a run: the first replays
    /// `empty_cache`, and each must be among what it unmapped.
    fn unmap(&mut self, index: usize, e: &TraceEntry) {
        if self.unmapped.is_none() {
            self.drained.clear();
            self.process.allocator().empty_cache(&mut self.device);
            self.process.allocator().drain_trace(&mut self.drained);
            let freed = (self.drained.iter())
                .filter(|t| t.action == TraceAction::SegmentFree)
                .map(|t| (t.address, t.size));
            self.unmapped = Some(freed.collect());
        }
        let unmapped = self.unmapped.as_mut().expect("just set");
        match unmapped.iter().position(|&u| u == (e.addr, e.size)) {
            Some(i) => _ = unmapped.swap_remove(i),
            None => self.differ(
                index,
                format!("segment_unmap of {} bytes at {:#x}", e.size, e.addr),
                "empty_cache() does not unmap that range".into(),
            ),
        }
    }

    /// After a run of `segment_unmap`s: the replay unmapped nothing more.
    fn end_unmapping(&mut self, index: usize) {
        let Some(left) = self.unmapped.take() else {
            return;
        };
        if let Some(&(a, s)) = left.first() {
            self.differ(
                index,
                "no further segment_unmap".into(),
                format!("empty_cache() also unmapped {s} bytes at {a:#x}"),
            );
        }
    }

    fn differ(&mut self, event: usize, trace: String, engine: String) {
        self.out.exact = Some(false);
        self.out.first_difference.get_or_insert(Difference {
            event,
            trace,
            engine,
        });
    }

    /// The allocator's segments, each live block named by its origin.
    fn segment_snapshots(&mut self) -> Vec<SegmentSnapshot> {
        let owners: HashMap<BlockId, String> = self
            .blocks
            .values()
            .map(|&(id, origin)| (id, self.origin_label(origin)))
            .collect();
        let segments = self.process.allocator().segments();
        segments
            .into_iter()
            .map(|s| segment_snapshot(s, &owners))
            .collect()
    }

    fn origin_label(&self, origin: Option<usize>) -> String {
        let Some(event) = origin else {
            return "live when the recording starts".into();
        };
        match user_frame(self.trace.frames(event)) {
            Some(frame) => format!("{} (event {event})", frame.label()),
            None => format!("allocated at event {event}"),
        }
    }

    /// Measures fragmentation at the run's first out-of-memory.
    fn at_oom(&mut self, event: usize) {
        if self.out.fragmentation.at_oom {
            return;
        }
        let s = self.process.allocator().stats();
        self.out.fragmentation = Fragmentation {
            bytes: s.reserved_bytes.current - s.allocated_bytes.current,
            event,
            at_oom: true,
        };
    }

    fn sample(&mut self, event: usize) {
        let s = self.process.allocator().stats();
        let (allocated, reserved) = (s.allocated_bytes.current, s.reserved_bytes.current);
        let first = self.out.timeline.is_empty();
        if (first || allocated > self.allocated_peak) && !self.out.fragmentation.at_oom {
            self.allocated_peak = allocated;
            self.out.fragmentation = Fragmentation {
                bytes: reserved - allocated,
                event,
                at_oom: false,
            };
        }
        self.out.timeline.push(TimelinePoint {
            event,
            allocated_bytes: allocated,
            reserved_bytes: reserved,
        });
    }
}

fn segment_snapshot(s: SegmentView, owners: &HashMap<BlockId, String>) -> SegmentSnapshot {
    let live = || s.blocks.iter().filter(|b| b.id.is_some());
    SegmentSnapshot {
        address: s.address,
        total_size: s.total_size,
        allocated_size: live().map(|b| b.size).sum(),
        requested_size: live().map(|b| b.requested_size).sum(),
        pool: s.pool.name().into(),
        blocks: s
            .blocks
            .iter()
            .map(|b| BlockSnapshot {
                address: b.address,
                size: b.size,
                requested_size: b.requested_size,
                state: b.state,
                owner: b.id.and_then(|id| owners.get(&id).cloned()),
                category: None,
            })
            .collect(),
    }
}

/// A request's outcome in words: the segments it made (mapped ranges with
/// expandable segments) and where its block went.
fn placement(segments: &[(u64, u64)], block: Option<u64>, expandable: bool) -> String {
    let Some(block) = block else {
        return "no block (out of memory)".into();
    };
    if segments.is_empty() {
        return format!("a cached block at {block:#x}");
    }
    let made: Vec<String> = (segments.iter())
        .map(|&(a, s)| match expandable {
            true => format!("{s} bytes mapped at {a:#x}"),
            false => format!("a new {s}-byte segment at {a:#x}"),
        })
        .collect();
    format!("{}, the block at {block:#x}", made.join(", "))
}
