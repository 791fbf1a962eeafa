//! Gemma 2 and Gemma 3's training forward as transformers 5.24 runs it:
//! the embeddings scaled by `embed_scale`, RMSNorm in float32 scaled by
//! `1 + weight`, a norm after attention and around the MLP, Gemma 3's
//! per-head q and k norms (after all three projections) and its rotary
//! embedding per kind of layer, a mask per kind of layer (full, sliding),
//! the GELU (tanh) MLP, Gemma 2's soft-capped scores and logits.

use super::llama::Shared;
use super::tape::T;
use super::weights::Name;
use super::Model;
use crate::config::Arch;
use vramlab_train::kinds::step::Attention;
use vramlab_train::program::Holds;

impl Model<'_, '_> {
    /// `Gemma2RMSNorm` / `Gemma3RMSNorm`: `x.float() * rsqrt(mean(x²) +
    /// eps)`, times `1.0 + weight.float()`, `type_as(x)`.
    pub(super) fn gemma_norm(&mut self, x: T, w: T, rows: u64, width: u64) -> T {
        let f32 = rows * width * 4;
        // Under autocast a projection's output comes in the autocast type.
        let half = x.bytes != f32;
        let x32 = if half {
            self.t.cast(x, f32)
        } else {
            self.t.share(x)
        };
        let squared = self.t.square(x32);
        let variance = self.t.mean(squared, rows * 4);
        self.t.drop(squared);
        let shifted = self.t.add_scalar(variance);
        self.t.drop(variance);
        let r = self.t.rsqrt(shifted);
        self.t.drop(shifted);
        let normed = self.t.mul(x32, r, f32);
        self.t.drop(r);
        self.t.drop(x32);
        let w32 = if self.low() {
            self.t.cast(w, width * 4)
        } else {
            self.t.share(w)
        };
        let plus_one = self.t.add_scalar(w32);
        self.t.drop(w32);
        let scaled = self.t.mul(normed, plus_one, f32);
        self.t.drop_all(&[plus_one, normed]);
        if !half {
            return scaled;
        }
        let out = self.t.cast(scaled, x.bytes);
        self.t.drop(scaled);
        out
    }

    /// The embeddings times `embed_scale` (a buffer).
    pub(super) fn gemma_embeds(&mut self, raw: T) -> T {
        // `embed_scale.to(weight.dtype)`: a copy where the buffer stayed in
        // the loading type and `prepare_model_for_kbit_training` upcast
        // the weight.
        let scale = match self.run.quant {
            Some(_) => {
                let s = self.t.alloc("_to_copy", self.e(), Holds::Activation);
                self.t.plain(s, self.e())
            }
            None => self.t.external(self.e()),
        };
        let out = self.t.mul(raw, scale, raw.bytes);
        self.t.drop_all(&[raw, scale]);
        out
    }

    /// A Gemma layer's attention from its normed input.
    fn gemma_attn(&mut self, l: u64, x: T, s: &Shared) -> (T, Option<T>) {
        let (c, rows) = (self.c, self.run.batch * self.run.seq);
        let (q_width, kv_width) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let mut q = self.project(x, Name::of(l, "self_attn.q_proj"), rows, q_width, false);
        if c.heads > 1 {
            q = self.heads(q);
        }
        let mut k = self.project(x, Name::of(l, "self_attn.k_proj"), rows, kv_width, false);
        if c.kv_heads > 1 {
            k = self.heads(k);
        }
        let mut v = self.project(x, Name::of(l, "self_attn.v_proj"), rows, kv_width, false);
        if self.run.attention == Attention::Eager && c.kv_heads > 1 {
            v = self.heads(v);
        }
        if c.arch == Arch::Gemma3 {
            let w = self.weight(Name::of(l, "self_attn.q_norm"));
            let n = self.gemma_norm(q, w, rows * c.heads, c.head_dim);
            self.t.drop(q);
            q = n;
            let w = self.weight(Name::of(l, "self_attn.k_norm"));
            let n = self.gemma_norm(k, w, rows * c.kv_heads, c.head_dim);
            self.t.drop(k);
            k = n;
        }
        self.attention_block(l, [q, k, v], s, None)
    }

