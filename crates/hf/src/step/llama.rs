//! A Llama-family decoder's training forward as transformers 5.24 runs it
//! (Llama, Mistral, Qwen2, Qwen3, Phi-3): RMSNorm in float32, rotary
//! embeddings under `no_grad`, q/k/v (Phi-3's one projection), the keys
//! and values through the `DynamicCache` a training forward makes too
//! (none under checkpointing: `use_cache=False`), eager or sdpa
//! attention, the gated SiLU MLP, peft's LoRA on its target projections.

use super::kernel::Sdpa;
use super::ops::Fit;
use super::tape::T;
use super::weights::Name;
use super::Model;
use crate::config::Arch;
use vramlab_train::kinds::step::sdp::Kernel;
use vramlab_train::kinds::step::Attention;

/// What every layer reads besides its input: the rotary cos and sin, and
/// eager attention's mask.
#[derive(Clone, Copy)]
pub(super) struct Shared {
    pub cos: T,
    pub sin: T,
    pub positions: T,
    pub mask: Option<T>,
}

impl Model<'_, '_> {
    /// `LlamaRMSNorm(x)` over `rows` rows of `width`, weight `w`: in
    /// float32, then `weight * x.to(input_dtype)` (the wider of the two
    /// types: float32 weights under autocast keep the output float32).
    pub(super) fn rms_norm(&mut self, x: T, w: T, rows: u64, width: u64) -> T {
        let numel = rows * width;
        let f32 = numel * 4;
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
        let r = self.t.rsqrt(shifted);
        self.t.drop(shifted);
        let normed = self.t.mul(x32, r, f32);
        self.t.drop(r);
        self.t.drop(x32);
        // `self.weight * hidden_states.to(input_dtype)`: the cast is the
        // expression's temporary; the float32 rows go as it returns.
        let out = if half {
            let cast = self.t.cast(normed, x.bytes);
            let out_bytes = numel * self.e().max(x.bytes / numel);
            let fits = [Fit::Sum(w.bytes), Fit::Cast(cast.bytes)];
            let out = self.t.mul_fit(w, cast, out_bytes, fits);
            self.t.drop(cast);
            out
        } else {
            self.t.mul(w, normed, numel * self.e().max(4))
        };
        self.t.drop(normed);
        self.t.drop(variance);
        out
    }

    /// `x * cos + rotate_half(x) * sin` of `numel` elements, in the wider
    /// of `x`'s and cos's types.
    fn rotate(&mut self, x: T, s: &Shared, numel: u64) -> T {
        let bytes = numel * self.e().max(x.bytes / numel);
        let fits = |x: T| [Fit::Cast(x.bytes), Fit::Sum(s.cos.bytes)];
        let times_cos = self.t.mul_fit(x, s.cos, bytes, fits(x));
        let first = self.t.slice(x, x.bytes / 2);
        let second = self.t.slice(x, x.bytes / 2);
        let negated = self.t.neg(second);
        let half = self.t.cat(&[negated, first]);
        self.t.drop_all(&[negated, second, first]);
        let times_sin = self.t.mul_fit(half, s.sin, bytes, fits(half));
        self.t.drop(half);
        let out = self.t.add(times_cos, times_sin, bytes);
        self.t.drop_all(&[times_cos, times_sin]);
        out
    }

