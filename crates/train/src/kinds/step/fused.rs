//! `scaled_dot_product_attention`'s fused kernels, forward and backward,
//! as each allocates (the kernel from `sdp`):
//!
//! - the CPU's flash kernel and CUDA's flash: the output and a float32
//!   log-sum-exp of B x H x S; backward the gradients of q, k and v apart.
//!   CUDA's flash backward (`mha_bwd` in `flash_api.cpp`) also holds, for
//!   the call, `softmax_d` (B x H x S rounded up to 128, float32) and
//!   `dq_accum` (B x S rounded up to 128 x H x the head size rounded up to
//!   32, or 256 past 192; float32), freed as it returns.
//! - memory-efficient (`_efficient_attention_forward` /
//!   `_efficient_attention_backward` in `attention.cu`,
//!   `attention_backward.cu`): the log-sum-exp's rows padded to 32
//!   (`kAlignLSE`); in halves with a head size past 128 a float32 output
//!   accumulator for the call. Backward: q, k and v views of one packed
//!   projection, so one B x S x 3 x H x D buffer holds their gradients;
//!   `delta` in float32: in halves the kernel computes it into a B x H x S
//!   buffer, in float32 it is `(grad_out * out).sum(-1).transpose(-2,
//!   -1).contiguous()`, whose product and sum live until the copy is made.
//! - cuDNN (`_cudnn_attention_forward`): the output and its softmax
//!   statistics (B x H x S x 1, float32); backward the three gradients.
//!
//! Not counted: the cutlass backward's workspace (`workspace_size()`: its
//! size follows the kernel dispatched and the split-keys heuristic) and
//! cuDNN's per-call workspace (cuDNN's execution plan decides it), and
//! flash's padded copies when the head size is not a multiple of 8.

use super::sdp::{self, Kernel};
use super::{part, Arg, Calc, Tape, H};
use crate::kinds::TransformerShape;
use vramlab_core::types::Dtype;

fn round_up(n: u64, m: u64) -> u64 {
    n.div_ceil(m) * m
}

impl Tape<TransformerShape> {
    /// The kernel this call runs.
    pub(super) fn kernel(&self) -> Kernel {
        let d = self.shape.width / self.shape.heads;
        sdp::select(self.options.gpu, self.low(), d, self.grad)
    }

    fn head_size(&self) -> u64 {
        self.shape.width / self.shape.heads
    }

    /// The kernel's output and log-sum-exp (or softmax statistics), and
    /// the Philox seed and offset that CUDA's flash and cuDNN kernels
    /// return: two int64 scalars allocated first and saved for the
    /// backward (measured on an H100 in float16 and bfloat16,
    /// `tests/golden/workspaces.json` and `gpu_step.json`: two 8-byte
    /// blocks before the output, alive until the backward).
    pub(super) fn fused_forward(&mut self, qkv: H, kernel: Kernel) -> (H, H, Option<[H; 2]>) {
        let align = if kernel == Kernel::Efficient { 32 } else { 1 };
        let (t, op) = (self.shape, kernel.aten_ops().0);
        let philox = matches!(kernel, Kernel::Flash | Kernel::Cudnn).then(|| {
            [(); 2].map(|_| self.alloc_as((op, Calc::Workspace), vec![], Dtype::Int64, self.role))
        });
        let calc = Calc::Sdpa {
            qkv: Arg::T(qkv),
            heads: t.heads,
            lse_align: align,
        };
        let out = self.alloc((op, calc), self.act());
        let rows = round_up(t.seq_len, align);
        let lse = self.alloc_f32((op, part(out, 1)), vec![self.batch, t.heads, rows]);
        let half = self.low() != Dtype::Float32;
        if kernel == Kernel::Efficient && half && self.head_size() > 128 {
            // `kNeedsOutputAccumulatorBuffer`: not one pass over the values.
            let accum = self.alloc_f32((op, Calc::Workspace), self.act());
            self.free(accum);
        }
        (out, lse, philox)
    }

    /// The gradients of q, k and v (as heads, or in one packed buffer),
    /// with the kernel's own buffers for the call.
    pub(super) fn fused_backward(
        &mut self,
        [qkv, out, lse]: [H; 3],
        g: H,
        kernel: Kernel,
    ) -> Vec<H> {
        let op = kernel.aten_ops().1;
        let (grad, qkv_arg) = (Arg::T(g), Arg::T(qkv));
        let (out_arg, lse_arg) = (Arg::T(out), Arg::T(lse));
        if kernel == Kernel::Efficient {
            let calc = Calc::SdpaBackwardPacked {
                grad,
                qkv: qkv_arg,
                out: out_arg,
                lse: lse_arg,
            };
            let chunk = self.alloc((op, calc), self.tokens(3 * self.shape.width));
            self.delta(op);
            return vec![chunk];
        }
        let calc = Calc::SdpaBackward {
            grad,
            qkv: qkv_arg,
            out: out_arg,
            lse: lse_arg,
        };
        let q = self.alloc((op, calc), self.head_dims());
        let k = self.alloc((op, part(q, 1)), self.head_dims());
        let v = self.alloc((op, part(q, 2)), self.head_dims());
        if kernel == Kernel::Flash {
            let (t, d) = (self.shape, self.head_size());
            let rows = round_up(t.seq_len, 128);
            let cols = if d <= 192 { round_up(d, 32) } else { 256 };
            let softmax_d = self.alloc_f32((op, Calc::Workspace), vec![self.batch, t.heads, rows]);
            let shape = vec![self.batch, rows, t.heads, cols];
            let dq_accum = self.alloc_f32((op, Calc::Workspace), shape);
            self.free_all(&[dq_accum, softmax_d]);
        }
        vec![q, k, v]
    }

