//! Settings read by hand, field by field: every hello and every restart's
//! result carries them, and serde's derived reader for eighteen fields is a
//! large part of the page's download. As with the derived reader, fields
//! not named here are ignored, and those with a default may be missing.

use super::{RestartSettings, Settings, DEFAULT_COMPUTE_CAPABILITY};
use serde::{Deserialize, Deserializer};
use vramlab_core::fields::{self, Fields};

impl<'de> Deserialize<'de> for Settings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        fields::read(d, read)
    }
}

fn read(f: &mut Fields) -> Result<Settings, serde_json::Error> {
    Ok(Settings {
        framework: f.take("framework")?,
        gpu: f.take("gpu")?,
        compute_capability: f.take_or("compute_capability", DEFAULT_COMPUTE_CAPABILITY)?,
        device_total_bytes: f.take("device_total_bytes")?,
        context_bytes: f.take("context_bytes")?,
        other_processes_bytes: f.take("other_processes_bytes")?,
        allow_growth: f.take("allow_growth")?,
        memory_limit_bytes: f.take("memory_limit_bytes")?,
        gpu_garbage_collection: f.take("gpu_garbage_collection")?,
        preallocate: f.take("preallocate")?,
        mem_fraction: f.take("mem_fraction")?,
        no_caching: f.take("no_caching")?,
        max_split_size_mb: f.take("max_split_size_mb")?,
        garbage_collection_threshold: f.take("garbage_collection_threshold")?,
        per_process_memory_fraction: f.take("per_process_memory_fraction")?,
        cublas_workspace_config: f.take("cublas_workspace_config")?,
        roundup_power2_divisions: f.take_or("roundup_power2_divisions", Default::default())?,
        expandable_segments: f.take_or("expandable_segments", false)?,
        torch_version: f.take_or("torch_version", Default::default())?,
        cublas_workspace_cache: f.take_or("cublas_workspace_cache", false)?,
        cublaslt_unified_workspace: f.take_or("cublaslt_unified_workspace", false)?,
        cudnn_workspace_bytes: f.take_or("cudnn_workspace_bytes", 0)?,
    })
}

impl<'de> Deserialize<'de> for RestartSettings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        fields::read(d, restart)
    }
}

/// `restart`'s fields, in `RestartSettings`' order.
pub const RESTART_FIELDS: &[&str] = &[
    "framework",
    "gpu",
    "compute_capability",
    "device_total_bytes",
    "context_bytes",
    "other_processes_bytes",
    "allow_growth",
    "memory_limit_bytes",
    "gpu_garbage_collection",
    "preallocate",
    "mem_fraction",
    "no_caching",
    "max_split_size_mb",
    "garbage_collection_threshold",
    "per_process_memory_fraction",
    "cublas_workspace_config",
    "roundup_power2_divisions",
    "expandable_segments",
    "torch_version",
    "cublas_workspace_cache",
    "cublaslt_unified_workspace",
    "cudnn_workspace_bytes",
];

/// A `restart` line's fields: a missing one keeps the process's value; a
/// nullable one (`memory_limit_bytes`, `max_split_size_mb`,
/// `per_process_memory_fraction`, `cublas_workspace_config`) set to `null`
/// goes back to its default; an unknown one is refused, naming the others.
fn restart(f: &mut Fields) -> Result<RestartSettings, serde_json::Error> {
    let s = RestartSettings {
        framework: f.take("framework")?,
        gpu: f.take("gpu")?,
        compute_capability: f.take("compute_capability")?,
        device_total_bytes: f.take("device_total_bytes")?,
        context_bytes: f.take("context_bytes")?,
        other_processes_bytes: f.take("other_processes_bytes")?,
        allow_growth: f.take("allow_growth")?,
        memory_limit_bytes: f.take_nullable("memory_limit_bytes")?,
        gpu_garbage_collection: f.take("gpu_garbage_collection")?,
        preallocate: f.take("preallocate")?,
        mem_fraction: f.take("mem_fraction")?,
        no_caching: f.take("no_caching")?,
        max_split_size_mb: f.take_nullable("max_split_size_mb")?,
        garbage_collection_threshold: f.take("garbage_collection_threshold")?,
        per_process_memory_fraction: f.take_nullable("per_process_memory_fraction")?,
        cublas_workspace_config: f.take_nullable("cublas_workspace_config")?,
        roundup_power2_divisions: f.take("roundup_power2_divisions")?,
        expandable_segments: f.take("expandable_segments")?,
        torch_version: f.take("torch_version")?,
        cublas_workspace_cache: f.take("cublas_workspace_cache")?,
        cublaslt_unified_workspace: f.take("cublaslt_unified_workspace")?,
        cudnn_workspace_bytes: f.take("cudnn_workspace_bytes")?,
    };
    f.done(RESTART_FIELDS)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramlab_core::types::Framework;

    #[test]
    fn settings_read_back_as_written() {
        let s = Settings {
            framework: Framework::Jax,
            memory_limit_bytes: Some(1 << 30),
            cublas_workspace_config: Some(":4096:8".into()),
            expandable_segments: true,
            ..Settings::default()
        };
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Settings>(&text).unwrap(), s);
    }

    #[test]
    fn a_restart_reads_missing_null_and_unknown_fields_as_before() {
        let r: RestartSettings = serde_json::from_str(
            r#"{"max_split_size_mb":null,"memory_limit_bytes":5,"torch_version":"2.9","expandable_segments":null}"#,
        )
        .unwrap();
        assert_eq!(r.max_split_size_mb, Some(None));
        assert_eq!(r.memory_limit_bytes, Some(Some(5)));
        assert_eq!(r.torch_version, Some(super::super::TorchVersion::V2_9));
        assert_eq!(r.expandable_segments, None);
        assert_eq!(r.gpu, None);
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<RestartSettings>(&text).unwrap(), r);
        let e = serde_json::from_str::<RestartSettings>(r#"{"framwork":"jax"}"#).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unknown field `framwork`, expected one of `framework`"),
            "{e}"
        );
        let all = serde_json::to_value(RestartSettings {
            torch_version: Some(Default::default()),
            ..Default::default()
        });
        assert_eq!(all.unwrap().as_object().unwrap().len(), 1);
    }

    #[test]
    fn fields_with_a_default_may_be_missing_and_others_are_named() {
        let mut v = serde_json::to_value(Settings::default()).unwrap();
        let o = v.as_object_mut().unwrap();
        for key in [
            "gpu",
            "compute_capability",
            "cublas_workspace_config",
            "roundup_power2_divisions",
            "expandable_segments",
            "memory_limit_bytes",
        ] {
            o.remove(key);
        }
        o.insert("unknown".into(), 1.into());
        // No `gpu`: a device of the sizes given, no card's name.
        assert_eq!(
            serde_json::from_value::<Settings>(v.clone()).unwrap(),
            Settings {
                gpu: None,
                ..Settings::default()
            }
        );
        v.as_object_mut().unwrap().remove("preallocate");
        let e = serde_json::from_value::<Settings>(v.clone()).unwrap_err();
        assert_eq!(e.to_string(), "missing field `preallocate`");
        v["preallocate"] = "yes".into();
        let e = serde_json::from_value::<Settings>(v).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid type: string \"yes\", expected a boolean"
        );
    }
}
