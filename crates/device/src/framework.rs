//! What each framework decides on its own: its settings and their defaults,
//! which allocator it builds and how large its pool may grow; how it words
//! an out-of-memory error (`oom`).

use crate::alloc::bfc::{BfcAllocator, BfcConfig};
use crate::alloc::caching::{CachingAllocator, CachingConfig, LARGE_BUFFER};
use crate::alloc::expandable::ExpandableAllocator;
use crate::alloc::roundup::RoundupDivisions;
use crate::alloc::uncached::UncachedAllocator;
use crate::alloc::Allocator;
use crate::device::{
    Device, SimDevice, SimDeviceConfig, DEFAULT_COMPUTE_CAPABILITY, DEFAULT_CONTEXT_BYTES,
    DEFAULT_TOTAL_BYTES,
};
use crate::gpu::GpuModel;
use serde::Serialize;
use vramlab_core::error::{CommandError, ErrorKind, Invalid};
use vramlab_core::types::Framework;
use vramlab_core::units::{format_size, GIB, MIB};

/// The largest simulated device accepted (1 PiB): anything above is a typo.
pub const MAX_DEVICE_BYTES: u64 = 1024 * 1024 * GIB;

/// Every setting a process runs with, resolved (what `restart` patches); read by hand
/// (`read`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Settings {
    pub framework: Framework,
    /// The GPU model the simulated device stands for, if one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuModel>,
    pub compute_capability: (u32, u32),
    pub device_total_bytes: u64,
    pub context_bytes: u64,
    pub other_processes_bytes: u64,
    pub allow_growth: bool,
    pub memory_limit_bytes: Option<u64>,
    pub gpu_garbage_collection: bool,
    pub preallocate: bool,
    pub mem_fraction: f64,
    pub no_caching: bool,
    pub max_split_size_mb: Option<u64>,
    pub garbage_collection_threshold: f64,
    pub per_process_memory_fraction: Option<f64>,
    /// `CUBLAS_WORKSPACE_CONFIG` (e.g. `:4096:8`; `:0:0` for none), unset
    /// by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cublas_workspace_config: Option<String>,
    /// `roundup_power2_divisions` (`PYTORCH_CUDA_ALLOC_CONF`): one number
    /// for every size or a per-interval list; 0: off.
    pub roundup_power2_divisions: RoundupDivisions,
    /// `expandable_segments:True` (`PYTORCH_CUDA_ALLOC_CONF`).
    pub expandable_segments: bool,
    /// The PyTorch release whose cuBLAS workspaces the process follows.
    pub torch_version: TorchVersion,
    /// `TORCH_CUBLAS_WORKSPACE_CACHE=1`: 2.15 keeps its workspaces per
    /// thread, as earlier releases did.
    pub cublas_workspace_cache: bool,
    /// `TORCH_CUBLASLT_UNIFIED_WORKSPACE=1`: cuBLASLt's products use the
    /// cuBLAS workspace instead of one of their own.
    pub cublaslt_unified_workspace: bool,
    /// The workspace each cuDNN convolution call takes (forward, backward
    /// data, backward weight), allocated and freed inside the call. Its
    /// real size is the algorithm cuDNN picks on the GPU at run time:
    /// unknown here, so 0 (not counted) unless set.
    pub cudnn_workspace_bytes: u64,
}

