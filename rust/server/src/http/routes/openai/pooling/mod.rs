//! vLLM 0.33's pooling API over a pooling model: `/v1/embeddings`,
//! `/pooling`, `/classify`, `/score` (and `/v1/score`), `/rerank` (and
//! `/v1/rerank`, `/v2/rerank`), and Cohere's `/v2/embed` (`cohere`). Inputs are tokenized and checked here
//! (`validate`), pooled in the engines (`run`), and answered (`convert`).
//! A model that generates answers these routes with vLLM's 400, as a
//! pooling model answers the generating routes (`submit.rs`).

pub mod cohere;
pub mod convert;
pub mod run;
pub mod types;
pub mod validate;

use crate::http::body::JsonRequest;
use crate::http::error::ApiError;
use crate::http::generation::submit::{check_model, client_request_id, pinned_rank, DATA_PARALLEL_RANK_HEADER};
use crate::http::state::{unix_now, AppState, SharedState};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use convert::{cosine, label, ranking, Encoding};
use run::{params, pool_all, PoolError, Pooling};
use serde_json::Value;
use types::{
    ClassifyData, EmbeddingData, ListResponse, PoolRequest, PoolingData, RerankDocument, RerankRequest, RerankResponse,
    RerankResult, ScoreData, ScoreRequest, Usage,
};
use validate::{chat_prompt, encode, fit_prompts, input_prompts, texts, Cut, Purpose};
use vllm_rs_config::ModelTask;
use vllm_rs_wire::protocol::PoolingParams;

/// Handles `POST /v1/embeddings`.
pub async fn create_embedding(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonRequest(body): JsonRequest<PoolRequest>,
) -> Response {
    answer(embed(&state, &headers, body, false).await)
}

/// Handles `POST /pooling`.
pub async fn create_pooling(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonRequest(body): JsonRequest<PoolRequest>,
) -> Response {
    answer(embed(&state, &headers, body, true).await)
}

/// Handles `POST /classify`.
pub async fn create_classify(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonRequest(body): JsonRequest<PoolRequest>,
) -> Response {
    answer(classify(&state, &headers, body).await)
}

/// Handles `POST /score` and `POST /v1/score`.
pub async fn create_score(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonRequest(body): JsonRequest<ScoreRequest>,
) -> Response {
    answer(score(&state, &headers, body).await)
}

/// Handles `POST /rerank`, `/v1/rerank` and `/v2/rerank`.
pub async fn create_rerank(
    State(state): State<SharedState>,
    headers: HeaderMap,
    JsonRequest(body): JsonRequest<RerankRequest>,
) -> Response {
    answer(rerank(&state, &headers, body).await)
}

fn answer<T: serde::Serialize>(result: Result<T, ApiError>) -> Response {
    match result {
        Ok(body) => Json(body).into_response(),
        Err(error) => error.into_response(),
    }
}

/// vLLM's 400 when the model does not run `api` (`Embeddings`, `Score`, ...).
fn require(state: &AppState, allowed: &[ModelTask], api: &str) -> Result<(), ApiError> {
    if allowed.contains(&state.config.task) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!("The model does not support {api} API")))
}

impl From<PoolError> for ApiError {
    fn from(error: PoolError) -> Self {
        match error {
            PoolError::RankOutOfRange(why) => ApiError::invalid_param(DATA_PARALLEL_RANK_HEADER, why),
            PoolError::Unavailable(why) => ApiError::unavailable(why),
            PoolError::Invalid(error) => ApiError::bad_request(error.message),
            PoolError::Failed(error) if error.retryable => ApiError::unavailable(error.message),
            PoolError::Failed(error) => ApiError::internal(error.message),
            PoolError::NotPooled => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
        }
    }
}

/// The token ids of a body's inputs (`input`, or the chat form's
/// `messages`), cut and checked.
fn body_prompts(state: &AppState, body: &mut PoolRequest, purpose: Purpose) -> Result<Vec<Vec<u32>>, ApiError> {
    let mut prompts = match (body.input.take(), body.messages.take()) {
        (Some(input), _) => input_prompts(state, input, body.add_special_tokens.unwrap_or(true))?,
        (None, Some(items)) => vec![chat_prompt(
            state,
            items,
            body.add_generation_prompt.unwrap_or(false),
            body.chat_template_kwargs.as_ref(),
            body.add_special_tokens.unwrap_or(false),
        )?],
        (None, None) => return Err(ApiError::invalid_param("input", "`input` or `messages` is required")),
    };
    fit_prompts(state, &mut prompts, (body.truncate_prompt_tokens, Cut::End), purpose)?;
    Ok(prompts)
}

/// vLLM 0.33's 400s for what it removed from pooling bodies
/// (`reject_removed_pooling_parameters`): `normalize`, and the `score` and
/// `encode` tasks.
fn reject_removed(body: &PoolRequest) -> Result<(), ApiError> {
    if body.normalize.is_some() {
        return Err(ApiError::invalid_param(
            "normalize",
            "Parameter `normalize` was removed; use `use_activation` instead.",
        ));
    }
    let removed = match body.task.as_deref() {
        Some("score") => "`score` task was removed; use `classify` instead.",
        Some("encode") => "`encode` task was removed; use `token_embed` or `token_classify` instead.",
        _ => return Ok(()),
    };
    Err(ApiError::invalid_param("task", removed))
}

