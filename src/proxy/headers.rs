//! Hop-by-hop headers: they describe one connection and never cross the proxy (RFC 9110 §7.6.1).

use http::header::{self, HeaderMap, HeaderName};

/// Headers that are hop-by-hop by definition (a static: a `const` array would be built and
/// dropped at each use).
static HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
];

/// The elements of a comma-separated list header (RFC 9110 §5.6.1), trimmed, over all of its
/// fields in order ([`list_tokens`] of each).
pub(crate) fn list_elements<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> impl DoubleEndedIterator<Item = &'a [u8]> + 'a {
    headers
        .get_all(name)
        .iter()
        .flat_map(|v| list_tokens(v.as_bytes()))
}

/// The elements of one list field's value (RFC 9110 §5.6.1), trimmed; a value that is not
/// visible ASCII (`visible`) gives none: the one reading of a list field, on the request's
/// side and the response's.
pub(crate) fn list_tokens(value: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    let read = visible(value);
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(move |_| read)
}

/// Whether a field's value is visible ASCII and tabs, as `HeaderValue::to_str` takes it.
pub(crate) fn visible(value: &[u8]) -> bool {
    value.iter().all(|&b| b == b'\t' || (32..127).contains(&b))
}

/// Whether a field is hop-by-hop by its name alone, in any case: the fixed set and every
/// `Proxy-*` field (the names a `Connection` field lists are too).
pub(crate) fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h.as_str()))
        || name
            .get(..6)
            .is_some_and(|p| p.eq_ignore_ascii_case("proxy-"))
}

/// Appends one field line of a head: `name: value` and CRLF (RFC 9112 §5).
pub(crate) fn write_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends a `content-length` field line for `n` bytes.
pub(crate) fn write_length(out: &mut Vec<u8>, name: &[u8], n: u64) {
    write_field(out, name, itoa::Buffer::new().format(n).as_bytes());
}

/// Removes hop-by-hop headers: the fixed set, every `Proxy-*` header, and those `Connection` names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most heads carry none, which one pass over the names tells (a name listed in `Connection`
    // comes with `Connection`, one of the fixed set).
    if !headers.keys().any(|k| is_hop_by_hop(k.as_str())) {
        return;
    }
    let named: Vec<HeaderName> = list_elements(headers, &header::CONNECTION)
        .filter_map(|t| HeaderName::from_bytes(t).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    let proxy: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for name in proxy {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_fixed_named_and_proxy_headers() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, X-Secret-Hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("trailer", "x"),
            ("content-type", "application/json"),
            ("x-keep", "yes"),
        ] {
            h.append(HeaderName::from_static(k), v.parse().unwrap());
        }
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(http::HeaderName::as_str).collect();
        assert_eq!(left, vec!["content-type", "x-keep"]);
    }
}
