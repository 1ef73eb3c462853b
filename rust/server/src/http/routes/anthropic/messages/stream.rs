//! A streamed chat answer's chunks as Anthropic's stream events, as vLLM 0.33
//! translates them (`message_stream_converter`): `message_start` (with the
//! prompt's token count), for each run of text, reasoning or one tool call a
//! `content_block_start`, its `content_block_delta`s (`text_delta`,
//! `thinking_delta` then a `signature_delta`, `input_json_delta`) and
//! `content_block_stop`; then `message_delta` with the stop reason and the
//! counts, and `message_stop`. A generation that fails midway sends an
//! `error` event.

use super::convert::{stop_reason, thinking_signature};
use super::error::error_type;
use super::types::MessagesUsage;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::convert::Infallible;

/// The kind of the block being streamed.
#[derive(Debug, Clone, PartialEq)]
enum Block {
    Text,
    Thinking,
    /// A tool call, by its id.
    ToolUse(String),
}

/// Turns one chat stream's `data:` payloads into Anthropic events.
#[derive(Debug, Default)]
pub struct Translator {
    started: bool,
    /// The open block and its index.
    open: Option<(Block, u32)>,
    /// Blocks opened so far (the next block's index).
    blocks: u32,
    /// The chat finish: its reason and `stop_reason`.
    finish: Option<(String, Value)>,
    /// Tool call ids by the chat stream's tool call index.
    tool_ids: HashMap<u64, String>,
    /// Whether the message_delta went out.
    delta_sent: bool,
    /// Whether an error event ended the stream (nothing follows it).
    failed: bool,
}

/// One event: `event: TYPE` and its JSON.
fn event(value: &Value) -> Vec<u8> {
    let kind = value["type"].as_str().unwrap_or("error");
    format!("event: {kind}\ndata: {value}\n\n").into_bytes()
}

impl Translator {
    /// The events for one chat stream payload (the text after `data: `).
    pub fn payload(&mut self, data: &str) -> Vec<u8> {
        if self.failed {
            return Vec::new();
        }
        if data == "[DONE]" {
            return self.done();
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            return event(&json!({"type": "error", "error": {"type": "api_error",
                "message": "the chat stream sent a chunk that is not JSON"}}));
        };
        if let Some(error) = chunk.get("error") {
            let status = error["code"].as_u64().and_then(|c| StatusCode::from_u16(c as u16).ok());
            let kind = error_type(status.unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
            self.failed = true;
            return event(&json!({"type": "error", "error": {"type": kind, "message": error["message"]}}));
        }
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            out.extend(event(&json!({"type": "message_start", "message": {
                "id": chunk["id"], "type": "message", "role": "assistant", "content": [], "model": chunk["model"],
                "stop_reason": null, "stop_sequence": null,
                "usage": MessagesUsage { output_tokens: 0, ..MessagesUsage::of(&chunk["usage"]) }}})));
        }
        let Some(choice) = chunk["choices"].as_array().and_then(|c| c.first()) else {
            // The usage chunk that ends every stream of the chat pipeline here.
            out.extend(self.close_block());
            out.extend(self.message_delta(&chunk["usage"]));
            return out;
        };
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish = Some((reason.to_owned(), choice["stop_reason"].clone()));
        }
        let delta = &choice["delta"];
        if let Some(thinking) = delta["reasoning"].as_str().filter(|t| !t.is_empty()) {
            let index = self.open_block(Block::Thinking, json!({"type": "thinking", "thinking": ""}), &mut out);
            out.extend(event(&json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "thinking_delta", "thinking": thinking}})));
        }
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            let index = self.open_block(Block::Text, json!({"type": "text", "text": ""}), &mut out);
            out.extend(event(&json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "text_delta", "text": text}})));
        }
        for call in delta["tool_calls"].as_array().map(Vec::as_slice).unwrap_or_default() {
            out.extend(self.tool_call(call));
        }
        out
    }

    /// A tool call's part: a new call opens a `tool_use` block; its arguments
    /// (whole or in pieces) are `input_json_delta`s of its block.
    fn tool_call(&mut self, call: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        let position = call["index"].as_u64().unwrap_or(0);
        if let (Some(id), Some(name)) = (call["id"].as_str(), call["function"]["name"].as_str()) {
            self.tool_ids.insert(position, id.to_owned());
            let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
            self.open_block(Block::ToolUse(id.to_owned()), block, &mut out);
        }
        let arguments = call["function"]["arguments"].as_str().filter(|a| !a.is_empty());
        let id = self.tool_ids.get(&position);
        if let (Some(arguments), Some((Block::ToolUse(open_id), index))) = (arguments, &self.open) {
            if Some(open_id) == id {
                out.extend(event(&json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": arguments}})));
            }
        }
        out
    }

    /// The index of the open block of `kind`, opening it (and closing
    /// another) when needed.
    fn open_block(&mut self, kind: Block, start: Value, out: &mut Vec<u8>) -> u32 {
        if let Some((open, index)) = &self.open {
            if *open == kind {
                return *index;
            }
        }
        out.extend(self.close_block());
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some((kind, index));
        out.extend(event(&json!({"type": "content_block_start", "index": index, "content_block": start})));
        index
    }

    /// Closes the open block; a thinking block gets its signature first.
    fn close_block(&mut self) -> Vec<u8> {
        let Some((kind, index)) = self.open.take() else { return Vec::new() };
        let mut out = Vec::new();
        if kind == Block::Thinking {
            out.extend(event(&json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "signature_delta", "signature": thinking_signature()}})));
        }
        out.extend(event(&json!({"type": "content_block_stop", "index": index})));
        out
    }

    fn message_delta(&mut self, usage: &Value) -> Vec<u8> {
        if self.delta_sent {
            return Vec::new();
        }
        self.delta_sent = true;
        let (reason, chat_stop) = self.finish.clone().unwrap_or_else(|| ("stop".into(), Value::Null));
        let (reason, sequence) = stop_reason(Some(&reason), &chat_stop, !self.tool_ids.is_empty());
        event(&json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": MessagesUsage::of(usage)}))
    }

    /// The end of the chat stream: what is still open closes, then `message_stop`.
    fn done(&mut self) -> Vec<u8> {
        let mut out = self.close_block();
        out.extend(self.message_delta(&Value::Null));
        out.extend(event(&json!({"type": "message_stop"})));
        out
    }
}

