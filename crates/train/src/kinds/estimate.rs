//! What a step holds, predicted from the shapes:
//! the activations autograd saves, in closed form (the formulas
//! docs/simulator.md gives, equal to the step's own count), and the
//! step's peak over what lived before it, by adding up the sizes its
//! program allocates and frees in order (no allocator runs).

use super::step::checkpoint_segments;
use super::step::sdp::{self, Kernel};
use super::step::{Attention, Op, Options, Program, Role};
use super::{blocks, CnnShape, MlpShape, Norm, TransformerShape};
use crate::cublas::{BlasThread, Gemm};
use vramlab_core::types::Dtype;
use vramlab_device::framework::BlasWorkspaces;

/// What a transformer's forward pass leaves saved for backward (its
/// log-probabilities, loss and NLL's total weight included), and the part
/// of it attention alone keeps: eager attention's B·H·S² probabilities and
/// S² mask per layer, or the fused kernel's B·H·S log-sum-exp. LoRA adds
/// each linear layer's r-wide `lora_A` output; with the embeddings and the
/// head frozen, the position ids, the first block's input and norm
/// statistics and the final norm's output are not saved (under autocast,
/// the adapters' weight casts are, but not the first block's `c_attn`
/// weight casts). Under autocast
/// the matrix products' inputs and outputs are in the autocast type, the
/// residual stream, the norms and the probabilities stay float32, and
/// each weight's cast, the probabilities' cast and NLL's float32 copy of
/// the log-probabilities are saved too.
pub fn transformer_saved(t: &TransformerShape, batch: u64, options: Options) -> (u64, u64) {
    let (b, s, h, d) = (batch, t.seq_len, t.heads, t.width);
    let amp = options.amp.is_some();
    let lo = options.amp.map_or(4, |dtype| dtype.size_bytes());
    let tokens = |n: u64, bytes: u64| blocks(b * s * n * bytes);
    let (hidden, hidden_lo) = (tokens(d, 4), tokens(d, lo));
    let wide_lo = tokens(t.mlp_ratio * d, lo);
    let stats = match t.norm {
        Norm::LayerNorm => 2 * tokens(1, 4),
        Norm::RmsNorm => tokens(1, 4),
    };
    let low = options.amp.unwrap_or(Dtype::Float32);
    let kernel = sdp::select(options.gpu, low, d / h, true);
    let attention = match (options.attention, kernel) {
        (Attention::Sdpa, Kernel::Efficient) => blocks(4 * b * h * s.div_ceil(32) * 32),
        (Attention::Sdpa, Kernel::Math) | (Attention::Eager, _) => {
            let probs_low = if amp { blocks(lo * b * h * s * s) } else { 0 };
            blocks(4 * b * h * s * s) + probs_low + blocks(s * s)
        }
        (Attention::Sdpa, _) => blocks(4 * b * h * s),
    };
    let wide = t.mlp_ratio * d;
    let weight_casts = if amp {
        blocks(3 * d * d * lo) + blocks(d * d * lo) + 2 * blocks(wide * d * lo)
    } else {
        0
    };
    let layers = u64::from(t.layers);
    let (lora, r) = (t.lora_rank > 0, t.lora_rank);
    // Each `lora_A` output, and under autocast the adapters' weight casts.
    let adapter_casts: u64 = [(d, 3 * d), (d, d), (d, wide), (wide, d)]
        .iter()
        .map(|&(fan_in, fan_out)| blocks(r * fan_in * lo) + blocks(fan_out * r * lo))
        .sum();
    let adapters = match (lora, amp) {
        (false, _) => 0,
        (true, false) => 4 * tokens(r, 4),
        (true, true) => 4 * tokens(r, lo) + adapter_casts,
    };
    // The first block's input needs no gradient: its `c_attn` saves
    // neither its base weight's cast nor its `lora_A` weight's.
    let first_casts = if amp {
        blocks(3 * d * d * lo) + blocks(r * d * lo)
    } else {
        0
    };
    let (per_layer, first_unsaved) = if options.checkpointing {
        // Only each block's input; the block is recomputed in backward.
        (hidden, 0)
    } else {
        // The input and the residual (float32); the norms' outputs (or
        // their casts), q, k, v and the heads' output (eager's copies or
        // the fused kernel's projection and output); the MLP's input to
        // GELU and its output; the norms' statistics.
        let qkv_out = match options.attention {
            Attention::Eager => 4 * hidden_lo,
            Attention::Sdpa => tokens(3 * d, lo) + hidden_lo,
        };
        let all = 2 * hidden + 2 * hidden_lo + qkv_out + 2 * wide_lo + 2 * stats + attention;
        (
            all + adapters + weight_casts,
            if lora {
                hidden + stats + first_casts
            } else {
                0
            },
        )
    };
    // The final norm's input and output (a frozen head saves no input;
    // under autocast, the output's cast), its statistics and the
    // log-probabilities (under autocast also their float32 copy and the
    // head weight's cast).
    let output = if lora { 0 } else { hidden_lo };
    let log_probs = tokens(t.vocab, lo);
    let amp_head = if amp {
        tokens(t.vocab, 4) + blocks(t.vocab * d * lo)
    } else {
        0
    };
    let head = hidden + output + stats + log_probs + amp_head;
    let positions = if lora { 0 } else { blocks(s * 8) };
    let total = positions + layers * per_layer - first_unsaved + head + 2 * 512;
    let kept = if options.checkpointing {
        0
    } else {
        layers * attention
    };
    (total, kept)
}