/// `/v1/embeddings` and (with `pooling`) `/pooling`.
async fn embed(state: &AppState, headers: &HeaderMap, mut body: PoolRequest, pooling: bool) -> Result<Value, ApiError> {
    reject_removed(&body)?;
    let api = if pooling { "Pooling" } else { "Embeddings" };
    let allowed: &[ModelTask] = if pooling { &[ModelTask::Embed, ModelTask::Classify] } else { &[ModelTask::Embed] };
    require(state, allowed, api)?;
    check_model(state, body.model.as_deref())?;
    let encoding = Encoding::parse(body.encoding_format.as_deref())
        .ok_or_else(|| ApiError::invalid_param("encoding_format", "`encoding_format` must be 'float' or 'base64'"))?;
    let task = match (body.task.as_deref(), state.config.task) {
        (None | Some("embed"), ModelTask::Embed) => "embed",
        (None | Some("classify"), ModelTask::Classify) => "classify",
        (task, _) => {
            let task = task.unwrap_or("generate");
            return Err(ApiError::invalid_param("task", format!("The model does not support the {task} task")));
        }
    };
    let dimensions = match body.dimensions {
        None => None,
        Some(d) if d >= 1 => Some(u32::try_from(d).unwrap_or(u32::MAX)),
        Some(_) => return Err(ApiError::invalid_param("dimensions", "Dimensions must be greater than 0")),
    };
    let prompts = body_prompts(state, &mut body, Purpose::Embedding)?;
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    let client_id = client_request_id(headers, body.request_id.take());
    let prefix = if pooling { "pool" } else { "embd" };
    let id = format!("{prefix}-{client_id}");
    let settings = params(task, dimensions, body.use_activation);
    let vectors = pool_prompts(state, headers, &id, prompts, &settings).await?;
    let (created, model) = (unix_now(), state.config.primary_model_name().to_string());
    let usage = Usage::of(prompt_tokens);
    let value = if pooling {
        let data = vectors
            .iter()
            .enumerate()
            .map(|(index, v)| PoolingData { index, object: "pooling", data: encoding.write(v) })
            .collect();
        serde_json::to_value(ListResponse { id, object: "list", created, model, data, usage })
    } else {
        let data = vectors
            .iter()
            .enumerate()
            .map(|(index, v)| EmbeddingData { index, object: "embedding", embedding: encoding.write(v) })
            .collect();
        serde_json::to_value(ListResponse { id, object: "list", created, model, data, usage })
    };
    value.map_err(|e| ApiError::internal(e.to_string()))
}

/// Pools every prompt with the same `settings` (the embedding step of
/// `/v1/embeddings`, `/pooling` and `/v2/embed`).
async fn pool_prompts(
    state: &AppState,
    headers: &HeaderMap,
    id: &str,
    prompts: Vec<Vec<u32>>,
    settings: &PoolingParams,
) -> Result<Vec<Vec<f32>>, ApiError> {
    let inputs = prompts.into_iter().map(|token_ids| Pooling { token_ids, params: settings.clone() }).collect();
    Ok(pool_all(state, id, inputs, pinned_rank(headers)?).await?)
}

/// `/classify`.
async fn classify(
    state: &AppState,
    headers: &HeaderMap,
    mut body: PoolRequest,
) -> Result<ListResponse<ClassifyData>, ApiError> {
    reject_removed(&body)?;
    require(state, &[ModelTask::Classify], "Classification")?;
    check_model(state, body.model.as_deref())?;
    let prompts = body_prompts(state, &mut body, Purpose::Classification)?;
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    let id = format!("classify-{}", client_request_id(headers, body.request_id.take()));
    let inputs = prompts
        .into_iter()
        .map(|token_ids| Pooling { token_ids, params: params("classify", None, body.use_activation) })
        .collect();
    let vectors = pool_all(state, &id, inputs, pinned_rank(headers)?).await?;
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, probs)| ClassifyData {
            index,
            label: label(&probs, &state.class_labels),
            num_classes: probs.len(),
            probs,
        })
        .collect();
    let model = state.config.primary_model_name().to_string();
    Ok(ListResponse { id, object: "list", created: unix_now(), model, data, usage: Usage::of(prompt_tokens) })
}

