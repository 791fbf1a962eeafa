//! The CNN's ops as the GPU computes them (`train::cpu::conv` on the
//! CPU): the 3x3 convolution and its two backwards, batch norm with the
//! batch's statistics and its backward, 2x2 max pooling and its backward.
//! cuDNN is not used: each is a kernel of [`super::SOURCE`] written as the
//! CPU interpreter computes the op.

use super::{launch, Place};
use vramlab_device::compute::{Call, Grid, KernelArg as K};

/// Batch norm's epsilon, as `cpu::conv` has it (`BatchNorm2d`'s default).
const BATCH_NORM_EPS: f32 = 1e-5;

/// Batch, channels, height, width.
fn nchw(p: &Place) -> Option<[u64; 4]> {
    match *p.shape {
        [n, c, h, w] => Some([n, c, h, w]),
        _ => None,
    }
}

fn sizes<const N: usize>(v: [u64; N]) -> Vec<K> {
    v.iter().map(|&v| K::I64(v as i64)).collect()
}

/// The convolution of `x` by a 3x3 `weight`, padding 1, plus `bias`.
pub(super) fn conv(out: Place, args: &[Place]) -> Option<Vec<Call>> {
    let (x, weight, bias) = (*args.first()?, *args.get(1)?, *args.get(2)?);
    let [n, ci, h, w] = nchw(&x)?;
    let [co, wci, kh, kw] = nchw(&weight)?;
    let fits = wci == ci && (kh, kw) == (3, 3) && bias.numel() == co;
    (fits && out.numel() == n * co * h * w).then_some(())?;
    let tensors = [out, x, weight, bias].map(|t| t.arg()).concat();
    let args = [tensors, sizes([n, ci, co, h, w])].concat();
    Some(vec![launch("conv3x3", Grid::Elements(out.numel()), args)])
}

/// Its backward: the input's gradient into `out` (when `input_grad`),
/// then the weight's and the bias's (`parts`). Operands: grad, x, weight.
pub(super) fn conv_backward(
    out: Place,
    parts: &[Place],
    args: &[Place],
    input_grad: bool,
) -> Option<Vec<Call>> {
    let (g, x, weight) = (*args.first()?, *args.get(1)?, *args.get(2)?);
    let [n, ci, h, w] = nchw(&x)?;
    let [co, ..] = nchw(&weight)?;
    let (dw, db) = match input_grad {
        true => (*parts.first()?, *parts.get(1)?),
        false => (out, *parts.first()?),
    };
    let fits = g.numel() == n * co * h * w && dw.numel() == co * ci * 9 && db.numel() == co;
    fits.then_some(())?;
    let shape = sizes([n, ci, co, h, w]);
    let mut calls = Vec::with_capacity(2);
    if input_grad {
        (out.numel() == x.numel()).then_some(())?;
        let tensors = [out, g, weight].map(|t| t.arg()).concat();
        calls.push(launch(
            "conv3x3_backward_input",
            Grid::Elements(out.numel()),
            [tensors, shape.clone()].concat(),
        ));
    }
    let tensors = [dw, db, g, x].map(|t| t.arg()).concat();
    calls.push(launch(
        "conv3x3_backward_params",
        Grid::Rows(co * ci * 9),
        [tensors, shape].concat(),
    ));
    Some(calls)
}

/// Batch norm: the output, then the per-channel mean and inverse
/// deviation (`parts`). Operands: x, weight, bias.
pub(super) fn batch_norm(out: Place, parts: &[Place], args: &[Place]) -> Option<Vec<Call>> {
    let (x, weight, bias) = (*args.first()?, *args.get(1)?, *args.get(2)?);
    let (mean, invstd) = (*parts.first()?, *parts.get(1)?);
    let [n, c, h, w] = nchw(&x)?;
    let per_channel = [weight, bias, mean, invstd].iter().all(|t| t.numel() == c);
    (per_channel && out.numel() == x.numel()).then_some(())?;
    let tensors = [out, mean, invstd, x, weight, bias]
        .map(|t| t.arg())
        .concat();
    let rest = [sizes([n, c, h * w]), vec![K::F32(BATCH_NORM_EPS)]].concat();
    Some(vec![launch(
        "batch_norm",
        Grid::Rows(c),
        [tensors, rest].concat(),
    )])
}

/// Its backward: the input's gradient, then the weight's and the bias's
/// (`parts`). Operands: grad, x, weight, mean, inverse deviation.
pub(super) fn batch_norm_backward(
    out: Place,
    parts: &[Place],
    args: &[Place],
) -> Option<Vec<Call>> {
    let [g, x, weight, mean, invstd] = [0, 1, 2, 3, 4].map(|i| args.get(i).copied());
    let (g, x, weight, mean, invstd) = (g?, x?, weight?, mean?, invstd?);
    let (dw, db) = (*parts.first()?, *parts.get(1)?);
    let [n, c, h, w] = nchw(&x)?;
    let per_channel = [weight, mean, invstd, dw, db]
        .iter()
        .all(|t| t.numel() == c);
    let same = g.numel() == x.numel() && out.numel() == x.numel();
    (per_channel && same).then_some(())?;
    let tensors = [out, dw, db, g, x, weight, mean, invstd].map(|t| t.arg());
    Some(vec![launch(
        "batch_norm_backward",
        Grid::Rows(c),
        [tensors.concat(), sizes([n, c, h * w])].concat(),
    )])
}

/// 2x2 max pooling, stride 2: the output, then each maximum's index in
/// its input plane (`parts`).
pub(super) fn max_pool(out: Place, parts: &[Place], args: &[Place]) -> Option<Vec<Call>> {
    let (x, indices) = (*args.first()?, *parts.first()?);
    let [n, c, h, w] = nchw(&x)?;
    let pooled = n * c * (h / 2) * (w / 2);
    (out.numel() == pooled && indices.numel() == pooled).then_some(())?;
    let tensors = [out, indices, x].map(|t| t.arg()).concat();
    Some(vec![launch(
        "max_pool2",
        Grid::Elements(pooled),
        [tensors, sizes([n * c, h, w])].concat(),
    )])
}

/// Its backward into `out`, the input's shape. Operands: grad, indices.
pub(super) fn max_pool_backward(out: Place, args: &[Place]) -> Option<Vec<Call>> {
    let (g, indices) = (*args.first()?, *args.get(1)?);
    let [n, c, h, w] = nchw(&out)?;
    let pooled = n * c * (h / 2) * (w / 2);
    (g.numel() == pooled && indices.numel() == pooled).then_some(())?;
    let tensors = [out, g, indices].map(|t| t.arg()).concat();
    Some(vec![launch(
        "max_pool2_backward",
        Grid::Elements(out.numel()),
        [tensors, sizes([n * c, h, w])].concat(),
    )])
}