/// What a CNN's forward pass leaves saved for backward: per block the
/// convolution's output (BatchNorm's input), the batch statistics, ReLU's
/// output (the pooling's input), the pooled output (the next convolution's
/// or the head's input) and the pooling's int64 indices; then the
/// log-probabilities, loss and total weight. Under autocast the maps are in
/// the autocast type, and the weights' casts, the images' cast and NLL's
/// float32 copy of the log-probabilities are saved too. With each block
/// checkpointed, only the pooled outputs (the next block's input) and
/// the head's weight cast stay.
pub fn cnn_saved(c: &CnnShape, batch: u64, options: Options) -> u64 {
    let amp = options.amp;
    let lo = amp.map_or(4, |dtype| dtype.size_bytes());
    let mut total = blocks(batch * c.classes * lo) + 2 * 512;
    let mut c_in = c.channels;
    for b in 0..c.blocks {
        let channels = c.width << b;
        let side = c.image_size >> b;
        let pooled = batch * channels * (side / 2) * (side / 2);
        total += blocks(pooled * lo);
        c_in = channels;
        if options.checkpointing {
            continue;
        }
        let maps = blocks(batch * channels * side * side * lo);
        let stats = 2 * blocks(channels * 4);
        total += 2 * maps + stats + blocks(pooled * 8);
        if amp.is_some() {
            let c_in = if b == 0 { c.channels } else { channels / 2 };
            total += blocks(channels * c_in * 9 * lo);
            if b == 0 {
                total += blocks(batch * c_in * side * side * lo);
            }
        }
    }
    if amp.is_some() {
        let side = c.image_size >> c.blocks;
        let features = c_in * side * side;
        total += blocks(batch * c.classes * 4) + blocks(c.classes * features * lo);
    }
    total
}

