//! Where a step's GPU time goes: with `VRAMLAB_KERNEL_TIMES=FILE` set, a
//! CUDA event before and after each kernel launch and matrix product on
//! the default stream, summed by the call's name and size; when the
//! device is dropped, one JSON line is appended to the file, the calls
//! that took longest first. Unset, nothing is recorded.
//!
//! The events are resolved every [`BATCH`] calls (waiting for the last
//! one), so a timed run keeps the GPU a little less busy than an untimed
//! one; the totals are the kernels' own time, not the gaps between them.

use cudarc::driver::{result as driver, sys};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use vramlab_shared::compute::{GemmEx, Grid, Launch};

/// Calls recorded before their events are read and destroyed.
const BATCH: usize = 512;

/// The environment variable that names the file.
pub const ENV: &str = "VRAMLAB_KERNEL_TIMES";

/// Calls and milliseconds of one kind of call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Total {
    calls: u64,
    ms: f64,
}

/// The events of the calls not yet read, and the totals so far.
pub struct CallTimes {
    file: PathBuf,
    pending: Vec<(String, sys::CUevent, sys::CUevent)>,
    totals: BTreeMap<String, Total>,
    failed: Option<String>,
}

impl CallTimes {
    /// Timing, if the environment asks for it.
    pub fn from_env() -> Option<Self> {
        let file = std::env::var_os(ENV)?;
        Some(Self {
            file: file.into(),
            pending: Vec::new(),
            totals: BTreeMap::new(),
            failed: None,
        })
    }

    /// Records the events around `call` (which issues one call on the
    /// default stream) under `name`.
    pub fn around<T>(&mut self, name: String, call: impl FnOnce() -> T) -> T {
        let events = self.record_start();
        let out = call();
        if let Some(start) = events {
            match record(std::ptr::null_mut()) {
                Ok(end) => self.pending.push((name, start, end)),
                Err(e) => self.fail(e),
            }
        }
        if self.pending.len() >= BATCH {
            self.resolve();
        }
        out
    }

    fn record_start(&mut self) -> Option<sys::CUevent> {
        if self.failed.is_some() {
            return None;
        }
        match record(std::ptr::null_mut()) {
            Ok(e) => Some(e),
            Err(e) => {
                self.fail(e);
                None
            }
        }
    }

    fn fail(&mut self, why: String) {
        self.failed.get_or_insert(why);
    }

    /// Waits for the recorded calls and adds their times.
    fn resolve(&mut self) {
        if let Some((_, _, last)) = self.pending.last() {
            // SAFETY: the event was created and recorded in this context.
            if let Err(e) = unsafe { driver::event::synchronize(*last) } {
                self.fail(format!("cuEventSynchronize: {e:?}"));
            }
        }
        for (name, start, end) in std::mem::take(&mut self.pending) {
            // SAFETY: both recorded on the default stream, and complete.
            match unsafe { driver::event::elapsed(start, end) } {
                Ok(ms) => {
                    let t = self.totals.entry(name).or_default();
                    t.calls += 1;
                    t.ms += f64::from(ms);
                }
                Err(e) => self.fail(format!("cuEventElapsedTime: {e:?}")),
            }
            // SAFETY: each event is destroyed once, after it is read.
            unsafe {
                let _ = driver::event::destroy(start);
                let _ = driver::event::destroy(end);
            }
        }
    }

    /// Reads what is left and appends the report; the context must be
    /// current.
    pub fn finish(&mut self) {
        self.resolve();
        let line = report(&self.totals, self.failed.as_deref());
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.file)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = written {
            tracing::warn!(file = %self.file.display(), error = %e, "cannot write the kernel times");
        }
    }
}

/// A new event recorded on `stream`.
fn record(stream: sys::CUstream) -> Result<sys::CUevent, String> {
    let event = driver::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
        .map_err(|e| format!("cuEventCreate: {e:?}"))?;
    // SAFETY: the event was just created in the current context.
    unsafe { driver::event::record(event, stream) }.map_err(|e| {
        // SAFETY: created above, destroyed once.
        let _ = unsafe { driver::event::destroy(event) };
        format!("cuEventRecord: {e:?}")
    })?;
    Ok(event)
}

/// A launch's name in the report: the kernel and its size.
pub fn launch_name(l: &Launch) -> String {
    match l.grid {
        Grid::Elements(n) => format!("{} ({n} elements)", l.kernel),
        Grid::Rows(n) => format!("{} ({n} rows)", l.kernel),
    }
}

/// A product's name in the report: its shape, batch and types.
pub fn gemm_name(g: &GemmEx) -> String {
    let batch = if g.batch > 1 {
        format!(" x {}", g.batch)
    } else {
        String::new()
    };
    format!(
        "GemmEx {}{} {}x{}x{}{batch} {:?}/{:?}->{:?}",
        if g.transa { "T" } else { "N" },
        if g.transb { "T" } else { "N" },
        g.m,
        g.n,
        g.k,
        g.a.dtype,
        g.b.dtype,
        g.c.dtype
    )
}

/// The JSON line: every kind of call, longest first, and the sums.
fn report(totals: &BTreeMap<String, Total>, failed: Option<&str>) -> String {
    let mut rows: Vec<(&String, &Total)> = totals.iter().collect();
    rows.sort_by(|a, b| b.1.ms.total_cmp(&a.1.ms).then(a.0.cmp(b.0)));
    let sum = |gemm: bool| -> f64 {
        rows.iter()
            .filter(|(n, _)| n.starts_with("GemmEx") == gemm)
            .map(|(_, t)| t.ms)
            .sum()
    };
    let calls: Vec<serde_json::Value> = rows
        .iter()
        .map(|(name, t)| serde_json::json!({"call": name, "calls": t.calls, "ms": t.ms}))
        .collect();
    serde_json::json!({
        "gemm_ms": sum(true),
        "kernel_ms": sum(false),
        "failed": failed,
        "calls": calls,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_puts_the_longest_calls_first_and_sums_each_side() {
        let mut totals = BTreeMap::new();
        totals.insert("softmax (8 rows)".to_string(), Total { calls: 2, ms: 1.5 });
        totals.insert("GemmEx NN 2x2x2".to_string(), Total { calls: 1, ms: 4.0 });
        totals.insert("fill (4 elements)".to_string(), Total { calls: 3, ms: 0.5 });
        let v: serde_json::Value = serde_json::from_str(&report(&totals, None)).unwrap();
        assert_eq!(v["gemm_ms"], 4.0);
        assert_eq!(v["kernel_ms"], 2.0);
        let names: Vec<&str> = v["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["call"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["GemmEx NN 2x2x2", "softmax (8 rows)", "fill (4 elements)"]
        );
        assert_eq!(v["calls"][1]["calls"], 2);
    }
}
