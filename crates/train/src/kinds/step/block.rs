//! One transformer block (`x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))`)
//! forward and backward, its norms and linear layers' backward, and what a
//! checkpointed block keeps.

use super::attention::Saved as AttentionSaved;
use super::lora::{Casts, Early, Layer, Linear, Node};
use super::{param_or_cast, part, Arg, Calc, Keep, Tape, H};
use crate::kinds::Norm;
use crate::kinds::TransformerShape;
use vramlab_core::types::Dtype;

/// A norm's output and what its backward needs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Normed {
    pub out: H,
    pub input: H,
    /// LayerNorm's mean (RMSNorm has none).
    pub mean: Option<H>,
    pub rstd: H,
}

/// What a block's backward needs from its forward.
#[derive(Clone, Copy, Debug)]
pub(super) struct Saved {
    ln1: Normed,
    attention: AttentionSaved,
    ln2: Normed,
    fc: H,
    gelu: H,
    /// What each linear layer's backward needs (`c_attn`, `c_proj`, `c_fc`,
    /// the MLP's `c_proj`).
    kept: [Kept; 4],
}

/// What a linear layer's backward needs from its forward.
#[derive(Clone, Copy, Debug, Default)]
struct Kept {
    /// Under autocast, the cast of its float32 input (autograd saved it).
    input: Option<H>,
    /// With LoRA, `lora_A`'s output.
    hidden: Option<H>,
    casts: Casts,
}

impl Kept {
    fn of(l: &Linear, x: H) -> Self {
        Kept {
            input: (l.input != x).then_some(l.input),
            hidden: l.hidden,
            casts: l.casts,
        }
    }
}

/// Where a block's parameters sit in `parameters()`: each layer's weight
/// (its bias, if any, follows).
#[derive(Clone, Copy, Debug)]
pub(super) struct Params {
    pub ln1: usize,
    pub attn: usize,
    pub proj: usize,
    pub ln2: usize,
    pub fc: usize,
    pub out: usize,
}

impl Params {
    /// The block's linear layers: `c_attn` (whose input requires a
    /// gradient when the block's does), `c_proj`, `c_fc`, the MLP's
    /// `c_proj`.
    fn linears(&self, t: &TransformerShape, input_grad: bool) -> [Layer; 4] {
        let (d, wide) = (t.width, t.mlp_ratio * t.width);
        let layer = |weight, fans| Layer {
            weight,
            fans,
            input_grad: true,
        };
        [
            Layer {
                input_grad,
                ..layer(self.attn, (d, 3 * d))
            },
            layer(self.proj, (d, d)),
            layer(self.fc, (d, wide)),
            layer(self.out, (wide, d)),
        ]
    }
}

impl Tape<TransformerShape> {
    fn norm_ops(&self) -> (&'static str, &'static str) {
        match self.shape.norm {
            Norm::LayerNorm => ("native_layer_norm", "native_layer_norm_backward"),
            Norm::RmsNorm => ("_fused_rms_norm", "_fused_rms_norm_backward"),
        }
    }

    /// The norm (its weight is parameter `param`, LayerNorm's bias next)
    /// and its float32 statistics; freed at once unless kept.
    pub(super) fn norm(&mut self, input: H, param: usize, keep: bool) -> Normed {
        let (op, _) = self.norm_ops();
        let layer_norm = self.shape.norm == Norm::LayerNorm;
        let calc = Calc::Norm {
            x: Arg::T(input),
            weight: Arg::Param(param),
            bias: layer_norm.then_some(Arg::Param(param + 1)),
        };
        let out = self.alloc_f32((op, calc), self.act());
        let stat =
            |t: &mut Self, k| t.alloc_as((op, part(out, k)), t.tokens(1), Dtype::Float32, t.role);
        let mean = layer_norm.then(|| stat(self, 1));
        let rstd = stat(self, 1 + usize::from(layer_norm));
        if !keep {
            self.free_all(&[mean, Some(rstd)].into_iter().flatten().collect::<Vec<_>>());
        }
        Normed {
            out,
            input,
            mean,
            rstd,
        }
    }

