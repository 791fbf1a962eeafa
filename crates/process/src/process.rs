//! One Python process (what a notebook calls its kernel): its device, its framework's
//! allocator, its object world and its event log. Every tensor the engine
//! creates or frees goes through here, so the events, the per-category
//! totals and the per-command peaks are always right.

use crate::runtime::{Holder, ObjId, ObjectKind, Released, Runtime, Tensor};
use crate::stats::{Event, EventAction, Stats};
use std::collections::{BTreeMap, VecDeque};
#[cfg(debug_assertions)]
use vramlab_core::error::Broken;
use vramlab_core::types::{Category, Dtype};
use vramlab_device::alloc::uncached::UncachedAllocator;
use vramlab_device::alloc::{AllocError, Allocator, BlockId, TraceAction, TraceEvent};
use vramlab_device::device::{Device, SimDevice, SimDeviceConfig};

/// How many events the log keeps (like PyTorch's `max_entries`).
pub const DEFAULT_EVENT_CAPACITY: usize = 10_000;

/// A failed allocation: the allocator's facts and the tensor asked for.
#[derive(Clone, Debug)]
pub struct AllocFailure {
    pub error: AllocError,
    pub shape: Vec<u64>,
    pub dtype: Dtype,
}

pub struct Process {
    pub device: Box<dyn Device>,
    pub allocator: Box<dyn Allocator>,
    pub runtime: Runtime,
    /// Index of the command being executed.
    pub step: u64,
    events: VecDeque<Event>,
    event_capacity: usize,
    next_seq: u64,
    trace: Vec<TraceEvent>,
    /// Live block bytes by category.
    categories: [u64; Category::ALL.len()],
    /// Peaks since the current command began.
    command_peak_allocated: u64,
    command_peak_reserved: u64,
    /// Peaks since [`Process::begin_window`] (one training step).
    window_peak_allocated: u64,
    window_peak_reserved: u64,
    /// Peaks since the last [`Process::take_sample_peaks`] (live streaming).
    sample_peak_allocated: u64,
    sample_peak_reserved: u64,
    /// Non-tensor objects destroyed since the engine last looked.
    dead_instances: Vec<ObjId>,
    /// Bytes the first GPU kernel allocates before its output and keeps for
    /// the process's life (TensorFlow's Eigen scratch buffer); 0 once done,
    /// or for frameworks without one.
    pub first_kernel_scratch: u64,
}

fn category_index(c: Category) -> usize {
    Category::ALL
        .iter()
        .position(|&x| x == c)
        .expect("every category is listed")
}

impl Process {
    pub fn new(device: Box<dyn Device>, allocator: Box<dyn Allocator>) -> Self {
        Self {
            device,
            allocator,
            runtime: Runtime::new(),
            step: 0,
            events: VecDeque::new(),
            event_capacity: DEFAULT_EVENT_CAPACITY,
            next_seq: 0,
            trace: Vec::new(),
            categories: [0; Category::ALL.len()],
            command_peak_allocated: 0,
            command_peak_reserved: 0,
            window_peak_allocated: 0,
            window_peak_reserved: 0,
            sample_peak_allocated: 0,
            sample_peak_reserved: 0,
            dead_instances: Vec::new(),
            first_kernel_scratch: 0,
        }
    }

    /// The process exits: its allocator and device are dropped (on a real
    /// GPU the context is destroyed, and the driver takes back every
    /// segment) before anything else starts; until [`Process::start`] it
    /// holds an empty device. The events continue.
    pub fn exit(&mut self) {
        self.allocator = Box::new(UncachedAllocator::new());
        self.device = Box::new(SimDevice::new(SimDeviceConfig {
            total_bytes: 0,
            context_bytes: 0,
            ..SimDeviceConfig::default()
        }));
        self.runtime.clear();
        self.categories = [0; Category::ALL.len()];
        self.dead_instances.clear();
        self.begin_command(self.step);
        self.push_event(EventAction::Restart, 0, 0, None);
    }

    /// A new process on a new device, after [`Process::exit`].
    pub fn start(&mut self, device: Box<dyn Device>, allocator: Box<dyn Allocator>) {
        self.allocator = allocator;
        self.device = device;
    }

