//! Cohere's `POST /v2/embed` as vLLM 0.33 serves it on an embedding model:
//! texts (or text-only `inputs`) tokenized and cut as `truncate` and
//! `max_tokens` say, pooled through the `/v1/embeddings` step, and answered
//! in each of `embedding_types` (`float`, `binary`, `ubinary`, `base64`).

use super::convert::typed_embeddings;
use super::run::params;
use super::types::{
    CohereApiVersion, CohereBilledUnits, CohereEmbedContent, CohereEmbedInput, CohereEmbedRequest, CohereEmbedResponse,
    CohereEmbeddingType, CohereMeta, CohereTruncate,
};
use super::validate::{chat_prompt, encode, fit_prompts, Cut, Purpose};
use super::{answer, pool_prompts, require};
use crate::http::body::JsonRequest;
use crate::http::error::ApiError;
use crate::http::generation::submit::{check_model, client_request_id};
use crate::http::state::{AppState, SharedState};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::json;
use vllm_rs_config::ModelTask;

/// Handles `POST /v2/embed`.
pub async fn create_cohere_embedding(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonRequest(body): JsonRequest<CohereEmbedRequest>,
) -> Response {
    answer(cohere_embed(&state, &headers, body).await)
}

/// vLLM's refusal of an image on a model without a multimodal processor
/// (every model this server pools).
const NO_IMAGES: &str = "Resolving modality {'image'} requires a multimodal processor but none is available.";

/// The `truncate_prompt_tokens` and side vLLM derives from `truncate` and
/// `max_tokens` (`_resolve_cohere_truncation`): NONE cuts nothing, START
/// and END cut to `max_tokens` (absent: the model length) from their end.
fn truncation(truncate: CohereTruncate, max_tokens: Option<i64>) -> (Option<i64>, Cut) {
    match truncate {
        CohereTruncate::None => (None, Cut::End),
        CohereTruncate::Start => (Some(max_tokens.unwrap_or(-1)), Cut::Start),
        CohereTruncate::End => (Some(max_tokens.unwrap_or(-1)), Cut::End),
    }
}

/// The token ids of a text-only `inputs` entry: its texts as one user
/// message through the chat template, as vLLM renders mixed inputs.
fn input_prompt(state: &AppState, input: CohereEmbedInput) -> Result<Vec<u32>, ApiError> {
    let mut parts = Vec::with_capacity(input.content.len());
    for part in input.content {
        match part {
            CohereEmbedContent::Text { text } => parts.push(json!({"type": "text", "text": text})),
            CohereEmbedContent::ImageUrl { .. } => return Err(ApiError::bad_request(NO_IMAGES)),
        }
    }
    let message = serde_json::from_value(json!({"role": "user", "content": parts}))
        .map_err(|e| ApiError::invalid_param("inputs", e.to_string()))?;
    chat_prompt(state, vec![message], false, None, false)
}

/// What a `/v2/embed` body embeds: the one of `texts`, `images` and
/// `inputs` it sent.
enum Source {
    /// Texts, echoed in the answer.
    Texts(Vec<String>),
    /// Images: refused, as no model pooled here reads them.
    Images,
    /// Inputs of parts.
    Inputs(Vec<CohereEmbedInput>),
}

