//! The header fields of an upstream response, kept as the upstream sent them: the head's bytes,
//! parsed again where they are read. The client's head is written from them in the upstream's
//! order and spelling, less the hop-by-hop fields (RFC 9110 §7.6.1); a `HeaderMap` is built from
//! them only where one is needed (hyper's server, the answer rebuilt from a stream, the tests).
//!
//! Why: building a `HeaderMap` for every response head, stripping it and encoding it again was
//! most of what a response head cost the proxy with agents' traffic, where none of that code is
//! in the CPU's caches (docs/performance.md, issue 37). httparse's second pass over a head in
//! the cache is a fraction of that.

use std::mem::MaybeUninit;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::headers::{is_hop_by_hop, list_tokens, visible};

/// Most header fields a response head (or a trailer section) may have, as hyper allows.
pub(super) const MAX_HEADERS: usize = 128;

/// A response head's fields as the upstream sent them.
#[derive(Clone, Debug, Default)]
pub struct UpstreamFields {
    /// The head, from its status line to its empty line, as `parse` took it.
    head: Bytes,
    /// Where the reason phrase lies in `head`.
    reason: (u32, u32),
    /// Where the first `content-type` value lies in `head`.
    content_type: Option<(u32, u32)>,
}

/// A field's value as it is forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded<'a> {
    /// As the upstream sent it.
    Sent(&'a [u8]),
    /// The body's length as the proxy forwards it (`content-length`).
    Length(u64),
}

/// Parses a response head at the start of `buf` with httparse's defaults: the one parse of
/// upstream heads, so that what was accepted once parses the same again.
pub(super) fn parse<'b, 'h>(
    buf: &'b [u8],
    fields: &'h mut [MaybeUninit<httparse::Header<'b>>],
) -> (httparse::Response<'h, 'b>, httparse::Result<usize>) {
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        buf,
        fields,
    );
    (response, parsed)
}

impl UpstreamFields {
    /// The fields of `head`, a whole head `parse` accepted, with the places in it of its reason
    /// phrase and of its first `content-type` value.
    pub(super) fn new(
        head: Bytes,
        reason: (u32, u32),
        content_type: Option<(u32, u32)>,
    ) -> UpstreamFields {
        UpstreamFields {
            head,
            reason,
            content_type,
        }
    }

    /// Calls `f` with the head's fields, parsed again.
    fn with_parsed<R>(&self, f: impl FnOnce(&[httparse::Header<'_>]) -> R) -> R {
        let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let (response, parsed) = parse(&self.head, &mut fields);
        match parsed {
            Ok(httparse::Status::Complete(_)) => f(response.headers),
            // Not reached: `new` is given heads that parsed.
            _ => f(&[]),
        }
    }

    /// The reason phrase as the upstream sent it (empty when it sent none).
    pub fn reason(&self) -> &[u8] {
        &self.head[self.reason.0 as usize..self.reason.1 as usize]
    }

    /// Whether the `content-type` starts with `prefix` (lowercase), in any case.
    pub fn content_type_starts(&self, prefix: &str) -> bool {
        self.content_type
            .is_some_and(|(a, b)| value_starts(&self.head[a as usize..b as usize], prefix))
    }

    /// Calls `f` with each field forwarded to the client, in the upstream's order and spelling:
    /// every field but the hop-by-hop ones (the fixed set, `Proxy-*`, and the names a
    /// `Connection` field lists) and those `over` sets (the proxy's own, which replace the
    /// upstream's). On a response with a body, the first `content-length` carries `length`, the
    /// body's length as forwarded, and is left out when that is not known (the body is then
    /// chunked); a bodiless response (204, 304) keeps the upstream's value.
    pub fn forwarded(
        &self,
        over: &HeaderMap,
        length: Option<u64>,
        has_body: bool,
        mut f: impl FnMut(&str, Forwarded<'_>),
    ) {
        self.with_parsed(|fields| {
            let listed = fields
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case(header::CONNECTION.as_str()));
            let mut length_sent = false;
            for h in fields {
                let name = h.name;
                if is_hop_by_hop(name)
                    || over.keys().any(|k| name.eq_ignore_ascii_case(k.as_str()))
                    || (listed
                        && fields
                            .iter()
                            .filter(|c| c.name.eq_ignore_ascii_case(header::CONNECTION.as_str()))
                            .flat_map(|c| list_tokens(c.value))
                            .any(|t| t.eq_ignore_ascii_case(name.as_bytes())))
                {
                    continue;
                }
                if name.eq_ignore_ascii_case(header::CONTENT_LENGTH.as_str()) && has_body {
                    match length {
                        Some(n) if !length_sent => f(name, Forwarded::Length(n)),
                        _ => {}
                    }
                    length_sent = true;
                    continue;
                }
                f(name, Forwarded::Sent(h.value));
            }
        });
    }

    /// The forwarded fields ([`UpstreamFields::forwarded`]) followed by `over`'s, as a map.
    pub fn header_map(&self, over: HeaderMap, length: Option<u64>, has_body: bool) -> HeaderMap {
        let mut map = HeaderMap::new();
        self.forwarded(&over, length, has_body, |name, value| {
            let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
                return;
            };
            let value = match value {
                Forwarded::Sent(v) => HeaderValue::from_maybe_shared(self.head.slice_ref(v)),
                Forwarded::Length(n) => Ok(HeaderValue::from(n)),
            };
            if let Ok(value) = value {
                map.append(name, value);
            }
        });
        let mut last = None;
        for (name, value) in over {
            if let Some(name) = name {
                last = Some(name);
            }
            if let Some(name) = &last {
                map.append(name.clone(), value);
            }
        }
        map
    }

    /// Every field as the upstream sent it, as a map.
    pub fn as_sent(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        self.with_parsed(|fields| {
            for h in fields {
                if let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(h.name.as_bytes()),
                    HeaderValue::from_maybe_shared(self.head.slice_ref(h.value)),
                ) {
                    map.append(name, value);
                }
            }
        });
        map
    }
}

