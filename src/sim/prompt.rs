//! Deterministic stand-ins for the tokenizer and the sampler: prompt-token estimates, the
//! end-of-sequence stop rule and the filler text of generated tokens.

/// Prompt tokens of a chat request: for each message `ceil(chars(content) / 4) + 4`, plus 3.
///
/// `chars` counts Unicode scalar values of the message's text (a string content, or the
/// concatenated `text` of its content parts); the 4 per message and 3 per conversation stand for
/// the chat template's role markers and the assistant prefix.
pub fn chat_prompt_tokens<'a>(message_texts: impl Iterator<Item = &'a str>) -> u64 {
    message_texts.map(|t| text_tokens(t) + 4).sum::<u64>() + 3
}

/// Prompt tokens of a completions request: `ceil(chars(prompt) / 4) + 1` (the 1 is the BOS token).
pub fn completion_prompt_tokens(prompt: &str) -> u64 {
    text_tokens(prompt) + 1
}

/// `ceil(chars / 4)`: the usual "4 characters per token" rule of thumb.
pub fn text_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}

/// FNV-1a 64-bit hash, used to seed the per-sequence stop rule from the request text.
pub fn fnv1a(bytes: &[u8], mut hash: u64) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The FNV-1a offset basis (start value of [`fnv1a`]).
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// SplitMix64 finalizer: turns a hash into a well-mixed 64-bit value.
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The stop rule: the number of tokens after which sequence `choice` ends with `finish_reason: "stop"`,
/// or `None` when it never stops early.
///
/// Each token independently ends the sequence with probability `p`, so the stop position is
/// geometric: `k = max(1, ceil(ln(u) / ln(1 − p)))` with `u` uniform in (0, 1] drawn from
/// `splitmix(prompt_hash ^ splitmix(seed) ^ splitmix(choice + 1))`. `prompt_hash` is [`fnv1a`] of the
/// request's prompt text, `seed` the request's `seed` (0 if absent). The same request always stops at
/// the same place. `p == 0` never stops (so does a request with `ignore_eos: true`, decided by the caller).
pub fn stop_after_tokens(prompt_hash: u64, seed: u64, choice: u32, p: f64) -> Option<u64> {
    if p <= 0.0 || p >= 1.0 {
        return None;
    }
    let mixed = splitmix(prompt_hash ^ splitmix(seed) ^ splitmix(u64::from(choice) + 1));
    // 53 random bits → u in (0, 1].
    let u = ((mixed >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
    let k = (u.ln() / (1.0 - p).ln()).ceil();
    if !k.is_finite() {
        return None;
    }
    Some((k as u64).max(1))
}

/// The filler text of generated tokens: one word per token, cycling.
pub const FILLER_WORDS: [&str; 8] = [
    " token", " sim", " engine", " batch", " step", " decode", " prefill", " stream",
];

/// The text of the `index`-th (0-based) generated token of a sequence.
pub fn token_text(index: u64) -> &'static str {
    FILLER_WORDS[(index % FILLER_WORDS.len() as u64) as usize]
}

/// The identity of the `j`-th (0..4) template token opening every chat message; the three
/// tokens closing a chat prompt (the assistant prefix) are the first three of these, so a
/// prompt followed by its answer reads like the next prompt's assistant message.
pub fn header_id(j: u64) -> u64 {
    0xa5a5_0000_0000_0000 | j
}

/// The identity of the begin-of-sequence token of a completions prompt.
const BOS_ID: u64 = 0xa5a5_0000_0000_0100;

/// The identity of one text token: the FNV-1a hash of its (at most 4) characters.
fn chunk_id(bytes: impl Iterator<Item = u8>) -> u64 {
    let mut hash = FNV_OFFSET;
    for b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash & 0x7fff_ffff_ffff_ffff
}

/// Pushes the identities of `text`'s tokens: one per 4 characters (the last may be shorter),
/// as [`text_tokens`] counts them.
fn push_text_ids(text: &str, out: &mut Vec<u64>) {
    let mut start = 0;
    let mut chars = 0;
    for (i, _) in text.char_indices() {
        if chars == 4 {
            out.push(chunk_id(text[start..i].bytes()));
            start = i;
            chars = 0;
        }
        chars += 1;
    }
    if chars > 0 {
        out.push(chunk_id(text[start..].bytes()));
    }
}

/// The identities of a chat-like prompt's tokens, one per token that
/// [`chat_prompt_tokens`] counts: per message its 4 template tokens and its text's tokens, then
/// the 3 tokens of the assistant prefix. Equal texts give equal identities, whatever JSON form
/// carried them (a string or text blocks, with or without `cache_control`).
pub fn chat_prompt_ids(message_texts: &[String]) -> Vec<u64> {
    let total: u64 = message_texts
        .iter()
        .map(|t| text_tokens(t) + 4)
        .sum::<u64>()
        + 3;
    let mut out = Vec::with_capacity(total as usize);
    for t in message_texts {
        out.extend((0..4).map(header_id));
        push_text_ids(t, &mut out);
    }
    out.extend((0..3).map(header_id));
    out
}

/// The identities of a completions prompt's tokens: the begin-of-sequence token, then its
/// text's tokens.
pub fn completion_prompt_ids(prompt: &str) -> Vec<u64> {
    let mut out = Vec::with_capacity(text_tokens(prompt) as usize + 1);
    out.push(BOS_ID);
    push_text_ids(prompt, &mut out);
    out
}

/// The identity of the `index`-th (0-based) generated token of a sequence, as the next chat
/// prompt will read it when it carries the answer as an assistant message: the message's last
/// template token first, then the 4-character tokens of the answer's text (the filler words
/// concatenated, which is periodic: their tokens never depend on how the answer ended).
pub fn generated_id(index: u64) -> u64 {
    if index == 0 {
        return header_id(3);
    }
    let period: usize = FILLER_WORDS.iter().map(|w| w.len()).sum();
    let start = ((index - 1) * 4) as usize % period;
    chunk_id((start..start + 4).map(|i| filler_byte(i % period)))
}

/// The `i`-th byte of the filler words concatenated (one period).
fn filler_byte(mut i: usize) -> u8 {
    for w in FILLER_WORDS {
        if i < w.len() {
            return w.as_bytes()[i];
        }
        i -= w.len();
    }
    b' '
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_follow_the_documented_rule() {
        assert_eq!(text_tokens(""), 0);
        assert_eq!(text_tokens("abcd"), 1);
        assert_eq!(text_tokens("abcde"), 2);
        assert_eq!(text_tokens("éééé"), 1);
        assert_eq!(
            chat_prompt_tokens(["hi", "abcdefgh"].into_iter()),
            (1 + 4) + (2 + 4) + 3
        );
        assert_eq!(completion_prompt_tokens("def hello():"), 3 + 1);
    }

    #[test]
    fn identities_count_like_the_estimates_and_an_answer_extends_its_prompt() {
        let texts = vec!["You are helpful.".to_string(), "hello there".to_string()];
        let ids = chat_prompt_ids(&texts);
        assert_eq!(
            ids.len() as u64,
            chat_prompt_tokens(texts.iter().map(String::as_str))
        );
        assert_eq!(
            completion_prompt_ids("def hello():").len() as u64,
            completion_prompt_tokens("def hello():")
        );
        // The conversation extended by the answer (7 tokens, cut by length) and a new message.
        let answer: String = (0..7).map(token_text).collect();
        let mut next = texts.clone();
        next.push(answer);
        next.push("thanks".to_string());
        let next_ids = chat_prompt_ids(&next);
        let extended: Vec<u64> = ids
            .iter()
            .copied()
            .chain((0..7).map(generated_id))
            .collect();
        assert_eq!(&next_ids[..extended.len()], &extended[..]);
        // And with a stop: the answer's text lacks its last token, the first 7 still agree.
        let stopped: String = (0..6).map(token_text).collect();
        let mut next = texts.clone();
        next.push(stopped);
        next.push("thanks".to_string());
        assert_eq!(&chat_prompt_ids(&next)[..extended.len()], &extended[..]);
    }

    #[test]
    fn stop_rule_is_deterministic_and_geometric() {
        let h = fnv1a(b"hello", FNV_OFFSET);
        assert_eq!(
            stop_after_tokens(h, 1, 0, 0.01),
            stop_after_tokens(h, 1, 0, 0.01)
        );
        assert_eq!(stop_after_tokens(h, 1, 0, 0.0), None);
        // Mean of a geometric(p) is 1/p: check over many prompts within 10%.
        let p = 0.01;
        let n = 20_000u64;
        let sum: u64 = (0..n)
            .map(|i| stop_after_tokens(fnv1a(&i.to_le_bytes(), FNV_OFFSET), 0, 0, p).unwrap())
            .sum();
        let mean = sum as f64 / n as f64;
        assert!((mean - 100.0).abs() < 10.0, "mean {mean}");
    }
}
