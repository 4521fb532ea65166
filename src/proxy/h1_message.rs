//! HTTP/1.1 response messages as the upstream connection reads them, and request heads as it
//! writes them: the types, and the rules of RFC 9112 that decide how a body is framed (§6.3,
//! §7.1), whether a connection may be kept (§9.3) and what is refused. Heads and trailers are
//! parsed by `httparse`, hyper's own parser; `upstream_h1.rs` does the reading and writing.

use std::io;

use bytes::{Buf, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, Version};

use super::headers::list_elements;

/// Most header fields a response head (or a trailer section) may have, as hyper allows.
pub(super) const MAX_HEADERS: usize = 128;

/// Why a response could not be read.
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    /// The socket failed.
    #[error("upstream connection failed")]
    Io(#[from] io::Error),
    /// The upstream closed the connection before the message was complete.
    #[error("upstream closed the connection mid-message")]
    Incomplete,
    /// The upstream sent what is not HTTP/1.1.
    #[error("invalid response from the upstream: {0}")]
    Invalid(&'static str),
}

/// How the rest of a response body is delimited, and how far it has been read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `content-length`: this many bytes are left.
    Length(u64),
    /// `transfer-encoding: chunked`, at this step.
    Chunked(Chunk),
    /// Neither: the body ends when the upstream closes the connection.
    UntilClose,
    /// The body is over.
    Done,
}

/// Where a chunked body's reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk's data, with this many bytes left.
    Data(u64),
    /// After a chunk's data, before its CRLF.
    DataEnd,
    /// After the last chunk, before the trailer section and its empty line.
    Trailers,
}

/// A response head as read: the response, how its body is framed, and whether the connection
/// may carry another request once the body is over.
#[derive(Debug)]
pub struct Head {
    /// Status, version, headers (as sent, framing headers included) and, for a reason phrase
    /// that is not the status's canonical one, a [`hyper::ext::ReasonPhrase`] extension.
    pub response: Response<()>,
    /// How the body is delimited.
    pub framing: Framing,
    /// The connection may be kept once the body has been read to its end.
    pub reusable: bool,
}

/// Parses a complete head at the start of `buf` and takes it off; `None` while it is partial.
pub(super) fn parse_head(buf: &mut BytesMut) -> Result<Option<Response<()>>, H1Error> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut fields);
    let n = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(H1Error::Invalid("too many response header fields"))
        }
        Err(_) => return Err(H1Error::Invalid("malformed response head")),
    };
    let status = parsed
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(H1Error::Invalid("invalid status code"))?;
    let version = if parsed.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = version;
    *response.headers_mut() = header_map(parsed.headers)?;
    let reason = parsed.reason.unwrap_or("");
    if status.canonical_reason() != Some(reason) {
        if let Ok(r) = hyper::ext::ReasonPhrase::try_from(reason.as_bytes()) {
            response.extensions_mut().insert(r);
        }
    }
    buf.advance(n);
    Ok(Some(response))
}

