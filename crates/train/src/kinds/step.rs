//! A transformer's training step as PyTorch runs it, op by op: every tensor
//! an aten op creates (its shape and type) and the moment each one is freed,
//! from the embeddings through the loss and backward, in float32, the batch
//! already on the device. What each op saves follows autograd's derivatives
//! (`tools/autograd/derivatives.yaml`): LayerNorm saves its input, mean and
//! rstd; GELU its input; softmax its output; `masked_fill` its mask; each
//! `addmm` its input; `at::matmul` copies non-contiguous heads before `bmm`;
//! fused attention saves q, k, v, its output and the log-sum-exp, and no
//! S x S matrix. Under activation checkpointing (`checkpoint(block, x,
//! use_reentrant=False)`) a block's forward saves only its input, and its
//! backward first recomputes the block up to the last tensor backward needs.
//!
//! The step is a [`Program`]: allocations with their roles (an activation,
//! a gradient of an activation, a parameter's `.grad`, the loss), frees
//! naming the allocation they free, and the cuBLAS calls that may allocate a
//! workspace. With LoRA (`lora`) the frozen layers make no gradients: the
//! first block's input needs none, so what it saves shrinks too. The engine
//! plays it on a process; `optim_step` writes `opt.step()` as a
//! program of its own. `tests/reference/step_trace.py` records the same step from
//! PyTorch's own ops; the tests hold this to it event by event.

use super::{blocks, NamedTensor, TransformerShape};
use crate::cublas::{BlasThread, Gemm};
use crate::optim::{OptimizerKind, OptimizerSpec};
pub use crate::program::{Alloc, Arg, Batch, Calc, Op, Program, Region, Role, TraceEvent};
pub use options::{Attention, Options};
use vramlab_core::types::Dtype;

/// The forward pass alone under `torch.no_grad()`: nothing is saved, each
/// tensor dies after its last use (a block's input when the next block
/// returns), and `checkpoint` runs its block plainly.
pub fn no_grad_program(t: &TransformerShape, batch: u64, options: Options) -> Program {
    let mut tape = Tape::no_grad(*t, "h", batch, options);
    tape.forward();
    tape.program.ops.push(Op::ForwardEnd);
    tape.program
}

/// The step's forward and backward passes.
pub fn program(t: &TransformerShape, batch: u64, options: Options) -> Program {
    let mut tape = Tape::new(*t, "h", batch, options);
    let top = tape.forward();
    tape.program.ops.push(Op::ForwardEnd);
    tape.backward(top);
    tape.program
}

/// The most bytes a trace has live at once, over what lived before it.
pub fn peak(events: &[TraceEvent]) -> u64 {
    let mut live = 0i64;
    let mut peak = 0i64;
    for e in events {
        live += e.bytes;
        peak = peak.max(live);
    }
    peak as u64
}

/// A later `opt.step()` of Adam (foreach: `exp_avg_sq.sqrt()` for every
/// parameter at once, freed last first) and `zero_grad(set_to_none=True)`
/// (every gradient, in order) as a trace, for comparing whole steps with
/// PyTorch's.
pub fn optimizer_events(parameters: &[NamedTensor]) -> Vec<TraceEvent> {
    let params: Vec<optim_step::Param> = (parameters.iter().enumerate())
        .map(|(index, p)| optim_step::Param {
            index,
            shape: &p.shape,
            dtype: p.dtype,
        })
        .collect();
    let adam = OptimizerSpec::torch(OptimizerKind::Adam);
    let mut events = optim_step::program(adam, &params, false).events();
    events.extend(parameters.iter().map(|p| TraceEvent {
        op: "free",
        bytes: -(blocks(p.numel() * p.dtype.size_bytes()) as i64),
    }));
    events
}

/// A handle on an allocation of the program being written.
type H = usize;

