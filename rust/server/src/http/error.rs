//! Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// An HTTP error answered in the OpenAI shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// The HTTP status (also the `code` field).
    pub status: StatusCode,
    /// What went wrong.
    pub message: String,
    /// The request parameter at fault, if one is.
    pub param: Option<String>,
    /// The error type where vLLM names one itself (`invalid_request_error`),
    /// instead of the one its status gives.
    pub kind: Option<&'static str>,
}

impl ApiError {
    /// An error with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), param: None, kind: None }
    }

    /// 400 for a bad `param`.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.to_string()),
            kind: None,
        }
    }

    /// 400 for a bad request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 500 for an engine-side failure.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// 503 when the engines are unusable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 404 for a response id this server never stored, as vLLM answers one
    /// without its response store: its own type and message, naming `response_id`.
    pub fn response_not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            param: Some("response_id".into()),
            kind: Some("invalid_request_error"),
        }
    }

    /// The OpenAI error type: the one vLLM names, else the one for this status.
    pub fn error_type(&self) -> &'static str {
        if let Some(kind) = self.kind {
            return kind;
        }
        match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            StatusCode::FORBIDDEN => "PermissionDeniedError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowedError",
            StatusCode::REQUEST_TIMEOUT => "RequestTimeoutError",
            StatusCode::PAYLOAD_TOO_LARGE => "RequestTooLargeError",
            StatusCode::NOT_IMPLEMENTED => "NotImplementedError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.error_type(),
                param: self.param.as_deref(),
                code: self.status.as_u16(),
            },
        }
    }
}

/// The OpenAI error body: `{"error": {...}}`.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    /// What went wrong.
    pub error: ErrorDetail<'a>,
}

/// The fields of an OpenAI error, in vLLM's order.
#[derive(Debug, Serialize)]
pub struct ErrorDetail<'a> {
    /// What went wrong.
    pub message: &'a str,
    /// The OpenAI error type.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request parameter at fault, if one is.
    pub param: Option<&'a str>,
    /// The HTTP status.
    pub code: u16,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if matches!(self.status, StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT) {
            // The rest of the body was never read: this connection cannot be reused.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}
