//! Cross-origin rules as vLLM 0.33 applies them: Starlette's `CORSMiddleware`
//! with `allowed_origins`, `allowed_methods`, `allowed_headers` and
//! `allow_credentials`, always installed (with the defaults, no origin is
//! allowed). Written here rather than taken from tower-http because clients
//! see the differences: Starlette answers a refused preflight with 400
//! `Disallowed CORS ...`, sends `Access-Control-Max-Age: 600`, lists the
//! safelisted headers, adds `Vary: Origin` to every response, and mirrors the
//! origin where credentials meet `*` (tower-http refuses that combination).

use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use vllm_rs_config::CorsRules;

/// Every method, for `*` (Starlette's list).
const ALL_METHODS: &[&str] = &["DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY"];
/// Headers a browser may always send; listed in every preflight answer.
const SAFELISTED_HEADERS: &[&str] = &["Accept", "Accept-Language", "Content-Language", "Content-Type"];
/// How long a browser may cache a preflight answer (seconds).
const MAX_AGE_SECONDS: &str = "600";
const PREFLIGHT_VARY: &str =
    "Origin, Access-Control-Request-Method, Access-Control-Request-Headers, Access-Control-Request-Private-Network";

/// The rules, with the headers they always add worked out once.
pub struct Cors {
    origins: Vec<String>,
    allow_all_origins: bool,
    methods: Vec<String>,
    allow_all_headers: bool,
    /// Allowed request headers, lowercase, the safelisted ones included.
    headers: Vec<String>,
    credentials: bool,
    preflight_explicit_origin: bool,
    simple_headers: Vec<(HeaderName, HeaderValue)>,
    preflight_headers: Vec<(HeaderName, HeaderValue)>,
}

fn value(text: &str) -> HeaderValue {
    // Configured names come from the command line and may hold anything:
    // what cannot be a header value is left out rather than panicking.
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

impl Cors {
    /// Works out the headers `rules` add.
    pub fn new(rules: &CorsRules) -> Self {
        let allow_all_origins = rules.origins.iter().any(|o| o == "*");
        let allow_all_headers = rules.headers.iter().any(|h| h == "*");
        let methods: Vec<String> = if rules.methods.iter().any(|m| m == "*") {
            ALL_METHODS.iter().map(|m| m.to_string()).collect()
        } else {
            rules.methods.clone()
        };
        let preflight_explicit_origin = !allow_all_origins || rules.credentials;
        let mut simple_headers = Vec::new();
        if allow_all_origins {
            simple_headers.push((header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*")));
        }
        if rules.credentials {
            simple_headers.push((header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true")));
        }
        let mut preflight_headers = vec![(header::VARY, HeaderValue::from_static(PREFLIGHT_VARY))];
        if !preflight_explicit_origin {
            preflight_headers.push((header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*")));
        }
        preflight_headers.push((header::ACCESS_CONTROL_ALLOW_METHODS, value(&methods.join(", "))));
        preflight_headers.push((header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static(MAX_AGE_SECONDS)));
        let mut headers: Vec<String> = SAFELISTED_HEADERS.iter().map(|h| h.to_string()).collect();
        headers.extend(rules.headers.iter().cloned());
        headers.sort();
        headers.dedup();
        if !allow_all_headers {
            preflight_headers.push((header::ACCESS_CONTROL_ALLOW_HEADERS, value(&headers.join(", "))));
        }
        if rules.credentials {
            preflight_headers.push((header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true")));
        }
        Cors {
            origins: rules.origins.clone(),
            allow_all_origins,
            methods,
            allow_all_headers,
            headers: headers.iter().map(|h| h.to_lowercase()).collect(),
            credentials: rules.credentials,
            preflight_explicit_origin,
            simple_headers,
            preflight_headers,
        }
    }

    fn allows_origin(&self, origin: &HeaderValue) -> bool {
        self.allow_all_origins || origin.to_str().is_ok_and(|origin| self.origins.iter().any(|o| o == origin))
    }

    /// The answer to a preflight request (`OPTIONS` with `Origin` and
    /// `Access-Control-Request-Method`): 200 `OK`, or 400 naming what is not allowed.
    fn preflight(&self, request: &HeaderMap, origin: &HeaderValue) -> Response {
        let mut headers = HeaderMap::new();
        for (name, value) in &self.preflight_headers {
            headers.insert(name, value.clone());
        }
        let mut failures = Vec::new();
        if self.allows_origin(origin) {
            if self.preflight_explicit_origin {
                headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
            }
        } else {
            failures.push("origin");
        }
        let method = request.get(header::ACCESS_CONTROL_REQUEST_METHOD).and_then(|m| m.to_str().ok());
        if !method.is_some_and(|method| self.methods.iter().any(|m| m == method)) {
            failures.push("method");
        }
        if let Some(requested) = request.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
            if self.allow_all_headers {
                headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, requested.clone());
            } else {
                let allowed = requested.to_str().is_ok_and(|requested| {
                    requested.split(',').all(|h| self.headers.contains(&h.trim().to_lowercase()))
                });
                if !allowed {
                    failures.push("headers");
                }
            }
        }
        if request.contains_key("access-control-request-private-network") {
            failures.push("private-network");
        }
        let (status, body) = if failures.is_empty() {
            (StatusCode::OK, "OK".to_owned())
        } else {
            (StatusCode::BAD_REQUEST, format!("Disallowed CORS {}", failures.join(", ")))
        };
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        (status, headers, body).into_response()
    }

    /// Adds the CORS headers of a non-preflight answer.
    fn decorate(&self, response: &mut Response, origin: Option<&HeaderValue>) {
        let headers = response.headers_mut();
        if origin.is_some() {
            for (name, value) in &self.simple_headers {
                headers.insert(name, value.clone());
            }
        }
        match origin {
            Some(origin)
                if (self.allow_all_origins && self.credentials)
                    || (!self.allow_all_origins && self.allows_origin(origin)) =>
            {
                headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
                add_vary_origin(headers);
            }
            _ => add_vary_origin(headers),
        }
    }
}

/// `Vary: <what was there>, Origin`, as one header.
fn add_vary_origin(headers: &mut HeaderMap) {
    let mut values: Vec<&str> = headers.get_all(header::VARY).iter().filter_map(|v| v.to_str().ok()).collect();
    values.push("Origin");
    let joined = value(&values.join(", "));
    headers.insert(header::VARY, joined);
}

/// The middleware: answers preflight requests itself and decorates every other answer.
pub async fn apply_cors(State(cors): State<Arc<Cors>>, request: Request, next: Next) -> Response {
    let origin = request.headers().get(header::ORIGIN).cloned();
    if let Some(origin) = &origin {
        if request.method() == Method::OPTIONS && request.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        {
            return cors.preflight(request.headers(), origin);
        }
    }
    let mut response = next.run(request).await;
    cors.decorate(&mut response, origin.as_ref());
    response
}