/// What a block's forward keeps for backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Keep {
    /// Everything autograd saves.
    All,
    /// Nothing (a checkpointed block's first forward): each tensor dies
    /// when its last user is done; the checkpoint holds the block's input.
    Nothing,
    /// Backward's recomputation of a checkpointed block, in its own
    /// autocast region: all it saves, up to the last tensor backward needs
    /// (non-reentrant checkpointing stops recomputing there: the
    /// transformer's GELU output, or with LoRA the MLP projection's
    /// `lora_B` weight cast; the CNN's pooling indices).
    Recompute,
}

/// A step being written: the model's shape and the program so far.
struct Tape<S> {
    program: Program,
    shape: S,
    options: Options,
    batch: u64,
    /// The block being written, for the labels.
    layer: Option<u32>,
    /// The role of what the pass being written allocates.
    role: Role,
    /// The thread its matrix products run on.
    thread: BlasThread,
    /// The block being written's input requires a gradient (with LoRA the
    /// first block's does not: the embeddings are frozen).
    input_grad: bool,
    /// The autocast cache.
    cache: Vec<autocast::Cached>,
    /// Autograd records (off under `torch.no_grad()`: nothing is saved).
    grad: bool,
    /// The parameters' type (`model.half()`: float16): what products
    /// compute in outside autocast, and every `.grad`'s.
    dtype: Dtype,
    /// How many nodes, checkpoints or variables hold each allocation
    /// (where several may: the MLP's).
    holds: Vec<u32>,
}

impl<S> Tape<S> {
    fn new(shape: S, scope: &'static str, batch: u64, options: Options) -> Self {
        let ops = match options.amp {
            Some(_) => vec![Op::Begin(Region::Autocast)],
            None => Vec::new(),
        };
        Self {
            program: Program {
                scope,
                ops,
                ..Program::default()
            },
            shape,
            options,
            batch,
            layer: None,
            role: Role::Forward,
            thread: BlasThread::Main,
            input_grad: true,
            cache: Vec::new(),
            grad: true,
            dtype: Dtype::Float32,
            holds: Vec::new(),
        }
    }

    /// A forward pass under `torch.no_grad()`: autograd records nothing,
    /// and `checkpoint` runs its block plainly.
    fn no_grad(shape: S, scope: &'static str, batch: u64, options: Options) -> Self {
        let options = Options {
            checkpointing: false,
            ..options
        };
        Self {
            grad: false,
            ..Self::new(shape, scope, batch, options)
        }
    }

