//! The small routes: health (and ping), models, load, version, metrics, KV-event sources, and the engine
//! utility calls (`/reset_prefix_cache`, `/sleep`, `/wake_up`).

use crate::http::error::ApiError;
use crate::http::state::SharedState;
use crate::http::submit::check_model;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use vllm_rs_metrics::sleep::SleepOperation;

/// How long a utility call may take per engine.
const UTILITY_TIMEOUT: Duration = Duration::from_secs(60);

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

/// `GET /v1/models`: every served name.
pub async fn list_models(State(state): State<SharedState>) -> Response {
    let data = state.config.served_model_names.iter().map(|name| model_card(&state, name)).collect();
    Json(ModelList { object: "list", data }).into_response()
}

/// `GET /v1/models/{id}`: the card of one served name; 404 naming `model`
/// for any other, in vLLM's words.
pub async fn retrieve_model(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    match check_model(&state, Some(&id)) {
        Ok(()) => Json(model_card(&state, &id)).into_response(),
        Err(error) => error.into_response(),
    }
}

/// `GET /v1/models`'s answer.
#[derive(Serialize)]
struct ModelList<'a> {
    object: &'static str,
    data: Vec<ModelCard<'a>>,
}

/// One served model, as vLLM's `ModelCard` writes it (the fields it sets).
#[derive(Serialize)]
struct ModelCard<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    root: &'a str,
    parent: Option<&'a str>,
    max_model_len: Option<u64>,
}

fn model_card<'a>(state: &'a SharedState, name: &'a str) -> ModelCard<'a> {
    ModelCard {
        id: name,
        object: "model",
        created: state.created,
        owned_by: "vllm-rs",
        root: &state.config.model_tag,
        parent: None,
        max_model_len: state.max_model_len,
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

/// Calls `method` with `args` on every engine; 500 with the first failure.
async fn call_all_engines(state: &SharedState, method: &str, args: Vec<rmpv::Value>) -> Response {
    for engine in state.engines.engine_indices() {
        if let Err(why) = state.engines.call_utility(engine, method, args.clone(), UTILITY_TIMEOUT).await {
            return ApiError::internal(format!("{method} failed on engine {engine}: {why}")).into_response();
        }
    }
    StatusCode::OK.into_response()
}

/// `POST /reset_prefix_cache`.
pub async fn reset_prefix_cache(State(state): State<SharedState>) -> Response {
    call_all_engines(&state, "reset_prefix_cache", Vec::new()).await
}

/// Query of `POST /sleep`: read as text so a bad value gets an error naming it.
#[derive(Deserialize)]
pub struct SleepQuery {
    level: Option<String>,
}

/// The sleep level of a `/sleep` query: 1 when absent, else 1 or 2 (vLLM's
/// levels: weights offloaded, or discarded too).
pub fn sleep_level(query: Result<Query<SleepQuery>, QueryRejection>) -> Result<u8, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::bad_request(rejection.body_text()))?;
    match query.level.as_deref().map(str::trim) {
        None => Ok(1),
        Some("1") => Ok(1),
        Some("2") => Ok(2),
        Some(_) => Err(ApiError::invalid_param("level", "`level` must be 1 or 2")),
    }
}

/// `POST /sleep?level=N` (level 1 by default).
pub async fn sleep(State(state): State<SharedState>, query: Result<Query<SleepQuery>, QueryRejection>) -> Response {
    match sleep_level(query) {
        Ok(level) => {
            let _timer = state.metrics.sleep_mode().record(SleepOperation::Sleep);
            call_all_engines(&state, "sleep", vec![rmpv::Value::from(level)]).await
        }
        Err(error) => error.into_response(),
    }
}

/// `POST /wake_up`.
pub async fn wake_up(State(state): State<SharedState>) -> Response {
    let _timer = state.metrics.sleep_mode().record(SleepOperation::Wake);
    call_all_engines(&state, "wake_up", vec![rmpv::Value::Nil]).await
}
