//! The fast path of [`summarize`](super::summarize): one pass over the bytes of the shapes vLLM
//! streams (`choices` with `delta`/`message`/`text`/`finish_reason`, `usage`), without building
//! strings or checking what nobody reads.
//!
//! It answers only for input it has fully checked to be a JSON object of that shape; for anything
//! else (escaped keys, `\u` escapes, exponents, non-null `error`/`metrics`, duplicate fields, deep
//! nesting, bad UTF-8, malformed JSON) it declines and serde decides. So where it answers, the
//! answer is serde's; the differential tests below and `fuzz/fuzz_targets/summarize.rs` hold it
//! to that.

use std::borrow::Cow;

use super::{Summary, Usage};
use crate::swar::find_string_special;

mod memo;

pub(super) use memo::summarize_memo;
pub use memo::EventMemo;

/// The skimmer declined: serde must decide.
#[derive(Debug)]
pub(super) struct Decline;

type Skimmed<T> = Result<T, Decline>;

/// Nesting the skimmer follows before it declines (serde_json stops at 128).
const MAX_DEPTH: u32 = 64;

/// Summarizes `data` when it is a JSON object of a shape the skimmer knows.
pub(super) fn summarize(data: &[u8]) -> Skimmed<Summary<'_>> {
    summarize_from(data, None).map(|(s, _)| s)
}

/// Walks the JSON object `data`, handing `member` each top-level key and its value's exact text
/// (as serde's `RawValue` has it), in order, and checking the rest of `data` is whitespace: by
/// this module's rules, so `None` (serde must decide) for an escaped key, a `\u` escape, an
/// exponent, nesting past [`MAX_DEPTH`], bad UTF-8 or malformed JSON, or when `member` says no.
pub(crate) fn object_members<'a>(
    data: &'a [u8],
    mut member: impl FnMut(&'a [u8], &'a [u8]) -> bool,
) -> Option<()> {
    let mut p = Parser {
        b: data,
        i: 0,
        depth: 0,
        last_string: (0, 0),
    };
    p.open_object().ok()?;
    let mut first = true;
    while let Some(key) = p.key(&mut first).ok()? {
        let raw = p.value().ok()?;
        if !member(key, raw) {
            return None;
        }
    }
    p.ws();
    (p.i == data.len()).then_some(())
}

/// What a parse found besides its answer, for the memo.
struct Found {
    /// Where a prefix could end (a whole parse only).
    mark: Option<usize>,
    /// The string that carried the output, as (opening quote, just past the closing quote).
    varying: Option<(usize, usize)>,
}

/// Parses `data` whole (`resume` `None`) or from the memo's resume point; with the point where a
/// memo could resume this event, when it has one.
fn summarize_from(data: &[u8], resume: Option<usize>) -> Skimmed<(Summary<'_>, Found)> {
    // UTF-8 is checked where it can occur: outside strings any byte >= 0x80 is not JSON and
    // declines; inside a string the search stops at one and the string is checked whole.
    let mut p = Parser {
        b: data,
        i: resume.unwrap_or(0),
        depth: 0,
        last_string: (0, 0),
    };
    let (summary, found) = p.top(resume.is_some())?;
    p.ws();
    if p.i != data.len() {
        return Err(Decline);
    }
    Ok((summary, found))
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
    depth: u32,
    /// The last string value read whole by [`Parser::value`]: (opening quote, just past the
    /// closing quote).
    last_string: (usize, usize),
}

/// Marks a field as read, declining on the second time (serde rejects duplicate fields).
fn first_time(seen: &mut bool) -> Skimmed<()> {
    if std::mem::replace(seen, true) {
        Err(Decline)
    } else {
        Ok(())
    }
}

/// A raw JSON value that carries output, by the rule of `carries` in the serde path.
fn carries(raw: &[u8]) -> bool {
    raw != b"null" && raw != b"\"\"" && raw != b"[]"
}

impl<'a> Parser<'a> {
    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    /// The next byte that is not whitespace, not consumed.
    #[inline]
    fn peek(&mut self) -> Skimmed<u8> {
        match self.b.get(self.i) {
            // vLLM writes no whitespace between tokens: one comparison settles it.
            Some(&c) if c > b' ' => Ok(c),
            _ => {
                self.ws();
                self.b.get(self.i).copied().ok_or(Decline)
            }
        }
    }

    fn eat(&mut self, c: u8) -> Skimmed<()> {
        if self.peek()? == c {
            self.i += 1;
            Ok(())
        } else {
            Err(Decline)
        }
    }

