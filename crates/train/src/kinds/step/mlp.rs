//! The MLP's training step as PyTorch runs it: an `nn.Sequential` of
//! `Linear` (`addmm`: saves its input for the weight's gradient and, when
//! its input needs a gradient, its weight or the weight's autocast cast)
//! and `ReLU` (saves its output; the pre-activation dies), then the loss.
//!
//! Under checkpointing the model runs as `checkpoint_sequential(model,
//! segments, x, use_reentrant=False)` with about the square root of its
//! hidden layers as segments: its modules split into runs of `len //
//! segments`, each run but the last under `checkpoint` (it holds its input
//! and saves nothing; backward recomputes it from that input, up to the
//! last tensor its nodes need), the last run plainly, its input held by
//! the function's own variable until the run returns. A run may end
//! between a `Linear` and its `ReLU`. Tensors two nodes save (a ReLU's
//! output is the next Linear's input) die when the second lets go.

use super::{param_or_cast, Arg, Batch, Calc, Keep, Op, Options, Program, Region, Tape, H};
use crate::kinds::MlpShape;
use std::ops::Range;

/// What a module's forward saved for its backward.
#[derive(Clone, Copy, Debug)]
enum Saved {
    Linear {
        /// Its input (`None`: the batch, which the loop holds).
        input: Option<H>,
        /// Under autocast, the weight's cast it saved (when its input
        /// needs a gradient).
        cast: Option<H>,
    },
    Relu {
        out: H,
    },
}

/// A run of modules: checkpointed or plain, its input, and (plain) what
/// each module saved.
struct Run {
    modules: Range<usize>,
    checkpointed: bool,
    input: Option<H>,
    saved: Vec<Saved>,
}

/// The step's forward and backward passes at `batch` samples.
pub fn program(m: &MlpShape, batch: u64, options: Options) -> Program {
    let mut tape = Tape::new(*m, "", batch, options);
    tape.dtype = m.dtype;
    let runs = tape.forward();
    let loss = tape.cross_entropy(tape.last_out(), &[batch, m.classes]);
    tape.program.ops.push(Op::ForwardEnd);
    let (seed, mut g) = tape.cross_entropy_backward(loss, &[batch, m.classes]);
    for run in runs.into_iter().rev() {
        g = tape.run_backward(run, g);
    }
    tape.free(seed);
    tape.program
}

/// The forward pass alone under `torch.no_grad()`: each input dies after
/// its module, nothing is saved.
pub fn no_grad_program(m: &MlpShape, batch: u64, options: Options) -> Program {
    let mut tape = Tape::no_grad(*m, "", batch, options);
    tape.dtype = m.dtype;
    tape.forward();
    tape.cross_entropy(tape.last_out(), &[batch, m.classes]);
    tape.program.ops.push(Op::ForwardEnd);
    tape.program
}

/// Segments `checkpoint_sequential` is given: about the square root of
/// the hidden layers.
pub fn checkpoint_segments(layers: u32) -> u32 {
    (layers as f64).sqrt().ceil().max(1.0) as u32
}

impl Tape<MlpShape> {
    /// Modules of the Sequential: a Linear and a ReLU per hidden layer,
    /// then the output Linear.
    fn modules(&self) -> usize {
        2 * self.shape.layers as usize + 1
    }

    /// `checkpoint_sequential`'s runs: `(modules, checkpointed)`.
    fn runs(&self) -> Vec<(Range<usize>, bool)> {
        let n = self.modules();
        if !self.options.checkpointing {
            return vec![(0..n, false)];
        }
        let segments = checkpoint_segments(self.shape.layers) as usize;
        let size = n / segments;
        let mut runs: Vec<_> = (0..segments - 1)
            .map(|s| (s * size..(s + 1) * size, true))
            .collect();
        runs.push(((segments - 1) * size..n, false));
        runs
    }

    /// Widths: the input, each hidden layer, the classes.
    fn width(&self, layer: usize) -> u64 {
        match layer {
            0 => self.shape.input_dim,
            l if l > self.shape.layers as usize => self.shape.classes,
            _ => self.shape.width,
        }
    }

    fn rows(&self, width: u64) -> Vec<u64> {
        vec![self.batch, width]
    }

    /// The logits: the last allocation of the forward pass.
    fn last_out(&self) -> H {
        self.program.allocs.len() - 1
    }

