//! Byte searches eight bytes per step ("SIMD within a register"): the SSE scanner and the event
//! skimmer run them over every byte of every streamed event, where a byte-at-a-time loop was
//! their largest cost.

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// Flags (high bit) the bytes of `w` equal to `b`. The lowest flag is exact; flags above a true
/// one may be false, so only the lowest is used.
#[inline]
pub(crate) fn eq_mask(w: u64, b: u8) -> u64 {
    let x = w ^ (LO * u64::from(b));
    x.wrapping_sub(LO) & !x & HI
}

/// Flags the bytes of `w` below `n` (`n` ≤ 0x80), with the same lowest-flag-is-exact rule.
#[inline]
pub(crate) fn below_mask(w: u64, n: u8) -> u64 {
    w.wrapping_sub(LO * u64::from(n)) & !w & HI
}

/// Index of the first byte of `s` that `pred` accepts; `mask` must flag exactly those bytes of a
/// little-endian word (lowest flag exact), `pred` is the same test for one byte.
#[inline]
pub(crate) fn find(
    s: &[u8],
    mask: impl Fn(u64) -> u64,
    pred: impl Fn(u8) -> bool,
) -> Option<usize> {
    let mut i = 0;
    while let Some(chunk) = s.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let m = mask(u64::from_le_bytes(word));
        if m != 0 {
            return Some(i + (m.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    s[i..].iter().position(|&c| pred(c)).map(|p| i + p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every position and length up to 40, every target, every filler byte: the word search
    /// finds what a byte-at-a-time search finds.
    #[test]
    fn masks_find_what_a_byte_search_finds() {
        let special = |c: u8| c == b'"' || c == b'\\' || c < 0x20;
        let mask = |w| eq_mask(w, b'"') | eq_mask(w, b'\\') | below_mask(w, 0x20);
        for len in 0..40usize {
            for at in 0..=len {
                for target in [b'"', b'\\', 0x00, 0x1f, b'\n'] {
                    for fill in 0..=255u8 {
                        if special(fill) {
                            continue;
                        }
                        let mut v = vec![fill; len];
                        if at < len {
                            v[at] = target;
                        }
                        let naive = v.iter().position(|&c| special(c));
                        assert_eq!(find(&v, mask, special), naive, "{len} {at} {target} {fill}");
                    }
                }
            }
        }
    }
}