    /// The input's gradient, the weight's (and LayerNorm's bias's), then
    /// the incoming gradient and the saved tensors go.
    pub(super) fn norm_backward(&mut self, n: &Normed, incoming: H, param: usize, ckpt: bool) -> H {
        let (_, op) = self.norm_ops();
        let calc = Calc::NormBackward {
            grad: Arg::T(incoming),
            x: Arg::T(n.input),
            mean: n.mean.map(Arg::T),
            rstd: Arg::T(n.rstd),
            weight: Arg::Param(param),
        };
        let g = self.alloc_f32((op, calc), self.act());
        let d = self.shape.width;
        if !self.frozen() {
            self.grad((op, part(g, 1)), param, vec![d]);
            if n.mean.is_some() {
                self.grad((op, part(g, 2)), param + 1, vec![d]);
            }
        }
        let stats: Vec<H> = [n.mean, Some(n.rstd)].into_iter().flatten().collect();
        if ckpt {
            self.free_all(&stats);
            self.free_all(&[n.input, incoming]);
        } else {
            self.free_all(&[incoming, n.input]);
            self.free_all(&stats);
        }
        g
    }

    /// `addmm`'s backward: the input's gradient and the weight's (`mm`),
    /// the bias's (`sum`). The saved input dies after the weight's
    /// gradient in a checkpointed block, with the node otherwise. Under
    /// autocast the incoming gradient is cast first when it is float32,
    /// and each cast's `ToCopyBackward` follows: the input's, the
    /// weight's, the bias's.
    pub(super) fn linear_backward(&mut self, n: &Node, ckpt: bool) -> H {
        let ((fan_in, fan_out), param) = (n.layer.fans, n.layer.weight);
        let (incoming, dies) = self.incoming(n);
        let (g_out, x) = (Arg::T(incoming), Arg::T(n.x));
        let w = param_or_cast(param, n.casts.weight);
        let g = self.matmul(
            ("mm", Calc::mm(g_out, w, false, false)),
            self.tokens(fan_in),
        );
        let calc = Calc::mm(g_out, x, true, false);
        let weight = self.weight_grad_mm(param, calc, vec![fan_out, fan_in]);
        let input: Vec<H> = n.input.into_iter().collect();
        let cast: Vec<H> = n.casts.weight.into_iter().collect();
        if ckpt {
            self.free_all(&cast);
            self.free_all(&input);
        }
        let bias = self.weight_grad(("sum", Calc::Sum(g_out)), param + 1, vec![fan_out]);
        if dies {
            self.free(incoming);
        }
        if !ckpt {
            self.free_all(&input);
            self.free_all(&cast);
        }
        let g = self.input_grad_done(g, n.input_cast);
        self.uncast_grads(param, weight, bias);
        g
    }

    /// A linear layer's backward, LoRA's when it has adapters; `None`
    /// when its input needs no gradient.
    fn linear_grad(&mut self, n: Node, ckpt: bool) -> Option<H> {
        if self.frozen() {
            return self.lora_backward(n, ckpt);
        }
        Some(self.linear_backward(&n, ckpt))
    }

    /// A residual add's backward: the two gradients of its input summed.
    fn residual_backward(&mut self, through: H, branch: H) -> H {
        let sum = ("add", Calc::Add(Arg::T(through), Arg::T(branch)));
        let g = self.alloc_f32(sum, self.act());
        self.free_all(&[through, branch]);
        g
    }

    /// A block's forward from `x`: its output (none when recomputing stops
    /// early) and what it saved.
    pub(super) fn block(&mut self, x: H, keep: Keep, p: Params) -> (Option<H>, Option<Saved>) {
        let save = keep != Keep::Nothing;
        let [attn, proj, fc, out] = p.linears(&self.shape, self.input_grad);
        let ln1 = self.norm(x, p.ln1, save && self.input_grad);
        let (attention, [qkv, proj]) = self.attention(ln1.out, save, [attn, proj]);
        if !save || qkv.input != ln1.out {
            // Nothing saved the norm's output (a float32 one under autocast).
            self.free(ln1.out);
        }
        let residual = ("add", Calc::Add(Arg::T(x), Arg::T(proj.out)));
        let x2 = self.alloc_f32(residual, self.act());
        self.free(proj.out);
        let ln2 = self.norm(x2, p.ln2, save);
        let fc_layer = self.linear(ln2.out, fc, save);
        let wide = fc.fans.1;
        let gelu = self.alloc(
            ("gelu", Calc::Gelu(Arg::T(fc_layer.out))),
            self.tokens(wide),
        );
        let mut saved = attention.map(|attention| Saved {
            ln1,
            attention,
            ln2,
            fc: fc_layer.out,
            gelu,
            kept: [
                Kept::of(&qkv, ln1.out),
                Kept::of(&proj, proj.input),
                Kept::of(&fc_layer, ln2.out),
                Kept::default(),
            ],
        });
        if keep == Keep::Recompute {
            let (last, stopped) = self.recompute_projection(gelu, out);
            // Recomputation stops: its autocast region exits, then the
            // stopped forward's frames let go of the base layer's output
            // (LoRA) and the MLP's float32 input (saved is its cast).
            self.clear_cache();
            self.free_all(&stopped.into_iter().collect::<Vec<_>>());
            if fc_layer.input != ln2.out {
                self.free(ln2.out);
            }
            if let Some(s) = saved.as_mut() {
                s.kept[3] = last;
            }
            return (None, saved);
        }
        if !save {
            self.free(fc_layer.out);
        }
        let out = self.linear(gelu, out, save);
        if let Some(s) = saved.as_mut() {
            s.kept[3] = Kept::of(&out, gelu);
        }
        if !save {
            self.free_all(&[gelu, ln2.out]);
        } else if fc_layer.input != ln2.out {
            self.free(ln2.out);
        }
        let residual = ("add", Calc::Add(Arg::T(x2), Arg::T(out.out)));
        let x3 = self.alloc_f32(residual, self.act());
        self.free(out.out);
        if !save {
            self.free(x2);
        }
        (Some(x3), saved)
    }

