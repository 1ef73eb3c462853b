//! Reasoning parsers by vLLM's `--reasoning-parser` names: split the
//! `<think>...</think>` text into vLLM 0.33's `reasoning` field.
//!
//! - `deepseek_r1`: the text before `</think>` is reasoning (after `<think>`
//!   when there is one; a model that omits it still reasons first), the rest
//!   is content. No `</think>`: all reasoning.
//! - `qwen3`: reasoning until `</think>` (the chat template opens the block),
//!   `<think>` inside it and repeated `</think>` after it are dropped, a
//!   `<tool_call>` ends it too (the call is content, for the tool parser).
//!   With `enable_thinking: false` (chat template kwarg) all is content.
//!
//! Streamed, text that may still become a marker is held back; the deltas
//! concatenated give the same split as the whole parse.
//!
//! [`ReasoningParser::count_reasoning_tokens`] counts reasoning tokens as
//! vLLM 0.33's parsers count them: `qwen3`, the tokens whose text the parser
//! classifies as reasoning; `deepseek_r1`, the tokens inside
//! `<think>`...`</think>` pairs (vLLM counts between the marker token ids,
//! so an answer whose `<think>` was in the prompt counts none). The markers
//! themselves are never reasoning.

use crate::stream::partial_overlap_any;
use crate::types::{DeltaMessage, Reasoning, UnknownParser};
use std::ops::Range;

/// The names [`ReasoningParser::new`] accepts, as vLLM 0.33 registers them.
pub const REASONING_PARSER_NAMES: &[&str] = &["deepseek_r1", "qwen3"];

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";
const TOOL_CALL_START: &str = "<tool_call>";
/// The longest marker any parser looks for, in bytes.
const LONGEST_MARKER: usize = TOOL_CALL_START.len();

/// The reasoning tokens of the first `tokens` tokens of an output, whose
/// class no more text can change (see
/// [`ReasoningParser::count_reasoning_tokens_since`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReasoningTokenTally {
    tokens: usize,
    reasoning: usize,
    /// Where the next token's text starts.
    next_start: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    DeepSeekR1,
    Qwen3,
}

/// A reasoning parser for one request.
#[derive(Debug, Clone)]
pub struct ReasoningParser {
    kind: Kind,
    thinking: bool,
}

/// The output so far, split.
struct Split {
    reasoning: String,
    content: String,
}

impl ReasoningParser {
    /// The parser vLLM registers as `name`, with thinking on (the default).
    pub fn new(name: &str) -> Result<Self, UnknownParser> {
        let kind = match name {
            "deepseek_r1" => Kind::DeepSeekR1,
            "qwen3" => Kind::Qwen3,
            other => {
                return Err(UnknownParser {
                    kind: "reasoning",
                    name: other.to_owned(),
                    supported: REASONING_PARSER_NAMES.join(", "),
                })
            }
        };
        Ok(ReasoningParser { kind, thinking: true })
    }

    /// The same parser with the chat template's `enable_thinking` set to
    /// `thinking` (only `qwen3` reads it: off, all output is content).
    pub fn with_thinking(mut self, thinking: bool) -> Self {
        self.thinking = thinking;
        self
    }

