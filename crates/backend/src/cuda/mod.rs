//! The real GPU: segments are `cuMemAlloc` / `cuMemFree` on an NVIDIA GPU,
//! through the CUDA driver loaded at run time, so the binary runs (on the
//! simulator) where there is no CUDA at all. The driver code ([`driver`])
//! is behind the `cuda` cargo feature (on by default); a build without it
//! says so when asked for a GPU.

#[cfg(feature = "cuda")]
pub mod cubin_cache;
#[cfg(feature = "cuda")]
pub mod driver;
#[cfg(feature = "cuda")]
pub mod kernels;
#[cfg(feature = "cuda")]
pub mod timing;
#[cfg(feature = "cuda")]
pub mod vmm;

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

/// Looks for GPU `ordinal`, usable; never panics. The error says why
/// there is none.
pub fn probe(ordinal: usize) -> Result<Probe, String> {
    #[cfg(feature = "cuda")]
    return driver::probe(ordinal);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(NOT_BUILT.into())
    }
}

/// `vramlab kernels`: the step's kernels compiled for each compute
/// capability asked for (`arch`, as `8.0`; every one vramlab builds for
/// when none), one line each, each cubin written under `out` when given;
/// status 1 if any fails.
pub fn compile_kernels(
    arch: &[String],
    out: Option<&std::path::Path>,
) -> anyhow::Result<std::process::ExitCode> {
    #[cfg(feature = "cuda")]
    {
        let mut archs = vec![];
        for a in arch {
            let parsed = a
                .split_once('.')
                .and_then(|(x, y)| Some((x.parse().ok()?, y.parse().ok()?)));
            archs.push(parsed.ok_or_else(|| {
                anyhow::anyhow!("--arch {a}: a compute capability is written like 8.0")
            })?);
        }
        if archs.is_empty() {
            archs = kernels::ARCHITECTURES.to_vec();
        }
        let mut failed = false;
        for (major, minor) in archs {
            match kernels::compile((major, minor)) {
                Ok(cubin) => {
                    println!(
                        "sm_{major}{minor}: {} kernels, cubin of {} bytes",
                        vramlab_shared::train::kernels::NAMES.len(),
                        cubin.len()
                    );
                    if let Some(dir) = out {
                        std::fs::create_dir_all(dir)?;
                        std::fs::write(
                            dir.join(format!("vramlab-sm_{major}{minor}.cubin")),
                            &cubin,
                        )?;
                    }
                }
                Err(e) => {
                    eprintln!("sm_{major}{minor}: {e}");
                    failed = true;
                }
            }
        }
        Ok(std::process::ExitCode::from(u8::from(failed)))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (arch, out);
        anyhow::bail!(NOT_BUILT)
    }
}

#[cfg(not(feature = "cuda"))]
const NOT_BUILT: &str = "this vramlab was built without the `cuda` feature";

/// Starts a CUDA device for each kernel. A kernel set to a GPU smaller
/// than the real one (a lesson's 16 GiB card on an 80 GB H100) gets the
/// real GPU standing in for it: real segments, within that card's room.
pub struct CudaFactory {
    pub ordinal: usize,
}

impl DeviceFactory for CudaFactory {
    fn start(&mut self, settings: &Settings) -> Result<Box<dyn Device>, CommandError> {
        start(self.ordinal, settings).map_err(|m| CommandError::new(ErrorKind::DeviceError, m))
    }
}

/// The smaller GPU a real one stands in for: its total, its context and
/// the other processes on it, as the settings describe them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StandIn {
    pub total_bytes: u64,
    pub context_bytes: u64,
    pub other_processes_bytes: u64,
    /// The card's, which decides TensorFlow's system reserve.
    pub compute_capability: (u32, u32),
}

impl StandIn {
    /// The settings' GPU, where it is smaller than `real_total`.
    pub fn of(settings: &Settings, real_total: u64) -> Option<StandIn> {
        (settings.device_total_bytes < real_total).then_some(StandIn {
            total_bytes: settings.device_total_bytes,
            context_bytes: settings.context_bytes,
            other_processes_bytes: settings.other_processes_bytes,
            compute_capability: settings.compute_capability,
        })
    }

    /// Free bytes on that GPU with `segments` bytes in this process's
    /// segments.
    pub fn free_bytes(&self, segments: u64) -> u64 {
        self.total_bytes
            .saturating_sub(self.context_bytes + self.other_processes_bytes + segments)
    }
}

fn start(ordinal: usize, settings: &Settings) -> Result<Box<dyn Device>, String> {
    #[cfg(feature = "cuda")]
    return driver::CudaDevice::start(ordinal, settings).map(|d| Box::new(d) as Box<dyn Device>);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ordinal, settings);
        Err(NOT_BUILT.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_gpu_stands_in_only_for_a_smaller_one() {
        let settings = Settings {
            device_total_bytes: 16 << 30,
            context_bytes: 300 << 20,
            other_processes_bytes: 1 << 30,
            ..Settings::default()
        };
        let stand_in = StandIn::of(&settings, 80 << 30).unwrap();
        assert_eq!(stand_in.total_bytes, 16 << 30);
        assert_eq!(stand_in.free_bytes(0), (16 << 30) - (300 << 20) - (1 << 30));
        assert_eq!(stand_in.free_bytes(1 << 30), (14 << 30) - (300 << 20));
        assert_eq!(stand_in.free_bytes(u64::MAX / 2), 0);
        // The real GPU is that size or smaller: it is itself.
        assert_eq!(StandIn::of(&settings, 16 << 30), None);
        assert_eq!(StandIn::of(&settings, 8 << 30), None);
    }

    #[test]
    fn probing_never_panics() {
        // On a machine without CUDA (or a build without the feature) this is
        // an error that says why; on a GPU machine it names the GPU.
        match probe(0) {
            Ok(p) => assert!(p.total_bytes > 0 && !p.name.is_empty()),
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
