//! The framework allocators behind one trait.
//!
//! - [`caching`]: PyTorch's CUDA caching allocator (native backend).
//! - [`uncached`]: PyTorch with `PYTORCH_NO_CUDA_MEMORY_CACHING=1`.
//! - [`bfc`]: the TensorFlow / XLA best-fit-with-coalescing allocator, which
//!   JAX uses too (with preallocation).
//!
//! They are pure bookkeeping of address ranges inside segments. They ask a
//! [`Device`] for whole segments and never touch data. `caching` and `bfc`
//! share one block arena (split, coalesce, release, views, invariants) and
//! keep only their policy.

mod arena;
pub mod bfc;
pub mod caching;
pub mod expandable;
pub mod private_pools;
pub mod roundup;
pub mod uncached;

use crate::device::Device;
use serde::{Deserialize, Serialize};
#[cfg(debug_assertions)]
use vramlab_core::error::Broken;
use vramlab_core::error::DeviceError;

/// Handle of a live block, valid until the block is freed.
pub type BlockId = u32;

/// One PyTorch `Stat`: current value, peak, and the sums of all increases
/// and decreases (`increase_stat` / `decrease_stat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    pub current: u64,
    pub peak: u64,
    pub allocated: u64,
    pub freed: u64,
}

impl Stat {
    #[inline]
    pub fn increase(&mut self, n: u64) {
        self.current += n;
        self.peak = self.peak.max(self.current);
        self.allocated += n;
    }

    #[inline]
    pub fn decrease(&mut self, n: u64) {
        debug_assert!(self.current >= n, "stat would go negative");
        self.current -= n;
        self.freed += n;
    }

    /// Applies a signed net change, as `free_block` does for inactive splits.
    #[inline]
    pub fn apply(&mut self, delta: i64) {
        match delta.cmp(&0) {
            std::cmp::Ordering::Greater => self.increase(delta as u64),
            std::cmp::Ordering::Less => self.decrease(delta.unsigned_abs()),
            std::cmp::Ordering::Equal => {}
        }
    }

    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// The counters every allocator keeps, under PyTorch's names. For the BFC
/// allocator `allocated_bytes` is `bytes_in_use` and `reserved_bytes` is
/// `pool_bytes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    pub allocated_bytes: Stat,
    pub reserved_bytes: Stat,
    pub active_bytes: Stat,
    pub requested_bytes: Stat,
    pub inactive_split_bytes: Stat,
    /// Count of allocated blocks (`allocation.all`).
    pub allocation: Stat,
    /// Count of segments (`segment.all`).
    pub segment: Stat,
    pub active: Stat,
    pub inactive_split: Stat,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
}

impl AllocatorStats {
    pub fn reset_peaks(&mut self) {
        for stat in [
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.requested_bytes,
            &mut self.inactive_split_bytes,
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
        ] {
            stat.reset_peak();
        }
    }
}

/// State of a block in the segment map (PyTorch snapshot names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    ActiveAllocated,
    Inactive,
}

vramlab_core::read_by_name!(BlockState {
    ActiveAllocated = "active_allocated",
    Inactive = "inactive",
});

/// One block of a segment, as `torch.cuda.memory._snapshot()` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockView {
    /// Handle of an allocated block; `None` for free space.
    pub id: Option<BlockId>,
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
}

/// Which pool a segment belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// PyTorch's small pool (requests up to 1 MiB, 2 MiB segments).
    Small,
    /// PyTorch's large pool.
    Large,
    /// A BFC region (TensorFlow, XLA).
    Region,
    /// PyTorch without caching: one segment per tensor.
    Uncached,
}

vramlab_core::read_by_name!(PoolKind {
    Small = "small",
    Large = "large",
    Region = "region",
    Uncached = "uncached",
});

impl PoolKind {
    pub(crate) const COUNT: usize = 4;

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
            PoolKind::Region => "region",
            PoolKind::Uncached => "uncached",
        }
    }
}

/// One segment (PyTorch) or region (BFC) with its blocks in address order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentView {
    pub address: u64,
    pub total_size: u64,
    pub pool: PoolKind,
    /// The CUDA stream it serves (0: the default stream).
    pub stream: u64,
    pub blocks: Vec<BlockView>,
}

/// What happened inside an allocator, in order (PyTorch trace actions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceAction {
    Alloc,
    Free,
    SegmentAlloc,
    SegmentFree,
    Oom,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    pub action: TraceAction,
    /// Block or segment address; for `Oom`, the free bytes the driver reported.
    pub address: u64,
    /// Block size (`Alloc` records the caller's size, as PyTorch does),
    /// segment size, or for `Oom` the rounded request.
    pub size: u64,
    pub block: Option<BlockId>,
}

/// The facts at the moment an allocation failed, from which each framework
/// words its own error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    /// What the caller asked for.
    pub requested: u64,
    /// The request after the allocator's rounding.
    pub rounded: u64,
    /// What the allocator tried to get from the driver (PyTorch prints this).
    pub alloc_size: u64,
    pub device_free: u64,
    pub device_total: u64,
    /// nvidia-smi's view of this process.
    pub process_used: u64,
    pub other_processes: u64,
    pub allocated: u64,
    pub reserved: u64,
    /// PyTorch's `set_per_process_memory_fraction` maximum, when set.
    pub allowed: Option<u64>,
    /// The BFC allocator's memory limit.
    pub memory_limit: Option<u64>,
}

