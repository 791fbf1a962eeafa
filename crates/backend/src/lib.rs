//! The device a session runs on: the simulated GPU, or a real NVIDIA GPU
//! through the CUDA driver ([`cuda`], feature `cuda`), chosen once from
//! `--device` and handed to every engine the binary starts. It never reads
//! the command line: the binary builds its choice in `main`.

pub mod cuda;

use clap::ValueEnum;
use vramlab_shared::engine::{DeviceFactory, SimDeviceFactory};
use vramlab_shared::framework::Settings;
use vramlab_shared::Engine;

/// `--device`: the backend asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceChoice {
    /// The simulated GPU: exact allocator bookkeeping, no hardware needed.
    Sim,
    /// A real NVIDIA GPU through the CUDA driver.
    Cuda,
    /// CUDA when a driver and a GPU are present, else the simulated GPU.
    Auto,
}

/// The backend chosen, and why.
pub struct Backend {
    pub name: &'static str,
    /// One sentence for the log and `/healthz`.
    pub reason: String,
    /// The GPU processes start on (CUDA's device ordinal), for a CUDA backend.
    ordinal: usize,
    factory: fn(usize) -> Box<dyn DeviceFactory>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .field("reason", &self.reason)
            .finish()
    }
}

impl Backend {
    /// A fresh device factory for one engine.
    pub fn factory(&self) -> Box<dyn DeviceFactory> {
        (self.factory)(self.ordinal)
    }

    /// An engine on this backend with default settings.
    pub fn engine(&self) -> anyhow::Result<Engine> {
        Engine::new(self.factory(), Settings::default()).map_err(|e| anyhow::anyhow!(e.message))
    }
}

impl Backend {
    /// A simulated backend whose engines start from `factory`: a device of
    /// the caller's own (a test's, gated or failing on purpose).
    pub fn simulated_with(factory: fn(usize) -> Box<dyn DeviceFactory>) -> Backend {
        Backend {
            name: "sim",
            reason: "a device of the caller's own".into(),
            ordinal: 0,
            factory,
        }
    }
}

fn sim_factory(_ordinal: usize) -> Box<dyn DeviceFactory> {
    Box::new(SimDeviceFactory)
}

fn cuda_factory(ordinal: usize) -> Box<dyn DeviceFactory> {
    Box::new(crate::cuda::CudaFactory { ordinal })
}

/// Picks the backend, on GPU `ordinal` for CUDA (`--cuda-ordinal`); never
/// panics, whatever the machine has.
pub fn select(choice: DeviceChoice, ordinal: usize) -> anyhow::Result<Backend> {
    let sim = |reason: String| Backend {
        name: "sim",
        reason,
        ordinal,
        factory: sim_factory,
    };
    match choice {
        DeviceChoice::Sim => Ok(sim("simulated GPU (asked for with --device sim)".into())),
        DeviceChoice::Auto => Ok(match crate::cuda::probe(ordinal) {
            Ok(gpu) => Backend {
                name: "cuda",
                reason: format!(
                    "CUDA: GPU {ordinal}, {} ({} GiB, compute capability {}.{})",
                    gpu.name,
                    gpu.total_bytes >> 30,
                    gpu.compute_capability.0,
                    gpu.compute_capability.1
                ),
                ordinal,
                factory: cuda_factory,
            },
            Err(why) => sim(format!("simulated GPU: no CUDA GPU here ({why})")),
        }),
        DeviceChoice::Cuda => match crate::cuda::probe(ordinal) {
            Ok(gpu) => Ok(Backend {
                name: "cuda",
                reason: format!(
                    "CUDA: GPU {ordinal}, {} (asked for with --device cuda)",
                    gpu.name
                ),
                ordinal,
                factory: cuda_factory,
            }),
            Err(why) => Err(anyhow::anyhow!(
                "--device cuda: {why}; use --device sim, or see the README's section on GPUs"
            )),
        },
    }
}
