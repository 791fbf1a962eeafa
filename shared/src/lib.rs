//! vramlab's memory engine: pure, deterministic, single-threaded, and built
//! for the host and for wasm32 alike.
//!
//! - [`protocol`]: the commands and result records (the wire format).
//! - [`alloc`]: the allocators (PyTorch caching, uncached, TF/XLA BFC).
//! - [`device`]: the `Device` trait and the simulated GPU.
//! - [`framework`]: settings, which allocator each framework builds, OOM texts.
//! - [`runtime`]: names, reference counts, cycles and `gc.collect()`.
//! - [`kernel`]: one process: device + allocator + runtime + event log.
//! - [`engine`]: carries out commands on a kernel.
//! - [`train`]: models, optimizers, data and the allocations of a training step.
//! - [`snapshot`]: stats, segment map, event log, live objects.
//! - [`lesson`]: checks lesson files' expectations.

pub mod alloc;
pub mod device;
pub mod engine;
pub mod framework;
pub mod kernel;
pub mod lesson;
pub mod protocol;
pub mod python;
pub mod runtime;
pub mod snapshot;
pub mod train;
pub mod units;

pub use engine::Engine;
pub use protocol::{Command, CommandError, ErrorKind, Framework, StepRecord};
pub use snapshot::{Snapshot, Stats};
