//! `vramlab run`: executes a command file on a fresh kernel and prints one
//! JSON line per command. It never stops at an error: an OOM is part of a
//! lesson.

use std::io::{BufRead, Write};
use vramlab_backend::Backend;
use vramlab_shared::command::parse_line;
use vramlab_shared::lesson::check_step;
use vramlab_shared::torch_snapshot;

/// What a run found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RunSummary {
    pub steps: u64,
    pub errors: u64,
    /// Lesson expectations that did not hold (with `check`).
    pub mismatches: Vec<String>,
}

/// The events an exported snapshot keeps, as many as
/// `torch.cuda.memory._record_memory_history(max_entries=1000000)` would.
const EXPORT_EVENTS: usize = 1_000_000;

pub struct RunOptions {
    pub check: bool,
    pub snapshot: bool,
    /// Write the session as a PyTorch memory snapshot here at the end.
    pub export_snapshot: Option<std::path::PathBuf>,
}

/// Reads commands from `input` until its end, writing one record per
/// non-empty line to `output` (flushed line by line, so a pipe sees each
/// result at once).
pub fn run(
    backend: &Backend,
    input: impl BufRead,
    mut output: impl Write,
    options: &RunOptions,
) -> anyhow::Result<RunSummary> {
    let mut engine = backend.engine()?;
    if options.export_snapshot.is_some() {
        engine.set_event_capacity(EXPORT_EVENTS);
    }
    let mut summary = RunSummary::default();
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let record = engine.run_line(&line);
        summary.steps += 1;
        if !record.ok {
            summary.errors += 1;
        }
        if options.check {
            if let Some(expect) = parse_line(&line).annotations.expect {
                let expect = expect.into_iter().collect();
                summary
                    .mismatches
                    .extend(check_step(&expect, &record).iter().map(ToString::to_string));
            }
        }
        serde_json::to_writer(&mut output, &record)?;
        output.write_all(b"\n")?;
        output.flush()?;
    }
    if options.snapshot {
        serde_json::to_writer(&mut output, &engine.snapshot(usize::MAX))?;
        output.write_all(b"\n")?;
        output.flush()?;
    }
    if let Some(path) = &options.export_snapshot {
        let expandable = engine.settings().expandable_segments;
        export(&engine.snapshot(usize::MAX), expandable, path)?;
    }
    Ok(summary)
}

/// Writes a session as a memory snapshot (its allocator's ranges mapped
/// and unmapped when it ran with expandable segments).
fn export(
    snapshot: &vramlab_shared::snapshot::Snapshot,
    expandable: bool,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let mut exported = torch_snapshot::export::from_session(snapshot);
    if expandable {
        exported = torch_snapshot::export::with_expandable_segments(exported);
    }
    crate::replay::write_snapshot_file(&exported, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramlab_backend::{select, DeviceChoice};
    use vramlab_shared::StepRecord;

    fn run_text(text: &str, check: bool) -> (Vec<StepRecord>, RunSummary) {
        let backend = select(DeviceChoice::Sim, 0).unwrap();
        let mut out = Vec::new();
        let summary = run(
            &backend,
            text.as_bytes(),
            &mut out,
            &RunOptions {
                check,
                snapshot: false,
                export_snapshot: None,
            },
        )
        .unwrap();
        let records = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (records, summary)
    }

    #[test]
    fn one_line_per_command_and_errors_do_not_stop_the_run() {
        let (records, summary) = run_text(
            "{\"cmd\":\"alloc\",\"name\":\"x\",\"bytes\":1}\n\n{oops\n{\"cmd\":\"del\",\"name\":\"x\"}\n",
            false,
        );
        assert_eq!(records.len(), 3);
        assert_eq!(summary.errors, 1);
        assert_eq!(records[1].step, 1);
        assert_eq!(records[1].cmd, serde_json::json!("{oops"));
        assert!(records[2].ok);
        assert_eq!(records[2].stats.allocated_bytes, 0);
    }

    #[test]
    fn check_reports_mismatches() {
        let (_, summary) = run_text(
            "{\"cmd\":\"alloc\",\"name\":\"x\",\"bytes\":1,\"expect\":{\"allocated_bytes\":1}}\n",
            true,
        );
        assert_eq!(
            summary.mismatches,
            vec!["step 0: allocated_bytes expected 1 but was 512".to_string()]
        );
    }
}
