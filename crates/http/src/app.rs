//! The state every request handler shares: health, sessions, access
//! rules and limits.

use crate::access::Access;
use crate::session::Sessions;
use serde::Serialize;
use std::sync::Arc;
use vramlab_shared::device::DeviceInfo;
use vramlab_shared::protocol::Limits;

/// What `/healthz` answers.
#[derive(Clone, Debug, Serialize)]
pub struct Health {
    pub status: &'static str,
    pub version: &'static str,
    pub protocol_version: u32,
    /// `sim` or `cuda`.
    pub backend: &'static str,
    /// Why this backend was chosen.
    pub backend_reason: String,
    pub device: DeviceInfo,
}

#[derive(Clone)]
pub struct AppState {
    pub health: Arc<Health>,
    pub sessions: Arc<Sessions>,
    pub access: Arc<Access>,
    pub limits: Limits,
    pub keepalive: Keepalive,
    /// Where a connection's CPU-heavy requests run.
    pub heavy: crate::heavy::Heavy,
}

/// How a connection proves it is alive: the server pings every
/// `ping_every`; one that sends nothing (not even a pong) for `idle` is
/// closed, so a dead or stuck client cannot keep its session past its TTL.
#[derive(Clone, Copy, Debug)]
pub struct Keepalive {
    pub ping_every: std::time::Duration,
    pub idle: std::time::Duration,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            ping_every: std::time::Duration::from_secs(20),
            idle: std::time::Duration::from_secs(60),
        }
    }
}