    /// The parser's name.
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::DeepSeekR1 => "deepseek_r1",
            Kind::Qwen3 => "qwen3",
        }
    }

    /// The reasoning and content of a whole output.
    pub fn parse(&self, text: &str) -> Reasoning {
        match self.kind {
            Kind::DeepSeekR1 => {
                let after_start = text.split_once(THINK_START).map_or(text, |(_, rest)| rest);
                match after_start.split_once(THINK_END) {
                    None => Reasoning { reasoning: Some(after_start.to_owned()), content: None },
                    Some((reasoning, content)) => Reasoning {
                        reasoning: Some(reasoning.to_owned()),
                        content: (!content.is_empty()).then(|| content.to_owned()),
                    },
                }
            }
            Kind::Qwen3 if !self.thinking => {
                Reasoning { reasoning: None, content: Some(text.to_owned()).filter(|c| !c.is_empty()) }
            }
            Kind::Qwen3 => {
                let split = self.split(text, true);
                Reasoning {
                    reasoning: Some(split.reasoning).filter(|r| !r.is_empty()),
                    content: Some(split.content).filter(|c| !c.is_empty()),
                }
            }
        }
    }

    /// How many of the tokens of `text` are reasoning (see the module's
    /// words): token `i`'s text ends at byte `token_ends[i]` of `text` (ends
    /// never decrease; a token whose text is not complete yet ends where the
    /// previous one did, and belongs to the text that follows). A token is
    /// reasoning when some of its text is reasoning text; a token with no
    /// text of its own, when the text right after it is. Text that may still
    /// become a marker counts only once `finished` (or once it did not).
    pub fn count_reasoning_tokens(&self, text: &str, token_ends: &[usize], finished: bool) -> usize {
        self.count_reasoning_tokens_since(text, token_ends, finished, &mut ReasoningTokenTally::default())
    }

    /// [`Self::count_reasoning_tokens`] of a growing output, counted again
    /// only from the first token whose class may still change: `tally`
    /// remembers the tokens before it (pass the same one with every call for
    /// one output; its text and tokens only grow). A running count of a
    /// stream's usage then costs a scan of the text, not of every token.
    pub fn count_reasoning_tokens_since(
        &self,
        text: &str,
        token_ends: &[usize],
        finished: bool,
        tally: &mut ReasoningTokenTally,
    ) -> usize {
        let ranges = self.reasoning_ranges(text, finished);
        // A marker that more text completes starts after this: text before it
        // is classed for good (the scan reads markers from the left).
        let settled = if finished { usize::MAX } else { text.len().saturating_sub(LONGEST_MARKER - 1) };
        let (mut start, mut count) = (tally.next_start, tally.reasoning);
        for (i, &end) in token_ends.iter().enumerate().skip(tally.tokens) {
            let span = if end > start { start..end } else { start..start + 1 };
            start = start.max(end);
            let reasoning = ranges.iter().any(|r| r.start < span.end && span.start < r.end);
            count += usize::from(reasoning);
            if i == tally.tokens && span.end <= settled {
                *tally = ReasoningTokenTally {
                    tokens: i + 1,
                    reasoning: tally.reasoning + usize::from(reasoning),
                    next_start: start,
                };
            }
        }
        count
    }

    /// The byte ranges of `text` whose tokens count as reasoning: `qwen3`'s
    /// reasoning as [`Self::parse`] (`finished`) or the stream so far (not
    /// `finished`: a possible partial marker at the end held back) splits
    /// it; `deepseek_r1`'s inside `<think>`...`</think>` pairs.
    fn reasoning_ranges(&self, text: &str, finished: bool) -> Vec<Range<usize>> {
        let hold = |s: &str, tags: &[&str]| if finished { 0 } else { partial_overlap_any(s, tags) };
        match self.kind {
            Kind::Qwen3 if !self.thinking => Vec::new(),
            Kind::DeepSeekR1 => {
                // vLLM's `BaseThinkingReasoningParser.count_reasoning_tokens`:
                // what lies inside `<think>`...`</think>` pairs, nested ones
                // counted in depth, a stray `</think>` ignored.
                let text = &text[..text.len() - hold(text, &[THINK_START, THINK_END])];
                let (mut ranges, mut depth, mut at) = (Vec::new(), 0usize, 0);
                while let Some((pos, marker)) =
                    [THINK_START, THINK_END].iter().filter_map(|m| text[at..].find(m).map(|i| (at + i, *m))).min()
                {
                    if depth > 0 {
                        ranges.push(at..pos);
                    }
                    depth = if marker == THINK_START { depth + 1 } else { depth.saturating_sub(1) };
                    at = pos + marker.len();
                }
                if depth > 0 {
                    ranges.push(at..text.len());
                }
                ranges.retain(|r| !r.is_empty());
                ranges
            }
            Kind::Qwen3 => {
                let end = [THINK_END, TOOL_CALL_START]
                    .iter()
                    .filter_map(|m| text.find(m))
                    .min()
                    .unwrap_or_else(|| text.len() - hold(text, &[THINK_START, THINK_END, TOOL_CALL_START]));
                // `<think>` inside the block is dropped from the reasoning.
                let mut ranges = Vec::new();
                let mut from = 0;
                for (at, _) in text[..end].match_indices(THINK_START) {
                    ranges.push(from..at);
                    from = at + THINK_START.len();
                }
                ranges.push(from..end);
                ranges.retain(|r| !r.is_empty());
                ranges
            }
        }
    }

    /// A streaming parser: feed it the output's text deltas in order.
    pub fn stream(&self) -> ReasoningStream {
        ReasoningStream {
            parser: self.clone(),
            text: String::new(),
            reasoning_sent: 0,
            content_sent: 0,
            finished: false,
        }
    }

    /// The settled split of `text` (a possible partial marker held back
    /// unless `finished`).
    fn split(&self, text: &str, finished: bool) -> Split {
        let hold = |s: &str, tags: &[&str]| if finished { 0 } else { partial_overlap_any(s, tags) };
        match self.kind {
            Kind::Qwen3 if !self.thinking => Split { reasoning: String::new(), content: text.to_owned() },
            Kind::DeepSeekR1 => match text.split_once(THINK_END) {
                Some((before, content)) => {
                    let reasoning = before.split_once(THINK_START).map_or(before, |(_, r)| r);
                    Split { reasoning: reasoning.to_owned(), content: content.to_owned() }
                }
                None => {
                    let settled = &text[..text.len() - hold(text, &[THINK_START, THINK_END])];
                    let reasoning = settled.split_once(THINK_START).map_or(settled, |(_, r)| r);
                    Split { reasoning: reasoning.to_owned(), content: String::new() }
                }
            },
            Kind::Qwen3 => {
                let end = [THINK_END, TOOL_CALL_START].iter().filter_map(|m| text.find(m).map(|at| (at, *m))).min();
                match end {
                    None => {
                        let settled = &text[..text.len() - hold(text, &[THINK_START, THINK_END, TOOL_CALL_START])];
                        Split { reasoning: settled.replace(THINK_START, ""), content: String::new() }
                    }
                    Some((at, marker)) => {
                        let rest = if marker == THINK_END { &text[at + THINK_END.len()..] } else { &text[at..] };
                        let settled = &rest[..rest.len() - hold(rest, &[THINK_END])];
                        Split {
                            reasoning: text[..at].replace(THINK_START, ""),
                            content: settled.replace(THINK_END, ""),
                        }
                    }
                }
            }
        }
    }
}

