//! A step's ops as a GPU computes them: which kernels of [`SOURCE`] and
//! which cuBLAS products make each [`Calc`]'s outputs, on the addresses
//! the allocator gave its tensors. The arithmetic is the CPU
//! interpreter's (`train::cpu`), op for op; `engine::on_device` runs both
//! and holds the device's value to the CPU's. The CNN's ops are
//! [`cnn`]'s, fused attention's [`attention`]'s. An op with no kernel here
//! (bitsandbytes' maps) or too long a row for one (attention over more
//! than [`attention::ATTN_ROW`] positions) is computed on the host and its
//! value copied.

use crate::data::Synthetic;
use crate::init::Init;
use crate::kinds::step::Calc;
use crate::optim::OptimizerKind;
use crate::update::{ADAMW_WEIGHT_DECAY, BETA1, BETA2, EPS, MOMENTUM};
use vramlab_core::types::Dtype;
use vramlab_device::compute::{type_code, Call, GemmEx, Grid, KernelArg as K, Launch, Matrix};

/// The kernels' CUDA source, compiled by NVRTC (no headers needed).
pub const SOURCE: &str = include_str!("kernels.cu");

/// Every kernel in [`SOURCE`], as a device looks them up.
pub const NAMES: &[&str] = &[
    "fill",
    "arange",
    "copy",
    "scale",
    "sqrt_",
    "not_",
    "relu",
    "relu_backward",
    "gelu_",
    "gelu_backward",
    "add",
    "bias_rows",
    "sum_rows",
    "tril",
    "masked_fill",
    "embedding",
    "embedding_backward",
    "softmax",
    "softmax_backward",
    "softmax_warps",
    "softmax_backward_warps",
    "nll",
    "nll_backward",
    "heads",
    "cat_part",
    "merge_heads",
    "norm_rows",
    "norm_backward_input",
    "norm_backward_params",
    "conv3x3",
    "conv3x3_backward_input",
    "conv3x3_backward_params",
    "batch_norm",
    "batch_norm_backward",
    "max_pool2",
    "max_pool2_backward",
    "sdpa_forward",
    "sdpa_backward_q",
    "sdpa_backward_kv",
    "synthetic_batch",
    "synthetic_sequences",
    "init_param",
    "sgd_update",
    "adam_update",
];

/// Columns a block of `sum_rows` and `norm_backward_params` sums (`COLS`
/// in the source).
pub const COLS: u64 = 8;

/// The longest row `softmax` and `softmax_backward` give one warp
/// (`WARP_ROW`), and the rows a block then takes (`WARP_ROWS`).
pub const WARP_ROW: u64 = 1024;
pub const WARP_ROWS: u64 = 8;

/// A softmax's (or its backward's) kernel, grid and size arguments: a
/// warp a row (`warps`) when the rows are short and every tensor is
/// float32 or bfloat16, else a block a row (`block`).
fn softmax_launch<const N: usize>(
    (block, warps): (&'static str, &'static str),
    tensors: [Place; N],
    rows: u64,
    cols: u64,
    log: bool,
) -> (&'static str, Grid, Vec<K>) {
    let fast = tensors
        .iter()
        .all(|t| matches!(t.dtype, Dtype::Float32 | Dtype::Bfloat16));
    let log = K::I32(log.into());
    if cols <= WARP_ROW && fast {
        let sizes = vec![K::I64(cols as i64), K::I64(rows as i64), log];
        (warps, Grid::Rows(rows.div_ceil(WARP_ROWS)), sizes)
    } else {
        (block, Grid::Rows(rows), vec![K::I64(cols as i64), log])
    }
}

/// A tensor on the device: its block's address, shape and type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Place<'a> {
    pub at: u64,
    pub shape: &'a [u64],
    pub dtype: Dtype,
}

impl Place<'_> {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// The last dimension (1 for a scalar).
    fn last(&self) -> u64 {
        self.shape.last().copied().unwrap_or(1).max(1)
    }

    /// Its address and type code, as every kernel takes a tensor.
    fn arg(&self) -> [K; 2] {
        [K::Ptr(self.at), K::I32(type_code(self.dtype))]
    }

    /// As a matrix, rows x columns: an image batch (4-D) a row per image,
    /// anything else with its last dimension as columns (`cpu::dense`).
    fn matrix(&self) -> (u64, u64) {
        let n = self.numel();
        let cols = match self.shape.len() {
            4 => n / self.shape[0].max(1),
            _ => self.last(),
        };
        (n / cols.max(1), cols)
    }
}

