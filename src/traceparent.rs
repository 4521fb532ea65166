//! The W3C Trace Context `traceparent` request header: the caller's trace and span, which the
//! OTLP span of a request continues. Read once per request; a malformed header is ignored.

/// A parsed `traceparent`: `{version}-{trace-id}-{parent-id}-{trace-flags}`, lowercase hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The 16-byte trace id (never all zero).
    pub trace_id: [u8; 16],
    /// The caller's 8-byte span id (never all zero).
    pub parent_id: [u8; 8],
    /// The trace flags; bit 0 is `sampled`.
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` value. Version `00` must be exactly 55 characters; a later version
    /// may append `-` and more, read the same way (the spec's forward compatibility); version
    /// `ff`, uppercase hex and all-zero ids are invalid.
    pub fn parse(v: &[u8]) -> Option<TraceParent> {
        if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let version = hex_byte(&v[0..2])?;
        if version == 0xff || (version == 0 && v.len() != 55) || (v.len() > 55 && v[55] != b'-') {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(&v[3 + 2 * i..5 + 2 * i])?;
        }
        let mut parent_id = [0u8; 8];
        for (i, b) in parent_id.iter_mut().enumerate() {
            *b = hex_byte(&v[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&v[53..55])?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// Whether the caller sampled this trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// Two lowercase hex digits.
fn hex_byte(two: &[u8]) -> Option<u8> {
    let d = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(d(two[0])? << 4 | d(two[1])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_header_parses() {
        let t = TraceParent::parse(OK.as_bytes()).unwrap();
        assert_eq!(t.trace_id[0], 0x4b);
        assert_eq!(t.trace_id[15], 0x36);
        assert_eq!(
            t.parent_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert!(t.sampled());
        let unsampled = OK.replace("-01", "-00");
        assert!(!TraceParent::parse(unsampled.as_bytes()).unwrap().sampled());
        // A later version with more fields is read the same way.
        let later = OK.replacen("00-", "01-", 1) + "-what-comes-next";
        assert_eq!(TraceParent::parse(later.as_bytes()).unwrap().flags, 1);
    }

    #[test]
    fn malformed_headers_are_ignored() {
        for bad in [
            "",
            &OK[..54],
            &format!("{OK}-x"),
            &OK.replacen("00-", "ff-", 1),
            &OK.to_uppercase(),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            &OK.replace('-', "_"),
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad}");
        }
    }
}
