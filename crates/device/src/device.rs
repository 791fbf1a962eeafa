//! The GPU as the allocators see it: whole segments from the driver
//! (`cudaMalloc` / `cudaFree`), the driver's free/total view
//! (`cudaMemGetInfo`), and the CUDA context the process pays for.
//!
//! [`SimDevice`] is the simulated GPU. The CUDA backend in the server
//! implements the same [`Device`] trait, so both run the same allocator code.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use vramlab_core::error::DeviceError;
use vramlab_core::error::Invalid;
use vramlab_core::units::{round_up, MIB};

/// Address of the first segment on the simulated GPU. Real CUDA addresses look
/// like this too (`0x7f...`); runs are reproducible because every kernel start
/// begins here again.
pub const SIM_BASE_ADDRESS: u64 = 0x7f00_0000_0000;
/// Segment addresses on the simulated GPU are aligned like the driver's large
/// pages.
pub const SIM_SEGMENT_ALIGNMENT: u64 = 2 * MIB;
/// Default CUDA context size, assumed, not read: what a CUDA 12 context
/// with lazy module loading is reported to cost (public reports range from
/// 287 MB to 426 MiB, and it grows as cuBLAS and cuDNN load their kernels;
/// see `docs/simulator.md`).
pub const DEFAULT_CONTEXT_BYTES: u64 = 300 * MIB;
/// The default device is a real card, the one most learners have: a
/// Tesla T4 (`gpu::DEFAULT_GPU`), compute capability 7.5 ...
pub const DEFAULT_COMPUTE_CAPABILITY: (u32, u32) = (7, 5);
/// ... and the 15,104 MiB (14.75 GiB) `cudaMemGetInfo` reports as its total.
pub const DEFAULT_TOTAL_BYTES: u64 = 15_104 * MIB;
/// Process id shown in OOM messages for memory used by other processes.
pub const OTHER_PROCESS_PID: u32 = 4242;

/// Which backend a device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Simulated,
    Cuda,
}

vramlab_core::read_by_name!(DeviceKind {
    Simulated = "simulated",
    Cuda = "cuda",
});

/// What a device says about itself, for the hello message, `/healthz` and the UI.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceInfo {
    pub kind: DeviceKind,
    pub name: String,
    pub total_bytes: u64,
    pub compute_capability: (u32, u32),
}

/// Read by hand, as a hello and a snapshot are (`fields`).
impl<'de> Deserialize<'de> for DeviceInfo {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        vramlab_core::fields::read(d, |f| {
            Ok(DeviceInfo {
                kind: f.take("kind")?,
                name: f.take("name")?,
                total_bytes: f.take("total_bytes")?,
                compute_capability: f.take("compute_capability")?,
            })
        })
    }
}

