//! PyTorch with `PYTORCH_NO_CUDA_MEMORY_CACHING=1`: every tensor is its own
//! `cudaMalloc` of exactly the requested bytes and `cudaFree` on release
//! (`uncached_allocate` / `uncached_delete` in `CUDACachingAllocator.cpp`).
//!
//! That path bypasses `DeviceStats` entirely, so `memory_allocated()` and
//! `memory_reserved()` stay at zero while nvidia-smi shows every byte: the
//! stats here stay at zero too, and the device numbers tell the truth.

use super::{
    device_malloc, AllocError, Allocator, AllocatorStats, BlockId, BlockState, BlockView,
    OutOfMemory, PoolKind, SegmentView, Slab, Trace, TraceAction, TraceEvent,
};
use crate::device::Device;
#[cfg(debug_assertions)]
use vramlab_core::error::Broken;

#[derive(Debug, Default)]
pub struct UncachedAllocator {
    blocks: Slab<(u64, u64)>,
    stats: AllocatorStats,
    trace: Trace,
}

impl UncachedAllocator {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Allocator for UncachedAllocator {
    fn malloc(
        &mut self,
        device: &mut dyn Device,
        bytes: u64,
    ) -> Result<Option<BlockId>, AllocError> {
        if bytes == 0 {
            return Ok(None);
        }
        let Some(address) = device_malloc(device, bytes)? else {
            // No stats to report: this path bypasses `DeviceStats`.
            let oom = OutOfMemory::at(device, (bytes, bytes, bytes), &self.stats, None, None);
            self.trace
                .record(TraceAction::Oom, oom.device_free, bytes, None);
            return Err(AllocError::OutOfMemory(oom));
        };
        let id = self.blocks.insert((address, bytes));
        self.trace
            .record(TraceAction::SegmentAlloc, address, bytes, None);
        self.trace
            .record(TraceAction::Alloc, address, bytes, Some(id));
        Ok(Some(id))
    }

    fn free(&mut self, device: &mut dyn Device, block: BlockId) {
        let (address, size) = self.blocks.remove(block);
        self.trace
            .record(TraceAction::Free, address, size, Some(block));
        self.trace
            .record(TraceAction::SegmentFree, address, size, None);
        device.free(address, size);
    }

    fn empty_cache(&mut self, _device: &mut dyn Device) -> Option<u64> {
        // Nothing is cached: the call exists and releases nothing.
        Some(0)
    }

    fn stats(&self) -> &AllocatorStats {
        &self.stats
    }

    fn reset_peak_stats(&mut self) {}

    fn block_size(&self, block: BlockId) -> u64 {
        self.blocks.get(block).1
    }

    #[cfg(feature = "device-values")]
    fn block_address(&self, block: BlockId) -> u64 {
        self.blocks.get(block).0
    }

    fn segments(&self) -> Vec<SegmentView> {
        let mut segments: Vec<SegmentView> = self
            .blocks
            .iter()
            .map(|(id, &(address, size))| SegmentView {
                address,
                total_size: size,
                pool: PoolKind::Uncached,
                stream: 0,
                blocks: vec![BlockView {
                    id: Some(id),
                    address,
                    size,
                    requested_size: size,
                    state: BlockState::ActiveAllocated,
                }],
            })
            .collect();
        vramlab_core::collections::sort_by_u64(&mut segments, |s| s.address);
        segments
    }

    fn drain_trace(&mut self, out: &mut Vec<TraceEvent>) {
        out.append(&mut self.trace.events);
    }

    fn set_tracing(&mut self, on: bool) {
        self.trace.on = on;
    }

    #[cfg(debug_assertions)]
    fn check_invariants(&self, device: &dyn Device) -> Result<(), Broken> {
        let live: u64 = self.blocks.iter().map(|(_, &(_, s))| s).sum();
        if live != device.segment_bytes() {
            return Err(Broken(format!(
                "live allocations add up to {live} but the device holds {}",
                device.segment_bytes()
            )));
        }
        if self.stats != AllocatorStats::default() {
            return Err("the uncached path must not touch PyTorch's stats".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{SimDevice, SimDeviceConfig};
    use vramlab_core::units::MIB;

    #[test]
    fn every_tensor_is_a_device_allocation_and_stats_stay_zero() {
        let mut dev = SimDevice::new(SimDeviceConfig::default());
        let mut a = UncachedAllocator::new();
        let x = a.malloc(&mut dev, 1000).unwrap().unwrap();
        assert_eq!(dev.segment_bytes(), 1000);
        assert_eq!(a.stats().allocated_bytes.current, 0);
        a.free(&mut dev, x);
        assert_eq!(dev.segment_bytes(), 0);
        let _ = a.malloc(&mut dev, 3 * MIB).unwrap();
        a.check_invariants(&dev).unwrap();
    }
}
