//! Byte searches eight bytes per step ("SIMD within a register") for tests memchr does not offer
//! (a byte *below* a value): the event skimmer runs them over every string of every event.

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// Flags (high bit) the bytes of `w` equal to `b`. The lowest flag is exact; flags above a true
/// one may be false, so only the lowest is used.
#[inline]
fn eq_mask(w: u64, b: u8) -> u64 {
    let x = w ^ (LO * u64::from(b));
    x.wrapping_sub(LO) & !x & HI
}

/// Flags the bytes of `w` below `n` (`n` ≤ 0x80), with the same lowest-flag-is-exact rule.
#[inline]
fn below_mask(w: u64, n: u8) -> u64 {
    w.wrapping_sub(LO * u64::from(n)) & !w & HI
}

/// Whether a byte ends a run of plain ASCII JSON string contents: `"`, `\`, a control byte, or
/// a byte of a multi-byte UTF-8 sequence (its validity is checked apart).
#[inline]
pub(crate) fn is_string_special(c: u8) -> bool {
    c == b'"' || c == b'\\' || !(0x20..0x80).contains(&c)
}

/// Index of the first byte at or after `from` in `s` that [`is_string_special`], or `s.len()`.
#[inline(always)]
pub(crate) fn find_string_special(s: &[u8], from: usize) -> usize {
    let mut i = from;
    while let Some(chunk) = s.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        // The high bits flag bytes >= 0x80 exactly; the lowest flag of the union stays exact.
        let m = eq_mask(w, b'"') | eq_mask(w, b'\\') | below_mask(w, 0x20) | (w & HI);
        if m != 0 {
            return i + (m.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < s.len() && !is_string_special(s[i]) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every start, position and length up to 40, every special byte, every filler byte: the
    /// word search finds what a byte-at-a-time search finds.
    #[test]
    fn word_search_finds_what_a_byte_search_finds() {
        for len in 0..40usize {
            for at in 0..=len {
                for target in [b'"', b'\\', 0x00, 0x1f, b'\n', 0x80, 0xc3, 0xff] {
                    for fill in (0..=255u8).filter(|&c| !is_string_special(c)) {
                        let mut v = vec![fill; len];
                        if at < len {
                            v[at] = target;
                        }
                        for from in [0, 1, 7, 9].into_iter().filter(|&f| f <= len) {
                            let naive = (from..len)
                                .find(|&i| is_string_special(v[i]))
                                .unwrap_or(len);
                            assert_eq!(
                                find_string_special(&v, from),
                                naive,
                                "{len} {at} {target} {fill} {from}"
                            );
                        }
                    }
                }
            }
        }
    }
}
