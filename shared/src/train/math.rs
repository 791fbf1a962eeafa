//! The arithmetic of a training step on the CPU, in f32: an MLP's forward
//! and backward with ReLU and softmax cross-entropy, and the optimizers'
//! updates as PyTorch defines them. Used when a step is small enough.

use super::OptimizerKind;

/// Parameters of an MLP: per linear layer a weight (out x in, row-major)
/// and a bias (out), in that order.
pub type Params = Vec<Vec<f32>>;

/// Layer widths: input, hidden..., classes.
pub fn dims_of(params: &Params) -> Vec<usize> {
    let mut dims = Vec::new();
    for l in 0..params.len() / 2 {
        let out = params[2 * l + 1].len();
        let inp = params[2 * l].len() / out;
        if l == 0 {
            dims.push(inp);
        }
        dims.push(out);
    }
    dims
}

/// What backward needs from forward: each layer's input (after ReLU) and
/// the gradient of the mean loss with respect to the logits.
#[derive(Clone, Debug)]
pub struct ForwardCache {
    pub inputs: Vec<Vec<f32>>,
    pub dlogits: Vec<f32>,
    pub batch: usize,
}

/// Forward pass and mean cross-entropy loss for a batch `x` (batch x in)
/// with labels `y`. Returns the loss and the cache for backward.
pub fn forward(params: &Params, x: &[f32], y: &[usize]) -> (f32, ForwardCache) {
    let dims = dims_of(params);
    let batch = y.len();
    let layers = dims.len() - 1;
    let mut inputs = vec![x.to_vec()];
    let mut h = x.to_vec();
    for l in 0..layers {
        let (inp, out) = (dims[l], dims[l + 1]);
        let (w, b) = (&params[2 * l], &params[2 * l + 1]);
        let mut z = vec![0f32; batch * out];
        for r in 0..batch {
            let hr = &h[r * inp..(r + 1) * inp];
            for o in 0..out {
                let wr = &w[o * inp..(o + 1) * inp];
                z[r * out + o] = b[o] + dot(hr, wr);
            }
        }
        if l + 1 < layers {
            z.iter_mut().for_each(|v| *v = v.max(0.0));
            inputs.push(z.clone());
        }
        h = z;
    }
    // Softmax cross-entropy, mean over the batch.
    let classes = dims[layers];
    let mut loss = 0f32;
    let mut dlogits = vec![0f32; batch * classes];
    for r in 0..batch {
        let row = &h[r * classes..(r + 1) * classes];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|v| libm::expf(v - max)).sum();
        let log_sum = libm::logf(sum) + max;
        loss += log_sum - row[y[r]];
        for c in 0..classes {
            let p = libm::expf(row[c] - log_sum);
            dlogits[r * classes + c] = (p - if c == y[r] { 1.0 } else { 0.0 }) / batch as f32;
        }
    }
    (
        loss / batch as f32,
        ForwardCache {
            inputs,
            dlogits,
            batch,
        },
    )
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Gradients of every parameter, in parameter order.
pub fn backward(params: &Params, cache: &ForwardCache) -> Params {
    let dims = dims_of(params);
    let layers = dims.len() - 1;
    let batch = cache.batch;
    let mut grads: Params = params.iter().map(|p| vec![0f32; p.len()]).collect();
    let mut delta = cache.dlogits.clone();
    for l in (0..layers).rev() {
        let (inp, out) = (dims[l], dims[l + 1]);
        let a = &cache.inputs[l];
        let w = &params[2 * l];
        {
            let (gw, gb) = grads.split_at_mut(2 * l + 1);
            let gw = &mut gw[2 * l];
            let gb = &mut gb[0];
            for r in 0..batch {
                let ar = &a[r * inp..(r + 1) * inp];
                for o in 0..out {
                    let d = delta[r * out + o];
                    if d == 0.0 {
                        continue;
                    }
                    gb[o] += d;
                    let row = &mut gw[o * inp..(o + 1) * inp];
                    row.iter_mut().zip(ar).for_each(|(g, x)| *g += d * x);
                }
            }
        }
        if l > 0 {
            let mut prev = vec![0f32; batch * inp];
            for r in 0..batch {
                for o in 0..out {
                    let d = delta[r * out + o];
                    if d == 0.0 {
                        continue;
                    }
                    let wr = &w[o * inp..(o + 1) * inp];
                    let pr = &mut prev[r * inp..(r + 1) * inp];
                    pr.iter_mut().zip(wr).for_each(|(p, w)| *p += d * w);
                }
            }
            // ReLU: the gradient passes where the activation was positive.
            prev.iter_mut()
                .zip(a)
                .for_each(|(p, &x)| *p = if x > 0.0 { *p } else { 0.0 });
            delta = prev;
        }
    }
    grads
}

