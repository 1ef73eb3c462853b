//! The route table ([`routes`]) and one module per route family: the OpenAI
//! API (`openai/`), Anthropic's Messages API (`anthropic/`), vLLM's
//! scale-out render and generate routes (`scale_out/`), SageMaker's
//! `/invocations`, generative scoring, the LoRA and unsupported-API answers,
//! the server's status (health, load, version, metrics) and the engine
//! utility calls (`engine_control`).

pub mod anthropic;
pub mod engine_control;
pub mod generative_scoring;
pub mod invocations;
pub mod lora;
pub mod openai;
pub mod scale_out;
pub mod status;
pub mod unsupported_apis;

use crate::http::error::ApiError;
use crate::http::middleware::{auth, body_deadline, cors, request_id, root_path};
use crate::http::state::SharedState;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;

/// All routes, with authentication and the body deadline (the size limit is the
/// JSON extractor's), CORS, and when configured request id headers and the
/// root path. Outermost first, as vLLM stacks them: request id, auth, CORS.
pub fn routes(state: SharedState) -> Router {
    let layers = &state.config.http_layers;
    let cors = std::sync::Arc::new(cors::Cors::new(&layers.cors));
    let request_id_headers = layers.request_id_headers;
    let root_path = layers.root_path.clone();
    let mut app = Router::new()
        .route("/health", get(status::health))
        .route("/ping", get(status::health).post(status::health))
        .route("/metrics", get(status::metrics))
        .route("/load", get(status::load))
        .route("/version", get(status::version))
        .route("/kv_event_sources", get(status::kv_event_sources))
        .route("/v1/models", get(openai::models::list_models))
        // A model id may hold slashes (`Org/Name`): the rest of the path is the id.
        .route("/v1/models/{*id}", get(openai::models::retrieve_model))
        .route("/tokenize", post(openai::tokenize::tokenize))
        .route("/detokenize", post(openai::tokenize::detokenize))
        .route("/v1/responses", post(openai::responses::create_response))
        .route("/v1/completions", post(openai::completions::create_completion))
        .route("/v1/chat/completions", post(openai::chat_completions::create_chat_completion))
        .route("/v1/chat/completions/batch", post(openai::chat_completions::batch::create_batch_chat_completion))
        .route("/invocations", post(invocations::invocations))
        .route("/generative_scoring", post(generative_scoring::generative_scoring))
        .route("/v1/messages", post(anthropic::messages::create_message))
        .route("/v1/messages/count_tokens", post(anthropic::messages::count_tokens))
        .route("/v1/embeddings", post(openai::pooling::create_embedding))
        .route("/pooling", post(openai::pooling::create_pooling))
        .route("/classify", post(openai::pooling::create_classify))
        .route("/score", post(openai::pooling::create_score))
        .route("/v1/score", post(openai::pooling::create_score))
        .route("/rerank", post(openai::pooling::create_rerank))
        .route("/v1/rerank", post(openai::pooling::create_rerank))
        .route("/v2/rerank", post(openai::pooling::create_rerank))
        .route("/v2/embed", post(openai::pooling::cohere::create_cohere_embedding))
        .route("/reset_prefix_cache", post(engine_control::reset_prefix_cache))
        .route("/sleep", post(engine_control::sleep))
        .route("/wake_up", post(engine_control::wake_up))
        .merge(scale_out::routes(&state))
        .merge(lora::routes())
        .merge(openai::responses::stored::routes())
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
