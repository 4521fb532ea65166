//! Incremental server-sent-events parser: bytes in arbitrary chunk splits, `data` payloads out.
//!
//! Lines end with `\n` (a preceding `\r` is dropped); `data:` lines (one optional space after the
//! colon) accumulate into the current event, joined by `\n`; a blank line dispatches it. Other
//! fields (`event:`, `id:`, `retry:`) and comments (`:`) are ignored. Buffers are reused, so a
//! steady stream allocates nothing once they have grown to the largest line.

/// Longest line accepted; a longer one is an error rather than unbounded buffering.
pub const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;

/// Error for a line longer than [`MAX_LINE_BYTES`].
#[derive(Debug, thiserror::Error)]
#[error("SSE line longer than {MAX_LINE_BYTES} bytes")]
pub struct LineTooLong;

/// Parser state carried across chunks.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of a line whose end has not arrived yet.
    partial: Vec<u8>,
    /// Data of the event being assembled.
    data: Vec<u8>,
    /// Whether the current event has at least one `data` line (an empty `data:` counts).
    has_data: bool,
}

impl SseParser {
    /// A parser with empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk; calls `on_event` with the data of every event completed by it.
    pub fn feed(
        &mut self,
        mut chunk: &[u8],
        on_event: &mut impl FnMut(&[u8]),
    ) -> Result<(), LineTooLong> {
        while let Some(pos) = chunk.iter().position(|&b| b == b'\n') {
            let (head, rest) = chunk.split_at(pos);
            chunk = &rest[1..];
            if self.partial.is_empty() {
                self.line(head, on_event);
            } else {
                self.partial.extend_from_slice(head);
                let line = std::mem::take(&mut self.partial);
                self.line(&line, on_event);
                // Give the allocation back for reuse.
                self.partial = line;
                self.partial.clear();
            }
        }
        if self.partial.len() + chunk.len() > MAX_LINE_BYTES {
            return Err(LineTooLong);
        }
        self.partial.extend_from_slice(chunk);
        Ok(())
    }

    /// Ends the stream: an unterminated last line and an event without its blank line are
    /// still delivered (servers that close right after the last `data:` line lose nothing).
    pub fn finish(&mut self, on_event: &mut impl FnMut(&[u8])) {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line, on_event);
        }
        self.dispatch(on_event);
    }

    fn line(&mut self, line: &[u8], on_event: &mut impl FnMut(&[u8])) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch(on_event);
            return;
        }
        if let Some(value) = line.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
        // Any other field or a comment line: ignored on purpose.
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(&[u8])) {
        if self.has_data {
            on_event(&self.data);
        }
        self.data.clear();
        self.has_data = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events_of(chunks: &[&[u8]]) -> Vec<String> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        let mut push = |d: &[u8]| out.push(String::from_utf8_lossy(d).into_owned());
        for c in chunks {
            p.feed(c, &mut push).unwrap();
        }
        p.finish(&mut push);
        out
    }

    const STREAM: &[u8] =
        b"data: {\"a\":1}\n\n: comment\nevent: x\ndata: {\"b\":2}\r\n\r\ndata:[DONE]\n\n";

    #[test]
    fn whole_stream_gives_three_events() {
        assert_eq!(
            events_of(&[STREAM]),
            vec!["{\"a\":1}", "{\"b\":2}", "[DONE]"]
        );
    }

    #[test]
    fn every_two_way_and_three_way_split_gives_the_same_events() {
        let want = events_of(&[STREAM]);
        for i in 0..=STREAM.len() {
            for j in i..=STREAM.len() {
                let got = events_of(&[&STREAM[..i], &STREAM[i..j], &STREAM[j..]]);
                assert_eq!(got, want, "split at {i},{j}");
            }
        }
    }

    #[test]
    fn byte_by_byte_gives_the_same_events() {
        let chunks: Vec<&[u8]> = STREAM.chunks(1).collect();
        assert_eq!(events_of(&chunks), events_of(&[STREAM]));
    }

    #[test]
    fn multi_line_data_is_joined_and_unterminated_event_is_flushed() {
        assert_eq!(
            events_of(&[b"data: a\ndata: b\n\ndata: c"]),
            vec!["a\nb", "c"]
        );
    }

    #[test]
    fn blank_lines_without_data_dispatch_nothing() {
        assert!(events_of(&[b"\n\n\r\n: ping\n\n"]).is_empty());
    }

    #[test]
    fn overlong_line_is_an_error_not_a_panic() {
        let mut p = SseParser::new();
        let big = vec![b'x'; MAX_LINE_BYTES + 1];
        assert!(p.feed(&big, &mut |_| {}).is_err());
    }
}
