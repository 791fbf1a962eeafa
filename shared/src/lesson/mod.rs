//! Lessons: command files whose lines carry what the learner should see.
//!
//! A lesson is JSON Lines: each line a command, optionally with `say` (what
//! to do), `why` (the explanation) and `expect` (the observation). The same
//! files are played by the tests, by `vramlab run` and by the lesson panel.
//!
//! `expect` maps stat names to exact values (`categories.<name>` for a
//! category), and may also name `ok`, `error_kind`, `error_contains`,
//! `note_contains`, and `value.<key>` for what a command returns.

pub mod cell;
pub mod predict;

use crate::command::parse_line;
use crate::protocol::StepRecord;
use serde_json::Value;

/// One step's expectations that did not hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub step: u64,
    pub key: String,
    pub expected: String,
    pub actual: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {}: {} expected {} but was {}",
            self.step, self.key, self.expected, self.actual
        )
    }
}

/// Checks a step's record against the `expect` object of its line.
pub fn check_step(expect: &serde_json::Map<String, Value>, record: &StepRecord) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let mut miss = |key: &str, expected: String, actual: String| {
        out.push(Mismatch {
            step: record.step,
            key: key.to_string(),
            expected,
            actual,
        })
    };
    for (key, want) in expect {
        match key.as_str() {
            "ok" => {
                if want.as_bool() != Some(record.ok) {
                    miss(key, want.to_string(), record.ok.to_string());
                }
            }
            "error_kind" => {
                let actual = record
                    .error
                    .as_ref()
                    .map(|e| serde_json::to_value(e.kind).unwrap_or(Value::Null))
                    .unwrap_or(Value::Null);
                if &actual != want {
                    miss(key, want.to_string(), actual.to_string());
                }
            }
            "error_contains" | "note_contains" => {
                let text = if key == "error_contains" {
                    record.error.as_ref().map(|e| e.message.as_str())
                } else {
                    record.note.as_deref()
                }
                .unwrap_or("");
                let needle = want.as_str().unwrap_or("");
                if !text.contains(needle) {
                    miss(key, format!("{needle:?}"), format!("{text:?}"));
                }
            }
            value if value.starts_with("value.") => {
                let actual = record.value.as_ref().and_then(|v| {
                    value["value.".len()..]
                        .split('.')
                        .try_fold(v, |v, k| v.get(k))
                });
                if actual != Some(want) {
                    miss(
                        key,
                        want.to_string(),
                        actual.map_or("nothing".into(), ToString::to_string),
                    );
                }
            }
            stat => match (record.stats.get(stat), want.as_u64()) {
                (Some(actual), Some(expected)) if actual == expected => {}
                (Some(actual), _) => miss(stat, want.to_string(), actual.to_string()),
                (None, _) => miss(stat, want.to_string(), "no such stat".into()),
            },
        }
    }
    out
}

/// Plays a lesson's lines through `run` (one record per non-empty line)
/// and checks every expectation. Returns how many expectations were checked.
pub fn check_lesson(
    text: &str,
    mut run: impl FnMut(&str) -> StepRecord,
) -> Result<usize, Vec<Mismatch>> {
    let mut checked = 0;
    let mut mismatches = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let parsed = parse_line(line);
        let record = run(line);
        if let Some(expect) = parsed.annotations.expect {
            let map: serde_json::Map<String, Value> = expect.into_iter().collect();
            checked += map.len();
            mismatches.extend(check_step(&map, &record));
        }
    }
    if mismatches.is_empty() {
        Ok(checked)
    } else {
        Err(mismatches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Engine;

    #[test]
    fn a_lesson_checks_and_reports_mismatches() {
        let good = r#"{"cmd":"alloc","name":"x","bytes":1,"expect":{"allocated_bytes":512,"reserved_bytes":2097152,"ok":true}}
{"cmd":"del","name":"y","expect":{"ok":false,"error_kind":"name_error","error_contains":"'y'"}}"#;
        let mut e = Engine::new_simulated();
        assert_eq!(check_lesson(good, |l| e.run_line(l)), Ok(6));
        let bad = r#"{"cmd":"alloc","name":"x","bytes":1,"expect":{"allocated_bytes":1}}"#;
        let mut e = Engine::new_simulated();
        let err = check_lesson(bad, |l| e.run_line(l)).unwrap_err();
        assert_eq!(
            err[0].to_string(),
            "step 0: allocated_bytes expected 1 but was 512"
        );
    }
}
