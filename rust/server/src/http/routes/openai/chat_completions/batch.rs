//! `POST /v1/chat/completions/batch`, as vLLM 0.33 defines it: a chat body
//! whose `messages` is a list of conversations. Each conversation is answered
//! by the chat pipeline as its own chat request (the other fields shared),
//! every one checked before any is run, and the answers are merged into one
//! chat completion with a choice per conversation, indexed in order, and
//! the usage summed. Not streamed, no tools, `n` 1 and no beam search, as
//! in vLLM.

use crate::http::body::{parse_body, JsonBody};
use crate::http::error::ApiError;
use crate::http::routes::openai::chat_completions::chat_completion;
use crate::http::routes::openai::chat_completions::convert::prepare_chat;
use crate::http::routes::openai::chat_completions::types::ChatBody;
use crate::http::rules::RULES;
use crate::http::state::SharedState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

/// Handles `POST /v1/chat/completions/batch`.
pub async fn create_batch_chat_completion(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Response {
    let answer = async {
        let body: Map<String, Value> = parse_body(&body?.0)?;
        let conversations = conversation_bodies(body)?;
        let chats = conversations.iter().map(|b| parse_body::<ChatBody>(b)).collect::<Result<Vec<_>, _>>()?;
        // vLLM renders every conversation before running any: a bad one refuses the batch.
        for chat in chats {
            prepare_chat(&state, chat)?;
        }
        let runs = conversations.iter().map(|b| async {
            let response = chat_completion(state.clone(), headers.clone(), parse_body(b)?).await?;
            answer_json(response).await
        });
        let answers = futures_util::future::join_all(runs).await.into_iter().collect::<Result<Vec<_>, _>>()?;
        merge_answers(answers)
    };
    match answer.await {
        Ok(merged) => Json(merged).into_response(),
        Err(error) => error.into_response(),
    }
}

/// Checks the batch's own rules and splits it into one chat body (as JSON)
/// per conversation, every other field shared.
pub fn conversation_bodies(mut body: Map<String, Value>) -> Result<Vec<Vec<u8>>, ApiError> {
    let refuse = |param: &str, key: &str| RULES.refuse(param, key, &[]);
    if body.get("use_beam_search").and_then(Value::as_bool) == Some(true) {
        return Err(refuse("use_beam_search", "batch_beam_search"));
    }
    if body.get("n").is_some_and(|n| !n.is_null() && n.as_i64() != Some(1)) {
        return Err(refuse("n", "batch_n"));
    }
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err(refuse("stream", "batch_stream"));
    }
    if body.get("tools").and_then(Value::as_array).is_some_and(|tools| !tools.is_empty()) {
        return Err(refuse("tools", "batch_tools"));
    }
    if body.get("tool_choice").is_some_and(|c| !c.is_null() && c.as_str() != Some("none")) {
        return Err(refuse("tool_choice", "batch_tool_choice"));
    }
    let conversations = match body.remove("messages") {
        None | Some(Value::Null) => return Err(refuse("messages", "messages_missing")),
        Some(Value::Array(conversations)) => conversations,
        Some(_) => return Err(refuse("messages", "batch_messages_shape")),
    };
    if conversations.is_empty() {
        return Err(refuse("messages", "messages_empty"));
    }
    conversations
        .into_iter()
        .map(|conversation| {
            if conversation.as_array().is_none_or(|messages| messages.is_empty()) {
                return Err(refuse("messages", "batch_messages_shape"));
            }
            let mut chat = body.clone();
            chat.insert("messages".into(), conversation);
            Ok(serde_json::to_vec(&chat).expect("a JSON map serializes"))
        })
        .collect()
}

/// A whole chat answer's JSON, or the error it answered.
async fn answer_json(response: Response) -> Result<Value, ApiError> {
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .map_err(|e| ApiError::internal(format!("cannot read the chat answer: {e}")))?;
    let value: Value =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::internal(format!("the chat answer is not JSON: {e}")))?;
    if status.is_success() {
        return Ok(value);
    }
    let message = value["error"]["message"].as_str().unwrap_or("the chat answer failed");
    Err(ApiError::new(status, message))
}

