//! The head a request goes upstream with: the client's request line and fields as they came,
//! less those that belong to one connection or to the proxy, plus the proxy's own, written in
//! one pass over the client's fields. The client's `HeaderMap` is read, never edited: a
//! request's way to the upstream write builds and changes no map (docs/performance.md, "Code
//! touched per request").

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Uri};

use super::headers::{is_hop_by_hop, list_elements, write_field, write_length};
use super::identity::X_API_KEY;

/// A request as the upstream pool sends it.
pub struct UpstreamRequest {
    /// The replica's scheme and authority (`UpstreamTarget::origin`): they pick the connection.
    pub origin: Uri,
    /// The method (a `HEAD` response has no body, whatever its head says).
    pub method: Method,
    /// The head, as written ([`encode`]).
    pub head: Bytes,
    /// The whole body.
    pub body: Bytes,
}

/// The proxy's own fields of one request, sent in place of the client's on every attempt.
pub struct ProxyFields<'a> {
    /// The request id field, named as configured.
    request_id: Option<(HeaderName, HeaderValue)>,
    /// The upstream key as a bearer key.
    authorization: Option<HeaderValue>,
    /// `x-api-key` when the client sent one: the upstream key, or nothing when it makes no
    /// field value (the client's is dropped either way).
    x_api_key: Option<Option<HeaderValue>>,
    /// The user header (`users.header`), which names the user to the proxy alone.
    user_header: &'a str,
}

impl<'a> ProxyFields<'a> {
    /// The fields for a request whose client sent `client`: its `request_id`, and with an
    /// `upstream_key` configured the upstream's key always as a bearer key, and in place of the
    /// client's `x-api-key` when it sent one: no client key reaches the upstream.
    pub fn new(
        request_id: Option<(HeaderName, HeaderValue)>,
        upstream_key: Option<&str>,
        client: &HeaderMap,
        user_header: &'a str,
    ) -> Self {
        ProxyFields {
            request_id,
            authorization: upstream_key
                .and_then(|k| HeaderValue::from_str(&format!("Bearer {k}")).ok()),
            x_api_key: upstream_key
                .filter(|_| client.contains_key(&X_API_KEY))
                .map(|k| HeaderValue::from_str(k).ok()),
            user_header,
        }
    }

    /// The request for `target` (origin form) to the replica at `origin`, whose authority is
    /// `host`, with the client's `method` and `headers`, these fields, and `body`.
    pub fn request(
        &self,
        origin: Uri,
        target: &str,
        host: &HeaderValue,
        method: &Method,
        headers: &HeaderMap,
        body: Bytes,
    ) -> UpstreamRequest {
        let mut set: [(&HeaderName, Option<&HeaderValue>); 3] = [(&header::HOST, None); 3];
        let mut n = 0;
        if let Some((name, value)) = &self.request_id {
            set[n] = (name, Some(value));
            n += 1;
        }
        if let Some(value) = &self.authorization {
            set[n] = (&header::AUTHORIZATION, Some(value));
            n += 1;
        }
        if let Some(value) = &self.x_api_key {
            set[n] = (&X_API_KEY, value.as_ref());
            n += 1;
        }
        let edits = Edits {
            host: Some(host),
            set: &set[..n],
            drop: Some(self.user_header),
        };
        let head = encode(method, target, headers, &edits, body.len());
        UpstreamRequest {
            origin,
            method: method.clone(),
            head,
            body,
        }
    }
}

/// What the proxy changes in a client's head on its way upstream.
#[derive(Default)]
pub struct Edits<'a> {
    /// `Host`, written first (RFC 9112 §3.2), in place of the client's.
    pub host: Option<&'a HeaderValue>,
    /// Fields written after the client's, in place of the client's of the same name; a `None`
    /// value only drops the client's.
    pub set: &'a [(&'a HeaderName, Option<&'a HeaderValue>)],
    /// One more field the client's head loses, named in any case (the user header).
    pub drop: Option<&'a str>,
}

