//! The OpenAI-compatible HTTP API.

pub mod answer;
pub mod chat;
pub mod chat_batch;
pub mod completions;
pub mod error;
pub mod generative_scoring;
pub mod invocations;
pub mod lora;
pub mod message;
pub mod messages;
pub mod middleware;
pub mod misc;
pub mod params;
pub mod pooling;
pub mod responses;
pub mod rules;
pub mod scale_out;
pub mod server;
pub mod sse;
pub mod state;
pub mod stored_responses;
pub mod structured;
pub mod submit;
pub mod template_kwargs;
pub mod tokenize;
pub mod tools;
pub mod unsupported_apis;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use error::ApiError;
use middleware::{auth, body_deadline, cors, request_id, root_path};
use state::SharedState;

/// All routes, with authentication and the body deadline (the size limit is the
/// JSON extractor's), CORS, and when configured request id headers and the
/// root path. Outermost first, as vLLM stacks them: request id, auth, CORS.
pub fn routes(state: SharedState) -> Router {
    let layers = &state.config.http_layers;
    let cors = std::sync::Arc::new(cors::Cors::new(&layers.cors));
    let request_id_headers = layers.request_id_headers;
    let root_path = layers.root_path.clone();
    let mut app = Router::new()
        .route("/health", get(misc::health))
        .route("/ping", get(misc::health).post(misc::health))
        .route("/metrics", get(misc::metrics))
        .route("/load", get(misc::load))
        .route("/version", get(misc::version))
        .route("/kv_event_sources", get(misc::kv_event_sources))
        .route("/v1/models", get(misc::list_models))
        // A model id may hold slashes (`Org/Name`): the rest of the path is the id.
        .route("/v1/models/{*id}", get(misc::retrieve_model))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/v1/responses", post(responses::create_response))
        .route("/v1/completions", post(completions::create_completion))
        .route("/v1/chat/completions", post(chat::create_chat_completion))
        .route("/v1/chat/completions/batch", post(chat_batch::create_batch_chat_completion))
        .route("/invocations", post(invocations::invocations))
        .route("/generative_scoring", post(generative_scoring::generative_scoring))
        .route("/v1/messages", post(messages::create_message))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/embeddings", post(pooling::create_embedding))
        .route("/pooling", post(pooling::create_pooling))
        .route("/classify", post(pooling::create_classify))
        .route("/score", post(pooling::create_score))
        .route("/v1/score", post(pooling::create_score))
        .route("/rerank", post(pooling::create_rerank))
        .route("/v1/rerank", post(pooling::create_rerank))
        .route("/v2/rerank", post(pooling::create_rerank))
        .route("/v2/embed", post(pooling::cohere::create_cohere_embedding))
        .route("/reset_prefix_cache", post(misc::reset_prefix_cache))
        .route("/sleep", post(misc::sleep))
        .route("/wake_up", post(misc::wake_up))
        .merge(scale_out::routes(&state))
        .merge(lora::routes())
        .merge(stored_responses::routes())
        .merge(unsupported_apis::routes())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "Not Found").into_response() })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed").into_response()
        })
        .layer(axum::middleware::from_fn_with_state(cors, cors::apply_cors))
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth::require_api_key))
        .layer(axum::middleware::from_fn_with_state(state.clone(), body_deadline::limit_body_time))
        .layer(axum::middleware::from_fn_with_state(state.metrics.clone(), vllm_rs_metrics::http::record_http))
        .with_state(state);
    if request_id_headers {
        app = app.layer(axum::middleware::from_fn(request_id::add_request_id));
    }
    match root_path {
        // Rewritten before routing, so routes and middleware see the path without it.
        Some(root) => Router::new().fallback_service(tower::ServiceExt::map_request(app, move |request| {
            root_path::strip_root_path(request, &root)
        })),
        None => app,
    }
}
