//! The vramlab server and command-line tool.
//!
//! - [`cli`]: the command line (clap), every option also an environment variable.
//! - [`backend`]: which device a kernel runs on (simulated GPU or CUDA).
//! - [`runner`]: `vramlab run`, the headless runner of command files.
//! - [`http`]: `vramlab serve`, the axum application.

pub mod backend;
pub mod cli;
pub mod http;
pub mod runner;
