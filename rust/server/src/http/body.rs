//! Request bodies: the body extractor (408 when it arrives too slowly, 413
//! when too large) and typed request models read with `serde` in one pass
//! (400 naming the field when one has the wrong type).

use crate::http::error::ApiError;
use crate::http::middleware::body_deadline::is_body_timeout;
use crate::http::rules::RULES;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use http_body_util::LengthLimitError;
use serde::de::DeserializeOwned;

/// Largest request body accepted (bytes).
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// A request body, read whole.
pub struct JsonBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES).await.map(JsonBody).map_err(|e| body_error(&e))
    }
}

/// A request body deserialized as the route's typed request `T` in one pass
/// (the body read as [`JsonBody`] reads it), or the 400 [`parse_body`] gives.
pub struct JsonRequest<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonRequest<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let JsonBody(bytes) = JsonBody::from_request(req, state).await?;
        parse_body(&bytes).map(JsonRequest)
    }
}

/// Why a body could not be read: too slow (408), too large (413), or broken (400).
fn body_error(error: &axum::Error) -> ApiError {
    let too_large = std::iter::successors(Some(error as &(dyn std::error::Error + 'static)), |e| e.source())
        .any(|e| e.is::<LengthLimitError>());
    if is_body_timeout(error) {
        ApiError::new(StatusCode::REQUEST_TIMEOUT, error.to_string())
    } else if too_large {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("request body exceeds {MAX_BODY_BYTES} bytes"))
    } else {
        ApiError::bad_request(format!("cannot read the request body: {error}"))
    }
}

/// The body as the typed request model `T`, or a 400 saying why not: not
/// JSON (syntax, nesting deeper than 128, numbers out of range), not an
/// object, or a field of the wrong type (named, with the type it must have).
/// Unknown fields are ignored, as vLLM ignores them.
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(field_error)?;
    deserializer.end().map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    Ok(value)
}

fn field_error(error: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    use serde_path_to_error::Segment;
    let inner = error.inner();
    if !inner.is_data() {
        return ApiError::bad_request(format!("the request body is not valid JSON: {inner}"));
    }
    // The top-level field names the fault, also for one deep inside it (the
    // Python API server's pydantic paths differ there; the messages must not).
    match error.path().iter().next() {
        Some(Segment::Map { key }) => RULES.wrong_type(key),
        _ if inner.to_string().starts_with("invalid type") => {
            ApiError::bad_request("the request body must be a JSON object")
        }
        _ => ApiError::bad_request(format!("the request body is invalid: {inner}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::{json, Map, Value};

    #[test]
    fn bodies_that_are_not_a_json_object_are_400s() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        let huge_integer = format!("{{\"max_tokens\": {}}}", "9".repeat(5000));
        for body in [
            "",
            "{",
            "[1]",
            "null",
            "\"x\"",
            deep.as_str(),
            huge_integer.as_str(),
            "{\"a\": 1e999}",
            "\u{feff}{}",
            "{} x",
        ] {
            let err = parse_body::<Map<String, Value>>(body.as_bytes()).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{body:.40}");
        }
        assert!(parse_body::<Map<String, Value>>(&[b'{', 0xff, b'}']).is_err());
        assert_eq!(parse_body::<Map<String, Value>>(b"{\"a\": [1]}").unwrap()["a"], json!([1]));
        assert_eq!(parse_body::<OneField>(br#"{"model": "m"}"#).unwrap().model.as_deref(), Some("m"));
        let err = parse_body::<OneField>(b"[1]").unwrap_err();
        assert_eq!(err.message, "the request body must be a JSON object");
    }

    /// A typed body, for the tests.
    #[derive(Debug, Default, Deserialize)]
    #[serde(default)]
    struct OneField {
        model: Option<String>,
    }
}
