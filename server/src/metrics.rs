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
    pub refused: AtomicU64,
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
            "vramlab_refused_total",
            "counter",
            "Connections or messages refused by a limit.",
            get(&self.refused),
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
        out
    }
}
