//! An incremental Server-Sent Events scanner: bytes in, complete events out, whatever the split.
//!
//! It never copies an event whose single `data:` line lies inside one input slice (the common
//! case: vLLM writes one event per HTTP chunk); events split across slices, or spread over several
//! `data:` lines, are assembled in a reused buffer bounded by `max_event_bytes`.

/// One complete event, with where it lies in the current slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    /// The event's data: its `data:` lines joined with `\n`, field names and one leading space removed.
    pub data: &'a [u8],
    /// Offset in the current slice where the event's first line began, when it began in it.
    pub start: Option<usize>,
    /// Offset in the current slice just past the blank line that ended the event.
    pub end: usize,
    /// The event's data exceeded `max_event_bytes`; `data` is empty and must not be interpreted.
    pub oversize: bool,
}

/// Length of `data: `, by which a pending line may exceed the data limit.
const DATA_PREFIX_LEN: usize = 6;

/// Default limit for one event's data (and for one pending line).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;

/// Incremental SSE scanner with bounded memory.
#[derive(Debug)]
pub struct SseScanner {
    max_event_bytes: usize,
    /// An unterminated line carried over from the previous slice.
    partial: Vec<u8>,
    /// `partial` outgrew the limit; its content was dropped.
    partial_overflow: bool,
    /// Whether a line is pending in `partial` (it may be empty so far, e.g. after a split `\r`).
    partial_pending: bool,
    /// The previous slice ended in `\r`: a leading `\n` belongs to that line end.
    after_cr: bool,
    /// Data of the event being assembled, when it could not be borrowed.
    data: Vec<u8>,
    /// Number of `data` lines in the current event.
    data_lines: u32,
    /// The current event outgrew the limit.
    oversize: bool,
    /// After `feed`: where the unfinished block began in the last slice, if it began there.
    pending_from: Option<usize>,
    /// A non-blank line has been seen since the last blank line.
    in_event: bool,
}

