//! Streaming by re-reading: after each delta a format describes the output so
//! far as a [`Snapshot`] (settled content, and per call its name once whole
//! and its argument text so far); [`Differ`] turns the growth between two
//! snapshots into the delta vLLM would send. Nothing once sent is taken back,
//! so the deltas concatenated are the final snapshot.

use crate::ids::IdKind;
use crate::types::{DeltaMessage, DeltaToolCall};

/// A call as far as the output shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct CallSnapshot {
    /// The name, once it is whole.
    pub name: Option<String>,
    /// The argument text so far.
    pub arguments: String,
    /// Whether `arguments` only ever grows at its end. When false it is a
    /// best-effort completion of a partial value (closers added) and only the
    /// part it shares with the previous snapshot's is sent, as vLLM does with
    /// partial JSON.
    pub settled: bool,
}

/// The output so far, as a format reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Snapshot {
    /// Content that can no longer change (it only grows).
    pub content: String,
    /// The calls begun so far.
    pub calls: Vec<CallSnapshot>,
}

/// Per call: what was sent.
#[derive(Debug, Default)]
struct SentCall {
    name_sent: bool,
    arguments: String,
    /// The previous unsettled argument text (for the common prefix).
    previous_candidate: Option<String>,
}

/// Diffs successive snapshots into deltas.
#[derive(Debug)]
pub(crate) struct Differ {
    id_kind: IdKind,
    content_sent: usize,
    calls: Vec<SentCall>,
}

/// The longest common prefix of `a` and `b`, on a character boundary.
fn common_prefix<'a>(a: &'a str, b: &str) -> &'a str {
    let mut end = 0;
    for ((i, ca), cb) in a.char_indices().zip(b.chars()) {
        if ca != cb {
            break;
        }
        end = i + ca.len_utf8();
    }
    &a[..end]
}

impl Differ {
    pub(crate) fn new(id_kind: IdKind) -> Self {
        Differ { id_kind, content_sent: 0, calls: Vec::new() }
    }

    /// Whether any call was announced.
    pub(crate) fn any_call_sent(&self) -> bool {
        self.calls.iter().any(|c| c.name_sent)
    }

    /// What `snapshot` adds to what was sent, if anything.
    pub(crate) fn diff(&mut self, snapshot: &Snapshot) -> Option<DeltaMessage> {
        let mut delta = DeltaMessage::default();
        if snapshot.content.len() > self.content_sent && snapshot.content.is_char_boundary(self.content_sent) {
            delta.content = Some(snapshot.content[self.content_sent..].to_owned());
            self.content_sent = snapshot.content.len();
        }
        for (index, call) in snapshot.calls.iter().enumerate() {
            if self.calls.len() <= index {
                self.calls.push(SentCall::default());
            }
            let sent = &mut self.calls[index];
            let mut part = DeltaToolCall { index, id: None, kind: None, name: None, arguments: None };
            if !sent.name_sent {
                let Some(name) = &call.name else {
                    // A later call cannot be announced before this one.
                    break;
                };
                sent.name_sent = true;
                part.id = Some(self.id_kind.make());
                part.kind = Some("function");
                part.name = Some(name.clone());
            }
            let stable = if call.settled {
                sent.previous_candidate = None;
                call.arguments.as_str()
            } else {
                // Two equal readings say nothing about which closers are final.
                let previous = sent.previous_candidate.replace(call.arguments.clone());
                match previous {
                    Some(previous) if previous != call.arguments => common_prefix(&call.arguments, &previous),
                    _ => "",
                }
            };
            if stable.len() > sent.arguments.len() && stable.starts_with(sent.arguments.as_str()) {
                part.arguments = Some(stable[sent.arguments.len()..].to_owned());
                sent.arguments = stable.to_owned();
            }
            if part.name.is_some() || part.arguments.is_some() {
                delta.tool_calls.push(part);
            }
        }
        (!delta.is_empty()).then_some(delta)
    }
}

/// How long a suffix of `text` is a proper prefix of `tag` (vLLM's
/// `partial_tag_overlap`): text that may still become the tag.
pub(crate) fn partial_tag_overlap(text: &str, tag: &str) -> usize {
    let max = (tag.len().saturating_sub(1)).min(text.len());
    (1..=max).rev().find(|&k| tag.is_char_boundary(k) && text.ends_with(&tag[..k])).unwrap_or(0)
}

/// The longest overlap of `text`'s end with a prefix of any of `tags`.
pub(crate) fn partial_overlap_any(text: &str, tags: &[&str]) -> usize {
    tags.iter().map(|t| partial_tag_overlap(text, t)).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_finds_tag_prefixes() {
        assert_eq!(partial_tag_overlap("abc<tool_", "<tool_call>"), 6);
        assert_eq!(partial_tag_overlap("abc", "<tool_call>"), 0);
        assert_eq!(partial_tag_overlap("<tool_call>", "<tool_call>"), 0);
        assert_eq!(partial_tag_overlap("x<｜tool", "<｜tool▁calls▁begin｜>"), "<｜tool".len());
    }

    #[test]
    fn unsettled_arguments_send_the_common_prefix() {
        let mut d = Differ::new(IdKind::Chatcmpl);
        let snap = |args: &str| Snapshot {
            content: String::new(),
            calls: vec![CallSnapshot { name: Some("f".into()), arguments: args.into(), settled: false }],
        };
        let first = d.diff(&snap("{\"a\": \"P\"}")).unwrap();
        assert_eq!(first.tool_calls[0].name.as_deref(), Some("f"));
        assert_eq!(first.tool_calls[0].arguments, None);
        let second = d.diff(&snap("{\"a\": \"Pa\"}")).unwrap();
        assert_eq!(second.tool_calls[0].arguments.as_deref(), Some("{\"a\": \"P"));
    }
}