    fn literal(&mut self, word: &[u8]) -> Skimmed<()> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(Decline)
        }
    }

    /// A string at the current `"`: its contents' byte range and whether it holds escapes.
    #[inline(always)]
    fn string(&mut self) -> Skimmed<(usize, usize, bool)> {
        let start = self.i + 1;
        let mut i = start;
        let mut escaped = false;
        let mut ascii = true;
        loop {
            i = find_string_special(self.b, i);
            match self.b.get(i) {
                Some(b'"') => {
                    if !ascii && std::str::from_utf8(&self.b[start..i]).is_err() {
                        return Err(Decline);
                    }
                    self.i = i + 1;
                    return Ok((start, i, escaped));
                }
                Some(0x80..=0xff) => {
                    ascii = false;
                    i += 1;
                }
                Some(b'\\') => match self.b.get(i + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                        escaped = true;
                        i += 2;
                    }
                    _ => return Err(Decline),
                },
                _ => return Err(Decline),
            }
        }
    }

    /// A number by JSON's grammar; exponents decline. Returns its text.
    fn number(&mut self) -> Skimmed<&'a [u8]> {
        let start = self.i;
        if self.b.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        match self.b.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(Decline),
        }
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            if !matches!(self.b.get(self.i), Some(b'0'..=b'9')) {
                return Err(Decline);
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            return Err(Decline);
        }
        Ok(&self.b[start..self.i])
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    /// Any value, checked and skipped; returns its exact text (as serde's `RawValue` has it).
    fn value(&mut self) -> Skimmed<&'a [u8]> {
        let c = self.peek()?;
        let start = self.i;
        match c {
            b'"' => {
                self.string()?;
                self.last_string = (start, self.i);
            }
            b'{' => {
                self.enter()?;
                let mut first = true;
                while self.key(&mut first)?.is_some() {
                    self.value()?;
                }
                self.depth -= 1;
            }
            b'[' => {
                self.enter()?;
                let mut first = true;
                while self.element(&mut first)? {
                    self.value()?;
                }
                self.depth -= 1;
            }
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'n' => self.literal(b"null")?,
            _ => {
                self.number()?;
            }
        }
        Ok(&self.b[start..self.i])
    }

    /// Consumes the `{` or `[` at the cursor, one level deeper.
    fn enter(&mut self) -> Skimmed<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Decline);
        }
        self.i += 1;
        Ok(())
    }

    /// Inside an object: the next member's key (the `:` consumed), or `None` at its `}`.
    #[inline(always)]
    fn key(&mut self, first: &mut bool) -> Skimmed<Option<&'a [u8]>> {
        let c = self.peek()?;
        if std::mem::take(first) {
            if c == b'}' {
                self.i += 1;
                return Ok(None);
            }
        } else {
            match c {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Ok(None);
                }
                _ => return Err(Decline),
            }
        }
        if self.peek()? != b'"' {
            return Err(Decline);
        }
        let (from, to, escaped) = self.string()?;
        if escaped {
            // serde compares the unescaped key; not worth doing here.
            return Err(Decline);
        }
        if self.b.get(self.i) == Some(&b':') {
            self.i += 1;
        } else {
            self.eat(b':')?;
        }
        Ok(Some(&self.b[from..to]))
    }

    /// Inside an array: whether another element follows (the `,` consumed), false at its `]`.
    fn element(&mut self, first: &mut bool) -> Skimmed<bool> {
        let c = self.peek()?;
        if std::mem::take(first) {
            if c == b']' {
                self.i += 1;
                return Ok(false);
            }
            return Ok(true);
        }
        match c {
            b',' => {
                self.i += 1;
                Ok(true)
            }
            b']' => {
                self.i += 1;
                Ok(false)
            }
            _ => Err(Decline),
        }
    }

    /// Consumes `null` when it is next; false (nothing consumed) otherwise.
    fn null(&mut self) -> Skimmed<bool> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Consumes the `{` of an object that must come next.
    fn open_object(&mut self) -> Skimmed<()> {
        if self.peek()? != b'{' {
            return Err(Decline);
        }
        self.enter()
    }

    /// The top-level object; `resumed`: the cursor is where a memo's prefix ends, inside the
    /// object after its first member, no member read so far being one this reads. Returns, for
    /// a whole parse, the memo's resume point: where the `choices` member began when no member
    /// before it is one this reads.
    fn top(&mut self, resumed: bool) -> Skimmed<(Summary<'a>, Found)> {
        let mut s = Summary::default();
        let mut varying = None;
        let (mut seen_choices, mut seen_usage) = (false, false);
        let (mut seen_error, mut seen_metrics) = (false, false);
        let mut mark = None;
        let mut first = !resumed;
        if resumed {
            self.depth = 1;
        } else {
            self.open_object()?;
        }
        let mut members = 0u32;
        loop {
            let at = self.i;
            let Some(key) = self.key(&mut first)? else {
                break;
            };
            members += 1;
            match key {
                b"choices" => {
                    if !resumed && members > 1 && !(seen_usage || seen_error || seen_metrics) {
                        mark = Some(at);
                    }
                    first_time(&mut seen_choices)?;
                    if !self.null()? {
                        self.choices(&mut s, &mut varying)?;
                    }
                }
                b"usage" => {
                    first_time(&mut seen_usage)?;
                    if !self.null()? {
                        s.usage = Some(self.usage()?);
                    }
                }
                // vLLM sends `"metrics": null`; a present value (error events, per-request
                // timings) is rare and serde reads it.
                b"error" | b"metrics" => {
                    first_time(if key == b"error" {
                        &mut seen_error
                    } else {
                        &mut seen_metrics
                    })?;
                    if !self.null()? {
                        return Err(Decline);
                    }
                }
                _ => {
                    self.value()?;
                }
            }
        }
        self.depth -= 1;
        Ok((s, Found { mark, varying }))
    }

    /// `varying`: the last string in it that carried output, for a template (see [`EventMemo`]).
    fn choices(
        &mut self,
        s: &mut Summary<'a>,
        varying: &mut Option<(usize, usize)>,
    ) -> Skimmed<()> {
        if self.peek()? != b'[' {
            return Err(Decline);
        }
        self.enter()?;
        let mut first = true;
        while self.element(&mut first)? {
            let (content, finish) = self.choice(varying)?;
            s.choices += 1;
            s.content_choices += content as u32;
            if s.finish_reason.is_none() {
                s.finish_reason = finish;
            }
        }
        self.depth -= 1;
        Ok(())
    }

    /// One choice: whether it carries output, and its `finish_reason`.
    fn choice(
        &mut self,
        varying: &mut Option<(usize, usize)>,
    ) -> Skimmed<(bool, Option<Cow<'a, str>>)> {
        let (mut seen_delta, mut seen_message, mut seen_text, mut seen_finish) =
            (false, false, false, false);
        let mut content = false;
        let mut finish = None;
        self.open_object()?;
        let mut first = true;
        while let Some(key) = self.key(&mut first)? {
            match key {
                b"delta" | b"message" => {
                    first_time(if key == b"delta" {
                        &mut seen_delta
                    } else {
                        &mut seen_message
                    })?;
                    if !self.null()? {
                        content |= self.output(varying)?;
                    }
                }
                b"text" => {
                    first_time(&mut seen_text)?;
                    content |= self.carrying_value(varying)?;
                }
                b"finish_reason" => {
                    first_time(&mut seen_finish)?;
                    if !self.null()? {
                        if self.peek()? != b'"' {
                            return Err(Decline);
                        }
                        let (from, to, escaped) = self.string()?;
                        if escaped {
                            return Err(Decline);
                        }
                        let text = std::str::from_utf8(&self.b[from..to]);
                        finish = Some(Cow::Borrowed(text.map_err(|_| Decline)?));
                    }
                }
                _ => {
                    self.value()?;
                }
            }
        }
        self.depth -= 1;
        Ok((content, finish))
    }

    /// A `delta` or `message` object: whether any of its output fields carries output.
    fn output(&mut self, varying: &mut Option<(usize, usize)>) -> Skimmed<bool> {
        let mut seen = [false; 4];
        let mut carried = false;
        self.open_object()?;
        let mut first = true;
        while let Some(key) = self.key(&mut first)? {
            let slot = match key {
                b"content" => 0,
                b"reasoning_content" => 1,
                b"reasoning" => 2,
                b"tool_calls" => 3,
                _ => {
                    self.value()?;
                    continue;
                }
            };
            first_time(&mut seen[slot])?;
            carried |= self.carrying_value(varying)?;
        }
        self.depth -= 1;
        Ok(carried)
    }

    /// An output field's value: whether it carries output. When it does, the last non-empty
    /// string in it becomes `varying`: its bytes change no answer but by being valid and empty.
    fn carrying_value(&mut self, varying: &mut Option<(usize, usize)>) -> Skimmed<bool> {
        let start = self.i;
        let raw = self.value()?;
        let carried = carries(raw);
        let (quote, after) = self.last_string;
        // Past the value's start (so inside it), and more than its two quotes.
        if carried && quote >= start && after > quote + 2 {
            *varying = Some(self.last_string);
        }
        Ok(carried)
    }

    fn usage(&mut self) -> Skimmed<Usage> {
        let mut u = Usage::default();
        let (mut seen_prompt, mut seen_completion) = (false, false);
        let (mut seen_prompt_details, mut seen_completion_details) = (false, false);
        self.open_object()?;
        let mut first = true;
        while let Some(key) = self.key(&mut first)? {
            match key {
                b"prompt_tokens" => {
                    first_time(&mut seen_prompt)?;
                    u.prompt_tokens = self.count()?;
                }
                b"completion_tokens" => {
                    first_time(&mut seen_completion)?;
                    u.completion_tokens = self.count()?;
                }
                // Token details are rare (once per stream at most): serde reads them.
                b"prompt_tokens_details" | b"completion_tokens_details" => {
                    first_time(if key[0] == b'p' {
                        &mut seen_prompt_details
                    } else {
                        &mut seen_completion_details
                    })?;
                    if !self.null()? {
                        return Err(Decline);
                    }
                }
                _ => {
                    self.value()?;
                }
            }
        }
        self.depth -= 1;
        Ok(u)
    }

    /// `null` or a non-negative integer that fits in u64; anything else declines.
    fn count(&mut self) -> Skimmed<Option<u64>> {
        if self.null()? {
            return Ok(None);
        }
        let digits = self.number()?;
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(Decline);
        }
        let mut n: u64 = 0;
        for &d in digits {
            n = n
                .checked_mul(10)
                .and_then(|n| n.checked_add(u64::from(d - b'0')))
                .ok_or(Decline)?;
        }
        Ok(Some(n))
    }
}

#[cfg(test)]
mod tests;