    /// A checkpointed block's recomputation goes past GELU to the last
    /// tensor the MLP's projection saves: with LoRA `lora_B`'s weight cast
    /// (or `lora_A`'s output), under autocast the weight's cast. Returns
    /// what the projection's backward needs, and with LoRA the base
    /// layer's output, which dies when recomputation stops.
    fn recompute_projection(&mut self, gelu: H, layer: Layer) -> (Kept, Option<H>) {
        if self.frozen() {
            let s = self.lora_start(gelu, layer, true);
            let kept = Kept {
                input: (s.input != gelu).then_some(s.input),
                hidden: Some(s.hidden),
                casts: s.casts,
            };
            return (kept, Some(s.base));
        }
        let (fan_in, fan_out) = layer.fans;
        self.cast_param(layer.weight + 1, vec![fan_out]);
        let weight = self.cast_param(layer.weight, vec![fan_out, fan_in]);
        if let Some(w) = weight {
            self.save_cast(w);
        }
        let casts = Casts {
            weight,
            ..Casts::default()
        };
        let kept = Kept {
            casts,
            ..Kept::default()
        };
        (kept, None)
    }

    /// A block's backward from its output's gradient `g`: its input's,
    /// when the input requires one. `early`: what a checkpointed block
    /// made for the MLP projection before its recomputation; `held`: a
    /// checkpointed block's input.
    pub(super) fn block_backward(
        &mut self,
        s: Saved,
        (g, early): (H, Early),
        p: Params,
        held: Option<H>,
    ) -> Option<H> {
        let ckpt = held.is_some();
        let input_grad = self.input_grad;
        let [attn, proj, fc, out] = p.linears(&self.shape, input_grad);
        // A layer's input `x`, and whether only its node holds it.
        let node = |layer, (x, owned): (H, bool), kept: Kept, incoming| Node {
            layer,
            x: kept.input.unwrap_or(x),
            input: kept.input.or(owned.then_some(x)),
            input_cast: kept.input.is_some(),
            hidden: kept.hidden,
            incoming,
            incoming_dies: true,
            early: Early::default(),
            casts: kept.casts,
            released: None,
        };
        let out = Node {
            incoming_dies: false,
            early,
            ..node(out, (s.gelu, true), s.kept[3], g)
        };
        let g_gelu = self.linear_grad(out, ckpt)?;
        let calc = Calc::GeluBackward {
            grad: Arg::T(g_gelu),
            x: Arg::T(s.fc),
        };
        let g_fc = self.alloc(("gelu_backward", calc), self.tokens(fc.fans.1));
        self.node_done(&[s.fc], g_gelu, ckpt);
        let fc = node(fc, (s.ln2.out, true), s.kept[2], g_fc);
        let g_ln2 = self.linear_grad(fc, ckpt)?;
        let g_x2 = self.norm_backward(&s.ln2, g_ln2, p.ln2, ckpt);
        let g_x2 = self.residual_backward(g, g_x2);
        // The residual shares `g_x2` with the block's input, if that needs it.
        let input = s.attention.projection_input();
        let proj = Node {
            incoming_dies: !input_grad,
            ..node(proj, input, s.kept[1], g_x2)
        };
        let g_heads = self.linear_grad(proj, ckpt)?;
        let g_qkv = self.attention_backward(s.attention, g_heads, ckpt);
        let attn = Node {
            released: held.filter(|_| !input_grad),
            ..node(attn, (s.ln1.out, true), s.kept[0], g_qkv)
        };
        let g_ln1 = self.linear_grad(attn, ckpt)?;
        let g_x = self.norm_backward(&s.ln1, g_ln1, p.ln1, ckpt);
        Some(self.residual_backward(g_x2, g_x))
    }
}
