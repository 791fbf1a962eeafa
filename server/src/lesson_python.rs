//! `vramlab lesson-python`: a lesson's steps as the Python that does them,
//! one file per kernel (a restart in the lesson starts the next), each run
//! by `vramlab python --settings` with its restart's settings. The page's
//! "as Python in the cell" opens the same files (`tests/lessons/*.kN.py`,
//! written by this command and held to it by a test).

use crate::cli::LessonPythonArgs;
use std::io::Write;
use std::process::ExitCode;
use vramlab_shared::command::parse_line;
use vramlab_shared::lesson::cell::{lesson_cells, LessonCell};
use vramlab_shared::types::Framework;

/// The lesson's kernels as cells.
pub fn cells_of(text: &str) -> Vec<LessonCell> {
    let lines: Vec<_> = (text.lines())
        .filter(|l| !l.trim().is_empty())
        .map(parse_line)
        .collect();
    lesson_cells(&lines, Framework::Pytorch)
}

/// The file kernel `k` (from 1) of the lesson `stem` is written to.
pub fn file_name(stem: &str, k: usize) -> String {
    format!("{stem}.k{k}.py")
}

pub fn lesson_python(args: &LessonPythonArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.file.display()))?;
    let stem =
        (args.file.file_stem()).map_or("lesson".into(), |s| s.to_string_lossy().into_owned());
    for (i, cell) in cells_of(&text).iter().enumerate() {
        let settings = serde_json::to_string(&cell.settings)?;
        let name = file_name(&stem, i + 1);
        let run = format!("vramlab python --settings '{settings}' {name}");
        match &args.out {
            Some(dir) => {
                let path = dir.join(&name);
                std::fs::write(&path, &cell.code)
                    .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
                writeln!(
                    out,
                    "{}  (steps {}-{}): {run}",
                    path.display(),
                    cell.steps.start + 1,
                    cell.steps.end
                )?;
            }
            None => {
                writeln!(
                    out,
                    "# ---- {name}, steps {}-{}: {run}",
                    cell.steps.start + 1,
                    cell.steps.end
                )?;
                write!(out, "{}", cell.code)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
