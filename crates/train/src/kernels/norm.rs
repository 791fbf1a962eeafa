//! LayerNorm and RMSNorm over a row as the GPU computes them: the output
//! and the saved statistics, then the input's and the parameters'
//! gradients.

use super::{launch, Place, COLS};
use vramlab_device::compute::{Call, Grid, KernelArg as K};

/// LayerNorm's epsilon, and RMSNorm's (float32's machine epsilon), as the
/// CPU interpreter has them.
const LAYER_NORM_EPS: f32 = 1e-5;
const RMS_NORM_EPS: f32 = f32::EPSILON;

/// LayerNorm (`layer`) or RMSNorm: the output, then the mean (LayerNorm)
/// and the inverse deviation.
pub(super) fn norm(out: Place, parts: &[Place], args: &[Place], layer: bool) -> Option<Vec<Call>> {
    let (x, weight) = (*args.first()?, *args.get(1)?);
    let bias = if layer { *args.get(2)? } else { weight };
    let (mean, rstd) = if layer {
        (*parts.first()?, *parts.get(1)?)
    } else {
        (*parts.first()?, *parts.first()?)
    };
    let cols = weight.numel();
    (cols > 0 && x.numel() == out.numel() && out.numel() % cols == 0).then_some(())?;
    let eps = if layer { LAYER_NORM_EPS } else { RMS_NORM_EPS };
    let tensors = [out, mean, rstd, x, weight, bias].map(|t| t.arg()).concat();
    let rest = vec![K::I64(cols as i64), K::I32(layer.into()), K::F32(eps)];
    let rows = out.numel() / cols;
    Some(vec![launch(
        "norm_rows",
        Grid::Rows(rows),
        [tensors, rest].concat(),
    )])
}

/// A norm's backward: the input's gradient, then the weight's and
/// (LayerNorm) the bias's. Operands: grad, x, [mean], rstd, weight.
pub(super) fn norm_backward(
    out: Place,
    parts: &[Place],
    args: &[Place],
    layer: bool,
) -> Option<Vec<Call>> {
    let m = usize::from(layer);
    let (g, x) = (*args.first()?, *args.get(1)?);
    let (rstd, weight) = (*args.get(2 + m)?, *args.get(3 + m)?);
    let mean = if layer { *args.get(2)? } else { rstd };
    let dw = *parts.first()?;
    let db = if layer { *parts.get(1)? } else { dw };
    let cols = weight.numel();
    let same = g.numel() == out.numel() && x.numel() == out.numel();
    (cols > 0 && same && out.numel() % cols == 0).then_some(())?;
    let rows = out.numel() / cols;
    let saved = [g, x, mean, rstd].map(|t| t.arg()).concat();
    let input = [out.arg().to_vec(), saved.clone(), weight.arg().to_vec()].concat();
    let input_rest = vec![K::I64(cols as i64), K::I32(layer.into())];
    let params = [dw.arg().to_vec(), db.arg().to_vec(), saved].concat();
    let params_rest = vec![
        K::I64(cols as i64),
        K::I64(rows as i64),
        K::I32(layer.into()),
    ];
    Some(vec![
        launch(
            "norm_backward_input",
            Grid::Rows(rows),
            [input, input_rest].concat(),
        ),
        launch(
            "norm_backward_params",
            Grid::Rows(cols.div_ceil(COLS)),
            [params, params_rest].concat(),
        ),
    ])
}
