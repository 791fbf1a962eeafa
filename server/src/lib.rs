//! The vramlab server and command-line tool.
//!
//! - [`cli`]: the command line (clap), every option also an environment variable.
//! - [`backend`]: which device a kernel runs on (simulated GPU or CUDA).
//! - [`cuda`]: the real GPU through the CUDA driver (loaded at run time).
//! - [`runner`]: `vramlab run`, the headless runner of command files.
//! - [`replay`]: `vramlab replay`, real PyTorch memory snapshots replayed;
//!   [`diff`]: `vramlab diff`, two of them compared at their peaks.
//! - [`plan`]: `vramlab plan`, will a Hugging Face model's `generate()` fit.
//! - [`app`]: the state the request handlers share.
//! - [`http`]: `vramlab serve`, the axum application and its routes.
//! - [`access`]: the access token, the host names served, the websocket's
//!   origin check, and the throttle on wrong tokens.
//! - [`listener`]: the TCP side: a connection cap, silent connections closed,
//!   the peer's address.
//! - [`ws`]: one websocket connection (keepalive, write timeout).
//! - [`session`]: sessions, each an engine on its own thread, and streaming;
//!   their registry and limits.
//! - [`rate`]: the per-session budget of commands a second.
//! - [`metrics`]: counters (refusals by reason) for `/metrics`.

pub mod access;
pub mod app;
pub mod atomic;
pub mod backend;
pub mod cli;
pub mod cuda;
pub mod diff;
pub mod dist;
pub mod heavy;
pub mod http;
pub mod lesson_python;
pub mod listener;
pub mod metrics;
pub mod network;
pub mod plan;
pub mod python;
pub mod rate;
pub mod replay;
pub mod runner;
pub mod session;
pub mod webapp;
pub mod ws;
