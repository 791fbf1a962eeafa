//! GPT-2's training forward as transformers 5.24 runs it: token and
//! position embeddings added, `nn.LayerNorm`s, `Conv1D` projections
//! (`addmm` with a bias), q, k and v split from one projection, the GELU
//! written in Python ops (`NewGELUActivation`), and dropout where the
//! config asks for it (its class defaults to 0.1 everywhere).

use super::llama::Shared;
use super::ops::Fit;
use super::tape::T;
use super::weights::Name;
use super::Model;
use vramlab_train::kinds::step::Attention;

impl Model<'_, '_> {
    /// `nn.LayerNorm` named `name` over the batch's rows.
    fn layer_norm(&mut self, name: Name, x: T) -> T {
        let rows = self.run.batch * self.run.seq;
        let (w, b) = (self.weight(name), self.bias(name));
        self.t.layer_norm(x, w, b, rows)
    }

    /// `nn.Dropout` in training, where the config's probability is not 0:
    /// on a GPU `native_dropout` (the output and a boolean mask, saved);
    /// on the CPU a noise tensor the input is multiplied by (saved).
    /// Off in `generate` (`model.eval()`).
    pub(super) fn dropout(&mut self, x: T, on: bool) -> T {
        if !on || self.decode.is_some() {
            return self.t.share(x);
        }
        if self.run.gpu.is_some() {
            return self.t.native_dropout(x, x.bytes / self.e());
        }
        let noise = self.t.alloc(
            "empty_like",
            x.bytes,
            vramlab_train::program::Holds::Activation,
        );
        let noise = self.t.plain(noise, x.bytes);
        let out = self.t.mul(x, noise, x.bytes);
        self.t.drop(noise);
        out
    }

    /// `NewGELUActivation`: `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x +
    /// 0.044715 * x³)))`, op by op.
    /// Under autocast `pow` is a float32 op: `x` is cast for it, and the
    /// rest runs in float32 from there.
    fn gelu_new(&mut self, x: T) -> T {
        let numel = x.bytes / self.pe();
        let half = self.t.scale(x);
        let x32 = match self.run.amp.is_some() && x.bytes != numel * 4 {
            true => self.t.cast(x, numel * 4),
            false => self.t.share(x),
        };
        let cube = self.t.square(x32);
        self.t.drop(x32);
        let small = self.t.scale(cube);
        self.t.drop(cube);
        let inner = self.t.add_mixed(x, small);
        self.t.drop(small);
        let scaled = self.t.scale(inner);
        self.t.drop(inner);
        let tanh = self.t.tanh(scaled);
        self.t.drop(scaled);
        let plus_one = self.t.add_scalar(tanh);
        self.t.drop(tanh);
        let bytes = half.bytes.max(plus_one.bytes);
        let fits = [Fit::Cast(half.bytes), Fit::Cast(plus_one.bytes)];
        let out = self.t.mul_fit(half, plus_one, bytes, fits);
        self.t.drop_all(&[half, plus_one]);
        out
    }

    /// GPT-2's attention from the normed input: `c_proj`'s output (after
    /// its dropout) and eager attention's weights.
    fn gpt2_attn(&mut self, l: u64, x: T, s: &Shared) -> (T, Option<T>) {
        let (c, rows) = (self.c, self.run.batch * self.run.seq);
        let d = c.hidden;
        let qkv = self.project(x, Name::of(l, "attn.c_attn"), rows, 3 * d, true);
        let parts = self.t.split(qkv, 3);
        let (q, mut k, mut v) = (parts[0], parts[1], parts[2]);
        // Eager attention's key and value gradients come back in the heads'
        // layout: viewing them as rows copies them.
        if self.run.attention == Attention::Eager {
            k = self.heads(k);
            v = self.heads(v);
        }
        let (k, v) = self.cache_update(l, k, v);
        let keys = self.keys_read(l);
        let (out, weights) = match self.run.attention {
            Attention::Eager => {
                let (o, w) = self.gpt2_eager(q, k, v, s, keys);
                (o, Some(w))
            }
            // Causal in training; `generate`'s static cache passes its mask.
            Attention::Sdpa => {
                let mask = s.mask.filter(|_| self.decode.is_some());
                (self.sdpa(q, k, v, mask), None)
            }
        };
        let projected = self.project(out, Name::of(l, "attn.c_proj"), rows, d, true);
        self.t.drop(out);
        let dropped = self.dropout(projected, c.dropout.resid);
        self.t.drop(projected);
        self.t.drop_all(&[q, k, v, qkv]);
        (dropped, weights)
    }

