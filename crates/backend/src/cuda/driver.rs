//! The CUDA driver through cudarc: a [`Device`] whose segments are
//! `cuMemAlloc` / `cuMemFree` on an NVIDIA GPU.
//!
//! Each kernel gets a CUDA context of its own (`cuCtxCreate`), as each Python
//! process does; restarting the kernel destroys it, so everything, the
//! context included, goes back to the driver. The context's cost is measured
//! when it is created (the driver's free memory before and after).
//!
//! The shared allocators decide when to ask for and give back segments, as
//! they do on the simulated GPU. A step's values are copied to the blocks
//! the allocator placed them in and read back from them
//! ([`DeviceMemory`]: `cuMemcpyHtoD` / `cuMemcpyDtoH`), so the loss the
//! engine reports on a GPU is the one read from the GPU.

use super::kernels::Kernels;
use super::vmm::Vmm;
use super::{Probe, StandIn};
use cudarc::driver::{result, sys, CudaContext};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use vramlab_shared::compute::{DeviceCompute, GemmEx, Launch};
use vramlab_shared::device::{Device, DeviceInfo, DeviceKind, DeviceMemory};
use vramlab_shared::framework::Settings;
use vramlab_shared::DeviceError;

/// Looks for GPU `ordinal` without ever panicking: first whether the
/// driver library can be loaded at all, then whether there is such a GPU,
/// then a context on it.
pub fn probe(ordinal: usize) -> Result<Probe, String> {
    // SAFETY: only tries to dlopen the driver library.
    if !unsafe { sys::is_culib_present() } {
        return Err("the CUDA driver library (libcuda.so) is not installed".into());
    }
    let count = CudaContext::device_count().map_err(|e| format!("CUDA driver: {e:?}"))?;
    if count < 1 {
        return Err("the CUDA driver sees no GPU".into());
    }
    if ordinal >= count as usize {
        return Err(format!(
            "the CUDA driver sees {count} GPU(s), numbered from 0: there is no GPU {ordinal}"
        ));
    }
    let ctx =
        CudaContext::new(ordinal).map_err(|e| format!("cannot create a CUDA context: {e:?}"))?;
    let name = ctx.name().map_err(|e| format!("{e:?}"))?;
    let total = ctx.total_mem().map_err(|e| format!("{e:?}"))? as u64;
    let (major, minor) = ctx.compute_capability().map_err(|e| format!("{e:?}"))?;
    Ok(Probe {
        name,
        total_bytes: total,
        compute_capability: (major as u32, minor as u32),
    })
}

pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    info: DeviceInfo,
    context_bytes: u64,
    segments: BTreeMap<u64, u64>,
    segment_bytes: u64,
    /// The last free bytes the driver reported, for when a query fails.
    last_free: AtomicU64,
    /// The smaller GPU this one stands in for, if the settings ask for one.
    stand_in: Option<StandIn>,
    /// The step's kernels and cuBLAS in this context, loaded at the first
    /// step that asks (or why they could not be).
    kernels: Option<Result<Kernels, String>>,
    /// Expandable segments' ranges and pages.
    vmm: Vmm,
}

impl Drop for CudaDevice {
    /// The kernels and the cuBLAS handle go first, then the expandable
    /// segments' pages and ranges, in their context.
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            self.kernels = None;
            self.vmm.release_all();
        }
    }
}

impl CudaDevice {
    /// A new context on GPU `ordinal`, with its cost measured; standing in
    /// for the settings' GPU where that one is smaller.
    pub fn start(ordinal: usize, settings: &Settings) -> Result<Self, String> {
        let ctx = CudaContext::new_non_primary(ordinal, 0)
            .map_err(|e| format!("cannot create a CUDA context: {e:?}"))?;
        let (free, total) = ctx.mem_get_info().map_err(|e| format!("{e:?}"))?;
        // What one more context costs: create one, read the driver's free
        // memory, destroy it. (Free memory is device-wide, so it cannot be
        // read before this process has a context of its own.)
        let context_bytes = {
            let probe = CudaContext::new_non_primary(ordinal, 0)
                .map_err(|e| format!("cannot create a CUDA context: {e:?}"))?;
            let (with_probe, _) = probe.mem_get_info().map_err(|e| format!("{e:?}"))?;
            drop(probe);
            ctx.bind_to_thread().map_err(|e| format!("{e:?}"))?;
            (free as u64).saturating_sub(with_probe as u64)
        };
        let (major, minor) = ctx.compute_capability().map_err(|e| format!("{e:?}"))?;
        let name = ctx.name().map_err(|e| format!("{e:?}"))?;
        let stand_in = StandIn::of(settings, total as u64);
        let info = DeviceInfo {
            kind: DeviceKind::Cuda,
            name: match stand_in {
                Some(s) => format!(
                    "{name}, standing in for a {} GPU",
                    vramlab_shared::units::format_size(s.total_bytes)
                ),
                None => name,
            },
            total_bytes: stand_in.map_or(total as u64, |s| s.total_bytes),
            compute_capability: stand_in
                .map_or((major as u32, minor as u32), |s| s.compute_capability),
        };
        Ok(Self {
            ctx,
            info,
            context_bytes,
            segments: BTreeMap::new(),
            segment_bytes: 0,
            last_free: AtomicU64::new(free as u64),
            stand_in,
            kernels: None,
            vmm: Vmm::new(ordinal),
        })
    }
}

