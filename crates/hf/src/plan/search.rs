//! The searches of an answer: the largest batch or sequence that fits,
//! each value a run played on the allocator.

use vramlab_core::error::Invalid;

/// The largest value in `1..=most` for which `fits` holds, when `fits`
/// holds for every value below one that fits (0: none fits).
pub fn largest(
    most: u64,
    mut fits: impl FnMut(u64) -> Result<bool, Invalid>,
) -> Result<u64, Invalid> {
    let (mut lo, mut hi) = (0, most);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok(lo)
}

/// `largest`, starting from a `guess` of it, thought within one part in
/// `within` of it: the value that fits and the one above it that does not
/// are bracketed by steps from the guess that double (that part first),
/// then searched between by halves.
/// With a close guess that is a few runs instead of one per halving of
/// the whole range.
pub fn largest_near(
    most: u64,
    (guess, within): (u64, u64),
    mut fits: impl FnMut(u64) -> Result<bool, Invalid>,
) -> Result<u64, Invalid> {
    if most == 0 {
        return Ok(0);
    }
    let g = guess.clamp(1, most);
    let mut step = (g / within.max(1)).max(1);
    // `lo` fits (0: nothing yet), `hi + 1` does not (or `hi` is `most`).
    let (mut lo, mut hi) = (0, most);
    if fits(g)? {
        lo = g;
        while lo < hi {
            let next = lo.saturating_add(step).min(hi);
            if !fits(next)? {
                hi = next - 1;
                break;
            }
            lo = next;
            step = step.saturating_mul(2);
        }
    } else {
        hi = g - 1;
        while hi > 0 {
            let next = hi.saturating_sub(step - 1).max(1);
            if fits(next)? {
                lo = next;
                break;
            }
            hi = next - 1;
            step = step.saturating_mul(2);
        }
    }
    Ok(lo + largest(hi - lo, |k| fits(lo + k))?)
}