    /// Starts the window for per-command peaks.
    pub fn begin_command(&mut self, step: u64) {
        self.step = step;
        self.begin_window();
        self.command_peak_allocated = self.window_peak_allocated;
        self.command_peak_reserved = self.window_peak_reserved;
    }

    /// Starts a window for peaks inside a command (one training step).
    pub fn begin_window(&mut self) {
        let s = self.allocator.stats();
        self.window_peak_allocated = s.allocated_bytes.current;
        self.window_peak_reserved = s.reserved_bytes.current;
    }

    /// The peaks (allocated, reserved) since the last call, then starts a
    /// new sample window at the current values: a live view that samples
    /// now and then still sees every peak.
    pub fn take_sample_peaks(&mut self) -> (u64, u64) {
        let s = self.allocator.stats();
        let (allocated, reserved) = (s.allocated_bytes.current, s.reserved_bytes.current);
        let peaks = (
            self.sample_peak_allocated.max(allocated),
            self.sample_peak_reserved.max(reserved),
        );
        self.sample_peak_allocated = allocated;
        self.sample_peak_reserved = reserved;
        peaks
    }

    /// Peak allocated since the command began.
    pub fn command_peak_allocated(&self) -> u64 {
        self.command_peak_allocated
    }

    /// Peak allocated since the window began.
    pub fn window_peak_allocated(&self) -> u64 {
        self.window_peak_allocated
    }

    /// Peak reserved since the window began.
    pub fn window_peak_reserved(&self) -> u64 {
        self.window_peak_reserved
    }

    pub fn set_event_capacity(&mut self, capacity: usize) {
        self.event_capacity = capacity;
        while self.events.len() > capacity {
            self.events.pop_front();
        }
    }

    /// Allocates a tensor held by one local reference (after the scratch
    /// buffer, if this is the process's first GPU kernel).
    pub fn alloc_tensor(
        &mut self,
        label: &str,
        bytes: u64,
        shape: Vec<u64>,
        dtype: Dtype,
        category: Category,
    ) -> Result<ObjId, AllocFailure> {
        if self.first_kernel_scratch > 0 {
            self.init_scratch_buffer()?;
        }
        self.malloc_tensor(label, bytes, shape, dtype, category)
    }

    /// TensorFlow's `BaseGPUDevice::InitScratchBuffers`: the first op
    /// allocates `Eigen::kGpuScratchSize + sizeof(unsigned int)` bytes from
    /// the device's allocator, which the device holds until it is destroyed.
    fn init_scratch_buffer(&mut self) -> Result<(), AllocFailure> {
        let bytes = self.first_kernel_scratch;
        let label = "Eigen scratch buffer (GPU device)";
        let id =
            self.malloc_tensor(label, bytes, vec![bytes], Dtype::Uint8, Category::Workspace)?;
        self.first_kernel_scratch = 0;
        self.runtime.hold(Holder::GpuDevice, id);
        self.drop_local(id);
        Ok(())
    }

    fn malloc_tensor(
        &mut self,
        label: &str,
        bytes: u64,
        shape: Vec<u64>,
        dtype: Dtype,
        category: Category,
    ) -> Result<ObjId, AllocFailure> {
        let result = self.allocator.malloc(self.device.as_mut(), bytes);
        self.drain_trace(Some(label));
        let block = match result {
            Ok(block) => block,
            Err(error) => {
                return Err(AllocFailure {
                    error,
                    shape,
                    dtype,
                })
            }
        };
        if let Some(b) = block {
            self.categories[category_index(category)] += self.allocator.block_size(b);
            let s = self.allocator.stats();
            let (allocated, reserved) = (s.allocated_bytes.current, s.reserved_bytes.current);
            self.window_peak_allocated = self.window_peak_allocated.max(allocated);
            self.window_peak_reserved = self.window_peak_reserved.max(reserved);
            self.command_peak_allocated = self.command_peak_allocated.max(allocated);
            self.command_peak_reserved = self.command_peak_reserved.max(reserved);
            self.sample_peak_allocated = self.sample_peak_allocated.max(allocated);
            self.sample_peak_reserved = self.sample_peak_reserved.max(reserved);
        }
        Ok(self.runtime.new_local(
            ObjectKind::Tensor(Tensor {
                block,
                bytes,
                shape,
                dtype,
                category,
            }),
            label,
        ))
    }

