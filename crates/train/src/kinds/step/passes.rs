//! The step's two passes: embeddings, the blocks (checkpointed or not),
//! the final norm, the head and the loss; then backward in reverse.

use super::block::{Normed, Params, Saved};
use super::lora::Early;
use super::{param_or_cast, Arg, Batch, Calc, Keep, Loss, Region, Role, Tape, H};
use crate::kinds::Norm;
use crate::kinds::TransformerShape;
use vramlab_core::types::Dtype;

/// What backward needs from the forward pass.
pub(super) struct Top {
    /// The position ids the position embedding saves.
    positions: H,
    /// Each block's saved tensors, or (checkpointed) its input.
    blocks: Vec<Block>,
    final_norm: Normed,
    /// Under autocast, the head's casts autograd saved: of its input
    /// (unless the head is frozen) and of its weight.
    head_casts: Option<(Option<H>, H)>,
    loss: Loss,
}

enum Block {
    Saved(Box<Saved>),
    Checkpointed(H),
}

impl Tape<TransformerShape> {
    /// Parameters per norm: LayerNorm's weight and bias, RMSNorm's weight.
    fn norm_params(&self) -> usize {
        match self.shape.norm {
            Norm::LayerNorm => 2,
            Norm::RmsNorm => 1,
        }
    }

    fn block_params(&self, layer: u32) -> Params {
        let (n, linear) = (self.norm_params(), self.shape.linear_params());
        let ln1 = 2 + layer as usize * (2 * n + 4 * linear);
        let attn = ln1 + n;
        let proj = attn + linear;
        let ln2 = proj + linear;
        Params {
            ln1,
            attn,
            proj,
            ln2,
            fc: ln2 + n,
            out: ln2 + n + linear,
        }
    }

    /// Whether block `layer`'s input requires a gradient: with LoRA the
    /// first block's does not (the embeddings are frozen).
    fn block_input_grad(&self, layer: u32) -> bool {
        !(self.frozen() && layer == 0)
    }

    /// The final norm's weight; an untied head follows it.
    fn final_norm_param(&self) -> usize {
        self.block_params(self.shape.layers).ln1
    }

    fn logits(&self) -> Vec<u64> {
        vec![self.batch * self.shape.seq_len, self.shape.vocab]
    }

    pub(super) fn forward(&mut self) -> Top {
        let (seq, d) = (self.shape.seq_len, self.shape.width);
        let ids = Arg::Batch(Batch::Inputs);
        let embedding = |weight, ids| ("embedding", Calc::Embedding { weight, ids });
        let tokens = self.alloc_f32(embedding(Arg::Param(0), ids), self.act());
        let arange = ("arange", Calc::Arange);
        let positions = self.alloc_as(arange, vec![seq], Dtype::Int64, Role::Forward);
        let pos = self.alloc_f32(embedding(Arg::Param(1), Arg::T(positions)), vec![seq, d]);
        if self.frozen() || !self.grad {
            // A frozen embedding saves no indices (nor does any under
            // no_grad).
            self.free(positions);
        }
        let sum = ("add", Calc::Add(Arg::T(tokens), Arg::T(pos)));
        let mut x = self.alloc_f32(sum, self.act());
        self.free_all(&[tokens, pos]);
        let mut blocks = Vec::new();
        for l in 0..self.shape.layers {
            self.layer = Some(l);
            self.input_grad = self.block_input_grad(l);
            let keep = if !self.grad {
                Keep::Nothing
            } else if self.options.checkpointing {
                blocks.push(Block::Checkpointed(x));
                Keep::Nothing
            } else {
                Keep::All
            };
            let checkpointed = self.grad && self.options.checkpointing;
            if checkpointed {
                self.begin(Region::Checkpoint);
            }
            let (out, saved) = self.block(x, keep, self.block_params(l));
            if checkpointed {
                self.end(Region::Checkpoint);
            }
            blocks.extend(saved.map(|s| Block::Saved(Box::new(s))));
            if !self.grad || (!self.input_grad && !self.options.checkpointing) {
                // Nothing saved the block's input (with LoRA, the
                // embeddings' sum): it dies as the block returns.
                self.free(x);
            }
            x = out.expect("a whole block has an output");
        }
        self.layer = None;
        let final_norm = self.norm(x, self.final_norm_param(), self.grad);
        let shape = vec![self.shape.vocab, d];
        let head = self.head_param();
        let weight = match self.frozen() {
            true => self.cast_frozen(head, shape),
            false => self.cast_param(head, shape),
        };
        let input = self.cast_input(final_norm.out);
        let mm = Calc::mm(Arg::T(input), param_or_cast(head, weight), false, true);
        let logits = self.matmul(("mm", mm), self.logits());
        if let Some(w) = weight {
            self.save_cast(w);
        }
        let cast = (input != final_norm.out).then_some(input);
        if !self.grad {
            // Nothing saved: the casts die with the head's call, then the
            // norm's output and its input.
            let frozen = weight.filter(|_| self.frozen());
            let dead: Vec<H> = frozen.into_iter().chain(cast).collect();
            self.free_all(&dead);
            self.free_all(&[final_norm.out, x]);
        } else {
            if let Some(cast) = cast.filter(|_| self.frozen()) {
                self.free(cast);
            }
            if self.frozen() || cast.is_some() {
                // A frozen head saves no input; under autocast it saves the
                // cast.
                self.free(final_norm.out);
            }
        }
        let loss = self.cross_entropy(logits, &self.logits());
        Top {
            positions,
            blocks,
            final_norm,
            head_casts: weight.map(|w| (cast.filter(|_| !self.frozen()), w)),
            loss,
        }
    }