/// The scores of `pairs` of texts (indices into `first` and `second`):
/// for an embedding model the cosine of their embeddings, for a
/// cross-encoder its classifier's output on the pair. Answers the scores
/// and the prompt tokens pooled.
async fn pair_scores(
    state: &AppState,
    headers: &HeaderMap,
    id: &str,
    (first, second): (&[String], &[String]),
    pairs: &[(usize, usize)],
    (truncate, use_activation): (Option<i64>, Option<bool>),
) -> Result<(Vec<f32>, usize), ApiError> {
    let rank = pinned_rank(headers)?;
    if state.config.task == ModelTask::Classify {
        let mut prompts = Vec::with_capacity(pairs.len());
        let mut starts = Vec::with_capacity(pairs.len());
        for &(a, b) in pairs {
            let (ids, start) = state
                .tokenizer
                .encode_pair(&first[a], &second[b])
                .map_err(|e| ApiError::invalid_param("text_2", format!("cannot tokenize the pair: {e}")))?;
            prompts.push(ids);
            starts.push(start);
        }
        fit_prompts(state, &mut prompts, (truncate, Cut::End), Purpose::Score)?;
        let prompt_tokens = prompts.iter().map(Vec::len).sum();
        let inputs = prompts
            .into_iter()
            .zip(starts)
            .map(|(token_ids, start)| {
                let mut params = params("classify", None, use_activation);
                params.extra_kwargs = Some([("compressed_token_type_ids".to_string(), start as u64)].into());
                Pooling { token_ids, params }
            })
            .collect();
        let vectors = pool_all(state, id, inputs, rank).await?;
        return Ok((vectors.iter().map(|v| v.first().copied().unwrap_or(0.0)).collect(), prompt_tokens));
    }
    let texts: Vec<&String> = first.iter().chain(second).collect();
    let mut prompts = texts.iter().map(|t| encode(state, t, true, "text_1")).collect::<Result<Vec<_>, _>>()?;
    fit_prompts(state, &mut prompts, (truncate, Cut::End), Purpose::Score)?;
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    let inputs =
        prompts.into_iter().map(|token_ids| Pooling { token_ids, params: params("embed", None, None) }).collect();
    let vectors = pool_all(state, id, inputs, rank).await?;
    let scores = pairs.iter().map(|&(a, b)| cosine(&vectors[a], &vectors[first.len() + b])).collect();
    Ok((scores, prompt_tokens))
}

/// Which texts pair up: one first text with every second one, or one to one
/// (vLLM's 1:1, 1:N and N:N).
fn pairing(first: usize, second: usize) -> Result<Vec<(usize, usize)>, ApiError> {
    if first == 1 {
        Ok((0..second).map(|b| (0, b)).collect())
    } else if first == second {
        Ok((0..first).map(|i| (i, i)).collect())
    } else {
        Err(ApiError::invalid_param("text_2", "Input lengths must be either 1:1, 1:N or N:N"))
    }
}

/// `/score`.
async fn score(
    state: &AppState,
    headers: &HeaderMap,
    mut body: ScoreRequest,
) -> Result<ListResponse<ScoreData>, ApiError> {
    require(state, &[ModelTask::Embed, ModelTask::Classify], "Score")?;
    check_model(state, body.model.as_deref())?;
    let first = texts(body.text_1.take(), "text_1")?;
    let second = texts(body.text_2.take(), "text_2")?;
    let pairs = pairing(first.len(), second.len())?;
    let id = format!("score-{}", client_request_id(headers, body.request_id.take()));
    let settings = (body.truncate_prompt_tokens, body.use_activation);
    let (scores, prompt_tokens) = pair_scores(state, headers, &id, (&first, &second), &pairs, settings).await?;
    let data =
        scores.into_iter().enumerate().map(|(index, score)| ScoreData { index, object: "score", score }).collect();
    let model = state.config.primary_model_name().to_string();
    Ok(ListResponse { id, object: "list", created: unix_now(), model, data, usage: Usage::of(prompt_tokens) })
}

/// `/rerank`.
async fn rerank(state: &AppState, headers: &HeaderMap, mut body: RerankRequest) -> Result<RerankResponse, ApiError> {
    require(state, &[ModelTask::Embed, ModelTask::Classify], "Rerank")?;
    check_model(state, body.model.as_deref())?;
    let query = body.query.take().ok_or_else(|| ApiError::invalid_param("query", "`query` is required"))?;
    let documents = body.documents.take().unwrap_or_default();
    if documents.is_empty() {
        return Err(ApiError::invalid_param("documents", "`documents` must not be empty"));
    }
    let top_n = match body.top_n {
        Some(n) if n < 0 => return Err(ApiError::invalid_param("top_n", "`top_n` must not be negative")),
        n => n.map(|n| n as usize),
    };
    let id = format!("rerank-{}", client_request_id(headers, body.request_id.take()));
    let pairs = pairing(1, documents.len())?;
    let settings = (body.truncate_prompt_tokens, body.use_activation);
    let (scores, prompt_tokens) = pair_scores(state, headers, &id, (&[query], &documents), &pairs, settings).await?;
    let return_documents = body.return_documents.unwrap_or(true);
    let results = ranking(&scores, top_n)
        .into_iter()
        .map(|index| RerankResult {
            index,
            document: return_documents.then(|| RerankDocument { text: documents[index].clone() }),
            relevance_score: scores[index],
        })
        .collect();
    let model = state.config.primary_model_name().to_string();
    Ok(RerankResponse { id, model, usage: Usage::of(prompt_tokens), results })
}
