//! `vramlab serve`: the HTTP and websocket server. It never reads the
//! command line: the binary builds its configuration in `main`.
//!
//! - [`app`]: the state the request handlers share.
//! - [`http`]: the axum application and its routes.
//! - [`access`]: the access token, the host names served, the websocket's
//!   origin check, and the throttle on wrong tokens.
//! - [`listener`]: the TCP side: a connection cap, silent connections closed,
//!   the peer's address; [`network`]: addresses and networks.
//! - [`ws`]: one websocket connection (keepalive, write timeout).
//! - [`session`]: sessions, each an engine on its own thread, and streaming;
//!   their registry and limits.
//! - [`rate`]: the per-session budget of commands a second; [`heavy`]: the
//!   cap on heavy requests at once.
//! - [`metrics`]: counters (refusals by reason) for `/metrics`.
//! - [`webapp`]: the built web app inside the binary; [`dist`]: a built
//!   folder served instead.

pub mod access;
pub mod app;
pub mod dist;
pub mod heavy;
pub mod http;
pub mod listener;
pub mod metrics;
pub mod network;
pub mod rate;
pub mod session;
pub mod webapp;
pub mod ws;
