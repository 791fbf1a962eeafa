//! Serving with vLLM 0.33.0: how much of the GPU its KV cache gets, how
//! many tokens that holds, how many requests of `max_model_len` fit at
//! once, and whether the engine starts at all. Followed from the
//! release's own code:
//!
//! - `Worker.init_device`: `requested_memory = total_memory ×
//!   gpu_memory_utilization`, measured after the CUDA context and before
//!   the model (the context is outside the budget).
//! - `Worker.determine_available_memory` and `memory_profiling`
//!   (`vllm/utils/mem_utils.py`): the KV cache gets `requested_memory −
//!   non_kv_cache_memory − cudagraph_memory_estimate`, where
//!   `non_kv_cache_memory` is what the instance holds after profiling
//!   (the weights' segments, the model runner's buffers, memory outside
//!   PyTorch) plus the profile run's transient peak
//!   (`allocated_bytes.all.peak − allocated_bytes.all.current`).
//! - `GPUModelRunner.profile_run`: one forward over
//!   `max_num_batched_tokens` tokens split into `min(tokens,
//!   max_num_seqs)` requests, then the sampler twice on their last
//!   positions ([`profile`] plays it on the caching allocator).
//! - `GPUModelRunner.profile_cudagraph_memory` (on by default since
//!   0.21: `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1`): for each graph
//!   mode, the first capture's memory plus `(graphs − 1) ×` the second's.
//! - `kv_cache_planning.get_kv_cache_config_from_groups`: `num_blocks =
//!   available // (page_size × layers)`, a page being `2 × block_size ×
//!   kv_heads × head_dim × dtype size`; `get_kv_cache_capacity`: the
//!   tokens are `num_blocks / cdiv(max_model_len, block_size) ×
//!   max_model_len`; `check_enough_kv_cache_memory` refuses to start
//!   when one request of `max_model_len` does not fit.
//!
//! What no source gives is assumed and named: memory outside PyTorch
//! ([`NON_TORCH_BYTES`]) and a CUDA graph's own memory
//! ([`GRAPH_BYTES`]), both from the start-up logs docs/serving.md lists.

use super::config::{Arch, HfConfig};
use vramlab_core::error::Invalid;
use vramlab_core::types::Dtype;
use vramlab_core::units::MIB;
use vramlab_device::gpu::GpuModel;

pub mod profile;

/// Memory the instance comes to hold outside PyTorch's allocator while
/// it loads and profiles on one GPU (kernel modules loaded lazily,
/// cuBLAS handles): not in any source, so taken from the start-up logs
/// (docs/serving.md: 0.1 to 0.4 GiB on one GPU).
pub const NON_TORCH_BYTES: u64 = 256 * MIB;

/// What one captured CUDA graph holds beyond the pool its first capture
/// filled (the executable graph the driver instantiates): the second
/// capture's drop in free memory, at least 1 MiB in vLLM's code; from the
/// start-up logs (docs/serving.md).
pub const GRAPH_BYTES: u64 = 4 * MIB;

/// The card vLLM starts on: what `cudaMemGetInfo` reports as total, its
/// compute capability, and its streaming multiprocessors (which size
/// the Triton sampler's buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Card {
    pub total: u64,
    pub compute_capability: (u32, u32),
    pub sms: u64,
    /// An H100-class card: 70 GiB or more and not an A100
    /// (`EngineArgs.get_batch_defaults`).
    pub large: bool,
}

impl Card {
    pub fn of(gpu: GpuModel) -> Card {
        let spec = gpu.spec();
        Card {
            total: spec.total_bytes,
            compute_capability: spec.compute_capability,
            sms: match gpu {
                GpuModel::T4 => 40,
                GpuModel::L4 => 58,
                GpuModel::A100_40gb | GpuModel::A100_80gb => 108,
                GpuModel::Rtx4090 => 128,
                GpuModel::H100_80gb | GpuModel::H200 => 132,
            },
            large: spec.total_bytes >= 70 << 30 && !spec.name.contains("A100"),
        }
    }
}

/// `vllm serve`'s settings that decide memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Serving {
    /// `--gpu-memory-utilization` (0.9).
    pub gpu_memory_utilization: f64,
    /// `--max-model-len` (the config's positions).
    pub max_model_len: u64,
    /// `--max-num-seqs` (1,024 on an H100 or H200, else 256).
    pub max_num_seqs: u64,
    /// `--max-num-batched-tokens` (8,192 on an H100 or H200, else 2,048).
    pub max_num_batched_tokens: u64,
    /// `--block-size` (16).
    pub block_size: u64,
    /// `--kv-cache-dtype`'s element size: 2 for `auto` on 16-bit weights,
    /// 1 for `fp8`.
    pub kv_bytes: u64,
    /// `--enforce-eager`: no CUDA graphs.
    pub enforce_eager: bool,
    /// `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS` (1).
    pub estimate_cudagraphs: bool,
    /// `--tensor-parallel-size` (1): the GPUs, each of them this card,
    /// that share every layer; the answer is one rank's.
    pub tensor_parallel_size: u64,
}

