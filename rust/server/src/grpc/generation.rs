//! One Generate call followed to its end: each choice (one engine request;
//! `n` of them for `n` > 1) answers `GenerateStreamChunk`s and a
//! `GenerateComplete` with its `index`, as vLLM's servicer answers them.

use super::logprobs::{extend, ChoiceLogprobs};
use futures_util::{Stream, StreamExt};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tonic::Status;
use vllm_rs_chat::TextDecoder;
use vllm_rs_engine::{RequestEvent, RequestStream, Take};
use vllm_rs_generate::stop::StopStrings;
use vllm_rs_grpc::engine::{
    generate_complete::MatchedStop, generate_response, GenerateComplete, GenerateResponse, GenerateStreamChunk,
    InputLogProbs, OutputLogProbs,
};
use vllm_rs_metrics::TokenClock;
use vllm_rs_wire::protocol::{FinishReason, RequestError, StopReason};

/// Running Generate calls by client request id: a sender per call that Abort fires.
pub type Running = Arc<Mutex<HashMap<String, watch::Sender<bool>>>>;

/// A call's place in [`Running`], given up when the last of its choices is dropped.
pub struct RunningEntry {
    running: Running,
    request_id: String,
}

impl RunningEntry {
    /// Registers `request_id`; answers the receiver Abort fires, or `None`
    /// when a call with that id is running already.
    pub fn register(running: &Running, request_id: &str) -> Option<(Arc<Self>, watch::Receiver<bool>)> {
        let mut calls = running.lock().unwrap_or_else(|e| e.into_inner());
        if calls.contains_key(request_id) {
            return None;
        }
        let (abort, aborted) = watch::channel(false);
        calls.insert(request_id.to_owned(), abort);
        Some((Arc::new(RunningEntry { running: running.clone(), request_id: request_id.to_owned() }), aborted))
    }
}

impl Drop for RunningEntry {
    fn drop(&mut self) {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.request_id);
    }
}

/// What every choice of a call shares.
#[derive(Clone)]
pub struct Call {
    /// Stream chunks, or answer one `GenerateComplete` per choice.
    pub streaming: bool,
    /// The prompt's token ids.
    pub prompt: Arc<[u32]>,
    /// Fires when Abort names the call.
    pub aborted: watch::Receiver<bool>,
    /// Keeps the call's id in [`Running`] while a choice lives.
    pub entry: Arc<RunningEntry>,
}

/// One choice: an engine request followed to its end. Dropping it (the
/// client cancelled) drops the request stream, which aborts the engine request.
pub struct Choice {
    index: u32,
    call: Call,
    stream: RequestStream,
    clock: TokenClock,
    stop_strings: Option<(StopStrings, Box<dyn TextDecoder>)>,
    logprobs: Option<ChoiceLogprobs>,
    /// Every output token (kept when not streaming).
    output_ids: Vec<u32>,
    /// Every output token's logprobs (kept when not streaming).
    output_logprobs: Option<OutputLogProbs>,
    /// The prompt's logprobs until a chunk (or the complete) carries them.
    input_logprobs: Option<InputLogProbs>,
    /// The `GenerateComplete` that follows the last chunk.
    queued: Option<GenerateResponse>,
}

impl Choice {
    /// Choice `index` of `call`, following `stream`, timed by `clock`.
    pub fn new(
        index: u32,
        call: Call,
        stream: RequestStream,
        clock: TokenClock,
        stop_strings: Option<(StopStrings, Box<dyn TextDecoder>)>,
        logprobs: Option<ChoiceLogprobs>,
    ) -> Self {
        Choice {
            index,
            call,
            stream,
            clock,
            stop_strings,
            logprobs,
            output_ids: Vec::new(),
            output_logprobs: None,
            input_logprobs: None,
            queued: None,
        }
    }