impl Device for CudaDevice {
    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        if self
            .stand_in
            .is_some_and(|s| bytes > s.free_bytes(self.segment_bytes))
        {
            return Err(DeviceError::OutOfMemory);
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| DeviceError::Driver(format!("cannot bind the CUDA context: {e:?}")))?;
        // SAFETY: a plain device allocation in this kernel's context; freed
        // in `free` or when the context is destroyed.
        match unsafe { result::malloc_sync(bytes as usize) } {
            Ok(ptr) => {
                self.segments.insert(ptr, bytes);
                self.segment_bytes += bytes;
                Ok(ptr)
            }
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(DeviceError::OutOfMemory)
            }
            Err(e) => {
                tracing::warn!(error = ?e, bytes, "cuMemAlloc failed");
                Err(DeviceError::Driver(format!(
                    "cuMemAlloc of {bytes} bytes failed: {e:?}"
                )))
            }
        }
    }

    /// `cuMemFree`; the segment's size is the one stored when it was made.
    fn free(&mut self, address: u64, bytes: u64) {
        let Some(size) = self.segments.remove(&address) else {
            tracing::error!(address, "cuMemFree of an unknown segment ignored");
            return;
        };
        if size != bytes {
            tracing::error!(
                address,
                size,
                bytes,
                "cuMemFree: the segment's size was misstated"
            );
        }
        self.segment_bytes -= size;
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the pointer came from `malloc_sync` in this context and
            // is freed once (it was just removed from the live set).
            if let Err(e) = unsafe { result::free_sync(address) } {
                tracing::error!(error = ?e, address, "cuMemFree failed");
            }
        }
    }

    /// `cuMemAddressReserve` for an expandable segment.
    fn reserve(&mut self, bytes: u64, hint: u64) -> Result<u64, DeviceError> {
        self.bind()?;
        self.vmm.reserve(bytes, hint)
    }

    /// `cuMemCreate` + `cuMemMap` of one page of an expandable segment,
    /// counted as a segment's bytes (and within a stand-in's room).
    fn map(&mut self, address: u64, bytes: u64) -> Result<u64, DeviceError> {
        if self
            .stand_in
            .is_some_and(|s| bytes > s.free_bytes(self.segment_bytes))
        {
            return Err(DeviceError::OutOfMemory);
        }
        self.bind()?;
        let handle = self.vmm.map(address, bytes)?;
        self.segment_bytes += bytes;
        Ok(handle)
    }

    fn unmap(&mut self, address: u64, handle: u64, bytes: u64) {
        if self.bind().is_ok() {
            self.vmm.unmap(address, handle, bytes);
        }
        self.segment_bytes = self.segment_bytes.saturating_sub(bytes);
    }

    /// `cuMemGetInfo` (standing in for a smaller GPU: that one's total, and
    /// its free bytes where the real GPU has as many). Should the query
    /// fail, the last reading stands, not a made-up "0 free".
    fn mem_get_info(&self) -> (u64, u64) {
        let (free, total) = self.real_mem_get_info();
        match self.stand_in {
            Some(s) => (free.min(s.free_bytes(self.segment_bytes)), s.total_bytes),
            None => (free, total),
        }
    }

    fn context_bytes(&self) -> u64 {
        self.stand_in
            .map_or(self.context_bytes, |s| s.context_bytes)
    }

    fn other_processes_bytes(&self) -> u64 {
        if let Some(s) = self.stand_in {
            return s.other_processes_bytes;
        }
        let (free, total) = self.real_mem_get_info();
        total.saturating_sub(free + self.context_bytes + self.segment_bytes)
    }

    fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn memory(&mut self) -> Option<&mut dyn DeviceMemory> {
        Some(self)
    }

    fn holds_values(&self) -> bool {
        true
    }
}

