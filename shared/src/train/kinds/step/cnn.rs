//! The CNN's training step as PyTorch runs it: per block `convolution`
//! (saves its input and weight), `native_batch_norm` (saves its input, the
//! batch's mean and inverse deviation; the running statistics change in
//! place), `relu` (saves its output; the norm's output dies), and
//! `max_pool2d_with_indices` (saves its input and int64 indices); then the
//! flattened head's `addmm` and the loss. The first convolution computes no
//! gradient for the images. cuDNN's convolution workspace is not modelled:
//! its size is the algorithm cuDNN picks on the GPU at run time.

use super::{Options, Program, Tape, H};
use crate::train::kinds::CnnShape;
use crate::types::Dtype;

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

/// The step's forward and backward passes at `batch` images, under
/// autocast to `amp` if given (see `autocast`).
pub fn program(c: &CnnShape, batch: u64, amp: Option<Dtype>) -> Program {
    let options = Options {
        attention: Default::default(),
        checkpointing: false,
        amp,
    };
    let mut tape = Tape::new(*c, "block", batch, options);
    let mut x = None;
    let mut saved = Vec::new();
    for b in 0..c.blocks {
        tape.layer = Some(b);
        let (pooled, s) = tape.block(x, b);
        saved.push(s);
        x = Some(pooled);
    }
    tape.layer = None;
    let flat = x.expect("at least one block");
    let weight = tape.head_forward();
    let logits = tape.matmul("addmm", vec![batch, c.classes]);
    let loss = tape.cross_entropy(logits, &[batch, c.classes]);
    let shape = [batch, c.classes];
    let (seed, g_logits) = tape.cross_entropy_backward(loss, &shape);
    let mut g = tape.head_backward(flat, g_logits, weight);
    for (b, s) in (0..c.blocks).zip(saved).rev() {
        tape.layer = Some(b);
        match tape.block_backward(s, g, b) {
            Some(next) => g = next,
            None => break,
        }
    }
    tape.layer = None;
    tape.free(seed);
    tape.program
}

impl Tape<CnnShape> {
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

    /// Under autocast, the head's casts of its bias and weight (saved).
    fn head_forward(&mut self) -> Option<H> {
        let (head, classes) = (self.head(), self.shape.classes);
        self.cast_param(head + 1, vec![classes]);
        let w = self.cast_param(head, vec![classes, self.features()]);
        w.inspect(|&w| self.save_cast(w))
    }

    /// Block `b` on `x` (`None`: the images): returns the pooled output.
    /// Under autocast the convolution runs on casts of its bias, weight and
    /// (the images) input.
    fn block(&mut self, x: Option<H>, b: u32) -> (H, Saved) {
        let (c_in, c, side) = self.sizes(b);
        self.cast_param(4 * b as usize + 1, vec![c]);
        let weight = self.cast_param(4 * b as usize, vec![c, c_in, 3, 3]);
        weight.inspect(|&w| self.save_cast(w));
        let images = self.shape.image_size;
        let input = x.or_else(|| {
            let amp = self.options.amp?;
            Some(self.alloc_as("_to_copy", self.maps(c_in, images), amp, self.role))
        });
        let conv = self.alloc("convolution", self.maps(c, side));
        let norm = self.alloc("native_batch_norm", self.maps(c, side));
        let op = "native_batch_norm";
        let mean = self.alloc_as(op, vec![c], Dtype::Float32, self.role);
        let invstd = self.alloc_as(op, vec![c], Dtype::Float32, self.role);
        let relu = self.alloc("relu", self.maps(c, side));
        self.free(norm);
        let pooled = self.alloc("max_pool2d_with_indices", self.maps(c, side / 2));
        let op = "max_pool2d_with_indices";
        let indices = self.alloc_as(op, self.maps(c, side / 2), Dtype::Int64, self.role);
        let saved = Saved {
            input,
            input_grad: x.is_some(),
            weight,
            conv,
            mean,
            invstd,
            relu,
            indices,
        };
        (pooled, saved)
    }

    /// The head's backward: the flattened input's gradient, the weight's
    /// and the bias's; the logits' gradient and the saved input (and
    /// weight's cast) go, then the casts' `ToCopyBackward`.
    fn head_backward(&mut self, flat: H, g_logits: H, cast: Option<H>) -> H {
        let (_, c, side) = self.sizes(self.shape.blocks - 1);
        let (head, classes) = (self.head(), self.shape.classes);
        let g = self.matmul("mm", self.maps(c, side / 2));
        let shape = vec![classes, self.features()];
        let Some(cast) = cast else {
            self.grad_mm(head, shape);
            self.grad("sum", head + 1, vec![classes]);
            self.free_all(&[g_logits, flat]);
            return g;
        };
        let weight = self.matmul("mm", shape);
        let bias = self.alloc("sum", vec![classes]);
        self.free_all(&[g_logits, flat, cast]);
        self.uncast_grads(head, weight, bias);
        g
    }

    /// Block `b`'s backward from its pooled output's gradient `g`; returns
    /// its input's gradient (none for the images).
    fn block_backward(&mut self, s: Saved, g: H, b: u32) -> Option<H> {
        let (c_in, c, side) = self.sizes(b);
        let g_relu = self.alloc("max_pool2d_with_indices_backward", self.maps(c, side));
        self.free_all(&[g, s.indices]);
        let g_norm = self.alloc("threshold_backward", self.maps(c, side));
        self.free_all(&[g_relu, s.relu]);
        let op = "native_batch_norm_backward";
        let g_conv = self.alloc(op, self.maps(c, side));
        let (conv, norm) = (4 * b as usize, 4 * b as usize + 2);
        self.grad(op, norm, vec![c]);
        self.grad(op, norm + 1, vec![c]);
        self.free_all(&[g_norm, s.conv, s.mean, s.invstd]);
        let op = "convolution_backward";
        let g_x = s.input_grad.then(|| self.alloc(op, self.maps(c_in, side)));
        let Some(cast) = s.weight else {
            self.grad(op, conv, vec![c, c_in, 3, 3]);
            self.grad(op, conv + 1, vec![c]);
            self.free(g_conv);
            self.free_all(&s.input.into_iter().collect::<Vec<_>>());
            return g_x;
        };
        let weight = self.alloc(op, vec![c, c_in, 3, 3]);
        let bias = self.alloc(op, vec![c]);
        self.free(g_conv);
        self.free_all(&s.input.into_iter().chain([cast]).collect::<Vec<_>>());
        self.uncast_grads(conv, weight, bias);
        g_x
    }
}
