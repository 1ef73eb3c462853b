//! The `VllmEngine` servicer: Generate over the frontend's engine client,
//! HealthCheck, Abort, GetModelInfo, GetServerInfo and GetLoads; the other
//! RPCs answer UNIMPLEMENTED.

use super::request::{invalid, map_request, MappedRequest, Prompt};
use crate::engine::protocol::{EngineRequest, FinishReason, RequestError, StopReason};
use crate::engine::{RequestEvent, RequestStream, SubmitError};
use crate::http::state::{unix_now_f64, AppState};
use crate::ids::random_hex;
use crate::stop::StopStrings;
use crate::tokenizer::{DecodeOptions, TextDecoder};
use futures_util::Stream;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use vllm_rs_grpc::common;
use vllm_rs_grpc::engine::{
    generate_complete::MatchedStop, generate_response, vllm_engine_server::VllmEngine, AbortRequest, AbortResponse,
    EmbedRequest, EmbedResponse, GenerateComplete, GenerateRequest, GenerateResponse, GenerateStreamChunk,
    GetLoadsRequest, GetLoadsResponse, GetModelInfoRequest, GetModelInfoResponse, GetServerInfoRequest,
    GetServerInfoResponse, HealthCheckRequest, HealthCheckResponse, SchedulerLoad,
};

/// What `GetServerInfo` reports as `server_type`, as vLLM's servicer does.
pub const SERVER_TYPE: &str = "vllm-grpc";

/// Running Generate calls by client request id: a sender per call that Abort fires.
type Running = Arc<Mutex<HashMap<String, watch::Sender<bool>>>>;

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
    /// submits; answers the request's stream and its prompt token ids.
    // tonic's Status is large, but it is what every RPC answers with.
    #[allow(clippy::result_large_err)]
    fn submit(&self, request_id: &str, mapped: MappedRequest) -> Result<(RequestStream, Vec<u32>), Status> {
        let state = &self.state;
        if let Some(reason) = state.engines.failure() {
            return Err(Status::unavailable(reason.to_string()));
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
        };
        if state.config.enable_log_requests {
            tracing::info!(request_id = %request.request_id, prompt_tokens = prompt_len, "received gRPC request");
        }
        let stream = state.engines.submit(request, mapped.data_parallel_rank).map_err(|e| match e {
            SubmitError::RankOutOfRange { .. } => invalid("data_parallel_rank", e),
            SubmitError::Unavailable(why) => Status::unavailable(why),
        })?;
        Ok((stream, prompt_token_ids))
    }
}

/// The response stream of one Generate call.
type GenerateStream = Pin<Box<dyn Stream<Item = Result<GenerateResponse, Status>> + Send>>;

/// One Generate call following its engine request. Dropping it (the client
/// cancelled) drops the request stream, which aborts the engine request.
struct Generation {
    stream: RequestStream,
    stop_strings: Option<(StopStrings, Box<dyn TextDecoder>)>,
    streaming: bool,
    prompt_tokens: u32,
    output_ids: Vec<u32>,
    aborted: watch::Receiver<bool>,
    running: Running,
    request_id: String,
    state: Arc<AppState>,
    started: Instant,
    last_tokens_at: Option<Instant>,
    done: bool,
    /// The `GenerateComplete` that follows the last chunk.
    queued: Option<GenerateResponse>,
}

impl Generation {
    /// The next response: a chunk of new tokens, or the final `GenerateComplete`.
    async fn next(&mut self) -> Option<Result<GenerateResponse, Status>> {
        if let Some(complete) = self.queued.take() {
            return Some(Ok(complete));
        }
        while !self.done {
            let event = tokio::select! {
                event = self.stream.recv() => event,
                _ = self.aborted.wait_for(|aborted| *aborted) => {
                    self.stream.abort();
                    Some(RequestEvent::Output { token_ids: vec![], finish_reason: Some(FinishReason::Abort), stop_reason: None })
                }
            };
            let (mut token_ids, mut finish_reason, mut stop_reason) = match event {
                Some(RequestEvent::Output { token_ids, finish_reason, stop_reason }) => {
                    (token_ids, finish_reason, stop_reason)
                }
                Some(RequestEvent::Failed(why)) => return Some(Err(self.fail(Status::unavailable(why)))),
                Some(RequestEvent::Rejected(error)) => return Some(Err(self.fail(rejection_status(error)))),
                None => return Some(Err(self.fail(Status::unavailable("the engine client stopped")))),
            };
            self.record_tokens(token_ids.len());
            if let Some((stops, decoder)) = &mut self.stop_strings {
                let mut text = decoder.push(&token_ids);
                if finish_reason.is_some() {
                    text.push_str(&decoder.flush());
                }
                if let (_, Some(stop)) = stops.push(&text) {
                    self.stream.abort();
                    finish_reason = Some(FinishReason::Stop);
                    stop_reason = Some(StopReason::Text(stop));
                }
            }
            let chunk_ids = if self.streaming { token_ids.clone() } else { Vec::new() };
            self.output_ids.append(&mut token_ids);
            if let Some(reason) = finish_reason {
                self.finish(reason);
                let complete = self.complete(reason, stop_reason);
                if chunk_ids.is_empty() {
                    return Some(Ok(complete));
                }
                self.queued = Some(complete);
            }
            if !chunk_ids.is_empty() {
                let chunk = GenerateStreamChunk {
                    token_ids: chunk_ids,
                    prompt_tokens: self.prompt_tokens,
                    completion_tokens: self.output_ids.len() as u32,
                    ..GenerateStreamChunk::default()
                };
                return Some(Ok(GenerateResponse { response: Some(generate_response::Response::Chunk(chunk)) }));
            }
        }
        None
    }

