//! The CPU interpreter of a step program: each allocation's arithmetic
//! ([`Calc`]) run in float32 on its operands, in the program's order, each
//! value dropped where the program frees it. The memory interpreter
//! (`engine::program`) plays the same ops on the allocator; this one gives
//! the numbers: the loss and every parameter's gradient. Integer and
//! boolean tensors (token ids, masks, pooling indices) are held as floats;
//! each op computes in float32 and a float16 or bfloat16 tensor is rounded
//! to its type as it is stored (an autocast cast is a rounding copy).
//!
//! - [`dense`]: sums, products, ReLU, log-softmax, the loss: an MLP's
//!   step, in every build.
//! - With the `kinds-arithmetic` feature (not in the page's own engine):
//!   [`transformer`]: embeddings, norms, GELU, softmax; [`attention`]:
//!   heads, causal attention (eager pieces and fused); [`conv`]:
//!   convolution, batch norm, max pooling; [`optim`]: an optimizer's
//!   first state and temporaries (`opt.step()`'s program; the engine
//!   updates the values through `train::update`).

#[cfg(feature = "kinds-arithmetic")]
mod attention;
#[cfg(feature = "kinds-arithmetic")]
mod conv;
mod dense;
#[cfg(feature = "kinds-arithmetic")]
mod optim;
#[cfg(feature = "kinds-arithmetic")]
mod transformer;

use crate::kinds::step::{Arg, Batch, Calc, Op, Program, Role};
use std::ops::Range;
use vramlab_core::types::Dtype;

/// Fused attention's arithmetic, for the tests that hold a device's kernels
/// to it op by op.
#[cfg(all(feature = "kinds-arithmetic", feature = "device-values"))]
pub use attention::{sdpa, sdpa_backward, sdpa_backward_packed};

/// Why a build without the `kinds-arithmetic` feature (the page's own
/// engine) computes no loss for a CNN or a transformer (an MLP's it does).
pub const NOT_IN_THIS_BUILD: &str =
    "the page's own engine computes no CNN or transformer step (a vramlab server does)";

/// What a program reads besides its own tensors.
pub struct Inputs<'a> {
    /// Each parameter's shape and values, in `parameters()` order.
    pub shapes: &'a [Vec<u64>],
    pub params: &'a [Vec<f32>],
    pub batch: &'a BatchValues,
    /// The optimizer's state, each parameter's tensors in turn (as
    /// `update::update` keeps them; empty before the first step): what
    /// `opt.step()`'s program reads.
    pub state: &'a [Vec<f32>],
}

/// One micro-batch: the model's input (token ids or images) and the
/// labels, as floats.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchValues {
    pub inputs: Vec<f32>,
    pub input_shape: Vec<u64>,
    pub targets: Vec<f32>,
}

/// The interpreter's state: the values alive in the program so far (what
/// a `forward` leaves for `backward`), the loss and the gradients made.
#[derive(Clone, Debug, Default)]
pub struct Values {
    tensors: Vec<Option<Vec<f32>>>,
    /// The later outputs of the last multi-output op, and its allocation.
    parts: (usize, Vec<Vec<f32>>),
    pub loss: Option<f32>,
    /// Each parameter's gradient, when the program made one.
    pub grads: Vec<Option<Vec<f32>>>,
}

/// A program's arithmetic under way: its values and the batch it reads
/// (what `forward` leaves for `backward`).
#[derive(Clone, Debug)]
pub struct Computed {
    pub values: Values,
    pub batch: BatchValues,
    /// Where the batch's inputs and targets live on a device that holds
    /// values (none on a simulated GPU).
    #[cfg(feature = "device-values")]
    pub batch_at: [Option<u64>; 2],
}

/// A program whose arithmetic cannot run: an operand already freed, or
/// shapes that disagree. A fault of the program, named for its op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unrunnable(pub String);

/// Runs `program.ops[range]` on `values`.
pub fn run(
    program: &Program,
    range: Range<usize>,
    inputs: &Inputs,
    values: &mut Values,
) -> Result<(), Unrunnable> {
    values.tensors.resize(program.allocs.len(), None);
    values.grads.resize(inputs.params.len(), None);
    for op in &program.ops[range] {
        match *op {
            Op::Alloc(i) => {
                let value = Machine {
                    program,
                    inputs,
                    values,
                }
                .eval(i)?;
                values.keep(program, i, value);
            }
            Op::Free(i) => values.tensors[i] = None,
            Op::Blas(..) | Op::Rebind | Op::Release(_) | Op::ForwardEnd => {}
            // The update itself moves the model's values (`train::update`).
            Op::Begin(_) | Op::End(_) | Op::Update(_) | Op::Workspace(_) => {}
            Op::Forward(_) | Op::Returned(_) | Op::Phase(_) => {}
        }
    }
    Ok(())
}

