//! `X-Request-Id` on every response when `enable_request_id_headers` is set,
//! as vLLM's `XRequestIdMiddleware` does: the request's own `X-Request-Id`
//! when it sent one, else 32 random hex digits (a uuid4's hex form).

use axum::extract::Request;
use axum::http::header::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use vllm_rs_engine::ids::random_hex;

const X_REQUEST_ID: &str = "x-request-id";

/// The middleware.
pub async fn add_request_id(request: Request, next: Next) -> Response {
    let id = request.headers().get(X_REQUEST_ID).cloned();
    let mut response = next.run(request).await;
    let id = id.unwrap_or_else(|| HeaderValue::from_str(&random_hex(32)).expect("hex digits are a header value"));
    response.headers_mut().append(X_REQUEST_ID, id);
    response
}