    /// The head's weight: the token embedding's when tied.
    fn head_param(&self) -> usize {
        if self.shape.tied {
            0
        } else {
            self.final_norm_param() + self.norm_params()
        }
    }

    pub(super) fn backward(&mut self, top: Top) {
        let (d, vocab) = (self.shape.width, self.shape.vocab);
        let (seed, g_logits) = self.cross_entropy_backward(top.loss, &self.logits());
        let head = self.head_param();
        let amp = top.head_casts.is_some();
        let input = match top.head_casts {
            Some((Some(cast), _)) => cast,
            _ => top.final_norm.out,
        };
        let weight = param_or_cast(head, top.head_casts.map(|(_, w)| w));
        let g_weight = Calc::mm(Arg::T(g_logits), Arg::T(input), true, false);
        let g_head = match (self.frozen(), self.shape.tied || amp) {
            (true, _) => None,
            (false, true) => Some(self.matmul(("mm", g_weight), vec![vocab, d])),
            (false, false) => Some(self.grad_mm(head, g_weight, vec![vocab, d])),
        };
        let g_input = Calc::mm(Arg::T(g_logits), weight, false, false);
        let mut g_norm = self.matmul(("mm", g_input), self.act());
        self.free(g_logits);
        match top.head_casts {
            Some((input, weight)) => {
                self.free(weight);
                self.free_all(&input.into_iter().collect::<Vec<_>>());
                g_norm = self.uncast(g_norm, Dtype::Float32, Role::Backward);
            }
            None if !self.frozen() => self.free(top.final_norm.out),
            None => {}
        }
        let role = if self.shape.tied {
            Role::Backward
        } else {
            Role::Grad(head)
        };
        let g_head = match g_head {
            Some(g) if amp => Some(self.uncast(g, Dtype::Float32, role)),
            g => g,
        };
        let param = self.final_norm_param();
        let mut g = Some(self.norm_backward(&top.final_norm, g_norm, param, false));
        for (l, block) in (0..self.shape.layers).zip(top.blocks).rev() {
            self.layer = Some(l);
            self.input_grad = self.block_input_grad(l);
            g = g.and_then(|g| self.block_backward_from(block, g, l));
        }
        self.layer = None;
        if let (Some(g), Some(g_head)) = (g, g_head) {
            self.embeddings_backward(top.positions, g, g_head);
        }
        self.free(seed);
    }

    /// A block's backward; a checkpointed block is recomputed first.
    fn block_backward_from(&mut self, block: Block, g: H, layer: u32) -> Option<H> {
        let params = self.block_params(layer);
        match block {
            Block::Saved(saved) => self.block_backward(*saved, (g, Early::default()), params, None),
            Block::Checkpointed(input) => {
                // The engine casts the gradient for the MLP's projection,
                // and LoRA's `MulBackward` runs, before the recomputation.
                let cast = self.cast_to(g, self.low());
                let early = Early {
                    cast: (cast != g).then_some(cast),
                    scaled: self.frozen().then(|| self.scale(cast, self.shape.width)),
                };
                self.begin(Region::Recompute);
                let (_, saved) = self.block(input, Keep::Recompute, params);
                let saved = saved.expect("a recomputed block saves");
                self.end(Region::Recompute);
                self.block_backward(saved, (g, early), params, Some(input))
            }
        }
    }

    /// The position embedding's gradient (summed over the batch), then the
    /// token embedding's, added to the tied head's.
    fn embeddings_backward(&mut self, positions: H, g: H, g_head: H) {
        let (seq, d, vocab) = (self.shape.seq_len, self.shape.width, self.shape.vocab);
        let summed = self.alloc_f32(("sum", Calc::Sum(Arg::T(g))), vec![seq, d]);
        let backward = |grad, ids| {
            let calc = Calc::EmbeddingBackward { grad, ids };
            ("embedding_dense_backward", calc)
        };
        let op = backward(Arg::T(summed), Arg::T(positions));
        self.grad(op, 1, vec![seq, d]);
        self.free_all(&[summed, positions]);
        let op = backward(Arg::T(g), Arg::Batch(Batch::Inputs));
        // The token embedding's node lets go of the token ids it saved.
        if self.shape.tied {
            let g_tokens = self.alloc_f32(op, vec![vocab, d]);
            self.free(g);
            self.release(Batch::Inputs);
            let sum = ("add", Calc::Add(Arg::T(g_head), Arg::T(g_tokens)));
            self.grad(sum, 0, vec![vocab, d]);
            self.free_all(&[g_head, g_tokens]);
        } else {
            self.grad(op, 0, vec![vocab, d]);
            self.free(g);
            self.release(Batch::Inputs);
        }
    }
}