impl Values {
    /// Allocation `i`'s value, while it lives.
    pub fn tensor(&self, i: usize) -> Option<&[f32]> {
        self.tensors.get(i)?.as_deref()
    }

    /// Stores allocation `i`'s value, rounded to its type; a loss is
    /// read, a parameter's gradient added into what it has (as `.grad`
    /// accumulates).
    fn keep(&mut self, program: &Program, i: usize, mut value: Vec<f32>) {
        round_to(program.allocs[i].dtype, &mut value);
        if let Calc::Nll { .. } = program.allocs[i].calc {
            // The criterion's value (before any `/ accumulate`).
            self.loss = value.first().copied();
        }
        match program.allocs[i].role {
            Role::Loss => {}
            Role::Grad(p) => match &mut self.grads[p] {
                Some(g) => g.iter_mut().zip(&value).for_each(|(g, v)| *g += v),
                slot => *slot = Some(value.clone()),
            },
            Role::Forward | Role::Backward => {}
            Role::State { .. } | Role::QuantMap(_) | Role::Scratch { .. } => {}
        }
        self.tensors[i] = Some(value);
    }
}

impl Values {
    /// Allocation `i`'s value replaced by `value` (a device's, computed
    /// from the same operands): a gradient it added into its parameter's
    /// is replaced in that sum too.
    #[cfg(feature = "device-values")]
    pub fn adopt(&mut self, program: &Program, i: usize, value: Vec<f32>) {
        let Some(old) = self.tensors.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        if let Role::Grad(p) = program.allocs[i].role {
            if let Some(Some(sum)) = self.grads.get_mut(p) {
                for ((s, o), v) in sum.iter_mut().zip(old.iter()).zip(&value) {
                    *s = if *s == *o { *v } else { *s - o + v };
                }
            }
        }
        *old = value;
    }
}

/// `values` rounded to `dtype` (to nearest, ties to even) where it is
/// narrower than float32: an op that writes a float16 or bfloat16 tensor
/// (a matrix product under autocast, a cast) computes in float32 and
/// rounds what it stores, as CUDA's kernels do.
fn round_to(dtype: Dtype, values: &mut [f32]) {
    let round: fn(f32) -> f32 = match dtype {
        Dtype::Float16 => to_f16,
        Dtype::Bfloat16 => to_bf16,
        _ => return,
    };
    values.iter_mut().for_each(|v| *v = round(*v));
}

/// The nearest bfloat16 (8 bits of exponent, 7 of mantissa).
fn to_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let b = x.to_bits();
    f32::from_bits(b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000)
}

/// The nearest float16 (5 bits of exponent, 10 of mantissa; below 2^-14
/// its subnormals, steps of 2^-24; from 65520 on, infinity).
fn to_f16(x: f32) -> f32 {
    let a = x.abs();
    if x.is_nan() || a < f32::MIN_POSITIVE {
        return x;
    }
    if a >= 65520.0 {
        return f32::INFINITY.copysign(x);
    }
    if a < 6.103_515_6e-5 {
        let quantum = 5.960_464_5e-8;
        return libm::rintf(x / quantum) * quantum;
    }
    let b = x.to_bits();
    f32::from_bits(b.wrapping_add(0xfff + ((b >> 13) & 1)) & !0x1fff)
}

/// One allocation's evaluation.
struct Machine<'a> {
    program: &'a Program,
    inputs: &'a Inputs<'a>,
    values: &'a mut Values,
}

/// An operand's values and shape.
pub struct View<'a> {
    pub data: &'a [f32],
    pub shape: &'a [u64],
}

impl View<'_> {
    /// The last dimension (1 for a scalar).
    pub fn last(&self) -> usize {
        self.shape.last().copied().unwrap_or(1) as usize
    }
}

