//! Writes a synthetic PyTorch memory snapshot of about `MB` megabytes (the
//! benchmark's recording, made longer), to measure `vramlab replay` on
//! files of any size:
//!
//! `cargo run --release -p vramlab-shared --example synthetic_snapshot -- 1024 big.pickle`

#[path = "../benches/common/mod.rs"]
mod common;

use vramlab_shared::torch_snapshot;

/// The pickle's bytes an event takes (measured on the benchmark's file).
const BYTES_PER_EVENT: usize = 220;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(mb), Some(path)) = (
        args.first().and_then(|a| a.parse::<usize>().ok()),
        args.get(1),
    ) else {
        eprintln!("usage: synthetic_snapshot MB FILE");
        std::process::exit(2);
    };
    let snapshot = common::recording((mb << 20) / BYTES_PER_EVENT);
    let bytes = torch_snapshot::write_pickle(&snapshot);
    std::fs::write(path, &bytes).expect("the file is written");
    eprintln!(
        "{path}: {} bytes, {} events",
        bytes.len(),
        snapshot.device_traces[0].len()
    );
}
