//! A transformer's training step as PyTorch runs it, op by op: every tensor
//! an aten op creates (its bytes, in 512-byte blocks) and every free, from
//! the embeddings through the loss, backward and a foreach Adam step to
//! `zero_grad(set_to_none=True)`, in float32, the batch already on the
//! device, Adam's state already there. What each op saves follows autograd's
//! derivatives (`tools/autograd/derivatives.yaml`): LayerNorm saves its input,
//! mean and rstd; GELU its input; softmax its output; `masked_fill` its mask;
//! each `addmm` its input; `at::matmul` copies non-contiguous heads before
//! `bmm`; fused attention saves q, k, v, its output and the log-sum-exp, and
//! no S x S matrix. `tests/reference/step_trace.py` records the same step
//! from PyTorch's own ops; the tests hold this to it event by event.

use super::TransformerShape;

/// How attention is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attention {
    /// `softmax(q @ k.T * scale, masked) @ v`: B x H x S x S tensors.
    Eager,
    /// `F.scaled_dot_product_attention` with a fused (flash) kernel.
    Sdpa,
}

/// One event: an op made a tensor of `bytes` (> 0), or a tensor of
/// `-bytes` was freed (`op` is `free`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub op: &'static str,
    pub bytes: i64,
}

const FREE: &str = "free";
const F32: u64 = 4;

/// The step's events, in order.
pub fn events(t: &TransformerShape, batch: u64, attention: Attention) -> Vec<Event> {
    let mut tape = Tape::new(t, batch);
    tape.forward(attention);
    tape.backward(attention);
    tape.optimizer(t);
    tape.events
}

/// The most bytes the step has live at once, over what lived before it.
pub fn peak(events: &[Event]) -> u64 {
    let mut live = 0i64;
    let mut peak = 0i64;
    for e in events {
        live += e.bytes;
        peak = peak.max(live);
    }
    peak as u64
}

/// The sizes of a step's tensors, and the events so far.
struct Tape {
    events: Vec<Event>,
    layers: u32,
    /// B·S·D: a hidden state.
    act: u64,
    /// B·S: LayerNorm's mean or rstd.
    stat: u64,
    /// B·H·S·S: attention scores.
    scores: u64,
    /// S·S booleans: the causal mask.
    mask: u64,
    /// B·H·S: the log-sum-exp fused attention saves.
    lse: u64,
    /// B·S·V: the logits.
    logits: u64,
    width: u64,
    ratio: u64,
    vocab: u64,
    seq_len: u64,
}

impl Tape {
    fn new(t: &TransformerShape, batch: u64) -> Self {
        let tokens = batch * t.seq_len;
        Self {
            events: Vec::new(),
            layers: t.layers,
            act: tokens * t.width * F32,
            stat: tokens * F32,
            scores: batch * t.heads * t.seq_len * t.seq_len * F32,
            mask: t.seq_len * t.seq_len,
            lse: batch * t.heads * t.seq_len * F32,
            logits: tokens * t.vocab * F32,
            width: t.width,
            ratio: t.mlp_ratio,
            vocab: t.vocab,
            seq_len: t.seq_len,
        }
    }

    fn alloc(&mut self, op: &'static str, bytes: u64) {
        self.events.push(Event {
            op,
            bytes: blocks(bytes) as i64,
        });
    }

    fn free(&mut self, bytes: u64) {
        self.events.push(Event {
            op: FREE,
            bytes: -(blocks(bytes) as i64),
        });
    }

    fn layer_norm(&mut self) {
        let (act, stat) = (self.act, self.stat);
        self.alloc("native_layer_norm", act);
        self.alloc("native_layer_norm", stat);
        self.alloc("native_layer_norm", stat);
    }

    /// LayerNorm's backward, then its incoming gradient, saved input, mean
    /// and rstd go.
    fn layer_norm_backward(&mut self) {
        let (act, stat, vector) = (self.act, self.stat, self.width * F32);
        self.alloc("native_layer_norm_backward", act);
        self.alloc("native_layer_norm_backward", vector);
        self.alloc("native_layer_norm_backward", vector);
        for bytes in [act, act, stat, stat] {
            self.free(bytes);
        }
    }

    /// A linear layer's backward: the input's gradient, the weight's, the
    /// bias's (`sum`).
    fn linear_backward(&mut self, input: u64, fan_in: u64, fan_out: u64) {
        self.alloc("mm", input);
        self.alloc("mm", fan_in * fan_out * F32);
        self.alloc("sum", fan_out * F32);
    }

    /// A residual add's backward: the two gradients summed, both go.
    fn residual_backward(&mut self) {
        let act = self.act;
        self.alloc("add", act);
        self.free(act);
        self.free(act);
    }
}

fn blocks(bytes: u64) -> u64 {
    bytes.div_ceil(512) * 512
}

mod passes;

#[cfg(test)]
mod tests;
