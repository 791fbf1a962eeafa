//! The step's three passes, in the order PyTorch runs their ops.

use super::{Attention, Tape, F32};
use crate::train::kinds::TransformerShape;
use crate::types::Dtype;

const SDPA: &str = "_scaled_dot_product_flash_attention";
const SDPA_BACKWARD: &str = "_scaled_dot_product_flash_attention_backward";

impl Tape {
    pub(super) fn forward(&mut self, attention: Attention) {
        let (act, d) = (self.act, self.width);
        // Token and position embeddings (the positions' ids are saved).
        self.alloc("embedding", act);
        self.alloc("arange", self.seq_len * 8);
        self.alloc("embedding", self.seq_len * d * F32);
        self.alloc("add", act);
        self.free(act);
        self.free(self.seq_len * d * F32);
        for _ in 0..self.layers {
            self.layer_norm();
            self.alloc("addmm", 3 * act);
            match attention {
                Attention::Sdpa => self.sdpa(),
                Attention::Eager => self.eager_attention(),
            }
            self.alloc("add", act);
            self.free(act);
            self.layer_norm();
            self.alloc("addmm", self.ratio * act);
            self.alloc("gelu", self.ratio * act);
            self.alloc("addmm", act);
            self.alloc("add", act);
            self.free(act);
        }
        self.layer_norm();
        // The head, log-softmax and NLL (its loss and total weight); the
        // loop's previous loss goes, then the logits.
        self.alloc("mm", self.logits);
        self.alloc("_log_softmax", self.logits);
        self.alloc("nll_loss_forward", F32);
        self.alloc("nll_loss_forward", F32);
        self.free(F32);
        self.free(self.logits);
    }

    fn sdpa(&mut self) {
        let act = self.act;
        self.alloc(SDPA, act);
        self.alloc(SDPA, self.lse);
        self.alloc("addmm", act);
    }

    fn eager_attention(&mut self) {
        let (act, scores, mask) = (self.act, self.scores, self.mask);
        self.alloc("clone", act);
        self.alloc("clone", act);
        self.alloc("bmm", scores);
        self.alloc("mul", scores);
        self.free(scores);
        self.alloc("ones", mask);
        self.alloc("tril", mask);
        self.free(mask);
        self.alloc("bitwise_not", mask);
        self.alloc("masked_fill", scores);
        self.alloc("_softmax", scores);
        self.free(scores);
        self.free(scores);
        self.alloc("clone", act);
        self.alloc("bmm", act);
        self.alloc("clone", act);
        self.alloc("addmm", act);
        // q, k, v's storage, the heads' output and the mask go with the
        // attention's locals.
        self.free(3 * act);
        self.free(act);
        self.free(mask);
    }

    pub(super) fn backward(&mut self, attention: Attention) {
        let (act, d, logits) = (self.act, self.width, self.logits);
        self.alloc("ones_like", F32);
        self.alloc("nll_loss_backward", logits);
        self.free(F32);
        self.alloc("_log_softmax_backward_data", logits);
        self.free(logits);
        self.free(logits);
        self.alloc("mm", self.vocab * d * F32);
        self.alloc("mm", act);
        self.free(logits);
        self.free(act);
        self.layer_norm_backward();
        for _ in 0..self.layers {
            self.mlp_backward();
            self.attention_backward(attention);
        }
        // The position embedding's gradient (summed over the batch), then
        // the tied token embedding's, added to the head's.
        let (positions, tokens) = (self.seq_len * d * F32, self.vocab * d * F32);
        self.alloc("sum", positions);
        self.alloc("embedding_dense_backward", positions);
        self.free(positions);
        self.free(self.seq_len * 8);
        self.alloc("embedding_dense_backward", tokens);
        self.free(act);
        self.alloc("add", tokens);
        self.free(tokens);
        self.free(tokens);
        self.free(F32);
    }

    fn mlp_backward(&mut self) {
        let (act, d, wide) = (self.act, self.width, self.ratio * self.act);
        self.linear_backward(wide, self.ratio * d, d);
        self.free(wide);
        self.alloc("gelu_backward", wide);
        self.free(wide);
        self.free(wide);
        self.linear_backward(act, d, self.ratio * d);
        self.free(wide);
        self.free(act);
        self.layer_norm_backward();
        self.residual_backward();
    }

    fn attention_backward(&mut self, attention: Attention) {
        let (act, d) = (self.act, self.width);
        self.linear_backward(act, d, d);
        match attention {
            Attention::Sdpa => {
                for _ in 0..3 {
                    self.alloc(SDPA_BACKWARD, act);
                }
                for bytes in [act, 3 * act, self.lse, act] {
                    self.free(bytes);
                }
            }
            Attention::Eager => self.eager_attention_backward(),
        }
        self.alloc("cat", 3 * act);
        for _ in 0..3 {
            self.free(act);
        }
        self.linear_backward(act, d, 3 * d);
        self.free(3 * act);
        self.free(act);
        self.layer_norm_backward();
        self.residual_backward();
    }

    fn eager_attention_backward(&mut self) {
        let (act, scores, mask) = (self.act, self.scores, self.mask);
        self.free(act);
        self.alloc("clone", act);
        self.free(act);
        self.alloc("bmm", act);
        self.alloc("bmm", scores);
        self.free(act);
        self.free(act);
        self.alloc("_softmax_backward_data", scores);
        self.free(scores);
        self.free(scores);
        self.alloc("masked_fill", scores);
        self.free(scores);
        self.free(mask);
        self.alloc("mul", scores);
        self.free(scores);
        self.alloc("bmm", act);
        self.alloc("bmm", act);
        self.free(scores);
        self.free(act);
        self.free(act);
        for _ in 0..2 {
            self.alloc("clone", act);
            self.free(act);
        }
    }

    /// Adam's foreach update: `exp_avg_sq.sqrt()` for every parameter at
    /// once, freed last first; then `zero_grad(set_to_none=True)` frees
    /// every gradient, in order.
    pub(super) fn optimizer(&mut self, t: &TransformerShape) {
        let sizes: Vec<u64> = t
            .parameters(Dtype::Float32)
            .iter()
            .map(|p| p.numel() * F32)
            .collect();
        for &bytes in &sizes {
            self.alloc("_foreach_sqrt", bytes);
        }
        for &bytes in sizes.iter().rev() {
            self.free(bytes);
        }
        for &bytes in &sizes {
            self.free(bytes);
        }
    }
}