    /// GPT-2's `eager_attention_forward`: the scores scaled and masked, a
    /// softmax in the model's type, dropout, the product; then
    /// `reshape(...).contiguous()` copies the output.
    fn gpt2_eager(&mut self, q: T, k: T, v: T, s: &Shared, attended: u64) -> (T, T) {
        let (c, b, n) = (self.c, self.run.batch, self.run.seq);
        let count = b * c.heads * n * attended;
        let scores = count * self.pe();
        // The split's views are not laid out as batches of heads: `matmul`
        // copies the queries, and without the cache's `cat` the keys and
        // values too.
        let q_batched = self.t.copy("clone", q);
        let copy = !self.cached();
        let keys = self.batched(k, copy);
        let raw = self.t.bmm(q_batched, keys, scores);
        self.t.drop_all(&[q_batched, keys]);
        let mut w = self.t.scale(raw);
        self.t.drop(raw);
        if let Some(mask) = s.mask {
            // The mask is in the embeddings' type: under autocast the
            // scores become float32.
            let bytes = count * self.e().max(self.pe());
            let fits = [Fit::Cast(w.bytes), Fit::Sum(mask.bytes)];
            let masked = self.t.add_fit(w, mask, bytes, fits);
            self.t.drop(w);
            w = masked;
        }
        let mut soft = self.t.softmax("_softmax", "_softmax_backward_data", w);
        self.t.drop(w);
        // `attn_weights.type(value.dtype)`.
        if soft.bytes != scores {
            let cast = self.t.cast(soft, scores);
            self.t.drop(soft);
            soft = cast;
        }
        let weights = self.dropout(soft, c.dropout.attn);
        self.t.drop(soft);
        let values = self.batched(v, copy);
        let out = self.t.bmm(weights, values, q.bytes);
        self.t.drop(values);
        (self.heads_to_rows(out), weights)
    }

    /// GPT-2's MLP on the normed rows: `c_proj`'s output after dropout.
    fn gpt2_mlp(&mut self, l: u64, x: T) -> T {
        let (c, rows) = (self.c, self.run.batch * self.run.seq);
        let fc = self.project(x, Name::of(l, "mlp.c_fc"), rows, c.intermediate, true);
        let act = self.gelu_new(fc);
        self.t.drop(fc);
        let projected = self.project(act, Name::of(l, "mlp.c_proj"), rows, c.hidden, true);
        self.t.drop(act);
        let dropped = self.dropout(projected, c.dropout.resid);
        self.t.drop(projected);
        dropped
    }

    /// One `GPT2Block` from `x`.
    pub(super) fn gpt2_block(&mut self, l: u64, x: T, s: &Shared) -> T {
        let normed = self.layer_norm(Name::of(l, "ln_1"), x);
        let (attended, weights) = self.gpt2_attn(l, normed, s);
        let h = self.t.add_mixed(attended, x);
        self.t.drop(normed);
        let normed = self.layer_norm(Name::of(l, "ln_2"), h);
        let ff = self.gpt2_mlp(l, normed);
        let out = self.t.add_mixed(h, ff);
        self.t.drop(normed);
        // The block's locals go as it returns: `residual`, `attn_output`,
        // `_` (the weights), `feed_forward_hidden_states`.
        self.t.drop_all(&[h, attended]);
        if let Some(w) = weights {
            self.t.drop(w);
        }
        self.t.drop(ff);
        out
    }

    /// `GPT2LMHeadModel(input_ids, labels=...)`'s forward to the final
    /// norm: the token and position embeddings, the blocks, `ln_f`.
    pub(super) fn gpt2_body(&mut self, ids: T) -> T {
        let (c, rows) = (self.c, self.run.batch * self.run.seq);
        let e = self.e();
        let wte = self.weight(Name::top("transformer.wte"));
        let wpe = self.weight(Name::top("transformer.wpe"));
        let mut embeds = self.t.embedding(wte, ids, rows * c.hidden * e);
        if self.run.input_grads {
            embeds = self.t.leaf(embeds);
        }
        let positions = self.positions();
        let position_rows = self.position_rows();
        let position_embeds = self
            .t
            .embedding(wpe, positions, position_rows * c.hidden * e);
        let sum = self.t.add(embeds, position_embeds, embeds.bytes);
        let [mask, _] = self.masks();
        let hidden = self.dropout(sum, c.dropout.embd);
        self.t.drop(sum);
        let s = Shared {
            cos: self.w.missing,
            sin: self.w.missing,
            positions,
            mask,
        };
        let last = self.layers(hidden, [s, s]);
        let normed = self.layer_norm(Name::top("transformer.ln_f"), last);
        self.t.drop(last);
        // `GPT2Model.forward` returns: its arguments, then its locals.
        self.t.drop_all(&[positions, embeds, position_embeds]);
        if let Some(m) = mask {
            self.t.drop(m);
        }
        normed
    }
}
