//! Pooling inputs in the engines: one engine request per input (ids
//! `{id}-{index}`, as vLLM numbers a batch's prompts), all in flight
//! together, each answered with its vector. Shared by the HTTP routes and
//! the gRPC `Embed` call.

use crate::http::state::{unix_now_f64, AppState};
use futures_util::future::try_join_all;
use std::time::Instant;
use vllm_rs_engine::ids::random_hex;
use vllm_rs_engine::{RequestEvent, SubmitError, Take};
use vllm_rs_metrics::TokenClock;
use vllm_rs_wire::protocol::{EngineRequest, FinishReason, PoolingParams, RequestError, SamplingParams};

/// One input to pool.
pub struct Pooling {
    /// Its token ids (checked: in the vocabulary, within the model length).
    pub token_ids: Vec<u32>,
    /// How to pool it.
    pub params: PoolingParams,
}

/// Why pooling failed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// `X-data-parallel-rank` named no engine.
    #[error("{0}")]
    RankOutOfRange(String),
    /// The engines are unusable, or went away.
    #[error("{0}")]
    Unavailable(String),
    /// An engine refused an input as invalid (vLLM's `validation_error`): the client's fault.
    #[error("{}", .0.message)]
    Invalid(RequestError),
    /// An engine failed an input.
    #[error("{}", .0.message)]
    Failed(RequestError),
    /// An engine answered a pooling request with tokens.
    #[error("the engine answered a pooling request without a pooled result")]
    NotPooled,
}

/// Pools every input (engine request ids `{external_id}-{index}-{random}`)
/// and answers their vectors in input order; the first failure aborts the rest.
pub async fn pool_all(
    state: &AppState,
    external_id: &str,
    inputs: Vec<Pooling>,
    pinned_rank: Option<u32>,
) -> Result<Vec<Vec<f32>>, PoolError> {
    let started = Instant::now();
    if let Some(reason) = state.engines.failure() {
        return Err(PoolError::Unavailable(reason.to_string()));
    }
    let streams = inputs
        .into_iter()
        .enumerate()
        .map(|(index, input)| {
            let request = EngineRequest {
                request_id: format!("{external_id}-{index}-{}", random_hex(8)),
                prompt_token_ids: input.token_ids,
                sampling: SamplingParams::default(),
                arrival_time: unix_now_f64(),
                data_parallel_rank: None,
                client_index: 0,
                external_request_id: external_id.to_string(),
                pooling: Some(input.params),
            };
            state.engines.submit(request, pinned_rank).map_err(|e| match e {
                SubmitError::RankOutOfRange { .. } => PoolError::RankOutOfRange(e.to_string()),
                SubmitError::Unavailable(why) => PoolError::Unavailable(why),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    try_join_all(streams.into_iter().map(|mut stream| async move {
        // The request's `/metrics` series, as a generation's (an unfinished clock counts an abort).
        let mut clock = TokenClock::start(state.metrics.clone(), stream.engine(), stream.times(), 1, started);
        match stream.recv(Take::All).await {
            Some(RequestEvent::Pooled(values)) => {
                clock.finish(FinishReason::Stop);
                Ok(values)
            }
            Some(RequestEvent::Rejected(error)) => {
                clock.finish(FinishReason::Error);
                Err(if error.code == "validation_error" { PoolError::Invalid(error) } else { PoolError::Failed(error) })
            }
            Some(RequestEvent::Failed(why)) => Err(PoolError::Unavailable(why)),
            None => Err(PoolError::Unavailable("the engine client stopped".into())),
            Some(RequestEvent::Output { .. }) => Err(PoolError::NotPooled),
        }
    }))
    .await
}

/// A pooling task's params with the request's settings.
pub fn params(task: &str, dimensions: Option<u32>, use_activation: Option<bool>) -> PoolingParams {
    PoolingParams { task: Some(task.to_string()), dimensions, use_activation, ..PoolingParams::default() }
}