    fn alloc_as(
        &mut self,
        (op, calc): (&'static str, Calc),
        shape: Vec<u64>,
        dtype: Dtype,
        role: Role,
    ) -> H {
        let p = &mut self.program;
        p.allocs.push(Alloc {
            op,
            calc,
            shape: shape.into(),
            dtype,
            role,
            holds: role.holds(),
            layer: self.layer,
            temporary_until: None,
        });
        p.ops.push(Op::Alloc(p.allocs.len() - 1));
        p.allocs.len() - 1
    }

    /// `temps` are temporaries of the expression whose result is `result`.
    fn temporaries_until(&mut self, temps: &[H], result: H) {
        for &t in temps {
            self.program.allocs[t].temporary_until = Some(result);
        }
    }

    /// A tensor in the type matrix products compute in.
    fn alloc(&mut self, op: (&'static str, Calc), shape: Vec<u64>) -> H {
        self.alloc_as(op, shape, self.low(), self.role)
    }

    /// A float32 tensor (a norm's, a residual's, an embedding's).
    fn alloc_f32(&mut self, op: (&'static str, Calc), shape: Vec<u64>) -> H {
        self.alloc_as(op, shape, Dtype::Float32, self.role)
    }

    /// A matrix product's output, then its cuBLAS call.
    fn matmul(&mut self, op: (&'static str, Calc), shape: Vec<u64>) -> H {
        let h = self.alloc(op, shape);
        self.blas();
        h
    }

    /// A parameter's gradient from a matrix product.
    fn grad_mm(&mut self, param: usize, calc: Calc, shape: Vec<u64>) -> H {
        let h = self.alloc_as(("mm", calc), shape, self.dtype, Role::Grad(param));
        self.blas();
        h
    }

    fn grad(&mut self, op: (&'static str, Calc), param: usize, shape: Vec<u64>) -> H {
        self.alloc_as(op, shape, self.dtype, Role::Grad(param))
    }

    /// The cuBLAS call of the product just allocated: cuBLASLt's
    /// `gemm_and_bias` for `addmm` with its bias, cuBLAS for the rest.
    fn blas(&mut self) {
        let last = self.program.allocs.last().map(|a| a.calc);
        let gemm = match last {
            Some(Calc::Linear { .. }) => Gemm::Lt,
            _ => Gemm::Cublas,
        };
        self.program.ops.push(Op::Blas(self.thread, gemm));
    }

    fn free(&mut self, h: H) {
        self.program.ops.push(Op::Free(h));
    }

    /// A region begins; a recomputation runs as forward, in its own
    /// autocast region.
    fn begin(&mut self, region: Region) {
        self.program.ops.push(Op::Begin(region));
        if region == Region::Recompute {
            self.role = Role::Forward;
            if self.options.amp.is_some() {
                self.program.ops.push(Op::Begin(Region::Autocast));
            }
        }
    }

    /// A region ends (a recomputation's autocast region ended with its
    /// cache).
    fn end(&mut self, region: Region) {
        self.program.ops.push(Op::End(region));
        if region == Region::Recompute {
            self.role = Role::Backward;
        }
    }

    fn release(&mut self, part: Batch) {
        self.program.ops.push(Op::Release(part));
    }

    fn free_all(&mut self, hs: &[H]) {
        hs.iter().for_each(|&h| self.free(h));
    }

    /// Frees a node's saved tensors and its incoming gradient: autograd
    /// drops the gradient first, then releases the node; a checkpointed
    /// block's unpacked tensors die with the backward function, first.
    fn node_done(&mut self, saved: &[H], incoming: H, ckpt: bool) {
        if ckpt {
            self.free_all(saved);
            self.free(incoming);
        } else {
            self.free(incoming);
            self.free_all(saved);
        }
    }
}

/// What the loss's backward needs.
struct Loss {
    /// Under gradient accumulation, `div`'s backward scales the seed.
    divided: Option<f32>,
    log_probs: H,
    /// NLL's float32 input: `log_probs`, or its float32 copy.
    nll_input: H,
    total_weight: H,
}

impl<S> Tape<S> {
    /// `loss = F.cross_entropy(logits, y)` (`log_softmax` in the logits'
    /// type, then NLL's loss and total weight in float32, on a float32
    /// copy under autocast), which drops the loop's previous loss; then
    /// `del logits`, and the autocast region exits.
    fn cross_entropy(&mut self, logits: H, shape: &[u64]) -> Loss {
        let f32 = self.loss_dtype();
        let dtype = self.dtype_of(logits);
        let op = ("_log_softmax", Calc::LogSoftmax(Arg::T(logits)));
        let log_probs = self.alloc_as(op, shape.to_vec(), dtype, Role::Forward);
        let nll_input = self.cast_to(log_probs, f32);
        let nll = Calc::Nll {
            log_probs: Arg::T(nll_input),
            targets: Arg::Batch(Batch::Targets),
        };
        let divided = self.options.divided();
        let role = match divided {
            Some(_) => Role::Forward,
            None => Role::Loss,
        };
        let loss = self.alloc_as(("nll_loss_forward", nll), vec![], f32, role);
        let weight = ("nll_loss_forward", part(loss, 1));
        let total_weight = self.alloc_as(weight, vec![], f32, Role::Forward);
        if let Some(by) = divided {
            // `/ accumulate` makes the loss; the criterion's dies with the
            // expression.
            let div = ("div", Calc::Scale(Arg::T(loss), by));
            self.alloc_as(div, vec![], f32, Role::Loss);
            self.free(loss);
        }
        self.program.ops.push(Op::Rebind);
        if !self.grad {
            // Nothing saved them.
            self.free(total_weight);
            if nll_input != log_probs {
                self.free(nll_input);
            }
            self.free(log_probs);
        }
        self.free(logits);
        self.clear_cache();
        Loss {
            divided,
            log_probs,
            nll_input,
            total_weight,
        }
    }

    /// Backward starts: the `ones_like` seed (which `torch.autograd.backward`
    /// keeps to the end), NLL's and log-softmax's backward. Returns the
    /// seed and the logits' gradient.
    fn cross_entropy_backward(&mut self, loss: Loss, shape: &[u64]) -> (H, H) {
        (self.role, self.thread) = (Role::Backward, BlasThread::Autograd);
        let f32 = self.loss_dtype();
        let seed = self.alloc_as(("ones_like", Calc::Ones), vec![], f32, Role::Backward);
        let incoming = loss.divided.map(|by| {
            let div = ("div", Calc::Scale(Arg::T(seed), by));
            self.alloc_as(div, vec![], f32, Role::Backward)
        });
        let nll = Calc::NllBackward {
            grad: Arg::T(incoming.unwrap_or(seed)),
            targets: Arg::Batch(Batch::Targets),
            total_weight: Arg::T(loss.total_weight),
        };
        let g = self.alloc_as(
            ("nll_loss_backward", nll),
            shape.to_vec(),
            f32,
            Role::Backward,
        );
        incoming.inspect(|&g| self.free(g));
        if loss.nll_input != loss.log_probs {
            self.free(loss.nll_input);
        }
        self.free(loss.total_weight);
        self.release(Batch::Targets);
        let dtype = self.dtype_of(loss.log_probs);
        let g = if dtype == f32 {
            g
        } else {
            self.uncast(g, dtype, Role::Backward)
        };
        let calc = Calc::LogSoftmaxBackward {
            grad: Arg::T(g),
            out: Arg::T(loss.log_probs),
        };
        let op = ("_log_softmax_backward_data", calc);
        let g_logits = self.alloc_as(op, shape.to_vec(), dtype, Role::Backward);
        self.free_all(&[g, loss.log_probs]);
        (seed, g_logits)
    }
}

impl<S> Tape<S> {
    /// The loss's type: autocast computes it in float32; outside autocast
    /// it has the logits' type, the model's.
    fn loss_dtype(&self) -> Dtype {
        match self.options.amp {
            Some(_) => Dtype::Float32,
            None => self.dtype,
        }
    }
}

/// Output `k` of the op that made `of`.
fn part(of: H, k: usize) -> Calc {
    Calc::Part { of, k }
}

/// A parameter as an op reads it: its autocast cast, or itself.
fn param_or_cast(param: usize, cast: Option<H>) -> Arg {
    cast.map_or(Arg::Param(param), Arg::T)
}

impl Tape<TransformerShape> {
    /// B x S x `n`: a hidden state `n` wide.
    fn tokens(&self, n: u64) -> Vec<u64> {
        vec![self.batch, self.shape.seq_len, n]
    }

    fn act(&self) -> Vec<u64> {
        self.tokens(self.shape.width)
    }

    /// With LoRA every parameter but the adapters is frozen.
    fn frozen(&self) -> bool {
        self.shape.lora_rank > 0
    }
}

/// Every attention, checkpointing or not, with each of `amps` (for tests).
#[cfg(test)]
pub(crate) fn every_option<T>(amps: &[T]) -> Vec<(Attention, bool, &T)> {
    let mut all = Vec::new();
    for attention in [Attention::Eager, Attention::Sdpa] {
        for checkpointing in [false, true] {
            all.extend(amps.iter().map(|a| (attention, checkpointing, a)));
        }
    }
    all
}

mod attention;
mod autocast;
mod block;
mod cnn;
mod fused;
mod lora;
mod mlp;
pub mod optim_step;
mod options;
mod passes;
pub mod sdp;

pub use cnn::{no_grad_program as cnn_no_grad_program, program as cnn_program};
pub use mlp::{
    checkpoint_segments, no_grad_program as mlp_no_grad_program, program as mlp_program,
};

#[cfg(test)]
mod tests;
