//! The CNN's pieces: a 3x3 convolution with padding 1, batch norm with the
//! batch's statistics (`BatchNorm2d` in training, epsilon 1e-5), ReLU's
//! backward and 2x2 max pooling (the first maximum of a window wins, its
//! index counted within the input's plane, as PyTorch's kernel does).

use super::dense::Out;
use super::View;

const BATCH_NORM_EPS: f32 = 1e-5;

/// Batch, channels, height, width.
fn nchw(shape: &[u64]) -> Result<[usize; 4], &'static str> {
    match *shape {
        [n, c, h, w] => Ok([n as usize, c as usize, h as usize, w as usize]),
        _ => Err("reads maps that are not N x C x H x W"),
    }
}

/// The 3x3 neighbourhood of (`y`, `x`) inside an `h` x `w` plane: each
/// tap's offset in the kernel and position in the plane.
fn taps(y: usize, x: usize, h: usize, w: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..9).filter_map(move |t| {
        let (yy, xx) = ((y + t / 3).checked_sub(1)?, (x + t % 3).checked_sub(1)?);
        (yy < h && xx < w).then_some((t, yy * w + xx))
    })
}

pub(super) fn conv(x: &View, weight: &View, bias: &View) -> Out {
    let [n, ci, h, w] = nchw(x.shape)?;
    let [co, wci, kh, kw] = nchw(weight.shape)?;
    if wci != ci || kh != 3 || kw != 3 || bias.data.len() != co {
        return Err("has a weight that does not fit its input");
    }
    let plane = h * w;
    let mut out = vec![0.0; n * co * plane];
    for b in 0..n {
        for o in 0..co {
            let dst = &mut out[(b * co + o) * plane..][..plane];
            dst.iter_mut().for_each(|v| *v = bias.data[o]);
            for c in 0..ci {
                let src = &x.data[(b * ci + c) * plane..][..plane];
                let k = &weight.data[(o * ci + c) * 9..][..9];
                for (p, v) in dst.iter_mut().enumerate() {
                    *v += taps(p / w, p % w, h, w)
                        .map(|(t, q)| k[t] * src[q])
                        .sum::<f32>();
                }
            }
        }
    }
    Ok(vec![out])
}

/// The input's gradient (when `input_grad`), the weight's and the bias's.
pub(super) fn conv_backward(g: &View, x: &View, weight: &View, input_grad: bool) -> Out {
    let [n, ci, h, w] = nchw(x.shape)?;
    let [co, ..] = nchw(weight.shape)?;
    let plane = h * w;
    if g.data.len() != n * co * plane {
        return Err("reads a gradient of another size");
    }
    let (mut dx, mut dw, mut db) = (
        vec![0.0; x.data.len()],
        vec![0.0; weight.data.len()],
        vec![0.0; co],
    );
    for b in 0..n {
        for (o, bias) in db.iter_mut().enumerate() {
            let go = &g.data[(b * co + o) * plane..][..plane];
            *bias += go.iter().sum::<f32>();
            for c in 0..ci {
                let src = &x.data[(b * ci + c) * plane..][..plane];
                let k = &weight.data[(o * ci + c) * 9..][..9];
                let (kd, xd) = ((o * ci + c) * 9, (b * ci + c) * plane);
                for (p, &gv) in go.iter().enumerate() {
                    for (t, q) in taps(p / w, p % w, h, w) {
                        dw[kd + t] += gv * src[q];
                        dx[xd + q] += gv * k[t];
                    }
                }
            }
        }
    }
    Ok(match input_grad {
        true => vec![dx, dw, db],
        false => vec![dw, db],
    })
}

