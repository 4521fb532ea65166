//! The upstream response reader (src/proxy/upstream_h1.rs) on arbitrary bytes cut at arbitrary
//! points: no panic and no hang; the same message whatever the cuts and pauses; nothing read past
//! the end of a message (what follows it changes nothing and stays unread); and a connection kept
//! only when its message ended before the end of the stream.
//!
//! Input: byte 0 is flags (bit 0: the request is a HEAD; bit 1: every read is preceded by a
//! `Pending`), the low 3 bits of byte 1 say how many of the next bytes are cut sizes (each 1 +
//! the byte, used in turn; none: one piece), and the rest is the stream the upstream sends.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenmeter::proxy::fuzzing::{read_response, Outcome};

/// What follows the message on the stream: a whole second response, as a pipelining upstream
/// would send (it is never asked for, so it must stay unread).
const NEXT: &[u8] = b"HTTP/1.1 299 Next\r\ncontent-length: 4\r\n\r\nNEXT";

/// `stream` cut into pieces of `sizes` in turn, each after an empty piece (a `Pending`) if
/// `pause`.
fn cut<'a>(stream: &'a [u8], sizes: &[u8], pause: bool) -> Vec<&'a [u8]> {
    let mut pieces = Vec::new();
    let mut rest = stream;
    let mut i = 0;
    while !rest.is_empty() {
        let n = if sizes.is_empty() {
            rest.len()
        } else {
            (1 + sizes[i % sizes.len()] as usize).min(rest.len())
        };
        i += 1;
        if pause {
            pieces.push(&b""[..]);
        }
        pieces.push(&rest[..n]);
        rest = &rest[n..];
    }
    pieces
}

fn read(stream: &[u8], sizes: &[u8], pause: bool, head: bool) -> Outcome {
    let out = read_response(&cut(stream, sizes, pause), head);
    assert!(!out.stalled, "the reader waited on nothing: {out:?}");
    // The pool keeps a connection whose body ended, whose head allows it and whose buffer is
    // empty: that must never be one whose stream has ended (the message was cut short, or its
    // body was delimited by the close).
    if out.reusable && out.clean && out.error.is_none() {
        assert!(!out.saw_eof, "kept after the end of the stream: {out:?}");
    }
    if out.error.is_none() && out.saw_eof {
        assert!(!out.reusable, "a body that ran to the close, kept: {out:?}");
    }
    out
}

/// The same message read: all but the buffer's state at the end, which depends on the cuts.
fn assert_same(a: &Outcome, b: &Outcome) {
    assert_eq!(
        (&a.status, &a.headers, &a.body, &a.trailers, a.reusable),
        (&b.status, &b.headers, &b.body, &b.trailers, b.reusable),
        "{a:?}\n{b:?}"
    );
    assert_eq!((&a.error, a.incomplete), (&b.error, b.incomplete));
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (head, pause) = (data[0] & 1 != 0, data[0] & 2 != 0);
    let n = usize::from(data[1] & 7).min(data.len() - 2);
    let (sizes, input) = data[2..].split_at(n);
    let mut followed = input.to_vec();
    followed.extend_from_slice(NEXT);

    let cut_up = read(&followed, sizes, pause, head);
    let whole = read(&followed, &[], false, head);
    assert_same(&cut_up, &whole);
    if cut_up.error.is_none() {
        assert_eq!(cut_up.unread, whole.unread, "left unread, by the cuts");
    }

    // The input alone, then the end of the stream. If its message ended before that end, the
    // bytes that follow it must change nothing and be left unread.
    let alone = read(input, sizes, pause, head);
    if alone.error.is_some() {
        return;
    }
    if alone.saw_eof {
        // Delimited by the close: the body is everything up to it.
        let mut body = alone.body.to_vec();
        body.extend_from_slice(NEXT);
        assert!(
            cut_up.body == body,
            "body {:?}, not {:?}",
            cut_up.body,
            body.escape_ascii().to_string()
        );
        assert!(cut_up.error.is_none() && cut_up.unread.is_empty() && alone.unread.is_empty());
    } else {
        assert_same(&cut_up, &alone);
        let mut unread = alone.unread.to_vec();
        unread.extend_from_slice(NEXT);
        assert!(
            cut_up.unread == unread,
            "read past the message: left {:?}, not {:?}",
            cut_up.unread,
            unread.escape_ascii().to_string()
        );
    }
});