/// The header fields of a head or trailer section as a map, in order.
pub(super) fn header_map(fields: &[httparse::Header<'_>]) -> Result<HeaderMap, H1Error> {
    let mut map = HeaderMap::with_capacity(fields.len());
    for f in fields {
        let name = HeaderName::from_bytes(f.name.as_bytes())
            .map_err(|_| H1Error::Invalid("invalid header name"))?;
        let value = HeaderValue::from_bytes(f.value)
            .map_err(|_| H1Error::Invalid("invalid header value"))?;
        map.append(name, value);
    }
    Ok(map)
}

/// How the body of `response` to a `method` request is framed (RFC 9112 §6.3), and whether its
/// connection may be kept. An invalid `content-length` leaves the body's end unknown: the
/// response is refused, as §6.3 tells a user agent to.
pub(super) fn frame_head(mut response: Response<()>, method: &Method) -> Result<Head, H1Error> {
    let headers = response.headers();
    let status = response.status();
    // RFC 9112 §9.3: `close` ends the connection whatever else `Connection` lists; HTTP/1.0 keeps
    // it only when asked to.
    let close = has_token(headers, &header::CONNECTION, "close");
    let keep_alive = !close
        && (response.version() != Version::HTTP_10
            || has_token(headers, &header::CONNECTION, "keep-alive"));
    let (framing, reusable) = if status == StatusCode::SWITCHING_PROTOCOLS {
        (Framing::Done, false)
    } else if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        (Framing::Done, keep_alive)
    } else if headers.contains_key(header::TRANSFER_ENCODING) {
        if response.version() == Version::HTTP_10 {
            // HTTP/1.0 has no transfer codings (RFC 9112 §6.1): the framing of a body cannot be
            // trusted, and hyper refuses it too. (A response without a body, above, has none to
            // frame: §6.3 rule 1 comes first.)
            return Err(H1Error::Invalid("HTTP/1.0 response with transfer-encoding"));
        }
        let framing = if last_coding_is_chunked(headers) {
            Framing::Chunked(Chunk::Size)
        } else {
            Framing::UntilClose
        };
        // With a length beside it the framing is suspect (§6.1): the chunks are read, the
        // connection is not kept, and the length, which does not describe the body, is removed
        // before the response is forwarded (§6.3, point 3).
        let suspect = headers.contains_key(header::CONTENT_LENGTH);
        response.headers_mut().remove(header::CONTENT_LENGTH);
        let chunked = matches!(framing, Framing::Chunked(_));
        (framing, keep_alive && chunked && !suspect)
    } else {
        let fields = headers.get_all(header::CONTENT_LENGTH).iter().count();
        let length =
            content_length(headers).map_err(|()| H1Error::Invalid("invalid content-length"))?;
        if let Some(n) = length {
            if fields > 1
                || headers
                    .get(header::CONTENT_LENGTH)
                    .is_some_and(|v| v.as_bytes().contains(&b','))
            {
                // A list of equal lengths (§6.3, point 5) is forwarded as the one length it
                // means, not as it came.
                response
                    .headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            }
        }
        match length {
            Some(0) => (Framing::Done, keep_alive),
            Some(n) => (Framing::Length(n), keep_alive),
            None => (Framing::UntilClose, false),
        }
    };
    Ok(Head {
        response,
        framing,
        reusable,
    })
}

/// The `content-length`, if any; `Err` if its values are invalid or disagree.
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, ()> {
    let mut length = None;
    for v in headers.get_all(header::CONTENT_LENGTH) {
        for part in v.to_str().map_err(|_| ())?.split(',') {
            // Digits only (RFC 9110 §8.6: `1*DIGIT`): `parse` alone would take `+5`.
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(());
            }
            let n: u64 = part.parse().map_err(|_| ())?;
            if length.is_some_and(|l| l != n) {
                return Err(());
            }
            length = Some(n);
        }
    }
    Ok(length)
}

/// Whether the last transfer coding named is `chunked`.
fn last_coding_is_chunked(headers: &HeaderMap) -> bool {
    list_elements(headers, &header::TRANSFER_ENCODING)
        .next_back()
        .is_some_and(|c| c.eq_ignore_ascii_case("chunked"))
}

/// Whether a comma-separated header lists `token` (case-insensitive).
fn has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    list_elements(headers, name).any(|t| t.eq_ignore_ascii_case(token))
}

/// The size of a chunk from its size line, and how many bytes of extensions the line carries.
/// RFC 9112 §7.1: `1*HEXDIG`, then optional whitespace (which hyper also allows) and `;`
/// extensions; anything else after the digits is refused.
pub(super) fn chunk_size(line: &[u8]) -> Result<(u64, usize), H1Error> {
    let digits_end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    // Leading zeros are digits too (`1*HEXDIG`); what is left must fit 64 bits.
    let zeros = line[..digits_end]
        .iter()
        .take_while(|&&b| b == b'0')
        .count();
    if digits_end == 0 || digits_end - zeros > 16 {
        return Err(invalid_size());
    }
    let rest = &line[digits_end..];
    let ws = rest
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(rest.len());
    let extension = match rest.get(ws) {
        None => 0,
        Some(b';') => rest.len() - ws,
        Some(_) => return Err(invalid_size()),
    };
    let mut size = 0u64;
    for &b in &line[..digits_end] {
        let d = char::from(b).to_digit(16).ok_or_else(invalid_size)?;
        size = size << 4 | u64::from(d);
    }
    Ok((size, extension))
}

fn invalid_size() -> H1Error {
    H1Error::Invalid("invalid chunk size")
}

/// Whether every line of a header section ends in CRLF.
pub(super) fn crlf_lines(section: &[u8]) -> bool {
    section
        .iter()
        .enumerate()
        .all(|(i, &b)| b != b'\n' || (i > 0 && section[i - 1] == b'\r'))
}

/// An interim response, read past: 1xx but `101 Switching Protocols`, which ends the exchange.
pub(super) fn is_interim(status: StatusCode) -> bool {
    status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS
}