    /// The next response: a chunk of new tokens (streaming only), or the
    /// final `GenerateComplete`; `None` after that.
    pub async fn next(&mut self) -> Option<Result<GenerateResponse, Status>> {
        if let Some(complete) = self.queued.take() {
            return Some(Ok(complete));
        }
        while !self.clock.is_finished() {
            let event = tokio::select! {
                event = self.stream.recv(Take::All) => event,
                _ = self.call.aborted.wait_for(|aborted| *aborted) => {
                    self.stream.abort();
                    Some(RequestEvent::Output { token_ids: vec![], finish_reason: Some(FinishReason::Abort), stop_reason: None, logprobs: None })
                }
            };
            let (mut token_ids, mut finish_reason, mut stop_reason, rows) = match event {
                Some(RequestEvent::Output { token_ids, finish_reason, stop_reason, logprobs }) => {
                    (token_ids, finish_reason, stop_reason, logprobs)
                }
                Some(RequestEvent::Failed(why)) => return Some(Err(self.fail(Status::unavailable(why)))),
                Some(RequestEvent::Rejected(error)) => return Some(Err(self.fail(rejection_status(error)))),
                Some(RequestEvent::Pooled(_)) => {
                    return Some(Err(self.fail(Status::internal("the engine pooled a generation request"))))
                }
                None => return Some(Err(self.fail(Status::unavailable("the engine client stopped")))),
            };
            self.clock.tokens(token_ids.len());
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
            let (output_logprobs, input_logprobs) = match &mut self.logprobs {
                Some(reader) => reader.read(&token_ids, rows, &self.call.prompt),
                None => (None, None),
            };
            if input_logprobs.is_some() {
                self.input_logprobs = input_logprobs;
            }
            let chunk = if !self.call.streaming {
                self.output_ids.append(&mut token_ids);
                extend(&mut self.output_logprobs, output_logprobs);
                None
            } else if token_ids.is_empty() {
                None
            } else {
                let chunk = GenerateStreamChunk {
                    token_ids,
                    prompt_tokens: self.call.prompt.len() as u32,
                    completion_tokens: self.clock.generated() as u32,
                    output_logprobs,
                    // vLLM sends the prompt's logprobs only in a choice's first chunk.
                    input_logprobs: self.input_logprobs.take(),
                    index: self.index,
                    ..GenerateStreamChunk::default()
                };
                Some(GenerateResponse { response: Some(generate_response::Response::Chunk(chunk)) })
            };
            if let Some(reason) = finish_reason {
                self.clock.finish(reason);
                let complete = self.complete(reason, stop_reason);
                let Some(chunk) = chunk else { return Some(Ok(complete)) };
                self.queued = Some(complete);
                return Some(Ok(chunk));
            }
            if let Some(chunk) = chunk {
                return Some(Ok(chunk));
            }
        }
        None
    }

    /// The choice's `GenerateComplete`: with every token and its logprobs
    /// when not streaming (the chunks carried them otherwise).
    fn complete(&mut self, reason: FinishReason, stop_reason: Option<StopReason>) -> GenerateResponse {
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
            output_ids: std::mem::take(&mut self.output_ids),
            finish_reason: finish_reason.as_str().to_string(),
            prompt_tokens: self.call.prompt.len() as u32,
            completion_tokens: self.clock.generated() as u32,
            output_logprobs: self.output_logprobs.take(),
            input_logprobs: self.input_logprobs.take(),
            index: self.index,
            matched_stop,
            ..GenerateComplete::default()
        };
        GenerateResponse { response: Some(generate_response::Response::Complete(complete)) }
    }

    fn fail(&mut self, status: Status) -> Status {
        self.clock.finish(FinishReason::Error);
        status
    }
}

/// The response stream of one Generate call.
pub type GenerateStream = Pin<Box<dyn Stream<Item = Result<GenerateResponse, Status>> + Send>>;

/// The responses of a call's `choices`, as vLLM's servicer sends them:
/// streamed, each choice's chunks and complete as they come (choices
/// interleaved); not streamed, one complete per choice in index order once
/// all have finished. A failing choice ends the call with its status, and
/// the other choices are dropped (aborted).
pub fn responses(choices: Vec<Choice>, streaming: bool) -> GenerateStream {
    if streaming {
        let each = choices.into_iter().map(|choice| {
            Box::pin(futures_util::stream::unfold(choice, |mut choice| async move {
                choice.next().await.map(|response| (response, choice))
            }))
        });
        let merged = futures_util::stream::select_all(each);
        Box::pin(merged.scan(false, |failed, response| {
            let item = (!*failed).then(|| {
                *failed = response.is_err();
                response
            });
            std::future::ready(item)
        }))
    } else {
        let completes = futures_util::future::try_join_all(choices.into_iter().map(|mut choice| async move {
            choice.next().await.unwrap_or_else(|| Err(Status::internal("the choice ended without an answer")))
        }));
        Box::pin(futures_util::stream::once(completes).flat_map(|result| match result {
            Ok(completes) => futures_util::stream::iter(completes.into_iter().map(Ok)).left_stream(),
            Err(status) => futures_util::stream::iter([Err(status)]).right_stream(),
        }))
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
