//! The responses the differential test generates (`upstream_h1_diff_tests.rs`): what they are,
//! how each is written on the wire, and the proptest strategies that make them.

use http::Method;
use proptest::prelude::*;

/// How a generated body is delimited on the wire.
#[derive(Debug, Clone)]
pub(super) enum Body {
    /// By `content-length`, written in one of five ways (see [`Case::wire`]).
    Length { data: Vec<u8>, form: u8 },
    /// By `transfer-encoding` with `chunked` last, named in one of four ways (see
    /// [`Case::wire`]); with `stray_length`, a `content-length` beside it.
    Chunked {
        chunks: Vec<Chunk>,
        trailers: Vec<(String, String)>,
        te: u8,
        stray_length: bool,
    },
    /// By the close of the connection; with `gzip`, under `transfer-encoding: gzip` (a coding
    /// other than chunked last: read until the close, RFC 9112 §6.3 rule 4).
    Close { data: Vec<u8>, gzip: bool },
}

/// One chunk: its data, an extension (or whitespace) after its size, and how the size is
/// written (leading zeros, upper-case hex digits).
#[derive(Debug, Clone)]
pub(super) struct Chunk {
    pub(super) data: Vec<u8>,
    pub(super) ext: &'static str,
    pub(super) zeros: usize,
    pub(super) upper: bool,
}

/// A generated response and how it is sent.
#[derive(Debug, Clone)]
pub(super) struct Case {
    /// The request is a HEAD (else a GET).
    pub(super) head: bool,
    http10: bool,
    /// Interim responses before the final one (HTTP/1.1 only: 1xx is not HTTP/1.0's).
    pub(super) interim: Vec<u16>,
    pub(super) status: u16,
    /// A reason phrase other than the canonical one.
    pub(super) reason: Option<&'static str>,
    pub(super) fields: Vec<(String, String)>,
    pub(super) connection: Option<&'static str>,
    pub(super) body: Body,
    /// The sizes of the writes, in turn (none: one write).
    pub(super) cuts: Vec<usize>,
}

impl Case {
    pub(super) fn method(&self) -> Method {
        if self.head {
            Method::HEAD
        } else {
            Method::GET
        }
    }

    /// The response has no body whatever its framing fields say (RFC 9112 §6.3 rules 1-2).
    pub(super) fn bodiless(&self) -> bool {
        self.head || self.status == 204 || self.status == 304
    }

