//! The CPU interpreter of a step program: each allocation's arithmetic
//! ([`Calc`]) run in float32 on its operands, in the program's order, each
//! value dropped where the program frees it. The memory interpreter
//! (`engine::program`) plays the same ops on the allocator; this one gives
//! the numbers: the loss and every parameter's gradient. Integer and
//! boolean tensors (token ids, masks, pooling indices) are held as floats,
//! and an autocast cast is a copy (the arithmetic stays float32).
//!
//! - [`dense`]: embeddings, sums, products, norms, GELU, softmax, the loss.
//! - [`attention`]: heads, causal attention (eager pieces and fused).
//! - [`conv`]: convolution, batch norm, ReLU, max pooling.

mod attention;
mod conv;
mod dense;

use crate::train::kinds::step::{Arg, Batch, Calc, Op, Program, Role};
use std::ops::Range;

/// What a program reads besides its own tensors.
pub struct Inputs<'a> {
    /// Each parameter's shape and values, in `parameters()` order.
    pub shapes: &'a [Vec<u64>],
    pub params: &'a [Vec<f32>],
    pub batch: &'a BatchValues,
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
            Op::Blas(_) | Op::Rebind | Op::Release(_) | Op::ForwardEnd => {}
        }
    }
    Ok(())
}

impl Values {
    /// Stores allocation `i`'s value; a loss is read, a parameter's
    /// gradient added into what it has (as `.grad` accumulates).
    fn keep(&mut self, program: &Program, i: usize, value: Vec<f32>) {
        match program.allocs[i].role {
            Role::Loss => self.loss = value.first().copied(),
            Role::Grad(p) => match &mut self.grads[p] {
                Some(g) => g.iter_mut().zip(&value).for_each(|(g, v)| *g += v),
                slot => *slot = Some(value.clone()),
            },
            Role::Forward | Role::Backward => {}
        }
        self.tensors[i] = Some(value);
    }
}

/// One allocation's evaluation.
struct Machine<'a> {
    program: &'a Program,
    inputs: &'a Inputs<'a>,
    values: &'a mut Values,
}

