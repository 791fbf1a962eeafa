//! Elementwise ops, sums over rows, matrix products, log-softmax and the NLL loss,
//! forward and backward, as PyTorch defines them: what every kind's step
//! computes (an MLP's whole).

use super::View;
use crate::kinds::step::{Arg, Calc, Program};

/// An op's outputs, or what is wrong with its operands.
pub type Out = Result<Vec<Vec<f32>>, &'static str>;

/// `f` of two same-sized operands.
pub(super) fn zip(a: &View, b: &View, f: impl Fn(f32, f32) -> f32) -> Out {
    if a.data.len() != b.data.len() {
        return Err("reads operands of other sizes");
    }
    Ok(vec![a
        .data
        .iter()
        .zip(b.data)
        .map(|(&x, &y)| f(x, y))
        .collect()])
}

/// `x` summed over its leading dimensions down to `numel` elements.
pub(super) fn sum_to(x: &View, numel: usize) -> Out {
    if numel == 0 || x.data.len() % numel != 0 {
        return Err("sums to a size that does not tile its input");
    }
    let mut out = vec![0.0; numel];
    for chunk in x.data.chunks(numel) {
        out.iter_mut().zip(chunk).for_each(|(o, v)| *o += v);
    }
    Ok(vec![out])
}

/// A tensor as a matrix: an image batch (4-D) as `nn.Flatten` views it
/// (a row per image), anything else with its last dimension as columns.
fn matrix(v: &View) -> (usize, usize) {
    let n = v.data.len();
    let cols = match v.shape.len() {
        4 => n / (v.shape[0] as usize).max(1),
        _ => v.last(),
    };
    (n / cols.max(1), cols)
}

/// `a @ b`, each transposed when asked; batched over the leading
/// dimensions of both when `batched`.
pub(super) fn mm((a, ta): (&View, bool), (b, tb): (&View, bool), batched: bool) -> Out {
    let split = |v: &View| -> (usize, usize, usize) {
        // Only attention's products are batched (not in the page's build).
        if batched && cfg!(feature = "kinds-arithmetic") {
            let s = v.shape;
            let (r, c) = (s[s.len() - 2] as usize, s[s.len() - 1] as usize);
            (v.data.len() / (r * c).max(1), r, c)
        } else {
            let (r, c) = matrix(v);
            (1, r, c)
        }
    };
    let ((batch, ra, ca), (batch_b, rb, cb)) = (split(a), split(b));
    let (m, k) = if ta { (ca, ra) } else { (ra, ca) };
    let (k2, n) = if tb { (cb, rb) } else { (rb, cb) };
    if k != k2 || batch != batch_b {
        return Err("multiplies matrices whose sizes do not match");
    }
    let mut out = vec![0.0; batch * m * n];
    for i in 0..batch {
        let (a, b) = (&a.data[i * m * k..][..m * k], &b.data[i * k * n..][..k * n]);
        gemm(a, b, (m, k, n), (ta, tb), &mut out[i * m * n..][..m * n]);
    }
    Ok(vec![out])
}

/// `out = op(a) @ op(b)`: `a` is m x k (k x m when transposed), `b` is
/// k x n (n x k when transposed).
fn gemm(
    a: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
    (ta, tb): (bool, bool),
    out: &mut [f32],
) {
    let at = |i: usize, p: usize| if ta { a[p * m + i] } else { a[i * k + p] };
    if tb {
        for i in 0..m {
            for j in 0..n {
                let row = &b[j * k..(j + 1) * k];
                out[i * n + j] = (0..k).map(|p| at(i, p) * row[p]).sum();
            }
        }
        return;
    }
    for i in 0..m {
        let o = &mut out[i * n..(i + 1) * n];
        for p in 0..k {
            let x = at(i, p);
            if x != 0.0 {
                o.iter_mut()
                    .zip(&b[p * n..(p + 1) * n])
                    .for_each(|(o, b)| *o += x * b);
            }
        }
    }
}

/// `x @ weight.T + bias`.
pub(super) fn linear(x: &View, weight: &View, bias: &View) -> Out {
    let (fan_out, fan_in) = (weight.shape[0] as usize, weight.last());
    if fan_in == 0 || x.data.len() % fan_in != 0 || bias.data.len() != fan_out {
        return Err("has a weight that does not fit its input");
    }
    let rows = x.data.len() / fan_in;
    let mut out = vec![0.0; rows * fan_out];
    gemm(
        x.data,
        weight.data,
        (rows, fan_in, fan_out),
        (false, true),
        &mut out,
    );
    for row in out.chunks_mut(fan_out) {
        row.iter_mut().zip(bias.data).for_each(|(o, b)| *o += b);
    }
    Ok(vec![out])
}

