//! Logprobs rendered as vLLM 0.33's completions and chat endpoints render
//! them, written as JSON text with Python's number format (the Python API
//! server writes the same bytes).

use super::positions::{entry, Position, Scored};
use super::py_float::write_py_float;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use vllm_rs_chat::Tokenizer;

/// What OpenAI (and vLLM) write for a logprob of -inf.
pub const MIN_LOGPROB: f64 = -9999.0;

/// How logprobs show tokens: as vLLM decodes them, or as `token_id:N`
/// (`return_tokens_as_token_ids`); a token without a position (the first
/// prompt token) is decoded alone.
pub struct TokenStrings {
    /// Decodes tokens that no position lists.
    pub tokenizer: Arc<dyn Tokenizer>,
    /// Show every token as `token_id:N`.
    pub as_ids: bool,
}

impl TokenStrings {
    /// The string for `token_id`, scored at `position`.
    pub fn of<'a>(&self, token_id: u32, position: Option<&'a Position>) -> Cow<'a, str> {
        if self.as_ids {
            return Cow::Owned(format!("token_id:{token_id}"));
        }
        match position.and_then(|p| entry(p, token_id)) {
            Some(e) => Cow::Borrowed(&e.text),
            None => Cow::Owned(self.tokenizer.decode(&[token_id]).unwrap_or_default()),
        }
    }
}

/// A completion's prompt, shown before its text (`echo`).
pub struct Echo {
    /// The prompt text.
    pub text: String,
    /// The prompt tokens.
    pub token_ids: Vec<u32>,
    /// Show the prompt alone, leaving the generated tokens out (vLLM's
    /// `echo` with `max_tokens` 0).
    pub prompt_only: bool,
}

/// How one request's answer shows logprobs, echo and prompt logprobs.
pub struct Rendering {
    /// How logprobs show tokens.
    pub strings: TokenStrings,
    /// Completions' `logprobs`, or chat's `top_logprobs` when chat `logprobs`
    /// is true; `None`: no logprobs in the answer.
    pub logprobs: Option<i64>,
    /// The prompt to echo (completions).
    pub echo: Option<Echo>,
    /// Whether the (non-streamed) answer carries `prompt_logprobs`.
    pub prompt_logprobs: bool,
}

/// -inf as the number OpenAI uses (Python's `max`: NaN stays NaN).
fn clamp(logprob: f64) -> f64 {
    if MIN_LOGPROB > logprob {
        MIN_LOGPROB
    } else {
        logprob
    }
}

/// JSON text built piece by piece.
struct Json(String);

impl Json {
    fn raw(&mut self, s: &str) {
        self.0.push_str(s);
    }

    fn str(&mut self, s: &str) {
        let quoted = serde_json::to_string(s).expect("a string serializes");
        self.0.push_str(&quoted);
    }

    /// A logprob, clamped; NaN (from a broken engine) as null, so the answer stays JSON.
    fn logprob(&mut self, logprob: f64) {
        let value = clamp(logprob);
        if value.is_finite() {
            write_py_float(&mut self.0, value);
        } else {
            self.0.push_str("null");
        }
    }

    fn int(&mut self, n: impl std::fmt::Display) {
        use std::fmt::Write;
        write!(self.0, "{n}").expect("write to String");
    }

    fn bytes(&mut self, text: &str) {
        self.0.push('[');
        for (i, b) in text.bytes().enumerate() {
            if i > 0 {
                self.0.push(',');
            }
            self.int(b);
        }
        self.0.push(']');
    }

    fn done(self) -> Box<RawValue> {
        RawValue::from_string(self.0).expect("logprobs JSON is well formed")
    }
}

/// The entries of `position` shown for a request asking for `limit` (all for `None`).
fn shown(position: &Position, limit: Option<usize>) -> &[super::Entry] {
    &position[..limit.map_or(position.len(), |n| n.min(position.len()))]
}

/// `positions` padded with `None` to `count` (tokens the engine sent no logprobs for).
fn padded(positions: Option<&[Position]>, count: usize) -> impl Iterator<Item = Option<&Position>> {
    let known = positions.unwrap_or_default();
    (0..count).map(move |i| known.get(i))
}

