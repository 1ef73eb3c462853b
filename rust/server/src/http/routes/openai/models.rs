//! `GET /v1/models` and `GET /v1/models/{id}`: the served model names, as
//! vLLM's `ModelCard`s.

use crate::http::generation::submit::check_model;
use crate::http::state::SharedState;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

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