    /// The bytes on the wire.
    pub(super) fn wire(&self) -> Vec<u8> {
        let mut w = Vec::new();
        for code in &self.interim {
            w.extend_from_slice(format!("HTTP/1.1 {code} Interim\r\n").as_bytes());
            if *code == 103 {
                w.extend_from_slice(b"link: </style.css>; rel=preload\r\n");
            }
            w.extend_from_slice(b"\r\n");
        }
        let canonical = http::StatusCode::from_u16(self.status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("");
        let version = if self.http10 { "1.0" } else { "1.1" };
        let reason = self.reason.unwrap_or(canonical);
        w.extend_from_slice(format!("HTTP/{version} {} {reason}\r\n", self.status).as_bytes());
        for (name, value) in &self.fields {
            w.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        if let Some(c) = self.connection {
            w.extend_from_slice(format!("Connection: {c}\r\n").as_bytes());
        }
        let body = match &self.body {
            Body::Length { data, form } => {
                let n = data.len();
                let field = match form % 5 {
                    0 => format!("content-length: {n}\r\n"),
                    1 => format!("Content-Length: {n}, {n}\r\n"),
                    2 => format!("content-length: {n}\r\ncontent-length: {n}\r\n"),
                    3 => format!("content-length:   {n}  \r\n"),
                    _ => format!("content-length: 00{n}\r\n"),
                };
                w.extend_from_slice(field.as_bytes());
                data.clone()
            }
            Body::Chunked {
                chunks,
                trailers,
                te,
                stray_length,
            } => {
                w.extend_from_slice(match te % 4 {
                    0 => &b"Transfer-Encoding: chunked\r\n"[..],
                    1 => b"transfer-encoding: Chunked\r\n",
                    2 => b"Transfer-Encoding: gzip, chunked\r\n",
                    _ => b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
                });
                if *stray_length {
                    w.extend_from_slice(b"content-length: 3\r\n");
                }
                let mut b = Vec::new();
                for c in chunks {
                    let size = if c.upper {
                        format!("{:X}", c.data.len())
                    } else {
                        format!("{:x}", c.data.len())
                    };
                    b.extend_from_slice(
                        format!("{}{size}{}\r\n", "0".repeat(c.zeros), c.ext).as_bytes(),
                    );
                    b.extend_from_slice(&c.data);
                    b.extend_from_slice(b"\r\n");
                }
                b.extend_from_slice(b"0\r\n");
                for (name, value) in trailers {
                    b.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
                }
                b.extend_from_slice(b"\r\n");
                b
            }
            Body::Close { data, gzip } => {
                if *gzip {
                    w.extend_from_slice(b"Transfer-Encoding: gzip\r\n");
                }
                data.clone()
            }
        };
        w.extend_from_slice(b"\r\n");
        if !self.bodiless() {
            w.extend_from_slice(&body);
        }
        w
    }

    /// The server closes after the response when the response does not keep the connection
    /// (RFC 9112 §9.3), or its body runs to the close. Otherwise it keeps the socket open until
    /// the client closes it: a close right after a kept-alive response would race hyper's check
    /// of its connection.
    pub(super) fn server_closes(&self) -> bool {
        let tokens: Vec<String> = self
            .connection
            .unwrap_or("")
            .split(',')
            .map(|t| t.trim().to_ascii_lowercase())
            .collect();
        let close = tokens.iter().any(|t| t == "close");
        let keep = tokens.iter().any(|t| t == "keep-alive");
        let persistent = !close && (!self.http10 || keep);
        let to_close = matches!(self.body, Body::Close { .. }) && !self.bodiless();
        !persistent || to_close || (self.http10 && self.transfer_coded())
    }

    /// The response has a `transfer-encoding` field.
    pub(super) fn has_transfer_encoding(&self) -> bool {
        matches!(
            self.body,
            Body::Chunked { .. } | Body::Close { gzip: true, .. }
        )
    }

    /// The response has a `transfer-encoding` field and a body it would frame.
    pub(super) fn transfer_coded(&self) -> bool {
        !self.bodiless() && self.has_transfer_encoding()
    }
}

/// Where ours may keep fewer connections than hyper: a chunked response with a
/// `content-length` beside it, which RFC 9112 §6.3 (rule 3) says "ought to be handled as an
/// error" (ours reads it by its chunks but does not keep the connection, hyper keeps it); and an
/// HTTP/1.0 response with `transfer-encoding`, after which §6.1 says to "close the connection
/// after processing the message" (hyper keeps a bodiless one that asks for keep-alive).
pub(super) fn ours_may_close(case: &Case) -> bool {
    let stray_length = matches!(
        case.body,
        Body::Chunked {
            stray_length: true,
            ..
        }
    );
    (stray_length && !case.bodiless()) || (case.http10 && case.has_transfer_encoding())
}

pub(super) fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

/// Field names and values as servers send them: visible ASCII, inner spaces, mixed case.
pub(super) fn field() -> impl Strategy<Value = (String, String)> {
    (
        prop_oneof![
            "x-[a-z0-9-]{1,8}",
            Just("Content-Type".to_owned()),
            Just("server".to_owned()),
            Just("Vary".to_owned()),
        ],
        "[!-~]([ -~]{0,16}[!-~])?",
    )
}

pub(super) fn chunk() -> impl Strategy<Value = Chunk> {
    (
        proptest::collection::vec(any::<u8>(), 1..48),
        prop_oneof![
            4 => Just(""),
            1 => Just(";a=b"),
            1 => Just(";flag"),
            1 => Just(";q=\"x; y\""),
            1 => Just(" ;sp=1"),
            1 => Just("\t;tab"),
            1 => Just(" "),
        ],
        prop_oneof![8 => 0usize..3, 1 => 14usize..17],
        any::<bool>(),
    )
        .prop_map(|(data, ext, zeros, upper)| Chunk {
            data,
            ext,
            zeros,
            upper,
        })
}

pub(super) fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        (bytes(200), any::<u8>()).prop_map(|(data, form)| Body::Length { data, form }),
        (
            proptest::collection::vec(chunk(), 0..5),
            proptest::collection::vec(("x-t[a-z]{0,4}", "[!-~]{1,12}"), 0..3),
            any::<u8>(),
            prop::bool::weighted(0.15),
        )
            .prop_map(|(chunks, trailers, te, stray_length)| Body::Chunked {
                chunks,
                trailers,
                te,
                stray_length,
            }),
        (bytes(200), prop::bool::weighted(0.2)).prop_map(|(data, gzip)| Body::Close { data, gzip }),
    ]
}

pub(super) fn case() -> impl Strategy<Value = Case> {
    (
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.25),
        proptest::collection::vec(prop_oneof![Just(100u16), Just(102), Just(103)], 0..3),
        prop_oneof![
            6 => Just(200u16),
            1 => Just(201),
            2 => Just(204),
            1 => Just(206),
            2 => Just(304),
            1 => Just(404),
            1 => Just(429),
            1 => Just(503),
        ],
        prop_oneof![
            4 => Just(None),
            1 => Just(Some("")),
            1 => Just(Some("Fine Thanks")),
        ],
        proptest::collection::vec(field(), 0..4),
        prop_oneof![
            3 => Just(None),
            1 => Just(Some("close")),
            1 => Just(Some("keep-alive")),
            1 => Just(Some("Keep-Alive")),
            1 => Just(Some("keep-alive, close")),
            1 => Just(Some("x-option, Close")),
        ],
        body(),
        proptest::collection::vec(1usize..40, 0..6),
    )
        .prop_map(
            |(head, http10, interim, status, reason, fields, connection, body, cuts)| Case {
                head,
                http10,
                interim: if http10 { Vec::new() } else { interim },
                status,
                reason,
                fields,
                connection,
                body,
                cuts,
            },
        )
}
