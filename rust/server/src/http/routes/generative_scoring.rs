//! `POST /generative_scoring`, as vLLM 0.33 serves it for a generative
//! model: for each item, the prompt `query + item` (or `item + query`) runs
//! for one token, and the item's score is the probability of the first
//! label token as the next token: over the label tokens alone (a softmax
//! of their logprobs, `apply_softmax`, the default) or over the whole
//! vocabulary. vLLM asks its engine for the label tokens' logprobs; this
//! server reads them from the whole vocabulary's, a read of its own that
//! `--max-logprobs` does not limit (the label count is checked against it,
//! as vLLM's request for that many logprobs is).

use crate::http::body::{parse_body, JsonBody};
use crate::http::error::ApiError;
use crate::http::generation::failure::generation_error;
use crate::http::generation::submit::{check_generates, check_model, submit, Endpoint};
use crate::http::rules::RULES;
use crate::http::sampling::CommonParams;
use crate::http::state::{AppState, SharedState};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::try_join_all;
use serde::{Deserialize, Serialize};
use vllm_rs_generate::logprobs::positions::entry;

/// A query or an item: text, or token ids as they are.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum TextOrIds {
    /// Text, tokenized by the server.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
}

/// vLLM's `GenerativeScoringRequest`.
#[derive(Debug, Deserialize)]
pub struct ScoringBody {
    /// The model asked for, if any.
    model: Option<String>,
    /// What every item is scored against.
    query: Option<TextOrIds>,
    /// The items to score.
    items: Option<Vec<TextOrIds>>,
    /// The tokens whose probabilities are read; the first one's is the score.
    label_token_ids: Option<Vec<i64>>,
    /// Normalize over the label tokens alone (default true).
    apply_softmax: Option<bool>,
    /// Put the item before the query (default false).
    item_first: Option<bool>,
    /// Tokenize a text query with the model's special tokens (default true).
    add_special_tokens: Option<bool>,
    /// The request's id.
    request_id: Option<String>,
}

/// One item's score.
#[derive(Debug, Serialize)]
struct ItemScore {
    index: usize,
    object: &'static str,
    score: f64,
}

/// Token counts, as vLLM's `UsageInfo` for this route.
#[derive(Debug, Serialize)]
struct ScoringUsage {
    prompt_tokens: usize,
    total_tokens: usize,
    completion_tokens: usize,
    prompt_tokens_details: Option<()>,
}

/// vLLM's `GenerativeScoringResponse`.
#[derive(Debug, Serialize)]
struct ScoringResponse {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    data: Vec<ItemScore>,
    usage: ScoringUsage,
}

/// The checked request: one prompt per item and the label tokens.
#[derive(Debug, PartialEq)]
pub struct ScoringPlan {
    /// Each item's prompt, truncated to leave room for one token.
    pub prompts: Vec<Vec<u32>>,
    /// The label tokens, in the vocabulary.
    pub labels: Vec<u32>,
    /// Normalize over the label tokens alone.
    pub apply_softmax: bool,
}

/// Handles `POST /generative_scoring`.
pub async fn generative_scoring(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Result<JsonBody, ApiError>,
) -> Response {
    let answer = async {
        let body: ScoringBody = parse_body(&body?.0)?;
        check_model(&state, body.model.as_deref())?;
        // Scoring runs the model as a generator: a pooling model has no next-token logprobs.
        check_generates(&state, Endpoint::Completions)?;
        let request_id = body.request_id.clone();
        let plan = plan(&state, body)?;
        score(&state, &headers, plan, request_id).await
    };
    match answer.await {
        Ok(response) => Json(response).into_response(),
        Err(error) => error.into_response(),
    }
}