impl Rendering {
    /// Chat's `logprobs` for the tokens of a delta (vLLM's
    /// `_create_chat_logprobs`), or `None` when not asked for: per token
    /// {token, logprob, bytes, top_logprobs}, the first `top_logprobs`
    /// entries of each position (all of them for -1). As in vLLM, a token's
    /// own `bytes` are those of its decoded text even shown as `token_id:N`.
    pub fn chat_logprobs(&self, scored: Option<&Scored>) -> Option<Box<RawValue>> {
        let top = self.logprobs?;
        let limit = (top != -1).then(|| top.max(0) as usize);
        let (token_ids, positions) = match scored {
            Some(s) => (&s.token_ids[..], s.logprobs.as_deref()),
            None => (&[][..], None),
        };
        let mut out = Json(String::from("{\"content\":["));
        for (i, (&token_id, position)) in token_ids.iter().zip(padded(positions, token_ids.len())).enumerate() {
            if i > 0 {
                out.raw(",");
            }
            let token = self.strings.of(token_id, position);
            out.raw("{\"token\":");
            out.str(&token);
            match position.and_then(|p| entry(p, token_id).map(|e| (p, e))) {
                None => {
                    out.raw(",\"logprob\":");
                    out.logprob(MIN_LOGPROB);
                    out.raw(",\"bytes\":");
                    out.bytes(&token);
                    out.raw(",\"top_logprobs\":[]}");
                }
                Some((position, own)) => {
                    out.raw(",\"logprob\":");
                    out.logprob(own.logprob);
                    out.raw(",\"bytes\":");
                    out.bytes(&own.text);
                    out.raw(",\"top_logprobs\":[");
                    for (j, e) in shown(position, limit).iter().enumerate() {
                        if j > 0 {
                            out.raw(",");
                        }
                        let text = self.strings.of(e.token_id, Some(position));
                        out.raw("{\"token\":");
                        out.str(&text);
                        out.raw(",\"logprob\":");
                        out.logprob(e.logprob);
                        out.raw(",\"bytes\":");
                        out.bytes(&text);
                        out.raw("}");
                    }
                    out.raw("]}");
                }
            }
        }
        out.raw("]}");
        Some(out.done())
    }

    /// vLLM's `prompt_logprobs` field for the positions the engine sent
    /// (null when none came): per prompt token null (the first) or
    /// {token id: {logprob, rank, decoded_token}}.
    pub fn prompt_logprobs_json(&self, positions: Option<&[Option<Position>]>) -> Box<RawValue> {
        let Some(positions) = positions else { return Json("null".into()).done() };
        let mut out = Json(String::from("["));
        for (i, position) in positions.iter().enumerate() {
            if i > 0 {
                out.raw(",");
            }
            let Some(position) = position else {
                out.raw("null");
                continue;
            };
            out.raw("{");
            for (j, e) in position.iter().enumerate() {
                if j > 0 {
                    out.raw(",");
                }
                out.raw("\"");
                out.int(e.token_id);
                out.raw("\":{\"logprob\":");
                out.logprob(e.logprob);
                out.raw(",\"rank\":");
                out.int(e.rank);
                out.raw(",\"decoded_token\":");
                out.str(&e.text);
                out.raw("}");
            }
            out.raw("}");
        }
        out.raw("]");
        out.done()
    }
}

