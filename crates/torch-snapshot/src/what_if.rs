//! A what-if as the command line and the page write it: `key=value` pairs
//! of `restart` settings.

use super::replay::uses_expandable_segments;
use super::{MemorySnapshot, SnapshotError};
use vramlab_device::framework::{RestartSettings, RESTART_FIELDS};

/// Reads a what-if as the command line writes it: `key=value` pairs of
/// `restart` settings, comma-separated (`expandable_segments=true,
/// max_split_size_mb=128`, `gpu=a100-40gb`). A value is JSON when it reads
/// as JSON, else a string.
pub fn parse_what_if(text: &str) -> Result<RestartSettings, SnapshotError> {
    let mut fields = serde_json::Map::new();
    for pair in split_pairs(text) {
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            SnapshotError::Settings(format!(
                "'{pair}' is not key=value (for example expandable_segments=true)"
            ))
        })?;
        let value = serde_json::from_str(value.trim())
            .unwrap_or_else(|_| serde_json::Value::String(value.trim().to_string()));
        fields.insert(key.trim().to_string(), value);
    }
    serde_json::from_value(serde_json::Value::Object(fields))
        .map_err(|e| SnapshotError::Settings(format!("what if '{text}': {e}")))
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

/// A what-if in the form [`parse_what_if`] reads (`key=value,…`), for the
/// command line that repeats what the page did; the keys in the order
/// `RestartSettings` declares them (`RESTART_FIELDS`, which a test holds to
/// it), so the text does not depend on the map a `serde_json::Value`
/// keeps.
pub fn describe_what_if(settings: &RestartSettings) -> String {
    let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(settings) else {
        return String::new();
    };
    RESTART_FIELDS
        .iter()
        .filter_map(|key| Some((key, fields.get(*key)?)))
        .map(|(key, value)| match value {
            serde_json::Value::String(s) => format!("{key}={s}"),
            other => format!("{key}={other}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The allocator settings a recording was made with, in words: what a
/// what-if starts from (its controls are the recorded values until
/// changed).
pub fn describe_recorded(snapshot: &MemorySnapshot) -> String {
    let expandable = uses_expandable_segments(snapshot);
    match &snapshot.allocator_settings {
        Some(a) if !a.alloc_conf.is_empty() => {
            format!("Recorded with PYTORCH_CUDA_ALLOC_CONF={}", a.alloc_conf)
        }
        Some(a) if a.expandable_segments || expandable => {
            "Recorded with expandable segments (set in the program, PYTORCH_CUDA_ALLOC_CONF unset)".into()
        }
        Some(_) => "Recorded with PyTorch's default allocator settings (PYTORCH_CUDA_ALLOC_CONF unset)".into(),
        None if expandable => "The recording carries no allocator settings (PyTorch writes them from 2.1 on); its segments are expandable".into(),
        None => "The recording carries no allocator settings (PyTorch writes them from 2.1 on): replayed with PyTorch's defaults".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_are_restart_settings_in_their_order() {
        let all = RestartSettings {
            framework: Some(vramlab_core::types::Framework::Pytorch),
            gpu: Some(vramlab_device::gpu::GpuModel::ALL[0]),
            compute_capability: Some((8, 0)),
            device_total_bytes: Some(1),
            context_bytes: Some(1),
            other_processes_bytes: Some(1),
            allow_growth: Some(true),
            memory_limit_bytes: Some(None),
            gpu_garbage_collection: Some(true),
            preallocate: Some(true),
            mem_fraction: Some(0.5),
            no_caching: Some(true),
            max_split_size_mb: Some(None),
            garbage_collection_threshold: Some(0.5),
            per_process_memory_fraction: Some(None),
            cublas_workspace_config: Some(None),
            roundup_power2_divisions: Some(Default::default()),
            expandable_segments: Some(true),
            torch_version: Some(vramlab_device::framework::TorchVersion::V2_9),
            cublas_workspace_cache: Some(true),
            cublaslt_unified_workspace: Some(true),
            cudnn_workspace_bytes: Some(1),
        };
        let fields = serde_json::to_value(&all).unwrap();
        assert_eq!(
            fields.as_object().unwrap().len(),
            RESTART_FIELDS.len(),
            "every key listed"
        );
        // The JSON text keeps the declaration order.
        let text = serde_json::to_string(&all).unwrap();
        let mut at: Vec<(usize, &str)> = RESTART_FIELDS
            .iter()
            .map(|k| (text.find(&format!("\"{k}\":")).expect(k), *k))
            .collect();
        at.sort();
        assert_eq!(at.iter().map(|p| p.1).collect::<Vec<_>>(), RESTART_FIELDS);
    }

    /// Each way a recording tells its settings, in words.
    #[test]
    fn the_recorded_settings_are_said() {
        use crate::format::AllocatorSettings;
        let mut s = MemorySnapshot::default();
        assert_eq!(
            describe_recorded(&s),
            "The recording carries no allocator settings (PyTorch writes them from 2.1 on): replayed with PyTorch's defaults"
        );
        let mut a = AllocatorSettings {
            alloc_conf: String::new(),
            max_split_size: -1,
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            roundup_power2_divisions: Default::default(),
        };
        s.allocator_settings = Some(a.clone());
        assert_eq!(
            describe_recorded(&s),
            "Recorded with PyTorch's default allocator settings (PYTORCH_CUDA_ALLOC_CONF unset)"
        );
        a.expandable_segments = true;
        s.allocator_settings = Some(a.clone());
        assert_eq!(
            describe_recorded(&s),
            "Recorded with expandable segments (set in the program, PYTORCH_CUDA_ALLOC_CONF unset)"
        );
        a.alloc_conf = "expandable_segments:True,max_split_size_mb:128".into();
        s.allocator_settings = Some(a);
        assert_eq!(
            describe_recorded(&s),
            "Recorded with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128"
        );
    }

    #[test]
    fn a_described_what_if_reads_back_the_same() {
        for text in [
            "expandable_segments=true",
            "gpu=a100-40gb,max_split_size_mb=128,garbage_collection_threshold=0.6",
            "max_split_size_mb=null",
        ] {
            let settings = parse_what_if(text).unwrap();
            assert_eq!(describe_what_if(&settings), text);
            assert_eq!(
                parse_what_if(&describe_what_if(&settings)).unwrap(),
                settings
            );
        }
        // A divisions list is written whole, interval by interval.
        let list = parse_what_if("roundup_power2_divisions=[256:1,>:8]").unwrap();
        assert_eq!(parse_what_if(&describe_what_if(&list)).unwrap(), list);
        assert_eq!(describe_what_if(&RestartSettings::default()), "");
    }
}
