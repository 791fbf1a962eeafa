//! vramlab's memory engine: pure, deterministic, single-threaded, and built
//! for the host and for wasm32 alike. Modules in layers; each uses only
//! those listed before it:
//!
//! - [`types`], [`error`], [`units`]: plain domain words, errors, sizes.
//! - [`compute`]: the calls a device that runs code is asked for (kernels,
//!   cuBLAS's `GemmEx`).
//! - [`device`]: the `Device` trait and the simulated GPU.
//! - [`gpu`]: GPU models (memory, compute capability, context).
//! - [`alloc`]: one block arena under the allocators (PyTorch caching,
//!   uncached, TF/XLA BFC).
//! - [`framework`]: settings, which allocator each framework builds, OOM texts.
//! - [`runtime`]: names, reference counts, cycles and `gc.collect()`.
//! - [`stats`]: the numbers every result carries and the event log's entries.
//! - [`process`]: one process: device + allocator + runtime + event log.
//! - [`snapshot`]: the segment map and live objects, captured from a process.
//! - [`torch_snapshot`]: the memory snapshots PyTorch records
//!   (`torch.cuda.memory._dump_snapshot`): read, replayed exactly, what-if,
//!   and a session written as one.
//! - [`train`]: models, optimizers, data and the allocations of a training step.
//! - [`command`]: the commands, their arguments, and `parse_line`.
//! - [`engine`]: carries out commands on a process.
//! - [`python`]: the Python each command stands for.
//! - [`explain`]: which numbers moved, the framework's names for them, links.
//! - [`protocol`]: result records and websocket messages (the wire format).
//! - [`lesson`]: checks lesson files' expectations.
//! - [`input`]: text typed into the page's fields, read or refused.
//! - [`advice`]: the popular advice on freeing memory, as cell code, and its claims judged.

pub mod advice;
pub mod alloc;
mod by_name;
pub mod collections;
pub mod command;
#[cfg(feature = "device-values")]
pub mod compute;
pub mod device;
pub mod engine;
pub mod error;
pub mod explain;
pub mod fields;
pub mod framework;
pub mod gpu;
pub mod hash;
pub mod input;
pub mod lesson;
pub mod process;
pub mod protocol;
pub mod python;
pub mod runtime;
pub mod snapshot;
pub mod stats;
pub mod torch_snapshot;
pub mod train;
pub mod types;
pub mod units;

pub use command::Command;
pub use engine::Engine;
pub use error::{CommandError, DeviceError, ErrorKind, Invalid};
pub use protocol::StepRecord;
pub use snapshot::Snapshot;
pub use stats::Stats;
pub use types::Framework;