/// Per channel over the batch and the plane: the output, the mean and the
/// inverse deviation (of the biased variance).
pub(super) fn batch_norm(x: &View, weight: &View, bias: &View) -> Out {
    let [n, c, h, w] = nchw(x.shape)?;
    if weight.data.len() != c || bias.data.len() != c {
        return Err("has a weight that does not fit its channels");
    }
    let plane = h * w;
    let count = (n * plane) as f32;
    let channel =
        |ch: usize| (0..n).flat_map(move |b| (b * c + ch) * plane..(b * c + ch + 1) * plane);
    let mut out = vec![0.0; x.data.len()];
    let (mut means, mut invstds) = (vec![0.0; c], vec![0.0; c]);
    for ch in 0..c {
        let mean = channel(ch).map(|i| x.data[i]).sum::<f32>() / count;
        let var = channel(ch).map(|i| (x.data[i] - mean).powi(2)).sum::<f32>() / count;
        let invstd = 1.0 / (var + BATCH_NORM_EPS).sqrt();
        for i in channel(ch) {
            out[i] = (x.data[i] - mean) * invstd * weight.data[ch] + bias.data[ch];
        }
        (means[ch], invstds[ch]) = (mean, invstd);
    }
    Ok(vec![out, means, invstds])
}

/// The input's, the weight's and the bias's gradients.
pub(super) fn batch_norm_backward(
    g: &View,
    x: &View,
    weight: &View,
    (mean, invstd): (&View, &View),
) -> Out {
    let [n, c, h, w] = nchw(x.shape)?;
    if g.data.len() != x.data.len() || mean.data.len() != c || invstd.data.len() != c {
        return Err("reads operands of other sizes");
    }
    let plane = h * w;
    let count = (n * plane) as f32;
    let channel =
        |ch: usize| (0..n).flat_map(move |b| (b * c + ch) * plane..(b * c + ch + 1) * plane);
    let (mut dx, mut dw, mut db) = (vec![0.0; x.data.len()], vec![0.0; c], vec![0.0; c]);
    for ch in 0..c {
        let (m, inv) = (mean.data[ch], invstd.data[ch]);
        let xhat = |i: usize| (x.data[i] - m) * inv;
        let sum_g: f32 = channel(ch).map(|i| g.data[i]).sum();
        let sum_gx: f32 = channel(ch).map(|i| g.data[i] * xhat(i)).sum();
        for i in channel(ch) {
            dx[i] = weight.data[ch] * inv / count * (count * g.data[i] - sum_g - xhat(i) * sum_gx);
        }
        (dw[ch], db[ch]) = (sum_gx, sum_g);
    }
    Ok(vec![dx, dw, db])
}

/// 2x2 max pooling, stride 2: the output and each maximum's index in its
/// input plane.
pub(super) fn max_pool(x: &View) -> Out {
    let [n, c, h, w] = nchw(x.shape)?;
    let (oh, ow) = (h / 2, w / 2);
    let (mut out, mut indices) = (Vec::with_capacity(n * c * oh * ow), Vec::new());
    for p in 0..n * c {
        let src = &x.data[p * h * w..][..h * w];
        for y in 0..oh {
            for xx in 0..ow {
                let window = [0, 1, w, w + 1].map(|o| 2 * y * w + 2 * xx + o);
                let mut best = window[0];
                for &i in &window[1..] {
                    if src[i] > src[best] || src[i].is_nan() {
                        best = i;
                    }
                }
                out.push(src[best]);
                indices.push(best as f32);
            }
        }
    }
    Ok(vec![out, indices])
}

/// Each gradient added at its maximum's place in an input of shape `out`.
pub(super) fn max_pool_backward(g: &View, indices: &View, out: &[u64]) -> Out {
    let [n, c, h, w] = nchw(out)?;
    let per_plane = g.data.len() / (n * c).max(1);
    if g.data.len() != indices.data.len() {
        return Err("reads indices of another size");
    }
    let mut dx = vec![0.0; n * c * h * w];
    for (k, (&gv, &i)) in g.data.iter().zip(indices.data).enumerate() {
        let at = (k / per_plane.max(1)) * h * w + i as usize;
        *dx.get_mut(at).ok_or("a pooling index outside its plane")? += gv;
    }
    Ok(vec![dx])
}
