//! Request bodies: the body extractor (408 when it arrives too slowly, 413
//! when too large), typed request models read with `serde` in one pass (400
//! naming the field when one has the wrong type), and [`SamplingRequest`],
//! the body of a generating route: the shared [`SamplingFields`] beside the
//! route's own fields.

use crate::http::error::ApiError;
use crate::http::middleware::body_deadline::is_body_timeout;
use crate::http::rules::RULES;
use crate::http::sampling::SamplingFields;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use http_body_util::LengthLimitError;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::marker::PhantomData;

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

/// The body of a generating route: the [`SamplingFields`] every generating
/// route shares and the route's own fields `R` (a struct with
/// `#[serde(default)]`), read in one pass in the body's order, so the first
/// bad field is the one named, with its top-level key, as for one struct.
/// Unknown fields are ignored. A body sent as a JSON array fills `R`'s
/// fields, then the sampling fields, in order (as serde reads a struct).
#[derive(Debug, Default)]
pub struct SamplingRequest<R> {
    /// The shared sampling fields.
    pub sampling: SamplingFields,
    /// The route's own fields.
    pub route: R,
}

impl<'de, R: Deserialize<'de>> Deserialize<'de> for SamplingRequest<R> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct("SamplingRequest", &[], SamplingRequestVisitor(PhantomData))
    }
}

struct SamplingRequestVisitor<R>(PhantomData<R>);

impl<'de, R: Deserialize<'de>> Visitor<'de> for SamplingRequestVisitor<R> {
    type Value = SamplingRequest<R>;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a request body")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut sampling = SamplingFields::default();
        let entries = RouteEntries { map: &mut map, sampling: &mut sampling, seen: 0 };
        let route = R::deserialize(MapAccessDeserializer::new(entries))?;
        Ok(SamplingRequest { sampling, route })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let route = R::deserialize(SeqAccessDeserializer::new(&mut seq))?;
        let sampling = SamplingFields::deserialize(SeqAccessDeserializer::new(&mut seq))?;
        Ok(SamplingRequest { sampling, route })
    }
}

/// A body's entries as the route's fields see them: the sampling fields are
/// read into `sampling` as they come, every other entry passes through.
struct RouteEntries<'a, A> {
    map: &'a mut A,
    sampling: &'a mut SamplingFields,
    /// The sampling fields read so far (see [`SamplingFields::read_field`]).
    seen: u64,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for RouteEntries<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        while let Some(Key(key)) = self.map.next_key()? {
            if !self.sampling.read_field(&key, self.map, &mut self.seen)? {
                return seed.deserialize(key.into_deserializer()).map(Some);
            }
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// A key, borrowed from the body when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a field name")
            }

            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(key)))
            }

            fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(key.to_owned())))
            }

            fn visit_string<E>(self, key: String) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(key)))
            }
        }
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::IgnoredAny;
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
        let err = parse_body::<SamplingRequest<RouteFields>>(b"[1]").unwrap_err();
        assert_eq!(err.message, "the request body must be a JSON object");
    }

    /// A route's own fields, for the tests.
    #[derive(Debug, Default, Deserialize)]
    #[serde(default)]
    struct RouteFields {
        messages: Option<Vec<String>>,
    }

    #[test]
    fn the_first_bad_field_in_the_body_is_named_and_duplicates_are_refused() {
        let first = |body: &str| parse_body::<SamplingRequest<RouteFields>>(body.as_bytes()).unwrap_err().param;
        assert_eq!(first(r#"{"max_tokens": "x", "messages": 5}"#).as_deref(), Some("max_tokens"));
        assert_eq!(first(r#"{"messages": 5, "max_tokens": "x"}"#).as_deref(), Some("messages"));
        let err = parse_body::<SamplingRequest<RouteFields>>(br#"{"n": 1, "n": 2}"#).unwrap_err();
        assert!(err.message.contains("duplicate field `n`"), "{}", err.message);
        let read: SamplingRequest<RouteFields> =
            parse_body(br#"{"messages": ["a"], "unknown": {"x": 1}, "n": 3}"#).unwrap();
        assert_eq!((read.route.messages, read.sampling.n), (Some(vec!["a".to_string()]), Some(3)));
        // An array fills the route's fields, then the sampling fields, as serde reads a struct.
        let read: SamplingRequest<RouteFields> = parse_body(br#"[null, "model"]"#).unwrap();
        assert_eq!(read.sampling.model.as_deref(), Some("model"));
        assert!(parse_body::<SamplingRequest<RouteFields>>(b"[]").is_ok());
    }
}