/// An operand's values and shape.
pub(crate) struct View<'a> {
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
        })
    }

    /// Allocation `i`'s value.
    fn eval(&mut self, i: usize) -> Result<Vec<f32>, Unrunnable> {
        let alloc = &self.program.allocs[i];
        let out = &alloc.shape;
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
        let one = |v: Vec<f32>| Ok(vec![v]);
        match calc {
            Calc::Part { .. } => Err("is a part read where its op runs"),
            Calc::Arange => one((0..numel).map(|v| v as f32).collect()),
            Calc::Ones => one(vec![1.0; numel]),
            Calc::Tril(x) => one(dense::tril(&self.arg(x)?)),
            Calc::Not(x) => one(self.arg(x)?.data.iter().map(|v| 1.0 - v).collect()),
            Calc::Copy(x) => one(self.arg(x)?.data.to_vec()),
            Calc::Embedding { weight, ids } => {
                dense::embedding(&self.arg(weight)?, &self.arg(ids)?)
            }
            Calc::EmbeddingBackward { grad, ids } => {
                dense::embedding_backward(&self.arg(grad)?, &self.arg(ids)?, numel)
            }
            Calc::Add(a, b) => dense::add(&self.arg(a)?, &self.arg(b)?),
            Calc::Scale(x, f) => one(self.arg(x)?.data.iter().map(|v| v * f).collect()),
            Calc::Sum(x) => dense::sum_to(&self.arg(x)?, numel),
            Calc::Mm {
                a,
                b,
                ta,
                tb,
                batched,
            } => dense::mm((&self.arg(a)?, ta), (&self.arg(b)?, tb), batched),
            Calc::Linear { x, weight, bias } => {
                dense::linear(&self.arg(x)?, &self.arg(weight)?, &self.arg(bias)?)
            }
            Calc::Norm { x, weight, bias } => {
                let bias = bias.map(|b| self.arg(b)).transpose()?;
                dense::norm(&self.arg(x)?, &self.arg(weight)?, bias.as_ref())
            }
            Calc::NormBackward {
                grad,
                x,
                mean,
                rstd,
                weight,
            } => {
                let mean = mean.map(|m| self.arg(m)).transpose()?;
                let saved = dense::NormSaved {
                    x: &self.arg(x)?,
                    mean: mean.as_ref(),
                    rstd: &self.arg(rstd)?,
                    weight: &self.arg(weight)?,
                };
                dense::norm_backward(&self.arg(grad)?, &saved)
            }
            Calc::Gelu(x) => one(self.arg(x)?.data.iter().map(|&v| dense::gelu(v)).collect()),
            Calc::GeluBackward { grad, x } => {
                let (g, x) = (self.arg(grad)?, self.arg(x)?);
                dense::zip(&g, &x, |g, x| g * dense::gelu_grad(x))
            }
            Calc::Heads { x, part } => attention::heads(&self.arg(x)?, part, out),
            Calc::MergeHeads(x) => attention::merge_heads(&self.arg(x)?),
            Calc::MaskedFill { x, mask, value } => {
                attention::masked_fill(&self.arg(x)?, &self.arg(mask)?, value)
            }
            Calc::Softmax(x) => one(dense::softmax(&self.arg(x)?)),
            Calc::SoftmaxBackward { grad, out } => {
                dense::softmax_backward(&self.arg(grad)?, &self.arg(out)?)
            }
            Calc::LogSoftmax(x) => one(dense::log_softmax(&self.arg(x)?)),
            Calc::LogSoftmaxBackward { grad, out } => {
                dense::log_softmax_backward(&self.arg(grad)?, &self.arg(out)?)
            }
            Calc::Nll { log_probs, targets } => {
                dense::nll(&self.arg(log_probs)?, &self.arg(targets)?)
            }
            Calc::NllBackward {
                grad,
                targets,
                total_weight,
            } => dense::nll_backward(
                &self.arg(grad)?,
                &self.arg(targets)?,
                &self.arg(total_weight)?,
                numel,
            ),
            Calc::Sdpa { qkv, heads } => attention::sdpa(&self.arg(qkv)?, heads as usize, out),
            Calc::SdpaBackward {
                grad,
                qkv,
                out: o,
                lse,
            } => attention::sdpa_backward(
                &self.arg(grad)?,
                &self.arg(qkv)?,
                &self.arg(o)?,
                &self.arg(lse)?,
            ),
            Calc::Cat(parts) => {
                let [q, k, v] = [
                    self.arg(parts[0])?,
                    self.arg(parts[1])?,
                    self.arg(parts[2])?,
                ];
                attention::cat(&[q, k, v], out)
            }
            Calc::Conv { x, weight, bias } => {
                conv::conv(&self.arg(x)?, &self.arg(weight)?, &self.arg(bias)?)
            }
            Calc::ConvBackward {
                grad,
                x,
                weight,
                input_grad,
            } => conv::conv_backward(
                &self.arg(grad)?,
                &self.arg(x)?,
                &self.arg(weight)?,
                input_grad,
            ),
            Calc::BatchNorm { x, weight, bias } => {
                conv::batch_norm(&self.arg(x)?, &self.arg(weight)?, &self.arg(bias)?)
            }
            Calc::BatchNormBackward {
                grad,
                x,
                weight,
                mean,
                invstd,
            } => conv::batch_norm_backward(
                &self.arg(grad)?,
                &self.arg(x)?,
                &self.arg(weight)?,
                (&self.arg(mean)?, &self.arg(invstd)?),
            ),
            Calc::Relu(x) => one(self.arg(x)?.data.iter().map(|v| v.max(0.0)).collect()),
            Calc::ReluBackward { grad, out } => {
                let (g, y) = (self.arg(grad)?, self.arg(out)?);
                dense::zip(&g, &y, |g, y| if y > 0.0 { g } else { 0.0 })
            }
            Calc::MaxPool(x) => conv::max_pool(&self.arg(x)?),
            Calc::MaxPoolBackward { grad, indices } => {
                conv::max_pool_backward(&self.arg(grad)?, &self.arg(indices)?, out)
            }
        }
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
