//! peft's LoRA linear layer (`lora.Linear` with `lora_dropout=0`):
//! `result = base_layer(x); result = result + lora_B(lora_A(x)) * scaling`,
//! the base layer frozen. Forward, `lora_A` saves its input and `lora_B`
//! `lora_A`'s output (r wide); the frozen `addmm` saves nothing that needs
//! memory (autograd saves `mat1` only for the weight's gradient). Backward
//! (`MulBackward`, then each `MmBackward`, the weight's gradient first), the
//! adapters get their gradients, and the input's gradient (when the input
//! requires one) is `lora_A`'s part plus the base layer's, summed.
//!
//! Under autocast the frozen weight and bias are cast at every use (the
//! cache keeps only casts of parameters that require a gradient) and the
//! base layer's cast of `x` dies at once; `lora_A` casts `x` again and
//! saves that cast. Backward, each cast's `ToCopyBackward` runs as soon as
//! its gradient is ready: the adapters' `.grad`s, and a float32 input's two
//! gradients each back in float32 before they are summed.

use super::{param_or_cast, Arg, Calc, Role, Tape, H};
use crate::kinds::TransformerShape;
use vramlab_core::types::Dtype;

/// A linear layer: its weight's index in `parameters()` (its bias next;
/// with LoRA `lora_A` 2 after it, `lora_B` 3), its fans (in, out), and
/// whether its input requires a gradient.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layer {
    pub weight: usize,
    pub fans: (u64, u64),
    pub input_grad: bool,
}

/// A linear layer's backward: what it needs and where its gradients go.
pub(super) struct Node {
    pub layer: Layer,
    /// The input the layer read (`x`, or under autocast its cast).
    pub x: H,
    /// The input autograd saved (`x` or its cast), when only it holds it.
    pub input: Option<H>,
    /// `input` is an autocast cast of a float32 tensor.
    pub input_cast: bool,
    /// `lora_A`'s output, saved by `lora_B` (a layer with adapters has one).
    pub hidden: Option<H>,
    /// The output's gradient.
    pub incoming: H,
    /// The layer is the last user of `incoming`.
    pub incoming_dies: bool,
    /// Made before a checkpointed block's recomputation: `incoming`'s
    /// autocast cast, and (LoRA) the cast (or `incoming`) times `scaling`.
    pub early: Early,
    /// Under autocast, the weight casts autograd saved: the base layer's,
    /// `lora_A`'s, `lora_B`'s.
    pub casts: Casts,
    /// A tensor that dies with the node's saved tensors: a checkpointed
    /// block's input, held for the recomputation until its last saved
    /// tensor is gone.
    pub released: Option<H>,
}

/// What a checkpointed block's backward makes before recomputing.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Early {
    pub cast: Option<H>,
    pub scaled: Option<H>,
}

/// Under autocast, the weight casts a linear layer's forward saved.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Casts {
    pub weight: Option<H>,
    pub lora_a: Option<H>,
    pub lora_b: Option<H>,
}

/// A linear layer's forward: its output and what its backward needs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Linear {
    pub out: H,
    /// With LoRA, `lora_A`'s output, when kept.
    pub hidden: Option<H>,
    /// The input autograd saves: `x`, or under autocast its cast.
    pub input: H,
    pub casts: Casts,
}

/// The start of a LoRA layer's forward, up to `lora_B`'s weight cast.
pub(super) struct Started {
    /// The base layer's output.
    pub base: H,
    pub hidden: H,
    pub input: H,
    pub casts: Casts,
    /// Under autocast, `lora_B`'s weight cast (saved or not).
    pub lora_b: Option<H>,
}

impl Tape<TransformerShape> {
    pub(super) fn rows(&self) -> u64 {
        self.batch * self.shape.seq_len
    }