/// The calls that compute `calc` into `out` (and its later outputs,
/// `parts`), reading `args` (its operands in [`Calc::operands`] order);
/// `workspace` is cuBLAS's for a product. `None`: no kernel computes it
/// here, or its operands do not fit (the CPU says why).
pub fn plan(
    calc: &Calc,
    out: Place,
    parts: &[Place],
    args: &[Place],
    workspace: Option<(u64, u64)>,
) -> Option<Vec<Call>> {
    let n = out.numel();
    let [o, to] = out.arg();
    let one = |kernel: &'static str, grid: Grid, rest: Vec<K>| {
        let mut all = vec![o, to];
        all.extend(rest);
        Some(vec![launch(kernel, grid, all)])
    };
    let each = |kernel: &'static str, rest: Vec<K>| one(kernel, Grid::Elements(n), rest);
    let arg = |i: usize| args.get(i).copied();
    let unary = |kernel: &'static str, extra: Option<f32>| {
        let x = arg(0)?;
        let mut rest = x.arg().to_vec();
        rest.push(K::I64(n as i64));
        rest.extend(extra.map(K::F32));
        (x.numel() == n).then_some(())?;
        each(kernel, rest)
    };
    let binary = |kernel: &'static str| {
        let (a, b) = (arg(0)?, arg(1)?);
        (a.numel() == n && b.numel() == n).then_some(())?;
        each(
            kernel,
            [a.arg(), b.arg()]
                .concat()
                .into_iter()
                .chain([K::I64(n as i64)])
                .collect(),
        )
    };
    match *calc {
        Calc::Ones => each("fill", vec![K::I64(n as i64), K::F32(1.0)]),
        Calc::Zeros | Calc::Workspace => each("fill", vec![K::I64(n as i64), K::F32(0.0)]),
        Calc::Arange => each("arange", vec![K::I64(n as i64)]),
        Calc::Copy(_) => unary("copy", None),
        Calc::Scale(_, f) => unary("scale", Some(f)),
        Calc::Sqrt(_) => unary("sqrt_", None),
        Calc::Not(_) => unary("not_", None),
        Calc::Relu(_) => unary("relu", None),
        Calc::Gelu(_) => unary("gelu_", None),
        Calc::ReluBackward { .. } => binary("relu_backward"),
        Calc::GeluBackward { .. } => binary("gelu_backward"),
        Calc::Add(..) => {
            let (a, b) = (arg(0)?, arg(1)?);
            let (big, small) = if a.numel() >= b.numel() {
                (a, b)
            } else {
                (b, a)
            };
            let tiles = small.numel() > 0 && big.numel() == n && n % small.numel() == 0;
            tiles.then_some(())?;
            let rest = [big.arg(), small.arg()].concat();
            each(
                "add",
                [rest, vec![K::I64(n as i64), K::I64(small.numel() as i64)]].concat(),
            )
        }
        Calc::Sum(_) => {
            let x = arg(0)?;
            (n > 0 && x.numel() % n == 0).then_some(())?;
            let rest = [
                x.arg().to_vec(),
                vec![K::I64(n as i64), K::I64((x.numel() / n) as i64)],
            ];
            one("sum_rows", Grid::Rows(n.div_ceil(COLS)), rest.concat())
        }
        Calc::Tril(_) => each("tril", vec![K::I64(n as i64), K::I64(out.last() as i64)]),
        Calc::MaskedFill { value, .. } => {
            let (x, mask) = (arg(0)?, arg(1)?);
            let tiles = mask.numel() > 0 && x.numel() == n && n % mask.numel() == 0;
            tiles.then_some(())?;
            let rest = [x.arg(), mask.arg()].concat();
            let sizes = vec![K::I64(n as i64), K::I64(mask.numel() as i64), K::F32(value)];
            each("masked_fill", [rest, sizes].concat())
        }
        Calc::Embedding { .. } => {
            let (weight, ids) = (arg(0)?, arg(1)?);
            let cols = weight.last();
            (ids.numel() * cols == n).then_some(())?;
            let rows = weight.numel() / cols;
            let rest = [weight.arg(), ids.arg()].concat();
            let sizes = [n, cols, rows].map(|v| K::I64(v as i64));
            each("embedding", [rest, sizes.to_vec()].concat())
        }
        Calc::EmbeddingBackward { .. } => embedding_backward(out, arg(0)?, arg(1)?),
        Calc::Softmax(_) | Calc::LogSoftmax(_) => {
            let x = arg(0)?;
            let log = matches!(calc, Calc::LogSoftmax(_));
            (x.numel() == n).then_some(())?;
            let rows = n / out.last();
            let (kernel, grid, sizes) = softmax_launch(
                ("softmax", "softmax_warps"),
                [x, out],
                rows,
                out.last(),
                log,
            );
            one(kernel, grid, [x.arg().to_vec(), sizes].concat())
        }
        Calc::SoftmaxBackward { .. } | Calc::LogSoftmaxBackward { .. } => {
            let (g, y) = (arg(0)?, arg(1)?);
            let log = matches!(calc, Calc::LogSoftmaxBackward { .. });
            (g.numel() == n && y.numel() == n).then_some(())?;
            let rows = n / out.last();
            let (kernel, grid, sizes) = softmax_launch(
                ("softmax_backward", "softmax_backward_warps"),
                [g, y, out],
                rows,
                out.last(),
                log,
            );
            one(
                kernel,
                grid,
                [g.arg().to_vec(), y.arg().to_vec(), sizes].concat(),
            )
        }
        Calc::Nll { .. } => {
            let (lp, targets, total) = (arg(0)?, arg(1)?, *parts.first()?);
            let classes = lp.last();
            let rows = lp.numel() / classes;
            (targets.numel() == rows && rows > 0).then_some(())?;
            let rest = [total.arg(), lp.arg(), targets.arg()].concat();
            let sizes = vec![K::I64(rows as i64), K::I64(classes as i64)];
            one("nll", Grid::Rows(1), [rest, sizes].concat())
        }
        Calc::NllBackward { .. } => {
            let (grad, targets, weight) = (arg(0)?, arg(1)?, arg(2)?);
            (targets.numel() > 0 && n % targets.numel() == 0).then_some(())?;
            let classes = n / targets.numel();
            let rest = [grad.arg(), targets.arg(), weight.arg()].concat();
            let sizes = vec![K::I64(n as i64), K::I64(classes as i64)];
            each("nll_backward", [rest, sizes].concat())
        }
        Calc::Heads { part, .. } => {
            let x = arg(0)?;
            let &[_, h, s, d] = out.shape else {
                return None;
            };
            let tokens = x.numel() / x.last();
            (tokens * h * d == n && x.last() >= (part as u64 + 1) * h * d).then_some(())?;
            let sizes = [n, s, h, d, x.last(), part as u64].map(|v| K::I64(v as i64));
            each("heads", [x.arg().to_vec(), sizes.to_vec()].concat())
        }
        Calc::MergeHeads(_) => {
            let x = arg(0)?;
            let &[_, h, s, d] = x.shape else {
                return None;
            };
            (x.numel() == n).then_some(())?;
            let sizes = [n, s, h, d].map(|v| K::I64(v as i64));
            each("merge_heads", [x.arg().to_vec(), sizes.to_vec()].concat())
        }
        Calc::Cat(_) => cat(out, args),
        Calc::Norm { bias, .. } => norm::norm(out, parts, args, bias.is_some()),
        Calc::NormBackward { mean, .. } => norm::norm_backward(out, parts, args, mean.is_some()),
        Calc::Linear { .. } => {
            let (x, weight, bias) = (arg(0)?, arg(1)?, arg(2)?);
            let (cols, rows) = (weight.shape.first().copied()?, n / weight.shape[0].max(1));
            (bias.numel() == cols && rows * cols == n).then_some(())?;
            let bias = [
                bias.arg().to_vec(),
                vec![K::I64(n as i64), K::I64(cols as i64)],
            ];
            let fill = launch(
                "bias_rows",
                Grid::Elements(n),
                [vec![o, to], bias.concat()].concat(),
            );
            let product = gemm(out, (x, false), (weight, true), false, 1.0, workspace)?;
            Some(vec![fill, Call::Gemm(product)])
        }
        Calc::Mm {
            ta, tb, batched, ..
        } => {
            let product = gemm(out, (arg(0)?, ta), (arg(1)?, tb), batched, 0.0, workspace)?;
            Some(vec![Call::Gemm(product)])
        }
        Calc::Conv { .. } => cnn::conv(out, args),
        Calc::ConvBackward { input_grad, .. } => cnn::conv_backward(out, parts, args, input_grad),
        Calc::BatchNorm { .. } => cnn::batch_norm(out, parts, args),
        Calc::BatchNormBackward { .. } => cnn::batch_norm_backward(out, parts, args),
        Calc::MaxPool(_) => cnn::max_pool(out, parts, args),
        Calc::MaxPoolBackward { .. } => cnn::max_pool_backward(out, args),
        Calc::Sdpa { heads, .. } => attention::sdpa(out, parts, args, heads),
        Calc::SdpaBackward { .. } => attention::sdpa_backward(out, parts, args, false),
        Calc::SdpaBackwardPacked { .. } => attention::sdpa_backward(out, parts, args, true),
        _ => None,
    }
}

