//! A transformer's ops beyond the dense products: sums of two tensors (the
//! residual stream, LoRA's branch), embeddings, LayerNorm
//! and RMSNorm, GELU, the causal mask's triangle and softmax, forward and
//! backward, as PyTorch defines them (LayerNorm's epsilon 1e-5, RMSNorm's
//! float32 machine epsilon, GELU's exact erf form).

use super::dense::{rowwise, Out};
use super::View;

const LAYER_NORM_EPS: f32 = 1e-5;

/// `a + b`, the smaller repeated over the larger's leading dimensions.
pub(super) fn add(a: &View, b: &View) -> Out {
    let (big, small) = match a.data.len() >= b.data.len() {
        true => (a.data, b.data),
        false => (b.data, a.data),
    };
    if small.is_empty() || big.len() % small.len() != 0 {
        return Err("adds tensors that do not tile");
    }
    let n = small.len();
    Ok(vec![big
        .iter()
        .enumerate()
        .map(|(i, v)| v + small[i % n])
        .collect()])
}
/// `nn.RMSNorm(eps=None)`: `torch.finfo(torch.float32).eps`.
const RMS_NORM_EPS: f32 = f32::EPSILON;

/// Rows of `weight` picked by `ids`.
pub(super) fn embedding(weight: &View, ids: &View) -> Out {
    let d = weight.last();
    let rows = weight.data.len() / d.max(1);
    let mut out = Vec::with_capacity(ids.data.len() * d);
    for &id in ids.data {
        let r = id as usize;
        if id < 0.0 || r >= rows {
            return Err("picks an id outside its table");
        }
        out.extend_from_slice(&weight.data[r * d..(r + 1) * d]);
    }
    Ok(vec![out])
}

/// Each row of `grad` added into the row of a `numel`-element table its
/// id picks.
pub(super) fn embedding_backward(grad: &View, ids: &View, numel: usize) -> Out {
    let d = grad.data.len() / ids.data.len().max(1);
    let mut out = vec![0.0; numel];
    for (r, &id) in ids.data.iter().enumerate() {
        let at = id as usize * d;
        let row = out
            .get_mut(at..at + d)
            .ok_or("picks an id outside its table")?;
        row.iter_mut()
            .zip(&grad.data[r * d..(r + 1) * d])
            .for_each(|(o, g)| *o += g);
    }
    Ok(vec![out])
}

/// LayerNorm (with a bias) or RMSNorm over the last dimension: the output,
/// (LayerNorm) the mean, the inverse deviation.
pub(super) fn norm(x: &View, weight: &View, bias: Option<&View>) -> Out {
    let d = weight.data.len();
    if d == 0 || x.data.len() % d != 0 {
        return Err("has a weight that does not fit its input");
    }
    let (mut out, mut means, mut rstds) = (Vec::with_capacity(x.data.len()), vec![], vec![]);
    for row in x.data.chunks(d) {
        let mean = match bias {
            Some(_) => row.iter().sum::<f32>() / d as f32,
            None => 0.0,
        };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let eps = if bias.is_some() {
            LAYER_NORM_EPS
        } else {
            RMS_NORM_EPS
        };
        let rstd = 1.0 / (var + eps).sqrt();
        for (j, v) in row.iter().enumerate() {
            let b = bias.map_or(0.0, |b| b.data[j]);
            out.push((v - mean) * rstd * weight.data[j] + b);
        }
        means.push(mean);
        rstds.push(rstd);
    }
    Ok(match bias {
        Some(_) => vec![out, means, rstds],
        None => vec![out, rstds],
    })
}

/// What a norm's backward reads.
pub(super) struct NormSaved<'a> {
    pub x: &'a View<'a>,
    /// LayerNorm's mean; RMSNorm has none.
    pub mean: Option<&'a View<'a>>,
    pub rstd: &'a View<'a>,
    pub weight: &'a View<'a>,
}

/// The input's gradient, the weight's, and (LayerNorm) the bias's.
pub(super) fn norm_backward(g: &View, s: &NormSaved) -> Out {
    let d = s.weight.data.len();
    if d == 0 || g.data.len() != s.x.data.len() || s.x.data.len() / d != s.rstd.data.len() {
        return Err("reads operands of other sizes");
    }
    let (mut dx, mut dw, mut db) = (vec![0.0; g.data.len()], vec![0.0; d], vec![0.0; d]);
    for (r, (gr, xr)) in g.data.chunks(d).zip(s.x.data.chunks(d)).enumerate() {
        let mean = s.mean.map_or(0.0, |m| m.data[r]);
        let rstd = s.rstd.data[r];
        let xhat: Vec<f32> = xr.iter().map(|v| (v - mean) * rstd).collect();
        let dxhat: Vec<f32> = gr.iter().zip(s.weight.data).map(|(g, w)| g * w).collect();
        let mean_dxhat = match s.mean {
            Some(_) => dxhat.iter().sum::<f32>() / d as f32,
            None => 0.0,
        };
        let mean_dot = dxhat.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f32>() / d as f32;
        for j in 0..d {
            dx[r * d + j] = rstd * (dxhat[j] - mean_dxhat - xhat[j] * mean_dot);
            dw[j] += gr[j] * xhat[j];
            db[j] += gr[j];
        }
    }
    Ok(match s.mean {
        Some(_) => vec![dx, dw, db],
        None => vec![dx, dw],
    })
}

/// GELU, `0.5 x (1 + erf(x / sqrt 2))`.
pub(super) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// GELU's derivative.
pub(super) fn gelu_grad(x: f32) -> f32 {
    let cdf = 0.5 * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2));
    let pdf = libm::expf(-0.5 * x * x) * 0.398_942_3;
    cdf + x * pdf
}

/// The lower triangle (the diagonal included) of a square's ones.
pub(super) fn tril(x: &View) -> Vec<f32> {
    let n = x.last();
    x.data
        .iter()
        .enumerate()
        .map(|(i, &v)| if i % n <= i / n % n { v } else { 0.0 })
        .collect()
}

/// Softmax over the last dimension.
pub(super) fn softmax(x: &View) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.data.len());
    for row in x.data.chunks(x.last().max(1)) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = row.iter().map(|v| libm::expf(v - max)).collect();
        let sum: f32 = exps.iter().sum();
        out.extend(exps.iter().map(|e| e / sum));
    }
    out
}

pub(super) fn softmax_backward(g: &View, y: &View) -> Out {
    rowwise(g, y, |g, y, out| {
        let dot: f32 = g.iter().zip(y).map(|(g, y)| g * y).sum();
        out.extend(g.iter().zip(y).map(|(g, y)| y * (g - dot)));
    })
}
