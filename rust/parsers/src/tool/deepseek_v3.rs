//! `deepseek_v3`: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`.
//!
//! Whole: every complete call block matching vLLM's expression is a call,
//! its arguments the model's text as written; the content is the text before
//! the calls plus the text after them. As in vLLM, an output with the
//! calls-begin marker counts as calling tools even when no block reads.
//! Streamed: content up to the marker (a possible partial marker held back),
//! each call's name once its line ends, then its argument text (a possible
//! closing fence held back).

use std::sync::LazyLock;

use regex::Regex;

use super::Format;
use crate::stream::{partial_tag_overlap, CallSnapshot, Snapshot};
use crate::types::{ExtractedToolCalls, Tool, ToolCall};

const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";
const FENCE: &str = "\n```json\n";
/// What ends a call's arguments.
const ARGS_END: &str = "\n```<｜tool▁call▁end｜>";

static CALL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"<｜tool▁call▁begin｜>(?P<type>.*)<｜tool▁sep｜>(?P<name>.*)\n```json\n(?P<args>[\s\S]*?)\n```<｜tool▁call▁end｜>")
        .expect("valid regex")
});

pub(super) struct DeepSeekV3;

impl Format for DeepSeekV3 {
    fn parse(&self, text: &str, _tools: &[Tool]) -> ExtractedToolCalls {
        let Some(begin) = text.find(CALLS_BEGIN) else { return ExtractedToolCalls::content_only(text) };
        let tool_calls = CALL
            .captures_iter(text)
            .map(|c| ToolCall { id: String::new(), name: c["name"].to_owned(), arguments: c["args"].to_owned() })
            .collect();
        let mut content = text[..begin].to_owned();
        if let Some(end) = text.rfind(CALLS_END) {
            content.push_str(&text[end + CALLS_END.len()..]);
        }
        ExtractedToolCalls { tools_called: true, content: Some(content).filter(|c| !c.is_empty()), tool_calls }
    }

    fn snapshot(&self, text: &str, finished: bool, _tools: &[Tool]) -> Snapshot {
        let hold = |s: &str, tag: &str| if finished { 0 } else { partial_tag_overlap(s, tag) };
        let Some(begin) = text.find(CALLS_BEGIN) else {
            let end = text.len() - hold(text, CALLS_BEGIN);
            return Snapshot { content: text[..end].to_owned(), calls: Vec::new() };
        };
        let mut content = text[..begin].to_owned();
        let mut calls_part = &text[begin + CALLS_BEGIN.len()..];
        if let Some(end) = calls_part.rfind(CALLS_END) {
            let after = &calls_part[end + CALLS_END.len()..];
            content.push_str(&after[..after.len() - hold(after, CALLS_BEGIN)]);
            calls_part = &calls_part[..end];
        }
        let mut calls = Vec::new();
        for block in calls_part.split(CALL_BEGIN).skip(1) {
            let Some(sep) = block.find(SEP) else { break };
            let after_sep = &block[sep + SEP.len()..];
            let Some(line_end) = after_sep.find('\n') else { break };
            let name = after_sep[..line_end].to_owned();
            let arguments = match after_sep[line_end..].strip_prefix(FENCE) {
                Some(args) => match args.find(ARGS_END) {
                    Some(end) => args[..end].to_owned(),
                    None => {
                        let args = args.strip_suffix(CALL_END).unwrap_or(args);
                        args[..args.len() - hold(args, ARGS_END)].to_owned()
                    }
                },
                None => String::new(),
            };
            calls.push(CallSnapshot { name: Some(name), arguments, settled: true });
        }
        Snapshot { content, calls }
    }
}