/// Log-softmax over the last dimension.
pub(super) fn log_softmax(x: &View) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.data.len());
    for row in x.data.chunks(x.last().max(1)) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|v| libm::expf(v - max)).sum();
        let log_sum = libm::logf(sum) + max;
        out.extend(row.iter().map(|v| v - log_sum));
    }
    out
}

pub(super) fn log_softmax_backward(g: &View, out: &View) -> Out {
    rowwise(g, out, |g, y, o| {
        let sum: f32 = g.iter().sum();
        o.extend(g.iter().zip(y).map(|(g, y)| g - libm::expf(*y) * sum));
    })
}

/// `f` over each row of two same-shaped operands.
pub(super) fn rowwise(a: &View, b: &View, f: impl Fn(&[f32], &[f32], &mut Vec<f32>)) -> Out {
    let n = a.last().max(1);
    if a.data.len() != b.data.len() {
        return Err("reads operands of other sizes");
    }
    let mut out = Vec::with_capacity(a.data.len());
    for (ra, rb) in a.data.chunks(n).zip(b.data.chunks(n)) {
        f(ra, rb, &mut out);
    }
    Ok(vec![out])
}

/// NLL's mean over the rows and its total weight (the row count).
pub(super) fn nll(log_probs: &View, targets: &View) -> Out {
    let classes = log_probs.last().max(1);
    let rows = log_probs.data.len() / classes;
    if targets.data.len() != rows {
        return Err("has labels for another number of rows");
    }
    let mut total = 0.0;
    for (row, &t) in log_probs.data.chunks(classes).zip(targets.data) {
        total -= row
            .get(t as usize)
            .ok_or("reads a label outside its classes")?;
    }
    Ok(vec![vec![total / rows as f32], vec![rows as f32]])
}

/// NLL's backward: `-grad / total_weight` at each row's label.
pub(super) fn nll_backward(grad: &View, targets: &View, weight: &View, numel: usize) -> Out {
    let rows = targets.data.len().max(1);
    let classes = numel / rows;
    let scale = -grad.data[0] / weight.data[0];
    let mut out = vec![0.0; numel];
    for (r, &t) in targets.data.iter().enumerate() {
        if t as usize >= classes {
            return Err("reads a label outside its classes");
        }
        out[r * classes + t as usize] = scale;
    }
    Ok(vec![out])
}

/// Two per multiply-add of allocation `i`'s op, its other outputs
/// included; `params`: the parameters' shapes.
pub(super) fn op_flops(program: &Program, params: &[Vec<u64>], i: usize) -> u64 {
    let a = &program.allocs[i];
    let out: u64 = a.shape.iter().product();
    let shape = |arg| match arg {
        Arg::T(j) => program.allocs[j].shape.as_slice(),
        Arg::Param(p) | Arg::Grad(p) => params.get(p).map_or(&[][..], Vec::as_slice),
        Arg::Batch(_) | Arg::State { .. } => &[],
    };
    let last = |arg| shape(arg).last().copied().unwrap_or(1);
    let numel = |arg| shape(arg).iter().product::<u64>();
    let macs = match a.calc {
        Calc::Linear { weight, .. } => out.saturating_mul(last(weight)),
        // The inner dimension: `a`'s columns, or its rows when transposed.
        Calc::Mm {
            a: x, ta: false, ..
        } => out.saturating_mul(last(x)),
        Calc::Mm { a: x, ta: true, .. } => out.saturating_mul(numel(x) / last(x).max(1)),
        Calc::Conv { weight, .. } => out.saturating_mul(numel(weight) / shape(weight)[0].max(1)),
        Calc::ConvBackward {
            grad,
            weight,
            input_grad,
            ..
        } => numel(grad)
            .saturating_mul(numel(weight) / shape(weight)[0].max(1))
            .saturating_mul(1 + u64::from(input_grad)),
        // Two products of S x S per head, five backward.
        Calc::Sdpa { qkv, .. } => out.saturating_mul(shape(qkv).get(1).copied().unwrap_or(1)) * 2,
        // (The packed buffer holds all three gradients: a third each.)
        Calc::SdpaBackwardPacked { qkv, .. } => {
            (out / 3).saturating_mul(shape(qkv).get(1).copied().unwrap_or(1)) * 5
        }
        Calc::SdpaBackward { qkv, .. } => {
            out.saturating_mul(shape(qkv).get(1).copied().unwrap_or(1)) * 5
        }
        _ => out / 2,
    };
    macs.saturating_mul(2)
}