/// Whether some kernel computes ops of `calc`'s kind (shapes aside):
/// what a step must be made of to run on a device alone.
pub fn has_kernel(calc: &Calc) -> bool {
    !matches!(calc, Calc::DynamicMap { .. })
}

/// Parameter `index`'s first values, drawn on the device as
/// `train::init` draws them on the host.
pub fn init(param: Place, rule: Init, seed: u64, index: u64) -> Call {
    let (code, bound) = match rule {
        Init::Uniform(bound) => (0, bound),
        Init::Normal => (1, 0.0),
        Init::Ones => (2, 0.0),
        Init::Zeros => (3, 0.0),
    };
    let n = param.numel();
    let args = [
        param.arg().to_vec(),
        vec![K::I64(n as i64), K::I32(code), K::F32(bound)],
        vec![K::I64(seed as i64), K::I64(index as i64)],
    ];
    launch("init_param", Grid::Elements(n), args.concat())
}

/// `rows` samples of the synthetic set from `start`, drawn into the
/// batch's places: features and labels, or (`sequences`) tokens and next
/// tokens.
pub fn batch(
    sequences: bool,
    [x, y]: [Place; 2],
    set: &Synthetic,
    (start, rows): (u64, u64),
) -> Call {
    let kernel = if sequences {
        "synthetic_sequences"
    } else {
        "synthetic_batch"
    };
    let sizes = [
        start,
        rows,
        set.samples.max(1),
        set.features,
        set.classes.max(1),
        set.seed,
    ];
    let args = [
        x.arg().to_vec(),
        y.arg().to_vec(),
        sizes.map(|v| K::I64(v as i64)).to_vec(),
    ];
    launch(kernel, Grid::Elements(rows * set.features), args.concat())
}

