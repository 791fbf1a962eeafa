//! What the kernel counts and logs: the numbers every result carries
//! ([`Stats`]) and the entries of the event log ([`Event`]).

use crate::alloc::TraceAction;
use crate::types::Category;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The numbers of DESIGN.md, in bytes or counts. For TensorFlow and JAX,
/// allocated is the BFC allocator's `bytes_in_use` and reserved its
/// `pool_bytes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// `memory_allocated()`.
    pub allocated_bytes: u64,
    /// `memory_reserved()`.
    pub reserved_bytes: u64,
    pub active_bytes: u64,
    pub requested_bytes: u64,
    /// Free bytes inside segments that also hold live blocks: `empty_cache`
    /// cannot return them ("Non-releasable memory").
    pub inactive_split_bytes: u64,
    /// `max_memory_allocated()`.
    pub peak_allocated_bytes: u64,
    /// `max_memory_reserved()`.
    pub peak_reserved_bytes: u64,
    /// nvidia-smi's view of this process: context + every live segment.
    pub device_used_bytes: u64,
    pub device_total_bytes: u64,
    /// `cudaMemGetInfo` free: what any process could still get.
    pub device_free_bytes: u64,
    pub segments: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    /// Live blocks (`allocation.all.current`).
    pub allocations: u64,
    pub context_bytes: u64,
    pub other_processes_bytes: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    /// Peak allocated during the command (not lost between samples).
    pub step_peak_allocated_bytes: u64,
    /// Peak reserved during the command.
    pub step_peak_reserved_bytes: u64,
    /// Allocated bytes by what the blocks hold (the memory_viz legend).
    pub categories: BTreeMap<Category, u64>,
}

impl Stats {
    /// The value of a stat by its JSON name, `categories.<name>` for a
    /// category (for lesson expectations).
    pub fn get(&self, key: &str) -> Option<u64> {
        if let Some(name) = key.strip_prefix("categories.") {
            let category = Category::ALL.into_iter().find(|c| c.name() == name)?;
            return Some(self.categories.get(&category).copied().unwrap_or(0));
        }
        Some(match key {
            "allocated_bytes" => self.allocated_bytes,
            "reserved_bytes" => self.reserved_bytes,
            "active_bytes" => self.active_bytes,
            "requested_bytes" => self.requested_bytes,
            "inactive_split_bytes" => self.inactive_split_bytes,
            "peak_allocated_bytes" => self.peak_allocated_bytes,
            "peak_reserved_bytes" => self.peak_reserved_bytes,
            "device_used_bytes" => self.device_used_bytes,
            "device_total_bytes" => self.device_total_bytes,
            "device_free_bytes" => self.device_free_bytes,
            "segments" => self.segments,
            "num_alloc_retries" => self.num_alloc_retries,
            "num_ooms" => self.num_ooms,
            "allocations" => self.allocations,
            "context_bytes" => self.context_bytes,
            "other_processes_bytes" => self.other_processes_bytes,
            "num_device_alloc" => self.num_device_alloc,
            "num_device_free" => self.num_device_free,
            "step_peak_allocated_bytes" => self.step_peak_allocated_bytes,
            "step_peak_reserved_bytes" => self.step_peak_reserved_bytes,
            _ => return None,
        })
    }
}

/// One entry of the event log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the whole log since the server started the session.
    pub seq: u64,
    /// The command (step) that caused it.
    pub step: u64,
    pub action: EventAction,
    /// Block or segment address; for `oom`, the driver's free bytes.
    pub address: u64,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventAction {
    Alloc,
    Free,
    SegmentAlloc,
    SegmentFree,
    Oom,
    /// The kernel restarted: the process and its context are gone.
    Restart,
}

impl From<TraceAction> for EventAction {
    fn from(a: TraceAction) -> Self {
        match a {
            TraceAction::Alloc => EventAction::Alloc,
            TraceAction::Free => EventAction::Free,
            TraceAction::SegmentAlloc => EventAction::SegmentAlloc,
            TraceAction::SegmentFree => EventAction::SegmentFree,
            TraceAction::Oom => EventAction::Oom,
        }
    }
}