impl Serving {
    /// `vllm serve`'s defaults on `card` (`EngineArgs.get_batch_defaults`
    /// for the OpenAI server).
    pub fn defaults(c: &HfConfig, card: &Card, dtype: Dtype) -> Serving {
        let big = card.large;
        Serving {
            gpu_memory_utilization: 0.9,
            max_model_len: c.max_positions,
            max_num_seqs: if big { 1024 } else { 256 },
            max_num_batched_tokens: if big { 8192 } else { 2048 },
            block_size: 16,
            kv_bytes: dtype.size_bytes(),
            enforce_eager: false,
            estimate_cudagraphs: true,
            tensor_parallel_size: 1,
        }
    }

    /// The batch sizes vLLM captures CUDA graphs for, by mode: piecewise
    /// graphs up to `min(2 × max_num_seqs, 512)` tokens (never past
    /// `max_num_batched_tokens`), full decode graphs up to
    /// `max_num_seqs` of those (`VllmConfig._set_cudagraph_sizes`).
    pub fn capture_sizes(&self) -> [Vec<u64>; 2] {
        if self.enforce_eager {
            return [Vec::new(), Vec::new()];
        }
        let max = (2 * self.max_num_seqs)
            .min(512)
            .min(self.max_num_batched_tokens);
        let mut sizes: Vec<u64> = [1, 2, 4].into_iter().filter(|&s| s <= max).collect();
        sizes.extend((8..(max + 1).min(256)).step_by(8));
        if max >= 256 {
            sizes.extend((256..=max).step_by(16));
        }
        let full = sizes
            .iter()
            .copied()
            .filter(|&s| s <= self.max_num_seqs)
            .collect();
        [sizes, full]
    }
}

/// The start-up, as vLLM's log reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct Startup {
    /// `cudaMemGetInfo`'s total, and `× gpu_memory_utilization`.
    pub total: u64,
    pub requested: u64,
    /// "Model loading took …": the weights' allocated bytes.
    pub weights: u64,
    /// What the instance holds after profiling: the weights' segments,
    /// the model runner's buffers and the sampler's, and memory outside
    /// PyTorch.
    pub consumed: u64,
    /// The profile run's transient peak over what stayed.
    pub transient_peak: u64,
    /// The CUDA graphs' estimate (0 with `enforce_eager` or the estimate
    /// off).
    pub cudagraph: u64,
    /// "Available KV cache memory" (negative: nothing left).
    pub available: i64,
    /// One block of every layer's keys and values.
    pub block_bytes: u64,
    pub num_blocks: u64,
    /// "GPU KV cache size: … tokens" and "Maximum concurrency for … tokens
    /// per request".
    pub kv_tokens: u64,
    pub max_concurrency: f64,
    /// The error vLLM stops with, if it does not start.
    pub refused: Option<String>,
    /// The longest `max_model_len` the cache would take.
    pub longest_model_len: u64,
}

/// The type vLLM loads the weights in for `--dtype auto`: the config's,
/// a float32 config's downcast to the card's first 16-bit type, and
/// bfloat16 as float16 below compute capability 8.0.
pub fn auto_dtype(c: &HfConfig, card: &Card) -> Dtype {
    let bf16 = card.compute_capability >= (8, 0);
    match c.dtype {
        Dtype::Float32 | Dtype::Bfloat16 if bf16 => Dtype::Bfloat16,
        Dtype::Float32 | Dtype::Bfloat16 => Dtype::Float16,
        d => d,
    }
}

