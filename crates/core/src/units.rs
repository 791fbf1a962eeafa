//! Byte units and the size format PyTorch prints (`format_size` in
//! `c10/cuda/CUDACachingAllocator.cpp`).

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;
pub const TIB: u64 = 1024 * GIB;
pub const PIB: u64 = 1024 * TIB;
/// PyTorch refuses any single request of this size or more
/// (`one_exa_bytes` in `CUDACachingAllocator.cpp`'s `allocate`: 2^60).
pub const EIB: u64 = 1024 * PIB;

/// Formats a byte count exactly as PyTorch's `format_size`: up to 1024 as
/// `"N bytes"`, then KiB up to 1 MiB, MiB up to 1 GiB, GiB above, with two
/// decimals (`std::fixed`, precision 2).
pub fn format_size(bytes: u64) -> String {
    if bytes <= KIB {
        format!("{bytes} bytes")
    } else if bytes <= MIB {
        format!("{:.2} KiB", bytes as f64 / KIB as f64)
    } else if bytes <= GIB {
        format!("{:.2} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / GIB as f64)
    }
}

/// Rounds `value` up to a multiple of `to` (a power of two or any non-zero
/// number).
pub const fn round_up(value: u64, to: u64) -> u64 {
    value.div_ceil(to) * to
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_size_matches_pytorch_boundaries() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1025), "1.00 KiB");
        assert_eq!(format_size(MIB), "1024.00 KiB");
        assert_eq!(format_size(2 * MIB), "2.00 MiB");
        assert_eq!(format_size(20 * MIB), "20.00 MiB");
        assert_eq!(format_size(GIB), "1024.00 MiB");
        assert_eq!(format_size(GIB + 1), "1.00 GiB");
        assert_eq!(format_size(80 * GIB), "80.00 GiB");
    }

    #[test]
    fn format_size_rounds_ties_to_even_like_printf() {
        // 1.125 KiB and 1.375 KiB are exact binary ties; glibc prints 1.12 and 1.38.
        assert_eq!(format_size(1152), "1.12 KiB");
        assert_eq!(format_size(1408), "1.38 KiB");
    }

    #[test]
    fn round_up_works() {
        assert_eq!(round_up(1, 512), 512);
        assert_eq!(round_up(512, 512), 512);
        assert_eq!(round_up(513, 512), 1024);
    }
}
