//! The data of a PyTorch memory snapshot, field for field as
//! `torch.cuda.memory._snapshot()` returns it and `_dump_snapshot` pickles
//! it (`SegmentInfo`, `BlockInfo`, `TraceEntry` in
//! `c10/cuda/CUDACachingAllocator.h`; the dict keys from
//! `torch/csrc/cuda/memory_snapshot.cpp`, `_memory_snapshot_pickled`).
//! Written by serde (as a pickle or JSON); read by `decode`: fields a
//! recording may lack default, fields vramlab does not use are skipped.

use super::trace::Trace;
use crate::alloc::{BlockId, PoolKind, SegmentView};
use serde::{Serialize, Serializer};
use std::sync::Arc;

/// Stack frames kept per block or event (a recording may hold hundreds;
/// the first are the innermost, where the allocation happened).
pub const MAX_FRAMES: usize = 32;

/// A whole snapshot: every segment at the moment of the dump, and each
/// device's trace of what happened before it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MemorySnapshot {
    pub segments: Vec<Segment>,
    /// One trace per device, oldest event first.
    pub device_traces: Vec<Trace>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_settings: Option<AllocatorSettings>,
}

/// One segment (`cudaMalloc`ed range, or an expandable segment's mapped
/// range) with its blocks in address order.
impl MemorySnapshot {
    /// `device`'s trace (empty when the snapshot has none for it).
    pub fn trace(&self, device: usize) -> &Trace {
        static EMPTY: std::sync::LazyLock<Trace> = std::sync::LazyLock::new(Trace::default);
        self.device_traces.get(device).unwrap_or(&EMPTY)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Segment {
    pub device: u32,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    /// The `cudaStream_t` it serves, as an integer (0: the default stream).
    pub stream: u64,
    /// `"small"` (2 MiB segments for requests up to 1 MiB) or `"large"`.
    pub segment_type: String,
    /// `(0, 0)` for the default pools; a CUDA graph's private pool else.
    pub segment_pool_id: (u64, u64),
    pub is_expandable: bool,
    pub blocks: Vec<Block>,
    pub frames: Stack,
}

impl Segment {
    /// A segment as the allocator shows it (`SegmentView`), each live
    /// block with the frames `frames_of` gives; the sizes summed from the
    /// blocks as `_snapshot()` sums them.
    pub fn from_view(view: &SegmentView, frames_of: impl Fn(BlockId) -> Stack) -> Segment {
        let blocks = (view.blocks.iter())
            .map(|b| Block {
                address: b.address,
                size: b.size,
                requested_size: b.requested_size,
                state: match b.id {
                    Some(_) => BlockState::ActiveAllocated,
                    None => BlockState::Inactive,
                },
                frames: b.id.map(&frames_of).unwrap_or_default(),
            })
            .collect();
        Segment {
            address: view.address,
            total_size: view.total_size,
            stream: view.stream,
            segment_type: match view.pool {
                PoolKind::Small => "small",
                _ => "large",
            }
            .into(),
            blocks,
            ..Segment::default()
        }
        .summed()
    }

    /// With `allocated_size`, `active_size` and `requested_size` summed
    /// over its active blocks.
    pub fn summed(mut self) -> Segment {
        let active = || self.blocks.iter().filter(|b| b.state.is_active());
        let (size, requested) = (
            active().map(|b| b.size).sum(),
            active().map(|b| b.requested_size).sum(),
        );
        (self.allocated_size, self.active_size, self.requested_size) = (size, size, requested);
        self
    }
}

/// A block of a segment: allocated, freed but waiting on a stream, or free.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    /// What the caller asked for (for a free block, its last user's).
    pub requested_size: u64,
    pub state: BlockState,
    pub frames: Stack,
}

/// `BlockInfo`'s state as the snapshot names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BlockState {
    ActiveAllocated,
    /// Freed by the caller, waiting for a stream's work before it returns
    /// to the cache (`record_stream`).
    ActivePendingFree,
    #[default]
    Inactive,
}

impl BlockState {
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }

    /// Still held by the allocator for a caller (not in the cache).
    pub fn is_active(self) -> bool {
        self != BlockState::Inactive
    }
}

/// One event of a device's trace (`TraceEntry`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceEntry {
    pub action: Action,
    /// Block or segment address (absent on `oom`).
    pub addr: u64,
    /// `alloc`, `free_requested`, `free_completed`: the caller's requested
    /// size; segment events: the segment's (or mapped range's) size; `oom`:
    /// the segment size that could not be had.
    pub size: u64,
    pub stream: u64,
    /// `oom`: the free bytes the driver reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_us: Option<i64>,
    pub frames: Stack,
}

impl TraceEntry {
    /// An entry with its action alone (no address, size or frames).
    pub fn new(action: Action) -> Self {
        TraceEntry {
            action,
            addr: 0,
            size: 0,
            stream: 0,
            device_free: None,
            time_us: None,
            frames: Stack::default(),
        }
    }
}

/// `TraceEntry::Action`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    /// An action this version does not know (kept, not replayed).
    Other(Arc<str>),
}

impl Action {
    pub fn name(&self) -> &str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::Other(name) => name,
        }
    }

    pub(super) fn from_name(name: String) -> Self {
        match name.as_str() {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "snapshot" => Action::Snapshot,
            "oom" => Action::Oom,
            _ => Action::Other(name.into()),
        }
    }
}

/// One stack frame. Its strings are shared: a recording names the same
/// few files and functions in millions of frames.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Frame {
    pub filename: Arc<str>,
    pub line: i64,
    pub name: Arc<str>,
}

/// A stack of frames, innermost first, shared by every record made at the
/// same place (a recording has a few hundred stacks for millions of
/// events).
pub type Stack = Arc<[Frame]>;

impl Frame {
    /// `name (file:line)`, or the name alone for a frame without a source
    /// file (C++ frames, vramlab's own owner frames).
    pub fn label(&self) -> String {
        if self.filename.ends_with(".py") {
            format!("{} ({}:{})", self.name, self.filename, self.line)
        } else {
            self.name.to_string()
        }
    }

    fn is_python(&self) -> bool {
        self.filename.ends_with(".py")
    }

    fn is_torch(&self) -> bool {
        self.filename.contains("/torch/") || self.filename.starts_with("torch/")
    }
}

/// The frame a reader looks for: the innermost Python frame outside
/// PyTorch's own files, else the innermost Python frame, else the first.
pub fn user_frame(frames: &[Frame]) -> Option<&Frame> {
    frames
        .iter()
        .find(|f| f.is_python() && !f.is_torch())
        .or_else(|| frames.iter().find(|f| f.is_python()))
        .or_else(|| frames.first())
}

/// The allocator's settings at the dump (`allocator_settings`, PyTorch 2.1
/// and later).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AllocatorSettings {
    #[serde(rename = "PYTORCH_CUDA_ALLOC_CONF")]
    pub alloc_conf: String,
    /// Bytes; -1 when unset.
    pub max_split_size: i64,
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    /// Interval in MiB (as a string: `"1"` … `"32768"`) to divisions.
    pub roundup_power2_divisions: std::collections::BTreeMap<String, u64>,
}

/// Strings on the wire, as PyTorch writes them.
macro_rules! by_name {
    ($type:ty) => {
        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }
    };
}

by_name!(Action);
by_name!(BlockState);