/// Streams one output's reasoning split: [`push`](Self::push) each text
/// delta, then [`finish`](Self::finish) once.
#[derive(Debug)]
pub struct ReasoningStream {
    parser: ReasoningParser,
    text: String,
    reasoning_sent: usize,
    content_sent: usize,
    finished: bool,
}

impl ReasoningStream {
    /// What `delta` adds (reasoning and/or content), `None` when nothing yet.
    pub fn push(&mut self, delta: &str) -> Option<DeltaMessage> {
        if self.finished {
            return None;
        }
        self.text.push_str(delta);
        self.emit(false)
    }

    /// Whatever was held back, once the output is complete. Later calls
    /// return `None`.
    pub fn finish(&mut self) -> Option<DeltaMessage> {
        if std::mem::replace(&mut self.finished, true) {
            return None;
        }
        self.emit(true)
    }

    fn emit(&mut self, finished: bool) -> Option<DeltaMessage> {
        let split = self.parser.split(&self.text, finished);
        let mut delta = DeltaMessage::default();
        if split.reasoning.len() > self.reasoning_sent && split.reasoning.is_char_boundary(self.reasoning_sent) {
            delta.reasoning = Some(split.reasoning[self.reasoning_sent..].to_owned());
            self.reasoning_sent = split.reasoning.len();
        }
        if split.content.len() > self.content_sent && split.content.is_char_boundary(self.content_sent) {
            delta.content = Some(split.content[self.content_sent..].to_owned());
            self.content_sent = split.content.len();
        }
        (!delta.is_empty()).then_some(delta)
    }
}
