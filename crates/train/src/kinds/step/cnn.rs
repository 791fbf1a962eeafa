//! The CNN's training step as PyTorch runs it: per block `convolution`
//! (saves its input and weight), `native_batch_norm` (saves its input, the
//! batch's mean and inverse deviation; the running statistics change in
//! place), `relu` (saves its output; the norm's output dies), and
//! `max_pool2d_with_indices` (saves its input and int64 indices); then the
//! flattened head's `addmm` and the loss. The first convolution computes no
//! gradient for the images. cuDNN's convolution workspace is the algorithm
//! cuDNN picks on the GPU at run time: unknown here, so each call takes
//! what `Options::conv_workspace` says (the `cudnn_workspace_bytes`
//! setting; 0, not counted, unless set): after the forward's output, and
//! after each of backward's two calls' (the input's gradient, the weight's).

use super::{param_or_cast, part, Arg, Batch, Calc, Keep, Op, Options, Program, Region, Tape, H};
use crate::kinds::CnnShape;
use vramlab_core::types::Dtype;

/// What a block's backward needs.
struct Saved {
    /// The input the convolution saved: the previous pooling's output, or
    /// under autocast the images' cast (`None`: the images, which the
    /// loop holds).
    input: Option<H>,
    /// The input requires a gradient (the images do not).
    input_grad: bool,
    /// Under autocast, the weight's cast (the convolution saves it).
    weight: Option<H>,
    conv: H,
    mean: H,
    invstd: H,
    relu: H,
    indices: H,
}

/// The forward pass alone under `torch.no_grad()`: each block's input dies
/// after its convolution, the head's after the head, nothing is saved.
pub fn no_grad_program(c: &CnnShape, batch: u64, options: Options) -> Program {
    let mut tape = Tape::no_grad(*c, "block", batch, options);
    let mut x = None;
    for b in 0..c.blocks {
        tape.layer = Some(b);
        x = tape.block(x, b, Keep::Nothing).0;
    }
    tape.layer = None;
    let flat = x.expect("at least one block");
    let head = tape.head_forward(flat);
    let logits = tape.matmul(head, vec![batch, c.classes]);
    tape.free(flat);
    tape.cross_entropy(logits, &[batch, c.classes]);
    tape.program.ops.push(Op::ForwardEnd);
    tape.program
}

/// The step's forward and backward passes at `batch` images, with each
/// block checkpointed (`checkpoint(block, x, use_reentrant=False)`) and
/// under autocast as `options` say (see `autocast`).
pub fn program(c: &CnnShape, batch: u64, options: Options) -> Program {
    let mut tape = Tape::new(*c, "block", batch, options);
    let keep = match options.checkpointing {
        true => Keep::Nothing,
        false => Keep::All,
    };
    let mut x = None;
    let mut blocks = Vec::new();
    for b in 0..c.blocks {
        tape.layer = Some(b);
        if keep == Keep::Nothing {
            tape.begin(Region::Checkpoint);
        }
        let (pooled, s) = tape.block(x, b, keep);
        if keep == Keep::Nothing {
            tape.end(Region::Checkpoint);
        }
        blocks.push((x, s));
        x = pooled;
    }
    tape.layer = None;
    let flat = x.expect("at least one block");
    let head = tape.head_forward(flat);
    let weight = tape.head_weight_cast();
    let logits = tape.matmul(head, vec![batch, c.classes]);
    let loss = tape.cross_entropy(logits, &[batch, c.classes]);
    tape.program.ops.push(Op::ForwardEnd);
    let shape = [batch, c.classes];
    let (seed, g_logits) = tape.cross_entropy_backward(loss, &shape);
    let mut g = Some(tape.head_backward(flat, g_logits, weight));
    for (b, (input, saved)) in (0..c.blocks).zip(blocks).rev() {
        tape.layer = Some(b);
        let saved = saved.unwrap_or_else(|| tape.recompute(input, b));
        g = g.and_then(|g| tape.block_backward(saved, g, b));
    }
    tape.layer = None;
    tape.free(seed);
    tape.program
}

impl Tape<CnnShape> {
    /// A cuDNN call's workspace, when the setting gives it a size.
    fn conv_workspace(&mut self) {
        if self.options.conv_workspace > 0 {
            let bytes = self.options.conv_workspace;
            self.program.ops.push(Op::Workspace(bytes));
        }
    }

    /// (input channels, output channels, side) of block `b`'s convolution.
    fn sizes(&self, b: u32) -> (u64, u64, u64) {
        let c = &self.shape;
        let c_in = if b == 0 {
            c.channels
        } else {
            c.width << (b - 1)
        };
        (c_in, c.width << b, c.image_size >> b)
    }

