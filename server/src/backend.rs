//! Which device a kernel runs on.

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
    factory: fn() -> Box<dyn DeviceFactory>,
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
        (self.factory)()
    }

    /// An engine on this backend with default settings.
    pub fn engine(&self) -> anyhow::Result<Engine> {
        Engine::new(self.factory(), Settings::default()).map_err(|e| anyhow::anyhow!(e.message))
    }
}

fn sim_factory() -> Box<dyn DeviceFactory> {
    Box::new(SimDeviceFactory)
}

/// Picks the backend; never panics, whatever the machine has.
pub fn select(choice: DeviceChoice) -> anyhow::Result<Backend> {
    match choice {
        DeviceChoice::Sim => Ok(Backend {
            name: "sim",
            reason: "simulated GPU (asked for with --device sim)".into(),
            factory: sim_factory,
        }),
        DeviceChoice::Auto => Ok(Backend {
            name: "sim",
            reason: "simulated GPU (this build has no CUDA backend)".into(),
            factory: sim_factory,
        }),
        DeviceChoice::Cuda => Err(anyhow::anyhow!(
            "--device cuda: this build has no CUDA backend; use --device sim or --device auto"
        )),
    }
}
