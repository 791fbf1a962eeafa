//! Settings, memory limits and OOM texts, each pinned by an exact value.

use super::*;
use crate::alloc::OutOfMemory;
use crate::device::{SimDevice, SimDeviceConfig};
use vramlab_core::types::Dtype;

#[test]
fn tf_reserve_follows_gpu_device_cc() {
    assert_eq!(tf_min_system_memory(GIB, 9), 225 * MIB);
    assert_eq!(tf_min_system_memory(10 * GIB, 6), 500 * MIB);
    assert_eq!(tf_min_system_memory(10 * GIB, 7), 1050 * MIB);
    assert_eq!(tf_min_system_memory(10 * GIB, 8), 1536 * MIB);
    assert_eq!(tf_default_memory_limit(100 * MIB, 8), 100 * MIB);
}

#[test]
fn jax_limit_is_a_fraction_of_total() {
    let dev = SimDevice::new(SimDeviceConfig::default());
    let s = Settings {
        framework: Framework::Jax,
        ..Default::default()
    };
    // 0.75 of a T4's 15,104 MiB.
    assert_eq!(s.bfc_memory_limit(&dev), 11_328 * vramlab_core::units::MIB);
}

/// A T4 (compute capability 7.5): TensorFlow keeps back 1,050 MiB
/// (`MinSystemMemory`) of the 15,104 - 300 MiB free after the context.
#[test]
fn a_gpu_model_brings_its_memory_context_and_compute_capability() {
    let s = Settings::default()
        .patched(&RestartSettings {
            framework: Some(Framework::Tensorflow),
            gpu: Some(GpuModel::T4),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(s.device_total_bytes, 15_104 * MIB);
    assert_eq!(s.context_bytes, 300 * MIB);
    assert_eq!(s.compute_capability, (7, 5));
    let dev = SimDevice::new(SimDeviceConfig {
        total_bytes: s.device_total_bytes,
        context_bytes: s.context_bytes,
        compute_capability: s.compute_capability,
        ..Default::default()
    });
    assert_eq!(s.bfc_memory_limit(&dev), (15_104 - 300 - 1_050) * MIB);
    // The same card told it is compute capability 9.0: 1,800 MiB.
    let hopper = s
        .patched(&RestartSettings {
            compute_capability: Some((9, 0)),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(hopper.gpu, Some(GpuModel::T4));
    let dev = SimDevice::new(SimDeviceConfig {
        total_bytes: hopper.device_total_bytes,
        context_bytes: hopper.context_bytes,
        compute_capability: hopper.compute_capability,
        ..Default::default()
    });
    assert_eq!(hopper.bfc_memory_limit(&dev), (15_104 - 300 - 1_800) * MIB);
    // A size of its own: no longer that card.
    let custom = s
        .patched(&RestartSettings {
            device_total_bytes: Some(8 * GIB),
            ..Default::default()
        })
        .unwrap();
    assert_eq!((custom.gpu, custom.compute_capability), (None, (7, 5)));
}

#[test]
fn cublas_workspace_size_follows_get_chosen_workspace_size() {
    assert_eq!(
        parse_cublas_workspace_config(":4096:2:16:8"),
        Some(8_519_680)
    );
    assert_eq!(parse_cublas_workspace_config(":4096:8"), Some(32 * MIB));
    assert_eq!(parse_cublas_workspace_config(":0:0"), Some(0));
    assert_eq!(
        parse_cublas_workspace_config("::16:8x:1:"),
        Some(128 * 1024)
    );
    assert_eq!(parse_cublas_workspace_config("4096:8"), None);
    let in_version = |torch_version, cc, config: Option<&str>, framework| {
        Settings {
            framework,
            compute_capability: cc,
            cublas_workspace_config: config.map(str::to_string),
            torch_version,
            ..Default::default()
        }
        .cublas_workspace_bytes()
    };
    let ws = |cc, config, framework| in_version(TorchVersion::V2_15, cc, config, framework);
    assert_eq!(ws((8, 0), None, Framework::Pytorch), 8_519_680);
    assert_eq!(ws((8, 9), None, Framework::Pytorch), 8_519_680);
    // 2.15: compute capability majors 9 to 12 get 32 MiB.
    for cc in [(9, 0), (10, 0), (12, 1)] {
        assert_eq!(ws(cc, None, Framework::Pytorch), 32 * MIB);
    }
    // 2.9 (revision 26a39059): only 9.0 (`major == 9 && minor == 0`).
    let old = |cc| in_version(TorchVersion::V2_9, cc, None, Framework::Pytorch);
    assert_eq!(old((9, 0)), 32 * MIB);
    assert_eq!(old((10, 0)), 8_519_680);
    assert_eq!(ws((8, 0), Some(":4096:8"), Framework::Pytorch), 32 * MIB);
    assert_eq!(ws((9, 0), Some("junk"), Framework::Pytorch), 32 * MIB);
    assert_eq!(ws((8, 0), None, Framework::Tensorflow), 0);
}

#[test]
fn validation_messages() {
    let s = Settings::default();
    let bad = |patch: RestartSettings| s.patched(&patch).unwrap_err().message;
    assert!(bad(RestartSettings {
        max_split_size_mb: Some(Some(20)),
        ..Default::default()
    })
    .contains("must be > 20"));
    // `torch.cuda.set_per_process_memory_fraction`'s ValueError.
    assert_eq!(
        bad(RestartSettings {
            per_process_memory_fraction: Some(Some(1.5)),
            ..Default::default()
        }),
        "Invalid fraction value: 1.5. Allowed range: 0~1"
    );
    assert!(bad(RestartSettings {
        compute_capability: Some((0, 0)),
        ..Default::default()
    })
    .contains("compute_capability"));
    assert!(bad(RestartSettings {
        mem_fraction: Some(0.0),
        ..Default::default()
    })
    .contains("mem_fraction"));
    assert!(bad(RestartSettings {
        context_bytes: Some(17 * GIB),
        ..Default::default()
    })
    .contains("do not fit"));
}

#[test]
fn pytorch_oom_text() {
    let oom = OutOfMemory {
        requested: 100,
        rounded: 512,
        alloc_size: 2 * MIB,
        device_free: MIB,
        device_total: GIB,
        process_used: 1000 * MIB,
        other_processes: 0,
        allocated: 600 * MIB,
        reserved: 700 * MIB,
        allowed: None,
        memory_limit: None,
    };
    let tensor = TensorDesc {
        shape: &[100],
        dtype: Dtype::Uint8,
        op: None,
    };
    let text = "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 1024.00 MiB of which 1024.00 KiB is free. Including non-PyTorch memory, this process has 1000.00 MiB memory in use. Of the allocated memory 600.00 MiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but unallocated.";
    // 2.15: `PYTORCH_CUDA_ALLOC_CONF` and docs.pytorch.org's section.
    assert_eq!(
        oom_message(&Settings::default(), &oom, &tensor),
        format!("{text} If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")
    );
    let old = Settings {
        torch_version: TorchVersion::V2_9,
        ..Settings::default()
    };
    assert_eq!(
        oom_message(&old, &oom, &tensor),
        format!("{text} If reserved but unallocated memory is large try setting PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
    );
    // 2.11 printed 2.15's hint on an H100 (tests/golden/05-*.pytorch.jsonl).
    let v2_11 = Settings {
        torch_version: TorchVersion::V2_11,
        ..Settings::default()
    };
    assert_eq!(
        oom_message(&v2_11, &oom, &tensor),
        oom_message(&Settings::default(), &oom, &tensor)
    );
}

/// 2.11 keeps its workspaces per handle as 2.9 does (measured on an H100:
/// tests/golden/workspaces.json), 32 MiB on compute capability 9.0, and
/// `TORCH_CUBLAS_WORKSPACE_CACHE` changes nothing.
#[test]
fn pytorch_2_11_keeps_its_workspaces() {
    let on = |cc, cache| {
        Settings {
            torch_version: TorchVersion::V2_11,
            compute_capability: cc,
            cublas_workspace_cache: cache,
            ..Default::default()
        }
        .blas_workspaces()
    };
    for cache in [false, true] {
        let h100 = on((9, 0), cache);
        assert!(!h100.per_call);
        assert_eq!((h100.cublas_bytes, h100.lt_bytes), (32 * MIB, MIB));
    }
    assert_eq!(on((8, 0), false).cublas_bytes, 8_519_680);
}

/// The page's version field reads every release by its number, and no other.
#[test]
fn versions_read_back_by_their_numbers() {
    for v in TorchVersion::ALL {
        assert_eq!(TorchVersion::from_id(v.id()), Some(v));
        assert_eq!(serde_json::to_value(v).unwrap(), v.id());
    }
    assert_eq!(TorchVersion::from_id("2.10"), None);
    assert_eq!(TorchVersion::from_id(""), None);
}