/// A PyTorch release, for what changed between them (today: where cuBLAS
/// gets its workspace).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum TorchVersion {
    /// Each (cuBLAS handle, stream) keeps a workspace from its first call
    /// (`setWorkspaceForHandle`, `getCUDABlasLtWorkspace` in
    /// `CublasHandlePool.cpp` at revision 26a39059, the 2.9-era main).
    #[serde(rename = "2.9")]
    V2_9,
    /// As 2.9: each (handle, stream) keeps its workspaces. Measured on an
    /// H100 with 2.11.0+cu130 (`tests/golden/workspaces.json`): the first
    /// `mm` keeps 32 MiB, the first `addmm` with a bias keeps cuBLASLt's
    /// 1 MiB, autograd's thread keeps 32 MiB of its own, and
    /// `TORCH_CUBLAS_WORKSPACE_CACHE` changes nothing. The 32 MiB size is
    /// measured on compute capability 9.0 only; elsewhere 2.9's rule.
    #[serde(rename = "2.11")]
    V2_11,
    /// A workspace per call unless `TORCH_CUBLAS_WORKSPACE_CACHE=1`
    /// (`getCurrentCUDABlasHandleWithWorkspace`, `CublasLtWorkspace`,
    /// `isCUDABlasWorkspaceCachingEnabled`: the 2.15 wheel's
    /// `CUDAContextLight.h` and `CublasLtUtils.h`).
    #[default]
    #[serde(rename = "2.15")]
    V2_15,
}

vramlab_core::read_by_name!(TorchVersion {
    V2_9 = "2.9",
    V2_11 = "2.11",
    V2_15 = "2.15",
});

impl TorchVersion {
    /// Every release followed, newest first.
    pub const ALL: [TorchVersion; 3] = [Self::V2_15, Self::V2_11, Self::V2_9];

    /// The release named as PyTorch numbers it (`"2.11"`).
    pub fn from_id(id: &str) -> Option<TorchVersion> {
        Self::ALL.into_iter().find(|v| v.id() == id)
    }

    /// The release as PyTorch numbers it.
    pub fn id(self) -> &'static str {
        match self {
            Self::V2_9 => "2.9",
            Self::V2_11 => "2.11",
            Self::V2_15 => "2.15",
        }
    }
}

/// Where PyTorch's matrix products get their cuBLAS workspaces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlasWorkspaces {
    /// Allocated for each call and freed as it returns (2.15 without the
    /// cache); else kept per thread from its first call.
    pub per_call: bool,
    /// A cuBLAS call's (`getChosenWorkspaceSize`); 0: none (not PyTorch,
    /// or `CUBLAS_WORKSPACE_CONFIG=:0:0`).
    pub cublas_bytes: u64,
    /// A cuBLASLt call's (`getCUDABlasLtWorkspaceSize`: 1 MiB, no more
    /// than the cuBLAS workspace).
    pub lt_bytes: u64,
    /// Kept workspaces: cuBLASLt uses the cuBLAS one.
    pub lt_shares_cublas: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            framework: Framework::Pytorch,
            gpu: Some(crate::gpu::DEFAULT_GPU),
            compute_capability: DEFAULT_COMPUTE_CAPABILITY,
            device_total_bytes: DEFAULT_TOTAL_BYTES,
            context_bytes: DEFAULT_CONTEXT_BYTES,
            other_processes_bytes: 0,
            allow_growth: false,
            memory_limit_bytes: None,
            gpu_garbage_collection: true,
            preallocate: true,
            mem_fraction: 0.75,
            no_caching: false,
            max_split_size_mb: None,
            garbage_collection_threshold: 0.0,
            per_process_memory_fraction: None,
            cublas_workspace_config: None,
            roundup_power2_divisions: RoundupDivisions::default(),
            expandable_segments: false,
            torch_version: TorchVersion::default(),
            cublas_workspace_cache: false,
            cublaslt_unified_workspace: false,
            cudnn_workspace_bytes: 0,
        }
    }
}

