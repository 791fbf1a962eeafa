//! What each allocation of a step program computes: the aten op's
//! arithmetic and its operands (tensors of the program, parameters, the
//! batch). Memory play ignores it; the CPU interpreter (`train::cpu`) runs
//! it in float32, rounding what it stores to each tensor's type. Shapes are the
//! allocations' own: attention's heads are B x H x S x (width / H), so a
//! batched product or a concatenation reads each operand's layout from its
//! shape.

use super::Batch;

/// An operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// Allocation `i` of the program.
    T(usize),
    /// Parameter `i`, in `parameters()` order.
    Param(usize),
    /// A part of the batch: token ids or images, or the labels.
    Batch(Batch),
    /// Parameter `i`'s `.grad`.
    Grad(usize),
    /// Parameter `param`'s optimizer state `slot` (in `state_names`
    /// order).
    State { param: usize, slot: usize },
}

/// An op's arithmetic. Several ops have more than one output: the first
/// allocation names the op, each later one is a [`Calc::Part`] of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Calc {
    /// Output `k` (from 1) of the op that made allocation `of`.
    Part {
        of: usize,
        k: usize,
    },
    /// What the op computes is not modelled: a program for memory alone
    /// (a Hugging Face family's). The CPU and device interpreters refuse it.
    Opaque,
    /// `arange(n)`.
    Arange,
    /// A tensor of ones (`ones`, `ones_like`).
    Ones,
    /// A tensor of zeros (`zeros_like`: an optimizer's first state).
    Zeros,
    /// bitsandbytes' quantization map (`create_dynamic_map(signed)`, made
    /// on the host and copied to the device): 256 code values, sorted.
    DynamicMap {
        signed: bool,
    },
    /// The square root of each element (`_foreach_sqrt`).
    Sqrt(Arg),
    /// The lower triangle of a square, ones elsewhere zero (`tril`).
    Tril(Arg),
    /// `~x` of a boolean tensor.
    Not(Arg),
    /// A copy: `clone`, or an autocast cast (`_to_copy`).
    Copy(Arg),
    /// Rows of `weight` picked by `ids`.
    Embedding {
        weight: Arg,
        ids: Arg,
    },
    /// `embedding_dense_backward`: each row of `grad` added into the row
    /// of a zero table its id picks.
    EmbeddingBackward {
        grad: Arg,
        ids: Arg,
    },
    /// `a + b`, `b` repeated over `a`'s leading dimensions.
    Add(Arg, Arg),
    /// `x * factor`.
    Scale(Arg, f32),
    /// `x` summed over its leading dimensions down to the output's size (a
    /// bias's gradient, the position embedding's summed gradient).
    Sum(Arg),
    /// A matrix product of `a` and `b` (each, transposed when `ta`/`tb`),
    /// batched over their leading dimensions when `batched`, else with
    /// every leading dimension flattened into rows.
    Mm {
        a: Arg,
        b: Arg,
        ta: bool,
        tb: bool,
        batched: bool,
    },
    /// `addmm`: `x @ weight.T + bias`.
    Linear {
        x: Arg,
        weight: Arg,
        bias: Arg,
    },
    /// LayerNorm (with `bias`) or RMSNorm (without) over the last
    /// dimension: the output, then (LayerNorm) the mean, then the inverse
    /// deviation, as `Part`s.
    Norm {
        x: Arg,
        weight: Arg,
        bias: Option<Arg>,
    },
    /// The norm's backward: the input's gradient, then the weight's and
    /// (LayerNorm, when `mean` is kept) the bias's.
    NormBackward {
        grad: Arg,
        x: Arg,
        mean: Option<Arg>,
        rstd: Arg,
        weight: Arg,
    },
    /// GELU (the exact, erf form).
    Gelu(Arg),
    GeluBackward {
        grad: Arg,
        x: Arg,
    },
    /// Head `part` (0, 1, 2 for q, k, v) of a B x S x (parts · width)
    /// projection as B x H x S x (width / H).
    Heads {
        x: Arg,
        part: usize,
    },
    /// B x H x S x D heads back as B x S x (H · D).
    MergeHeads(Arg),
    /// `x` where `mask` is false, `value` where it is true (the mask
    /// repeated over `x`'s leading dimensions).
    MaskedFill {
        x: Arg,
        mask: Arg,
        value: f32,
    },
    /// Softmax over the last dimension.
    Softmax(Arg),
    SoftmaxBackward {
        grad: Arg,
        out: Arg,
    },
    LogSoftmax(Arg),
    LogSoftmaxBackward {
        grad: Arg,
        out: Arg,
    },
    /// NLL's mean loss over the rows of `log_probs`; its second output is
    /// the total weight (the row count).
    Nll {
        log_probs: Arg,
        targets: Arg,
    },
    NllBackward {
        grad: Arg,
        targets: Arg,
        total_weight: Arg,
    },
    /// Causal attention of `heads` heads on a B x S x 3·width projection:
    /// the output (B x S x width), then the log-sum-exp (B x H x S).
    Sdpa {
        qkv: Arg,
        heads: u64,
        /// The log-sum-exp's rows padded to a multiple of this (the
        /// memory-efficient kernel's 32; 1 elsewhere).
        lse_align: u64,
    },
    /// Its backward: the gradients of q, k and v as B x H x S x D.
    SdpaBackward {
        grad: Arg,
        qkv: Arg,
        out: Arg,
        lse: Arg,
    },
    /// The memory-efficient kernel's backward: the same gradients in one
    /// B x S x 3 x H x D buffer (q, k and v views of one projection).
    SdpaBackwardPacked {
        grad: Arg,
        qkv: Arg,
        out: Arg,
        lse: Arg,
    },
    /// A kernel's buffer for the call (an accumulator, `delta`): values
    /// no op of the program reads (zeros here).
    Workspace,
    /// The three gradients of the q/k/v split joined along the last
    /// dimension (each B x S x width, or B x H x S x D heads).
    Cat([Arg; 3]),
    /// A 3x3 convolution, padding 1.
    Conv {
        x: Arg,
        weight: Arg,
        bias: Arg,
    },
    /// Its backward: the input's gradient (when `input_grad`), then the
    /// weight's and the bias's.
    ConvBackward {
        grad: Arg,
        x: Arg,
        weight: Arg,
        input_grad: bool,
    },
    /// Batch norm with the batch's statistics: the output, then the
    /// per-channel mean and inverse deviation.
    BatchNorm {
        x: Arg,
        weight: Arg,
        bias: Arg,
    },
    /// Its backward: the input's, the weight's and the bias's gradients.
    BatchNormBackward {
        grad: Arg,
        x: Arg,
        weight: Arg,
        mean: Arg,
        invstd: Arg,
    },
    Relu(Arg),
    /// `threshold_backward`: the gradient where the output is positive.
    ReluBackward {
        grad: Arg,
        out: Arg,
    },
    /// 2x2 max pooling: the output, then the indices.
    MaxPool(Arg),
    MaxPoolBackward {
        grad: Arg,
        indices: Arg,
    },
}