    /// The GELU MLP on the normed rows.
    fn gemma_mlp(&mut self, l: u64, x: T) -> T {
        let (c, rows) = (self.c, self.run.batch * self.run.seq);
        let gate = self.project(x, Name::of(l, "mlp.gate_proj"), rows, c.intermediate, false);
        let act = self.t.unary_saving_input("gelu", "gelu_backward", gate);
        self.t.drop(gate);
        let up = self.project(x, Name::of(l, "mlp.up_proj"), rows, c.intermediate, false);
        let gated = self.t.mul(act, up, act.bytes);
        self.t.drop_all(&[act, up]);
        let down = self.project(gated, Name::of(l, "mlp.down_proj"), rows, c.hidden, false);
        self.t.drop(gated);
        down
    }

    /// One Gemma decoder layer's forward from `x`.
    pub(super) fn gemma_layer(&mut self, l: u64, x: T, s: &Shared) -> T {
        let (c, rows) = (self.c, self.run.batch * self.run.seq);
        let norm = |m: &mut Self, name: &'static str, x: T| {
            let w = m.weight(Name::of(l, name));
            m.gemma_norm(x, w, rows, c.hidden)
        };
        let normed = norm(self, "input_layernorm", x);
        let (attended, weights) = self.gemma_attn(l, normed, s);
        self.t.drop(normed);
        let after = norm(self, "post_attention_layernorm", attended);
        self.t.drop(attended);
        let h = self.t.add_mixed(x, after);
        self.t.drop(after);
        let normed = norm(self, "pre_feedforward_layernorm", h);
        let down = self.gemma_mlp(l, normed);
        self.t.drop(normed);
        let after = norm(self, "post_feedforward_layernorm", down);
        self.t.drop(down);
        let out = self.t.add_mixed(h, after);
        self.t.drop_all(&[after, h]);
        if let Some(w) = weights {
            self.t.drop(w);
        }
        out
    }

    /// `create_sliding_window_causal_mask`: the indices, `kv_idx > q_idx -
    /// window` and `kv_idx <= q_idx` as booleans; for eager attention then
    /// a batch of queries x keys in the model's type, for sdpa (`boolean`)
    /// the booleans themselves.
    pub(super) fn sliding_mask(&mut self, boolean: bool, keys: u64) -> T {
        let (b, n) = (self.run.batch, self.run.seq);
        let a = |t: &mut Self, op, bytes| t.t.alloc(op, bytes, Holds::Ids);
        let batch = a(self, "arange", b * 8);
        let head = a(self, "arange", 8);
        let q = self.mask_index(n);
        let kv = self.mask_index(keys);
        let ones = a(self, "new_ones", 1);
        let start = a(self, "sub", n * 8);
        let after_start = a(self, "gt", n * keys);
        self.t.release(start);
        let windowed = a(self, "bitwise_and", n * keys);
        self.t.release(after_start);
        self.t.release(ones);
        let causal = a(self, "le", n * keys);
        let both = a(self, "bitwise_and", n * keys);
        self.t.release(causal);
        self.t.release(windowed);
        for s in [batch, head, q, kv] {
            self.t.release(s);
        }
        if boolean {
            return self.t.plain(both, n * keys);
        }
        let zero = a(self, "zeros", 4);
        let min = a(self, "scalar_tensor", 4);
        let bytes = b * n * keys * self.e();
        let mask = self.t.alloc("where", bytes, Holds::Activation);
        for s in [zero, min, both] {
            self.t.release(s);
        }
        self.t.plain(mask, bytes)
    }

    /// Gemma 2's `final_logit_softcapping`: `tanh(logits / cap) * cap`.
    pub(super) fn softcap_logits(&mut self, logits: T) -> T {
        let divided = self.t.scale_as("div", logits);
        self.t.drop(logits);
        let tanh = self.t.tanh(divided);
        self.t.drop(divided);
        let capped = self.t.scale(tanh);
        self.t.drop(tanh);
        capped
    }
}