    /// `apply_rotary_pos_emb(q, k, cos, sin)`: both rotated. Phi-3's
    /// rotates `q[..., :rotary_dim]` (the whole head here) and `cat`s the
    /// rest (`q[..., rotary_dim:]`, empty) back on.
    fn rotate_both(&mut self, q: T, k: T, s: &Shared) -> (T, T) {
        let (c, rows) = (self.c, self.run.batch * self.run.seq);
        let (nq, nk) = (rows * c.heads * c.head_dim, rows * c.kv_heads * c.head_dim);
        if c.arch != Arch::Phi3 {
            let q_rot = self.rotate(q, s, nq);
            let k_rot = self.rotate(k, s, nk);
            return (q_rot, k_rot);
        }
        let parts = |t: &mut Self, x: T| (t.t.alias(x), t.t.slice(x, 0));
        let (q_part, q_pass) = parts(self, q);
        let (k_part, k_pass) = parts(self, k);
        // Under autocast the rotated half is float32 and the rest keeps
        // the projection's type.
        let promoted = q.bytes / nq.max(1) < self.e();
        let whole = |t: &mut Self, part: T, pass: T, numel: u64| {
            let rotated = t.rotate(part, s, numel);
            let out = t.t.cat_promoted(&[rotated, pass], &[false, promoted]);
            t.t.drop(rotated);
            out
        };
        let q_rot = whole(self, q_part, q_pass, nq);
        let k_rot = whole(self, k_part, k_pass, nk);
        self.t.drop_all(&[q_part, q_pass, k_part, k_pass]);
        (q_rot, k_rot)
    }

    /// `x.view(b, s, heads, d).transpose(1, 2)` of a projection whose
    /// gradient comes back in the heads' layout (the rotary embedding's
    /// `slice_backward` zeros, eager attention's batched products), so
    /// viewing it as rows again copies it (`ViewBackward0`'s `reshape`).
    pub(super) fn heads(&mut self, x: T) -> T {
        let heads = self.t.rows_view(x);
        self.t.drop(x);
        heads
    }

    /// `repeat_kv`: each key/value head repeated for its query heads:
    /// `x` itself when every head has its own, a view when there is one
    /// key/value head (`expand`ed), else a copy. Whether the batched
    /// product must copy it again (not laid out as heads of rows).
    fn repeat_kv(&mut self, x: T, value: bool) -> (T, bool) {
        let (groups, kv) = (self.c.heads / self.c.kv_heads, self.c.kv_heads);
        if groups == 1 {
            // The cache's `cat` made it contiguous; else it is a view of
            // the projection (Phi-3's rotated keys: its rotation's `cat`).
            let contiguous = self.cached() || (self.c.arch == Arch::Phi3 && !value);
            return (self.t.share(x), !contiguous);
        }
        let wide = self.t.expand(x, x.bytes * groups);
        if kv == 1 {
            return (wide, true);
        }
        let copy = self.t.copy("clone", wide);
        self.t.drop(wide);
        (copy, false)
    }

    /// `attn_output.transpose(1, 2).contiguous()` of attention's output in
    /// the heads' layout: a copy, but for one position, whose layout is
    /// the rows' already (`out` goes).
    pub(super) fn heads_to_rows(&mut self, out: T) -> T {
        if self.run.seq == 1 {
            return out;
        }
        let copy = self.t.contiguous_heads(out);
        self.t.drop(out);
        copy
    }

    /// `matmul`'s copy of an operand it cannot batch as a view.
    pub(super) fn batched(&mut self, x: T, copy: bool) -> T {
        if copy {
            self.t.copy("clone", x)
        } else {
            self.t.share(x)
        }
    }

