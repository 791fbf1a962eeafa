//! The step IR: a [`Program`] is the allocations an op sequence makes
//! ([`Alloc`]: the aten op, what it computes from which operands, shape,
//! type, role) and the ops that play them ([`Op`]: each allocation, each
//! free, each BLAS call's workspace, the loss's rebinding, the batch let go
//! of, the forward pass's end, autocast and checkpoint regions). Every
//! model kind's builder writes one; the memory interpreter
//! (`engine::program`), the CPU interpreter (`train::cpu`), a device's
//! (`engine::on_device`) and the estimate's walk (`kinds::estimate`) run it.

use super::calc::{Arg, Calc};
use crate::cublas::{BlasThread, Gemm};
use crate::kinds::blocks;
use vramlab_core::types::Dtype;

/// How attention is computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// `softmax(q @ k.T * scale, masked) @ v`: B x H x S x S tensors.
    #[default]
    Eager,
    /// `F.scaled_dot_product_attention` with a fused (flash) kernel.
    Sdpa,
}

vramlab_core::read_by_name!(Attention {
    Eager = "eager",
    Sdpa = "sdpa",
});

impl Attention {
    pub fn is_eager(&self) -> bool {
        *self == Attention::Eager
    }
}

/// What a step does to memory besides its shapes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub attention: Attention,
    /// Each block under `torch.utils.checkpoint` (non-reentrant).
    pub checkpointing: bool,
    /// The forward pass and the loss under `torch.autocast('cuda', dtype)`
    /// (float16 or bfloat16).
    pub amp: Option<Dtype>,
    /// `loss = criterion(...) / accumulate` when above 1 (gradient
    /// accumulation): a `div` in forward and in backward.
    pub accumulate: u64,
    /// The GPU's compute capability where PyTorch picks a CUDA kernel
    /// for `scaled_dot_product_attention` (`sdp`); `None`: the CPU's, as
    /// PyTorch's own traces here ran.
    pub gpu: Option<(u32, u32)>,
    /// The workspace each cuDNN convolution call takes on a GPU
    /// (`Settings::cudnn_workspace_bytes`; 0: not counted).
    pub conv_workspace: u64,
}

impl Options {
    /// The loss is divided (gradient accumulation).
    pub(in crate::kinds) fn divided(&self) -> Option<f32> {
        (self.accumulate > 1).then(|| 1.0 / self.accumulate as f32)
    }
}

/// What an allocation is, for its category and what happens to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Made by the forward pass.
    Forward,
    /// A gradient of an activation, made by backward.
    Backward,
    /// The gradient of parameter `i` (in `parameters()` order): it becomes
    /// `.grad`, or is added into an existing `.grad` and dies.
    Grad(usize),
    /// The loss: the loop's `loss` is rebound to it at [`Op::Rebind`].
    Loss,
    /// Parameter `param`'s optimizer state `name` (`optimizer.state[p]`),
    /// made at the first `opt.step()` and held by the optimizer.
    State { param: usize, name: &'static str },
    /// A quantization map (`name2qmap[name]`) bitsandbytes moves to the
    /// device before its first 8-bit state; the optimizer holds it.
    QuantMap(&'static str),
    /// A temporary of parameter `param`'s update, as the optimizer names
    /// it (Adam's foreach `exp_avg_sq_sqrt[param]`).
    Scratch { param: usize, name: &'static str },
}

/// A tensor an op creates.
#[derive(Clone, Debug, PartialEq)]
pub struct Alloc {
    /// The aten op that made it.
    pub op: &'static str,
    /// What it computes, from what.
    pub calc: Calc,
    pub shape: Vec<u64>,
    pub dtype: Dtype,
    pub role: Role,
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