/// `opt.step()`'s update of one parameter in place, as `train::update`
/// computes it; `state` the optimizer's tensors for it, `step` from 1.
pub fn update(
    kind: OptimizerKind,
    (param, grad): (Place, Place),
    state: &[Place],
    step: u32,
    lr: f32,
) -> Option<Call> {
    let n = param.numel();
    (grad.numel() == n && state.iter().all(|s| s.numel() == n)).then_some(())?;
    let tensors = [param.arg(), grad.arg()].concat();
    let grid = Grid::Elements(n);
    match (kind, state) {
        (OptimizerKind::Sgd | OptimizerKind::Momentum, _) => {
            let (buf, momentum) = match (kind, state) {
                (OptimizerKind::Momentum, [buf]) => (*buf, MOMENTUM),
                (OptimizerKind::Sgd, []) => (param, 0.0),
                _ => return None,
            };
            let rest = vec![
                K::I64(n as i64),
                K::F32(lr),
                K::F32(momentum),
                K::I32((step == 1).into()),
            ];
            Some(launch(
                "sgd_update",
                grid,
                [tensors, buf.arg().to_vec(), rest].concat(),
            ))
        }
        (OptimizerKind::Adam | OptimizerKind::Adamw, [m, v]) => {
            let bc1 = 1.0 - BETA1.powi(step as i32);
            let bc2_sqrt = (1.0 - BETA2.powi(step as i32)).sqrt();
            let decay = if kind == OptimizerKind::Adamw {
                ADAMW_WEIGHT_DECAY
            } else {
                0.0
            };
            let rest = [lr, BETA1, BETA2, EPS, bc1, bc2_sqrt, decay].map(K::F32);
            let args = [
                tensors,
                m.arg().to_vec(),
                v.arg().to_vec(),
                vec![K::I64(n as i64)],
                rest.to_vec(),
            ];
            Some(launch("adam_update", grid, args.concat()))
        }
        _ => None,
    }
}

