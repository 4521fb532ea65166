//! [`EventMemo`]: what the events of a stream before this one let the skimmer skip in it.

use super::{summarize_from, Found, Parser, Skimmed, Summary};

/// What the events of a stream before this one let the skimmer skip in it.
///
/// - **The prefix:** the bytes of the top-level members before `choices` (vLLM repeats `id`,
///   `object`, `created` and `model` unchanged in every event of a stream), up to and including
///   the byte where the parse of the `choices` member began. An event that starts with exactly
///   these bytes brings the parser to exactly the state it was in there (the parse reads left to
///   right and never looks past that byte before it), so the skimmer resumes at that byte: the
///   answer is the one the whole parse gives.
/// - **The template:** an event that answered, split around the one string value that carries
///   its output (a token's text, or a piece of a tool call's arguments): what comes before the
///   string's opening quote and what follows its closing quote. Another event made of the same
///   two parts around any non-empty, valid string is read the same way by the whole parse, byte
///   for byte outside the string, and the string's bytes change nothing but whether it is valid
///   and empty; so its answer is the learned one, and checking it costs two comparisons and one
///   string scan.
#[derive(Debug, Default, Clone)]
pub struct EventMemo {
    /// The last event learned from.
    learned: Vec<u8>,
    /// `learned[..prefix]` is the prefix (0: none).
    prefix: usize,
    template: Option<Template>,
    /// Template misses in a row. A stream whose events differ outside their token too (a
    /// per-event `logprobs`, a send stamp) would copy every event for nothing: after
    /// [`MAX_TEMPLATE_MISSES`] it learns no more templates.
    misses: u8,
}

/// Template misses in a row after which a stream's memo stops learning templates.
const MAX_TEMPLATE_MISSES: u8 = 3;

/// The template of [`EventMemo`], as places in its `learned` event.
#[derive(Debug, Clone, Copy)]
struct Template {
    /// The varying string's opening quote: `learned[..=quote]` comes before it.
    quote: usize,
    /// Just past its closing quote: `learned[after..]` comes after it.
    after: usize,
    /// The learned event's answer (its other fields are empty: see [`learnable`]).
    choices: u32,
    content_choices: u32,
}

/// Whether an answer can be a template's: one that borrows nothing from its event and whose
/// every field a template keeps.
fn learnable(s: &Summary<'_>) -> bool {
    s.finish_reason.is_none() && s.usage.is_none() && !s.is_error && s.server_timings.is_none()
}

impl EventMemo {
    /// The prefix learned (empty: none).
    #[cfg(test)]
    pub(super) fn prefix(&self) -> &[u8] {
        &self.learned[..self.prefix]
    }

    /// The template's string's places in the learned event: (opening quote, just past the
    /// closing quote).
    #[cfg(test)]
    pub(super) fn template_places(&self) -> Option<(usize, usize)> {
        self.template.map(|t| (t.quote, t.after))
    }

    /// The template's answer for `data`, when `data` is the learned template around another
    /// non-empty valid string.
    #[inline]
    pub(super) fn template_answer(&self, data: &[u8]) -> Option<Summary<'static>> {
        let t = self.template?;
        let (head, tail) = (&self.learned[..=t.quote], &self.learned[t.after..]);
        if data.len() <= head.len() + tail.len() + 1 || !data.starts_with(head) {
            return None;
        }
        let mut p = Parser {
            b: data,
            i: t.quote,
            depth: 0,
            last_string: (0, 0),
        };
        p.string().ok()?;
        // Non-empty (an empty string carries no output), and the rest is the learned tail.
        if p.i < t.quote + 3 || p.i + tail.len() != data.len() || &data[p.i..] != tail {
            return None;
        }
        Some(Summary {
            choices: t.choices,
            content_choices: t.content_choices,
            ..Summary::default()
        })
    }

    /// Learns `data`, which answered `s` with `skimmed`, keeping the prefix of `keep_prefix`
    /// bytes (`data` starts with it) or, when `None`, the one this parse marked.
    fn learn(&mut self, data: &[u8], s: &Summary<'_>, skimmed: &Found, keep_prefix: Option<usize>) {
        let prefix = match keep_prefix {
            Some(n) => n,
            None => skimmed.mark.map_or(0, |m| m + 1),
        };
        let template = match skimmed.varying {
            Some((quote, after)) if learnable(s) && self.misses < MAX_TEMPLATE_MISSES => {
                Some(Template {
                    quote,
                    after,
                    choices: s.choices,
                    content_choices: s.content_choices,
                })
            }
            _ => None,
        };
        if template.is_none() && keep_prefix.is_some() {
            // Nothing new: the prefix, and the template learned before, still hold.
            return;
        }
        self.learned.clear();
        if template.is_some() {
            self.learned.extend_from_slice(data);
        } else {
            self.learned.extend_from_slice(&data[..prefix]);
        }
        self.prefix = if prefix >= MIN_MEMO { prefix } else { 0 };
        self.template = template;
    }
}

/// A memo shorter than this saves less than the comparison costs.
const MIN_MEMO: usize = 16;

/// [`summarize`](super::summarize) for the next event of the stream `memo` belongs to; learns
/// from the event.
pub(in crate::openai) fn summarize_memo<'a>(
    data: &'a [u8],
    memo: &mut EventMemo,
) -> Skimmed<Summary<'a>> {
    if memo.template.is_some() {
        if let Some(s) = memo.template_answer(data) {
            memo.misses = 0;
            return Ok(s);
        }
        memo.misses = memo.misses.saturating_add(1);
        if memo.misses >= MAX_TEMPLATE_MISSES {
            memo.template = None;
        }
    }
    let n = memo.prefix;
    if n >= MIN_MEMO && data.len() > n && data[..n] == memo.learned[..n] {
        let (s, skimmed) = summarize_from(data, Some(n - 1))?;
        memo.learn(data, &s, &skimmed, Some(n));
        return Ok(s);
    }
    let (s, skimmed) = summarize_from(data, None)?;
    memo.learn(data, &s, &skimmed, None);
    Ok(s)
}
