//! The `VllmEngine` servicer: Generate and Embed (a pooling model) over the frontend's engine client,
//! HealthCheck, Abort, GetModelInfo, GetServerInfo and GetLoads; the other
//! RPCs answer UNIMPLEMENTED.

use super::generation::{responses, Call, Choice, GenerateStream, Running, RunningEntry};
use super::logprobs::ChoiceLogprobs;
use super::request::{invalid, map_request, rule_status, MappedRequest, Prompt};
use crate::http::generation::submit::{check_logprobs, child_requests};
use crate::http::routes::openai::pooling::run::{params, pool_all, PoolError, Pooling};
use crate::http::state::{unix_now_f64, AppState};
use futures_util::Stream;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tonic::{Request, Response, Status};
use vllm_rs_chat::DecodeOptions;
use vllm_rs_config::ModelTask;
use vllm_rs_engine::ids::random_hex;
use vllm_rs_engine::{RequestStream, SubmitError};
use vllm_rs_generate::stop::StopStrings;
use vllm_rs_grpc::common;
use vllm_rs_grpc::engine::{
    vllm_engine_server::VllmEngine, AbortRequest, AbortResponse, EmbedRequest, EmbedResponse, GenerateRequest,
    GetLoadsRequest, GetLoadsResponse, GetModelInfoRequest, GetModelInfoResponse, GetServerInfoRequest,
    GetServerInfoResponse, HealthCheckRequest, HealthCheckResponse, SchedulerLoad,
};
use vllm_rs_metrics::TokenClock;
use vllm_rs_wire::protocol::EngineRequest;

/// What `GetServerInfo` reports as `server_type`, as vLLM's servicer does.
pub const SERVER_TYPE: &str = "vllm-grpc";

/// The servicer; one per server, shared by every connection.
pub struct Servicer {
    state: Arc<AppState>,
    running: Running,
    started: Instant,
}

impl Servicer {
    /// A servicer over the frontend's shared state.
    pub fn new(state: Arc<AppState>) -> Self {
        Servicer { state, running: Running::default(), started: Instant::now() }
    }

    /// Checks the prompt, fills in `max_tokens` and the stop tokens, and
    /// submits (`n` child requests for `n` > 1, as on HTTP); answers the
    /// choices' streams in index order and the prompt token ids.
    // tonic's Status is large, but it is what every RPC answers with.
    #[allow(clippy::result_large_err)]
    fn submit(&self, request_id: &str, mapped: MappedRequest) -> Result<(Vec<RequestStream>, Vec<u32>), Status> {
        let state = &self.state;
        if let Some(reason) = state.engines.failure() {
            return Err(Status::unavailable(reason.to_string()));
        }
        if state.config.task != ModelTask::Generate {
            return Err(Status::invalid_argument("The model does not support Generate API"));
        }
        let (prompt_token_ids, field) = match mapped.prompt {
            Prompt::Tokens(ids) => (ids, "tokenized.input_ids"),
            Prompt::Text(text) => (
                state.tokenizer.encode(&text, true).map_err(|e| invalid("text", format!("cannot tokenize: {e}")))?,
                "text",
            ),
        };
        if prompt_token_ids.is_empty() {
            return Err(invalid(field, "the prompt must not be empty"));
        }
        let vocab_size = state.tokenizer.vocab_size();
        if let Some(bad) = prompt_token_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(invalid(field, format!("token id {bad} is out of vocabulary (vocab size {vocab_size})")));
        }
        let prompt_len = prompt_token_ids.len() as u64;
        let mut sampling = mapped.sampling;
        if let Some(max_len) = state.max_model_len {
            if prompt_len >= max_len {
                return Err(invalid(
                    field,
                    format!("the prompt has {prompt_len} tokens, the model's maximum context length is {max_len}"),
                ));
            }
            let max_tokens = *sampling.max_tokens.get_or_insert(max_len - prompt_len);
            if prompt_len + max_tokens > max_len {
                return Err(invalid(
                    "sampling_params.max_tokens",
                    format!("{prompt_len} prompt tokens plus {max_tokens} exceed the maximum context length {max_len}"),
                ));
            }
        }
        if let (Some(min), Some(max)) = (sampling.min_tokens, sampling.max_tokens) {
            if min > max {
                return Err(invalid("sampling_params.min_tokens", format!("must not exceed max_tokens ({max})")));
            }
        }
        check_logprobs(state, &sampling).map_err(rule_status)?;
        // vLLM's stop tokens: the request's, EOS, and the generation config's EOS ids.
        state.generation_config.set_stop_token_ids(&mut sampling, state.tokenizer.eos_token_id());
        let request = EngineRequest {
            request_id: format!("{request_id}-{}", random_hex(8)),
            prompt_token_ids: prompt_token_ids.clone(),
            sampling,
            arrival_time: unix_now_f64(),
            data_parallel_rank: None,
            client_index: 0,
            external_request_id: request_id.to_string(),
            pooling: None,
        };
        if state.config.enable_log_requests {
            tracing::info!(request_id = %request.request_id, prompt_tokens = prompt_len, "received gRPC request");
        }
        let submit = |request: EngineRequest| {
            state.engines.submit(request, mapped.data_parallel_rank).map_err(|e| match e {
                SubmitError::RankOutOfRange { .. } => invalid("data_parallel_rank", e),
                SubmitError::Unavailable(why) => Status::unavailable(why),
            })
        };
        // The choices already submitted are aborted (dropped) when one cannot be.
        let streams = if mapped.n <= 1 {
            vec![submit(request)?]
        } else {
            child_requests(&request, mapped.n).map(submit).collect::<Result<Vec<_>, _>>()?
        };
        Ok((streams, prompt_token_ids))
    }
}

