//! Which kernel `F.scaled_dot_product_attention(q, k, v, is_causal=True)`
//! runs, as PyTorch 2.15's `sdp_utils.cpp` (`select_sdp_backend`) picks it
//! for this model's call: dense q, k and v of one head size, views of the
//! packed projection (cuDNN's "packed QKV" layout), no mask, no dropout,
//! square sequences.
//!
//! - The order (`priority_order`): cuDNN attention first where
//!   `check_prefer_cudnn_attention` holds (cuDNN newer than 9.15, which
//!   2.15's CUDA 13 wheels ship as 9.26, on compute capability 9.x or
//!   10.x), then flash, then memory-efficient, then math.
//! - cuDNN (`can_use_cudnn_attention`): float16 or bfloat16 (float16 only
//!   below 8.0), compute capability 8.0 to 12.1, head size a multiple of 8
//!   and at most 128 (256 on 9.0 and 10.x with cuDNN after 9.22, where a
//!   backward takes 128 or less, or 256).
//! - Flash (`can_use_flash_attention`): compute capability 8.0 to 12.1,
//!   float16 or bfloat16, head size at most 256; on 8.6–8.9 and 12.x a
//!   step (inputs that need a gradient) takes at most 192, or more than 224.
//! - Memory-efficient (`can_use_mem_efficient_attention`): compute
//!   capability 5.0 to 12.1; float16 or float32 below 8.0, bfloat16 too
//!   from 8.0; head size a multiple of `minimum_gemm_alignment` (4 for
//!   float32 and 8 for halves from 8.0; 8 for halves on 7.x; 1 otherwise).
//! - Math otherwise.

use vramlab_core::types::Dtype;

/// The kernel a call runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernel {
    /// The CPU's flash kernel (where PyTorch's own traces were recorded).
    #[default]
    CpuFlash,
    /// `_scaled_dot_product_flash_attention` on CUDA (FlashAttention 2).
    Flash,
    /// `_scaled_dot_product_efficient_attention` (cutlass, xFormers').
    Efficient,
    /// `_scaled_dot_product_cudnn_attention`.
    Cudnn,
    /// `_scaled_dot_product_attention_math`: the product, softmax and
    /// product as separate ops.
    Math,
}

impl Kernel {
    /// The aten ops of the kernel's forward and backward on CUDA (the
    /// math kernel's written-out ops and the CPU's flash kernel named as
    /// CUDA's flash).
    pub fn aten_ops(self) -> (&'static str, &'static str) {
        match self {
            Kernel::Efficient => (
                "_scaled_dot_product_efficient_attention",
                "_scaled_dot_product_efficient_attention_backward",
            ),
            Kernel::Cudnn => (
                "_scaled_dot_product_cudnn_attention",
                "_scaled_dot_product_cudnn_attention_backward",
            ),
            _ => (
                "_scaled_dot_product_flash_attention",
                "_scaled_dot_product_flash_attention_backward",
            ),
        }
    }

    /// What the kernel is called, for a note.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::CpuFlash => "the CPU's flash kernel",
            Kernel::Flash => "the flash kernel",
            Kernel::Efficient => "the memory-efficient kernel",
            Kernel::Cudnn => "cuDNN's kernel (its workspace not counted)",
            Kernel::Math => "the math kernel (its S x S scores kept, as written out)",
        }
    }
}

/// The kernel for q, k and v of `dtype` and head size `d` on a GPU of
/// compute capability `gpu` (`None`: the CPU); `grad`: the inputs need a
/// gradient (a training step).
pub fn select(gpu: Option<(u32, u32)>, dtype: Dtype, d: u64, grad: bool) -> Kernel {
    let Some(cc) = gpu else {
        return Kernel::CpuFlash;
    };
    if (cc.0 == 9 || cc.0 == 10) && cudnn(cc, dtype, d, grad) {
        Kernel::Cudnn
    } else if flash(cc, dtype, d, grad) {
        Kernel::Flash
    } else if efficient(cc, dtype, d) {
        Kernel::Efficient
    } else {
        Kernel::Math
    }
}