/// What an MLP's forward pass leaves saved for backward: each ReLU's
/// output (the next Linear's input too), the log-probabilities, loss and
/// total weight; under autocast the input's cast, the weights' casts of
/// every layer after the first and NLL's float32 copy. Under
/// `checkpoint_sequential`, each checkpoint after the first holds its
/// input (a hidden-wide tensor), and only the last, plain run's modules
/// save: its ReLUs their outputs, a Linear that starts it its input, and
/// its Linears' weight casts.
pub fn mlp_saved(m: &MlpShape, batch: u64, options: Options) -> u64 {
    let lo = options.amp.unwrap_or(m.dtype).size_bytes();
    let hidden = blocks(batch * m.width * lo);
    let layers = m.layers as u64;
    let modules = 2 * layers + 1;
    let (held, start) = if options.checkpointing {
        let segments = u64::from(checkpoint_segments(m.layers));
        let size = modules / segments;
        (segments.saturating_sub(2) * hidden, (segments - 1) * size)
    } else {
        (0, 0)
    };
    // ReLUs at odd positions start..modules.
    let relus = layers - start / 2;
    let first_input = match (start, options.amp) {
        (0, Some(_)) => blocks(batch * m.input_dim * lo),
        (0, None) => 0,
        (s, _) if s % 2 == 0 => hidden,
        _ => 0,
    };
    let casts = match options.amp {
        Some(_) => (start.div_ceil(2).max(1)..=layers)
            .map(|l| {
                let out = if l == layers { m.classes } else { m.width };
                blocks(out * m.width * lo)
            })
            .sum(),
        None => 0,
    };
    let nll_copy = match options.amp {
        Some(_) => blocks(batch * m.classes * 4),
        None => 0,
    };
    let head = blocks(batch * m.classes * lo) + nll_copy + 2 * 512;
    held + relus * hidden + first_input + casts + head
}

/// The workspaces a step keeps once it ran (none when they are per
/// call): a cuBLAS one per thread that made a product, and cuBLASLt's own
/// per thread that made an `addmm` unless it shares cuBLAS's.
pub fn kept_workspaces(program: &Program, blas: &BlasWorkspaces) -> u64 {
    if blas.per_call {
        return 0;
    }
    let mut kept = 0;
    for thread in [BlasThread::Main, BlasThread::Autograd] {
        let calls = |gemm: Option<Gemm>| {
            program.ops.iter().any(|op| match *op {
                Op::Blas(t, g) => t == thread && gemm.is_none_or(|want| want == g),
                _ => false,
            })
        };
        if calls(None) {
            kept += blas.cublas_bytes;
        }
        if calls(Some(Gemm::Lt)) && !blas.lt_shares_cublas {
            kept += blas.lt_bytes;
        }
    }
    kept
}

/// A program added up: bytes live when backward starts and at the most,
/// over what lived before the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    pub saved: u64,
    pub peak: u64,
}

/// Adds up `program`; with `grads_exist`, each parameter's new gradient
/// is added into the `.grad` there and dies at once. Under per-call
/// workspaces (PyTorch 2.15's) each matrix product holds one for its call.
pub fn walk(program: &Program, grads_exist: bool, blas: &BlasWorkspaces) -> Walk {
    let call_workspace = |gemm| match (blas.per_call, gemm) {
        (false, _) => 0,
        (true, Gemm::Cublas) => blas.cublas_bytes,
        (true, Gemm::Lt) => blas.lt_bytes,
    };
    let (mut live, mut peak, mut saved) = (0u64, 0u64, None);
    // A gradient added into a kept `.grad` lives through its product's call.
    let mut added = 0;
    for op in &program.ops {
        if !matches!(op, Op::Blas(..)) {
            added = 0;
        }
        match *op {
            Op::Alloc(i) => {
                let a = &program.allocs[i];
                let bytes = blocks(a.bytes());
                peak = peak.max(live + bytes);
                let transient = grads_exist && matches!(a.role, Role::Grad(_));
                if transient {
                    added = bytes;
                } else {
                    live += bytes;
                }
                if a.role == Role::Backward && saved.is_none() {
                    saved = Some(live - bytes);
                }
            }
            Op::Free(i) => live -= blocks(program.allocs[i].bytes()),
            Op::Blas(_, gemm) => peak = peak.max(live + added + call_workspace(gemm)),
            Op::Rebind | Op::Release(_) | Op::ForwardEnd => {}
            Op::Begin(_) | Op::End(_) | Op::Update(_) => {}
            Op::Forward(_) | Op::Returned(_) | Op::Phase(_) => {}
            Op::Workspace(bytes) => peak = peak.max(live + added + blocks(bytes)),
        }
    }
    Walk {
        saved: saved.unwrap_or(live),
        peak,
    }
}
