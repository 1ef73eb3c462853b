//! Bearer-token authentication when `api_key` is set: the key comes in
//! `Authorization: Bearer <key>` or, as Anthropic's clients send it,
//! `x-api-key: <key>`. `/health`, `/ping` and `/metrics` stay open, and so do
//! `OPTIONS` requests (CORS preflights carry no credentials), as in vLLM.

use crate::http::error::ApiError;
use crate::http::state::SharedState;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Paths served without a key.
const OPEN_PATHS: &[&str] = &["/health", "/ping", "/metrics"];

/// The header Anthropic's clients carry the key in.
const X_API_KEY: &str = "x-api-key";

/// Rejects requests without a valid key with 401 (in Anthropic's shape on its routes).
pub async fn require_api_key(State(state): State<SharedState>, request: Request, next: Next) -> Response {
    let keys = &state.config.api_keys;
    if keys.is_empty() || request.method() == Method::OPTIONS || OPEN_PATHS.contains(&request.uri().path()) {
        return next.run(request).await;
    }
    let headers = request.headers();
    let bearer =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let x_api_key = headers.get(X_API_KEY).and_then(|v| v.to_str().ok());
    // Every key is compared in full, so timing does not reveal which one is near.
    let matches = |given: &str| keys.iter().fold(false, |ok, key| ok | constant_time_eq(given.trim(), key));
    if bearer.is_some_and(matches) || x_api_key.is_some_and(matches) {
        return next.run(request).await;
    }
    let error = ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized: a valid API key is required");
    if request.uri().path().starts_with("/v1/messages") {
        crate::http::routes::anthropic::messages::error::anthropic_error(error)
    } else {
        error.into_response()
    }
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn compares_exactly() {
        assert!(constant_time_eq("abc", "abc"));
        assert!(!constant_time_eq("abc", "abd"));
        assert!(!constant_time_eq("abc", "abcd"));
        assert!(!constant_time_eq("", "a"));
        assert!(constant_time_eq("", ""));
    }
}