impl Machine<'_> {
    fn arg(&self, a: Arg) -> Result<View<'_>, &'static str> {
        Ok(match a {
            Arg::T(i) => View {
                data: self.values.tensors[i]
                    .as_deref()
                    .ok_or("reads a tensor after it was freed")?,
                shape: &self.program.allocs[i].shape,
            },
            Arg::Param(p) => {
                let missing = "reads a parameter the model does not have";
                let data = self.inputs.params.get(p).ok_or(missing)?;
                let shape = self.inputs.shapes.get(p).ok_or(missing)?;
                View { data, shape }
            }
            Arg::Batch(Batch::Inputs) => View {
                data: &self.inputs.batch.inputs,
                shape: &self.inputs.batch.input_shape,
            },
            Arg::Batch(Batch::Targets) => View {
                data: &self.inputs.batch.targets,
                shape: &[],
            },
            Arg::Grad(p) => View {
                data: self
                    .values
                    .grads
                    .get(p)
                    .and_then(Option::as_deref)
                    .ok_or("reads a .grad that is None")?,
                shape: self
                    .inputs
                    .shapes
                    .get(p)
                    .ok_or("reads a parameter the model does not have")?,
            },
            Arg::State { param, slot } => {
                let missing = "reads an optimizer state not made yet";
                let slots = self.inputs.state.len() / self.inputs.params.len().max(1);
                let data = self.inputs.state.get(param * slots + slot).ok_or(missing)?;
                let shape = self.inputs.shapes.get(param).ok_or(missing)?;
                View { data, shape }
            }
        })
    }

    /// Allocation `i`'s value.
    fn eval(&mut self, i: usize) -> Result<Vec<f32>, Unrunnable> {
        let alloc = &self.program.allocs[i];
        let out = &alloc.shape;
        if alloc.calc == Calc::Opaque {
            let what = "has no arithmetic here (a program for memory alone)";
            return Err(fault(self.program, i, what));
        }
        if let Calc::Part { of, k } = alloc.calc {
            let (last, parts) = &mut self.values.parts;
            return match parts.get_mut(k.wrapping_sub(1)) {
                Some(v) if *last == of => Ok(std::mem::take(v)),
                _ => Err(fault(
                    self.program,
                    i,
                    "is a part of an op that made no such output",
                )),
            };
        }
        let mut outputs = self
            .outputs(alloc.calc, out)
            .map_err(|e| fault(self.program, i, e))?;
        let numel = out.iter().product::<u64>() as usize;
        if outputs.first().map(Vec::len) != Some(numel) {
            return Err(fault(
                self.program,
                i,
                "computes a value of another size than its shape",
            ));
        }
        let first = outputs.remove(0);
        self.values.parts = (i, outputs);
        Ok(first)
    }

    /// The outputs of `calc`, the first of `out`'s shape.
    fn outputs(&self, calc: Calc, out: &[u64]) -> dense::Out {
        let numel = out.iter().product::<u64>() as usize;
        let mut v = Vec::with_capacity(5);
        for a in calc.operands().into_iter().flatten() {
            v.push(self.arg(a)?);
        }
        let one = |x: Vec<f32>| Ok(vec![x]);
        let map = |f: fn(f32) -> f32| one(v[0].data.iter().map(|&x| f(x)).collect());
        match calc {
            Calc::Part { .. } => Err("is a part read where its op runs"),
            Calc::Ones => one(vec![1.0; numel]),
            Calc::Copy(_) => one(v[0].data.to_vec()),
            Calc::Scale(_, f) => one(v[0].data.iter().map(|x| x * f).collect()),
            Calc::Sum(_) => dense::sum_to(&v[0], numel),
            Calc::Mm {
                ta, tb, batched, ..
            } => dense::mm((&v[0], ta), (&v[1], tb), batched),
            Calc::Linear { .. } => dense::linear(&v[0], &v[1], &v[2]),
            Calc::LogSoftmax(_) => one(dense::log_softmax(&v[0])),
            Calc::LogSoftmaxBackward { .. } => dense::log_softmax_backward(&v[0], &v[1]),
            Calc::Nll { .. } => dense::nll(&v[0], &v[1]),
            Calc::NllBackward { .. } => dense::nll_backward(&v[0], &v[1], &v[2], numel),
            Calc::Relu(_) => map(|x| x.max(0.0)),
            Calc::ReluBackward { .. } => {
                dense::zip(&v[0], &v[1], |g, y| if y > 0.0 { g } else { 0.0 })
            }
            #[cfg(feature = "kinds-arithmetic")]
            _ => wide_outputs(calc, &v, out),
            #[cfg(not(feature = "kinds-arithmetic"))]
            _ => Err("is an op this build does not compute"),
        }
    }
}

/// Whether this build computes `calc`: every op with the
/// `kinds-arithmetic` feature; without it (the page's own engine) the
/// dense ones alone, every op of an MLP's step.
pub fn in_this_build(calc: &Calc) -> bool {
    cfg!(feature = "kinds-arithmetic")
        || matches!(
            calc,
            Calc::Part { .. }
                | Calc::Ones
                | Calc::Copy(_)
                | Calc::Scale(..)
                | Calc::Sum(_)
                | Calc::Mm { .. }
                | Calc::Linear { .. }
                | Calc::LogSoftmax(_)
                | Calc::LogSoftmaxBackward { .. }
                | Calc::Nll { .. }
                | Calc::NllBackward { .. }
                | Calc::Relu(_)
                | Calc::ReluBackward { .. }
        )
}