    /// `eager_attention_forward`: the output and the attention weights,
    /// which the layer holds until it returns.
    fn eager(&mut self, q: T, k: T, v: T, s: &Shared, attended: u64) -> (T, T) {
        let (c, b, n) = (self.c, self.run.batch, self.run.seq);
        let (e, pe) = (self.e(), self.pe());
        let scores = b * c.heads * n * attended;
        let nq = b * n * c.heads * c.head_dim;
        let (keys, copy_keys) = self.repeat_kv(k, false);
        let (values, copy_values) = self.repeat_kv(v, true);
        // Under autocast `matmul` casts the keys, then the queries (its
        // cast of an expanded view is dense).
        let amp = self.run.amp.is_some();
        let [q16, k16] = self.amp_operands([(q, nq), (keys, nq)]);
        // `matmul` copies the rotated queries (laid out as the projection
        // was; Phi-3's rotation `cat`s them into heads) to batch them; one
        // position's are laid out as heads already.
        let q_batched = self.batched(q16, c.arch != Arch::Phi3 && n > 1);
        let keys_batched = self.batched(k16, copy_keys && !amp);
        let raw = self.t.bmm(q_batched, keys_batched, scores * pe);
        self.t.drop_all(&[keys_batched, q_batched]);
        self.drop_operands([q16, k16]);
        let mut w = self.t.scale(raw);
        self.t.drop(raw);
        if c.attn_softcap {
            // Gemma 2: `tanh(scores / cap) * cap`.
            let divided = self.t.scale_as("div", w);
            self.t.drop(w);
            let tanh = self.t.tanh(divided);
            self.t.drop(divided);
            w = self.t.scale(tanh);
            self.t.drop(tanh);
        }
        if let Some(mask) = s.mask {
            // The mask is in the embeddings' type: under autocast the
            // scores become float32.
            let bytes = scores * e.max(pe);
            let fits = [Fit::Cast(w.bytes), Fit::Sum(mask.bytes)];
            let masked = self.t.add_fit(w, mask, bytes, fits);
            self.t.drop(w);
            w = masked;
        }
        // `softmax(w, dim=-1, dtype=float32).to(query.dtype)`: the scores
        // go once the statement is done.
        let wide = match w.bytes == scores * 4 {
            true => self.t.share(w),
            false => self.t.cast(w, scores * 4),
        };
        let soft = self.t.softmax("_softmax", "_softmax_backward_data", wide);
        self.t.drop(wide);
        let q_e = q.bytes / nq.max(1);
        let weights = match q_e == 4 {
            true => soft,
            false => {
                let cast = self.t.cast(soft, scores * q_e);
                self.t.drop(soft);
                cast
            }
        };
        self.t.drop(w);
        let [w16, v16] = self.amp_operands([(weights, scores), (values, nq)]);
        let values_batched = self.batched(v16, copy_values);
        let out = self.t.bmm(w16, values_batched, nq * pe);
        self.t.drop(values_batched);
        self.drop_operands([w16, v16]);
        let copy = self.heads_to_rows(out);
        self.t.drop_all(&[keys, values]);
        (copy, weights)
    }

    /// `F.scaled_dot_product_attention(q, k, v, is_causal=True)` as the
    /// kernel the device picks allocates it: the output. With a mask (a
    /// sliding window shorter than the sequence) the keys and values are
    /// repeated for every head (`enable_gqa` needs no mask), and a GPU runs
    /// the memory-efficient kernel, which takes one.
    pub(super) fn sdpa(&mut self, q: T, k: T, v: T, mask: Option<T>) -> T {
        let (c, rows) = (self.c, self.run.batch * self.run.seq);
        let (nq, nk) = (rows * c.heads * c.head_dim, rows * c.kv_heads * c.head_dim);
        if self.decode.is_some() {
            return self.decode_sdpa(q, k, v, mask);
        }
        let Some(_) = mask else {
            if self.run.math_gqa && c.heads != c.kv_heads {
                return self.math_sdpa(q, k, v);
            }
            let [q, k, v] = self.amp_operands([(q, nq), (k, nk), (v, nk)]);
            let outs = self.kernel.forward(self.t, &self.c, self.run, q, k, v);
            let out = outs[0];
            self.t.drop_all(&outs[1..]);
            self.drop_operands([q, k, v]);
            return out;
        };
        let (keys, _) = self.repeat_kv(k, false);
        let (values, _) = self.repeat_kv(v, true);
        let kernel = match self.on_gpu() {
            true => Sdpa(Kernel::Efficient),
            false => self.kernel,
        };
        let wide = nk * (c.heads / c.kv_heads);
        let [q, k, v] = self.amp_operands([(q, nq), (keys, wide), (values, wide)]);
        let outs = kernel.forward(self.t, &self.c, self.run, q, k, v);
        let out = outs[0];
        self.t.drop_all(&outs[1..]);
        self.drop_operands([q, k, v]);
        self.t.drop_all(&[keys, values]);
        out
    }