/// `restart`: every field optional; an omitted one keeps its value, a
/// nullable one set to `null` goes back to its default. Read by hand
/// (`read`), its fields in `RESTART_FIELDS`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RestartSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub framework: Option<Framework>,
    /// A GPU model: its memory, compute capability and context, unless
    /// given here too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuModel>,
    /// `[major, minor]`: decides TensorFlow's system reserve and PyTorch's
    /// cuBLAS workspace size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<(u32, u32)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_total_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_bytes: Option<u64>,
    /// Memory other processes hold on the same GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_processes_bytes: Option<u64>,
    /// TensorFlow `allow_growth` / `set_memory_growth`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_growth: Option<bool>,
    /// TensorFlow's memory limit (a logical device's `memory_limit`); `null`
    /// for the default rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<Option<u64>>,
    /// `TF_ENABLE_GPU_GARBAGE_COLLECTION`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_garbage_collection: Option<bool>,
    /// `XLA_PYTHON_CLIENT_PREALLOCATE`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preallocate: Option<bool>,
    /// `XLA_PYTHON_CLIENT_MEM_FRACTION`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_fraction: Option<f64>,
    /// `PYTORCH_NO_CUDA_MEMORY_CACHING=1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_caching: Option<bool>,
    /// `PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:N`; `null` for unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_split_size_mb: Option<Option<u64>>,
    /// `PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:F`; 0 is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub garbage_collection_threshold: Option<f64>,
    /// `torch.cuda.set_per_process_memory_fraction(F)`; `null` for none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_process_memory_fraction: Option<Option<f64>>,
    /// `CUBLAS_WORKSPACE_CONFIG`; `null` unsets it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cublas_workspace_config: Option<Option<String>>,
    /// PyTorch: `roundup_power2_divisions` (0 or a power of two, or a list
    /// like `"[256:1,512:2,>:8]"`; 0: off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roundup_power2_divisions: Option<RoundupDivisions>,
    /// PyTorch: `expandable_segments:True`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expandable_segments: Option<bool>,
    /// PyTorch's release: `"2.15"`, `"2.11"` or `"2.9"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_version: Option<TorchVersion>,
    /// PyTorch: `TORCH_CUBLAS_WORKSPACE_CACHE=1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cublas_workspace_cache: Option<bool>,
    /// PyTorch: `TORCH_CUBLASLT_UNIFIED_WORKSPACE=1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cublaslt_unified_workspace: Option<bool>,
    /// PyTorch: each cuDNN convolution's workspace, in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cudnn_workspace_bytes: Option<u64>,
}

fn invalid(message: String) -> CommandError {
    CommandError::new(ErrorKind::InvalidValue, message)
}

impl Settings {
    /// PyTorch's caching allocator options.
    pub fn caching_config(&self) -> CachingConfig {
        CachingConfig {
            max_split_size: self.max_split_size_mb.map_or(u64::MAX, |mb| mb * MIB),
            garbage_collection_threshold: self.garbage_collection_threshold,
            memory_fraction: self.per_process_memory_fraction,
            roundup_power2_divisions: self.roundup_power2_divisions,
        }
    }

    /// These settings with a `restart` command's fields applied, checked.
    pub fn patched(&self, patch: &RestartSettings) -> Result<Settings, CommandError> {
        let mut s = self.clone();
        if let Some(v) = patch.framework {
            s.framework = v;
        }
        if let Some(g) = patch.gpu {
            let spec = g.spec();
            s.gpu = Some(g);
            s.device_total_bytes = spec.total_bytes;
            s.context_bytes = spec.context_bytes;
            s.compute_capability = spec.compute_capability;
        }
        if let Some(v) = patch.compute_capability {
            s.compute_capability = v;
        }
        if let Some(v) = patch.device_total_bytes {
            if patch.gpu.is_none() {
                s.gpu = None;
            }
            s.device_total_bytes = v;
        }
        if let Some(v) = patch.context_bytes {
            s.context_bytes = v;
        }
        if let Some(v) = patch.other_processes_bytes {
            s.other_processes_bytes = v;
        }
        if let Some(v) = patch.allow_growth {
            s.allow_growth = v;
        }
        if let Some(v) = patch.memory_limit_bytes {
            s.memory_limit_bytes = v;
        }
        if let Some(v) = patch.gpu_garbage_collection {
            s.gpu_garbage_collection = v;
        }
        if let Some(v) = patch.preallocate {
            s.preallocate = v;
        }
        if let Some(v) = patch.mem_fraction {
            s.mem_fraction = v;
        }
        if let Some(v) = patch.no_caching {
            s.no_caching = v;
        }
        if let Some(v) = patch.max_split_size_mb {
            s.max_split_size_mb = v;
        }
        if let Some(v) = patch.garbage_collection_threshold {
            s.garbage_collection_threshold = v;
        }
        if let Some(v) = patch.per_process_memory_fraction {
            s.per_process_memory_fraction = v;
        }
        if let Some(v) = &patch.cublas_workspace_config {
            s.cublas_workspace_config = v.clone();
        }
        if let Some(v) = patch.roundup_power2_divisions {
            s.roundup_power2_divisions = v;
        }
        if let Some(v) = patch.expandable_segments {
            s.expandable_segments = v;
        }
        if let Some(v) = patch.torch_version {
            s.torch_version = v;
        }
        if let Some(v) = patch.cublas_workspace_cache {
            s.cublas_workspace_cache = v;
        }
        if let Some(v) = patch.cublaslt_unified_workspace {
            s.cublaslt_unified_workspace = v;
        }
        if let Some(v) = patch.cudnn_workspace_bytes {
            s.cudnn_workspace_bytes = v;
        }
        s.validate()?;
        Ok(s)
    }

