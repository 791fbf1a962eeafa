//! A deterministic hash of three numbers (a splitmix64 finalizer), the
//! same on every target: the synthetic data's samples (`train::data`, and
//! its mirror in the GPU kernels) and a CUDA graph pool's stream key
//! (`torch_snapshot::pools`) are drawn from it.

/// The hash of `(a, b, c)`.
pub fn mix3(a: u64, b: u64, c: u64) -> u64 {
    let mut z = a
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(b.wrapping_mul(0xbf58_476d_1ce4_e5b9))
        .wrapping_add(c.wrapping_mul(0x94d0_49bb_1331_11eb))
        .wrapping_add(0x2545_f491_4f6c_dd1d);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