    /// A projection of `x` (`rows` rows) by the linear layer `name` to
    /// `width`, with peft's LoRA where it targets it.
    pub(super) fn project(&mut self, x: T, name: Name, rows: u64, width: u64, bias: bool) -> T {
        let module = self.w.module(name);
        if let (Some(q), Some(fans)) = (self.run.quant, module.quantized) {
            let out = self.linear4bit(x, q, rows, fans);
            // peft's `Linear4bit` clones the base layer's result first.
            return match module.adapters {
                Some(adapters) => {
                    let copy = self.t.copy("clone", out);
                    self.t.drop(out);
                    self.lora(x, adapters, copy, rows, width)
                }
                None => out,
            };
        }
        let w = module.weight.unwrap_or(self.w.missing);
        let b = bias.then(|| module.bias.unwrap_or(self.w.missing));
        let e = self.e();
        let fan_in = w.bytes / e / width.max(1);
        let conv1d = self.c.arch == Arch::Gpt2;
        let out = self.product_of(x, (w, b), rows, (fan_in, width), (e, conv1d));
        match module.adapters {
            Some(adapters) => self.lora(x, adapters, out, rows, width),
            None => out,
        }
    }

    /// peft's `Linear.forward` with adapters `(a, b)`: `result +
    /// lora_B(lora_A(x)) * scaling` (the adapters in float32: the input
    /// cast to it, the sum cast back).
    fn lora(&mut self, x: T, (a, b): (T, T), result: T, rows: u64, width: u64) -> T {
        let rank = self.run.lora.unwrap_or(0);
        // peft's 4-bit layer under autocast: `requires_conversion = not
        // torch.is_autocast_enabled()`, which asks about CUDA's autocast:
        // on a GPU the input and the adapters' output are left as they are
        // (the sum promoted); on the CPU (the traces) the input is cast to
        // the adapters' float32 and their output to the result's type.
        let four_amp = self.run.quant.is_some() && self.run.amp.is_some();
        let four_converts = four_amp && self.run.gpu.is_none();
        let fan_in = a_fan_in(a, rank);
        let x32 = if (self.low() || four_converts) && x.bytes != rows * fan_in * 4 {
            self.t.cast(x, rows * fan_in * 4)
        } else {
            self.t.share(x)
        };
        let down = self.linear_of(x32, (a, None), rows, (fan_in, rank), 4);
        let up = self.linear_of(down, (b, None), rows, (rank, width), 4);
        self.t.drop(down);
        let mut scaled = self.t.scale(up);
        self.t.drop(up);
        if four_converts && scaled.bytes != result.bytes {
            let cast = self.t.cast(scaled, result.bytes);
            self.t.drop(scaled);
            scaled = cast;
        }
        let sum = if self.low() {
            self.t.add_wider(result, scaled)
        } else if four_amp {
            self.t.add_mixed(result, scaled)
        } else {
            self.t.add(result, scaled, result.bytes)
        };
        if self.run.quant.is_some() {
            // peft's 4-bit layer names the adapters' output (`output`): the
            // old `result` goes as the sum is bound, then `x`, then
            // `output` as the forward returns.
            self.t.drop_all(&[result, x32, scaled]);
            return sum;
        }
        self.t.drop_all(&[scaled, result]);
        // `result.to(torch_result_dtype)`, then `x` goes as it returns.
        let out = if self.low() {
            let cast = self.t.cast(sum, rows * width * self.e());
            self.t.drop(sum);
            cast
        } else {
            sum
        };
        self.t.drop(x32);
        out
    }