    /// `nn.Linear` on the tokens `x` (`addmm`; under autocast on casts of
    /// the bias, the weight and `x`), or with LoRA the wrapped layer.
    pub(super) fn linear(&mut self, x: H, layer: Layer, keep: bool) -> Linear {
        if self.frozen() {
            return self.lora_linear(x, layer, keep);
        }
        let (fan_in, fan_out) = layer.fans;
        let b = self.cast_param(layer.weight + 1, vec![fan_out]);
        let w = self.cast_param(layer.weight, vec![fan_out, fan_in]);
        let input = self.cast_input(x);
        let calc = Calc::Linear {
            x: Arg::T(input),
            weight: param_or_cast(layer.weight, w),
            bias: param_or_cast(layer.weight + 1, b),
        };
        let out = self.matmul(("addmm", calc), self.tokens(fan_out));
        match w {
            Some(w) if keep => self.save_cast(w),
            Some(_) if input != x => self.free(input),
            _ => {}
        }
        Linear {
            out,
            hidden: None,
            input,
            casts: Casts {
                weight: w,
                ..Casts::default()
            },
        }
    }

    fn lora_linear(&mut self, x: H, layer: Layer, keep: bool) -> Linear {
        let fan_out = layer.fans.1;
        let s = self.lora_start(x, layer, keep);
        let b = param_or_cast(layer.weight + 3, s.lora_b);
        let up = Calc::mm(Arg::T(s.hidden), b, false, true);
        let up = self.matmul(("mm", up), vec![self.rows(), fan_out]);
        if !keep {
            self.free(s.hidden);
        }
        let scaled = self.scale(up, fan_out);
        self.free(up);
        let sum = ("add", Calc::Add(Arg::T(scaled), Arg::T(s.base)));
        let out = self.alloc(sum, self.tokens(fan_out));
        self.free_all(&[scaled, s.base]);
        Linear {
            out,
            hidden: keep.then_some(s.hidden),
            input: s.input,
            casts: s.casts,
        }
    }

    /// The frozen base layer, then `lora_A`, up to `lora_B`'s weight cast
    /// (where a checkpointed block's recomputation stops).
    pub(super) fn lora_start(&mut self, x: H, layer: Layer, keep: bool) -> Started {
        let ((fan_in, fan_out), r) = (layer.fans, self.shape.lora_rank);
        let bias = self.cast_frozen(layer.weight + 1, vec![fan_out]);
        let cast = self.cast_frozen(layer.weight, vec![fan_out, fan_in]);
        let base_input = self.cast_input(x);
        let calc = Calc::Linear {
            x: Arg::T(base_input),
            weight: param_or_cast(layer.weight, cast),
            bias: param_or_cast(layer.weight + 1, bias),
        };
        let base = self.matmul(("addmm", calc), self.tokens(fan_out));
        // `addmm` saves the weight's cast for the input's gradient only.
        let saves = keep && layer.input_grad;
        let (w, unsaved) = (cast.filter(|_| saves), cast.filter(|_| !saves));
        let base_input = Some(base_input).filter(|&h| h != x);
        let dead: Vec<H> = [bias, unsaved, base_input].into_iter().flatten().collect();
        self.free_all(&dead);
        let lora_a = self.cast_param(layer.weight + 2, vec![r, fan_in]);
        let input = self.cast_input(x);
        let a = param_or_cast(layer.weight + 2, lora_a);
        let hidden = Calc::mm(Arg::T(input), a, false, true);
        let hidden = self.matmul(("mm", hidden), vec![self.rows(), r]);
        if !keep && input != x {
            self.free(input);
        }
        let lora_b = self.cast_param(layer.weight + 3, vec![fan_out, r]);
        let casts = Casts {
            weight: w,
            lora_a: lora_a.filter(|_| keep && layer.input_grad),
            lora_b: lora_b.filter(|_| keep),
        };
        for c in [casts.lora_a, casts.lora_b].into_iter().flatten() {
            self.save_cast(c);
        }
        Started {
            base,
            hidden,
            input,
            casts,
            lora_b,
        }
    }

    /// `x * scaling`: forward, `lora_B`'s output; backward (`MulBackward`,
    /// which needs nothing saved: a checkpointed block makes it before
    /// recomputing), the output's gradient.
    pub(super) fn scale(&mut self, x: H, fan_out: u64) -> H {
        let scale = Calc::Scale(Arg::T(x), self.shape.lora_scaling());
        self.alloc(("mul", scale), self.tokens(fan_out))
    }

