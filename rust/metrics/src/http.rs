//! The HTTP request metrics vLLM 0.33's frontend serves (`http_requests_total`,
//! `http_request_duration_seconds`, `http_request_duration_highr_seconds`):
//! no `vllm:` prefix and no model label, a handler label that is the route
//! (`none` for a path no route serves) and statuses grouped as `2xx`..`5xx`.

use super::families::{Buckets, U64Counter};
use super::Metrics;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Instant;

/// Bucket bounds (seconds) of `http_request_duration_seconds`.
pub const DURATION_BUCKETS: &[f64] = &[0.1, 0.5, 1.0];
/// Bucket bounds (seconds) of `http_request_duration_highr_seconds`.
pub const DURATION_HIGHR_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 7.5, 10.0, 30.0, 60.0,
];

/// Routes whose requests are not counted, as vLLM leaves its own probes and
/// scrapes out.
const EXCLUDED_HANDLERS: [&str; 6] = ["/metrics", "/health", "/load", "/ping", "/version", "/server_info"];

/// The other routes, as the `handler` label names them.
const ROUTES: &[&str] = &[
    "/v1/models",
    "/v1/models/{id}",
    "/tokenize",
    "/detokenize",
    "/v1/responses",
    "/v1/completions",
    "/v1/chat/completions",
    "/reset_prefix_cache",
    "/sleep",
    "/wake_up",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/v1/messages/render",
    "/v1/chat/completions/derender",
    "/v1/completions/derender",
    "/inference/v1/generate",
    "/abort_requests",
    "/inference/v1/abort_requests",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/v1/responses/render",
    "/v1/chat/completions/batch",
    "/invocations",
    "/generative_scoring",
    "/kv_event_sources",
    "/v1/decisions",
    "/v1/systemone",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    status: &'static str,
    handler: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandlerLabels {
    method: String,
    handler: &'static str,
}

/// The HTTP families.
pub struct HttpMetrics {
    requests: Family<RequestLabels, U64Counter>,
    duration: Family<HandlerLabels, Histogram, Buckets>,
    duration_highr: Histogram,
}

impl HttpMetrics {
    /// The families, registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = HttpMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(Buckets(DURATION_BUCKETS.to_vec())),
            duration_highr: Histogram::new(DURATION_HIGHR_BUCKETS.iter().copied()),
        };
        registry.register(
            "http_requests",
            "Total number of HTTP requests by method, status, and handler",
            metrics.requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Duration of HTTP requests in seconds grouped by method and handler",
            metrics.duration.clone(),
        );
        registry.register(
            "http_request_duration_highr_seconds",
            "High-resolution duration of HTTP requests in seconds",
            metrics.duration_highr.clone(),
        );
        metrics
    }

    /// Counts one request to `path` answered with `status` after `seconds`.
    pub fn record(&self, method: &str, path: &str, status: u16, seconds: f64) {
        let handler = handler_of(path);
        if EXCLUDED_HANDLERS.contains(&handler) {
            return;
        }
        let status = match status / 100 {
            1 => "1xx",
            2 => "2xx",
            3 => "3xx",
            4 => "4xx",
            _ => "5xx",
        };
        let method = method.to_owned();
        self.requests.get_or_create(&RequestLabels { method: method.clone(), status, handler }).inc();
        self.duration.get_or_create(&HandlerLabels { method, handler }).observe(seconds);
        self.duration_highr.observe(seconds);
    }
}

/// The route serving `path` (`/health`, `/v1/models/{id}`), `none` for no route.
fn handler_of(path: &str) -> &'static str {
    if let Some(&route) = ROUTES.iter().chain(&EXCLUDED_HANDLERS).find(|&&route| route == path) {
        return route;
    }
    if let Some(id) = path.strip_prefix("/v1/models/") {
        return if id.is_empty() { "none" } else { "/v1/models/{id}" };
    }
    // A response id is one path segment.
    match path.strip_prefix("/v1/responses/").map(|rest| rest.split_once('/').unwrap_or((rest, ""))) {
        Some((id, "")) if !id.is_empty() => "/v1/responses/{response_id}",
        Some((id, "cancel")) if !id.is_empty() => "/v1/responses/{response_id}/cancel",
        _ => "none",
    }
}

/// Middleware: times the request until its response head and counts it.
pub async fn record_http(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().as_str().to_owned();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    metrics.http().record(&method, &path, response.status().as_u16(), started.elapsed().as_secs_f64());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handlers_are_routes_and_probes_are_left_out() {
        assert_eq!(handler_of("/v1/completions"), "/v1/completions");
        assert_eq!(handler_of("/v1/messages"), "/v1/messages");
        assert_eq!(handler_of("/v1/models/my-model"), "/v1/models/{id}");
        assert_eq!(handler_of("/v1/responses/resp_1"), "/v1/responses/{response_id}");
        assert_eq!(handler_of("/v1/responses/resp_1/cancel"), "/v1/responses/{response_id}/cancel");
        assert_eq!(handler_of("/v1/responses/render"), "/v1/responses/render");
        assert_eq!(handler_of("/v1/responses/resp_1/other"), "none");
        assert_eq!(handler_of("/v1/responses/"), "none");
        assert_eq!(handler_of("/nope"), "none");
        let mut registry = Registry::default();
        let metrics = HttpMetrics::register(&mut registry);
        metrics.record("POST", "/v1/completions", 200, 0.2);
        metrics.record("POST", "/v1/completions", 400, 0.01);
        metrics.record("GET", "/health", 200, 0.01);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"http_requests_total{method="POST",status="2xx",handler="/v1/completions"} 1"#,
            r#"http_requests_total{method="POST",status="4xx",handler="/v1/completions"} 1"#,
            r#"http_request_duration_seconds_bucket{le="0.5",method="POST",handler="/v1/completions"} 2"#,
            r#"http_request_duration_seconds_bucket{le="0.1",method="POST",handler="/v1/completions"} 1"#,
            "http_request_duration_highr_seconds_count 2",
        ] {
            assert!(text.contains(&format!("{line}\n")), "missing {line} in\n{text}");
        }
        assert!(!text.contains("/health"), "{text}");
    }
}
