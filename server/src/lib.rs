//! The `vramlab` binary: the command line and the subcommands that are
//! not the server. The HTTP server is `vramlab_http`, the device backend
//! `vramlab_backend`; neither reads the command line.
//!
//! - [`cli`]: the command line (clap), every option also an environment variable.
//! - [`runner`]: `vramlab run`, the headless runner of command files.
//! - [`replay`]: `vramlab replay`, real PyTorch memory snapshots replayed;
//!   [`diff`]: `vramlab diff`, two of them compared at their peaks.
//! - [`plan`]: `vramlab plan`, will a Hugging Face model's `generate()` fit.
//! - [`python`]: `vramlab python`, a script run on the simulated GPU;
//!   [`lesson_python`]: `vramlab lesson-python`, a lesson's cells.
//! - [`atomic`]: files written whole.

pub mod atomic;
pub mod cli;
pub mod diff;
pub mod lesson_python;
pub mod plan;
pub mod python;
pub mod replay;
pub mod runner;
