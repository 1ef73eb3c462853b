//! The server's own state: health (and ping), load, version, metrics and
//! KV-event sources.

use crate::http::error::ApiError;
use crate::http::state::SharedState;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// `GET /kv_event_sources`: the engines' KV-event publisher settings by
/// data-parallel rank. The reference engine publishes no KV events, so the
/// map is empty, as vLLM's is with KV events off (its default).
pub async fn kv_event_sources() -> Response {
    Json(serde_json::Map::new()).into_response()
}

/// `GET /health` (and `/ping`, as vLLM serves it, GET or POST): 200 while
/// the engines are usable, 503 after one died.
pub async fn health(State(state): State<SharedState>) -> Response {
    match state.engines.failure() {
        None => StatusCode::OK.into_response(),
        Some(reason) => ApiError::unavailable(reason.to_string()).into_response(),
    }
}

/// `GET /load`'s answer.
#[derive(Serialize)]
struct Load {
    server_load: u64,
}

/// `GET /version`'s answer.
#[derive(Serialize)]
struct Version {
    version: &'static str,
}

/// `GET /load`: requests in flight.
pub async fn load(State(state): State<SharedState>) -> Response {
    Json(Load { server_load: state.engines.inflight() }).into_response()
}

/// `GET /version`.
pub async fn version() -> Response {
    Json(Version { version: env!("CARGO_PKG_VERSION") }).into_response()
}

/// `GET /metrics`: OpenMetrics text.
pub async fn metrics(State(state): State<SharedState>) -> Response {
    let body = state.metrics.render();
    ([(header::CONTENT_TYPE, vllm_rs_metrics::CONTENT_TYPE)], body).into_response()
}
