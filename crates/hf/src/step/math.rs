//! `scaled_dot_product_attention`'s math kernel with grouped-query heads
//! (`_scaled_dot_product_attention_math`, a composite of aten ops, the same
//! on every device): what a GPU runs where no fused kernel takes the call,
//! as PyTorch 2.11's memory-efficient kernel refuses grouped heads
//! (`enable_gqa=True`) and flash and cuDNN take no float32. The query
//! scaled, the causal mask made, the keys and values repeated for every
//! query head (`repeat_interleave`), the keys scaled, the scores in full
//! (`batch x heads x seq x seq`), the mask added in place, `_safe_softmax`,
//! the product; the output
//! in the heads' layout, which `transpose(1, 2).contiguous()` copies.

use super::tape::T;
use super::Model;
use vramlab_train::program::Holds;

impl Model<'_, '_> {
    /// The math kernel's attention of `q`, `k`, `v` (causal, no mask): the
    /// output in the rows' layout.
    pub(super) fn math_sdpa(&mut self, q: T, k: T, v: T) -> T {
        let (c, b, n) = (self.c, self.run.batch, self.run.seq);
        let e = self.pe();
        let groups = c.heads / c.kv_heads.max(1);
        let q_s = self.t.scale(q);
        let mask = self.causal_mask(n, e);
        let [k_rep, v_rep] = [k, v].map(|x| {
            let wide = self.t.expand(x, x.bytes * groups);
            let copy = self.t.copy("clone", wide);
            self.t.drop(wide);
            copy
        });
        let k_s = self.t.scale(k_rep);
        let q_b = self.t.copy("clone", q_s);
        let scores = self.t.bmm(q_b, k_s, b * c.heads * n * n * e);
        self.t.drop_all(&[q_b, k_s]);
        // `attn.add_(attn_mask)`: in place on a GPU, so nothing is made,
        // and its backward passes the gradient through; under the
        // reference traces' dispatch mode the kernel takes its path for
        // tensor subclasses, `attn.add(attn_mask)`, and the mode sees
        // `_safe_softmax` as one op.
        let masked = match self.run.gpu {
            Some(_) => scores,
            None => {
                let masked = self.t.add(scores, mask, scores.bytes);
                self.t.drop(scores);
                masked
            }
        };
        let soft = self
            .t
            .softmax("_safe_softmax", "_softmax_backward_data", masked);
        if self.run.gpu.is_some() {
            self.safe_softmax_checks(scores.bytes / e, n);
        }
        self.t.drop(masked);
        let out = self.t.bmm(soft, v_rep, q.bytes);
        // The kernel returns: its locals go, then the tuple that carried
        // the weights beside the output.
        match self.run.gpu {
            Some(_) => self.t.drop_all(&[k_rep, v_rep, q_s, mask, soft]),
            None => self.t.drop_all(&[q_s, k_rep, v_rep, mask, soft]),
        }
        let copy = self.t.contiguous_heads(out);
        self.t.drop(out);
        copy
    }

    /// `_safe_softmax`'s fully masked rows zeroed, after the softmax (as
    /// the H100's snapshot shows): `isneginf` of the `elements` scores,
    /// `all` over each row of `n`, a scalar zero; all three go at once.
    fn safe_softmax_checks(&mut self, elements: u64, n: u64) {
        let neg = self.t.alloc("isneginf", elements, Holds::Activation);
        let rows = self.t.alloc("all", elements / n.max(1), Holds::Activation);
        let zero = self.t.alloc("scalar_tensor", self.pe(), Holds::Activation);
        for s in [zero, rows, neg] {
            self.t.release(s);
        }
    }

    /// `ones(n, n, bool).tril()` as a float mask (`where(mask, 0, -inf)`).
    fn causal_mask(&mut self, n: u64, e: u64) -> T {
        let ones = self.t.alloc("ones", n * n, Holds::Ids);
        let tril = self.t.alloc("tril", n * n, Holds::Ids);
        self.t.release(ones);
        let zero = self.t.alloc("scalar_tensor", e, Holds::Ids);
        let inf = self.t.alloc("scalar_tensor", e, Holds::Ids);
        let mask = self.t.alloc("where", n * n * e, Holds::Ids);
        for s in [zero, inf, tril] {
            self.t.release(s);
        }
        self.t.plain(mask, n * n * e)
    }
}
