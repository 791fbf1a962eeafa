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
    /// `incoming * scaling` (LoRA), or its cast (autocast), when already
    /// made.
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
    /// Under autocast, the weight's cast, which the node saved.
    pub weight_cast: Option<H>,
    /// `input` is an autocast cast of a float32 tensor.
    pub input_cast: bool,
}

/// A linear layer's forward: its output and what its backward needs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Linear {
    pub out: H,
    /// With LoRA, `lora_A`'s output, when kept.
    pub hidden: Option<H>,
    /// The input `addmm` saves: `x`, or under autocast its cast.
    pub input: H,
    /// Under autocast, the weight's cast (`addmm` saves it).
    pub weight: Option<H>,
}

impl Tape<TransformerShape> {
    pub(super) fn rows(&self) -> u64 {
        self.batch * self.shape.seq_len
    }

    /// `nn.Linear` (parameter `weight`, its bias next) on the tokens `x`
    /// (`addmm`; under autocast on casts of the bias, the weight and `x`),
    /// or with LoRA the wrapped layer.
    pub(super) fn linear(&mut self, x: H, weight: usize, fans: (u64, u64), keep: bool) -> Linear {
        let (fan_in, fan_out) = fans;
        self.cast_param(weight + 1, vec![fan_out]);
        let w = self.cast_param(weight, vec![fan_out, fan_in]);
        let input = self.cast_input(x);
        let base = self.matmul("addmm", self.tokens(fan_out));
        match w {
            Some(w) if keep => self.save_cast(w),
            Some(_) if input != x => self.free(input),
            _ => {}
        }
        let r = self.shape.lora_rank;
        let linear = Linear {
            out: base,
            hidden: None,
            input,
            weight: w,
        };
        if r == 0 {
            return linear;
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
        Linear {
            out,
            hidden: keep.then_some(hidden),
            ..linear
        }
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