/// `/v2/embed`.
async fn cohere_embed(
    state: &AppState,
    headers: &HeaderMap,
    mut body: CohereEmbedRequest,
) -> Result<CohereEmbedResponse, ApiError> {
    require(state, &[ModelTask::Embed], "Embeddings")?;
    check_model(state, body.model.as_deref())?;
    let source = match (body.texts.take(), body.images.take(), body.inputs.take()) {
        (Some(texts), None, None) if !texts.is_empty() => Source::Texts(texts),
        (None, Some(images), None) if !images.is_empty() => Source::Images,
        (None, None, Some(inputs)) if !inputs.is_empty() => Source::Inputs(inputs),
        _ => {
            return Err(ApiError::bad_request(
                "Exactly one of texts, images, or inputs must be provided, and it must be non-empty",
            ))
        }
    };
    if let Some(input_type) = &body.input_type {
        // Task instructions come from the model's config (`task_instructions`,
        // sentence-transformers `prompts`), which the frontend does not read:
        // vLLM's answer for a model that defines none.
        return Err(ApiError::bad_request(format!(
            "Unsupported input_type '{input_type}'. This model does not define any input_type task instructions."
        )));
    }
    let dimensions = match body.output_dimension {
        None => None,
        Some(d) if d >= 1 => Some(u32::try_from(d).unwrap_or(u32::MAX)),
        Some(_) => return Err(ApiError::invalid_param("output_dimension", "Dimensions must be greater than 0")),
    };
    let (mut prompts, texts): (Vec<Vec<u32>>, _) = match source {
        Source::Texts(texts) => {
            (texts.iter().map(|t| encode(state, t, true, "texts")).collect::<Result<_, _>>()?, Some(texts))
        }
        Source::Inputs(inputs) => {
            (inputs.into_iter().map(|input| input_prompt(state, input)).collect::<Result<_, _>>()?, None)
        }
        Source::Images => return Err(ApiError::bad_request(NO_IMAGES)),
    };
    fit_prompts(state, &mut prompts, truncation(body.truncate, body.max_tokens), Purpose::Embedding)?;
    if let (CohereTruncate::None, Some(max_tokens)) = (body.truncate, body.max_tokens) {
        if let Some(n) = prompts.iter().map(Vec::len).find(|&n| n as i64 > max_tokens) {
            return Err(ApiError::bad_request(format!(
                "Input of {n} tokens exceeds max_tokens={max_tokens} with truncate=NONE. Set truncate to END or START to allow truncation."
            )));
        }
    }
    let input_tokens = prompts.iter().map(Vec::len).sum();
    let id = format!("embd-{}", client_request_id(headers, None));
    let vectors = pool_prompts(state, headers, &id, prompts, &params("embed", dimensions, None)).await?;
    let types = match body.embedding_types {
        Some(types) if !types.is_empty() => types,
        _ => vec![CohereEmbeddingType::Float],
    };
    let embeddings = typed_embeddings(&vectors, &types).map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(CohereEmbedResponse {
        id,
        embeddings,
        texts,
        meta: CohereMeta {
            api_version: CohereApiVersion { version: "2" },
            billed_units: CohereBilledUnits { input_tokens, image_tokens: 0 },
        },
        response_type: "embeddings_by_type",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_follows_vllm() {
        assert_eq!(truncation(CohereTruncate::None, Some(5)), (None, Cut::End));
        assert_eq!(truncation(CohereTruncate::Start, None), (Some(-1), Cut::Start));
        assert_eq!(truncation(CohereTruncate::Start, Some(5)), (Some(5), Cut::Start));
        assert_eq!(truncation(CohereTruncate::End, None), (Some(-1), Cut::End));
        assert_eq!(truncation(CohereTruncate::End, Some(5)), (Some(5), Cut::End));
    }

    #[test]
    fn request_fields_parse_as_vllm_names_them() {
        let body: CohereEmbedRequest = serde_json::from_value(json!({
            "texts": ["a"], "embedding_types": ["float", "binary", "ubinary", "base64"], "truncate": "START",
            "inputs": [{"content": [{"type": "text", "text": "t"}, {"type": "image_url", "image_url": {"url": "u"}}]}],
        }))
        .unwrap();
        assert_eq!(body.truncate, CohereTruncate::Start);
        assert_eq!(body.embedding_types.unwrap().len(), 4);
        assert!(matches!(body.inputs.unwrap()[0].content[1], CohereEmbedContent::ImageUrl { .. }));
        assert_eq!(serde_json::from_value::<CohereEmbedRequest>(json!({})).unwrap().truncate, CohereTruncate::End);
        assert!(serde_json::from_value::<CohereEmbedRequest>(json!({"embedding_types": ["int8"]})).is_err());
        assert!(serde_json::from_value::<CohereEmbedRequest>(json!({"truncate": "end"})).is_err());
    }
}
