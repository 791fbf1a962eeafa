//! QLoRA's base layers: bitsandbytes 0.50's `Linear4bit` (`Params4bit`
//! weights, `matmul_4bit`) as a training step runs them.
//!
//! `Linear4bit.forward` casts its input to the compute type, and
//! `MatMul4Bit` (an `autograd.Function` that saves only the packed
//! weight) runs `bitsandbytes::gemm_4bit`. Past 512 rows every CUDA
//! architecture's heuristic (`_gemm_4bit_use_custom_cuda`) takes
//! `_dequant_linear_fallback`: with double quantization the 8-bit
//! `absmax` dequantized and the offset added, the weight dequantized in
//! the compute type, `F.linear`. Its backward dequantizes the weight
//! again (`F.dequantize_4bit`) for `grad_output @ W`. The result goes
//! back to the input's type (`.to(inp_dtype)`).

use super::tape::{Tape, T};
use super::Model;
use vramlab_core::types::Dtype;
use vramlab_train::program::Holds;

/// bitsandbytes' 4-bit quantization (`BitsAndBytesConfig(load_in_4bit=True,
/// ...)`). `nf4` and `fp4` store the same bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quant4 {
    /// `bnb_4bit_quant_type="nf4"` (else `"fp4"`).
    pub nf4: bool,
    /// `bnb_4bit_use_double_quant`: each block's `absmax` in 8 bits.
    pub double_quant: bool,
    /// `bnb_4bit_compute_dtype`.
    pub compute: Dtype,
}

/// `Params4bit`'s block of weights under one `absmax` (bitsandbytes 0.50's
/// default), and double quantization's block of `absmax` values.
pub const BLOCK: u64 = 64;
pub const BLOCK2: u64 = 256;

impl Quant4 {
    /// The tensors one quantized weight of `n` elements keeps, in bytes,
    /// as `quantize_4bit` makes them: the packed weight (two a byte), the
    /// 4-bit code, then `absmax` (float32 a block), or with double
    /// quantization the 8-bit `absmax`, its float32 `absmax` a block of
    /// 256, the offset and the 8-bit code.
    pub fn stored(self, n: u64) -> Vec<u64> {
        let blocks = n.div_ceil(BLOCK);
        let mut sizes = vec![n.div_ceil(2), 16 * 4];
        if self.double_quant {
            sizes.extend([blocks, blocks.div_ceil(BLOCK2) * 4, 4, 256 * 4]);
        } else {
            sizes.push(blocks * 4);
        }
        sizes
    }

    /// `absmax` dequantized to float32, when it is stored in 8 bits.
    fn absmax(self, n: u64) -> Option<u64> {
        self.double_quant.then(|| n.div_ceil(BLOCK) * 4)
    }
}

impl Tape<'_> {
    /// `F.dequantize_4bit` in the backward: `absmax` dequantized (and the
    /// offset added in place), the weight in `dtype`; `absmax` goes as it
    /// returns.
    fn dequantize(&mut self, q: Quant4, n: u64) -> usize {
        let absmax = q
            .absmax(n)
            .map(|b| self.alloc("dequantize_blockwise", b, Holds::Dequantized));
        let w = self.alloc(
            "dequantize_4bit",
            n * q.compute.size_bytes(),
            Holds::Dequantized,
        );
        if let Some(a) = absmax {
            self.release(a);
        }
        w
    }
}

impl Model<'_, '_> {
    /// `Linear4bit(x)` over `rows` rows, `fan_in` to `fan_out`: the output
    /// in `x`'s type.
    pub(super) fn linear4bit(&mut self, x: T, q: Quant4, rows: u64, fans: (u64, u64)) -> T {
        let (fan_out, fan_in) = (fans.0, fans.1);
        let n = fan_out * fan_in;
        let c = q.compute.size_bytes();
        // `x.to(compute_dtype)`, and the result `.to(inp_dtype)`: casts
        // where the input is not in the compute type (autocast's products
        // come in it already).
        let x_e = x.bytes / (rows * fan_in).max(1);
        let wide = x_e != c;
        let x16 = match wide {
            true => self.t.cast(x, rows * fan_in * c),
            false => self.t.share(x),
        };
        // On the CPU `gemm_4bit` is one op; CUDA's
        // `_dequant_linear_fallback` makes `absmax_dq`, `absmax_dq +
        // offset` and the dequantized weight, then `F.linear`.
        let cuda = self.run.gpu.is_some();
        let absmax = q.absmax(n).filter(|_| cuda).map(|b| {
            let dq = self.t.alloc("empty_like", b, Holds::Dequantized);
            let sum = self.t.alloc("add", b, Holds::Dequantized);
            (dq, sum)
        });
        let w = cuda.then(|| self.t.alloc("empty", n * c, Holds::Dequantized));
        let needs_x = x16.fun.is_some();
        let y = self.t.op1(
            if cuda { "mm" } else { "gemm_4bit" },
            rows * fan_out * c,
            &[x16],
            &[],
            false,
            move |t, g| {
                let gx = g[0].filter(|_| needs_x).map(|_| {
                    let w = t.dequantize(q, n);
                    let gx = t.grad(0, "mm", rows * fan_in * c);
                    t.release(w);
                    gx
                });
                vec![gx]
            },
        );
        // The fallback's locals go as it returns: the sum, `absmax_dq`,
        // the dequantized weight.
        if let Some((dq, sum)) = absmax {
            self.t.release(sum);
            self.t.release(dq);
        }
        if let Some(w) = w {
            self.t.release(w);
        }
        if !wide {
            self.t.drop(x16);
            return y;
        }
        let out = self.t.cast(y, rows * fan_out * x_e);
        self.t.drop_all(&[y, x16]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama-3.2-1B's `q_proj` (2048 x 2048) as the H100 stored it
    /// (`tests/golden/qlora.json`): 2 MiB packed, 64K 8-bit `absmax`, 256
    /// float32 second-level `absmax`, a float32 offset.
    #[test]
    fn a_weight_stores_half_a_byte_an_element_and_its_block_maxima() {
        let n = 2048 * 2048;
        let dq = Quant4 {
            nf4: true,
            double_quant: true,
            compute: Dtype::Bfloat16,
        };
        assert_eq!(dq.stored(n), [2_097_152, 64, 65_536, 1024, 4, 1024]);
        let plain = Quant4 {
            double_quant: false,
            ..dq
        };
        assert_eq!(plain.stored(n), [2_097_152, 64, 65_536 * 4]);
    }
}