    /// The attention block from the layer's normed input: its output
    /// projection and eager attention's weights.
    fn self_attn(&mut self, l: u64, x: T, s: &Shared) -> (T, Option<T>) {
        let (c, rows) = (self.c, self.run.batch * self.run.seq);
        let (q_width, kv_width) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let (q, k, v, fused) = if c.arch == Arch::Phi3 {
            let qkv = self.project(
                x,
                Name::of(l, "self_attn.qkv_proj"),
                rows,
                q_width + 2 * kv_width,
                false,
            );
            // The projection's own element size (under QLoRA with autocast
            // the 4-bit layer's output comes back in float32).
            let e = qkv.bytes / (rows * (q_width + 2 * kv_width)).max(1);
            let q = self.t.slice(qkv, rows * q_width * e);
            let k = self.t.slice(qkv, rows * kv_width * e);
            let mut v = self.t.slice(qkv, rows * kv_width * e);
            let (q, k) = (self.heads(q), self.heads(k));
            if self.run.attention == Attention::Eager {
                v = self.heads(v);
            }
            (q, k, v, Some(qkv))
        } else {
            let head_norm = c.arch == Arch::Qwen3;
            let mut q = self.project(
                x,
                Name::of(l, "self_attn.q_proj"),
                rows,
                q_width,
                c.qkv_bias,
            );
            if c.heads > 1 {
                q = self.heads(q);
            }
            if head_norm {
                let w = self.weight(Name::of(l, "self_attn.q_norm"));
                let n = self.rms_norm(q, w, rows * c.heads, c.head_dim);
                self.t.drop(q);
                q = n;
            }
            let mut k = self.project(
                x,
                Name::of(l, "self_attn.k_proj"),
                rows,
                kv_width,
                c.qkv_bias,
            );
            if c.kv_heads > 1 {
                k = self.heads(k);
            }
            if head_norm {
                let w = self.weight(Name::of(l, "self_attn.k_norm"));
                let n = self.rms_norm(k, w, rows * c.kv_heads, c.head_dim);
                self.t.drop(k);
                k = n;
            }
            let mut v = self.project(
                x,
                Name::of(l, "self_attn.v_proj"),
                rows,
                kv_width,
                c.qkv_bias,
            );
            // Eager attention's (and the math kernel's) value gradient is
            // in the heads' layout too (the fused kernels give theirs in
            // the rows').
            let math = self.run.math_gqa && c.heads != c.kv_heads;
            if (self.run.attention == Attention::Eager || math) && c.kv_heads > 1 {
                v = self.heads(v);
            }
            (q, k, v, None)
        };
        self.attention_block(l, [q, k, v], s, fused)
    }

    /// From q, k and v (views of their projections): rotated, cached,
    /// attended, projected. Returns the projection and eager attention's
    /// weights, which the layer holds.
    pub(super) fn attention_block(
        &mut self,
        l: u64,
        [q, k, v]: [T; 3],
        s: &Shared,
        fused: Option<T>,
    ) -> (T, Option<T>) {
        let (c, rows) = (self.c, self.run.batch * self.run.seq);
        let (q_rot, k_rot) = self.rotate_both(q, k, s);
        self.t.drop_all(&[q, k]);
        let (k, v) = self.cache_update(l, k_rot, v);
        let keys = self.keys_read(l);
        let (out, weights) = match self.run.attention {
            Attention::Eager => {
                let (o, w) = self.eager(q_rot, k, v, s, keys);
                (o, Some(w))
            }
            Attention::Sdpa => (self.sdpa(q_rot, k, v, s.mask), None),
        };
        // Phi-3's queries are laid out as heads (its rotation's `cat`), so
        // the kernel's output is too: `transpose(1, 2).contiguous()` copies.
        let out = if fused.is_some() && self.run.attention == Attention::Sdpa && self.run.seq > 1 {
            let copy = self.t.copy("clone", out);
            self.t.drop(out);
            copy
        } else {
            out
        };
        let projected = self.project(
            out,
            Name::of(l, "self_attn.o_proj"),
            rows,
            c.hidden,
            c.o_bias,
        );
        self.t.drop(out);
        // The attention's locals go as it returns, Phi-3's `qkv` first.
        if let Some(qkv) = fused {
            self.t.drop(qkv);
        }
        self.t.drop_all(&[q_rot, k, v]);
        (projected, weights)
    }