/// Refuses what vLLM would refuse, or what this plan does not model.
pub fn check(c: &HfConfig, card: &Card, dtype: Dtype, s: &Serving) -> Result<(), Invalid> {
    if matches!(c.arch, Arch::Gemma2 | Arch::Gemma3) || c.sliding_window > 0 {
        return Err(Invalid::from(
            "vLLM gives sliding-window layers a KV-cache group of their own; the serving plan models full attention in every layer (GPT-2, Llama, Mistral, Qwen, Phi-3)",
        ));
    }
    let (major, minor) = card.compute_capability;
    if dtype == Dtype::Bfloat16 && major < 8 {
        return Err(Invalid(format!(
            "Bfloat16 is only supported on GPUs with compute capability of at least 8.0 (this one has {major}.{minor}): use --dtype float16"
        )));
    }
    if !matches!(dtype, Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32) {
        return Err(Invalid(format!(
            "dtype is {}: bfloat16, float16 or float32",
            dtype.torch_name()
        )));
    }
    if !(s.gpu_memory_utilization > 0.0 && s.gpu_memory_utilization <= 1.0) {
        return Err(Invalid(format!(
            "gpu_memory_utilization is {}: above 0 and at most 1",
            s.gpu_memory_utilization
        )));
    }
    if s.max_model_len > c.max_positions {
        return Err(Invalid(format!(
            "max_model_len {} is longer than the model's {} positions (max_position_embeddings)",
            s.max_model_len, c.max_positions
        )));
    }
    if s.max_num_batched_tokens < s.max_num_seqs {
        return Err(Invalid(format!(
            "max_num_batched_tokens ({}) must be at least max_num_seqs ({})",
            s.max_num_batched_tokens, s.max_num_seqs
        )));
    }
    let tp = s.tensor_parallel_size;
    let (heads, kv_heads) = if c.arch == Arch::Gpt2 {
        (c.heads, c.heads)
    } else {
        (c.heads, c.kv_heads)
    };
    if ![1, 2, 4, 8].contains(&tp) {
        return Err(Invalid(format!(
            "tensor_parallel_size is {tp}: 1, 2, 4 or 8 GPUs"
        )));
    }
    if heads % tp != 0 || (kv_heads % tp != 0 && tp % kv_heads != 0) || c.intermediate % tp != 0 {
        return Err(Invalid(format!(
            "Total number of attention heads ({heads}), of key-value heads ({kv_heads}) and the MLP's width ({}) must be divisible by tensor parallel size ({tp})",
            c.intermediate
        )));
    }
    if ![8, 16, 32, 64, 128].contains(&s.block_size) {
        return Err(Invalid(format!(
            "block_size is {}: 8, 16, 32, 64 or 128",
            s.block_size
        )));
    }
    Ok(())
}

/// One layer's keys and values for `block_size` tokens, on one rank.
pub fn page_bytes(c: &HfConfig, s: &Serving) -> u64 {
    let kv = profile::Shard::of(c, s.tensor_parallel_size).kv;
    2 * s.block_size * kv * s.kv_bytes
}

fn cdiv(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// vLLM's start-up on `gpu`: the profile, the CUDA graphs' estimate, the
/// KV cache's blocks and tokens, and whether it starts.
pub fn startup(c: &HfConfig, card: &Card, dtype: Dtype, s: &Serving) -> Result<Startup, Invalid> {
    check(c, card, dtype, s)?;
    let total = card.total;
    let requested = (total as f64 * s.gpu_memory_utilization) as u64;
    let profiled = profile::profile(c, card, dtype, s)?;
    if let Some(message) = profiled.out_of_memory {
        return Ok(Startup {
            total,
            requested,
            weights: profiled.weights,
            consumed: 0,
            transient_peak: 0,
            cudagraph: 0,
            available: 0,
            block_bytes: page_bytes(c, s) * c.layers,
            num_blocks: 0,
            kv_tokens: 0,
            max_concurrency: 0.0,
            refused: Some(message),
            longest_model_len: 0,
        });
    }
    let consumed = profiled.reserved_after + NON_TORCH_BYTES;
    let cudagraph = if s.estimate_cudagraphs {
        profiled.cudagraph
    } else {
        0
    };
    let available =
        requested as i64 - (consumed + profiled.transient_peak) as i64 - cudagraph as i64;
    let block_bytes = page_bytes(c, s) * c.layers;
    let num_blocks = available.max(0) as u64 / block_bytes;
    let per_request = cdiv(s.max_model_len, s.block_size);
    let max_concurrency = num_blocks as f64 / per_request as f64;
    let kv_tokens = (max_concurrency * s.max_model_len as f64) as u64;
    // vLLM checks against the blocks left once its pool's null block
    // is set aside.
    let usable = available - block_bytes as i64;
    let needed = per_request.saturating_mul(block_bytes);
    let longest_model_len =
        (usable.max(0) as u64 / block_bytes * s.block_size).min(c.max_positions);
    let refused = if available <= 0 {
        Some("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.".to_string())
    } else if needed > usable.max(0) as u64 {
        Some(format!(
            "To serve at least one request with the model's max seq len ({}), ({:.2} GiB KV cache is needed, which is larger than the available KV cache memory ({:.2} GiB). Based on the available memory, the estimated maximum model length is {}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
            s.max_model_len,
            gib(needed as i64),
            gib(usable),
            longest_model_len
        ))
    } else {
        None
    };
    Ok(Startup {
        total,
        requested,
        weights: profiled.weights,
        consumed,
        transient_peak: profiled.transient_peak,
        cudagraph,
        available,
        block_bytes,
        num_blocks,
        kv_tokens,
        max_concurrency,
        refused,
        longest_model_len,
    })
}

/// Bytes in GiB, as vLLM's log prints them.
pub fn gib(bytes: i64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

#[cfg(test)]
mod tests;