fn launch(kernel: &'static str, grid: Grid, args: Vec<K>) -> Call {
    Call::Launch(Launch { kernel, grid, args })
}

/// `embedding_dense_backward` into a float32 table: zeros, then each row
/// of the gradient added (atomically) into the row its id picks.
fn embedding_backward(out: Place, grad: Place, ids: Place) -> Option<Vec<Call>> {
    let n = out.numel();
    let cols = grad.numel().checked_div(ids.numel())?;
    (out.dtype == Dtype::Float32 && cols > 0 && n % cols == 0).then_some(())?;
    let zero = vec![K::Ptr(out.at), K::I32(0), K::I64(n as i64), K::F32(0.0)];
    let sizes = [grad.numel(), cols, n / cols].map(|v| K::I64(v as i64));
    let add = [
        vec![K::Ptr(out.at)],
        grad.arg().to_vec(),
        ids.arg().to_vec(),
        sizes.to_vec(),
    ];
    Some(vec![
        launch("fill", Grid::Elements(n), zero),
        launch(
            "embedding_backward",
            Grid::Elements(grad.numel()),
            add.concat(),
        ),
    ])
}

/// The three q/k/v gradients into thirds of each token's row.
fn cat(out: Place, grads: &[Place]) -> Option<Vec<Call>> {
    let row = out.last();
    let width = row / 3;
    let tokens = out.numel() / row;
    let mut calls = Vec::with_capacity(3);
    for (p, part) in grads.iter().take(3).enumerate() {
        (part.numel() == tokens * width).then_some(())?;
        let (s, h, d) = match *part.shape {
            [_, h, s, d] => (s, h, d),
            _ => (1, 0, 1),
        };
        let sizes = [part.numel(), s, h, d, row, p as u64].map(|v| K::I64(v as i64));
        let args = [out.arg().to_vec(), part.arg().to_vec(), sizes.to_vec()].concat();
        calls.push(launch("cat_part", Grid::Elements(part.numel()), args));
    }
    (calls.len() == 3).then_some(calls)
}

/// `out` (row-major, m x n) = op(a) · op(b) + beta · out, as cuBLAS's
/// column-major call: `outᵀ = op(b)ᵀ · op(a)ᵀ`, so b is its first
/// operand and a its second, each with its row length as the leading
/// dimension. Batched over the leading dimensions when `batched`.
fn gemm(
    out: Place,
    (a, ta): (Place, bool),
    (b, tb): (Place, bool),
    batched: bool,
    beta: f32,
    workspace: Option<(u64, u64)>,
) -> Option<GemmEx> {
    let split = |v: &Place| -> Option<(u64, u64, u64)> {
        if batched {
            let s = v.shape;
            let (r, c) = (*s.get(s.len().checked_sub(2)?)?, *s.last()?);
            Some((v.numel() / (r * c).max(1), r, c))
        } else {
            let (r, c) = v.matrix();
            Some((1, r, c))
        }
    };
    let ((batch, ra, ca), (batch_b, rb, cb)) = (split(&a)?, split(&b)?);
    let (m, k) = if ta { (ca, ra) } else { (ra, ca) };
    let (k2, n) = if tb { (cb, rb) } else { (rb, cb) };
    let fits = k == k2 && batch == batch_b && batch * m * n == out.numel();
    (fits && m > 0 && n > 0).then_some(())?;
    let matrix = |p: &Place, ld: u64, stride: u64| Matrix {
        at: p.at,
        dtype: p.dtype,
        ld,
        stride,
    };
    Some(GemmEx {
        transa: tb,
        transb: ta,
        m: n,
        n: m,
        k,
        a: matrix(&b, cb, rb * cb),
        b: matrix(&a, ca, ra * ca),
        c: matrix(&out, n, m * n),
        batch,
        alpha: 1.0,
        beta,
        workspace,
    })
}

pub mod attention;
mod cnn;
mod norm;
#[cfg(test)]
mod tests;
