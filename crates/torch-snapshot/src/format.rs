//! The data of a PyTorch memory snapshot, field for field as
//! `torch.cuda.memory._snapshot()` returns it and `_dump_snapshot` pickles
//! it (`SegmentInfo`, `BlockInfo`, `TraceEntry` in
//! `c10/cuda/CUDACachingAllocator.h`; the dict keys from
//! `torch/csrc/cuda/memory_snapshot.cpp`, `_memory_snapshot_pickled`).
//! Written by serde (as a pickle or JSON); read by `decode`: fields a
//! recording may lack default, fields vramlab does not use are skipped.

pub use super::frame::{user_frame, Frame, Stack, MAX_FRAMES};
pub use super::trace::{Action, Trace, TraceEntry};
use serde::{Serialize, Serializer};
use vramlab_device::alloc::{BlockId, PoolKind, SegmentView};

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

impl MemorySnapshot {
    /// `device`'s trace (empty when the snapshot has none for it).
    pub fn trace(&self, device: usize) -> &Trace {
        static EMPTY: std::sync::LazyLock<Trace> = std::sync::LazyLock::new(Trace::default);
        self.device_traces.get(device).unwrap_or(&EMPTY)
    }
}

/// One segment (`cudaMalloc`ed range, or an expandable segment's mapped
/// range) with its blocks in address order.
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

by_name!(BlockState);