    /// The keys and values through the `DynamicCache` a training forward
    /// makes: its `torch.cat` onto its empty tensors copies them, and it
    /// holds the copies until the model's output goes. Without it (under
    /// checkpointing), `k` and `v` themselves. In `generate`, layer `l`'s
    /// cache as it runs there.
    pub(super) fn cache_update(&mut self, l: u64, k: T, v: T) -> (T, T) {
        if self.decode.is_some() {
            return self.decode_update(l, k, v);
        }
        if !self.cached() {
            return (k, v);
        }
        let keys = self.t.cat(&[k]);
        let values = self.t.cat(&[v]);
        self.t.drop_all(&[k, v]);
        let held = [self.t.share(keys), self.t.share(values)];
        self.cache.extend(held);
        (keys, values)
    }

    /// The gated SiLU MLP on the normed rows: its output.
    fn mlp(&mut self, l: u64, x: T) -> T {
        let (c, rows) = (self.c, self.run.batch * self.run.seq);
        let i = c.intermediate;
        // Phi-3's `gate, up_states = up_states.chunk(2, dim=-1)`: `gate`
        // (a view of the projection) lives until the MLP returns.
        let (gated, gate) = if c.arch == Arch::Phi3 {
            let gate_up = self.project(x, Name::of(l, "mlp.gate_up_proj"), rows, 2 * i, false);
            let e = gate_up.bytes / (rows * 2 * i).max(1);
            let halves = self.t.split(gate_up, 2);
            self.t.drop(gate_up);
            let (gate, up) = (halves[0], halves[1]);
            let act = self.t.unary_saving_input("silu", "silu_backward", gate);
            self.t.on_stack(act);
            let gated = self.t.mul(up, act, rows * i * e);
            self.t.drop_all(&[act, up]);
            (gated, Some(gate))
        } else {
            let gate = self.project(x, Name::of(l, "mlp.gate_proj"), rows, i, c.mlp_bias);
            // `act_fn(gate_proj(x)) * up_proj(x)`: `act_fn`'s and
            // `up_proj`'s outputs wait on the stack for the product.
            let act = self.t.unary_saving_input("silu", "silu_backward", gate);
            self.t.on_stack(act);
            self.t.drop(gate);
            let up = self.project(x, Name::of(l, "mlp.up_proj"), rows, i, c.mlp_bias);
            self.t.on_stack(up);
            let gated = self.t.mul(act, up, act.bytes);
            self.t.drop_all(&[act, up]);
            (gated, None)
        };
        let down = self.project(
            gated,
            Name::of(l, "mlp.down_proj"),
            rows,
            c.hidden,
            c.mlp_bias,
        );
        self.t.drop(gated);
        if let Some(gate) = gate {
            self.t.drop(gate);
        }
        down
    }

    /// One decoder layer's forward from `x`: its output.
    pub(super) fn layer(&mut self, l: u64, x: T, s: &Shared) -> T {
        let (c, rows) = (self.c, self.run.batch * self.run.seq);
        let w = self.weight(Name::of(l, "input_layernorm"));
        let normed = self.rms_norm(x, w, rows, c.hidden);
        let (attended, weights) = self.self_attn(l, normed, s);
        self.t.drop(normed);
        let h = self.t.add_mixed(x, attended);
        self.t.drop(attended);
        let w = self.weight(Name::of(l, "post_attention_layernorm"));
        let normed = self.rms_norm(h, w, rows, c.hidden);
        let down = self.mlp(l, normed);
        self.t.drop(normed);
        let out = self.t.add_mixed(h, down);
        self.t.drop_all(&[down, h]);
        if let Some(w) = weights {
            self.t.drop(w);
        }
        out
    }
}

/// A LoRA `lora_A`'s inputs (its float32 weight is rank x inputs).
fn a_fan_in(a: T, rank: u64) -> u64 {
    a.bytes / 4 / rank.max(1)
}
