//! `vramlab replay`: a real PyTorch memory snapshot replayed exactly as
//! recorded (checked event by event) and under other settings, with a
//! summary or, with `--json`, one record per event and the outcome; with
//! `--fix`, the settings that would have avoided its out-of-memory; with
//! `--events I..J`, a window of the trace as a recording of its own.

use crate::cli::ReplayArgs;
use std::io::Write;
use std::process::ExitCode;
use vramlab_shared::framework::RestartSettings;
use vramlab_shared::torch_snapshot::fix::{self, fix_lines, search_fix, FixReport};
use vramlab_shared::torch_snapshot::pools::DEFAULT_POOL;
use vramlab_shared::torch_snapshot::replay::{
    default_device, export_what_if, recorded_ooms, replay_exact, replay_what_if, ReplayRun,
};
use vramlab_shared::torch_snapshot::what_if::parse_what_if;
use vramlab_shared::torch_snapshot::window::{around_peak, window};
use vramlab_shared::torch_snapshot::{self, MemorySnapshot};
use vramlab_shared::units::format_size;

/// Reads a snapshot file, refusing one over the size read before reading it.
pub fn read_snapshot_file(path: &std::path::Path) -> anyhow::Result<MemorySnapshot> {
    let cannot = |e: std::io::Error| anyhow::anyhow!("cannot read {}: {e}", path.display());
    let len = std::fs::metadata(path).map_err(cannot)?.len();
    let within = |e: torch_snapshot::SnapshotError| anyhow::anyhow!("{}: {e}", path.display());
    torch_snapshot::check_size(usize::try_from(len).unwrap_or(usize::MAX)).map_err(within)?;
    let bytes = std::fs::read(path).map_err(cannot)?;
    torch_snapshot::read(&bytes).map_err(within)
}

/// Replays the file; exit status 1 when the exact replay differs from the
/// recording.
pub fn replay_file(args: &ReplayArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let snapshot = read_snapshot_file(&args.file)?;
    let device = args
        .cuda_device
        .unwrap_or_else(|| default_device(&snapshot));
    if device >= snapshot.device_traces.len().max(1) {
        anyhow::bail!("the snapshot has no trace for CUDA device {device}");
    }
    let range = match (&args.events, args.around_peak) {
        (Some(range), _) => Some(range.clone()),
        (None, Some(n)) => {
            let (range, peak) = around_peak(&snapshot, device, n)?;
            if !args.json {
                let end = range.end.min(snapshot.trace(device).len());
                writeln!(
                    out,
                    "events {}..{end}, around the peak of allocated memory at event {peak}",
                    range.start
                )?;
            }
            Some(range)
        }
        (None, None) => None,
    };
    let snapshot = match range {
        Some(range) => window(&snapshot, device, range)?,
        None => snapshot,
    };
    let exact = replay_exact(&snapshot, device);
    // A recording that ran out of memory is asked "what if" in the room
    // its process had, as the fix searches, unless a card or size is named.
    let room = (exact.as_ref().ok()).and_then(|run| fix::room(&snapshot, device, run));
    let what_ifs: Vec<(String, RestartSettings)> = (what_ifs(args)?.into_iter())
        .map(|(label, w)| (label, room.map_or(w.clone(), |r| fix::in_the_room(w, r))))
        .collect();
    let mut runs = Vec::new();
    for (label, what_if) in &what_ifs {
        runs.push((label.clone(), replay_what_if(&snapshot, device, what_if)?));
    }
    if let Some(path) = &args.export_snapshot {
        match what_ifs.last() {
            Some((_, last)) => write_snapshot_file(&export_what_if(&snapshot, device, last)?, path)?,
            None if range_asked(args) => write_snapshot_file(&snapshot, path)?,
            None => anyhow::bail!(
                "--export-snapshot writes a what-if run or a window: add --what-if, --gpu, --events or --around-peak"
            ),
        }
    }
    let fix = match args.fix {
        true => Some(search_fix(&snapshot, device)?),
        false => None,
    };
    if args.json {
        write_json(out, &snapshot, device, &exact, &runs, fix.as_ref())?;
    } else {
        write_summary(out, &snapshot, device, &exact, &runs)?;
        if let Some(fix) = &fix {
            write_fix(out, fix.as_ref())?;
        }
    }
    Ok(match &exact {
        Ok(run) if run.exact == Some(false) => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    })
}

