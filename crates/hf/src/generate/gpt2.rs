//! GPT-2's forward as transformers 5.24 runs it under `no_grad`
//! (`GPT2LMHeadModel`): token and position embeddings summed, LayerNorm,
//! one `Conv1D` (`addmm`) for q, k and v whose views the cache copies,
//! `gelu_new` written out in Python ops.

use super::{Attention, Holds, Tape, F32};

impl Tape<'_> {
    /// `nn.LayerNorm` over `rows`: the output, and the float32 mean and
    /// inverse deviation, dropped at once.
    fn layer_norm(&mut self, rows: u64) -> usize {
        let op = "native_layer_norm";
        let out = self.act(op, rows * self.c.hidden * self.e());
        let stats = [self.act(op, rows * F32), self.act(op, rows * F32)];
        self.free_all(&stats);
        out
    }

    /// `NewGELUActivation`: `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x +
    /// 0.044715 * x ** 3)))`, each op a tensor of `bytes`.
    fn gelu_new(&mut self, bytes: u64) -> usize {
        let half = self.act("mul", bytes);
        let cube = self.act("pow", bytes);
        let scaled = self.act("mul", bytes);
        self.free(cube);
        let inner = self.act("add", bytes);
        self.free(scaled);
        let times = self.act("mul", bytes);
        self.free(inner);
        let tanh = self.act("tanh", bytes);
        self.free(times);
        let plus = self.act("add", bytes);
        self.free(tanh);
        let out = self.act("mul", bytes);
        self.free_all(&[half, plus]);
        out
    }

    /// GPT-2's `eager_attention_forward`: q copied out of the projection,
    /// the scores scaled, masked and softmaxed in the model's type; the
    /// output and the weights, which the block holds until it returns.
    fn gpt2_eager(&mut self, tokens: u64, keys: u64) -> (usize, usize) {
        let (c, e) = (self.c, self.e());
        let heads = self.g.batch * c.heads;
        let q = self.act("clone", heads * tokens * c.head_dim * e);
        let scores = heads * tokens * keys * e;
        let raw = self.act("bmm", scores);
        self.free(q);
        let scaled = self.act("mul", scores);
        self.free(raw);
        let masked = self.act("add", scores);
        self.free(scaled);
        let weights = self.act("_softmax", scores);
        self.free(masked);
        let out = self.act("bmm", heads * tokens * c.head_dim * e);
        if tokens == 1 {
            return (out, weights);
        }
        // `attn_output.transpose(1, 2).contiguous()`.
        let copy = self.act("clone", heads * tokens * c.head_dim * e);
        self.free(out);
        (copy, weights)
    }

    /// One `GPT2Block` from `x`: its output.
    fn gpt2_block(&mut self, l: usize, tokens: u64) -> usize {
        let (c, e) = (self.c, self.e());
        let (bt, d) = (self.g.batch * tokens, c.hidden);
        let normed = self.layer_norm(bt);
        let qkv = self.act("addmm", bt * 3 * d * e);
        self.update(l, &[], tokens);
        let keys = self.layer_keys(l);
        let (attended, weights) = match self.g.attention {
            Attention::Eager => {
                let (out, weights) = self.gpt2_eager(tokens, keys);
                (out, Some(weights))
            }
            Attention::Sdpa => (self.sdpa(tokens), None),
        };
        let projected = self.act("addmm", bt * d * e);
        self.free_all(&[attended, qkv]);
        let h = self.act("add", bt * d * e);
        self.free(normed);
        let normed = self.layer_norm(bt);
        let wide = bt * c.intermediate * e;
        let fc = self.act("addmm", wide);
        let gelu = self.gelu_new(wide);
        self.free(fc);
        let mlp = self.act("addmm", bt * d * e);
        self.free(gelu);
        let out = self.act("add", bt * d * e);
        // The block returns: its locals go (the MLP's input, its output,
        // the residual, the attention's output and weights).
        self.free_all(&[normed, mlp, h, projected]);
        if let Some(w) = weights {
            self.free(w);
        }
        out
    }

    /// `GPT2LMHeadModel.forward` over `tokens` positions after `past`:
    /// the logits of the last position.
    pub(super) fn gpt2_forward(&mut self, past: u64, tokens: u64) -> usize {
        let (c, e, b) = (self.c, self.e(), self.g.batch);
        let bt = b * tokens;
        let tokens_embedded = self.act("embedding", bt * c.hidden * e);
        let positions_embedded = self.act("embedding", bt * c.hidden * e);
        let mut x = self.act("add", bt * c.hidden * e);
        let mask = self.mask(past, tokens);
        for l in 0..c.layers as usize {
            self.layer = Some(l as u32);
            let out = self.gpt2_block(l, tokens);
            self.free(x);
            x = out;
        }
        self.layer = None;
        let normed = self.layer_norm(bt);
        self.free_all(&[x, tokens_embedded, positions_embedded]);
        if let Some(m) = mask {
            self.free(m);
        }
        let logits = self.alloc("mm", b * c.vocab * e, Holds::Logits);
        self.free(normed);
        logits
    }
}