    pub fn validate(&self) -> Result<(), CommandError> {
        if self.device_total_bytes == 0 || self.device_total_bytes > MAX_DEVICE_BYTES {
            return Err(invalid(format!(
                "device_total_bytes must be between 1 byte and 1 PiB, not {}",
                self.device_total_bytes
            )));
        }
        let fixed = self
            .context_bytes
            .saturating_add(self.other_processes_bytes);
        if fixed > self.device_total_bytes {
            return Err(invalid(format!(
                "the CUDA context ({}) and other processes ({}) do not fit on a device of {}",
                format_size(self.context_bytes),
                format_size(self.other_processes_bytes),
                format_size(self.device_total_bytes)
            )));
        }
        if let Some(limit) = self.memory_limit_bytes {
            let free = self.device_total_bytes - fixed;
            if limit == 0 || limit > free {
                return Err(invalid(format!(
                    "memory_limit_bytes must be between 1 byte and the {} the device has free, not {}",
                    format_size(free),
                    format_size(limit)
                )));
            }
        }
        if self.cudnn_workspace_bytes > self.device_total_bytes {
            return Err(invalid(format!(
                "cudnn_workspace_bytes must be at most the device's {}, not {}",
                format_size(self.device_total_bytes),
                format_size(self.cudnn_workspace_bytes)
            )));
        }
        if !(self.mem_fraction > 0.0 && self.mem_fraction <= 1.0) {
            return Err(invalid(format!(
                "mem_fraction (XLA_PYTHON_CLIENT_MEM_FRACTION) must be in (0, 1], not {}",
                self.mem_fraction
            )));
        }
        if let Some(mb) = self.max_split_size_mb {
            let min = LARGE_BUFFER / MIB;
            if mb <= min || mb > u64::MAX / MIB {
                return Err(invalid(format!(
                    "CachingAllocator option max_split_size_mb too small, must be > {min} (got {mb})"
                )));
            }
        }
        let t = self.garbage_collection_threshold;
        if !(t == 0.0 || (t > 0.0 && t < 1.0)) {
            return Err(invalid(format!(
                "garbage_collection_threshold must be in (0, 1), or 0 for off; got {t}"
            )));
        }
        if let Some(f) = self.per_process_memory_fraction {
            if !(0.0..=1.0).contains(&f) {
                // `torch.cuda.set_per_process_memory_fraction`'s ValueError.
                return Err(invalid(format!(
                    "Invalid fraction value: {f:?}. Allowed range: 0~1"
                )));
            }
        }
        let (major, minor) = self.compute_capability;
        if !(1..=20).contains(&major) || minor > 9 {
            return Err(invalid(format!(
                "compute_capability must be [major, minor] like [8, 0] or [9, 0], not [{major}, {minor}]"
            )));
        }
        Ok(())
    }

