//! Counting reasoning tokens as vLLM 0.33's parsers count them: qwen3, the
//! tokens whose text the parser classifies as reasoning (the count of the
//! whole output agrees with the whole parse); deepseek_r1, the tokens inside
//! `<think>`...`</think>` pairs. Markers are never reasoning.

use proptest::prelude::*;
use vllm_rs_parsers::{ReasoningParser, ReasoningTokenTally, REASONING_PARSER_NAMES};

/// Token ends of `text` cut into one token per character.
fn char_tokens(text: &str) -> Vec<usize> {
    text.char_indices().map(|(i, c)| i + c.len_utf8()).collect()
}

fn count(name: &str, text: &str, ends: &[usize], finished: bool) -> usize {
    ReasoningParser::new(name).unwrap().count_reasoning_tokens(text, ends, finished)
}

#[test]
fn markers_are_not_reasoning_and_what_they_enclose_is() {
    // One token per marker and per character between them, as a model with
    // `<think>` and `</think>` in its vocabulary writes them.
    let ends = [7, 8, 9, 10, 18, 19, 20];
    assert_eq!(count("deepseek_r1", "<think>abc</think>de", &ends, true), 3);
    // qwen3: the chat template opened the block; the reasoning runs up to `</think>`.
    assert_eq!(count("qwen3", "abc</think>de", &[1, 2, 3, 11, 12, 13], true), 3);
    assert_eq!(count("qwen3", "ab<tool_call>x", &char_tokens("ab<tool_call>x"), true), 2);
    // deepseek_r1 counts inside the pairs only, as vLLM's depth counter over
    // the marker ids: a `<think>` the prompt held leaves nothing to count.
    assert_eq!(count("deepseek_r1", "abc", &[1, 2, 3], true), 0);
    assert_eq!(count("deepseek_r1", "abc</think>x", &char_tokens("abc</think>x"), true), 0);
    let nested = "<think>a<think>b</think>c</think>d</think><think>e";
    assert_eq!(count("deepseek_r1", nested, &char_tokens(nested), true), 4);
    assert_eq!(count("qwen3", "abc", &[1, 2, 3], true), 3);
    let off = ReasoningParser::new("qwen3").unwrap().with_thinking(false);
    assert_eq!(off.count_reasoning_tokens("abc</think>d", &char_tokens("abc</think>d"), true), 0);
}

#[test]
fn a_token_without_text_of_its_own_goes_with_the_text_after_it() {
    // "é" in two byte tokens: the first has no text yet.
    let text = "aé</think>b";
    assert_eq!(count("qwen3", text, &[1, 1, 3, 11, 12], true), 3);
    // A stop token after the text (not decoded) is not reasoning.
    assert_eq!(count("qwen3", "ab", &[1, 2, 2], true), 2);
}

#[test]
fn a_partial_marker_counts_only_once_settled() {
    let text = "ab</thi";
    let ends = char_tokens(text);
    assert_eq!(count("qwen3", text, &ends, false), 2);
    assert_eq!(count("qwen3", text, &ends, true), 7);
    let full = "ab</think>c";
    assert_eq!(count("qwen3", full, &char_tokens(full), false), 2);
    let open = "<think>ab<thi";
    assert_eq!(count("deepseek_r1", open, &char_tokens(open), false), 2);
    assert_eq!(count("deepseek_r1", open, &char_tokens(open), true), 6);
}

/// Characters inside `<think>`...`</think>` pairs of the text `parts` make,
/// counted with a depth counter over the parts (vLLM's, over marker ids);
/// `None` when the text has markers no single part makes.
fn inside_pairs(parts: &[String]) -> Option<usize> {
    let text = parts.concat();
    let markers = parts.iter().filter(|p| *p == "<think>" || *p == "</think>").count();
    if text.matches("<think>").count() + text.matches("</think>").count() != markers {
        return None;
    }
    let mut depth = 0usize;
    let mut count = 0;
    for part in parts {
        match part.as_str() {
            "<think>" => depth += 1,
            "</think>" => depth = depth.saturating_sub(1),
            other if depth > 0 => count += other.chars().count(),
            _ => {}
        }
    }
    Some(count)
}

/// Up to `most` - 1 pieces of text: markers whole, and short runs of letters,
/// spaces, `é` and marker characters (which may make markers across pieces).
fn marked_text(most: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            Just("<think>".to_string()),
            Just("</think>".to_string()),
            Just("<tool_call>".to_string()),
            "[a-z é<>/]{0,6}",
        ],
        0..most,
    )
}

proptest! {
    /// With one token per character, qwen3's whole count is the number of
    /// characters of its whole parse's reasoning, and a count of a prefix
    /// never exceeds the count of the whole; deepseek_r1 counts what lies
    /// inside the pairs.
    #[test]
    fn the_count_agrees_with_the_parse(
        parts in marked_text(8),
        name in prop::sample::select(REASONING_PARSER_NAMES),
        cut in 0usize..64,
    ) {
        let text = parts.concat();
        let parser = ReasoningParser::new(name).unwrap();
        let ends = char_tokens(&text);
        let whole = parser.count_reasoning_tokens(&text, &ends, true);
        if name == "deepseek_r1" {
            let expected = inside_pairs(&parts);
            prop_assume!(expected.is_some());
            prop_assert_eq!(Some(whole), expected);
            return Ok(());
        }
        // qwen3 drops `<think>` from inside the block: those characters are no tokens' reasoning.
        prop_assert_eq!(whole, parser.parse(&text).reasoning.unwrap_or_default().chars().count());
        let at = text.char_indices().map(|(i, _)| i).nth(cut).unwrap_or(text.len());
        let prefix = &text[..at];
        let so_far = parser.count_reasoning_tokens(prefix, &char_tokens(prefix), false);
        prop_assert!(so_far <= whole, "{} > {} for {:?}", so_far, whole, prefix);
    }
}

proptest! {
    /// A running count kept with one tally while the text grows (pieces of
    /// any size, markers split anywhere, byte tokens without text of their
    /// own) is, at every step and at the finish, the count from scratch.
    #[test]
    fn the_running_count_is_the_count_from_scratch(
        parts in marked_text(10),
        name in prop::sample::select(REASONING_PARSER_NAMES),
        thinking: bool,
        steps in prop::collection::vec(1usize..12, 1..40),
    ) {
        let text = parts.concat();
        let parser = ReasoningParser::new(name).unwrap().with_thinking(thinking);
        // One token per byte; a byte that ends no character has no text yet.
        let ends: Vec<usize> = (1..=text.len())
            .map(|i| (0..=i).rev().find(|&j| text.is_char_boundary(j)).unwrap())
            .collect();
        let mut tally = ReasoningTokenTally::default();
        let mut at = 0;
        for step in steps.iter().cycle().take(text.len() + 1) {
            at = (at + step).min(text.len());
            let prefix_tokens = &ends[..at];
            let shown = prefix_tokens.last().copied().unwrap_or(0);
            let running = parser.count_reasoning_tokens_since(&text[..shown], prefix_tokens, false, &mut tally);
            prop_assert_eq!(running, parser.count_reasoning_tokens(&text[..shown], prefix_tokens, false), "at {}", at);
            if at == text.len() {
                break;
            }
        }
        let finished = parser.count_reasoning_tokens_since(&text, &ends, true, &mut tally);
        prop_assert_eq!(finished, parser.count_reasoning_tokens(&text, &ends, true));
    }
}
