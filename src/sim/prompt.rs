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
