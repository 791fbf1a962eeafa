//! What `opt.step()`'s program computes besides the update: bitsandbytes'
//! quantization maps, as its Python makes them.

/// bitsandbytes' `create_dynamic_map(signed)` (7 exponent bits, 8 in all):
/// for each exponent `i` the midpoints of `torch.linspace(0.1, 1, n)`
/// scaled by 10^(i - 6) (and their negatives when signed), with 0 and 1,
/// sorted: 256 values. Each exponent's midpoints lie below the next one's,
/// so they are written in order (no sort).
pub(super) fn dynamic_map(signed: bool) -> Vec<f32> {
    const SCALES: [f32; 7] = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0];
    let means = |i: usize, scale: f32| {
        let n = if signed {
            (1 << i) + 1
        } else {
            (1 << (i + 1)) + 1
        };
        let b = linspace(0.1, 1.0, n);
        (1..n)
            .map(|j| (b[j - 1] + b[j]) / 2.0 * scale)
            .collect::<Vec<f32>>()
    };
    let positive: Vec<f32> = (SCALES.iter().enumerate())
        .flat_map(|(i, &scale)| means(i, scale))
        .collect();
    let negative = positive.iter().rev().map(|m| -m).filter(|_| signed);
    negative
        .chain([0.0])
        .chain(positive.iter().copied())
        .chain([1.0])
        .collect()
}

/// `torch.linspace` as its CPU kernel computes it: the first half stepped
/// up from `start`, the rest down from `end`, each value one fused
/// multiply-add (the kernel is compiled with FMA; the product of two
/// floats is exact in a double, so one rounding of the sum remains).
fn linspace(start: f32, end: f32, steps: usize) -> Vec<f32> {
    let step = (end - start) / (steps - 1) as f32;
    let fma = |a: f32, n: usize, c: f32| (f64::from(a) * n as f64 + f64::from(c)) as f32;
    (0..steps)
        .map(|i| match i < steps / 2 {
            true => fma(step, i, start),
            false => fma(-step, steps - i - 1, end),
        })
        .collect()
}