/// One chat completion from the conversations' answers, in order: the
/// first answer's id, time and model, conversation `i`'s choice at index
/// `i`, the token counts summed, and no response-level prompt fields (vLLM
/// leaves them out of a batch answer).
pub fn merge_answers(answers: Vec<Value>) -> Result<Value, ApiError> {
    let mut answers = answers.into_iter();
    let mut merged = answers.next().ok_or_else(|| ApiError::internal("a batch with no answers"))?;
    let mut choices = Vec::new();
    let mut counts = [0u64; 2];
    for (index, answer) in std::iter::once(&merged).chain(answers.as_slice()).enumerate() {
        let mut choice = answer["choices"][0].clone();
        if !choice.is_object() {
            return Err(ApiError::internal(format!("the answer to conversation {index} has no choice")));
        }
        choice["index"] = json!(index);
        choices.push(choice);
        for (count, field) in counts.iter_mut().zip(["prompt_tokens", "completion_tokens"]) {
            *count += answer["usage"][field].as_u64().unwrap_or(0);
        }
    }
    let [prompt_tokens, completion_tokens] = counts;
    merged["choices"] = Value::Array(choices);
    merged["usage"] = json!({
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": null,
    });
    for field in ["prompt_logprobs", "prompt_token_ids"] {
        if let Some(value) = merged.get_mut(field) {
            *value = Value::Null;
        }
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(body: Value) -> Result<Vec<Value>, ApiError> {
        let Value::Object(body) = body else { panic!("not an object") };
        conversation_bodies(body).map(|bodies| bodies.iter().map(|b| serde_json::from_slice(b).unwrap()).collect())
    }

    #[test]
    fn each_conversation_gets_the_shared_fields() {
        let bodies = split(json!({
            "messages": [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
            "max_tokens": 3, "temperature": 0
        }))
        .unwrap();
        assert_eq!(bodies.len(), 2);
        assert_eq!(bodies[1]["messages"][0]["content"], "b");
        assert_eq!(bodies[1]["max_tokens"], 3);
        assert_eq!(bodies[0]["temperature"], 0);
    }

    #[test]
    fn batch_rules_name_the_field() {
        let one = json!([[{"role": "user", "content": "a"}]]);
        let cases = [
            (json!({"messages": one, "n": 2}), "n"),
            (json!({"messages": one, "use_beam_search": true}), "use_beam_search"),
            (json!({"messages": one, "stream": true}), "stream"),
            (json!({"messages": one, "tools": [{"type": "function"}]}), "tools"),
            (json!({"messages": one, "tool_choice": "auto"}), "tool_choice"),
            (json!({}), "messages"),
            (json!({"messages": []}), "messages"),
            (json!({"messages": [[]]}), "messages"),
            (json!({"messages": [{"role": "user", "content": "a"}]}), "messages"),
        ];
        for (body, param) in cases {
            let error = split(body.clone()).unwrap_err();
            assert_eq!(error.param.as_deref(), Some(param), "{body}");
            assert_eq!(error.status, axum::http::StatusCode::BAD_REQUEST);
        }
        assert!(split(json!({"messages": one, "n": 1, "stream": false, "tool_choice": "none"})).is_ok());
    }

    #[test]
    fn answers_merge_in_order_with_summed_usage() {
        let answer = |id: &str, text: &str, prompt: u64, completion: u64| {
            json!({
                "id": id, "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion},
                "prompt_logprobs": null, "prompt_token_ids": [1, 2]
            })
        };
        let merged = merge_answers(vec![answer("a", "x", 5, 2), answer("b", "y", 7, 3)]).unwrap();
        assert_eq!(merged["id"], "a");
        assert_eq!(merged["choices"][1]["index"], 1);
        assert_eq!(merged["choices"][1]["message"]["content"], "y");
        assert_eq!(merged["usage"]["prompt_tokens"], 12);
        assert_eq!(merged["usage"]["completion_tokens"], 5);
        assert_eq!(merged["usage"]["total_tokens"], 17);
        assert_eq!(merged["prompt_token_ids"], Value::Null);
    }
}
