//! The proxy's own request ids, formatted on the stack: one is made for every request, sent
//! in `request_id_header` and logged.

use crate::hex::hex;

/// The longest id: `tm-`, 8 digits of prefix, `-`, 16 digits of counter.
const MAX_LEN: usize = 3 + 8 + 1 + 16;

/// A request id, `tm-<process prefix>-<counter>` in at least 8 lowercase hex digits each,
/// formatted without allocating.
#[derive(Clone, Copy)]
pub struct RequestId {
    buf: [u8; MAX_LEN],
    len: u8,
}

impl RequestId {
    /// The id of request `id` of the process whose ids start with `prefix`.
    pub fn new(prefix: u32, id: u64) -> RequestId {
        let mut buf = [0u8; MAX_LEN];
        let mut len = 0;
        let mut put = |part: &[u8]| {
            buf[len..len + part.len()].copy_from_slice(part);
            len += part.len();
        };
        put(b"tm-");
        put(hex(&prefix.to_be_bytes()).as_str().as_bytes());
        put(b"-");
        let counter = hex(&id.to_be_bytes());
        let digits = counter.as_str();
        // At least 8 digits, as `{:08x}`: the leading zeros beyond those are cut.
        let significant = digits.trim_start_matches('0').len().max(8);
        put(&digits.as_bytes()[16 - significant..]);
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
