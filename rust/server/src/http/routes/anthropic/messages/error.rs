//! Errors on the Messages routes in Anthropic's shape:
//! `{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}`,
//! with Anthropic's error types by status. The chat pipeline's errors name
//! chat's fields; they are renamed to the Messages fields they came from.

use crate::http::error::ApiError;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// Anthropic's error type for an HTTP status, as vLLM 0.33 translates it
/// (`translate_error_type`): its table, else `api_error` for a 5xx and
/// `invalid_request_error` for any other status.
pub fn error_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        status if status.is_server_error() => "api_error",
        _ => "invalid_request_error",
    }
}

/// The Messages field a chat field came from.
fn messages_param(chat_param: &str) -> &str {
    match chat_param {
        "stop" => "stop_sequences",
        "max_completion_tokens" => "max_tokens",
        "reasoning_effort" => "output_config.effort",
        "response_format" | "structured_outputs" => "output_config.format",
        other => other,
    }
}

/// The Anthropic body of `error`: the field it names, by its Messages name,
/// leads the message unless the message already says it.
fn body(error: &ApiError) -> Value {
    let message = match error.param.as_deref().map(messages_param) {
        Some(param) if !error.message.contains(param) => format!("{param}: {}", error.message),
        _ => error.message.clone(),
    };
    json!({"type": "error", "error": {"type": error_type(error.status), "message": message}})
}

/// `error` as an Anthropic error response (status and headers as on every route).
pub fn anthropic_error(error: ApiError) -> Response {
    let body = body(&error).to_string();
    let mut response = error.into_response();
    *response.body_mut() = Body::from(body);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_fields_are_named_as_the_messages_request_named_them() {
        let error = ApiError::invalid_param("stop", "stop cannot contain an empty string.");
        assert_eq!(
            body(&error),
            json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "stop_sequences: stop cannot contain an empty string."}})
        );
        let named = ApiError::invalid_param("max_tokens", "max_tokens must be positive");
        assert_eq!(body(&named)["error"]["message"], "max_tokens must be positive");
        let not_found = ApiError::new(StatusCode::NOT_FOUND, "The model `x` does not exist.");
        assert_eq!(body(&not_found)["error"]["type"], "not_found_error");
        assert_eq!(anthropic_error(not_found).status(), StatusCode::NOT_FOUND);
        assert_eq!(error_type(StatusCode::SERVICE_UNAVAILABLE), "overloaded_error");
    }
}