/// A GPU that hands out whole segments.
pub trait Device: Send {
    /// `cudaMalloc`: a new segment of exactly `bytes`;
    /// [`DeviceError::OutOfMemory`] when the driver has not enough free
    /// memory, [`DeviceError::Driver`] for any other failure.
    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError>;
    /// `cudaFree` of a segment obtained from [`Device::malloc`].
    fn free(&mut self, address: u64, bytes: u64);
    /// `cuMemAddressReserve`: a virtual address range of at least `bytes`
    /// for an expandable segment, at `hint` where the device can place it;
    /// nothing is mapped there yet. A simulated GPU's range is where the
    /// allocator asks. (With `device-values`: the page's engine, on a
    /// simulated GPU only, maps each page as a segment of its own.)
    #[cfg(feature = "device-values")]
    fn reserve(&mut self, bytes: u64, hint: u64) -> Result<u64, DeviceError> {
        let _ = bytes;
        Ok(hint)
    }
    /// `cuMemCreate` + `cuMemMap`: `bytes` of memory mapped at `address`
    /// inside a reserved range (a page of an expandable segment); returns
    /// the handle [`Device::unmap`] gives back. By default the memory is
    /// a segment of its own, counted as `malloc` counts it.
    #[cfg(feature = "device-values")]
    fn map(&mut self, address: u64, bytes: u64) -> Result<u64, DeviceError> {
        let _ = address;
        self.malloc(bytes)
    }
    /// `cuMemUnmap` + `cuMemRelease` of what [`Device::map`] made.
    #[cfg(feature = "device-values")]
    fn unmap(&mut self, address: u64, handle: u64, bytes: u64) {
        let _ = address;
        self.free(handle, bytes)
    }
    /// `cudaMemGetInfo`: `(free, total)` for the whole device, other
    /// processes included.
    fn mem_get_info(&self) -> (u64, u64);
    /// Bytes the CUDA context of this process holds.
    fn context_bytes(&self) -> u64;
    /// Bytes held by other processes on the same GPU.
    fn other_processes_bytes(&self) -> u64;
    /// Another process on the same GPU takes `bytes` (`start`) or gives
    /// them back as it exits: vLLM's engine core, started from this one.
    /// Only a simulated GPU can stand for such a process.
    fn other_process(&mut self, bytes: u64, start: bool) -> Result<(), DeviceError> {
        let _ = (bytes, start);
        Err(DeviceError::Driver(
            "another process's memory is modelled on a simulated GPU only".into(),
        ))
    }
    /// Bytes this process holds through `malloc` (all live segments).
    fn segment_bytes(&self) -> u64;
    fn info(&self) -> DeviceInfo;

    /// What nvidia-smi shows for this process: context plus every live segment.
    fn process_used_bytes(&self) -> u64 {
        self.context_bytes() + self.segment_bytes()
    }

    /// The bytes in its segments, where the device holds any: a real GPU
    /// does, a simulated one (which may stand for 80 GB) does not.
    #[cfg(feature = "device-values")]
    fn memory(&mut self) -> Option<&mut dyn DeviceMemory> {
        None
    }

    /// Whether [`Device::memory`] gives the bytes: then a step records
    /// where each of its tensors went.
    #[cfg(feature = "device-values")]
    fn holds_values(&self) -> bool {
        false
    }
}

/// The bytes of a device's segments: what a step's values are written to
/// and read back from (`cuMemcpyHtoD` / `cuMemcpyDtoH` on a GPU). Each
/// access lies inside a live segment, or is refused as the driver refuses
/// an illegal address.
#[cfg(feature = "device-values")]
pub trait DeviceMemory {
    fn write(&mut self, address: u64, bytes: &[u8]) -> Result<(), DeviceError>;
    fn read(&mut self, address: u64, out: &mut [u8]) -> Result<(), DeviceError>;

    /// Its own kernels and BLAS, where it runs code (a GPU whose kernels
    /// compiled): then a step's ops compute there, on these bytes.
    fn compute(&mut self) -> Option<&mut dyn crate::compute::DeviceCompute> {
        None
    }
}

/// Settings of the simulated GPU, all set by `restart`.
#[derive(Clone, Debug, PartialEq)]
pub struct SimDeviceConfig {
    pub total_bytes: u64,
    pub context_bytes: u64,
    pub other_processes_bytes: u64,
    pub compute_capability: (u32, u32),
    /// The card it stands for (`torch.cuda.get_device_name()`), if a model.
    pub model_name: Option<&'static str>,
}

impl Default for SimDeviceConfig {
    fn default() -> Self {
        Self {
            total_bytes: DEFAULT_TOTAL_BYTES,
            context_bytes: DEFAULT_CONTEXT_BYTES,
            other_processes_bytes: 0,
            compute_capability: DEFAULT_COMPUTE_CAPABILITY,
            model_name: None,
        }
    }
}

