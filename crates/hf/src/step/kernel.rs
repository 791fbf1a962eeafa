//! `scaled_dot_product_attention`'s kernel in a training step, as each
//! allocates (the kernel picked by `kinds::step::sdp`, the sizes as
//! `kinds::step::fused` measured them): the outputs Python drops at once
//! but the node saves (the log-sum-exp, the Philox seed and offset), and
//! the backward's gradients with the kernel's buffers for the call.
//! Grouped-query attention runs with `enable_gqa` (transformers passes it
//! when there is no mask): the CUDA kernels take the gradients of the
//! keys and values at every query head, summed to theirs.

use super::tape::{Sid, Tape, T};
use super::Run;
use crate::config::HfConfig;
use vramlab_train::kinds::step::sdp::Kernel;

fn round_up(n: u64, m: u64) -> u64 {
    n.div_ceil(m) * m
}

/// The aten ops of the kernel's forward and backward, the CPU's flash
/// kernel by its own name (the traces').
fn names(kernel: Kernel) -> (&'static str, &'static str) {
    match kernel {
        Kernel::CpuFlash => (
            "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_flash_attention_for_cpu_backward",
        ),
        k => k.aten_ops(),
    }
}

/// The kernel a step's attention runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Sdpa(pub Kernel);

impl Sdpa {
    /// The forward: every output, the attention output first.
    pub fn forward(self, t: &mut Tape<'_>, c: &HfConfig, r: Run, q: T, k: T, v: T) -> Vec<T> {
        let (fwd, back) = names(self.0);
        let (b, n) = (r.batch, r.seq);
        let align = if self.0 == Kernel::Efficient { 32 } else { 1 };
        let lse = b * c.heads * round_up(n, align) * 4;
        let philox = matches!(self.0, Kernel::Flash | Kernel::Cudnn);
        let mut outputs = vec![(fwd, q.bytes), (fwd, lse)];
        if philox {
            outputs.insert(0, (fwd, 8));
            outputs.insert(0, (fwd, 8));
        }
        // Released by name: `key_`, `query_`, `value_`, `logsumexp_`,
        // `output_`, `philox_offset_`, `philox_seed_`.
        let save: Vec<usize> = if philox { vec![3, 2, 1, 0] } else { vec![1, 0] };
        let kernel = self.0;
        let groups = c.heads / c.kv_heads;
        let rows = round_up(n, 128);
        let d = c.head_dim;
        let heads = c.heads;
        let [qb, kb, vb] = [q.bytes, k.bytes, v.bytes];
        let mut out = t.op(
            &outputs,
            &[q, k, v],
            &[k.s, q.s, v.s],
            &save,
            move |t, _| {
                let wide = |b: u64| b * groups;
                match kernel {
                    Kernel::Efficient => {
                        // One buffer holds the three gradients.
                        let packed = t.grad(0, back, qb + wide(kb) + wide(vb));
                        t.hold(packed);
                        t.hold(packed);
                        vec![Some(packed), Some(packed), Some(packed)]
                    }
                    Kernel::Flash => {
                        let dq = t.grad(0, back, qb);
                        let dk = t.temp(back, wide(kb));
                        let dv = t.temp(back, wide(vb));
                        let softmax_d = t.temp(back, b * heads * rows * 4);
                        let cols = if d <= 192 { round_up(d, 32) } else { 256 };
                        let accum = t.temp(back, b * rows * heads * cols * 4);
                        t.release(accum);
                        t.release(softmax_d);
                        let [dk, dv] =
                            [(dk, kb), (dv, vb)].map(|(g, bytes)| summed(t, g, groups, bytes));
                        vec![Some(dq), Some(dk), Some(dv)]
                    }
                    _ => {
                        let dq = t.grad(0, back, qb);
                        let dk = t.grad(1, back, kb);
                        let dv = t.grad(2, back, vb);
                        vec![Some(dq), Some(dk), Some(dv)]
                    }
                }
            },
        );
        if philox {
            out.rotate_left(2);
        }
        out
    }
}

/// A key or value gradient computed at every query head, summed to its
/// own heads when they are shared.
fn summed(t: &mut Tape<'_>, g: Sid, groups: u64, bytes: u64) -> Sid {
    if groups == 1 {
        return g;
    }
    let s = t.temp("sum", bytes);
    t.release(g);
    s
}
