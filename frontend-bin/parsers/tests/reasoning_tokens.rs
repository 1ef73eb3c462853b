//! Counting reasoning tokens: a token counts when the parser classifies some
//! of its text as reasoning, as vLLM counts the tokens between the thinking
//! markers; the count of the whole output agrees with the whole parse.

use proptest::prelude::*;
use vllm_rs_parsers::{ReasoningParser, REASONING_PARSER_NAMES};

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
    // No end marker: everything is reasoning.
    assert_eq!(count("deepseek_r1", "abc", &[1, 2, 3], true), 3);
    let off = ReasoningParser::new("qwen3").unwrap().with_thinking(false);
    assert_eq!(off.count_reasoning_tokens("abc</think>d", &char_tokens("abc</think>d"), true), 0);
}

#[test]
fn a_token_without_text_of_its_own_goes_with_the_text_after_it() {
    // "é" in two byte tokens: the first has no text yet.
    let text = "aé</think>b";
    assert_eq!(count("qwen3", text, &[1, 1, 3, 11, 12], true), 3);
    // A stop token after the text (not decoded) is not reasoning.
    assert_eq!(count("deepseek_r1", "ab", &[1, 2, 2], true), 2);
}

#[test]
fn a_partial_marker_counts_only_once_settled() {
    let text = "ab</thi";
    let ends = char_tokens(text);
    assert_eq!(count("deepseek_r1", text, &ends, false), 2);
    assert_eq!(count("deepseek_r1", text, &ends, true), 7);
    let full = "ab</think>c";
    assert_eq!(count("deepseek_r1", full, &char_tokens(full), false), 2);
}

proptest! {
    /// With one token per character, the whole count is the number of
    /// characters of the whole parse's reasoning; with qwen3 (whose stream
    /// splits as its whole parse does) a count of a prefix never exceeds the
    /// count of the whole.
    #[test]
    fn the_count_agrees_with_the_parse(
        parts in prop::collection::vec(prop_oneof![
            Just("<think>".to_string()), Just("</think>".to_string()), Just("<tool_call>".to_string()),
            "[a-z é<>/]{0,6}",
        ], 0..8),
        name in prop::sample::select(REASONING_PARSER_NAMES),
        cut in 0usize..64,
    ) {
        let text = parts.concat();
        let parser = ReasoningParser::new(name).unwrap();
        let ends = char_tokens(&text);
        let whole = parser.count_reasoning_tokens(&text, &ends, true);
        let reasoning = parser.parse(&text).reasoning.unwrap_or_default();
        // qwen3 drops `<think>` from inside the block: those characters are no tokens' reasoning.
        prop_assert_eq!(whole, reasoning.chars().count());
        if name != "qwen3" {
            return Ok(());
        }
        let at = text.char_indices().map(|(i, _)| i).nth(cut).unwrap_or(text.len());
        let prefix = &text[..at];
        let so_far = parser.count_reasoning_tokens(prefix, &char_tokens(prefix), false);
        prop_assert!(so_far <= whole, "{} > {} for {:?}", so_far, whole, prefix);
    }
}
