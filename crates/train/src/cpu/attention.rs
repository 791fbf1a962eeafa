//! Attention's pieces: q, k and v as heads and back, the causal mask's
//! fill, the fused kernel (`scaled_dot_product_attention(is_causal=True)`)
//! forward and backward, and the join of the three gradients.

use super::dense::Out;
use super::View;

/// Head `part` of a B x S x (parts · width) projection as B x H x S x D
/// (`out`'s shape).
pub(super) fn heads(x: &View, part: usize, out: &[u64]) -> Out {
    let [b, h, s, d] = dims4(out)?;
    let width = h * d;
    let row = x.last();
    if x.data.len() != b * s * row || row < (part + 1) * width {
        return Err("takes a head its input does not have");
    }
    let mut v = Vec::with_capacity(b * h * s * d);
    for bi in 0..b {
        for hi in 0..h {
            for si in 0..s {
                let at = (bi * s + si) * row + part * width + hi * d;
                v.extend_from_slice(&x.data[at..at + d]);
            }
        }
    }
    Ok(vec![v])
}

/// B x H x S x D as B x S x (H · D).
pub(super) fn merge_heads(x: &View) -> Out {
    let [b, h, s, d] = dims4(x.shape)?;
    let mut v = vec![0.0; x.data.len()];
    for bi in 0..b {
        for hi in 0..h {
            for si in 0..s {
                let from = ((bi * h + hi) * s + si) * d;
                let to = (bi * s + si) * h * d + hi * d;
                v[to..to + d].copy_from_slice(&x.data[from..from + d]);
            }
        }
    }
    Ok(vec![v])
}

/// `value` where the mask (repeated over `x`'s leading dimensions) is
/// true, `x` elsewhere.
pub(super) fn masked_fill(x: &View, mask: &View, value: f32) -> Out {
    let m = mask.data.len();
    if m == 0 || x.data.len() % m != 0 {
        return Err("has a mask that does not tile its input");
    }
    let fill = |(i, &v): (usize, &f32)| if mask.data[i % m] != 0.0 { value } else { v };
    Ok(vec![x.data.iter().enumerate().map(fill).collect()])
}

/// The three gradients of the q/k/v split (each B x S x width, or heads)
/// joined along the last dimension into `out` (B x S x 3·width).
pub(super) fn cat(parts: &[View], out: &[u64]) -> Out {
    let row = *out.last().unwrap_or(&0) as usize;
    let width = row / 3;
    let tokens = out.iter().product::<u64>() as usize / row.max(1);
    let mut v = vec![0.0; tokens * row];
    for (p, part) in parts.iter().enumerate() {
        if part.data.len() != tokens * width {
            return Err("joins a part of another size");
        }
        let tokens_layout = merged(part)?;
        for t in 0..tokens {
            v[t * row + p * width..][..width]
                .copy_from_slice(&tokens_layout[t * width..(t + 1) * width]);
        }
    }
    Ok(vec![v])
}

/// A part in the tokens' layout: heads are merged first.
fn merged(part: &View) -> Result<Vec<f32>, &'static str> {
    match part.shape.len() {
        4 => Ok(merge_heads(part)?.remove(0)),
        _ => Ok(part.data.to_vec()),
    }
}

fn dims4(shape: &[u64]) -> Result<[usize; 4], &'static str> {
    match *shape {
        [b, h, s, d] => Ok([b as usize, h as usize, s as usize, d as usize]),
        _ => Err("reads heads that are not B x H x S x D"),
    }
}

/// The shape of one fused attention call: batch, heads, sequence, head
/// size.
struct Dims {
    h: usize,
    s: usize,
    d: usize,
}

impl Dims {
    fn width(&self) -> usize {
        self.h * self.d
    }

    /// Row `i` of head `hi` of part `p` (q, k, v) in the projection.
    fn at(&self, bi: usize, p: usize, hi: usize, i: usize) -> usize {
        (bi * self.s + i) * 3 * self.width() + p * self.width() + hi * self.d
    }

    fn scale(&self) -> f32 {
        (1.0 / (self.d as f64).sqrt()) as f32
    }
}

