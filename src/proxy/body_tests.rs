//! Tests of the response body wrapper's usage strip and of the frames it hands on unread.

use super::*;
use crate::dialect::chat::CHAT;
use crate::dialect::Dialect;

fn strip_all(
    body: &[u8],
    pieces: impl Iterator<Item = std::ops::Range<usize>>,
) -> (Vec<u8>, usize, usize) {
    let mut scanner = SseScanner::default();
    let mut reader = CHAT.stream_reader();
    let mut held = BytesMut::new();
    let mut out = Vec::new();
    let mut usage_events = 0;
    let mut choice_events = 0;
    let mut max_held = 0;
    for r in pieces {
        let data = Bytes::copy_from_slice(&body[r]);
        let sent = strip_usage_events(&mut *reader, &mut scanner, &mut held, &data, |s| {
            if s.usage.is_some() {
                usage_events += 1;
            }
            if s.choices > 0 {
                choice_events += 1;
            }
        });
        out.extend_from_slice(&sent);
        max_held = max_held.max(held.len());
    }
    out.extend_from_slice(&held);
    assert!(max_held < 400, "held at most one event");
    (out, usage_events, choice_events)
}

#[test]
fn usage_event_is_removed_for_every_split() {
    let body = crate::test_fixtures::recorded_body("03_chat_stream_usage.http");
    let text = String::from_utf8(body.clone()).unwrap();
    let expected: String = text
        .split_inclusive("\n\n")
        .filter(|e| !e.contains("\"choices\":[]"))
        .collect();
    for size in 1..=body.len() {
        let pieces = (0..body.len())
            .step_by(size)
            .map(|s| s..(s + size).min(body.len()));
        let (out, usage, choices) = strip_all(&body, pieces);
        assert_eq!(String::from_utf8(out).unwrap(), expected, "split {size}");
        assert_eq!((usage, choices), (1, 6), "split {size}");
    }
}

/// Frames handed on before they are read must be exactly those the strip sends unchanged.
#[test]
fn frames_passed_unread_are_those_the_strip_leaves_alone() {
    for name in [
        "03_chat_stream_usage.http",
        "05_chat_stream_usage_n2.http",
        "07_chat_stream_stop_usage.http",
    ] {
        let body = crate::test_fixtures::recorded_body(name);
        // Whole events, as vLLM writes them, and every even split.
        let mut splits: Vec<Vec<std::ops::Range<usize>>> = Vec::new();
        let text = String::from_utf8(body.clone()).unwrap();
        let mut at = 0;
        splits.push(
            text.split_inclusive("\n\n")
                .map(|e| {
                    at += e.len();
                    at - e.len()..at
                })
                .collect(),
        );
        for size in 1..=body.len() {
            splits.push(
                (0..body.len())
                    .step_by(size)
                    .map(|s| s..(s + size).min(body.len()))
                    .collect(),
            );
        }
        let mut unread = 0;
        for pieces in splits {
            let mut scanner = SseScanner::default();
            let mut reader = CHAT.stream_reader();
            let mut held = BytesMut::new();
            for r in pieces {
                let data = Bytes::copy_from_slice(&body[r]);
                let before = passes_strip_unread(&held, &data);
                let sent = strip_usage_events(&mut *reader, &mut scanner, &mut held, &data, |_| {});
                if before {
                    unread += 1;
                    assert_eq!(sent, data, "{name}: a frame passed unread went as it came");
                    assert!(held.is_empty(), "{name}: and left nothing held");
                }
            }
        }
        assert!(unread > 0, "{name}: some frames pass unread");
    }
}

#[test]
fn whole_frames_pass_without_copy_and_comments_survive() {
    let mut scanner = SseScanner::default();
    let mut reader = CHAT.stream_reader();
    let mut held = BytesMut::new();
    let frame = Bytes::from_static(
        b": keep-alive\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
    );
    let out = strip_usage_events(&mut *reader, &mut scanner, &mut held, &frame, |_| {});
    assert_eq!(out.as_ptr(), frame.as_ptr(), "zero-copy pass-through");
    let usage = Bytes::from_static(
        b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":1}}\n\ndata: [DONE]\n\n",
    );
    let out = strip_usage_events(&mut *reader, &mut scanner, &mut held, &usage, |_| {});
    assert_eq!(&out[..], b"data: [DONE]\n\n");
}