fn half(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::Float16 | Dtype::Bfloat16)
}

/// `check_dtypes_low_precision`.
fn low_precision(cc: (u32, u32), dtype: Dtype) -> bool {
    match cc.0 >= 8 {
        true => half(dtype),
        false => dtype == Dtype::Float16,
    }
}

fn cudnn(cc: (u32, u32), dtype: Dtype, d: u64, grad: bool) -> bool {
    // cuDNN 9.26 is after 9.22: head sizes to 256 on 9.0 and 10.x (not
    // 10.7 before 9.25, which 9.26 is past).
    let d256 = cc == (9, 0) || cc.0 == 10;
    let limit = if d256 { 256 } else { 128 };
    let backward = !grad || !d256 || d <= 128 || d == 256;
    ((8, 0)..=(12, 1)).contains(&cc)
        && low_precision(cc, dtype)
        && d <= limit
        && d % 8 == 0
        && backward
}

fn flash(cc: (u32, u32), dtype: Dtype, d: u64, grad: bool) -> bool {
    let narrow = ((8, 6)..=(8, 9)).contains(&cc) || ((12, 0)..=(12, 1)).contains(&cc);
    let backward = !grad || !narrow || d <= 192 || d > 224;
    ((8, 0)..=(12, 1)).contains(&cc) && half(dtype) && d <= 256 && backward
}

fn efficient(cc: (u32, u32), dtype: Dtype, d: u64) -> bool {
    let dtypes = match cc.0 >= 8 {
        true => half(dtype) || dtype == Dtype::Float32,
        false => dtype == Dtype::Float16 || dtype == Dtype::Float32,
    };
    // `minimum_gemm_alignment`: tensor cores from 8.0, or 7.x in halves.
    let tensor_cores = cc.0 >= 8 || (cc.0 >= 7 && half(dtype));
    let mut alignment = if cc.0 >= 8 { 4 } else { 1 };
    if tensor_cores {
        alignment = alignment.max(if half(dtype) { 8 } else { 4 });
    }
    ((5, 0)..=(12, 1)).contains(&cc) && dtypes && d > 0 && d % alignment == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use Dtype::{Bfloat16 as Bf16, Float16 as F16, Float32 as F32};

    #[test]
    fn each_card_and_type_gets_the_kernel_sdp_utils_picks() {
        let t4 = Some((7, 5));
        let a100 = Some((8, 0));
        let l4 = Some((8, 9));
        let h100 = Some((9, 0));
        let cases = [
            (None, F32, 64, Kernel::CpuFlash),
            // A T4 has no flash kernel and no bfloat16 one.
            (t4, F32, 64, Kernel::Efficient),
            (t4, F16, 64, Kernel::Efficient),
            (t4, Bf16, 64, Kernel::Math),
            (a100, F32, 64, Kernel::Efficient),
            (a100, F16, 64, Kernel::Flash),
            (a100, Bf16, 128, Kernel::Flash),
            (a100, F16, 256, Kernel::Flash),
            // 8.9 trains with flash up to 192, then efficient.
            (l4, F16, 192, Kernel::Flash),
            (l4, F16, 200, Kernel::Efficient),
            // cuDNN first on 9.0, for halves with a multiple of 8.
            (h100, F16, 64, Kernel::Cudnn),
            (h100, Bf16, 256, Kernel::Cudnn),
            (h100, F16, 160, Kernel::Flash),
            (h100, F16, 60, Kernel::Flash),
            (h100, F32, 64, Kernel::Efficient),
            (a100, F32, 30, Kernel::Math),
            (Some((6, 1)), F32, 30, Kernel::Efficient),
            (Some((3, 5)), F32, 64, Kernel::Math),
        ];
        for (gpu, dtype, d, kernel) in cases {
            assert_eq!(
                select(gpu, dtype, d, true),
                kernel,
                "{gpu:?} {dtype:?} d={d}"
            );
        }
        // Without a gradient, 8.9 runs flash at any size to 256.
        assert_eq!(select(l4, F16, 200, false), Kernel::Flash);
    }
}
