//! The HTTP error of a generation that failed after it started, shared by
//! whole answers and streams (where it is the last event).

use crate::http::error::ApiError;
use vllm_rs_generate::GenerationError;

/// The HTTP error for a generation that failed after it started, as vLLM's
/// frontend maps it: a `RequestError` with code `validation_error` is a 400,
/// a retryable one a 503, any other a 500, each with the engine's message;
/// ERROR without a reason is a 500; engines that became unusable (dead, hung,
/// disconnected) a 503.
pub fn generation_error(error: &GenerationError) -> ApiError {
    match error {
        GenerationError::Engine => ApiError::internal(error.to_string()),
        GenerationError::Rejected(e) if e.code == "validation_error" => ApiError::bad_request(e.message.clone()),
        GenerationError::Rejected(e) if e.retryable => ApiError::unavailable(e.message.clone()),
        GenerationError::Rejected(e) => ApiError::internal(e.message.clone()),
        GenerationError::Unavailable(reason) => ApiError::unavailable(reason.clone()),
    }
}
