//! The allocator a replay runs on, by the recording's settings.

use vramlab_device::alloc::caching::CachingAllocator;
use vramlab_device::alloc::expandable::ExpandableAllocator;
use vramlab_device::alloc::{AllocError, Allocator, BlockId};
use vramlab_device::device::{Device, SimDevice};
use vramlab_device::framework::{make_allocator, Settings};

pub(super) enum Process {
    /// The caching allocator: seeded exactly, per-stream pools.
    Caching(Box<CachingAllocator>),
    /// Expandable segments: each stream's pools' ranges where the
    /// recording had them.
    Expandable(Box<ExpandableAllocator>),
    /// Without caching: seeded by allocating the live blocks.
    Other(Box<dyn Allocator>),
}

impl Process {
    pub(super) fn new(settings: &Settings, device: &SimDevice) -> Self {
        let total = device.mem_get_info().1;
        if settings.no_caching {
            Process::Other(make_allocator(settings, device))
        } else if settings.expandable_segments {
            Process::Expandable(Box::new(ExpandableAllocator::new(
                settings.caching_config(),
                total,
            )))
        } else {
            Process::Caching(Box::new(CachingAllocator::new(
                settings.caching_config(),
                total,
            )))
        }
    }

    pub(super) fn allocator(&mut self) -> &mut dyn Allocator {
        match self {
            Process::Caching(a) => a.as_mut(),
            Process::Expandable(a) => a.as_mut(),
            Process::Other(a) => a.as_mut(),
        }
    }

    /// A request of `size` bytes on `stream` (one pool per stream where
    /// the allocator keeps them).
    pub(super) fn malloc_on(
        &mut self,
        device: &mut SimDevice,
        size: u64,
        stream: u64,
    ) -> Result<Option<BlockId>, AllocError> {
        match self {
            Process::Caching(a) => a.malloc_on(device, size, stream),
            Process::Expandable(a) => a.malloc_on(device, size, stream),
            Process::Other(a) => a.malloc(device, size),
        }
    }
}