    /// The engine's `validate_outputs` casts a float32 gradient to the
    /// type the node computes in; the float32 one dies at once when
    /// nothing else holds it. Returns the gradient the node uses and
    /// whether the node is its last user.
    pub(super) fn incoming(&mut self, n: &Node) -> (H, bool) {
        let cast = match n.early.cast {
            Some(cast) => cast,
            None => self.cast_to(n.incoming, self.low()),
        };
        if cast == n.incoming {
            return (cast, n.incoming_dies);
        }
        if n.incoming_dies {
            self.free(n.incoming);
        }
        (cast, true)
    }

    /// The adapters' gradients and the input's, if it requires one.
    pub(super) fn lora_backward(&mut self, n: Node, ckpt: bool) -> Option<H> {
        let (r, (fan_in, fan_out)) = (self.shape.lora_rank, n.layer.fans);
        let (incoming, dies) = self.incoming(&n);
        let scaled = n
            .early
            .scaled
            .unwrap_or_else(|| self.scale(incoming, fan_out));
        let input_grad = n.layer.input_grad;
        if !input_grad && dies {
            self.free(incoming);
        }
        let (a, b) = (n.layer.weight + 2, n.layer.weight + 3);
        let hidden = n.hidden.expect("a LoRA layer keeps lora_A's output");
        let (g_out, h) = (Arg::T(scaled), Arg::T(hidden));
        let g_b = self.weight_grad_mm(b, Calc::mm(g_out, h, true, false), vec![fan_out, r]);
        let b_weight = param_or_cast(b, n.casts.lora_b);
        let g_hidden = Calc::mm(g_out, b_weight, false, false);
        let g_hidden = self.matmul(("mm", g_hidden), vec![self.rows(), r]);
        let saved = saved_order(n.casts.lora_b, Some(hidden), ckpt);
        self.node_done(&saved, scaled, ckpt);
        self.weight_grad_done(g_b, b);
        let (g_h, x) = (Arg::T(g_hidden), Arg::T(n.x));
        let g_a = self.weight_grad_mm(a, Calc::mm(g_h, x, true, false), vec![r, fan_in]);
        let a_weight = param_or_cast(a, n.casts.lora_a);
        let g_lora = Calc::mm(g_h, a_weight, false, false);
        let g_lora = input_grad.then(|| self.matmul(("mm", g_lora), vec![self.rows(), fan_in]));
        self.node_done(&saved_order(n.casts.lora_a, n.input, ckpt), g_hidden, ckpt);
        if let Some(x) = n.released {
            self.free(x);
        }
        let g_lora = g_lora.map(|g| self.input_grad_done(g, n.input_cast));
        self.weight_grad_done(g_a, a);
        let g_lora = g_lora?;
        let base_weight = param_or_cast(n.layer.weight, n.casts.weight);
        let g_base = Calc::mm(Arg::T(incoming), base_weight, false, false);
        let g_base = self.matmul(("mm", g_base), vec![self.rows(), fan_in]);
        let weight: Vec<H> = n.casts.weight.into_iter().collect();
        if dies {
            self.node_done(&weight, incoming, ckpt);
        } else {
            self.free_all(&weight);
        }
        let g_base = self.input_grad_done(g_base, n.input_cast);
        let sum = ("add", Calc::Add(Arg::T(g_lora), Arg::T(g_base)));
        let g = self.alloc_as(sum, self.tokens(fan_in), self.dtype_of(g_base), self.role);
        self.free_all(&[g_lora, g_base]);
        Some(g)
    }

    /// An input's gradient back through its autocast cast, when it had
    /// one.
    pub(super) fn input_grad_done(&mut self, g: H, cast: bool) -> H {
        if cast {
            self.uncast(g, Dtype::Float32, Role::Backward)
        } else {
            g
        }
    }
}

/// A matrix product's saved tensors in the order autograd lets go of them:
/// the weight's cast, then the activation; a checkpointed block's unpacked
/// ones the other way round.
fn saved_order(weight: Option<H>, activation: Option<H>, ckpt: bool) -> Vec<H> {
    let mut all: Vec<H> = [weight, activation].into_iter().flatten().collect();
    if ckpt {
        all.reverse();
    }
    all
}
