//! The one step program: a [`Program`] is the allocations an op sequence
//! makes ([`Alloc`]: the aten op, what it computes from which operands,
//! shape, type, role, what it holds) and the ops that play them ([`Op`]:
//! each allocation, each free, each BLAS call's workspace, the loss's
//! rebinding, the batch let go of, the forward pass's end, autocast and
//! checkpoint regions, a forward's start and return, a step's phases).
//!
//! Every model writes one: the MLP's, the CNN's and the GPT's builders
//! (`kinds::step`) with the arithmetic of each op ([`Calc`]), so the CPU
//! interpreter (`train::cpu`) and a device's (`engine::on_device`) can
//! compute it; each Hugging Face family's `generate` and training step
//! (`vramlab_hf`) for memory alone ([`Calc::Opaque`]), through a [`Sink`]
//! that may collect them ([`Program`]) or play them at once on an
//! allocator so that a long run is never held. The memory interpreters
//! (`engine::program`, `engine::hf_training`, the planner's player) and the
//! estimate's walk (`kinds::estimate`) read the same type.

pub mod calc;

pub use calc::{Arg, Calc};

use crate::cublas::{BlasThread, Gemm};
use smallvec::SmallVec;
use vramlab_core::types::Dtype;

/// A tensor's bytes in the caching allocator's 512-byte blocks.
pub fn blocks(bytes: u64) -> u64 {
    bytes.div_ceil(512) * 512
}

/// A tensor's shape, its dimensions held inline up to four.
pub type Shape = SmallVec<[u64; 4]>;

/// What a tensor of a program holds, for the category it counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holds {
    /// A forward's intermediate.
    Activation,
    /// A layer's keys or values in the cache.
    KvCache,
    /// The last position's logits, and their float32 copy.
    Logits,
    /// The token ids, the attention mask, the next tokens.
    Ids,
    /// cuBLAS's and cuBLASLt's workspaces (the plan's, by PyTorch release).
    Workspace,
    /// A training step's parameter gradients (`.grad`).
    Gradient,
    /// The optimizer's state and its step's temporaries.
    Optimizer,
    /// bitsandbytes' 4-bit weights dequantized for a product (QLoRA).
    Dequantized,
    /// Autocast's copies of the weights in its type (cached for the
    /// forward, saved for the backward).
    WeightCast,
}

impl Holds {
    pub const ALL: [Holds; 9] = [
        Holds::Activation,
        Holds::KvCache,
        Holds::Logits,
        Holds::Ids,
        Holds::Workspace,
        Holds::Gradient,
        Holds::Optimizer,
        Holds::Dequantized,
        Holds::WeightCast,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Holds::Activation => "activations",
            Holds::KvCache => "KV cache",
            Holds::Logits => "logits",
            Holds::Ids => "token ids and mask",
            Holds::Workspace => "cuBLAS workspaces",
            Holds::Gradient => "gradients",
            Holds::Optimizer => "optimizer state",
            Holds::Dequantized => "dequantized 4-bit weights",
            Holds::WeightCast => "autocast's weight copies",
        }
    }
}