    /// One more reference on `h` (a node saved it, or a checkpoint or a
    /// variable holds it).
    fn hold(&mut self, h: H) {
        if self.holds.len() <= h {
            self.holds.resize(h + 1, 0);
        }
        self.holds[h] += 1;
    }

    /// A reference on `h` goes; it dies with its last.
    fn let_go(&mut self, h: H) {
        self.holds[h] -= 1;
        self.drop_if_unheld(h);
    }

    /// `h` was used by its last op: it dies unless something holds it.
    fn drop_if_unheld(&mut self, h: H) {
        if self.holds.get(h).copied().unwrap_or(0) == 0 {
            self.free(h);
        }
    }

    /// Every run in order; returns them with what their modules saved.
    fn forward(&mut self) -> Vec<Run> {
        let mut x = None;
        let mut runs = Vec::new();
        let all = self.runs();
        let ckpt = all.len() > 1;
        for (modules, checkpointed) in all {
            // A checkpoint holds its input; the plain last run's input is
            // `checkpoint_sequential`'s variable until the run returns.
            x.inspect(|&h| self.hold(h));
            let keep = match (checkpointed, self.grad) {
                (false, true) => Keep::All,
                _ => Keep::Nothing,
            };
            let marked = checkpointed && self.grad;
            if marked {
                self.begin(Region::Checkpoint);
            }
            let (out, saved) = self.run(modules.clone(), x, keep);
            if marked {
                self.end(Region::Checkpoint);
            }
            if ckpt && !checkpointed {
                x.inspect(|&h| self.let_go(h));
            }
            runs.push(Run {
                modules,
                checkpointed,
                input: x,
                saved,
            });
            x = out;
        }
        self.layer = None;
        runs
    }

    /// Modules `modules` on `x`: the output (none when a recomputation
    /// stopped early) and what each saved.
    fn run(
        &mut self,
        modules: Range<usize>,
        mut x: Option<H>,
        keep: Keep,
    ) -> (Option<H>, Vec<Saved>) {
        let last = modules.end - 1;
        let mut saved = Vec::new();
        for i in modules {
            self.layer = Some(i as u32);
            let stop = keep == Keep::Recompute && i == last;
            let (out, s) = match i % 2 {
                0 => self.linear(i / 2, x, keep, stop),
                _ => self.relu(i / 2, x.expect("a ReLU follows a Linear"), keep, stop),
            };
            saved.extend(s);
            x = out;
        }
        (x, saved)
    }

    /// `Linear` `l` on `x` (`None`: the batch). `stop`: a recomputation
    /// ends here (its input and weight cast are what backward needs, so
    /// the product is not run).
    fn linear(
        &mut self,
        l: usize,
        x: Option<H>,
        keep: Keep,
        stop: bool,
    ) -> (Option<H>, Option<Saved>) {
        let (w, b) = (2 * l, 2 * l + 1);
        let (inp, out) = (self.width(l), self.width(l + 1));
        let save = keep != Keep::Nothing;
        let bias = self.cast_param(b, vec![out]);
        let cast = self.cast_param(w, vec![out, inp]);
        let input_grad = x.is_some();
        let input = match (x, self.options.amp) {
            (None, Some(amp)) if amp != self.dtype => {
                let copy = ("_to_copy", Calc::Copy(Arg::Batch(Batch::Inputs)));
                Some(self.alloc_as(copy, self.rows(inp), amp, self.role))
            }
            _ => x,
        };
        let saved_cast = cast.filter(|_| save && input_grad);
        if save {
            input.inspect(|&h| self.hold(h));
            saved_cast.inspect(|&c| self.save_cast(c));
        }
        let saved = save.then_some(Saved::Linear {
            input,
            cast: saved_cast,
        });
        if stop {
            self.clear_cache();
            return (None, saved);
        }
        let calc = Calc::Linear {
            x: input.map_or(Arg::Batch(Batch::Inputs), Arg::T),
            weight: param_or_cast(w, cast),
            bias: param_or_cast(b, bias),
        };
        let z = self.matmul(("addmm", calc), self.rows(out));
        input.inspect(|&h| self.drop_if_unheld(h));
        (Some(z), saved)
    }

