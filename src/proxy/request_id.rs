//! The proxy's own request ids, formatted on the stack: one is made for every request, sent
//! in `request_id_header` and logged.

/// A request id, `tm-<process prefix>-<counter>` in at least 8 lowercase hex digits each,
/// formatted without allocating.
#[derive(Clone, Copy)]
pub struct RequestId {
    buf: [u8; 3 + 8 + 1 + 16],
    len: u8,
}

impl RequestId {
    /// The id of request `id` of the process whose ids start with `prefix`.
    pub fn new(prefix: u32, id: u64) -> RequestId {
        let mut buf = [0u8; 28];
        buf[..3].copy_from_slice(b"tm-");
        let mut len = 3 + put_hex(&mut buf[3..], u64::from(prefix));
        buf[len] = b'-';
        len += 1;
        len += put_hex(&mut buf[len..], id);
        RequestId {
            buf,
            len: len as u8,
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever written.
        std::str::from_utf8(&self.buf[..usize::from(self.len)]).unwrap_or_default()
    }
}

/// Writes `v` as lowercase hex, at least 8 digits (`{:08x}`); returns the digits written.
fn put_hex(out: &mut [u8], v: u64) -> usize {
    let digits = (16 - v.leading_zeros() as usize / 4).max(8);
    for (i, slot) in out[..digits].iter_mut().enumerate() {
        let nibble = (v >> (4 * (digits - 1 - i))) & 0xf;
        *slot = b"0123456789abcdef"[nibble as usize];
    }
    digits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_format_it_replaces() {
        for (prefix, id) in [
            (0u32, 0u64),
            (0x692f_1a2b, 1),
            (u32::MAX, 0xffff_ffff),
            (7, 0x1_0000_0000),
            (1, u64::MAX),
        ] {
            let want = format!("tm-{prefix:08x}-{id:08x}");
            assert_eq!(RequestId::new(prefix, id).as_str(), want);
        }
    }
}
