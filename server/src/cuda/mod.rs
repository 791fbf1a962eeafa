//! The real GPU: segments are `cuMemAlloc` / `cuMemFree` on an NVIDIA GPU,
//! through the CUDA driver loaded at run time, so the binary runs (on the
//! simulator) where there is no CUDA at all. The driver code ([`driver`])
//! is behind the `cuda` cargo feature (on by default); a build without it
//! says so when asked for a GPU.

#[cfg(feature = "cuda")]
pub mod driver;

use vramlab_shared::device::Device;
use vramlab_shared::engine::DeviceFactory;
use vramlab_shared::framework::Settings;
use vramlab_shared::{CommandError, ErrorKind};

/// What a working GPU says about itself.
#[derive(Clone, Debug)]
pub struct Probe {
    pub name: String,
    pub total_bytes: u64,
    pub compute_capability: (u32, u32),
}

/// Looks for a usable GPU; never panics. The error says why there is none.
pub fn probe() -> Result<Probe, String> {
    #[cfg(feature = "cuda")]
    return driver::probe();
    #[cfg(not(feature = "cuda"))]
    Err(NOT_BUILT.into())
}

#[cfg(not(feature = "cuda"))]
const NOT_BUILT: &str = "this vramlab was built without the `cuda` feature";

/// Starts a CUDA device for each kernel; the settings that describe a
/// simulated GPU (its size, context, other processes) do not apply.
pub struct CudaFactory {
    pub ordinal: usize,
}

impl DeviceFactory for CudaFactory {
    fn start(&mut self, _settings: &Settings) -> Result<Box<dyn Device>, CommandError> {
        start(self.ordinal).map_err(|m| CommandError::new(ErrorKind::DeviceError, m))
    }
}

fn start(ordinal: usize) -> Result<Box<dyn Device>, String> {
    #[cfg(feature = "cuda")]
    return driver::CudaDevice::start(ordinal).map(|d| Box::new(d) as Box<dyn Device>);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(NOT_BUILT.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probing_never_panics() {
        // On a machine without CUDA (or a build without the feature) this is
        // an error that says why; on a GPU machine it names the GPU.
        match probe() {
            Ok(p) => assert!(p.total_bytes > 0 && !p.name.is_empty()),
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
