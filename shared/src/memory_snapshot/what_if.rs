//! A what-if as the command line and the page write it: `key=value` pairs
//! of `restart` settings.

use super::SnapshotError;
use crate::framework::RestartSettings;

/// Reads a what-if as the command line writes it: `key=value` pairs of
/// `restart` settings, comma-separated (`expandable_segments=true,
/// max_split_size_mb=128`, `gpu=a100-40gb`). A value is JSON when it reads
/// as JSON, else a string.
pub fn parse_what_if(text: &str) -> Result<RestartSettings, SnapshotError> {
    let mut fields = serde_json::Map::new();
    for pair in split_pairs(text) {
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            SnapshotError(format!(
                "'{pair}' is not key=value (for example expandable_segments=true)"
            ))
        })?;
        let value = serde_json::from_str(value.trim())
            .unwrap_or_else(|_| serde_json::Value::String(value.trim().to_string()));
        fields.insert(key.trim().to_string(), value);
    }
    serde_json::from_value(serde_json::Value::Object(fields))
        .map_err(|e| SnapshotError(format!("what if '{text}': {e}")))
}

/// Splits at commas outside brackets (`roundup_power2_divisions=[256:1,>:8]`
/// stays whole).
fn split_pairs(text: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}
