//! A lesson as code for the code cell: one cell per kernel (each restart
//! in the lesson starts a new process, as a notebook's "Restart kernel"
//! does), with the restart's settings to start it with, every step's
//! Python as the cell runs it, its words as comments, and a step the
//! lesson expects to fail inside the `try`/`except` a program writes
//! around it (the framework's own out-of-memory error).

use crate::command::{Command, CommandLine, RestartSettings};
use crate::python::{append_to_cell as append, cell_code, imports};
use crate::types::Framework;
use std::ops::Range;

/// One kernel's steps as cell code.
#[derive(Clone, Debug, PartialEq)]
pub struct LessonCell {
    /// The lesson's restart that starts this kernel (all settings it
    /// names; the framework always).
    pub settings: RestartSettings,
    pub code: String,
    /// The lesson's steps this cell holds, its restart included.
    pub steps: Range<usize>,
}

/// The exception a framework raises when the GPU is out of memory.
fn oom_error(framework: Framework) -> &'static str {
    match framework {
        Framework::Pytorch => "torch.cuda.OutOfMemoryError",
        Framework::Tensorflow => "tf.errors.ResourceExhaustedError",
        Framework::Jax => "jax.errors.JaxRuntimeError",
    }
}

/// The exception a step the lesson expects to fail raises: Python's
/// `ValueError` for a value refused (vLLM's refusals), else the
/// framework's out-of-memory error.
fn expected_error(line: &CommandLine, framework: Framework) -> &'static str {
    let kind = line
        .annotations
        .expect
        .as_ref()
        .and_then(|e| e.get("error_kind"));
    match kind.and_then(|k| k.as_str()) {
        Some("invalid_value") => "ValueError",
        _ => oom_error(framework),
    }
}

/// Whether the lesson expects this step to fail.
fn fails(line: &CommandLine) -> bool {
    let expect = line.annotations.expect.as_ref();
    expect.is_some_and(|e| e.get("ok").and_then(|v| v.as_bool()) == Some(false))
}

/// `text` as comment lines.
fn comment(text: &str) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut out = String::new();
    let mut line = String::from("#");
    for w in words {
        if line.len() + w.len() + 1 > 88 && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(w);
    }
    if line.len() > 1 {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// One step's code: its words (unless they are the code), then the code
/// as appended to `cell`, inside `try` when the lesson expects it to fail;
/// the exception is kept, as a notebook keeps the last one
/// (`sys.last_value`), until a later step `del`s it.
fn step_code(cell: &str, line: &CommandLine, command: &Command, framework: Framework) -> String {
    let code = append(cell, command, framework);
    let mut out = String::new();
    let quotes = |s: &str| s.trim().replace('\'', "\"");
    if let Some(say) = &line.annotations.say {
        if quotes(say) != quotes(&cell_code(command, framework)) {
            out.push_str(&comment(say));
        }
    }
    if fails(line) {
        let body: Vec<String> = code.lines().map(|l| format!("    {l}")).collect();
        out.push_str(&format!(
            "try:\n{}\nexcept {} as e:\n    print(type(e).__name__, e)\n    last_exception = e\n",
            body.join("\n"),
            expected_error(line, framework)
        ));
    } else {
        out.push_str(&code);
        out.push('\n');
    }
    // What it shows, after it.
    if let Some(why) = &line.annotations.why {
        out.push_str(&comment(&format!("→ {why}")));
    }
    out
}

/// The lesson's steps as cells: a new one at each restart (the first
/// line of every lesson is one). `framework` is the session's, for a
/// lesson whose first restart names none.
pub fn lesson_cells(lines: &[CommandLine], framework: Framework) -> Vec<LessonCell> {
    let mut cells: Vec<LessonCell> = Vec::new();
    let mut settings = RestartSettings {
        framework: Some(framework),
        ..Default::default()
    };
    for (i, line) in lines.iter().enumerate() {
        let Ok(command) = &line.command else { continue };
        if let Command::Restart(s) = command {
            settings = merged(&settings, s);
            let fw = settings.framework.unwrap_or(framework);
            let mut code = comment(line.annotations.say.as_deref().unwrap_or(""));
            let json = serde_json::to_string(&settings).unwrap_or_default();
            code.push_str(&format!("# vramlab python --settings '{json}'\n"));
            code.push_str(imports(fw));
            cells.push(LessonCell {
                settings: settings.clone(),
                code,
                steps: i..i + 1,
            });
            continue;
        }
        if cells.is_empty() {
            cells.push(LessonCell {
                settings: settings.clone(),
                code: imports(framework).to_string(),
                steps: i..i,
            });
        }
        let cell = cells.last_mut().expect("one made above");
        let fw = cell.settings.framework.unwrap_or(framework);
        let code = step_code(&cell.code, line, command, fw);
        cell.code.push('\n');
        cell.code.push_str(&code);
        cell.steps.end = i + 1;
    }
    cells
}

/// A restart's settings over the kernel's before it: a lesson's later
/// restart names only what it changes (as the engine's restart does).
fn merged(before: &RestartSettings, restart: &RestartSettings) -> RestartSettings {
    let mut all = serde_json::Map::new();
    for settings in [before, restart] {
        if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(settings) {
            all.extend(fields);
        }
    }
    all.insert("cmd".into(), "restart".into());
    match crate::command::parse_line(&serde_json::Value::Object(all).to_string()).command {
        Ok(Command::Restart(s)) => s,
        _ => restart.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::parse_line;

    fn cells(text: &str) -> Vec<LessonCell> {
        let lines: Vec<_> = text.lines().map(parse_line).collect();
        lesson_cells(&lines, Framework::Pytorch)
    }

    /// One cell per kernel, each with the settings its restart left (a
    /// later restart names only what it changes); a step the lesson
    /// expects to fail inside `try`, its exception kept.
    #[test]
    fn a_lesson_is_a_cell_per_kernel() {
        let lesson = r#"{"cmd":"restart","framework":"pytorch","device_total_bytes":1073741824,"say":"Start on a 1 GiB GPU."}
{"cmd":"alloc","name":"big","bytes":2147483648,"say":"A tensor too big","expect":{"ok":false}}
{"cmd":"restart","expandable_segments":true,"say":"Again, expandable."}
{"cmd":"alloc","name":"a","bytes":1048576}"#;
        let c = cells(lesson);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].steps.clone(), c[1].steps.clone()), (0..2, 2..4));
        assert_eq!(c[0].settings.device_total_bytes, Some(1 << 30));
        assert_eq!(c[1].settings.device_total_bytes, Some(1 << 30));
        assert_eq!(c[1].settings.expandable_segments, Some(true));
        assert_eq!(
            c[0].code,
            "# Start on a 1 GiB GPU.\n# vramlab python --settings '{\"framework\":\"pytorch\",\"device_total_bytes\":1073741824}'\nimport torch\nfrom torch import nn\nfrom torch.utils.data import TensorDataset\n\n# A tensor too big\ntry:\n    big = torch.empty(2048 * 2**20, dtype=torch.uint8, device=\"cuda\")\nexcept torch.cuda.OutOfMemoryError as e:\n    print(type(e).__name__, e)\n    last_exception = e\n"
        );
        assert!(c[1]
            .code
            .ends_with("\na = torch.empty(1 * 2**20, dtype=torch.uint8, device=\"cuda\")\n"));
    }
}
