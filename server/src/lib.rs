//! The vramlab server and command-line tool.
//!
//! - [`cli`]: the command line (clap), every option also an environment variable.
//! - [`backend`]: which device a kernel runs on (simulated GPU or CUDA).
//! - [`cuda`]: the real GPU through the CUDA driver (loaded at run time).
//! - [`runner`]: `vramlab run`, the headless runner of command files.
//! - [`app`]: the state the request handlers share.
//! - [`http`]: `vramlab serve`, the axum application and its routes.
//! - [`access`]: the access token and the websocket's origin check.
//! - [`ws`]: one websocket connection.
//! - [`session`]: sessions, each an engine on its own thread, and streaming.
//! - [`metrics`]: counters for `/metrics`.

pub mod access;
pub mod app;
pub mod backend;
pub mod cli;
pub mod cuda;
pub mod http;
pub mod listener;
pub mod metrics;
pub mod rate;
pub mod runner;
pub mod session;
pub mod ws;