    /// B x `channels` x `side` x `side`.
    fn maps(&self, channels: u64, side: u64) -> Vec<u64> {
        vec![self.batch, channels, side, side]
    }

    /// The features the head sees.
    fn features(&self) -> u64 {
        let (_, c, side) = self.sizes(self.shape.blocks - 1);
        c * (side / 2) * (side / 2)
    }

    /// The head's parameter index (its bias follows).
    fn head(&self) -> usize {
        4 * self.shape.blocks as usize
    }

    /// The head's `addmm` on the flattened `x`, under autocast on casts
    /// of its bias and weight (the weight's saved) and of `x`'s.
    fn head_forward(&mut self, x: H) -> (&'static str, Calc) {
        let (head, classes) = (self.head(), self.shape.classes);
        let b = self.cast_param(head + 1, vec![classes]);
        let w = self.cast_param(head, vec![classes, self.features()]);
        if let Some(w) = w {
            self.save_cast(w);
        }
        let calc = Calc::Linear {
            x: Arg::T(x),
            weight: param_or_cast(head, w),
            bias: param_or_cast(head + 1, b),
        };
        ("addmm", calc)
    }

    /// Under autocast, the head weight's cast (saved, in the cache).
    fn head_weight_cast(&self) -> Option<H> {
        self.cached(self.head())
    }

    /// Block `b` on `x` (`None`: the images): the pooled output (none
    /// when recomputing) and, when kept, what backward needs. Under
    /// autocast the convolution runs on casts of its bias, weight and (the
    /// images) input.
    fn block(&mut self, x: Option<H>, b: u32, keep: Keep) -> (Option<H>, Option<Saved>) {
        let (c_in, c, side) = self.sizes(b);
        let save = keep != Keep::Nothing;
        let (conv, norm) = (4 * b as usize, 4 * b as usize + 2);
        let bias = self.cast_param(conv + 1, vec![c]);
        let cast_weight = self.cast_param(conv, vec![c, c_in, 3, 3]);
        let weight = cast_weight.filter(|_| save);
        weight.inspect(|&w| self.save_cast(w));
        let images = self.shape.image_size;
        let cast = match (x, self.options.amp) {
            (None, Some(amp)) => {
                let copy = ("_to_copy", Calc::Copy(Arg::Batch(Batch::Inputs)));
                Some(self.alloc_as(copy, self.maps(c_in, images), amp, self.role))
            }
            _ => None,
        };
        let input = cast.or(x).map_or(Arg::Batch(Batch::Inputs), Arg::T);
        let calc = Calc::Conv {
            x: input,
            weight: param_or_cast(conv, cast_weight),
            bias: param_or_cast(conv + 1, bias),
        };
        let conv_out = self.alloc(("convolution", calc), self.maps(c, side));
        self.conv_workspace();
        if let Some(cast) = cast.filter(|_| !save) {
            self.free(cast);
        }
        if let Some(x) = x.filter(|_| !self.grad) {
            // Under no_grad nothing holds the last block's output.
            self.free(x);
        }
        let op = "native_batch_norm";
        let calc = Calc::BatchNorm {
            x: Arg::T(conv_out),
            weight: Arg::Param(norm),
            bias: Arg::Param(norm + 1),
        };
        let normed = self.alloc((op, calc), self.maps(c, side));
        let mean = self.alloc_as((op, part(normed, 1)), vec![c], Dtype::Float32, self.role);
        let invstd = self.alloc_as((op, part(normed, 2)), vec![c], Dtype::Float32, self.role);
        if !save {
            self.free_all(&[mean, invstd, conv_out]);
        }
        let relu = self.alloc(("relu", Calc::Relu(Arg::T(normed))), self.maps(c, side));
        self.free(normed);
        let op = "max_pool2d_with_indices";
        let pool = (op, Calc::MaxPool(Arg::T(relu)));
        let pooled = self.alloc(pool, self.maps(c, side / 2));
        let indices = (op, part(pooled, 1));
        let indices = self.alloc_as(indices, self.maps(c, side / 2), Dtype::Int64, self.role);
        match keep {
            Keep::All => {}
            Keep::Nothing => self.free_all(&[indices, relu]),
            Keep::Recompute => {
                self.free(pooled);
                self.clear_cache();
            }
        }
        let saved = Saved {
            input: cast.or(x),
            input_grad: x.is_some(),
            weight,
            conv: conv_out,
            mean,
            invstd,
            relu,
            indices,
        };
        let pooled = (keep != Keep::Recompute).then_some(pooled);
        (pooled, save.then_some(saved))
    }

    /// A checkpointed block's recomputation from its input, in its own
    /// autocast region.
    fn recompute(&mut self, x: Option<H>, b: u32) -> Saved {
        self.begin(Region::Recompute);
        let (_, saved) = self.block(x, b, Keep::Recompute);
        self.end(Region::Recompute);
        saved.expect("a recomputed block saves")
    }

