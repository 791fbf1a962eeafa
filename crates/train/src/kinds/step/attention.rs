//! Causal self-attention's forward and backward: eager (`q @ k.T`, scale,
//! mask, softmax, `@ v`, each op its own tensor) or fused
//! (`scaled_dot_product_attention`'s flash kernel).

use super::lora::{Layer, Linear};
use super::sdp::Kernel;
use super::{Arg, Attention, Calc, Tape, H};
use crate::kinds::TransformerShape;
use vramlab_core::types::Dtype;

/// What attention's backward needs from its forward.
#[derive(Clone, Copy, Debug)]
pub(super) enum Saved {
    /// `bmm` saves the contiguous copies of q, k and v and the
    /// probabilities (which softmax saves too), `masked_fill` its mask, and
    /// the output projection its contiguous input.
    Eager {
        q: H,
        k: H,
        mask: H,
        probs: H,
        /// What `bmm` saved: the probabilities, or under autocast their
        /// cast.
        probs_low: H,
        v: H,
        heads_out: H,
    },
    /// The fused kernel saves q, k, v (views of the projection), its output
    /// (which the output projection saves too), the log-sum-exp and, for
    /// CUDA's flash and cuDNN kernels, their Philox seed and offset.
    Sdpa {
        qkv: H,
        out: H,
        lse: H,
        philox: Option<[H; 2]>,
    },
}

impl Saved {
    /// The output projection's input, and whether only the projection
    /// holds it (the fused kernel's output is saved by the kernel too).
    pub(super) fn projection_input(&self) -> (H, bool) {
        match *self {
            Saved::Eager { heads_out, .. } => (heads_out, true),
            Saved::Sdpa { out, .. } => (out, false),
        }
    }
}

impl Tape<TransformerShape> {
    /// `c_attn`, attention and `c_proj` on the normed input: returns the
    /// projection's output. With `keep` false (a checkpointed block's
    /// first forward), nothing is saved and each tensor dies when its last
    /// user is done.
    /// Also what `c_attn`'s and `c_proj`'s backward need. `x`: the normed
    /// input; `layers`: `c_attn` and `c_proj`.
    pub(super) fn attention(
        &mut self,
        x: H,
        keep: bool,
        [attn, proj]: [Layer; 2],
    ) -> (Option<Saved>, [Linear; 2]) {
        let qkv_layer = self.linear(x, attn, keep);
        let qkv = qkv_layer.out;
        let (saved, proj_layer) = match self.options.attention {
            // PyTorch's math kernel: the products and softmax as separate
            // ops, each its own tensor (the eager step's).
            Attention::Sdpa if self.kernel() == Kernel::Math => self.eager(qkv, keep, proj),
            Attention::Sdpa => {
                let (out, lse, philox) = self.fused_forward(qkv, self.kernel());
                let seeds: Vec<H> = philox.into_iter().flatten().collect();
                if !self.grad {
                    // `scaled_dot_product_attention` returns only the output.
                    self.free(lse);
                    self.free_all(&seeds);
                }
                let proj_layer = self.linear(out, proj, keep);
                match (keep, self.grad) {
                    (true, _) => {}
                    (false, true) => {
                        self.free_all(&[out, qkv, lse]);
                        self.free_all(&seeds);
                    }
                    (false, false) => self.free_all(&[qkv, out]),
                }
                let saved = Saved::Sdpa {
                    qkv,
                    out,
                    lse,
                    philox,
                };
                (keep.then_some(saved), proj_layer)
            }
            Attention::Eager => self.eager(qkv, keep, proj),
        };
        (saved, [qkv_layer, proj_layer])
    }

    /// B x H x S x `rest`, float32.
    fn heads(&self, rest: &[u64]) -> Vec<u64> {
        let t = &self.shape;
        let mut s = vec![self.batch, t.heads, t.seq_len];
        s.extend_from_slice(rest);
        s
    }

    /// One of q, k, v (or their gradients) as heads: B x H x S x D.
    pub(super) fn head_dims(&self) -> Vec<u64> {
        self.heads(&[self.shape.width / self.shape.heads])
    }