impl SimDeviceConfig {
    /// Checks that the context and the other processes fit on the device.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.total_bytes == 0 {
            return Err("device_total_bytes must be greater than 0".into());
        }
        let fixed = self.context_bytes.checked_add(self.other_processes_bytes);
        match fixed {
            Some(fixed) if fixed <= self.total_bytes => Ok(()),
            _ => Err(Invalid(format!(
                "the CUDA context ({}) and other processes ({}) do not fit on a device of {}",
                vramlab_core::units::format_size(self.context_bytes),
                vramlab_core::units::format_size(self.other_processes_bytes),
                vramlab_core::units::format_size(self.total_bytes),
            ))),
        }
    }
}

/// The simulated GPU: exact bookkeeping of segments, deterministic addresses.
#[derive(Clone, Debug)]
pub struct SimDevice {
    config: SimDeviceConfig,
    next_address: u64,
    segments: BTreeMap<u64, u64>,
    segment_bytes: u64,
    /// Where the next segment goes, when a replay placed it.
    placed: Option<u64>,
}

impl SimDevice {
    /// Starts a process: the context is taken at once.
    pub fn new(config: SimDeviceConfig) -> Self {
        Self {
            config,
            next_address: SIM_BASE_ADDRESS,
            segments: BTreeMap::new(),
            segment_bytes: 0,
            placed: None,
        }
    }

    pub fn config(&self) -> &SimDeviceConfig {
        &self.config
    }

    /// Live segments, address to size.
    pub fn segments(&self) -> &BTreeMap<u64, u64> {
        &self.segments
    }

    /// Places the next segment at `address` (a recorded trace's own), if
    /// no live segment overlaps `[address, address + bytes)`; later ones
    /// continue above the highest address given out. Returns whether it
    /// will be placed there.
    pub fn place_next(&mut self, address: u64, bytes: u64) -> bool {
        let end = address.saturating_add(bytes.max(1));
        let below = self.segments.range(..end).next_back();
        let overlaps = below.is_some_and(|(&a, &s)| a + s.max(1) > address);
        if !overlaps {
            self.placed = Some(address);
        }
        !overlaps
    }

    fn free_bytes(&self) -> u64 {
        self.config.total_bytes
            - self.config.context_bytes
            - self.config.other_processes_bytes
            - self.segment_bytes
    }
}

impl Device for SimDevice {
    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        if bytes > self.free_bytes() {
            return Err(DeviceError::OutOfMemory);
        }
        let address = self.placed.take().unwrap_or(self.next_address);
        // Never reuse an address while the process lives (unless placed).
        let end = round_up(address + bytes.max(1), SIM_SEGMENT_ALIGNMENT);
        self.next_address = self.next_address.max(end);
        self.segments.insert(address, bytes);
        self.segment_bytes += bytes;
        Ok(address)
    }

    fn free(&mut self, address: u64, bytes: u64) {
        let removed = self.segments.remove(&address);
        debug_assert_eq!(removed, Some(bytes), "cudaFree of an unknown segment");
        if let Some(size) = removed {
            self.segment_bytes -= size;
        }
    }

    fn mem_get_info(&self) -> (u64, u64) {
        (self.free_bytes(), self.config.total_bytes)
    }

    fn context_bytes(&self) -> u64 {
        self.config.context_bytes
    }

    fn other_processes_bytes(&self) -> u64 {
        self.config.other_processes_bytes
    }

    fn other_process(&mut self, bytes: u64, start: bool) -> Result<(), DeviceError> {
        if !start {
            self.config.other_processes_bytes -= bytes.min(self.config.other_processes_bytes);
        } else if bytes > self.free_bytes() {
            return Err(DeviceError::OutOfMemory);
        } else {
            self.config.other_processes_bytes += bytes;
        }
        Ok(())
    }

    fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            kind: DeviceKind::Simulated,
            name: match self.config.model_name {
                Some(model) => format!("Simulated {model}"),
                None => format!(
                    "Simulated GPU ({})",
                    vramlab_core::units::format_size(self.config.total_bytes)
                ),
            },
            total_bytes: self.config.total_bytes,
            compute_capability: self.config.compute_capability,
        }
    }
}