    /// The head's backward: the flattened input's gradient, the weight's
    /// and the bias's; the logits' gradient and the saved input (and
    /// weight's cast) go, then the casts' `ToCopyBackward`.
    fn head_backward(&mut self, flat: H, g_logits: H, cast: Option<H>) -> H {
        let (_, c, side) = self.sizes(self.shape.blocks - 1);
        let (head, classes) = (self.head(), self.shape.classes);
        let (g_out, x) = (Arg::T(g_logits), Arg::T(flat));
        let g_input = Calc::mm(g_out, param_or_cast(head, cast), false, false);
        let g = self.matmul(("mm", g_input), self.maps(c, side / 2));
        let shape = vec![classes, self.features()];
        let (g_weight, g_bias) = (Calc::mm(g_out, x, true, false), ("sum", Calc::Sum(g_out)));
        let Some(cast) = cast else {
            self.grad_mm(head, g_weight, shape);
            self.grad(g_bias, head + 1, vec![classes]);
            self.free_all(&[g_logits, flat]);
            return g;
        };
        let weight = self.matmul(("mm", g_weight), shape);
        let bias = self.alloc(g_bias, vec![classes]);
        self.free_all(&[g_logits, flat, cast]);
        self.uncast_grads(head, weight, bias);
        g
    }

    /// Block `b`'s backward from its pooled output's gradient `g`; returns
    /// its input's gradient (none for the images).
    fn block_backward(&mut self, s: Saved, g: H, b: u32) -> Option<H> {
        let (c_in, c, side) = self.sizes(b);
        let ckpt = self.options.checkpointing;
        let unpool = Calc::MaxPoolBackward {
            grad: Arg::T(g),
            indices: Arg::T(s.indices),
        };
        let op = ("max_pool2d_with_indices_backward", unpool);
        let g_relu = self.alloc(op, self.maps(c, side));
        self.node_done(&[s.indices], g, ckpt);
        let threshold = Calc::ReluBackward {
            grad: Arg::T(g_relu),
            out: Arg::T(s.relu),
        };
        let g_norm = self.alloc(("threshold_backward", threshold), self.maps(c, side));
        self.node_done(&[s.relu], g_relu, ckpt);
        let op = "native_batch_norm_backward";
        let (conv, norm) = (4 * b as usize, 4 * b as usize + 2);
        let calc = Calc::BatchNormBackward {
            grad: Arg::T(g_norm),
            x: Arg::T(s.conv),
            weight: Arg::Param(norm),
            mean: Arg::T(s.mean),
            invstd: Arg::T(s.invstd),
        };
        let g_conv = self.alloc((op, calc), self.maps(c, side));
        self.grad((op, part(g_conv, 1)), norm, vec![c]);
        self.grad((op, part(g_conv, 2)), norm + 1, vec![c]);
        let saved = match ckpt {
            true => [s.mean, s.invstd, s.conv],
            false => [s.conv, s.mean, s.invstd],
        };
        self.node_done(&saved, g_norm, ckpt);
        let op = "convolution_backward";
        let calc = Calc::ConvBackward {
            grad: Arg::T(g_conv),
            x: s.input.map_or(Arg::Batch(Batch::Inputs), Arg::T),
            weight: param_or_cast(conv, s.weight),
            input_grad: s.input_grad,
        };
        let g_x = s
            .input_grad
            .then(|| self.alloc((op, calc), self.maps(c_in, side)));
        if g_x.is_some() {
            self.conv_workspace();
        }
        let (first, k) = match g_x {
            Some(g_x) => ((op, part(g_x, 1)), 2),
            None => ((op, calc), 1),
        };
        let weight = self.weight_grad(first, conv, vec![c, c_in, 3, 3]);
        self.conv_workspace();
        let bias = (op, part(g_x.unwrap_or(weight), k));
        let bias = self.weight_grad(bias, conv + 1, vec![c]);
        let (input, cast) = (s.input.into_iter(), s.weight.into_iter());
        if ckpt {
            // The recomputed tensors die with the node, the gradient next,
            // then the input the checkpoint held.
            let (held, recomputed): (Vec<H>, Vec<H>) = input.partition(|_| s.input_grad);
            self.free_all(&cast.chain(recomputed).collect::<Vec<_>>());
            self.free(g_conv);
            self.free_all(&held);
        } else {
            self.free(g_conv);
            self.free_all(&input.chain(cast).collect::<Vec<_>>());
        }
        if b == 0 && (ckpt || self.options.amp.is_none()) {
            // The images: the first convolution saved them (under autocast
            // it saved their cast), or the checkpoint held them.
            self.release(Batch::Inputs);
        }
        self.uncast_grads(conv, weight, bias);
        g_x
    }
}
