//! Lowercase hex on the stack, for what is formatted on every request (the key pseudonym, the
//! request id).

/// Lowercase hex of up to 32 bytes.
pub(crate) struct Hex {
    buf: [u8; 64],
    len: usize,
}

impl Hex {
    /// The digits, two per byte.
    pub(crate) fn as_str(&self) -> &str {
        // Only ASCII hex digits are written.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

/// The lowercase hex of `bytes` (of at most the first 32).
pub(crate) fn hex(bytes: &[u8]) -> Hex {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut h = Hex {
        buf: [0; 64],
        len: 0,
    };
    for &b in bytes.iter().take(32) {
        h.buf[h.len] = DIGITS[usize::from(b >> 4)];
        h.buf[h.len + 1] = DIGITS[usize::from(b & 15)];
        h.len += 2;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_format() {
        let all: Vec<u8> = (0..=255).collect();
        for chunk in all.chunks(32) {
            let want: String = chunk.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(hex(chunk).as_str(), want);
        }
    }
}
