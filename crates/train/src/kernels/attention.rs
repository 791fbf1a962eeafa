//! Fused causal attention as the GPU computes it (`train::cpu::attention`
//! on the CPU): the output and its log-sum-exp, then the gradients of q,
//! k and v, as B x H x S x D heads (the flash and cuDNN kernels) or in one
//! buffer in the projection's layout (the memory-efficient kernel's).
//! One block a row of one head, the row's scores held in shared memory;
//! the log-sum-exp's padded rows (the memory-efficient kernel's) written
//! as zeros, as the CPU has them.

use super::{launch, Place};
use vramlab_device::compute::{Call, Grid, KernelArg as K};

/// The longest sequence a block holds the scores of (`ATTN_ROW` in the
/// source); a longer one is computed on the host.
pub const ATTN_ROW: u64 = 2048;

/// Heads, sequence, head size, and the rows of the log-sum-exp.
struct Shape {
    h: u64,
    s: u64,
    d: u64,
    rows: u64,
}

impl Shape {
    /// Its size arguments and 1 / sqrt(d) as the CPU rounds it.
    fn args(&self) -> Vec<K> {
        let scale = (1.0 / (self.d as f64).sqrt()) as f32;
        let sizes = [self.h, self.s, self.d, self.rows].map(|v| K::I64(v as i64));
        [sizes.to_vec(), vec![K::F32(scale)]].concat()
    }

    fn fits(&self) -> bool {
        self.h > 0 && self.d > 0 && (1..=ATTN_ROW).contains(&self.s) && self.rows >= self.s
    }
}

/// The output (B x S x width) and the log-sum-exp (`parts`: B x H x
/// rows) of causal attention with `heads` heads on a B x S x 3·width
/// projection.
pub(super) fn sdpa(out: Place, parts: &[Place], args: &[Place], heads: u64) -> Option<Vec<Call>> {
    let (qkv, lse) = (*args.first()?, *parts.first()?);
    let &[b, s, width] = out.shape else {
        return None;
    };
    let &[_, _, rows] = lse.shape else {
        return None;
    };
    let shape = Shape {
        h: heads,
        s,
        d: width / heads.max(1),
        rows,
    };
    let fits = shape.fits() && shape.h * shape.d == width && qkv.numel() == 3 * out.numel();
    (fits && lse.numel() == b * heads * rows).then_some(())?;
    let tensors = [out, lse, qkv].map(|t| t.arg()).concat();
    Some(vec![launch(
        "sdpa_forward",
        Grid::Rows(b * shape.h * s),
        [tensors, shape.args()].concat(),
    )])
}

/// The gradients of q, k and v: into `out` and `parts` as heads, or
/// (`packed`) all three into `out` in the projection's layout. Operands:
/// the output's gradient, the projection, the output, the log-sum-exp.
pub(super) fn sdpa_backward(
    out: Place,
    parts: &[Place],
    args: &[Place],
    packed: bool,
) -> Option<Vec<Call>> {
    let [g, qkv, o, lse] = [0, 1, 2, 3].map(|i| args.get(i).copied());
    let (g, qkv, o, lse) = (g?, qkv?, o?, lse?);
    let &[b, h, rows] = lse.shape else {
        return None;
    };
    let width = *o.shape.last()?;
    let s = o.numel().checked_div(b * width)?;
    let shape = Shape {
        h,
        s,
        d: width / h.max(1),
        rows,
    };
    let same = g.numel() == o.numel() && qkv.numel() == 3 * o.numel();
    (shape.fits() && shape.h * shape.d == width && same).then_some(())?;
    let (dq, dk, dv) = match packed {
        true => (out, out, out),
        false => (out, *parts.first()?, *parts.get(1)?),
    };
    let each = if packed { 3 * o.numel() } else { o.numel() };
    [dq, dk, dv]
        .iter()
        .all(|t| t.numel() == each)
        .then_some(())?;
    let read = [g, qkv, o, lse].map(|t| t.arg()).concat();
    let rest = [shape.args(), vec![K::I32(packed.into())]].concat();
    let grid = Grid::Rows(b * h * s);
    Some(vec![
        launch(
            "sdpa_backward_q",
            grid,
            [dq.arg().to_vec(), read.clone(), rest.clone()].concat(),
        ),
        launch(
            "sdpa_backward_kv",
            grid,
            [dk.arg().to_vec(), dv.arg().to_vec(), read, rest].concat(),
        ),
    ])
}