/// A device with a cap on what one process may hold, like
/// `set_per_process_memory_fraction`: past the cap, segment allocations
/// fail without asking the driver, so one session cannot take the GPU from
/// the others.
pub struct QuotaDevice {
    inner: Box<dyn Device>,
    quota: u64,
}

impl QuotaDevice {
    pub fn new(inner: Box<dyn Device>, quota: u64) -> Self {
        Self { inner, quota }
    }

    pub fn quota(&self) -> u64 {
        self.quota
    }
}

impl Device for QuotaDevice {
    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        if self.inner.segment_bytes().saturating_add(bytes) > self.quota {
            return Err(DeviceError::OutOfMemory);
        }
        self.inner.malloc(bytes)
    }

    fn free(&mut self, address: u64, bytes: u64) {
        self.inner.free(address, bytes);
    }

    fn mem_get_info(&self) -> (u64, u64) {
        self.inner.mem_get_info()
    }

    fn context_bytes(&self) -> u64 {
        self.inner.context_bytes()
    }

    fn other_processes_bytes(&self) -> u64 {
        self.inner.other_processes_bytes()
    }

    fn other_process(&mut self, bytes: u64, start: bool) -> Result<(), DeviceError> {
        self.inner.other_process(bytes, start)
    }

    fn segment_bytes(&self) -> u64 {
        self.inner.segment_bytes()
    }

    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramlab_core::units::GIB;

    #[test]
    fn device_info_reads_back_and_names_a_missing_field() {
        let info = SimDevice::new(SimDeviceConfig::default()).info();
        let mut v = serde_json::to_value(&info).unwrap();
        assert_eq!(DeviceInfo::deserialize(v.clone()).unwrap(), info);
        v.as_object_mut().unwrap().remove("total_bytes");
        let e = DeviceInfo::deserialize(v).unwrap_err();
        assert_eq!(e.to_string(), "missing field `total_bytes`");
    }

    #[test]
    fn addresses_are_aligned_and_never_reused() {
        let mut d = SimDevice::new(SimDeviceConfig::default());
        let a = d.malloc(2 * MIB).unwrap();
        let b = d.malloc(512).unwrap();
        d.free(a, 2 * MIB);
        let c = d.malloc(2 * MIB).unwrap();
        assert_eq!(a, SIM_BASE_ADDRESS);
        assert_eq!(b, a + 2 * MIB);
        assert_eq!(c, b + 2 * MIB);
        assert_eq!(c % SIM_SEGMENT_ALIGNMENT, 0);
    }

    #[test]
    fn free_memory_counts_context_and_others() {
        let mut d = SimDevice::new(SimDeviceConfig {
            total_bytes: GIB,
            context_bytes: 100 * MIB,
            other_processes_bytes: 24 * MIB,
            ..Default::default()
        });
        assert_eq!(d.mem_get_info(), (900 * MIB, GIB));
        assert!(d.malloc(900 * MIB + 1).is_err());
        let a = d.malloc(900 * MIB).unwrap();
        assert_eq!(d.mem_get_info().0, 0);
        assert_eq!(d.process_used_bytes(), 1000 * MIB);
        d.free(a, 900 * MIB);
        assert_eq!(d.process_used_bytes(), 100 * MIB);
    }

    #[test]
    fn a_quota_caps_what_the_process_holds() {
        let mut d = QuotaDevice::new(
            Box::new(SimDevice::new(SimDeviceConfig::default())),
            4 * MIB,
        );
        assert!(d.malloc(2 * MIB).is_ok());
        assert!(d.malloc(4 * MIB).is_err());
        assert!(d.malloc(2 * MIB).is_ok());
        assert_eq!(d.segment_bytes(), 4 * MIB);
    }

    #[test]
    fn config_must_fit() {
        let bad = SimDeviceConfig {
            total_bytes: 100 * MIB,
            context_bytes: 300 * MIB,
            other_processes_bytes: 0,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().0.contains("do not fit"));
    }
}