    /// `1 / sqrt(D)`, as the model computes it (in double, then float).
    fn scale_factor(&self) -> f32 {
        (1.0 / ((self.shape.width / self.shape.heads) as f64).sqrt()) as f32
    }

    fn scores(&self) -> Vec<u64> {
        self.heads(&[self.shape.seq_len])
    }

    fn square(&self) -> Vec<u64> {
        vec![self.shape.seq_len, self.shape.seq_len]
    }

    /// Softmax in float32 (autocast asks for it): float16's kernel converts
    /// as it goes; others run on a float32 copy of the input.
    fn softmax(&mut self, filled: H) -> H {
        let half = self.options.amp == Some(Dtype::Float16);
        let input = if half {
            filled
        } else {
            self.cast_to(filled, Dtype::Float32)
        };
        let softmax = ("_softmax", Calc::Softmax(Arg::T(input)));
        let probs = self.alloc_f32(softmax, self.scores());
        if input != filled {
            self.temporaries_until(&[input], probs);
            self.free(input);
        }
        probs
    }

    fn eager(&mut self, qkv: H, keep: bool, proj: Layer) -> (Option<Saved>, Linear) {
        let head = |part| {
            (
                "clone",
                Calc::Heads {
                    x: Arg::T(qkv),
                    part,
                },
            )
        };
        let q = self.alloc(head(0), self.head_dims());
        let k = self.alloc(head(1), self.head_dims());
        let raw = self.matmul(
            ("bmm", Calc::bmm(Arg::T(q), Arg::T(k), false, true)),
            self.scores(),
        );
        if !keep {
            self.free_all(&[q, k]);
        }
        let scaled = self.alloc(
            ("mul", Calc::Scale(Arg::T(raw), self.scale_factor())),
            self.scores(),
        );
        self.free(raw);
        let (bool, role) = (Dtype::Bool, self.role);
        let ones = self.alloc_as(("ones", Calc::Ones), self.square(), bool, role);
        let tril = self.alloc_as(
            ("tril", Calc::Tril(Arg::T(ones))),
            self.square(),
            bool,
            role,
        );
        self.free(ones);
        let not = ("bitwise_not", Calc::Not(Arg::T(tril)));
        let mask = self.alloc_as(not, self.square(), bool, role);
        let fill = Calc::MaskedFill {
            x: Arg::T(scaled),
            mask: Arg::T(mask),
            value: f32::NEG_INFINITY,
        };
        let filled = self.alloc(("masked_fill", fill), self.scores());
        if !keep {
            self.free(mask);
        }
        let probs = if self.options.amp.is_some() {
            self.softmax(filled)
        } else {
            self.alloc(("_softmax", Calc::Softmax(Arg::T(filled))), self.scores())
        };
        // `att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)`.
        self.temporaries_until(&[mask, filled], probs);
        self.free_all(&[filled, scaled]);
        let probs_low = self.cast_input(probs);
        let v = self.alloc(head(2), self.head_dims());
        let mix = Calc::bmm(Arg::T(probs_low), Arg::T(v), false, false);
        let y = self.matmul(("bmm", mix), self.head_dims());
        if !keep {
            self.free(v);
            if probs_low != probs {
                self.free(probs_low);
            }
        }
        let heads_out = self.alloc(("clone", Calc::MergeHeads(Arg::T(y))), self.act());
        let proj_layer = self.linear(heads_out, proj, keep);
        if !keep {
            self.free(heads_out);
        }
        // The function's locals go: q, k, v's storage, y, att, the mask.
        self.free_all(&[qkv, y]);
        if !keep {
            self.free(probs);
        }
        self.free(tril);
        let saved = Saved::Eager {
            q,
            k,
            mask,
            probs,
            probs_low,
            v,
            heads_out,
        };
        (keep.then_some(saved), proj_layer)
    }

