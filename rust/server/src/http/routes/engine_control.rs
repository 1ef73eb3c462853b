//! The engine utility calls: `/reset_prefix_cache`, `/sleep` and `/wake_up`,
//! sent to every engine.

use crate::http::error::ApiError;
use crate::http::state::SharedState;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::time::Duration;
use vllm_rs_metrics::sleep::SleepOperation;

/// How long a utility call may take per engine.
const UTILITY_TIMEOUT: Duration = Duration::from_secs(60);

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