    /// The bytes of one cuBLAS workspace, which PyTorch allocates through
    /// its allocator (`getChosenWorkspaceSize` in `CublasHandlePool.cpp`):
    /// `CUBLAS_WORKSPACE_CONFIG` when it parses, else 32 MiB (on compute
    /// capability 9.0 in 2.9 and 2.11; 9.x to 12.x in 2.15) and `:4096:2:16:8`
    /// (8,519,680 bytes) elsewhere. TensorFlow and JAX: none through their
    /// allocators.
    pub fn cublas_workspace_bytes(&self) -> u64 {
        if self.framework != Framework::Pytorch {
            return 0;
        }
        let (major, minor) = self.compute_capability;
        let large = match self.torch_version {
            TorchVersion::V2_9 | TorchVersion::V2_11 => (major, minor) == (9, 0),
            TorchVersion::V2_15 => (9..=12).contains(&major),
        };
        let default = if large {
            4096 * 8 * 1024
        } else {
            4096 * 1024 * 2 + 16 * 1024 * 8
        };
        self.cublas_workspace_config
            .as_deref()
            .and_then(parse_cublas_workspace_config)
            .unwrap_or(default)
    }

    /// Where matrix products get their workspaces: per call in 2.15
    /// (`CUDABlasHandleWithWorkspace` owns an eager one, `CublasLtWorkspace`
    /// allocates one, both through the caching allocator, both freed as
    /// the op returns), kept per thread in 2.9 or with
    /// `TORCH_CUBLAS_WORKSPACE_CACHE=1`. cuBLASLt's is 1 MiB
    /// (`CUBLASLT_WORKSPACE_SIZE`'s default), capped at the cuBLAS size.
    pub fn blas_workspaces(&self) -> BlasWorkspaces {
        let cublas_bytes = self.cublas_workspace_bytes();
        BlasWorkspaces {
            per_call: self.torch_version == TorchVersion::V2_15 && !self.cublas_workspace_cache,
            cublas_bytes,
            lt_bytes: cublas_bytes.min(MIB),
            lt_shares_cublas: self.cublaslt_unified_workspace,
        }
    }

    /// What the first GPU kernel allocates before its output and keeps:
    /// TensorFlow's Eigen scratch buffer, `Eigen::kGpuScratchSize` (1,024)
    /// plus `sizeof(unsigned int)` bytes (`BaseGPUDevice::InitScratchBuffers`).
    /// JAX (XLA) and PyTorch have none.
    pub fn first_kernel_scratch_bytes(&self) -> u64 {
        match self.framework {
            Framework::Tensorflow => 1024 + 4,
            _ => 0,
        }
    }

    /// The most the framework lets this process hold on `device`: the
    /// memory it could get at start (capped by the per-process fraction)
    /// for PyTorch, the BFC memory limit for TensorFlow and JAX.
    pub fn memory_budget(&self, device: &dyn Device) -> u64 {
        let (free, total) = device.mem_get_info();
        let start_free = free + device.segment_bytes();
        match self.framework {
            Framework::Pytorch => self
                .per_process_memory_fraction
                .map_or(start_free, |f| ((f * total as f64) as u64).min(start_free)),
            _ => self.bfc_memory_limit(device),
        }
    }

    /// The BFC allocator's memory limit for this device.
    pub fn bfc_memory_limit(&self, device: &dyn Device) -> u64 {
        let (free, total) = device.mem_get_info();
        match self.framework {
            Framework::Jax => (total as f64 * self.mem_fraction) as u64,
            _ => match self.memory_limit_bytes {
                Some(limit) => limit,
                None => tf_default_memory_limit(free, device.info().compute_capability.0),
            },
        }
    }
}