/// Whether a window of the trace was asked for.
fn range_asked(args: &ReplayArgs) -> bool {
    args.events.is_some() || args.around_peak.is_some()
}

/// Writes a snapshot: JSON for a `.json` name, else the pickle
/// `torch.cuda.memory._dump_snapshot()` writes.
/// Streamed (what it holds beside the snapshot is a buffer) and atomic
/// (the file is whole or as it was).
pub fn write_snapshot_file(
    snapshot: &MemorySnapshot,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let json = path.extension().is_some_and(|e| e == "json");
    crate::atomic::write_atomically(path, |w| match json {
        true => serde_json::to_writer(w, snapshot).map_err(std::io::Error::other),
        false => torch_snapshot::write_pickle_to(snapshot, w),
    })
}

/// Each `--what-if`, with `--gpu` added; `--gpu` alone is one run.
fn what_ifs(args: &ReplayArgs) -> anyhow::Result<Vec<(String, RestartSettings)>> {
    let mut texts = args.what_if.clone();
    if texts.is_empty() && args.gpu.is_some() {
        texts.push(String::new());
    }
    texts
        .into_iter()
        .map(|text| {
            let full = match &args.gpu {
                Some(gpu) if text.is_empty() => format!("gpu={gpu}"),
                Some(gpu) => format!("{text},gpu={gpu}"),
                None => text,
            };
            Ok((full.clone(), parse_what_if(&full)?))
        })
        .collect()
}

fn write_summary(
    out: &mut impl Write,
    snapshot: &MemorySnapshot,
    device: usize,
    exact: &Result<ReplayRun, torch_snapshot::SnapshotError>,
    runs: &[(String, ReplayRun)],
) -> anyhow::Result<()> {
    let events = snapshot.trace(device).len();
    writeln!(
        out,
        "CUDA device {device}: {events} trace events, {} segments at the dump",
        snapshot
            .segments
            .iter()
            .filter(|s| s.device as usize == device)
            .count()
    )?;
    if let Some(devices) = devices(snapshot) {
        writeln!(out, "  traced devices (--cuda-device): {devices}")?;
    }
    if let Some(pools) = private_pools(snapshot, device) {
        writeln!(out, "  CUDA graphs' private pools at the dump: {pools}")?;
    }
    match exact {
        Ok(run) => {
            let verdict = match &run.first_difference {
                None => "exact: every segment_alloc, segment_free and block placement as recorded"
                    .to_string(),
                Some(d) => format!(
                    "differs first at event {}: the trace has {}; the replay made {}",
                    d.event, d.trace, d.engine
                ),
            };
            writeln!(out, "exact replay: {verdict}")?;
            writeln!(out, "  {}", figures(run))?;
            if run.recorded_ooms > 0 {
                writeln!(
                    out,
                    "  the recording shows {} out-of-memory error(s)",
                    run.recorded_ooms
                )?;
            }
        }
        Err(e) => writeln!(out, "exact replay: not possible: {e}")?,
    }
    for (label, run) in runs {
        writeln!(out, "what if {label}:")?;
        writeln!(out, "  {}", figures(run))?;
        match run.ooms.first() {
            None => writeln!(out, "  no out-of-memory error")?,
            Some(oom) => writeln!(
                out,
                "  {} out-of-memory error(s), the first at event {}: {}",
                run.ooms.len(),
                oom.event,
                oom.message
            )?,
        }
    }
    Ok(())
}

/// The devices with events, when there are several: "0 (6445 events), 1
/// (596 events, 1 out-of-memory), …".
fn devices(snapshot: &MemorySnapshot) -> Option<String> {
    let device = |d: usize| {
        let events = snapshot.trace(d).len();
        match recorded_ooms(snapshot, d) {
            0 => format!("{d} ({events} events)"),
            n => format!("{d} ({events} events, {n} out-of-memory)"),
        }
    };
    let traced: Vec<String> = (0..snapshot.device_traces.len())
        .filter(|&d| !snapshot.trace(d).is_empty())
        .map(device)
        .collect();
    (traced.len() > 1).then(|| traced.join(", "))
}