/// Whether a `Content-Type` value starts with `prefix` (lowercase), in any case, after leading
/// white space; a value that is not visible ASCII does not.
fn value_starts(v: &[u8], prefix: &str) -> bool {
    if !visible(v) {
        return false;
    }
    let v = v.trim_ascii_start();
    v.len() >= prefix.len() && v[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields_of(head: &'static [u8]) -> UpstreamFields {
        let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let (response, parsed) = parse(head, &mut fields);
        assert!(matches!(parsed, Ok(httparse::Status::Complete(_))));
        let head = Bytes::from_static(head);
        let at = |v: &[u8]| (v.as_ptr() as usize - head.as_ptr() as usize) as u32;
        let reason = response.reason.map_or((0, 0), |r| {
            (at(r.as_bytes()), at(r.as_bytes()) + r.len() as u32)
        });
        let content_type = response
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-type"))
            .map(|h| (at(h.value), at(h.value) + h.value.len() as u32));
        UpstreamFields::new(head, reason, content_type)
    }

    fn forwarded(f: &UpstreamFields, over: &HeaderMap, length: Option<u64>, body: bool) -> String {
        let mut out = String::new();
        f.forwarded(over, length, body, |name, value| {
            let value = match value {
                Forwarded::Sent(v) => String::from_utf8_lossy(v).into_owned(),
                Forwarded::Length(n) => n.to_string(),
            };
            out.push_str(&format!("{name}: {value}\n"));
        });
        out
    }

    #[test]
    fn forwards_in_order_and_spelling_less_hop_by_hop_fields() {
        let f = fields_of(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive, X-Hop\r\n\
X-Hop: 1\r\nKeep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\nProxy-Foo: 2\r\nTE: x\r\n\
Trailer: y\r\nUpgrade: z\r\nX-Request-Id: upstream\r\nX-Keep: a\r\nx-keep: b\r\n\r\n",
        );
        let mut over = HeaderMap::new();
        over.insert("x-request-id", HeaderValue::from_static("proxy"));
        assert_eq!(
            forwarded(&f, &over, None, true),
            "Content-Type: text/event-stream\nX-Keep: a\nx-keep: b\n"
        );
        assert!(f.content_type_starts("text/event-stream"));
        assert!(!f.content_type_starts("application/json"));
        let map = f.header_map(over, None, true);
        let names: Vec<_> = map.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["content-type", "x-keep", "x-request-id"]);
        assert_eq!(map.get_all("x-keep").iter().count(), 2);
        assert_eq!(map["x-request-id"], "proxy");
    }

    #[test]
    fn content_length_is_the_forwarded_bodys() {
        let f = fields_of(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\nx-a: 1\r\ncontent-length: 5\r\n\r\n",
        );
        let none = HeaderMap::new();
        // Once, with the body's length, where the first one was.
        assert_eq!(
            forwarded(&f, &none, Some(5), true),
            "Content-Length: 5\nx-a: 1\n"
        );
        // The length not known (a stream whose usage is stripped): left out.
        assert_eq!(forwarded(&f, &none, None, true), "x-a: 1\n");
        // No body (304): as sent.
        assert_eq!(
            forwarded(&f, &none, Some(0), false),
            "Content-Length: 5, 5\nx-a: 1\ncontent-length: 5\n"
        );
    }

    #[test]
    fn reason_as_sent() {
        assert_eq!(&fields_of(b"HTTP/1.1 200 Fine\r\n\r\n").reason(), b"Fine");
        assert_eq!(fields_of(b"HTTP/1.1 404 \r\n\r\n").reason(), b"");
        assert_eq!(
            fields_of(b"HTTP/1.1 200 OK\r\nx: 1\r\n\r\n").as_sent()["x"],
            "1"
        );
    }
}
