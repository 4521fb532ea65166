//! HTTP/1.1 response messages as the upstream connection reads them, and request heads as it
//! writes them: the types, and the rules of RFC 9112 that decide how a body is framed (§6.3,
//! §7.1), whether a connection may be kept (§9.3) and what is refused. Heads and trailers are
//! parsed by `httparse`, hyper's own parser; `upstream_h1.rs` does the reading and writing.

use std::io;
use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};

use super::headers::list_tokens;
use super::upstream_fields::{parse, UpstreamFields, MAX_HEADERS};

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

/// A response head as read: status, fields, how its body is framed, and whether the connection
/// may carry another request once the body is over.
#[derive(Debug)]
pub struct Head {
    /// The status.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1 (the framing's, and the tests'; the client is answered in HTTP/1.1).
    #[cfg_attr(not(test), allow(dead_code))]
    pub version: Version,
    /// The fields as sent, framing fields included; the reason phrase too.
    pub fields: UpstreamFields,
    /// How the body is delimited.
    pub framing: Framing,
    /// The connection may be kept once the body has been read to its end.
    pub reusable: bool,
}

/// A response head as parsed, before its framing is decided (an interim one is read past).
#[derive(Debug)]
pub(super) struct Parsed {
    /// The status.
    pub status: StatusCode,
    version: Version,
    fields: UpstreamFields,
    framing: FramingFields,
}

/// What the fields say of the body's framing and the connection, read in the parse's pass.
#[derive(Debug)]
struct FramingFields {
    /// `Connection` lists `close`.
    close: bool,
    /// `Connection` lists `keep-alive`.
    keep_alive: bool,
    /// A `Transfer-Encoding` field is there.
    transfer_encoding: bool,
    /// The last transfer coding named is `chunked`.
    chunked_last: bool,
    /// A `Content-Length` field is there.
    has_length: bool,
    /// The `content-length`, if any; `Err` if its values are invalid or disagree.
    length: Result<Option<u64>, ()>,
}

/// Parses a complete head at the start of `buf` and takes it off; `None` while it is partial.
pub(super) fn parse_head(buf: &mut BytesMut) -> Result<Option<Parsed>, H1Error> {
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let (parsed, result) = parse(buf, &mut fields);
    let n = match result {
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
    // httparse takes the names and values `HeaderName` and `HeaderValue` take (RFC 9110 §5.1,
    // §5.5): tokens, and visible ASCII, tabs, spaces and obs-text.
    let mut framing = FramingFields {
        close: false,
        keep_alive: false,
        transfer_encoding: false,
        chunked_last: false,
        has_length: false,
        length: Ok(None),
    };
    let mut content_type = None;
    let at = |v: &[u8]| (v.as_ptr() as usize - buf.as_ptr() as usize) as u32;
    for h in parsed.headers.iter() {
        let is = |n: &HeaderName| h.name.eq_ignore_ascii_case(n.as_str());
        let tokens = || list_tokens(h.value);
        if is(&header::CONNECTION) {
            for t in tokens() {
                framing.close |= t.eq_ignore_ascii_case(b"close");
                framing.keep_alive |= t.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if is(&header::TRANSFER_ENCODING) {
            framing.transfer_encoding = true;
            if let Some(last) = tokens().last() {
                framing.chunked_last = last.eq_ignore_ascii_case(b"chunked");
            }
        } else if is(&header::CONTENT_LENGTH) {
            framing.has_length = true;
            framing.length = framing.length.and_then(|l| content_length(l, h.value));
        } else if is(&header::CONTENT_TYPE) && content_type.is_none() {
            content_type = Some((at(h.value), at(h.value) + h.value.len() as u32));
        }
    }
    let reason = parsed.reason.map_or((0, 0), |r| {
        (at(r.as_bytes()), at(r.as_bytes()) + r.len() as u32)
    });
    let fields = UpstreamFields::new(Bytes::copy_from_slice(&buf[..n]), reason, content_type);
    buf.advance(n);
    Ok(Some(Parsed {
        status,
        version,
        fields,
        framing,
    }))
}

/// The fields of a trailer section as a map, in order.
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

/// How the body of a `method` request's response is framed (RFC 9112 §6.3), and whether its
/// connection may be kept. An invalid `content-length` leaves the body's end unknown: the
/// response is refused, as §6.3 tells a user agent to. What the client gets of the framing
/// fields is the writer's (`UpstreamFields::forwarded`): a length that does not describe the
/// body (beside a transfer coding, §6.3 point 3) is left out, and a list of equal lengths
/// (§6.3, point 5) goes as the one length it means.
pub(super) fn frame_head(parsed: Parsed, method: &Method) -> Result<Head, H1Error> {
    let Parsed {
        status,
        version,
        fields,
        framing: f,
    } = parsed;
    // RFC 9112 §9.3: `close` ends the connection whatever else `Connection` lists; HTTP/1.0 keeps
    // it only when asked to.
    let keep_alive = !f.close && (version != Version::HTTP_10 || f.keep_alive);
    let (framing, reusable) = if status == StatusCode::SWITCHING_PROTOCOLS {
        (Framing::Done, false)
    } else if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        (Framing::Done, keep_alive)
    } else if f.transfer_encoding {
        if version == Version::HTTP_10 {
            // HTTP/1.0 has no transfer codings (RFC 9112 §6.1): the framing of a body cannot be
            // trusted, and hyper refuses it too. (A response without a body, above, has none to
            // frame: §6.3 rule 1 comes first.)
            return Err(H1Error::Invalid("HTTP/1.0 response with transfer-encoding"));
        }
        let framing = if f.chunked_last {
            Framing::Chunked(Chunk::Size)
        } else {
            Framing::UntilClose
        };
        // With a length beside it the framing is suspect (§6.1): the chunks are read and the
        // connection is not kept.
        let chunked = matches!(framing, Framing::Chunked(_));
        (framing, keep_alive && chunked && !f.has_length)
    } else {
        match f
            .length
            .map_err(|()| H1Error::Invalid("invalid content-length"))?
        {
            Some(0) => (Framing::Done, keep_alive),
            Some(n) => (Framing::Length(n), keep_alive),
            None => (Framing::UntilClose, false),
        }
    };
    Ok(Head {
        status,
        version,
        fields,
        framing,
        reusable,
    })
}

/// The `content-length` so far, `length`, with one more field's `value`; `Err` if the value is
/// invalid or disagrees.
fn content_length(mut length: Option<u64>, value: &[u8]) -> Result<Option<u64>, ()> {
    for part in value.split(|&b| b == b',') {
        // Digits only (RFC 9110 §8.6: `1*DIGIT`): `parse` alone would take `+5`.
        let part = part.trim_ascii();
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return Err(());
        }
        let n: u64 = std::str::from_utf8(part)
            .map_err(|_| ())?
            .parse()
            .map_err(|_| ())?;
        if length.is_some_and(|l| l != n) {
            return Err(());
        }
        length = Some(n);
    }
    Ok(length)
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