    /// Allocates a tensor of `shape` and `dtype`.
    pub fn alloc_shaped(
        &mut self,
        label: &str,
        shape: &[u64],
        dtype: Dtype,
        category: Category,
    ) -> Result<ObjId, AllocFailure> {
        let bytes = shape.iter().product::<u64>() * dtype.size_bytes();
        self.alloc_tensor(label, bytes, shape.to_vec(), dtype, category)
    }

    /// Frees the blocks of tensors that died, in order; returns the bytes.
    pub fn release(&mut self, released: &[Released]) -> u64 {
        let mut freed = 0;
        for r in released {
            match &r.kind {
                ObjectKind::Tensor(t) => {
                    if let Some(block) = t.block {
                        freed += self.free_block(block, t.category, &r.label);
                    }
                }
                ObjectKind::Instance(_) => self.dead_instances.push(r.id),
                ObjectKind::List => {}
            }
        }
        freed
    }

    fn free_block(&mut self, block: BlockId, category: Category, label: &str) -> u64 {
        let size = self.allocator.block_size(block);
        self.categories[category_index(category)] -= size;
        self.allocator.free(self.device.as_mut(), block);
        self.drain_trace(Some(label));
        size
    }

    /// Drops a local reference; returns the bytes freed.
    pub fn drop_local(&mut self, id: ObjId) -> u64 {
        let released = self.runtime.drop_local(id);
        self.release(&released)
    }

    /// `name = obj`, then drops the local reference to `obj`.
    pub fn bind_local(&mut self, name: &str, id: ObjId) -> u64 {
        let released = self.runtime.bind(name, id);
        self.release(&released) + self.drop_local(id)
    }

    /// `owner.attr = target`, then drops the local reference to `target`.
    pub fn attach_local(&mut self, owner: ObjId, target: ObjId) {
        self.runtime.add_ref(owner, target);
        self.runtime.drop_local(target);
    }

    /// Removes `owner`'s reference to `target`; returns the bytes freed.
    pub fn detach(&mut self, owner: ObjId, target: ObjId) -> u64 {
        let released = self.runtime.remove_ref(owner, target);
        self.release(&released)
    }

    /// Drops every reference `owner` holds; returns the bytes freed.
    pub fn clear_refs(&mut self, owner: ObjId) -> u64 {
        let released = self.runtime.clear_refs(owner);
        self.release(&released)
    }

    /// Swaps two tensors' blocks (an array's new buffer takes the old
    /// one's place, which `b` then holds); `false`, changing nothing,
    /// unless both are tensors of the same bytes and category.
    pub fn swap_blocks(&mut self, a: ObjId, b: ObjId) -> bool {
        let of = |k: &Self, id| k.runtime.tensor(id).map(|t| (t.block, t.bytes, t.category));
        let (Some(x), Some(y)) = (of(self, a), of(self, b)) else {
            return false;
        };
        if (x.1, x.2) != (y.1, y.2) {
            return false;
        }
        for (id, block) in [(a, y.0), (b, x.0)] {
            if let Some(t) = self.runtime.tensor_mut(id) {
                t.block = block;
            }
        }
        true
    }

    /// Non-tensor objects destroyed since the last call.
    pub fn take_dead_instances(&mut self) -> Vec<ObjId> {
        std::mem::take(&mut self.dead_instances)
    }

    /// Where tensor `id`'s block starts on the device (none for an empty
    /// tensor, which holds no block).
    #[cfg(feature = "device-values")]
    pub fn address(&self, id: ObjId) -> Option<u64> {
        let block = self.runtime.tensor(id)?.block?;
        Some(self.allocator.block_address(block))
    }

    pub fn block_size(&self, id: ObjId) -> u64 {
        self.runtime
            .tensor(id)
            .and_then(|t| t.block)
            .map_or(0, |b| self.allocator.block_size(b))
    }

    fn drain_trace(&mut self, name: Option<&str>) {
        let mut trace = std::mem::take(&mut self.trace);
        self.allocator.drain_trace(&mut trace);
        for e in trace.drain(..) {
            let named = matches!(
                e.action,
                TraceAction::Alloc | TraceAction::Free | TraceAction::Oom
            );
            self.push_event(
                e.action.into(),
                e.address,
                e.size,
                if named { name } else { None },
            );
        }
        self.trace = trace;
    }