fn unimplemented(rpc: &str) -> Status {
    Status::unimplemented(format!("{rpc} is not implemented by the vllm-rs frontend"))
}

#[tonic::async_trait]
impl VllmEngine for Servicer {
    type GenerateStream = GenerateStream;

    async fn generate(&self, request: Request<GenerateRequest>) -> Result<Response<GenerateStream>, Status> {
        let started = Instant::now();
        let request = request.into_inner();
        let mapped = map_request(&request)?;
        let request_id = if request.request_id.is_empty() { random_hex(32) } else { request.request_id };
        let Some((entry, aborted)) = RunningEntry::register(&self.running, &request_id) else {
            return Err(invalid("request_id", format!("{request_id:?} is already running")));
        };
        let stop = mapped.stop.clone();
        let streaming = mapped.stream;
        let (logprobs, prompt_logprobs) = (mapped.sampling.logprobs, mapped.sampling.prompt_logprobs);
        // On failure the entry drops, and the id is free again.
        let (streams, prompt) = self.submit(&request_id, mapped)?;
        let has_stops = stop.iter().any(|s| !s.is_empty());
        let call = Call { streaming, prompt: prompt.into(), aborted, entry };
        let n = streams.len() as u32;
        let choices = (0..).zip(streams).map(|(index, stream)| {
            let clock = TokenClock::start(self.state.metrics.clone(), stream.engine(), stream.times(), n, started);
            let stop_strings = has_stops.then(|| {
                (StopStrings::new(stop.clone()), self.state.tokenizer.decoder(&call.prompt, DecodeOptions::default()))
            });
            let logprobs = ChoiceLogprobs::new(logprobs, prompt_logprobs);
            Choice::new(index, call.clone(), stream, clock, stop_strings, logprobs)
        });
        Ok(Response::new(responses(choices.collect(), streaming)))
    }