/// The Anthropic event stream of a chat stream's body. Dropping it (the
/// client went away) drops the chat stream, which aborts the request.
pub fn translate(body: Body) -> Body {
    let mut translator = Translator::default();
    let mut pending: Vec<u8> = Vec::new();
    let events = body.into_data_stream().filter_map(move |item| {
        let out = match item {
            Ok(bytes) => {
                pending.extend_from_slice(&bytes);
                let mut out = Vec::new();
                while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
                    let frame: Vec<u8> = pending.drain(..end + 2).collect();
                    let text = String::from_utf8_lossy(&frame);
                    if let Some(data) = text.trim_end().strip_prefix("data: ") {
                        out.extend(translator.payload(data));
                    }
                }
                out
            }
            Err(e) => event(&json!({"type": "error", "error": {"type": "api_error", "message": e.to_string()}})),
        };
        std::future::ready((!out.is_empty()).then(|| Ok::<_, Infallible>(Bytes::from(out))))
    });
    Body::from_stream(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events of `payloads` as (type, JSON) pairs.
    fn events(payloads: &[Value]) -> Vec<Value> {
        let mut translator = Translator::default();
        let mut bytes = Vec::new();
        for payload in payloads {
            bytes.extend(translator.payload(&payload.to_string()));
        }
        bytes.extend(translator.payload("[DONE]"));
        let text = String::from_utf8(bytes).unwrap();
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (head, data) = e.split_once('\n').unwrap();
                let value: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(head.strip_prefix("event: ").unwrap(), value["type"]);
                value
            })
            .collect()
    }

    fn chunk(delta: Value, finish: Value, stop: Value) -> Value {
        json!({"id": "chatcmpl-1", "model": "m", "usage": {"prompt_tokens": 4, "completion_tokens": 1},
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "stop_reason": stop}]})
    }

    #[test]
    fn text_thinking_and_a_tool_call_stream_as_anthropics_events() {
        let usage = json!({"id": "chatcmpl-1", "model": "m", "choices": [],
            "usage": {"prompt_tokens": 4, "completion_tokens": 6}});
        let all = events(&[
            chunk(json!({"role": "assistant", "content": ""}), Value::Null, Value::Null),
            chunk(json!({"reasoning": "hm"}), Value::Null, Value::Null),
            chunk(json!({"content": "Hi"}), Value::Null, Value::Null),
            chunk(json!({"content": " there"}), Value::Null, Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                "function": {"name": "f", "arguments": "{\"a\""}}]}),
                Value::Null,
                Value::Null,
            ),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}), Value::Null, Value::Null),
            chunk(json!({}), json!("tool_calls"), Value::Null),
            usage,
        ]);
        let kinds: Vec<&str> = all.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(all[0]["message"]["usage"], json!({"input_tokens": 4, "output_tokens": 0}));
        assert_eq!(all[3]["delta"]["type"], "signature_delta");
        assert_eq!((all[5]["index"].as_u64(), &all[5]["content_block"]["type"]), (Some(1), &json!("text")));
        assert_eq!(all[7]["delta"], json!({"type": "text_delta", "text": " there"}));
        assert_eq!(all[9]["content_block"], json!({"type": "tool_use", "id": "c1", "name": "f", "input": {}}));
        let json_parts: String = all[10..12].iter().map(|e| e["delta"]["partial_json"].as_str().unwrap()).collect();
        assert_eq!(json_parts, "{\"a\": 1}");
        assert_eq!(all[13]["delta"], json!({"stop_reason": "tool_use", "stop_sequence": null}));
        assert_eq!(all[13]["usage"], json!({"input_tokens": 4, "output_tokens": 6}));
    }

    #[test]
    fn a_stop_sequence_and_an_error_are_anthropics() {
        let all = events(&[
            chunk(json!({"content": "a"}), Value::Null, Value::Null),
            chunk(json!({}), json!("stop"), json!("END")),
        ]);
        let delta = all.iter().find(|e| e["type"] == "message_delta").unwrap();
        assert_eq!(delta["delta"], json!({"stop_reason": "stop_sequence", "stop_sequence": "END"}));
        let error = events(&[json!({"error": {"message": "engine died", "type": "x", "code": 503}})]);
        assert_eq!(error.len(), 1, "nothing follows an error");
        assert_eq!(error[0], json!({"type": "error", "error": {"type": "overloaded_error", "message": "engine died"}}));
    }
}
