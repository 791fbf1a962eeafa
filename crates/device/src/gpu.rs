//! GPU models a simulated device can be: the memory `cudaMemGetInfo`
//! reports as total on that card, its compute capability, and a typical
//! CUDA context. Compute capability decides TensorFlow's system reserve
//! (`MinSystemMemory`) and PyTorch's default cuBLAS workspace size.
//!
//! Totals are what PyTorch's out-of-memory message prints on that card
//! ("GPU 0 has a total capacity of 14.75 GiB"), to the 0.01 GiB it prints,
//! taken as whole MiB. The context is the ~300 MB a process pays with CUDA's
//! lazy module loading (CUDA 11.7 and later; pytorch/pytorch#107667).
//!
//! The H100's are measured (`tests/golden/context-torch.jsonl`, driver
//! 580.159.04, CUDA 13.0): `cudaMemGetInfo`'s total in bytes, and the
//! context PyTorch 2.11's process holds at its first tensor (NVML's used
//! memory less what was used before and less PyTorch's reserved bytes).
//! It then grows as libraries load their kernels: 684 MiB after the first
//! cuBLAS call, 702 MiB after cuDNN and flash attention; JAX 0.11's is
//! 558 MiB. The other cards have not been measured by this project yet.

use serde::Serialize;
use vramlab_core::units::MIB;

/// The device a kernel starts on: Colab's free card.
pub const DEFAULT_GPU: GpuModel = GpuModel::T4;

/// A GPU model, by the name `restart`'s `"gpu"` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum GpuModel {
    #[serde(rename = "t4")]
    T4,
    #[serde(rename = "l4")]
    L4,
    #[serde(rename = "a100-40gb")]
    A100_40gb,
    #[serde(rename = "a100-80gb")]
    A100_80gb,
    #[serde(rename = "rtx-4090")]
    Rtx4090,
    #[serde(rename = "h100-80gb")]
    H100_80gb,
    #[serde(rename = "h200")]
    H200,
}

vramlab_core::read_by_name!(GpuModel {
    T4 = "t4",
    L4 = "l4",
    A100_40gb = "a100-40gb",
    A100_80gb = "a100-80gb",
    Rtx4090 = "rtx-4090",
    H100_80gb = "h100-80gb",
    H200 = "h200",
});

/// What a GPU model brings to a simulated device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuSpec {
    /// The name `torch.cuda.get_device_name()` gives.
    pub name: &'static str,
    /// Total memory as `cudaMemGetInfo` reports it.
    pub total_bytes: u64,
    pub compute_capability: (u32, u32),
    pub context_bytes: u64,
}

/// The typical context with lazy module loading.
const CONTEXT: u64 = 300 * MIB;

impl GpuModel {
    pub const ALL: [GpuModel; 7] = [
        GpuModel::T4,
        GpuModel::L4,
        GpuModel::A100_40gb,
        GpuModel::A100_80gb,
        GpuModel::Rtx4090,
        GpuModel::H100_80gb,
        GpuModel::H200,
    ];

    /// The name on the wire: `t4`, `a100-40gb`, …
    pub fn id(self) -> &'static str {
        match self {
            GpuModel::T4 => "t4",
            GpuModel::L4 => "l4",
            GpuModel::A100_40gb => "a100-40gb",
            GpuModel::A100_80gb => "a100-80gb",
            GpuModel::Rtx4090 => "rtx-4090",
            GpuModel::H100_80gb => "h100-80gb",
            GpuModel::H200 => "h200",
        }
    }

    pub fn from_id(id: &str) -> Option<GpuModel> {
        GpuModel::ALL.into_iter().find(|g| g.id() == id)
    }

    pub fn spec(self) -> GpuSpec {
        let (name, total_bytes, cc, context_bytes) = match self {
            GpuModel::T4 => ("Tesla T4", 15_104 * MIB, (7, 5), CONTEXT),
            GpuModel::L4 => ("NVIDIA L4", 22_579 * MIB, (8, 9), CONTEXT),
            GpuModel::A100_40gb => ("NVIDIA A100-SXM4-40GB", 40_335 * MIB, (8, 0), CONTEXT),
            GpuModel::A100_80gb => ("NVIDIA A100-SXM4-80GB", 81_050 * MIB, (8, 0), CONTEXT),
            GpuModel::Rtx4090 => ("NVIDIA GeForce RTX 4090", 24_218 * MIB, (8, 9), CONTEXT),
            GpuModel::H100_80gb => ("NVIDIA H100 80GB HBM3", 85_017_493_504, (9, 0), 618 * MIB),
            GpuModel::H200 => ("NVIDIA H200", 143_166 * MIB, (9, 0), CONTEXT),
        };
        GpuSpec {
            name,
            total_bytes,
            compute_capability: cc,
            context_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramlab_core::units::GIB;

    #[test]
    fn every_model_reads_back_from_its_id() {
        for g in GpuModel::ALL {
            assert_eq!(GpuModel::from_id(g.id()), Some(g));
            let wire = serde_json::to_value(g).unwrap();
            assert_eq!(wire, g.id());
        }
    }

    /// The default device's numbers are the default card's.
    #[test]
    fn the_default_device_is_a_t4() {
        use crate::device::*;
        let spec = DEFAULT_GPU.spec();
        assert_eq!(spec.total_bytes, DEFAULT_TOTAL_BYTES);
        assert_eq!(spec.compute_capability, DEFAULT_COMPUTE_CAPABILITY);
        assert_eq!(spec.context_bytes, DEFAULT_CONTEXT_BYTES);
        assert_eq!(crate::framework::Settings::default().gpu, Some(DEFAULT_GPU));
    }

    #[test]
    fn totals_print_as_the_capacity_pytorch_reports() {
        let gib = |g: GpuModel| format!("{:.2}", g.spec().total_bytes as f64 / GIB as f64);
        assert_eq!(gib(GpuModel::T4), "14.75");
        assert_eq!(gib(GpuModel::A100_40gb), "39.39");
        assert_eq!(gib(GpuModel::A100_80gb), "79.15");
        assert_eq!(gib(GpuModel::Rtx4090), "23.65");
        assert_eq!(gib(GpuModel::H100_80gb), "79.18");
        assert_eq!(gib(GpuModel::L4), "22.05");
        assert_eq!(gib(GpuModel::H200), "139.81");
    }
}
