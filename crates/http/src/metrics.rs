//! Counters for `/metrics`, in Prometheus' text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Metrics {
    pub connections: AtomicU64,
    pub commands: AtomicU64,
    pub command_errors: AtomicU64,
    pub sessions_created: AtomicU64,
    pub sessions_expired: AtomicU64,
    pub refused: Refusals,
}

/// Requests, connections and messages refused, by reason.
#[derive(Debug, Default)]
pub struct Refusals {
    /// No access token, or a wrong one (401).
    pub token: AtomicU64,
    /// A `Host` the server does not answer to (403).
    pub host: AtomicU64,
    /// A websocket from an origin not allowed (403).
    pub origin: AtomicU64,
    /// The server's or one client's session limit.
    pub session_limit: AtomicU64,
    /// A message over the size limit.
    pub too_large: AtomicU64,
    /// Commands over the rate limit.
    pub rate_limited: AtomicU64,
    /// No user from a trusted proxy, or another user's session.
    pub user: AtomicU64,
}

impl Refusals {
    /// One labelled counter, a line per reason.
    fn render(&self) -> String {
        let mut out = String::from(
            "# HELP vramlab_refused_total Requests, connections or messages refused, by reason.\n# TYPE vramlab_refused_total counter\n",
        );
        for (reason, counter) in self.by_reason() {
            let value = counter.load(Ordering::Relaxed);
            let _ = writeln!(out, "vramlab_refused_total{{reason=\"{reason}\"}} {value}");
        }
        out
    }

    fn by_reason(&self) -> [(&'static str, &AtomicU64); 7] {
        [
            ("token", &self.token),
            ("host", &self.host),
            ("origin", &self.origin),
            ("session_limit", &self.session_limit),
            ("too_large", &self.too_large),
            ("rate_limited", &self.rate_limited),
            ("user", &self.user),
        ]
    }
}

/// Gauges read from the sessions at scrape time.
#[derive(Debug, Default, Clone, Copy)]
pub struct Gauges {
    pub sessions: u64,
    pub device_used_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
}

impl Metrics {
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self, g: Gauges) -> String {
        let mut out = String::new();
        let mut line = |name: &str, kind: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        line("vramlab_sessions", "gauge", "Live sessions.", g.sessions);
        line(
            "vramlab_connections",
            "gauge",
            "Open websocket connections.",
            get(&self.connections),
        );
        line(
            "vramlab_commands_total",
            "counter",
            "Commands executed.",
            get(&self.commands),
        );
        line(
            "vramlab_command_errors_total",
            "counter",
            "Commands that ended in an error.",
            get(&self.command_errors),
        );
        line(
            "vramlab_sessions_created_total",
            "counter",
            "Sessions created.",
            get(&self.sessions_created),
        );
        line(
            "vramlab_sessions_expired_total",
            "counter",
            "Sessions dropped after their connection was gone too long.",
            get(&self.sessions_expired),
        );
        line(
            "vramlab_device_used_bytes",
            "gauge",
            "Device memory all sessions hold (context + segments).",
            g.device_used_bytes,
        );
        line(
            "vramlab_allocated_bytes",
            "gauge",
            "Bytes in live tensors, all sessions.",
            g.allocated_bytes,
        );
        line(
            "vramlab_reserved_bytes",
            "gauge",
            "Bytes the sessions' allocators reserved.",
            g.reserved_bytes,
        );
        out.push_str(&self.refused.render());
        out
    }
}