/// `parseChosenWorkspaceSize`: every `:SIZE:COUNT` in the text (the regex
/// `:([0-9]+):([0-9]+)`, left to right) adds SIZE KiB times COUNT; `None`
/// when nothing matches (PyTorch then warns and uses its default).
pub fn parse_cublas_workspace_config(config: &str) -> Option<u64> {
    let bytes = config.as_bytes();
    let digits = |from: usize| {
        bytes[from..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let number =
        |from: usize, len: usize| -> u64 { config[from..from + len].parse().unwrap_or(u64::MAX) };
    let (mut total, mut matched, mut i) = (0u64, false, 0);
    while i < bytes.len() {
        let size_len = if bytes[i] == b':' { digits(i + 1) } else { 0 };
        let colon = i + 1 + size_len;
        let count_len = if size_len > 0 && bytes.get(colon) == Some(&b':') {
            digits(colon + 1)
        } else {
            0
        };
        if count_len == 0 {
            i += 1;
            continue;
        }
        let (size, count) = (number(i + 1, size_len), number(colon + 1, count_len));
        total = total.saturating_add(size.saturating_mul(1024).saturating_mul(count));
        matched = true;
        i = colon + 1 + count_len;
    }
    matched.then_some(total)
}

/// TensorFlow's reserve for the system (`MinSystemMemory` in
/// `gpu_device.cc`): 225 MiB when less than 2 GiB is free, else by compute
/// capability.
pub fn tf_min_system_memory(available: u64, cc_major: u32) -> u64 {
    if available < 2 * GIB {
        225 * MIB
    } else if cc_major <= 6 {
        500 * MIB
    } else if cc_major == 7 {
        1050 * MIB
    } else if cc_major == 8 {
        1536 * MIB
    } else {
        1800 * MIB
    }
}

/// TensorFlow's default memory limit: free memory at device creation minus
/// the system reserve.
pub fn tf_default_memory_limit(free: u64, cc_major: u32) -> u64 {
    let reserve = tf_min_system_memory(free, cc_major);
    if reserve < free {
        free - reserve
    } else {
        free
    }
}

/// The simulated GPU these settings describe (its memory, context, other
/// processes, compute capability, card name), its values checked.
pub fn sim_device(settings: &Settings) -> Result<SimDevice, Invalid> {
    let config = SimDeviceConfig {
        total_bytes: settings.device_total_bytes,
        context_bytes: settings.context_bytes,
        other_processes_bytes: settings.other_processes_bytes,
        compute_capability: settings.compute_capability,
        model_name: settings.gpu.map(|g| g.spec().name),
    };
    config.validate()?;
    Ok(SimDevice::new(config))
}

/// The allocator a process with these settings runs.
pub fn make_allocator(settings: &Settings, device: &dyn Device) -> Box<dyn Allocator> {
    match settings.framework {
        Framework::Pytorch if settings.no_caching => Box::new(UncachedAllocator::new()),
        Framework::Pytorch => {
            let config = settings.caching_config();
            let total = device.mem_get_info().1;
            if settings.expandable_segments {
                Box::new(ExpandableAllocator::new(config, total))
            } else {
                Box::new(CachingAllocator::new(config, total))
            }
        }
        Framework::Tensorflow => Box::new(BfcAllocator::new(BfcConfig {
            memory_limit: settings.bfc_memory_limit(device),
            allow_growth: settings.allow_growth,
            garbage_collection: settings.gpu_garbage_collection,
        })),
        // XLA's GPU client sets only `allow_growth` on its BFC options
        // (`xla/pjrt/gpu/gpu_helpers.cc`), and `garbage_collection` defaults
        // to false: JAX never returns free regions to make room.
        Framework::Jax => Box::new(BfcAllocator::new(BfcConfig {
            memory_limit: settings.bfc_memory_limit(device),
            allow_growth: !settings.preallocate,
            garbage_collection: false,
        })),
    }
}

mod oom;
pub use oom::{oom_exception, oom_message, TensorDesc, PYTORCH_2_9_OOM_HINT, PYTORCH_OOM_HINT};
mod read;
pub use read::RESTART_FIELDS;
#[cfg(test)]
mod tests;
