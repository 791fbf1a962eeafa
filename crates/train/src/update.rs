//! The optimizers' updates on the CPU as `torch.optim` defines them: one
//! parameter's values moved by its gradient and its state, when a step
//! computed numbers.

use super::OptimizerKind;

/// Every parameter's values (or gradients), in `parameters()` order.
pub type Params = Vec<Vec<f32>>;

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

    #[test]
    fn each_rule_moves_a_parameter_as_torch_optim_does() {
        let (g, lr) = ([0.5f32, -1.0], 0.1);
        let mut p = [1.0f32, 2.0];
        update(OptimizerKind::Sgd, &mut p, &g, &mut [], 1, lr);
        assert_eq!(p, [0.95, 2.1]);
        // Momentum's buffer starts as the first gradient.
        let (mut p, mut buf) = ([1.0f32, 2.0], [vec![0.0f32; 2]]);
        update(OptimizerKind::Momentum, &mut p, &g, &mut buf, 1, lr);
        update(OptimizerKind::Momentum, &mut p, &g, &mut buf, 2, lr);
        assert_eq!(buf[0], [0.5 * 0.9 + 0.5, -0.9 - 1.0]);
        // Adam's first step moves each value by about lr, against its
        // gradient's sign.
        let (mut p, mut state) = ([1.0f32, 2.0], [vec![0.0f32; 2], vec![0.0f32; 2]]);
        update(OptimizerKind::Adam, &mut p, &g, &mut state, 1, lr);
        assert!(
            (p[0] - 0.9).abs() < 1e-6 && (p[1] - 2.1).abs() < 1e-6,
            "{p:?}"
        );
        // AdamW decays the weights first.
        let (mut q, mut state) = ([1.0f32, 2.0], [vec![0.0f32; 2], vec![0.0f32; 2]]);
        update(OptimizerKind::Adamw, &mut q, &g, &mut state, 1, lr);
        assert!((q[0] - (0.9 - 0.1 * 0.01)).abs() < 1e-6, "{q:?}");
    }
}