/// What an allocation is, for its category and what happens to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Made by the forward pass.
    Forward,
    /// A gradient of an activation, made by backward.
    Backward,
    /// The gradient of parameter `i` (in `parameters()` order; in a
    /// Hugging Face step, among its trainable parameters), or a piece of
    /// it: it becomes `.grad`, or is added into an existing `.grad` and
    /// dies.
    Grad(usize),
    /// The loss: the loop's `loss` is rebound to it at [`Op::Rebind`].
    Loss,
    /// Parameter `param`'s optimizer state `name` (`optimizer.state[p]`),
    /// made at the first `opt.step()` and held by the optimizer.
    State { param: usize, name: &'static str },
    /// A quantization map (`name2qmap[name]`) bitsandbytes moves to the
    /// device before its first 8-bit state; the optimizer holds it.
    QuantMap(&'static str),
    /// A temporary of parameter `param`'s update (numbered as in
    /// [`Role::Grad`]), as the optimizer names it (Adam's foreach
    /// `exp_avg_sq_sqrt[param]`).
    Scratch { param: usize, name: &'static str },
}

impl Role {
    /// What a tensor of this role holds.
    pub fn holds(self) -> Holds {
        match self {
            Role::Forward | Role::Backward | Role::Loss => Holds::Activation,
            Role::Grad(_) => Holds::Gradient,
            Role::State { .. } | Role::QuantMap(_) | Role::Scratch { .. } => Holds::Optimizer,
        }
    }
}

/// A tensor an op creates.
#[derive(Clone, Debug, PartialEq)]
pub struct Alloc {
    /// The aten op that made it.
    pub op: &'static str,
    /// What it computes, from what.
    pub calc: Calc,
    pub shape: Shape,
    pub dtype: Dtype,
    pub role: Role,
    /// What it holds, for the category it counts in.
    pub holds: Holds,
    /// The block it belongs to, if any.
    pub layer: Option<u32>,
    /// An expression's temporary that no Python name holds until
    /// allocation `t`, the statement's result, is made (`~mask` and
    /// `masked_fill`'s output in `att = att.masked_fill(~mask,
    /// -inf).softmax(-1)`): an error raised before then drops it as the
    /// exception unwinds, while the traceback keeps the frames' locals.
    pub temporary_until: Option<usize>,
}

impl Alloc {
    /// A tensor of `bytes` whose arithmetic is not modelled (a Hugging
    /// Face program's), made by `op` in `layer`.
    #[inline]
    pub fn memory(op: &'static str, bytes: u64, holds: Holds, layer: Option<u32>) -> Self {
        Alloc {
            op,
            calc: Calc::Opaque,
            shape: SmallVec::from_slice(&[bytes]),
            dtype: Dtype::Uint8,
            role: Role::Forward,
            holds,
            layer,
            temporary_until: None,
        }
    }

    #[inline]
    pub fn bytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.size_bytes()
    }
}

/// One step of the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `allocs[i]` is created.
    Alloc(usize),
    /// `allocs[i]` dies.
    Free(usize),
    /// A matrix product's cuBLAS (or cuBLASLt) call on a thread: the
    /// workspace it takes (`train::cublas`).
    Blas(BlasThread, Gemm),
    /// `loss = ...`: the loop's previous loss dies.
    Rebind,
    /// A node done with a part of the batch it saved (NLL's targets, the
    /// token embedding's indices, the first convolution's images): a graph
    /// that holds the batch lets go of it here; a loop's names keep it.
    Release(Batch),
    /// The forward pass ends (the loss is made, the autocast region has
    /// exited): what lives now from the forward pass is what autograd saved.
    ForwardEnd,
    /// A region begins: its ops run under autocast, or in a checkpoint.
    Begin(Region),
    End(Region),
    /// `opt.step()` moves parameter `i` by its `.grad` and its state (its
    /// values; no memory).
    Update(usize),
    /// A cuDNN convolution's workspace of this many bytes, allocated and
    /// freed inside the call.
    Workspace(u64),
    /// Forward `k` of a run begins (0: the prefill, or a training step's
    /// only one; `k`: the `k`-th new token's).
    Forward(u64),
    /// Forward `k` has returned.
    Returned(u64),
    /// A training step's phase begins (`forward`, `backward`, `optimizer
    /// step`, `zero_grad`).
    Phase(&'static str),
}

/// A region of a step's ops (memory and arithmetic run through it; a
/// timeline or a device interpreter may mark it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    /// `torch.autocast`: the forward pass and the loss, or a
    /// recomputation's own region.
    Autocast,
    /// A checkpointed block's (or run's) first forward: it saves nothing.
    Checkpoint,
    /// Backward's recomputation of a checkpointed block from its input.
    Recompute,
}

/// A part of the batch a step's graph may save.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batch {
    /// The model's input: token ids, or images.
    Inputs,
    /// The labels.
    Targets,
}

/// A training step's forward and backward passes (a micro-batch's: the
/// program ends where the next micro-batch, or `opt.step()`, begins), or
/// an optimizer's step (`kinds::step::optim_step`).
#[derive(Clone, Debug, Default)]
pub struct Program {
    pub allocs: Vec<Alloc>,
    pub ops: Vec<Op>,
    /// What the model calls its blocks (`h` in GPT-2), for labels.
    pub scope: &'static str,
}

/// Where a program's ops go as they are made: collected ([`Program`]) or
/// played on an allocator at once (the planner, the engine's `generate`),
/// so a long run is never held.
pub trait Sink {
    /// A tensor is made: a handle the run frees it by. (By reference: a
    /// long run makes millions, and most sinks read a few fields.)
    fn alloc(&mut self, alloc: &Alloc) -> usize;
    fn free(&mut self, handle: usize);
    /// Any other op ([`Op::Forward`], [`Op::Returned`], [`Op::Phase`]).
    fn mark(&mut self, op: Op);
    /// Tensor `handle` is a value on a running Python frame's evaluation
    /// stack that no variable names (`act_fn(gate)` while `* up_proj(x)`
    /// runs): an exception passing through drops it, where the frames it
    /// leaves on the traceback keep their variables.
    fn on_stack(&mut self, _handle: usize) {}
    /// Whether the run may stop here (the sink ran out of memory).
    fn stopped(&self) -> bool {
        false
    }
    /// Tensor `handle` turned out to be `role`, holding `holds` (a
    /// gradient that `AccumulateGrad` kept as a parameter's `.grad`).
    fn retag(&mut self, _handle: usize, _role: Role, _holds: Holds) {}
}

impl Sink for Program {
    fn alloc(&mut self, alloc: &Alloc) -> usize {
        self.allocs.push(alloc.clone());
        self.ops.push(Op::Alloc(self.allocs.len() - 1));
        self.allocs.len() - 1
    }

    fn free(&mut self, handle: usize) {
        self.ops.push(Op::Free(handle));
    }