impl OutOfMemory {
    /// The facts now, for a request `(requested, rounded, alloc_size)`.
    pub fn at(
        device: &dyn Device,
        (requested, rounded, alloc_size): (u64, u64, u64),
        stats: &AllocatorStats,
        allowed: Option<u64>,
        memory_limit: Option<u64>,
    ) -> Box<Self> {
        let (device_free, device_total) = device.mem_get_info();
        Box::new(OutOfMemory {
            requested,
            rounded,
            alloc_size,
            device_free,
            device_total,
            process_used: device.process_used_bytes(),
            other_processes: device.other_processes_bytes(),
            allocated: stats.allocated_bytes.current,
            reserved: stats.reserved_bytes.current,
            allowed,
            memory_limit,
        })
    }
}

/// Why an allocation failed: the framework's out-of-memory, or the driver
/// failing in another way (which no framework turns into an OOM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllocError {
    OutOfMemory(Box<OutOfMemory>),
    Driver(String),
}

impl AllocError {
    /// The out-of-memory facts, when that is what it is.
    pub fn out_of_memory(&self) -> Option<&OutOfMemory> {
        match self {
            AllocError::OutOfMemory(oom) => Some(oom),
            AllocError::Driver(_) => None,
        }
    }
}

/// A recorded allocator state that does not match this allocator's: a
/// block where no free space is, a segment that is not one whole free
/// block. Rebuilding a snapshot's state refuses it with these words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch(pub String);

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Asks the driver for a segment: `Ok(None)` when it has not enough free
/// memory (the allocator may release cached memory and retry), `Err` for
/// any other driver failure.
pub(crate) fn device_malloc(
    device: &mut dyn Device,
    bytes: u64,
) -> Result<Option<u64>, AllocError> {
    match device.malloc(bytes) {
        Ok(address) => Ok(Some(address)),
        Err(DeviceError::OutOfMemory) => Ok(None),
        Err(DeviceError::Driver(message)) => Err(AllocError::Driver(message)),
    }
}

/// An allocator that keeps blocks inside device segments.
pub trait Allocator: Send {
    /// A request for `bytes`. `Ok(None)` for a zero-byte request, which
    /// touches nothing (both frameworks return a null pointer).
    fn malloc(
        &mut self,
        device: &mut dyn Device,
        bytes: u64,
    ) -> Result<Option<BlockId>, AllocError>;

    /// Returns a block: it goes back to the allocator's cache at once.
    fn free(&mut self, device: &mut dyn Device, block: BlockId);

    /// `torch.cuda.empty_cache()`: returns every whole free segment to the
    /// driver. `None` when the framework has no such call.
    fn empty_cache(&mut self, device: &mut dyn Device) -> Option<u64>;

    fn stats(&self) -> &AllocatorStats;

    /// `reset_peak_memory_stats` / `reset_memory_stats`.
    fn reset_peak_stats(&mut self);

    /// Size of a live block (after rounding).
    fn block_size(&self, block: BlockId) -> u64;

    /// Where a live block starts on the device.
    #[cfg(feature = "device-values")]
    fn block_address(&self, block: BlockId) -> u64;

    /// Every segment with its blocks, segments by address.
    fn segments(&self) -> Vec<SegmentView>;

    /// Moves the events recorded since the last call into `out`.
    fn drain_trace(&mut self, out: &mut Vec<TraceEvent>);

    /// Turns event recording on or off (benchmarks switch it off).
    fn set_tracing(&mut self, on: bool);

    /// A copy of this allocator in its present state, where it can make
    /// one (a plan replays many runs from the same loaded model).
    fn boxed_clone(&self) -> Option<Box<dyn Allocator>> {
        None
    }

    #[cfg(debug_assertions)]
    /// Checks the allocator's invariants against its own state and the
    /// device; `Err` names the first broken one.
    fn check_invariants(&self, device: &dyn Device) -> Result<(), Broken>;
}

/// Records trace events when switched on.
#[derive(Clone, Debug)]
pub(crate) struct Trace {
    pub on: bool,
    pub events: Vec<TraceEvent>,
}

impl Default for Trace {
    fn default() -> Self {
        Self {
            on: true,
            events: Vec::new(),
        }
    }
}

impl Trace {
    #[inline]
    pub fn record(&mut self, action: TraceAction, address: u64, size: u64, block: Option<BlockId>) {
        if self.on {
            self.events.push(TraceEvent {
                action,
                address,
                size,
                block,
            });
        }
    }
}

/// A slab of nodes addressed by [`BlockId`], reusing freed slots.
#[derive(Debug, Clone)]
pub(crate) struct Slab<T> {
    nodes: Vec<Option<T>>,
    vacant: Vec<BlockId>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            vacant: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    pub fn insert(&mut self, value: T) -> BlockId {
        if let Some(id) = self.vacant.pop() {
            self.nodes[id as usize] = Some(value);
            id
        } else {
            self.nodes.push(Some(value));
            (self.nodes.len() - 1) as BlockId
        }
    }

    pub fn remove(&mut self, id: BlockId) -> T {
        let value = self.nodes[id as usize].take().expect("slab slot is empty");
        self.vacant.push(id);
        value
    }

    #[inline]
    pub fn get(&self, id: BlockId) -> &T {
        self.nodes[id as usize]
            .as_ref()
            .expect("slab slot is empty")
    }

    #[inline]
    pub fn get_mut(&mut self, id: BlockId) -> &mut T {
        self.nodes[id as usize]
            .as_mut()
            .expect("slab slot is empty")
    }

    pub fn iter(&self) -> impl Iterator<Item = (BlockId, &T)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i as BlockId, n)))
    }
}

/// Sentinel for "no neighbour" in intrusive block lists.
pub(crate) const NIL: BlockId = BlockId::MAX;
