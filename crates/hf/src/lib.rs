//! Hugging Face transformers' causal language models, built from their
//! config.json as transformers 5.24 builds them.
//!
//! - [`config`]: the numbers of a config.json, with each class's defaults.
//! - [`params`]: parameters and buffers in `named_parameters()` order.
//! - [`known`]: a dozen published shapes shipped as data.
//! - [`generate`]: `model.generate()`'s allocations, the prefill and one
//!   forward per new token, with the `DynamicCache` or the `StaticCache`.
//! - [`ask`]: the question and its answer as JSON (the CLI's and the page's).
//! - [`step`]: one training step in transformers' op order, its backward
//!   as PyTorch's autograd engine runs it.
//! - [`plan`]: "will it fit?": that program played on a simulated GPU.
//! - [`serve`]: vLLM's start-up: its profile run, its CUDA graphs and
//!   the KV cache's blocks and tokens.
//! - [`state`]: what a process keeps of its models, optimizers and steps.

pub mod ask;
pub mod config;
pub mod generate;
pub mod known;
pub mod params;
pub mod plan;
pub mod serve;
pub mod state;
pub mod step;

pub use config::{Arch, HfConfig};
