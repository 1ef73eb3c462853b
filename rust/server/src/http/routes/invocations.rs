//! `POST /invocations`, SageMaker's route: the body's shape picks the route
//! that answers it, as vLLM dispatches it for a text-generation model (chat
//! completions first, then completions; this server runs no pooling models,
//! so those kinds are never candidates).

use crate::http::body::{parse_body, JsonBody};
use crate::http::error::ApiError;
use crate::http::routes::openai::chat_completions::chat_completion;
use crate::http::routes::openai::completions::completion;
use crate::http::rules::RULES;
use crate::http::state::SharedState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// The route a body goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invocation {
    /// A chat completion: the body has `messages`.
    Chat,
    /// A completion: the body has a non-empty `prompt`.
    Completion,
}

impl Invocation {
    /// The route for `body`, in vLLM's order (chat before completions), or
    /// `None` when it is neither kind. A body of a kind with a bad field goes
    /// to that kind's route, whose 400 names the field (vLLM's names none).
    pub fn of(body: &Value) -> Option<Invocation> {
        let field = |name| body.get(name).filter(|v| !v.is_null());
        if field("messages").is_some() {
            return Some(Invocation::Chat);
        }
        // vLLM's completion request needs a prompt that is not empty.
        field("prompt").filter(|p| p.as_str() != Some("")).map(|_| Invocation::Completion)
    }
}

/// Handles `POST /invocations`: the chat or completion answer, streamed or
/// not, or vLLM's 400 naming the kinds it takes.
pub async fn invocations(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Response {
    let answer = async {
        let bytes = body?.0;
        let value: Value = parse_body(&bytes)?;
        match Invocation::of(&value) {
            Some(Invocation::Chat) => chat_completion(state, headers, parse_body(&bytes)?).await,
            Some(Invocation::Completion) => completion(state, headers, parse_body(&bytes)?).await,
            None => Err(ApiError::bad_request(RULES.message("invocation_unknown", &[]))),
        }
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_body_picks_the_route() {
        let cases = [
            (json!({"messages": [{"role": "user", "content": "hi"}]}), Some(Invocation::Chat)),
            // Chat wins, as it is vLLM's first candidate.
            (json!({"messages": [], "prompt": "x"}), Some(Invocation::Chat)),
            (json!({"prompt": "x"}), Some(Invocation::Completion)),
            (json!({"prompt": [1, 2]}), Some(Invocation::Completion)),
            (json!({"prompt": ""}), None),
            (json!({"prompt": null, "messages": null}), None),
            (json!({}), None),
            (json!([1]), None),
        ];
        for (body, expected) in cases {
            assert_eq!(Invocation::of(&body), expected, "{body}");
        }
    }
}
