//! The device under the frameworks, in layers; each uses only those
//! listed before it:
//!
//! - `compute`: the calls a device that runs code is asked for (kernels,
//!   cuBLAS's `GemmEx`), with the `device-values` feature.
//! - [`device`]: the `Device` trait and the simulated GPU.
//! - [`gpu`]: GPU models (memory, compute capability, context).
//! - [`alloc`]: one block arena under the allocators (PyTorch caching,
//!   uncached, TF/XLA BFC).
//! - [`framework`]: settings, which allocator each framework builds, OOM texts.

pub mod alloc;
#[cfg(feature = "device-values")]
pub mod compute;
pub mod device;
pub mod framework;
pub mod gpu;