/// Hyper-parameters of the optimizers (PyTorch's defaults where it has them).
pub const MOMENTUM: f32 = 0.9;
pub const BETA1: f32 = 0.9;
pub const BETA2: f32 = 0.999;
pub const EPS: f32 = 1e-8;
pub const ADAMW_WEIGHT_DECAY: f32 = 0.01;

/// One parameter's update by `torch.optim`'s rule for `kind` at step `t`
/// (from 1): `state` is its state tensors (SGD's momentum buffer, which
/// starts as a copy of the first gradient; Adam's `exp_avg` and
/// `exp_avg_sq`); AdamW's weight decay is decoupled.
pub fn update(
    kind: OptimizerKind,
    p: &mut [f32],
    g: &[f32],
    state: &mut [Vec<f32>],
    t: u32,
    lr: f32,
) {
    match (kind, state) {
        (OptimizerKind::Sgd, _) => p.iter_mut().zip(g).for_each(|(p, g)| *p -= lr * g),
        (OptimizerKind::Momentum, [buf]) => {
            for ((p, g), b) in p.iter_mut().zip(g).zip(buf.iter_mut()) {
                *b = if t == 1 { *g } else { MOMENTUM * *b + g };
                *p -= lr * *b;
            }
        }
        (OptimizerKind::Adam | OptimizerKind::Adamw, [m, v]) => {
            let bc1 = 1.0 - BETA1.powi(t as i32);
            let bc2_sqrt = (1.0 - BETA2.powi(t as i32)).sqrt();
            let step_size = lr / bc1;
            if kind == OptimizerKind::Adamw {
                p.iter_mut()
                    .for_each(|x| *x *= 1.0 - lr * ADAMW_WEIGHT_DECAY);
            }
            for j in 0..p.len() {
                m[j] += (g[j] - m[j]) * (1.0 - BETA1);
                v[j] = v[j] * BETA2 + (1.0 - BETA2) * g[j] * g[j];
                let denom = v[j].sqrt() / bc2_sqrt + EPS;
                p[j] -= step_size * m[j] / denom;
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Params {
        // 2 -> 3 -> 2
        vec![
            vec![0.1, -0.2, 0.3, 0.4, -0.5, 0.6],
            vec![0.0, 0.1, -0.1],
            vec![0.2, -0.3, 0.1, -0.4, 0.5, 0.2],
            vec![0.05, -0.05],
        ]
    }

    #[test]
    fn gradients_match_finite_differences() {
        let params = tiny();
        let x = vec![1.0, 2.0, -1.0, 0.7];
        let y = vec![1, 0];
        let (_, cache) = forward(&params, &x, &y);
        let grads = backward(&params, &cache);
        let h = 1e-3f32;
        for (i, p) in params.iter().enumerate() {
            for j in 0..p.len() {
                let mut plus = params.clone();
                plus[i][j] += h;
                let mut minus = params.clone();
                minus[i][j] -= h;
                let numeric = (forward(&plus, &x, &y).0 - forward(&minus, &x, &y).0) / (2.0 * h);
                assert!(
                    (numeric - grads[i][j]).abs() < 2e-3,
                    "param {i}[{j}]: numeric {numeric}, analytic {}",
                    grads[i][j]
                );
            }
        }
    }

    #[test]
    fn dims_are_read_from_the_parameters() {
        assert_eq!(dims_of(&tiny()), vec![2, 3, 2]);
    }
}