/// Each CUDA graph private pool `device` holds at the dump: its id, its
/// segments and their bytes, reserved and allocated.
fn private_pools(snapshot: &MemorySnapshot, device: usize) -> Option<String> {
    let mut pools: Vec<((u64, u64), usize, u64, u64)> = Vec::new();
    let segments = (snapshot.segments.iter())
        .filter(|s| s.device as usize == device && s.segment_pool_id != DEFAULT_POOL);
    for s in segments {
        match pools.iter_mut().find(|p| p.0 == s.segment_pool_id) {
            Some(p) => (p.1, p.2, p.3) = (p.1 + 1, p.2 + s.total_size, p.3 + s.allocated_size),
            None => pools.push((s.segment_pool_id, 1, s.total_size, s.allocated_size)),
        }
    }
    let text: Vec<String> = (pools.iter())
        .map(|&((a, b), n, reserved, allocated)| {
            format!(
                "({a}, {b}): {n} segments, {} reserved, {} allocated",
                format_size(reserved),
                format_size(allocated)
            )
        })
        .collect();
    (!text.is_empty()).then(|| text.join("; "))
}

fn figures(run: &ReplayRun) -> String {
    format!(
        "peak reserved {}, peak allocated {}, reserved but unallocated {} {}",
        format_size(run.peak_reserved_bytes),
        format_size(run.peak_allocated_bytes),
        run.fragmentation.moment(),
        format_size(run.fragmentation.bytes)
    )
}

fn write_json(
    out: &mut impl Write,
    snapshot: &MemorySnapshot,
    device: usize,
    exact: &Result<ReplayRun, torch_snapshot::SnapshotError>,
    runs: &[(String, ReplayRun)],
    fix: Option<&Option<FixReport>>,
) -> anyhow::Result<()> {
    let trace = snapshot.trace(device);
    if let Ok(run) = exact {
        for (e, point) in trace.iter().zip(&run.timeline) {
            let record = serde_json::json!({
                "event": point.event,
                "action": e.action.name(),
                "addr": e.addr,
                "size": e.size,
                "stream": e.stream,
                "allocated_bytes": point.allocated_bytes,
                "reserved_bytes": point.reserved_bytes,
            });
            writeln!(out, "{record}")?;
        }
    }
    let outcome = |run: &ReplayRun| {
        serde_json::json!({
            "peak_reserved_bytes": run.peak_reserved_bytes,
            "peak_allocated_bytes": run.peak_allocated_bytes,
            "fragmentation": run.fragmentation,
            "ooms": run.ooms,
        })
    };
    let what_if: Vec<_> = runs
        .iter()
        .map(|(l, r)| serde_json::json!({"settings": l, "replay": outcome(r)}))
        .collect();
    let mut last = serde_json::json!({
        "exact": false,
        "events": trace.len(),
        "first_difference": null,
        "what_if": what_if,
    });
    match exact {
        Ok(run) => {
            last["exact"] = (run.exact == Some(true)).into();
            last["first_difference"] = serde_json::to_value(&run.first_difference)?;
            last["recorded_ooms"] = run.recorded_ooms.into();
            last["replay"] = outcome(run);
        }
        Err(e) => last["error"] = e.to_string().into(),
    }
    if let Some(fix) = fix {
        last["fix"] = serde_json::to_value(fix)?;
    }
    writeln!(out, "{last}")?;
    Ok(())
}

/// `--fix`: the settings that run the recording through its first
/// out-of-memory, or the shortfall and who held the memory.
fn write_fix(out: &mut impl Write, fix: Option<&FixReport>) -> anyhow::Result<()> {
    if let Some(f) = fix {
        writeln!(out, "{}\n", f.headline())?;
    }
    for line in fix_lines(fix) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}