    fn mark(&mut self, op: Op) {
        self.ops.push(op);
    }

    fn retag(&mut self, handle: usize, role: Role, holds: Holds) {
        if let Some(a) = self.allocs.get_mut(handle) {
            a.role = role;
            a.holds = holds;
        }
    }
}

/// One event of a trace: an op made a tensor of `bytes` (> 0), or a
/// tensor of `-bytes` was freed (`op` is `free`), in 512-byte blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    pub op: &'static str,
    pub bytes: i64,
}

impl Program {
    /// The step's allocations and frees as a trace, without cuBLAS calls;
    /// the loop's previous loss (a float32 scalar) dies at the rebinding.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.ops
            .iter()
            .filter_map(|op| match *op {
                Op::Alloc(i) => Some((self.allocs[i].op, blocks(self.allocs[i].bytes()) as i64)),
                Op::Free(i) => Some(("free", -(blocks(self.allocs[i].bytes()) as i64))),
                Op::Rebind => Some(("free", -(blocks(4) as i64))),
                Op::Blas(..) | Op::Release(_) | Op::ForwardEnd => None,
                Op::Begin(_) | Op::End(_) | Op::Update(_) | Op::Workspace(_) => None,
                Op::Forward(_) | Op::Returned(_) | Op::Phase(_) => None,
            })
            .map(|(op, bytes)| TraceEvent { op, bytes })
            .collect()
    }

    /// Where backward starts: the position of [`Op::ForwardEnd`] (the
    /// whole program when it has none).
    pub fn forward_end(&self) -> usize {
        self.ops
            .iter()
            .position(|op| *op == Op::ForwardEnd)
            .unwrap_or(self.ops.len())
    }

    /// Where the forward first reads the labels: the loss's first op (the
    /// forward's end when none does). `criterion(model(x.cuda()),
    /// y.cuda())` moves the labels to the GPU there, after the model ran.
    pub fn targets_read(&self) -> usize {
        let end = self.forward_end();
        let reads_targets = |op: &Op| match *op {
            Op::Alloc(i) => self.allocs[i]
                .calc
                .operands()
                .contains(&Some(Arg::Batch(Batch::Targets))),
            _ => false,
        };
        self.ops[..end]
            .iter()
            .position(reads_targets)
            .unwrap_or(end)
    }

    /// Where the criterion begins: its `log_softmax` (the op NLL reads,
    /// through a cast under autocast), else where the labels are first
    /// read. `criterion(model(x.cuda()), y.cuda())` moves the labels to
    /// the GPU here, after the model's forward and before the criterion.
    pub fn criterion_starts(&self) -> usize {
        let read = self.targets_read();
        let Some(&Op::Alloc(mut i)) = self.ops.get(read) else {
            return read;
        };
        for _ in 0..3 {
            let Some(Arg::T(j)) = self.allocs[i].calc.operands()[0] else {
                break;
            };
            i = j;
            if matches!(self.allocs[i].calc, Calc::LogSoftmax(_)) {
                return (self.ops.iter().position(|op| *op == Op::Alloc(i))).unwrap_or(read);
            }
        }
        read
    }

    /// Whether allocation `i` is an expression's temporary at op
    /// `position`: its statement's result is not made yet.
    pub fn temporary_at(&self, i: usize, position: usize) -> bool {
        self.allocs[i]
            .temporary_until
            .is_some_and(|t| !self.ops[..position].contains(&Op::Alloc(t)))
    }

    /// Whether backward lets go of `part` of the batch: then the graph
    /// saved it.
    pub fn saves(&self, part: Batch) -> bool {
        self.ops.contains(&Op::Release(part))
    }

    /// For each of `params` parameters, the op after which its gradient
    /// is complete: where its last piece is made, or added in and freed
    /// (`None`: the step computes no gradient for it).
    pub fn gradients_done(&self, params: usize) -> Vec<Option<usize>> {
        let mut done = vec![None; params];
        for (t, op) in self.ops.iter().enumerate() {
            if let Op::Alloc(i) | Op::Free(i) = *op {
                if let Role::Grad(p) = self.allocs[i].role {
                    if let Some(d) = done.get_mut(p) {
                        *d = Some(t);
                    }
                }
            }
        }
        done
    }

    /// For each of `params` parameters, the last op of backward (after
    /// [`Op::ForwardEnd`]) that reads it: a matrix product's weight, for
    /// its input's gradient.
    pub fn last_backward_reads(&self, params: usize) -> Vec<Option<usize>> {
        let mut last = vec![None; params];
        let backward = self.ops.iter().enumerate().skip(self.forward_end());
        for (t, op) in backward {
            let Op::Alloc(i) = *op else { continue };
            for arg in self.allocs[i].calc.operands().into_iter().flatten() {
                if let Some(l) = match arg {
                    Arg::Param(p) => last.get_mut(p),
                    _ => None,
                } {
                    *l = Some(t);
                }
            }
        }
        last
    }
}
