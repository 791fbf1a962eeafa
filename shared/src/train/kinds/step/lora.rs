//! peft's LoRA linear layer (`lora.Linear` with `lora_dropout=0`):
//! `result = base_layer(x); result = result + lora_B(lora_A(x)) * scaling`,
//! the base layer frozen. Forward, `lora_A` saves its input and `lora_B`
//! `lora_A`'s output (r wide); the frozen `addmm` saves nothing that needs
//! memory (autograd saves `mat1` only for the weight's gradient). Backward
//! (`MulBackward`, then each `MmBackward`, the weight's gradient first), the
//! adapters get their gradients, and the input's gradient (when the input
//! requires one) is `lora_A`'s part plus the base layer's, summed.

use super::{Tape, H};
use crate::train::kinds::TransformerShape;

/// A LoRA layer's backward: what it needs and where its gradients go.
pub(super) struct Node {
    /// The input `lora_A` saved, when only it holds it.
    pub input: Option<H>,
    /// `lora_A`'s output, saved by `lora_B` (a layer with adapters has one).
    pub hidden: Option<H>,
    /// The output's gradient.
    pub incoming: H,
    /// `incoming * scaling`, when already made.
    pub scaled: Option<H>,
    /// The base layer's weight in `parameters()`: `lora_A` is 2 after it,
    /// `lora_B` 3.
    pub weight: usize,
    pub fans: (u64, u64),
    /// The layer is the last user of `incoming`.
    pub incoming_dies: bool,
    /// Its input requires a gradient (the first block's does not: the
    /// embeddings are frozen).
    pub input_grad: bool,
}

impl Tape<TransformerShape> {
    pub(super) fn rows(&self) -> u64 {
        self.batch * self.shape.seq_len
    }

    /// `nn.Linear` on the tokens (`addmm`), or with LoRA the wrapped layer:
    /// its output and `lora_A`'s output when kept for backward.
    pub(super) fn linear(&mut self, fan_out: u64, keep: bool) -> (H, Option<H>) {
        let base = self.matmul("addmm", self.tokens(fan_out));
        let r = self.shape.lora_rank;
        if r == 0 {
            return (base, None);
        }
        let hidden = self.matmul("mm", vec![self.rows(), r]);
        let up = self.matmul("mm", vec![self.rows(), fan_out]);
        if !keep {
            self.free(hidden);
        }
        let scaled = self.alloc("mul", self.tokens(fan_out));
        self.free(up);
        let out = self.alloc("add", self.tokens(fan_out));
        self.free_all(&[scaled, base]);
        (out, keep.then_some(hidden))
    }

    /// `MulBackward`: the output's gradient times `scaling`, which needs
    /// nothing saved (a checkpointed block makes it before recomputing).
    pub(super) fn scale(&mut self, fan_out: u64) -> H {
        self.alloc("mul", self.tokens(fan_out))
    }

    /// The adapters' gradients and the input's, if it requires one.
    pub(super) fn lora_backward(&mut self, n: Node, ckpt: bool) -> Option<H> {
        let (r, (fan_in, fan_out)) = (self.shape.lora_rank, n.fans);
        let scaled = n.scaled.unwrap_or_else(|| self.scale(fan_out));
        let base_grad = n.input_grad;
        if !base_grad && n.incoming_dies {
            self.free(n.incoming);
        }
        self.grad_mm(n.weight + 3, vec![fan_out, r]);
        let g_hidden = self.matmul("mm", vec![self.rows(), r]);
        let hidden = n.hidden.expect("a LoRA layer keeps lora_A's output");
        self.node_done(&[hidden], scaled, ckpt);
        self.grad_mm(n.weight + 2, vec![r, fan_in]);
        let input: Vec<H> = n.input.into_iter().collect();
        if !base_grad {
            self.node_done(&input, g_hidden, ckpt);
            return None;
        }
        let g_lora = self.matmul("mm", vec![self.rows(), fan_in]);
        self.node_done(&input, g_hidden, ckpt);
        let g_base = self.matmul("mm", vec![self.rows(), fan_in]);
        if n.incoming_dies {
            self.free(n.incoming);
        }
        let g = self.alloc("add", self.tokens(fan_in));
        self.free_all(&[g_lora, g_base]);
        Some(g)
    }
}
