//! `vramlab diff A B`: two PyTorch memory snapshots compared at their
//! peaks of allocated memory, the difference attributed to the frames
//! that allocated it.

use crate::cli::DiffArgs;
use std::io::Write;
use std::process::ExitCode;
use vramlab_shared::torch_snapshot::diff::{diff, diff_lines};
use vramlab_shared::torch_snapshot::replay::default_device;
use vramlab_shared::torch_snapshot::MemorySnapshot;

/// Reads both files and prints the comparison.
pub fn diff_files(args: &DiffArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let read = |path: &std::path::Path| -> anyhow::Result<(MemorySnapshot, usize)> {
        let snapshot = crate::replay::read_snapshot_file(path)?;
        let device = args
            .cuda_device
            .unwrap_or_else(|| default_device(&snapshot));
        Ok((snapshot, device))
    };
    let (a, b) = (read(&args.a)?, read(&args.b)?);
    let d = diff((&a.0, a.1), (&b.0, b.1))?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&d)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let (a_name, b_name) = (args.a.display().to_string(), args.b.display().to_string());
    for line in diff_lines(&d, &a_name, &b_name) {
        writeln!(out, "{line}")?;
    }
    Ok(ExitCode::SUCCESS)
}
