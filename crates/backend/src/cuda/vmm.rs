//! Expandable segments on the driver's virtual memory management, as
//! PyTorch's `ExpandableSegment` does it: one address range reserved per
//! pool (`cuMemAddressReserve`), pages of physical memory created
//! (`cuMemCreate`) and mapped into it read-write (`cuMemMap`,
//! `cuMemSetAccess`) as the pool grows, unmapped and released
//! (`cuMemUnmap`, `cuMemRelease`) by `empty_cache`. A step's values live
//! at the range's addresses, as on a segment.

use cudarc::driver::sys;
use std::collections::BTreeMap;
use vramlab_shared::DeviceError;

/// The ranges and pages of one CUDA context; the context is current
/// whenever one of these is called.
#[derive(Debug, Default)]
pub struct Vmm {
    ordinal: i32,
    /// Reserved ranges: base -> bytes.
    reserved: BTreeMap<u64, u64>,
    /// Mapped pages: address -> (allocation handle, bytes).
    mapped: BTreeMap<u64, (u64, u64)>,
}

fn check(what: &str, r: sys::CUresult) -> Result<(), DeviceError> {
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory),
        other => Err(DeviceError::Driver(format!("{what} failed: {other:?}"))),
    }
}

impl Vmm {
    pub fn new(ordinal: usize) -> Self {
        Self {
            ordinal: ordinal as i32,
            ..Self::default()
        }
    }

    /// Physical memory on this GPU, pinned.
    fn prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct; zero is every field's "none".
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.ordinal;
        prop
    }

    /// The driver's mapping granularity (2 MiB on current GPUs).
    fn granularity(&self) -> Result<u64, DeviceError> {
        let mut g = 0usize;
        let prop = self.prop();
        let option = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: `prop` and `g` outlive the call.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(&mut g, &prop, option)
        })?;
        Ok((g as u64).max(1))
    }

    /// `cuMemAddressReserve` of `bytes` (rounded up to the granularity),
    /// at `hint` where the driver can.
    pub fn reserve(&mut self, bytes: u64, hint: u64) -> Result<u64, DeviceError> {
        let size = bytes.div_ceil(self.granularity()?) * self.granularity()?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: reserves address space only; freed in `release_all`.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut base, size as usize, 0, hint, 0)
        })?;
        self.reserved.insert(base, size);
        Ok(base)
    }

    /// `bytes` of new memory mapped read-write at `address`, inside a
    /// reserved range; returns its allocation handle.
    pub fn map(&mut self, address: u64, bytes: u64) -> Result<u64, DeviceError> {
        let inside = (self.reserved.range(..=address).next_back())
            .is_some_and(|(&base, &size)| address + bytes <= base + size);
        if !inside {
            return Err(DeviceError::Driver(format!(
                "{bytes} bytes at {address:#x} lie outside the reserved ranges"
            )));
        }
        let prop = self.prop();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` outlives the call; the handle is released in
        // `unmap` or `release_all`.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut handle, bytes as usize, &prop, 0)
        })?;
        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `address..address + bytes` is inside a range this
        // context reserved and not mapped (the allocator maps each page
        // once); `access` outlives the call.
        let mapped = unsafe {
            check(
                "cuMemMap",
                sys::cuMemMap(address, bytes as usize, 0, handle, 0),
            )
            .and_then(|()| {
                check(
                    "cuMemSetAccess",
                    sys::cuMemSetAccess(address, bytes as usize, &access, 1),
                )
            })
        };
        if let Err(e) = mapped {
            // SAFETY: unmapping what may have been mapped, then the handle.
            unsafe {
                let _ = sys::cuMemUnmap(address, bytes as usize);
                let _ = sys::cuMemRelease(handle);
            }
            return Err(e);
        }
        self.mapped.insert(address, (handle, bytes));
        Ok(handle)
    }

    /// Unmaps the page at `address` and releases its memory.
    pub fn unmap(&mut self, address: u64, handle: u64, bytes: u64) {
        if self.mapped.remove(&address) != Some((handle, bytes)) {
            tracing::error!(address, "cuMemUnmap of a page that is not mapped ignored");
            return;
        }
        // SAFETY: the page was mapped by `map` with this handle and size.
        unsafe {
            if let Err(e) = check("cuMemUnmap", sys::cuMemUnmap(address, bytes as usize)) {
                tracing::error!(error = %e, address, "cuMemUnmap failed");
            }
            let _ = sys::cuMemRelease(handle);
        }
    }

    /// Whether `len` bytes at `at` lie in pages mapped one after another.
    pub fn covers(&self, at: u64, len: u64) -> bool {
        let Some((&first, &(_, bytes))) = self.mapped.range(..=at).next_back() else {
            return false;
        };
        let (end, mut reached) = (at.saturating_add(len), first + bytes);
        while reached < end {
            match self.mapped.get(&reached) {
                Some(&(_, bytes)) => reached += bytes,
                None => return false,
            }
        }
        true
    }

    /// Every page unmapped and released, every range freed (the context
    /// current).
    pub fn release_all(&mut self) {
        for (address, (handle, bytes)) in std::mem::take(&mut self.mapped) {
            // SAFETY: mapped by `map`, released once.
            unsafe {
                let _ = sys::cuMemUnmap(address, bytes as usize);
                let _ = sys::cuMemRelease(handle);
            }
        }
        for (base, size) in std::mem::take(&mut self.reserved) {
            // SAFETY: reserved by `reserve`, freed once.
            let _ = unsafe { sys::cuMemAddressFree(base, size as usize) };
        }
    }
}
