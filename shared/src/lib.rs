//! vramlab's memory engine: pure, deterministic, single-threaded, and built
//! for the host and for wasm32 alike. It stands on crates in layers, each
//! using only those listed before it (Cargo holds them to it):
//!
//! - `vramlab-core`: [`types`], [`units`], [`error`]: plain domain words,
//!   sizes, errors.
//! - `vramlab-device`: [`device`], [`gpu`], [`alloc`], [`framework`]: the
//!   simulated GPU, GPU models, the allocators (PyTorch caching, uncached,
//!   TF/XLA BFC) and each framework's settings.
//! - `vramlab-process`: [`runtime`], [`stats`], [`process`], [`snapshot`]:
//!   names, references and `gc.collect()`; one process and its numbers.
//! - `vramlab-torch-snapshot` ([`torch_snapshot`]): the memory snapshots
//!   PyTorch records (`torch.cuda.memory._dump_snapshot`): read, replayed
//!   exactly, what-if, and a session written as one.
//! - `vramlab-train` ([`train`]): models, optimizers, data and the
//!   allocations of a training step.
//! - `vramlab-hf` (`hf`, with the `hf-models` feature): Hugging Face
//!   transformers' models, `generate`, their steps, plans and vLLM.
//!
//! This crate's own modules, in layers:
//!
//! - [`command`]: the commands, their arguments, and `parse_line`.
//! - [`engine`]: carries out commands on a process.
//! - [`python`]: the Python each command stands for.
//! - [`explain`]: which numbers moved, the framework's names for them, links.
//! - [`protocol`]: result records and websocket messages (the wire format).
//! - [`lesson`]: checks lesson files' expectations.
//! - [`input`]: text typed into the page's fields, read or refused.
//! - [`advice`]: the popular advice on freeing memory, as cell code, and its claims judged.

pub mod advice;
#[cfg(test)]
mod by_name_tests;
pub mod command;
pub mod engine;
pub mod explain;
pub mod input;
pub mod lesson;
pub mod protocol;
pub mod python;

// The layers below, each a crate of its own, under the names the engine
// and its users know them by.
pub use vramlab_core::{by_name, collections, error, fields, hash, types, units};
#[cfg(feature = "device-values")]
pub use vramlab_device::compute;
pub use vramlab_device::{alloc, device, framework, gpu};
#[cfg(feature = "hf-models")]
pub use vramlab_hf as hf;
pub use vramlab_process::{process, runtime, snapshot, stats};
pub use vramlab_torch_snapshot as torch_snapshot;
pub use vramlab_train as train;

pub use command::Command;
pub use engine::Engine;
pub use error::{CommandError, DeviceError, ErrorKind, Invalid};
pub use protocol::StepRecord;
pub use snapshot::Snapshot;
pub use stats::Stats;
pub use types::Framework;
