//! A Llama-family decoder's forward as transformers 5.24 runs it under
//! `no_grad` (Llama, Mistral, Qwen2, Qwen3, Phi-3): RMSNorm in float32,
//! rotary embeddings, grouped-query attention, the gated SiLU MLP.

use super::{Attention, Holds, Tape, F32};
use crate::config::Arch;
use vramlab_core::types::Dtype;

impl Tape<'_> {
    /// `LlamaRotaryEmbedding.forward`: cos and sin of `tokens` positions
    /// (float32, cast to the model's type).
    pub(super) fn rotary(&mut self, tokens: u64) -> (usize, usize) {
        let (r, low) = (self.c.rotary, self.dtype != Dtype::Float32);
        let positions = self.act("_to_copy", tokens * F32);
        // `inv_freq @ positions`: a cuBLAS product on a GPU, a `mul` on
        // the CPU that records the reference traces.
        let freqs = self.act(if self.cuda { "bmm" } else { "mul" }, tokens * r * F32);
        self.free(positions);
        let emb = self.act("cat", tokens * 2 * r * F32);
        let trig = |t: &mut Self, op| {
            let raw = t.act(op, tokens * 2 * r * F32);
            let scaled = t.act("mul", tokens * 2 * r * F32);
            t.free(raw);
            scaled
        };
        let (cos, sin) = (trig(self, "cos"), trig(self, "sin"));
        if !low {
            self.free_all(&[freqs, emb]);
            return (cos, sin);
        }
        let e = self.e();
        let cast = [
            self.act("_to_copy", tokens * 2 * r * e),
            self.act("_to_copy", tokens * 2 * r * e),
        ];
        self.free_all(&[freqs, emb, cos, sin]);
        (cast[0], cast[1])
    }

    /// `LlamaRMSNorm.forward` over rows of `width` (`tokens` of them):
    /// computed in float32, cast back, scaled by the weight.
    fn rms_norm(&mut self, x: usize, tokens: u64, width: u64) -> usize {
        let (low, e) = (self.dtype != Dtype::Float32, self.e());
        let x32 = low.then(|| self.act("_to_copy", tokens * width * F32));
        let squared = self.act("pow", tokens * width * F32);
        let variance = self.act("mean", tokens * F32);
        self.free(squared);
        let shifted = self.act("add", tokens * F32);
        let rsqrt = self.act("rsqrt", tokens * F32);
        self.free(shifted);
        let normed = self.act("mul", tokens * width * F32);
        self.free(rsqrt);
        let _ = x;
        if let Some(x32) = x32 {
            self.free(x32);
            let cast = self.act("_to_copy", tokens * width * e);
            let out = self.act("mul", tokens * width * e);
            self.free_all(&[cast, normed, variance]);
            return out;
        }
        let out = self.act("mul", tokens * width * e);
        self.free_all(&[normed, variance]);
        out
    }

    /// A linear layer's output (`mm`, or `addmm` with a bias).
    fn linear(&mut self, tokens: u64, fan_out: u64, bias: bool) -> usize {
        let op = if bias { "addmm" } else { "mm" };
        self.act(op, tokens * fan_out * self.e())
    }

    /// `apply_rotary_pos_emb` on one of q and k: `x * cos +
    /// rotate_half(x) * sin`.
    pub(super) fn rotate(&mut self, bytes: u64) -> usize {
        let times_cos = self.act("mul", bytes);
        let negated = self.act("neg", bytes / 2);
        let half = self.act("cat", bytes);
        self.free(negated);
        let times_sin = self.act("mul", bytes);
        self.free(half);
        let out = self.act("add", bytes);
        self.free_all(&[times_cos, times_sin]);
        if self.c.arch != Arch::Phi3 {
            return out;
        }
        // Phi-3 rotates the first `rotary` dims and concatenates the rest.
        let whole = self.act("cat", bytes);
        self.free(out);
        whole
    }

    /// `eager_attention_forward`: keys and values repeated for every head
    /// (`repeat_kv`), the scores, their float32 softmax, the output. `q`
    /// is copied first when the prefill's layout makes it non-contiguous.
    /// Returns the output and the attention weights, which the layer holds
    /// (`hidden_states, _ = self.self_attn(...)`) until it returns.
    pub(super) fn eager(&mut self, tokens: u64, keys: u64) -> (usize, usize) {
        let (c, b, e) = (self.c, self.g.batch, self.e());
        let heads = b * c.heads;
        let repeated = heads * keys * c.head_dim * e;
        let k = self.act("clone", repeated);
        let v = self.act("clone", repeated);
        let q = (tokens > 1).then(|| self.act("clone", heads * tokens * c.head_dim * e));
        let scores = heads * tokens * keys;
        let raw = self.act("bmm", scores * e);
        if let Some(q) = q {
            self.free(q);
        }
        let mut scaled = self.act("mul", scores * e);
        self.free(raw);
        if self.c.attn_softcap {
            // Gemma 2: `tanh(scores / cap) * cap`.
            for op in ["div", "tanh", "mul"] {
                let next = self.act(op, scores * e);
                self.free(scaled);
                scaled = next;
            }
        }
        let masked = self.act("add", scores * e);
        self.free(scaled);
        let wide = self.act("_to_copy", scores * F32);
        let softmax = self.act("_softmax", scores * F32);
        self.free(wide);
        let weights = self.act("_to_copy", scores * e);
        self.free_all(&[softmax, masked]);
        let out = self.act("bmm", heads * tokens * c.head_dim * e);
        let out = if tokens > 1 {
            // `attn_output.transpose(1, 2).contiguous()`.
            let copy = self.act("clone", heads * tokens * c.head_dim * e);
            self.free(out);
            copy
        } else {
            out
        };
        self.free_all(&[k, v]);
        (out, weights)
    }

    /// One decoder layer's forward from `x`: its output.
    fn layer(&mut self, l: usize, x: usize, tokens: u64) -> usize {
        let (c, bt, e) = (self.c, self.g.batch * tokens, self.e());
        let normed = self.rms_norm(x, bt, c.hidden);
        let (projected, weights) = self.self_attn(l, normed, tokens);
        let h = self.act("add", bt * c.hidden * e);
        self.free(projected);
        let normed = self.rms_norm(h, bt, c.hidden);
        let down = self.mlp(bt);
        self.free(normed);
        let out = self.act("add", bt * c.hidden * e);
        self.free_all(&[down, h]);
        if let Some(w) = weights {
            self.free(w);
        }
        out
    }

    /// The attention from the layer's normed input: q, k and v (Phi-3's
    /// one projection, viewed three ways; else three, Qwen3's each
    /// normed per head), rotated, cached, attended, projected. Returns the
    /// projection and eager attention's weights, which the layer holds.
    fn self_attn(&mut self, l: usize, normed: usize, tokens: u64) -> (usize, Option<usize>) {
        let (c, bt, e) = (self.c, self.g.batch * tokens, self.e());
        let (q_width, kv_width) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let fused = c.arch == Arch::Phi3;
        let head_norm = c.arch == Arch::Qwen3;
        let project = |t: &mut Self, width: u64, normed_heads: bool| {
            let out = t.linear(bt, width, c.qkv_bias);
            if !normed_heads {
                return out;
            }
            let n = t.rms_norm(out, bt * width / c.head_dim, c.head_dim);
            t.free(out);
            n
        };
        let (qkv, separate) = if fused {
            (Some(self.linear(bt, q_width + 2 * kv_width, false)), None)
        } else {
            let q = project(self, q_width, head_norm);
            let k = project(self, kv_width, head_norm);
            (None, Some([q, k, project(self, kv_width, false)]))
        };
        let q_rot = self.rotate(bt * q_width * e);
        let k_rot = self.rotate(bt * kv_width * e);
        match separate {
            Some([q, k, v]) => {
                self.free_all(&[q, k]);
                self.update(l, &[k_rot, v], tokens);
            }
            // The values are a view of the projection.
            None => self.update(l, &[k_rot], tokens),
        }
        let keys = self.layer_keys(l);
        let (mut attended, weights) = match self.g.attention {
            Attention::Eager => {
                let (out, weights) = self.eager(tokens, keys);
                (out, Some(weights))
            }
            Attention::Sdpa => (self.sdpa(tokens), None),
        };
        if fused && tokens > 1 {
            // `attn_output.reshape(...).contiguous()` copies Phi-3's.
            let copy = self.act("clone", bt * q_width * e);
            self.free(attended);
            attended = copy;
        }
        let projected = self.linear(bt, c.hidden, c.o_bias);
        let done: Vec<usize> = [Some(attended), qkv, Some(q_rot), Some(normed)]
            .into_iter()
            .flatten()
            .collect();
        self.free_all(&done);
        (projected, weights)
    }

    /// The gated SiLU MLP on `rows` normed rows (Phi-3's gate and up in
    /// one projection): its output, its temporaries gone.
    fn mlp(&mut self, rows: u64) -> usize {
        let (c, e) = (self.c, self.e());
        let wide = rows * c.intermediate * e;
        if c.arch == Arch::Phi3 {
            let gate_up = self.linear(rows, 2 * c.intermediate, false);
            let act = self.act("silu", wide);
            self.on_stack(act);
            let gated = self.act("mul", wide);
            self.free(act);
            let down = self.linear(rows, c.hidden, false);
            self.free_all(&[gated, gate_up]);
            return down;
        }
        // `down_proj(act_fn(gate_proj(x)) * up_proj(x))`: `act_fn`'s and
        // `up_proj`'s outputs wait on the stack for the product.
        let gate = self.linear(rows, c.intermediate, c.mlp_bias);
        let act = self.act("silu", wide);
        self.on_stack(act);
        self.free(gate);
        let up = self.linear(rows, c.intermediate, c.mlp_bias);
        self.on_stack(up);
        let gated = self.act("mul", wide);
        self.free_all(&[act, up]);
        let down = self.linear(rows, c.hidden, c.mlp_bias);
        self.free(gated);
        down
    }

    /// `LlamaForCausalLM.forward` over `tokens` positions after `past`:
    /// the logits of the last position (`logits_to_keep=1`).
    pub(super) fn llama_forward(&mut self, past: u64, tokens: u64) -> usize {
        let (c, b) = (self.c, self.g.batch);
        let embeds = self.act("embedding", b * tokens * c.hidden * self.e());
        let mask = self.mask(past, tokens);
        let (cos, sin) = self.rotary(b * tokens);
        let mut x = embeds;
        for l in 0..c.layers as usize {
            self.layer = Some(l as u32);
            let out = self.layer(l, x, tokens);
            if x != embeds {
                self.free(x);
            }
            x = out;
        }
        self.layer = None;
        let normed = self.rms_norm(x, b * tokens, c.hidden);
        self.free(x);
        self.free_all(&[embeds, cos, sin]);
        if let Some(m) = mask {
            self.free(m);
        }
        let logits = self.alloc("mm", b * c.vocab * self.e(), Holds::Logits);
        self.free(normed);
        logits
    }
}