    /// `ReLU` `l` on `z`; its output, saved when recording.
    fn relu(&mut self, l: usize, z: H, keep: Keep, stop: bool) -> (Option<H>, Option<Saved>) {
        let out = self.alloc(
            ("relu", Calc::Relu(Arg::T(z))),
            self.rows(self.width(l + 1)),
        );
        let save = keep != Keep::Nothing;
        if save {
            self.hold(out);
        }
        if stop {
            // Recomputation stops at the last saved tensor: its autocast
            // region exits as the stop unwinds, then its locals die.
            self.clear_cache();
        }
        self.drop_if_unheld(z);
        (Some(out), save.then_some(Saved::Relu { out }))
    }

    /// A run's backward from its output's gradient `g`; a checkpointed
    /// run is recomputed first. Returns its input's gradient (the last
    /// run's, the batch's, is none: the seed's handle is returned).
    fn run_backward(&mut self, run: Run, mut g: H) -> H {
        let saved = match run.checkpointed {
            true => {
                self.begin(Region::Recompute);
                let (_, saved) = self.run(run.modules.clone(), run.input, Keep::Recompute);
                self.end(Region::Recompute);
                saved
            }
            false => run.saved,
        };
        let ckpt = run.checkpointed;
        for (i, s) in run.modules.clone().zip(saved).rev() {
            self.layer = Some(i as u32);
            // The checkpoint lets go of its input after its first node.
            let held = run.input.filter(|_| ckpt && i == run.modules.start);
            g = match s {
                Saved::Relu { out } => {
                    let g = self.relu_backward(i / 2, g, out, ckpt);
                    held.inspect(|&h| self.let_go(h));
                    g
                }
                Saved::Linear { input, cast } => {
                    self.linear_backward(i / 2, g, (input, cast), ckpt, held)
                }
            };
        }
        self.layer = None;
        g
    }

    /// `threshold_backward`: the pre-activation's gradient.
    fn relu_backward(&mut self, l: usize, g: H, out: H, ckpt: bool) -> H {
        let calc = Calc::ReluBackward {
            grad: Arg::T(g),
            out: Arg::T(out),
        };
        let g_in = self.alloc(("threshold_backward", calc), self.rows(self.width(l + 1)));
        if ckpt {
            self.let_go(out);
            self.free(g);
        } else {
            self.free(g);
            self.let_go(out);
        }
        g_in
    }

    /// `AddmmBackward0`: the input's gradient (not the batch's), the
    /// weight's, then the bias's (`sum_to`, after the node returns). A
    /// checkpointed node's unpacked tensors die as it returns, before that
    /// sum; a plain node lets go of its saved tensors after its incoming
    /// gradient. `held`: the checkpoint's input, let go of last. Returns
    /// the input's gradient, or `g`'s handle (freed) for the first layer.
    fn linear_backward(
        &mut self,
        l: usize,
        g: H,
        (input, cast): (Option<H>, Option<H>),
        ckpt: bool,
        held: Option<H>,
    ) -> H {
        let (w, b) = (2 * l, 2 * l + 1);
        let (inp, out) = (self.width(l), self.width(l + 1));
        let g_out = Arg::T(g);
        let x = input.map_or(Arg::Batch(Batch::Inputs), Arg::T);
        let input_grad = l > 0;
        let g_in = input_grad.then(|| {
            let calc = Calc::mm(g_out, param_or_cast(w, cast), false, false);
            self.matmul(("mm", calc), self.rows(inp))
        });
        let weight = self.weight_grad_mm(w, Calc::mm(g_out, x, true, false), vec![out, inp]);
        let unpacked: Vec<H> = input.into_iter().chain(cast).collect();
        if ckpt {
            unpacked.iter().for_each(|&h| self.let_go_saved(h));
        }
        let bias = self.weight_grad(("sum", Calc::Sum(g_out)), b, vec![out]);
        self.free(g);
        if !ckpt {
            unpacked.iter().for_each(|&h| self.let_go_saved(h));
        }
        if let Some(h) = held {
            self.let_go(h);
        }
        if l == 0 && (ckpt || input.is_none()) {
            // The batch: addmm saved it, or the checkpoint held it.
            self.program.ops.push(Op::Release(Batch::Inputs));
        }
        self.uncast_grads(w, weight, bias);
        g_in.unwrap_or(g)
    }

    /// A saved tensor's node lets go: a weight's cast (autocast's, saved
    /// by this node alone) dies; an input dies with its last holder.
    fn let_go_saved(&mut self, h: H) {
        match self.holds.get(h) {
            Some(&n) if n > 0 => self.let_go(h),
            _ => self.free(h),
        }
    }
}