    /// Lets the allocator's own events (from `empty_cache`) into the log.
    pub fn drain_allocator_events(&mut self) {
        self.drain_trace(None);
    }

    fn push_event(&mut self, action: EventAction, address: u64, size: u64, name: Option<&str>) {
        if self.event_capacity == 0 {
            return;
        }
        if self.events.len() == self.event_capacity {
            self.events.pop_front();
        }
        self.events.push_back(Event {
            seq: self.next_seq,
            step: self.step,
            action,
            address,
            size,
            name: name.map(str::to_string),
        });
        self.next_seq += 1;
    }

    /// Events with `seq >= since`, oldest first.
    pub fn events_since(&self, since: u64) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(move |e| e.seq >= since)
    }

    pub fn events(&self) -> &VecDeque<Event> {
        &self.events
    }

    pub fn categories(&self) -> BTreeMap<Category, u64> {
        vramlab_core::collections::map_of(
            Category::ALL
                .iter()
                .map(|&c| (c, self.categories[category_index(c)])),
        )
    }

    pub fn stats(&self) -> Stats {
        let a = self.allocator.stats();
        let (free, total) = self.device.mem_get_info();
        Stats {
            allocated_bytes: a.allocated_bytes.current,
            reserved_bytes: a.reserved_bytes.current,
            active_bytes: a.active_bytes.current,
            requested_bytes: a.requested_bytes.current,
            inactive_split_bytes: a.inactive_split_bytes.current,
            peak_allocated_bytes: a.allocated_bytes.peak,
            peak_reserved_bytes: a.reserved_bytes.peak,
            device_used_bytes: self.device.process_used_bytes(),
            device_total_bytes: total,
            device_free_bytes: free,
            segments: a.segment.current,
            num_alloc_retries: a.num_alloc_retries,
            num_ooms: a.num_ooms,
            allocations: a.allocation.current,
            context_bytes: self.device.context_bytes(),
            other_processes_bytes: self.device.other_processes_bytes(),
            num_device_alloc: a.num_device_alloc,
            num_device_free: a.num_device_free,
            step_peak_allocated_bytes: self.command_peak_allocated,
            step_peak_reserved_bytes: self.command_peak_reserved,
            categories: self.categories(),
        }
    }

    /// Live tensors by block, for naming blocks in the map.
    pub fn owners(&self) -> std::collections::HashMap<BlockId, (&str, Category)> {
        self.runtime
            .objects()
            .values()
            .filter_map(|o| match &o.kind {
                ObjectKind::Tensor(t) => t.block.map(|b| (b, (o.label.as_str(), t.category))),
                _ => None,
            })
            .collect()
    }

    #[cfg(debug_assertions)]
    /// Every invariant of the allocator, the runtime and their agreement.
    pub fn check_invariants(&self) -> Result<(), Broken> {
        self.allocator.check_invariants(self.device.as_ref())?;
        self.runtime.check_invariants()?;
        let stats = self.stats();
        if stats.device_used_bytes != stats.context_bytes + self.device.segment_bytes() {
            return Err("device used is not context + segments".into());
        }
        if stats.device_used_bytes + stats.other_processes_bytes + stats.device_free_bytes
            != stats.device_total_bytes
        {
            return Err("used + others + free is not the device total".into());
        }
        let owners = self.owners();
        let allocated: Vec<BlockId> = self
            .allocator
            .segments()
            .iter()
            .flat_map(|s| s.blocks.iter().filter_map(|b| b.id))
            .collect();
        if owners.len() != allocated.len() || allocated.iter().any(|b| !owners.contains_key(b)) {
            return Err(Broken(format!(
                "{} live tensors own blocks but the allocator has {} allocated",
                owners.len(),
                allocated.len()
            )));
        }
        let by_category: u64 = self.categories.iter().sum();
        let owned: u64 = owners.keys().map(|&b| self.allocator.block_size(b)).sum();
        if by_category != owned {
            return Err(Broken(format!(
                "categories add up to {by_category} but live tensors hold {owned}"
            )));
        }
        Ok(())
    }
}