/// Causal attention with `heads` heads on a B x S x 3·width projection:
/// the output in the tokens' layout (`out`: B x S x width) and the
/// log-sum-exp (B x H x S, each row padded to a multiple of `align`).
pub fn sdpa(qkv: &View, heads: usize, out: &[u64], align: usize) -> Out {
    let (b, s, width) = match *out {
        [b, s, w] => (b as usize, s as usize, w as usize),
        _ => return Err("is not B x S x width"),
    };
    let (h, d) = (heads, width / heads.max(1));
    if qkv.data.len() != b * s * 3 * width || h * d != width {
        return Err("splits its projection into heads that do not fit");
    }
    let dims = Dims { h, s, d };
    let data = qkv.data;
    let mut out = vec![0.0; b * s * width];
    let rows = s.div_ceil(align.max(1)) * align.max(1);
    let mut lse = vec![0.0; b * h * rows];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..s {
                let qi = &data[dims.at(bi, 0, hi, i)..][..d];
                let scores: Vec<f32> = (0..=i)
                    .map(|j| dot(qi, &data[dims.at(bi, 1, hi, j)..][..d]) * dims.scale())
                    .collect();
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = scores.iter().map(|v| libm::expf(v - max)).sum();
                let log_sum = libm::logf(sum) + max;
                lse[(bi * h + hi) * rows + i] = log_sum;
                let o = &mut out[(bi * s + i) * width + hi * d..][..d];
                for (j, sc) in scores.iter().enumerate() {
                    let p = libm::expf(sc - log_sum);
                    let vj = &data[dims.at(bi, 2, hi, j)..][..d];
                    o.iter_mut().zip(vj).for_each(|(o, v)| *o += p * v);
                }
            }
        }
    }
    Ok(vec![out, lse])
}

/// The fused kernel's backward: the gradients of q, k and v, each B x H x
/// S x D, from the output's gradient (tokens' layout), the projection, the
/// output and the log-sum-exp (B x H x its rows, S of each used).
pub fn sdpa_backward(g: &View, qkv: &View, out: &View, lse: &View) -> Out {
    let [b, h, rows] = match *lse.shape {
        [b, h, rows] => [b as usize, h as usize, rows as usize],
        _ => return Err("reads a log-sum-exp that is not B x H x S"),
    };
    let width = out.last();
    let s = out.data.len() / (b * width).max(1);
    if s > rows {
        return Err("reads a log-sum-exp shorter than the sequence");
    }
    let d = width / h.max(1);
    if g.data.len() != b * s * width || qkv.data.len() != 3 * g.data.len() || d * h != width {
        return Err("reads operands of other sizes");
    }
    let dims = Dims { h, s, d };
    let data = qkv.data;
    let mut grads = [(); 3].map(|_| vec![0.0; b * h * s * d]);
    let head = |bi: usize, hi: usize, i: usize| ((bi * h + hi) * s + i) * d;
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..s {
                let tok = (bi * s + i) * width + hi * d;
                let (gi, oi) = (&g.data[tok..][..d], &out.data[tok..][..d]);
                let qi = &data[dims.at(bi, 0, hi, i)..][..d];
                let delta = dot(gi, oi);
                let log_sum = lse.data[(bi * h + hi) * rows + i];
                for j in 0..=i {
                    let (kj, vj) = (
                        &data[dims.at(bi, 1, hi, j)..][..d],
                        &data[dims.at(bi, 2, hi, j)..][..d],
                    );
                    let p = libm::expf(dot(qi, kj) * dims.scale() - log_sum);
                    let ds = p * (dot(gi, vj) - delta) * dims.scale();
                    for t in 0..d {
                        grads[2][head(bi, hi, j) + t] += p * gi[t];
                        grads[0][head(bi, hi, i) + t] += ds * kj[t];
                        grads[1][head(bi, hi, j) + t] += ds * qi[t];
                    }
                }
            }
        }
    }
    Ok(grads.into())
}

/// The memory-efficient kernel's backward: the gradients of q, k and v in
/// one buffer, B x S x 3 x H x D (the tokens' layout of the projection).
pub fn sdpa_backward_packed(g: &View, qkv: &View, out: &View, lse: &View) -> Out {
    let grads = sdpa_backward(g, qkv, out, lse)?;
    let (b, s, width) = (
        lse.shape[0],
        out.data.len() as u64 / (lse.shape[0] * out.last() as u64).max(1),
        out.last() as u64,
    );
    let head = [b, lse.shape[1], s, width / lse.shape[1].max(1)];
    let parts: Vec<View> = grads
        .iter()
        .map(|data| View { data, shape: &head })
        .collect();
    cat(&parts, &[b, s, 3 * width])
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