/// The head of a request for `method` and `target` (origin form) with the client's `headers`
/// and the proxy's `edits`, for a whole body of `body_len` bytes.
///
/// Dropped from the client's fields: the hop-by-hop ones (`headers::is_hop_by_hop`, and those
/// `Connection` names: RFC 9110 §7.6.1), `Expect` (the body is whole: nothing waits for a
/// 100), and the framing, which is the proxy's: the body goes with its exact length, as
/// hyper's client sends a whole body. An empty body gets `content-length: 0` only when the
/// client sent a length.
pub fn encode(
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    edits: &Edits<'_>,
    body_len: usize,
) -> Bytes {
    // Names a `Connection` field lists: hop-by-hop too; most heads have none.
    let listed: Vec<&[u8]> = if headers.contains_key(header::CONNECTION) {
        list_elements(headers, &header::CONNECTION).collect()
    } else {
        Vec::new()
    };
    let mut size = method.as_str().len() + target.len() + 64;
    for (name, value) in headers {
        size += name.as_str().len() + value.len() + 4;
    }
    for (name, value) in edits.set {
        size += name.as_str().len() + value.map_or(0, HeaderValue::len) + 4;
    }
    let mut head = Vec::with_capacity(size);
    head.extend_from_slice(method.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    if let Some(host) = edits.host {
        field(&mut head, &header::HOST, host);
    }
    let mut had_length = false;
    for (name, value) in headers {
        if *name == header::CONTENT_LENGTH {
            had_length = true;
            continue;
        }
        let dropped = is_hop_by_hop(name.as_str())
            || *name == header::EXPECT
            || (edits.host.is_some() && *name == header::HOST)
            || edits.set.iter().any(|(n, _)| *n == name)
            || edits
                .drop
                .is_some_and(|d| name.as_str().eq_ignore_ascii_case(d))
            || listed
                .iter()
                .any(|l| name.as_str().as_bytes().eq_ignore_ascii_case(l));
        if !dropped {
            field(&mut head, name, value);
        }
    }
    for (name, value) in edits.set {
        if let Some(value) = value {
            field(&mut head, name, value);
        }
    }
    if body_len > 0 || had_length {
        write_length(&mut head, b"content-length", body_len as u64);
    }
    head.extend_from_slice(b"\r\n");
    Bytes::from(head)
}

/// The head of `req` as the client wrote it, no edits: for the connection's own tests.
#[cfg(test)]
pub fn encode_head<B>(req: &http::Request<B>, body_len: usize) -> Bytes {
    let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    encode(
        req.method(),
        target,
        req.headers(),
        &Edits::default(),
        body_len,
    )
}

/// One field line.
fn field(head: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    write_field(head, name.as_str().as_bytes(), value.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn drops_what_is_the_connections_or_the_proxys_and_adds_the_proxys() {
        let h = head(&[
            ("host", "client.example"),
            ("connection", "keep-alive, X-Secret-Hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("te", "trailers"),
            ("proxy-authorization", "Basic x"),
            ("expect", "100-continue"),
            ("transfer-encoding", "chunked"),
            ("content-length", "11"),
            ("x-user", "alice"),
            ("x-request-id", "client-id"),
            ("authorization", "Bearer client"),
            ("accept", "a"),
            ("accept", "b"),
            ("content-type", "application/json"),
        ]);
        let host = HeaderValue::from_static("replica:8000");
        let rid = HeaderValue::from_static("proxy-id");
        let auth = HeaderValue::from_static("Bearer upstream");
        let rid_name = HeaderName::from_static("x-request-id");
        let set = [
            (&rid_name, Some(&rid)),
            (&header::AUTHORIZATION, Some(&auth)),
        ];
        let edits = Edits {
            host: Some(&host),
            set: &set,
            drop: Some("X-User"),
        };
        let got = encode(&Method::POST, "/v1/chat/completions?x=1", &h, &edits, 11);
        assert_eq!(
            std::str::from_utf8(&got).unwrap(),
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: replica:8000\r\naccept: a\r\n\
             accept: b\r\ncontent-type: application/json\r\nx-request-id: proxy-id\r\n\
             authorization: Bearer upstream\r\ncontent-length: 11\r\n\r\n"
        );
    }

    #[test]
    fn a_set_field_without_a_value_only_drops_and_lengths_follow_the_body() {
        let h = head(&[("x-api-key", "client"), ("content-length", "0")]);
        let key = HeaderName::from_static("x-api-key");
        let set = [(&key, None)];
        let edits = Edits {
            set: &set,
            ..Edits::default()
        };
        let got = encode(&Method::POST, "/", &h, &edits, 0);
        assert_eq!(&got[..], b"POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n");
        let got = encode(&Method::GET, "/", &HeaderMap::new(), &Edits::default(), 0);
        assert_eq!(&got[..], b"GET / HTTP/1.1\r\n\r\n");
    }
}