    /// From the output projection's input gradient `g` to the gradient of
    /// the fused q/k/v projection's output.
    pub(super) fn attention_backward(&mut self, saved: Saved, g: H, ckpt: bool) -> H {
        let grads = match saved {
            Saved::Sdpa {
                qkv,
                out,
                lse,
                philox,
            } => {
                let grads = self.fused_backward([qkv, out, lse], g, self.kernel());
                if ckpt {
                    self.free_all(&[qkv, lse, out, g]);
                } else {
                    self.free_all(&[g, qkv, lse, out]);
                }
                if let Some(seeds) = philox {
                    self.free_all(&seeds);
                }
                grads
            }
            Saved::Eager { .. } => {
                let (q, k, v) = self.eager_backward(saved, g, ckpt);
                vec![q, k, v]
            }
        };
        // `split`'s backward: the three gradients joined (one packed
        // buffer of them is copied).
        let cat = match grads[..] {
            [q, k, v] => Calc::Cat([q, k, v].map(Arg::T)),
            _ => Calc::Copy(Arg::T(grads[0])),
        };
        let cat = self.alloc(("cat", cat), self.tokens(3 * self.shape.width));
        self.free_all(&grads);
        cat
    }

    /// Softmax's backward: float16's kernel returns float16; otherwise the
    /// gradient of the float32 copy (cast back by its `ToCopyBackward`).
    fn softmax_backward(&mut self, grad: H, out: H) -> H {
        let calc = Calc::SoftmaxBackward {
            grad: Arg::T(grad),
            out: Arg::T(out),
        };
        let op = ("_softmax_backward_data", calc);
        match self.options.amp {
            Some(Dtype::Float16) | None => self.alloc(op, self.scores()),
            Some(_) => self.alloc_f32(op, self.scores()),
        }
    }

    fn eager_backward(&mut self, saved: Saved, g: H, ckpt: bool) -> (H, H, H) {
        let Saved::Eager {
            q,
            k,
            mask,
            probs,
            probs_low,
            v,
            ..
        } = saved
        else {
            unreachable!("eager attention's saved tensors")
        };
        let split = (
            "clone",
            Calc::Heads {
                x: Arg::T(g),
                part: 0,
            },
        );
        let g_y = self.alloc(split, self.head_dims());
        self.free(g);
        let (gy, probs_arg) = (Arg::T(g_y), Arg::T(probs_low));
        let g_v = self.matmul(
            ("bmm", Calc::bmm(probs_arg, gy, true, false)),
            self.head_dims(),
        );
        let g_probs = Calc::bmm(gy, Arg::T(v), false, true);
        let g_probs = self.matmul(("bmm", g_probs), self.scores());
        match (probs_low == probs, ckpt) {
            (true, _) => self.node_done(&[v], g_y, ckpt),
            (false, false) => self.node_done(&[v, probs_low], g_y, ckpt),
            (false, true) => self.node_done(&[probs_low, v], g_y, ckpt),
        }
        let g_probs = self.back_to(g_probs, Dtype::Float32);
        let g_filled = self.softmax_backward(g_probs, probs);
        self.node_done(&[probs], g_probs, ckpt);
        let g_filled = self.back_to(g_filled, self.low());
        let fill = Calc::MaskedFill {
            x: Arg::T(g_filled),
            mask: Arg::T(mask),
            value: 0.0,
        };
        let g_scaled = self.alloc(("masked_fill", fill), self.scores());
        self.node_done(&[mask], g_filled, ckpt);
        let scale = Calc::Scale(Arg::T(g_scaled), self.scale_factor());
        let g_raw = self.alloc(("mul", scale), self.scores());
        self.free(g_scaled);
        let raw = Arg::T(g_raw);
        let g_q = self.matmul(
            ("bmm", Calc::bmm(raw, Arg::T(k), false, false)),
            self.head_dims(),
        );
        let g_k = self.matmul(
            ("bmm", Calc::bmm(raw, Arg::T(q), true, false)),
            self.head_dims(),
        );
        if ckpt {
            self.free_all(&[q, k, g_raw]);
        } else {
            self.free_all(&[g_raw, q, k]);
        }
        // The heads' gradients made contiguous for the projection's split.
        let q_grad = self.alloc(("clone", Calc::MergeHeads(Arg::T(g_q))), self.act());
        self.free(g_q);
        let k_grad = self.alloc(("clone", Calc::MergeHeads(Arg::T(g_k))), self.act());
        self.free(g_k);
        (q_grad, k_grad, g_v)
    }
}