    async fn embed(&self, request: Request<EmbedRequest>) -> Result<Response<EmbedResponse>, Status> {
        let request = request.into_inner();
        let state = &self.state;
        if state.config.task != ModelTask::Embed {
            return Err(Status::invalid_argument("The model does not support Embeddings API"));
        }
        let token_ids = request.tokenized.map(|t| t.input_ids).unwrap_or_default();
        if token_ids.is_empty() {
            return Err(invalid("tokenized.input_ids", "the prompt must not be empty"));
        }
        let vocab_size = state.tokenizer.vocab_size();
        if let Some(bad) = token_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(invalid(
                "tokenized.input_ids",
                format!("token id {bad} is out of vocabulary (vocab size {vocab_size})"),
            ));
        }
        let prompt_tokens = token_ids.len();
        if let Some(max_len) = state.max_model_len.filter(|&max_len| prompt_tokens as u64 > max_len) {
            return Err(invalid(
                "tokenized.input_ids",
                format!("the prompt has {prompt_tokens} tokens, the model's maximum context length is {max_len}"),
            ));
        }
        let inputs = vec![Pooling { token_ids, params: params("embed", None, None) }];
        let embedding = match pool_all(state, &request.request_id, inputs, None).await {
            Ok(mut vectors) => vectors.remove(0),
            Err(PoolError::Invalid(error)) => return Err(Status::invalid_argument(error.message)),
            Err(PoolError::Unavailable(why)) => return Err(Status::unavailable(why)),
            Err(other) => return Err(Status::internal(other.to_string())),
        };
        let embedding_dim = embedding.len() as u32;
        Ok(Response::new(EmbedResponse { embedding, prompt_tokens: prompt_tokens as u32, embedding_dim }))
    }

    async fn health_check(&self, _: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        let response = match self.state.engines.failure() {
            Some(why) => HealthCheckResponse { healthy: false, message: why.to_string() },
            None => HealthCheckResponse { healthy: true, message: "Health check passed".into() },
        };
        Ok(Response::new(response))
    }

    async fn flush_cache(
        &self,
        _: Request<common::FlushCacheRequest>,
    ) -> Result<Response<common::FlushCacheResponse>, Status> {
        Err(unimplemented("FlushCache"))
    }

    async fn start_profile(
        &self,
        _: Request<common::StartProfileRequest>,
    ) -> Result<Response<common::ProfileResponse>, Status> {
        Err(unimplemented("StartProfile"))
    }

    async fn stop_profile(
        &self,
        _: Request<common::StopProfileRequest>,
    ) -> Result<Response<common::ProfileResponse>, Status> {
        Err(unimplemented("StopProfile"))
    }

    async fn abort(&self, request: Request<AbortRequest>) -> Result<Response<AbortResponse>, Status> {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        for id in &request.get_ref().request_ids {
            // Unknown ids (already finished) are ignored, as vLLM does.
            if let Some(abort) = running.get(id) {
                let _ = abort.send(true);
            }
        }
        Ok(Response::new(AbortResponse {}))
    }

    async fn get_model_info(&self, _: Request<GetModelInfoRequest>) -> Result<Response<GetModelInfoResponse>, Status> {
        let config = &self.state.config;
        let tokenizer = &self.state.tokenizer;
        let mut stops: Vec<u32> = tokenizer.eos_token_id().into_iter().collect();
        for &id in &self.state.generation_config.eos_token_ids {
            if !stops.contains(&id) {
                stops.push(id);
            }
        }
        Ok(Response::new(GetModelInfoResponse {
            model_path: config.model_tag.clone(),
            is_generation: true,
            max_context_length: self.state.max_model_len.map_or(0, |n| n.min(u64::from(u32::MAX)) as u32),
            vocab_size: tokenizer.vocab_size() as u32,
            served_model_name: config.primary_model_name().to_string(),
            tokenizer_path: config.tokenizer.clone().unwrap_or_else(|| config.model_tag.clone()),
            eos_token_ids: stops.iter().map(|&id| id as i32).collect(),
            max_req_input_len: self.state.max_model_len.map_or(0, |n| n.min(i32::MAX as u64) as i32),
            ..GetModelInfoResponse::default()
        }))
    }

    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        Ok(Response::new(GetServerInfoResponse {
            active_requests: self.state.engines.inflight().min(u64::from(u32::MAX)) as u32,
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            server_type: SERVER_TYPE.into(),
            data_parallel_size: self.state.engines.engine_indices().len() as i32,
            ..GetServerInfoResponse::default()
        }))
    }

    async fn get_loads(&self, _: Request<GetLoadsRequest>) -> Result<Response<GetLoadsResponse>, Status> {
        // The frontend knows only its own in-flight count, not the engines' queues.
        let running = self.state.engines.inflight().min(i32::MAX as u64) as i32;
        let load = SchedulerLoad { num_running_reqs: running, num_total_reqs: running, ..SchedulerLoad::default() };
        Ok(Response::new(GetLoadsResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            dp_rank_count: 1,
            loads: vec![load],
            ..GetLoadsResponse::default()
        }))
    }

    type GetTokenizerStream = Pin<Box<dyn Stream<Item = Result<common::GetTokenizerChunk, Status>> + Send>>;

    async fn get_tokenizer(
        &self,
        _: Request<common::GetTokenizerRequest>,
    ) -> Result<Response<Self::GetTokenizerStream>, Status> {
        Err(unimplemented("GetTokenizer"))
    }

    type SubscribeKvEventsStream = Pin<Box<dyn Stream<Item = Result<common::KvEventBatch, Status>> + Send>>;

    async fn subscribe_kv_events(
        &self,
        _: Request<common::SubscribeKvEventsRequest>,
    ) -> Result<Response<Self::SubscribeKvEventsStream>, Status> {
        Err(unimplemented("SubscribeKvEvents"))
    }
}