impl Default for SseScanner {
    fn default() -> Self {
        SseScanner::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl SseScanner {
    /// A scanner that holds at most `max_event_bytes` of one event (plus one line of that size).
    pub fn new(max_event_bytes: usize) -> Self {
        SseScanner {
            max_event_bytes,
            partial: Vec::new(),
            partial_overflow: false,
            partial_pending: false,
            after_cr: false,
            data: Vec::new(),
            data_lines: 0,
            oversize: false,
            in_event: false,
            pending_from: None,
        }
    }

    /// True when part of an event has been seen and its end has not.
    pub fn in_event(&self) -> bool {
        self.in_event || (self.partial_pending && !self.partial.is_empty())
    }

    /// Bytes held for the unfinished event and line.
    pub fn buffered(&self) -> usize {
        self.data.len() + self.partial.len()
    }

    /// Feeds one slice; calls `on_event` for every event completed inside it, in order.
    pub fn feed(&mut self, chunk: &[u8], mut on_event: impl FnMut(SseEvent<'_>)) {
        let mut pos = 0;
        if chunk.is_empty() {
            return;
        }
        if self.after_cr {
            self.after_cr = false;
            if chunk[0] == b'\n' {
                pos = 1;
            }
        }
        let mut event_start = if self.in_event() { None } else { Some(pos) };
        // The current event's only data value, borrowed from this slice: (from, to).
        let mut borrowed: Option<(usize, usize)> = None;
        while pos < chunk.len() {
            let Some(rel) = find_eol(&chunk[pos..]) else {
                self.keep_partial(&chunk[pos..]);
                break;
            };
            let term = pos + rel;
            let mut next = term + 1;
            if chunk[term] == b'\r' {
                match chunk.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            let line_start = pos;
            pos = next;
            if self.partial_pending {
                self.keep_partial(&chunk[line_start..term]);
                let line = std::mem::take(&mut self.partial);
                let overflow = std::mem::replace(&mut self.partial_overflow, false);
                self.partial_pending = false;
                if let Some((from, to)) = borrowed.take() {
                    self.push_data(&chunk[from..to], false);
                }
                if overflow {
                    if line.starts_with(b"data:") {
                        self.in_event = true;
                        self.data_lines += 1;
                        self.oversize = true;
                    }
                } else {
                    self.take_line(
                        &line,
                        None,
                        &mut borrowed,
                        &mut on_event,
                        &mut event_start,
                        next,
                    );
                }
                self.partial = line;
                self.partial.clear();
                continue;
            }
            self.take_line(
                &chunk[line_start..term],
                Some((chunk, line_start)),
                &mut borrowed,
                &mut on_event,
                &mut event_start,
                next,
            );
        }
        if let Some((from, to)) = borrowed.take() {
            self.push_data(&chunk[from..to], false);
        }
        self.pending_from = if self.in_event() { event_start } else { None };
    }

    /// After [`feed`](Self::feed), when [`in_event`](Self::in_event): the offset in the slice just
    /// fed where the unfinished block (event, comment or partial line) began; `None` when it began
    /// in an earlier slice.
    pub fn pending_from(&self) -> Option<usize> {
        self.pending_from
    }

    /// Handles one complete line. `origin` locates it in the current slice when it lies there.
    fn take_line(
        &mut self,
        line: &[u8],
        origin: Option<(&[u8], usize)>,
        borrowed: &mut Option<(usize, usize)>,
        on_event: &mut impl FnMut(SseEvent<'_>),
        event_start: &mut Option<usize>,
        next: usize,
    ) {
        if line.is_empty() {
            if self.data_lines > 0 {
                let data: &[u8] = if self.oversize {
                    &[]
                } else if let (Some((from, to)), Some((chunk, _))) = (*borrowed, origin) {
                    &chunk[from..to]
                } else {
                    &self.data
                };
                on_event(SseEvent {
                    data,
                    start: *event_start,
                    end: next,
                    oversize: self.oversize,
                });
            }
            *borrowed = None;
            self.reset_event();
            *event_start = Some(next);
            return;
        }
        self.in_event = true;
        if line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&c| c == b':') {
            Some(p) => (&line[..p], &line[p + 1..]),
            None => (line, &line[line.len()..]),
        };
        if field != b"data" {
            return;
        }
        let value = value.strip_prefix(b" ").unwrap_or(value);
        self.data_lines += 1;
        if self.data_lines == 1 {
            if let Some((_, line_start)) = origin {
                // Offsets of `value` inside the slice.
                let from = line_start + (line.len() - value.len());
                *borrowed = Some((from, from + value.len()));
                if value.len() > self.max_event_bytes {
                    *borrowed = None;
                    self.oversize = true;
                }
                return;
            }
        } else if let (Some((from, to)), Some((chunk, _))) = (borrowed.take(), origin) {
            self.push_data(&chunk[from..to], false);
        }
        self.push_data(value, self.data_lines > 1);
    }

    fn keep_partial(&mut self, bytes: &[u8]) {
        self.partial_pending = true;
        if self.partial_overflow {
            return;
        }
        // A line may exceed the data limit by its field name and separator (`data: `), so that
        // whether an event is oversize never depends on where the input was split.
        if self.partial.len() + bytes.len() > self.max_event_bytes + DATA_PREFIX_LEN {
            // Keep the field name: an overlong `data:` line makes its event oversize.
            self.partial_overflow = true;
            self.partial.extend_from_slice(&bytes[..bytes.len().min(5)]);
            self.partial.truncate(5);
            return;
        }
        self.partial.extend_from_slice(bytes);
    }

    fn push_data(&mut self, bytes: &[u8], newline_first: bool) {
        if self.oversize {
            return;
        }
        let extra = bytes.len() + newline_first as usize;
        if self.data.len() + extra > self.max_event_bytes {
            self.oversize = true;
            self.data.clear();
            return;
        }
        if newline_first {
            self.data.push(b'\n');
        }
        self.data.extend_from_slice(bytes);
    }

    fn reset_event(&mut self) {
        self.data.clear();
        if self.data.capacity() > 64 * 1024 {
            self.data.shrink_to(64 * 1024);
        }
        self.data_lines = 0;
        self.oversize = false;
        self.in_event = false;
    }
}

/// Index of the first `\n` or `\r` in `s`: this search runs over every byte of every streamed
/// event; memchr's vector search does it 16–32 bytes per step.
fn find_eol(s: &[u8]) -> Option<usize> {
    memchr::memchr2(b'\n', b'\r', s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects (data, start, end) of every event when `input` is fed in the given pieces.
    pub(crate) fn events_of(pieces: &[&[u8]], max: usize) -> Vec<(Vec<u8>, bool)> {
        let mut s = SseScanner::new(max);
        let mut out = Vec::new();
        for p in pieces {
            s.feed(p, |e| out.push((e.data.to_vec(), e.oversize)));
        }
        out
    }

    #[test]
    fn one_event_per_slice_is_borrowed_with_offsets() {
        let mut s = SseScanner::default();
        let input = b"data: {\"a\":1}\n\ndata: [DONE]\n\n";
        let mut seen = Vec::new();
        s.feed(input, |e| seen.push((e.data.to_vec(), e.start, e.end)));
        assert_eq!(
            seen,
            vec![
                (b"{\"a\":1}".to_vec(), Some(0), 15),
                (b"[DONE]".to_vec(), Some(15), 29)
            ]
        );
        assert!(!s.in_event());
        assert_eq!(s.buffered(), 0);
    }

    #[test]
    fn split_event_reports_no_start_and_end_in_last_slice() {
        let mut s = SseScanner::default();
        let mut seen = Vec::new();
        s.feed(b": keep-alive\n\ndata: {\"x\"", |e| {
            seen.push((e.data.to_vec(), e.start, e.end));
        });
        assert!(seen.is_empty());
        assert!(s.in_event());
        s.feed(b":2}\n\n", |e| seen.push((e.data.to_vec(), e.start, e.end)));
        assert_eq!(seen, vec![(b"{\"x\":2}".to_vec(), None, 5)]);
    }

    #[test]
    fn multi_line_data_crlf_and_comments() {
        let ev = events_of(
            &[b": c\r\ndata:a\r\ndata: b\r\nid: 3\r\n\r\ndata\n\n"],
            1024,
        );
        assert_eq!(ev, vec![(b"a\nb".to_vec(), false), (Vec::new(), false)]);
    }

    #[test]
    fn lone_cr_split_from_lf_is_one_line_end() {
        let ev = events_of(&[b"data: x\r", b"\n\r", b"\n"], 1024);
        assert_eq!(ev, vec![(b"x".to_vec(), false)]);
    }

    #[test]
    fn blank_lines_and_comment_only_blocks_are_not_events() {
        assert!(events_of(&[b"\n\n: ping\n\n\n"], 1024).is_empty());
    }

    #[test]
    fn oversize_events_are_flagged_and_memory_stays_bounded() {
        let big = vec![b'x'; 100];
        let mut input = b"data: ".to_vec();
        input.extend_from_slice(&big);
        input.extend_from_slice(b"\n\ndata: ok\n\n");
        for split in [1, 7, 50, input.len()] {
            let pieces: Vec<&[u8]> = input.chunks(split).collect();
            let mut s = SseScanner::new(32);
            let mut out = Vec::new();
            for p in &pieces {
                s.feed(p, |e| out.push((e.data.to_vec(), e.oversize)));
                assert!(s.buffered() <= 2 * 32 + 6, "held {} bytes", s.buffered());
            }
            assert_eq!(
                out,
                vec![(Vec::new(), true), (b"ok".to_vec(), false)],
                "split {split}"
            );
        }
    }
}

#[cfg(test)]
mod split_properties {
    use super::*;
    use proptest::prelude::*;

    /// Events of `input` fed whole, as the reference.
    fn reference(input: &[u8]) -> Vec<Vec<u8>> {
        let mut s = SseScanner::new(1 << 16);
        let mut out = Vec::new();
        s.feed(input, |e| out.push(e.data.to_vec()));
        out
    }

    fn stream_text() -> impl Strategy<Value = Vec<u8>> {
        let line = prop_oneof![
            "[a-z{}\":,0-9 ]{0,40}".prop_map(|s| format!("data: {s}")),
            "[a-z ]{0,10}".prop_map(|s| format!(":{s}")),
            Just("data".to_string()),
            Just("data:[DONE]".to_string()),
            Just("event: x".to_string()),
            Just(String::new()),
        ];
        (
            proptest::collection::vec(line, 0..30),
            prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
        )
            .prop_map(|(lines, eol)| {
                let mut s = lines.join(eol);
                s.push_str(eol);
                s.push_str(eol);
                s.into_bytes()
            })
    }

    proptest! {
        #[test]
        fn every_split_yields_the_same_events(input in stream_text(), cuts in proptest::collection::vec(0usize..400, 0..12)) {
            let want = reference(&input);
            let mut points: Vec<usize> = cuts.into_iter().map(|c| c % (input.len() + 1)).collect();
            points.sort_unstable();
            let mut s = SseScanner::new(1 << 16);
            let mut got = Vec::new();
            let mut prev = 0;
            for p in points.into_iter().chain(std::iter::once(input.len())) {
                s.feed(&input[prev..p], |e| got.push(e.data.to_vec()));
                prev = p;
            }
            prop_assert_eq!(got, want);
        }

        #[test]
        fn byte_by_byte_equals_whole(input in stream_text()) {
            let want = reference(&input);
            let mut s = SseScanner::new(1 << 16);
            let mut got = Vec::new();
            for b in &input {
                s.feed(std::slice::from_ref(b), |e| got.push(e.data.to_vec()));
            }
            prop_assert_eq!(got, want);
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_stay_bounded(input in proptest::collection::vec(any::<u8>(), 0..2000), split in 1usize..64) {
            let mut s = SseScanner::new(256);
            for piece in input.chunks(split) {
                s.feed(piece, |e| assert!(e.data.len() <= 256));
                prop_assert!(s.buffered() <= 2 * 256 + 6);
            }
        }
    }

    #[test]
    fn recorded_vllm_streams_split_every_way() {
        for name in [
            "03_chat_stream_usage.http",
            "04_chat_stream_usage_continuous.http",
            "05_chat_stream_usage_n2.http",
        ] {
            let body = &crate::test_fixtures::recorded_body(name)[..];
            let want = reference(body);
            assert!(want.len() >= 7, "{name}");
            assert_eq!(want.last().unwrap(), b"[DONE]");
            for size in 1..=body.len().min(300) {
                let mut s = SseScanner::default();
                let mut got = Vec::new();
                for piece in body.chunks(size) {
                    s.feed(piece, |e| got.push(e.data.to_vec()));
                }
                assert_eq!(got, want, "{name} split {size}");
            }
        }
    }
}

#[cfg(test)]
mod fuzz_regressions {
    use super::*;

    /// Inputs the fuzzer (fuzz/fuzz_targets/sse_scan.rs) once failed on, replayed its way.
    #[test]
    fn replay_fuzz_regressions() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
        for entry in std::fs::read_dir(dir).unwrap() {
            let data = std::fs::read(entry.unwrap().path()).unwrap();
            let (split, stream) = (1 + data[0] as usize, &data[1..]);
            let run = |pieces: Vec<&[u8]>| {
                let mut s = SseScanner::new(512);
                let mut out = Vec::new();
                for p in pieces {
                    s.feed(p, |e| out.push((e.data.to_vec(), e.oversize)));
                    assert!(s.buffered() <= 2 * 512 + 6);
                }
                out
            };
            assert_eq!(run(stream.chunks(split).collect()), run(vec![stream]));
        }
    }
}