/// Checks the body in vLLM's order and builds each item's prompt.
fn plan(state: &AppState, body: ScoringBody) -> Result<ScoringPlan, ApiError> {
    let required = |param: &str| RULES.refuse(param, "field_required", &[("param", param)]);
    let query = body.query.ok_or_else(|| required("query"))?;
    let items = body.items.ok_or_else(|| required("items"))?;
    let labels = body.label_token_ids.ok_or_else(|| required("label_token_ids"))?;
    let vocab_size = state.tokenizer.vocab_size();
    if let Some(bad) = labels.iter().find(|&&t| t < 0 || t as u64 >= vocab_size as u64) {
        let values = [("token_id", bad.to_string()), ("vocab_size", vocab_size.to_string())];
        let values: Vec<(&str, &str)> = values.iter().map(|(k, v)| (*k, v.as_str())).collect();
        return Err(ApiError::bad_request(RULES.message("label_out_of_vocab", &values)));
    }
    if labels.is_empty() {
        return Err(ApiError::bad_request(RULES.message("labels_empty", &[])));
    }
    if items.is_empty() {
        return Err(ApiError::bad_request(RULES.message("items_empty", &[])));
    }
    let texts = items.iter().filter(|item| matches!(item, TextOrIds::Text(_))).count();
    if texts != 0 && texts != items.len() {
        return Err(RULES.refuse("items", "items_mixed", &[]));
    }
    let limit = state.config.max_logprobs;
    if limit != -1 && labels.len() as i64 > limit {
        let values = [("count", labels.len().to_string()), ("limit", limit.to_string())];
        let values: Vec<(&str, &str)> = values.iter().map(|(k, v)| (*k, v.as_str())).collect();
        return Err(RULES.refuse("label_token_ids", "logprobs_above_max", &values));
    }
    let tokenize = |text: &str, special: bool, param: &str| {
        state
            .tokenizer
            .encode(text, special)
            .map_err(|e| ApiError::invalid_param(param, format!("cannot tokenize the {param}: {e}")))
    };
    let query = match query {
        TextOrIds::Text(text) => tokenize(&text, body.add_special_tokens.unwrap_or(true), "query")?,
        TextOrIds::Ids(ids) => ids,
    };
    let room = state.max_model_len.map(|len| len.saturating_sub(1) as usize);
    let item_first = body.item_first == Some(true);
    let prompts = items
        .into_iter()
        .map(|item| {
            // Items take no special tokens, so the query's are not repeated.
            let item = match item {
                TextOrIds::Text(text) => tokenize(&text, false, "items")?,
                TextOrIds::Ids(ids) => ids,
            };
            Ok(join(&query, &item, item_first, room))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    // In the vocabulary, so each fits a u32.
    let labels = labels.into_iter().map(|t| t as u32).collect();
    Ok(ScoringPlan { prompts, labels, apply_softmax: body.apply_softmax.unwrap_or(true) })
}

/// `query + item` (or `item + query`), cut to `room` tokens as vLLM cuts it.
pub fn join(query: &[u32], item: &[u32], item_first: bool, room: Option<usize>) -> Vec<u32> {
    let (first, second) = if item_first { (item, query) } else { (query, item) };
    let mut prompt = [first, second].concat();
    if let Some(room) = room {
        prompt.truncate(room);
    }
    prompt
}

/// The probability of each label token, over the labels alone
/// (`apply_softmax`) or over the whole vocabulary.
pub fn label_probabilities(logprobs: &[f64], apply_softmax: bool) -> Vec<f64> {
    if !apply_softmax {
        return logprobs.iter().map(|l| l.exp()).collect();
    }
    let max = logprobs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = logprobs.iter().map(|l| (l - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

/// Runs every item for one token, reading the whole vocabulary's logprobs.
async fn score(
    state: &AppState,
    headers: &HeaderMap,
    plan: ScoringPlan,
    request_id: Option<String>,
) -> Result<ScoringResponse, ApiError> {
    let mut runs = Vec::with_capacity(plan.prompts.len());
    for prompt in plan.prompts {
        let mut common = CommonParams { request_id: request_id.clone(), vocabulary_read: true, ..Default::default() };
        common.sampling.max_tokens = Some(1);
        common.sampling.logprobs = Some(-1);
        runs.push(submit(state, headers, Endpoint::Completions, prompt, common)?);
    }
    let id = runs[0].id.strip_prefix("cmpl-").unwrap_or(&runs[0].id).to_owned();
    let created = runs[0].created;
    let wholes = try_join_all(runs.iter_mut().map(|run| run.generation.collect_whole()))
        .await
        .map_err(|e| generation_error(&e))?;
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    let mut data = Vec::with_capacity(wholes.len());
    for (index, (whole, run)) in wholes.iter().zip(&runs).enumerate() {
        let usage = run.generation.usage();
        prompt_tokens += usage.prompt_tokens;
        completion_tokens += usage.completion_tokens;
        let position = whole.scored.as_ref().and_then(|s| s.logprobs.as_ref()).and_then(|p| p.first());
        let Some(position) = position else {
            return Err(ApiError::internal(RULES.message("scoring_no_logprobs", &[("index", &index.to_string())])));
        };
        let logprobs = plan
            .labels
            .iter()
            .map(|&label| entry(position, label).map(|e| e.logprob))
            .collect::<Option<Vec<f64>>>()
            .ok_or_else(|| {
                ApiError::internal(RULES.message("scoring_no_logprobs", &[("index", &index.to_string())]))
            })?;
        let score = label_probabilities(&logprobs, plan.apply_softmax)[0];
        data.push(ItemScore { index, object: "score", score });
    }
    Ok(ScoringResponse {
        id: format!("generative-scoring-{id}"),
        object: "list",
        created,
        model: state.config.primary_model_name().to_string(),
        data,
        usage: ScoringUsage {
            prompt_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            completion_tokens,
            prompt_tokens_details: None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_item_goes_after_the_query_unless_asked_and_the_prompt_leaves_room() {
        assert_eq!(join(&[1, 2], &[3], false, None), vec![1, 2, 3]);
        assert_eq!(join(&[1, 2], &[3], true, None), vec![3, 1, 2]);
        assert_eq!(join(&[1, 2], &[3, 4], false, Some(3)), vec![1, 2, 3]);
    }

    #[test]
    fn probabilities_over_the_labels_or_the_vocabulary() {
        let logprobs = [0.5f64.ln(), 0.25f64.ln()];
        let full = label_probabilities(&logprobs, false);
        assert!((full[0] - 0.5).abs() < 1e-12 && (full[1] - 0.25).abs() < 1e-12);
        let labels = label_probabilities(&logprobs, true);
        assert!((labels[0] - 2.0 / 3.0).abs() < 1e-12 && (labels[1] - 1.0 / 3.0).abs() < 1e-12);
    }
}
