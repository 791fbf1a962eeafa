//! `vramlab diff A B`: two PyTorch memory snapshots compared at their
//! peaks of allocated memory, the difference attributed to the frames
//! that allocated it.

use crate::cli::DiffArgs;
use std::io::Write;
use std::process::ExitCode;
use vramlab_shared::torch_snapshot::diff::{diff, FrameDelta};
use vramlab_shared::torch_snapshot::replay::default_device;
use vramlab_shared::torch_snapshot::MemorySnapshot;
use vramlab_shared::units::format_size;

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
    for (name, path, peak) in [("A", &args.a, &d.a), ("B", &args.b, &d.b)] {
        writeln!(
            out,
            "{name}: {}: peak allocated {} after event {} of {} (reserved {})",
            path.display(),
            format_size(peak.allocated_bytes),
            peak.event,
            peak.events,
            format_size(peak.reserved_bytes)
        )?;
    }
    let delta = d.peak_delta();
    if delta == 0 {
        writeln!(out, "the peaks are equal")?;
    } else {
        writeln!(
            out,
            "B's peak is {} {}; {:.0}% of it is in:",
            format_size(delta.unsigned_abs()),
            if delta > 0 { "higher" } else { "lower" },
            100.0 * d.explained()
        )?;
        for f in &d.explaining {
            writeln!(out, "  {}", line(f))?;
        }
    }
    let one_sided: Vec<&FrameDelta> = (d.all.iter())
        .filter(|f| f.a_bytes == 0 || f.b_bytes == 0)
        .collect();
    if !one_sided.is_empty() {
        writeln!(out, "alive at one peak only:")?;
        for f in one_sided {
            let side = if f.a_bytes == 0 { "B" } else { "A" };
            let bytes = f.a_bytes.max(f.b_bytes);
            writeln!(out, "  {side} only: {}  {}", format_size(bytes), f.frame)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `+512.00 MiB  frame (A 256.00 MiB, B 768.00 MiB)`.
fn line(f: &FrameDelta) -> String {
    let sign = if f.delta() >= 0 { '+' } else { '-' };
    format!(
        "{sign}{}  {} (A {}, B {})",
        format_size(f.delta().unsigned_abs()),
        f.frame,
        format_size(f.a_bytes),
        format_size(f.b_bytes)
    )
}