/// The transformer's, attention's and the CNN's ops.
#[cfg(feature = "kinds-arithmetic")]
fn wide_outputs(calc: Calc, v: &[View], out: &[u64]) -> dense::Out {
    let numel = out.iter().product::<u64>() as usize;
    let one = |x: Vec<f32>| Ok(vec![x]);
    let map = |f: fn(f32) -> f32| one(v[0].data.iter().map(|&x| f(x)).collect());
    match calc {
        Calc::Arange => one((0..numel).map(|x| x as f32).collect()),
        Calc::Zeros => one(vec![0.0; numel]),
        Calc::DynamicMap { signed } => one(optim::dynamic_map(signed)),
        Calc::Sqrt(_) => map(f32::sqrt),
        Calc::Not(_) => map(|x| 1.0 - x),
        Calc::Add(..) => transformer::add(&v[0], &v[1]),
        Calc::Tril(_) => one(transformer::tril(&v[0])),
        Calc::Embedding { .. } => transformer::embedding(&v[0], &v[1]),
        Calc::EmbeddingBackward { .. } => transformer::embedding_backward(&v[0], &v[1], numel),
        Calc::Norm { .. } => transformer::norm(&v[0], &v[1], v.get(2)),
        Calc::NormBackward { mean, .. } => {
            // grad, x, [mean], rstd, weight
            let m = usize::from(mean.is_some());
            let saved = transformer::NormSaved {
                x: &v[1],
                mean: mean.map(|_| &v[2]),
                rstd: &v[2 + m],
                weight: &v[3 + m],
            };
            transformer::norm_backward(&v[0], &saved)
        }
        Calc::Gelu(_) => map(transformer::gelu),
        Calc::GeluBackward { .. } => dense::zip(&v[0], &v[1], |g, x| g * transformer::gelu_grad(x)),
        Calc::Heads { part, .. } => attention::heads(&v[0], part, out),
        Calc::MergeHeads(_) => attention::merge_heads(&v[0]),
        Calc::MaskedFill { value, .. } => attention::masked_fill(&v[0], &v[1], value),
        Calc::Softmax(_) => one(transformer::softmax(&v[0])),
        Calc::SoftmaxBackward { .. } => transformer::softmax_backward(&v[0], &v[1]),
        Calc::Sdpa {
            heads, lse_align, ..
        } => attention::sdpa(&v[0], heads as usize, out, lse_align as usize),
        Calc::SdpaBackwardPacked { .. } => {
            attention::sdpa_backward_packed(&v[0], &v[1], &v[2], &v[3])
        }
        Calc::Workspace => one(vec![0.0; numel]),
        Calc::SdpaBackward { .. } => attention::sdpa_backward(&v[0], &v[1], &v[2], &v[3]),
        Calc::Cat(_) => attention::cat(v, out),
        Calc::Conv { .. } => conv::conv(&v[0], &v[1], &v[2]),
        Calc::ConvBackward { input_grad, .. } => {
            conv::conv_backward(&v[0], &v[1], &v[2], input_grad)
        }
        Calc::BatchNorm { .. } => conv::batch_norm(&v[0], &v[1], &v[2]),
        Calc::BatchNormBackward { .. } => {
            conv::batch_norm_backward(&v[0], &v[1], &v[2], (&v[3], &v[4]))
        }
        Calc::MaxPool(_) => conv::max_pool(&v[0]),
        Calc::MaxPoolBackward { .. } => conv::max_pool_backward(&v[0], &v[1], out),
        _ => Err("is a dense op"),
    }
}

/// The message of a program's fault at allocation `i`.
fn fault(program: &Program, i: usize, what: &str) -> Unrunnable {
    let a = &program.allocs[i];
    Unrunnable(format!("allocation {i} ({}, {:?}) {what}", a.op, a.shape))
}

/// What running a program's arithmetic costs: floating-point operations
/// (two per multiply-add of the products and convolutions, backward's
/// included) and the host memory of its float32 values at their peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cost {
    pub flops: u64,
    pub host_bytes: u64,
}

/// The cost of `program` with parameters of these shapes.
pub fn cost(program: &Program, params: &[Vec<u64>]) -> Cost {
    let numel = |i: usize| program.allocs[i].shape.iter().product::<u64>();
    let (mut live, mut peak, mut flops) = (0u64, 0u64, 0u64);
    for op in &program.ops {
        match *op {
            Op::Alloc(i) => {
                live = live.saturating_add(numel(i));
                peak = peak.max(live);
                flops = flops.saturating_add(dense::op_flops(program, params, i));
            }
            Op::Free(i) => live = live.saturating_sub(numel(i)),
            _ => {}
        }
    }
    // Values, gradients and up to two optimizer states per parameter.
    let elements: u64 = params.iter().map(|s| s.iter().product::<u64>()).sum();
    let params = elements.saturating_mul(4);
    Cost {
        flops,
        host_bytes: peak.saturating_add(params).saturating_mul(4),
    }
}

#[cfg(test)]
mod tests;
