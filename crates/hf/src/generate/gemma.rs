//! Gemma 2 and Gemma 3 as transformers 5.24 runs them under `no_grad`:
//! the embeddings scaled by the width's square root, RMSNorm in float32
//! scaled by `1 + weight`, a norm before and after attention and the MLP,
//! Gemma 3's per-head q and k norms and its two rotary embeddings (local
//! and global layers), Gemma 2's soft-capped scores and logits.

use super::{Attention, Cache, Holds, Tape, F32};
use crate::config::Arch;
use vramlab_core::types::Dtype;

impl Tape<'_> {
    /// `Gemma2RMSNorm` / `Gemma3RMSNorm` over `rows` of `width`:
    /// `(x.float() * rsqrt(mean(x²) + eps)) * (1 + weight.float())`, cast
    /// back.
    fn gemma_norm(&mut self, rows: u64, width: u64) -> usize {
        let (low, e) = (self.dtype != Dtype::Float32, self.e());
        let x32 = low.then(|| self.act("_to_copy", rows * width * F32));
        let squared = self.act("pow", rows * width * F32);
        let variance = self.act("mean", rows * F32);
        self.free(squared);
        let shifted = self.act("add", rows * F32);
        self.free(variance);
        let rsqrt = self.act("rsqrt", rows * F32);
        self.free(shifted);
        let normed = self.act("mul", rows * width * F32);
        self.free(rsqrt);
        let weight32 = x32.map(|x32| {
            self.free(x32);
            self.act("_to_copy", width * F32)
        });
        let plus_one = self.act("add", width * F32);
        if let Some(w) = weight32 {
            self.free(w);
        }
        let scaled = self.act("mul", rows * width * F32);
        self.free_all(&[plus_one, normed]);
        if !low {
            return scaled;
        }
        let out = self.act("_to_copy", rows * width * e);
        self.free(scaled);
        out
    }

    /// A Gemma layer's attention from its normed input: the projection
    /// and eager attention's weights.
    fn gemma_attn(&mut self, l: usize, normed: usize, tokens: u64) -> (usize, Option<usize>) {
        let (c, bt, e) = (self.c, self.g.batch * tokens, self.e());
        let (q_width, kv_width) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let mut q = self.act("mm", bt * q_width * e);
        let mut k = self.act("mm", bt * kv_width * e);
        let v = self.act("mm", bt * kv_width * e);
        if c.arch == Arch::Gemma3 {
            let qn = self.gemma_norm(bt * c.heads, c.head_dim);
            self.free(q);
            let kn = self.gemma_norm(bt * c.kv_heads, c.head_dim);
            self.free(k);
            (q, k) = (qn, kn);
        }
        let q_rot = self.rotate(bt * q_width * e);
        let k_rot = self.rotate(bt * kv_width * e);
        self.free_all(&[q, k]);
        self.update(l, &[k_rot, v], tokens);
        let keys = self.layer_keys(l);
        let (attended, weights) = match self.g.attention {
            Attention::Eager => {
                let (out, weights) = self.eager(tokens, keys);
                (out, Some(weights))
            }
            Attention::Sdpa => (self.sdpa(tokens), None),
        };
        let projected = self.act("mm", bt * c.hidden * e);
        self.free_all(&[attended, q_rot, normed]);
        (projected, weights)
    }

    /// One Gemma decoder layer from the hidden states: its output.
    fn gemma_layer(&mut self, l: usize, tokens: u64) -> usize {
        let (c, bt, e) = (self.c, self.g.batch * tokens, self.e());
        let normed = self.gemma_norm(bt, c.hidden);
        let (projected, weights) = self.gemma_attn(l, normed, tokens);
        let after = self.gemma_norm(bt, c.hidden);
        self.free(projected);
        let h = self.act("add", bt * c.hidden * e);
        self.free(after);
        let normed = self.gemma_norm(bt, c.hidden);
        let wide = bt * c.intermediate * e;
        let gate = self.act("mm", wide);
        let act = self.act("gelu", wide);
        self.on_stack(act);
        self.free(gate);
        let up = self.act("mm", wide);
        self.on_stack(up);
        let gated = self.act("mul", wide);
        self.free_all(&[act, up]);
        let down = self.act("mm", bt * c.hidden * e);
        self.free_all(&[gated, normed]);
        let after = self.gemma_norm(bt, c.hidden);
        self.free(down);
        let out = self.act("add", bt * c.hidden * e);
        self.free_all(&[after, h]);
        if let Some(w) = weights {
            self.free(w);
        }
        out
    }

    /// How many kinds of layer the model has (sliding, full): a mask and
    /// (Gemma 3) a rotary embedding each.
    pub(super) fn layer_kinds(&self) -> u64 {
        let c = self.c;
        let sliding = (0..c.layers).filter(|&l| c.sliding(l)).count() as u64;
        u64::from(sliding > 0) + u64::from(sliding < c.layers)
    }

    /// A Gemma model's forward over `tokens` positions after `past`: the
    /// logits of the last position (soft-capped in Gemma 2).
    pub(super) fn gemma_forward(&mut self, past: u64, tokens: u64) -> usize {
        let (c, b, e) = (self.c, self.g.batch, self.e());
        let bt = b * tokens;
        let raw = self.act("embedding", bt * c.hidden * e);
        let embeds = self.act("mul", bt * c.hidden * e);
        self.free(raw);
        let kinds = self.layer_kinds();
        let masked = self.g.attention == Attention::Eager || self.g.cache == Cache::Static;
        let masks: Vec<usize> = (0..kinds)
            .filter(|_| masked)
            .filter_map(|_| self.mask(past, tokens))
            .collect();
        let rotary_pairs = if c.arch == Arch::Gemma3 { kinds } else { 1 };
        let trig: Vec<usize> = (0..rotary_pairs)
            .flat_map(|_| {
                let (cos, sin) = self.rotary(bt);
                [cos, sin]
            })
            .collect();
        let mut x = embeds;
        for l in 0..c.layers as usize {
            self.layer = Some(l as u32);
            let out = self.gemma_layer(l, tokens);
            if x != embeds {
                self.free(x);
            }
            x = out;
        }
        self.layer = None;
        let normed = self.gemma_norm(bt, c.hidden);
        self.free(x);
        self.free(embeds);
        self.free_all(&trig);
        self.free_all(&masks);
        let mut logits = self.alloc("mm", b * c.vocab * e, Holds::Logits);
        if c.final_softcap {
            for op in ["div", "tanh", "mul"] {
                let next = self.alloc(op, b * c.vocab * e, Holds::Logits);
                self.free(logits);
                logits = next;
            }
        }
        self.free(normed);
        logits
    }
}