/// vLLM's `_create_completion_logprobs`: a position without logprobs (the
/// first prompt token) has null; each `top_logprobs` holds the first
/// `logprobs + 1` entries (all of them for -1), keyed by token string (a
/// string shown twice keeps its first place with its last logprob). Returns
/// the JSON and the offset after the last token.
fn completion_logprobs(
    token_ids: &[u32],
    positions: &[Option<&Position>],
    num_logprobs: i64,
    strings: &TokenStrings,
    initial_offset: usize,
) -> (Box<RawValue>, usize) {
    let limit = (num_logprobs != -1).then(|| (num_logprobs + 1).max(0) as usize);
    let tokens: Vec<Cow<'_, str>> = token_ids.iter().zip(positions).map(|(&t, p)| strings.of(t, *p)).collect();
    let mut out = Json(String::from("{\"text_offset\":["));
    // Python counts characters.
    let mut offset = initial_offset;
    for (i, token) in tokens.iter().enumerate() {
        if i > 0 {
            out.raw(",");
        }
        out.int(offset);
        offset += token.chars().count();
    }
    out.raw("],\"token_logprobs\":[");
    for (i, (&token_id, position)) in token_ids.iter().zip(positions).enumerate() {
        if i > 0 {
            out.raw(",");
        }
        // vLLM looks the token up in its position; a position without it is the engine's fault.
        match position.and_then(|p| entry(p, token_id)) {
            Some(e) => out.logprob(e.logprob),
            None => out.raw("null"),
        }
    }
    out.raw("],\"tokens\":[");
    for (i, token) in tokens.iter().enumerate() {
        if i > 0 {
            out.raw(",");
        }
        out.str(token);
    }
    out.raw("],\"top_logprobs\":[");
    for (i, position) in positions.iter().enumerate() {
        if i > 0 {
            out.raw(",");
        }
        let Some(position) = position else {
            out.raw("null");
            continue;
        };
        let mut top: Vec<(Cow<'_, str>, f64)> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        for e in shown(position, limit) {
            let key = strings.of(e.token_id, Some(position));
            match index.get(key.as_ref()) {
                Some(&at) => top[at].1 = e.logprob,
                None => {
                    index.insert(key.to_string(), top.len());
                    top.push((key, e.logprob));
                }
            }
        }
        out.raw("{");
        for (j, (key, logprob)) in top.iter().enumerate() {
            if j > 0 {
                out.raw(",");
            }
            out.str(key);
            out.raw(":");
            out.logprob(*logprob);
        }
        out.raw("}");
    }
    out.raw("]}");
    (out.done(), offset)
}

/// A completion's text and logprobs, delta by delta: the echoed prompt goes
/// first, text offsets run on across deltas (vLLM's streams). One per choice.
pub struct CompletionPieces {
    rendering: Arc<Rendering>,
    next_offset: Cell<usize>,
    echoed: Cell<bool>,
}

impl CompletionPieces {
    /// Pieces of a choice rendered with `rendering`, from its start.
    pub fn new(rendering: Arc<Rendering>) -> Self {
        CompletionPieces { rendering, next_offset: Cell::new(0), echoed: Cell::new(false) }
    }

    /// The text and the `logprobs` of the next delta.
    pub fn piece<'a>(&self, text: &'a str, scored: Option<&Scored>) -> (Cow<'a, str>, Option<Box<RawValue>>) {
        let rendering = &self.rendering;
        // The one token generated for a prompt-only echo is not shown.
        let shown = !rendering.echo.as_ref().is_some_and(|e| e.prompt_only);
        let (token_ids, sample) = match scored {
            Some(s) if shown => (&s.token_ids[..], s.logprobs.as_deref()),
            _ => (&[][..], None),
        };
        let mut text = Cow::Borrowed(if shown { text } else { "" });
        let mut all_ids = Cow::Borrowed(token_ids);
        let mut positions: Vec<Option<&Position>> = padded(sample, token_ids.len()).collect();
        if let Some(echo) = rendering.echo.as_ref().filter(|_| !self.echoed.get()) {
            self.echoed.set(true);
            text = Cow::Owned(format!("{}{text}", echo.text));
            all_ids = Cow::Owned([&echo.token_ids[..], token_ids].concat());
            let prompt = scored.and_then(|s| s.prompt_logprobs.as_deref()).unwrap_or_default();
            let echoed = (0..echo.token_ids.len()).map(|i| prompt.get(i).and_then(Option::as_ref));
            positions = echoed.chain(positions).collect();
        }
        let Some(num_logprobs) = rendering.logprobs else { return (text, None) };
        let (json, next) =
            completion_logprobs(&all_ids, &positions, num_logprobs, &rendering.strings, self.next_offset.get());
        if !all_ids.is_empty() {
            self.next_offset.set(next);
        }
        (text, Some(json))
    }
}