impl CudaDevice {
    /// The driver's own `cuMemGetInfo`.
    fn real_mem_get_info(&self) -> (u64, u64) {
        match self.ctx.mem_get_info() {
            Ok((free, total)) => {
                self.last_free.store(free as u64, Ordering::Relaxed);
                (free as u64, total as u64)
            }
            Err(e) => {
                tracing::warn!(error = ?e, "cuMemGetInfo failed; using the last reading");
                (
                    self.last_free.load(Ordering::Relaxed),
                    self.info.total_bytes,
                )
            }
        }
    }

    fn bind(&self) -> Result<(), DeviceError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| DeviceError::Driver(format!("cannot bind the CUDA context: {e:?}")))
    }

    /// `len` bytes at `at` lie inside one live segment of this context
    /// (or in mapped pages of an expandable one), and the context is
    /// current.
    fn reach(&self, at: u64, len: usize) -> Result<(), DeviceError> {
        let inside = (self.segments.range(..=at).next_back()).is_some_and(|(&base, &size)| {
            at.checked_add(len as u64)
                .is_some_and(|end| end <= base + size)
        }) || self.vmm.covers(at, len as u64);
        if !inside {
            return Err(DeviceError::Driver(format!(
                "{len} bytes at {at:#x} lie outside this process's segments"
            )));
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| DeviceError::Driver(format!("cannot bind the CUDA context: {e:?}")))
    }
}

impl DeviceMemory for CudaDevice {
    fn write(&mut self, address: u64, bytes: &[u8]) -> Result<(), DeviceError> {
        self.reach(address, bytes.len())?;
        // SAFETY: the span lies inside a live segment of this context
        // (checked above); the copy is synchronous, so `bytes` outlives it.
        unsafe { result::memcpy_htod_sync(address, bytes) }
            .map_err(|e| DeviceError::Driver(format!("cuMemcpyHtoD failed: {e:?}")))
    }

    fn read(&mut self, address: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        self.reach(address, out.len())?;
        // SAFETY: as in `write`; `out` is written before the call returns.
        unsafe { result::memcpy_dtoh_sync(out, address) }
            .map_err(|e| DeviceError::Driver(format!("cuMemcpyDtoH failed: {e:?}")))
    }

    /// The kernels, loaded into this context at the first call; what
    /// loading them takes from the GPU counts as the context's growth (as
    /// PyTorch's context grows when cuBLAS first runs).
    fn compute(&mut self) -> Option<&mut dyn DeviceCompute> {
        if self.kernels.is_none() {
            self.ctx.bind_to_thread().ok()?;
            let before = self.real_mem_get_info().0;
            let (major, minor) = self.ctx.compute_capability().ok()?;
            let loaded = Kernels::load((major as u32, minor as u32));
            match &loaded {
                Ok(_) => {
                    let after = self.real_mem_get_info().0;
                    self.context_bytes += before.saturating_sub(after);
                    tracing::info!(
                        grew = before.saturating_sub(after),
                        "the step's kernels loaded"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the step's kernels are not available: values are computed on the CPU and copied")
                }
            }
            self.kernels = Some(loaded);
        }
        match &self.kernels {
            Some(Ok(_)) => Some(self),
            _ => None,
        }
    }
}

impl DeviceCompute for CudaDevice {
    fn launch(&mut self, launch: &Launch) -> Result<(), DeviceError> {
        self.kernels_bound()?.launch(launch)
    }

    fn gemm(&mut self, gemm: &GemmEx) -> Result<(), DeviceError> {
        self.kernels_bound()?.gemm(gemm)
    }
}

impl CudaDevice {
    /// The loaded kernels, their context current.
    fn kernels_bound(&self) -> Result<&Kernels, DeviceError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| DeviceError::Driver(format!("cannot bind the CUDA context: {e:?}")))?;
        match &self.kernels {
            Some(Ok(k)) => Ok(k),
            _ => Err(DeviceError::Driver(
                "the step's kernels are not loaded".into(),
            )),
        }
    }
}