    /// The efficient kernel's `delta`, alive for the call.
    fn delta(&mut self, op: &'static str) {
        let t = self.shape;
        let per_query = vec![self.batch, t.heads, t.seq_len];
        if self.low() != Dtype::Float32 {
            let delta = self.alloc_f32((op, Calc::Workspace), per_query);
            self.free(delta);
            return;
        }
        let product = self.alloc_f32(("mul", Calc::Workspace), self.act());
        let sum = self.alloc_f32(("sum", Calc::Workspace), self.tokens(t.heads));
        let delta = self.alloc_f32(("clone", Calc::Workspace), per_query);
        self.free_all(&[sum, product, delta]);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{program, Options};
    use crate::kinds::step::{Attention, Op, Program};
    use crate::kinds::{Norm, TransformerShape};
    use vramlab_core::types::Dtype;

    /// One block, head size 64, a sequence of 100 (not a multiple of 32 or
    /// 128), batch 2.
    fn shape() -> TransformerShape {
        TransformerShape {
            layers: 1,
            width: 128,
            heads: 2,
            seq_len: 100,
            vocab: 50,
            mlp_ratio: 4,
            norm: Norm::LayerNorm,
            tied: true,
            lora_rank: 0,
        }
    }

    fn step(gpu: (u32, u32), amp: Option<Dtype>) -> Program {
        let options = Options {
            attention: Attention::Sdpa,
            amp,
            gpu: Some(gpu),
            ..Options::default()
        };
        program(&shape(), 2, options)
    }

    /// Each allocation of `op`'s family in order: (aten op, shape, type).
    fn made(p: &Program, family: &str) -> Vec<(&'static str, Vec<u64>, Dtype)> {
        (p.ops.iter())
            .filter_map(|op| match *op {
                Op::Alloc(i) => Some(&p.allocs[i]),
                _ => None,
            })
            // `delta`'s temporaries are the float32 ones of three dimensions.
            .filter(|a| {
                let delta = ["mul", "sum", "clone"].contains(&a.op) && a.shape.len() == 3;
                a.op.contains(family) || (delta && a.dtype == Dtype::Float32)
            })
            .map(|a| (a.op, a.shape.to_vec(), a.dtype))
            .collect()
    }

    #[test]
    fn the_memory_efficient_kernel_pads_its_log_sum_exp_and_packs_its_gradients() {
        let f32 = Dtype::Float32;
        let (fwd, bwd) = (
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_efficient_attention_backward",
        );
        // A T4 in float32: `delta` from three temporaries.
        let p = step((7, 5), None);
        assert_eq!(
            made(&p, "efficient"),
            [
                (fwd, vec![2, 100, 128], f32),
                (fwd, vec![2, 2, 128], f32),
                (bwd, vec![2, 100, 384], f32),
                ("mul", vec![2, 100, 128], f32),
                ("sum", vec![2, 100, 2], f32),
                ("clone", vec![2, 2, 100], f32),
            ]
        );
        // In float16 the kernel computes `delta` itself.
        let p = step((7, 5), Some(Dtype::Float16));
        let f16 = Dtype::Float16;
        assert_eq!(
            made(&p, "efficient"),
            [
                (fwd, vec![2, 100, 128], f16),
                (fwd, vec![2, 2, 128], f32),
                (bwd, vec![2, 100, 384], f16),
                (bwd, vec![2, 2, 100], f32),
            ]
        );
    }

    #[test]
    fn flash_backward_holds_dq_accum_and_softmax_d_for_the_call() {
        let (f16, f32) = (Dtype::Float16, Dtype::Float32);
        let (fwd, bwd) = (
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_flash_attention_backward",
        );
        let p = step((8, 0), Some(f16));
        let head = vec![2, 2, 100, 64];
        assert_eq!(
            made(&p, "flash"),
            [
                (fwd, vec![], Dtype::Int64),
                (fwd, vec![], Dtype::Int64),
                (fwd, vec![2, 100, 128], f16),
                (fwd, vec![2, 2, 100], f32),
                (bwd, head.clone(), f16),
                (bwd, head.clone(), f16),
                (bwd, head, f16),
                (bwd, vec![2, 2, 128], f32),
                (bwd, vec![2, 128, 2, 64], f32),
            ]
        );
    }

    #[test]
    fn an_h100_runs_cudnn_in_halves_and_a_t4_the_math_kernel_in_bfloat16() {
        let p = step((9, 0), Some(Dtype::Bfloat16));
        assert_eq!(
            made(&p, "cudnn").len(),
            7,
            "Philox seed and offset, output, statistics, three gradients"
        );
        let p = step((7, 5), Some(Dtype::Bfloat16));
        assert!(made(&p, "scaled_dot_product").is_empty());
        assert!(p.allocs.iter().any(|a| a.op == "_softmax"));
    }
}