impl Calc {
    /// The operands, in the order the fields are written (an absent
    /// optional one skipped); `Part`'s allocation is not an operand.
    pub fn operands(&self) -> [Option<Arg>; 5] {
        use Calc::*;
        let list = |args: &[Option<Arg>]| {
            let mut out = [None; 5];
            for (slot, a) in out.iter_mut().zip(args.iter().flatten()) {
                *slot = Some(*a);
            }
            out
        };
        match *self {
            Part { .. } | Opaque | Arange | Ones | Zeros | DynamicMap { .. } | Workspace => {
                [None; 5]
            }
            Tril(x)
            | Sqrt(x)
            | Not(x)
            | Copy(x)
            | Scale(x, _)
            | Sum(x)
            | Gelu(x)
            | MergeHeads(x)
            | Softmax(x)
            | LogSoftmax(x)
            | Relu(x)
            | MaxPool(x)
            | Heads { x, .. }
            | Sdpa { qkv: x, .. } => list(&[Some(x)]),
            Embedding { weight: a, ids: b }
            | EmbeddingBackward { grad: a, ids: b }
            | Add(a, b)
            | Mm { a, b, .. }
            | GeluBackward { grad: a, x: b }
            | MaskedFill { x: a, mask: b, .. }
            | SoftmaxBackward { grad: a, out: b }
            | LogSoftmaxBackward { grad: a, out: b }
            | Nll {
                log_probs: a,
                targets: b,
            }
            | ReluBackward { grad: a, out: b }
            | MaxPoolBackward {
                grad: a,
                indices: b,
            } => list(&[Some(a), Some(b)]),
            Linear { x, weight, bias }
            | Conv { x, weight, bias }
            | BatchNorm { x, weight, bias } => list(&[Some(x), Some(weight), Some(bias)]),
            Norm { x, weight, bias } => list(&[Some(x), Some(weight), bias]),
            NormBackward {
                grad,
                x,
                mean,
                rstd,
                weight,
            } => list(&[Some(grad), Some(x), mean, Some(rstd), Some(weight)]),
            NllBackward {
                grad,
                targets,
                total_weight,
            } => list(&[Some(grad), Some(targets), Some(total_weight)]),
            SdpaBackward {
                grad,
                qkv,
                out,
                lse,
            }
            | SdpaBackwardPacked {
                grad,
                qkv,
                out,
                lse,
            } => list(&[Some(grad), Some(qkv), Some(out), Some(lse)]),
            Cat([a, b, c]) => list(&[Some(a), Some(b), Some(c)]),
            ConvBackward {
                grad, x, weight, ..
            } => list(&[Some(grad), Some(x), Some(weight)]),
            BatchNormBackward {
                grad,
                x,
                weight,
                mean,
                invstd,
            } => list(&[Some(grad), Some(x), Some(weight), Some(mean), Some(invstd)]),
        }
    }

    /// `ta`/`tb` products without batching.
    pub fn mm(a: Arg, b: Arg, ta: bool, tb: bool) -> Calc {
        Calc::Mm {
            a,
            b,
            ta,
            tb,
            batched: false,
        }
    }

    /// Batched products (attention's heads).
    pub fn bmm(a: Arg, b: Arg, ta: bool, tb: bool) -> Calc {
        Calc::Mm {
            a,
            b,
            ta,
            tb,
            batched: true,
        }
    }
}