    fn complete(&self, reason: FinishReason, stop_reason: Option<StopReason>) -> GenerateResponse {
        let finish_reason = match reason {
            FinishReason::Repetition => FinishReason::Stop,
            other => other,
        };
        let matched_stop = match stop_reason {
            Some(StopReason::Token(id)) => u32::try_from(id).ok().map(MatchedStop::MatchedTokenId),
            Some(StopReason::Text(text)) => Some(MatchedStop::MatchedStopStr(text)),
            None => None,
        };
        let complete = GenerateComplete {
            output_ids: if self.streaming { Vec::new() } else { self.output_ids.clone() },
            finish_reason: finish_reason.as_str().to_string(),
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.output_ids.len() as u32,
            matched_stop,
            ..GenerateComplete::default()
        };
        GenerateResponse { response: Some(generate_response::Response::Complete(complete)) }
    }

    fn record_tokens(&mut self, count: usize) {
        if count == 0 {
            return;
        }
        let now = Instant::now();
        let (first, gap) = match self.last_tokens_at {
            None => (Some(now - self.started), None),
            Some(last) => (None, Some(now - last)),
        };
        self.state.metrics.record_tokens(self.stream.engine(), count, first, gap);
        self.last_tokens_at = Some(now);
    }

    fn finish(&mut self, reason: FinishReason) {
        self.done = true;
        self.state.metrics.record_finished(self.stream.engine(), reason, self.started.elapsed());
        self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.request_id);
    }

    fn fail(&mut self, status: Status) -> Status {
        self.finish(FinishReason::Error);
        status
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.done {
            // The client cancelled; the request stream's own drop sends the ABORT.
            self.finish(FinishReason::Abort);
        }
    }
}

/// The status for a request the engine finished with ERROR, by its code as
/// the HTTP routes map it: validation errors are the client's, retryable ones
/// a temporary unavailability, the rest internal.
fn rejection_status(error: RequestError) -> Status {
    if error.code == "validation_error" {
        Status::invalid_argument(error.message)
    } else if error.retryable {
        Status::unavailable(error.message)
    } else {
        Status::internal(error.message)
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
        let (abort, aborted) = watch::channel(false);
        {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            if running.contains_key(&request_id) {
                return Err(invalid("request_id", format!("{request_id:?} is already running")));
            }
            running.insert(request_id.clone(), abort);
        }
        let stop = mapped.stop.clone();
        let streaming = mapped.stream;
        let (stream, prompt) = match self.submit(&request_id, mapped) {
            Ok(submitted) => submitted,
            Err(status) => {
                self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(&request_id);
                return Err(status);
            }
        };
        let prompt_tokens = prompt.len();
        self.state.metrics.record_prompt(stream.engine(), prompt_tokens);
        let has_stops = stop.iter().any(|s| !s.is_empty());
        let generation = Generation {
            stream,
            stop_strings: has_stops
                .then(|| (StopStrings::new(stop), self.state.tokenizer.decoder(&prompt, DecodeOptions::default()))),
            streaming,
            prompt_tokens: prompt_tokens as u32,
            output_ids: Vec::new(),
            aborted,
            running: self.running.clone(),
            request_id,
            state: self.state.clone(),
            started,
            last_tokens_at: None,
            done: false,
            queued: None,
        };
        let responses = futures_util::stream::unfold(generation, |mut generation| async move {
            generation.next().await.map(|response| (response, generation))
        });
        Ok(Response::new(Box::pin(responses)))
    }

    async fn embed(&self, _: Request<EmbedRequest>) -> Result<Response<EmbedResponse>, Status> {
        Err(unimplemented("Embed"))
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
