//! What a CNN's or a transformer's step holds, predicted from the shapes:
//! the activations autograd saves, in closed form (the formulas
//! docs/estimate.md explains, equal to the step's own count), and the
//! step's peak over what lived before it, by adding up the sizes its
//! program allocates and frees in order (no allocator runs).

use super::step::{Attention, Op, Options, Program, Role};
use super::{blocks, CnnShape, Norm, TransformerShape};

/// What a transformer's forward pass leaves saved for backward (its
/// log-probabilities, loss and NLL's total weight included), and the part
/// of it attention alone keeps: eager attention's B·H·S² probabilities and
/// S² mask per layer, or the fused kernel's B·H·S log-sum-exp. LoRA adds
/// each linear layer's r-wide `lora_A` output; with the embeddings and the
/// head frozen, the position ids, the first block's input and norm
/// statistics and the final norm's output are not saved.
pub fn transformer_saved(t: &TransformerShape, batch: u64, options: Options) -> (u64, u64) {
    let (b, s, h) = (batch, t.seq_len, t.heads);
    let hidden = blocks(b * s * t.width * 4);
    let wide = blocks(b * s * t.mlp_ratio * t.width * 4);
    let stats = match t.norm {
        Norm::LayerNorm => 2 * blocks(b * s * 4),
        Norm::RmsNorm => blocks(b * s * 4),
    };
    let attention = match options.attention {
        Attention::Eager => blocks(4 * b * h * s * s) + blocks(s * s),
        Attention::Sdpa => blocks(4 * b * h * s),
    };
    let layers = u64::from(t.layers);
    let lora = t.lora_rank > 0;
    let adapters = if lora {
        4 * blocks(b * s * t.lora_rank * 4)
    } else {
        0
    };
    let (per_layer, first_unsaved) = if options.checkpointing {
        // Only each block's input; the block is recomputed in backward.
        (hidden, 0)
    } else {
        // Input, norms' outputs and statistics, q, k, v and the heads'
        // output (eager's copies or the fused kernel's projection and
        // output), the residual, the MLP's input to GELU and its output.
        let all = 8 * hidden + 2 * wide + 2 * stats + attention + adapters;
        (all, if lora { hidden + stats } else { 0 })
    };
    // The final norm's input and output (a frozen head saves no input),
    // its statistics and the log-probabilities.
    let head = if lora { 1 } else { 2 } * hidden + stats + blocks(b * s * t.vocab * 4);
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
/// log-probabilities, loss and total weight.
pub fn cnn_saved(c: &CnnShape, batch: u64) -> u64 {
    let mut total = blocks(batch * c.classes * 4) + 2 * 512;
    for b in 0..c.blocks {
        let channels = c.width << b;
        let side = c.image_size >> b;
        let maps = blocks(batch * channels * side * side * 4);
        let pooled = batch * channels * (side / 2) * (side / 2);
        let stats = 2 * blocks(channels * 4);
        total += 2 * maps + stats + blocks(pooled * 4) + blocks(pooled * 8);
    }
    total
}

/// A program added up: bytes live when backward starts and at the most,
/// over what lived before the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk {
    pub saved: u64,
    pub peak: u64,
}

/// Adds up `program`; with `grads_exist`, each parameter's new gradient
/// is added into the `.grad` there and dies at once.
pub fn walk(program: &Program, grads_exist: bool) -> Walk {
    let (mut live, mut peak, mut saved) = (0u64, 0u64, None);
    for op in &program.ops {
        match *op {
            Op::Alloc(i) => {
                let a = &program.allocs[i];
                let bytes = blocks(a.bytes());
                peak = peak.max(live + bytes);
                let transient = grads_exist && matches!(a.role, Role::Grad(_));
                if !transient {
                    live += bytes;
                }
                if a.role == Role::Backward && saved.is_none() {
                    saved = Some(live - bytes);
                }
            }
            Op::Free(i) => live -= blocks(program.allocs[i].bytes()),
            Op::Blas(_) | Op::Rebind => {}
        }
    }
    Walk {
        saved: saved.unwrap_or(live),
        peak,
    }
}
