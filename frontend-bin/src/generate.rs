//! One generation as the HTTP handlers see it: engine outputs turned into text
//! deltas, with detokenization, stop strings, usage counts and metrics.

use crate::engine::protocol::{FinishReason, RequestError, StopReason};
use crate::engine::{RequestEvent, RequestStream};
use crate::metrics::Metrics;
use crate::stop::StopStrings;
use crate::tokenizer::TextDecoder;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a generation ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Finish {
    /// The finish reason.
    pub reason: FinishReason,
    /// The stop token id or stop string, when one stopped it.
    pub stop_reason: Option<StopReason>,
}

/// New text of a generation; the last delta carries the finish.
#[derive(Clone, Debug, PartialEq)]
pub struct Delta {
    /// Text since the previous delta.
    pub text: String,
    /// Set on the last delta.
    pub finish: Option<Finish>,
}

/// Why a generation failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum GenerationError {
    /// The engine finished the request with ERROR and no reason.
    #[error("the engine failed the request")]
    Engine,
    /// The engine finished the request with ERROR and a `RequestError`.
    #[error("{}", .0.message)]
    Rejected(RequestError),
    /// The engines are gone, or the request could not be delivered.
    #[error("{0}")]
    Unavailable(String),
}

/// Token counts of a generation so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

impl Usage {
    /// Adds `choice`, another choice of the same prompt: the prompt counts
    /// once, the completions add up (as vLLM counts n > 1).
    pub fn add_choice(&mut self, choice: Usage) {
        self.prompt_tokens = choice.prompt_tokens;
        self.completion_tokens += choice.completion_tokens;
        self.total_tokens = self.prompt_tokens + self.completion_tokens;
    }
}

/// A running generation.
pub struct Generation {
    stream: RequestStream,
    decoder: Box<dyn TextDecoder>,
    stops: StopStrings,
    metrics: Arc<Metrics>,
    prompt_tokens: usize,
    completion_tokens: usize,
    started: Instant,
    last_tokens_at: Option<Instant>,
    finished: bool,
}

impl Generation {
    /// Follows `stream`, decoding with `decoder` and stopping at `stop_strings`.
    pub fn new(
        stream: RequestStream,
        decoder: Box<dyn TextDecoder>,
        stop_strings: Vec<String>,
        prompt_tokens: usize,
        metrics: Arc<Metrics>,
        started: Instant,
    ) -> Self {
        metrics.record_prompt(stream.engine(), prompt_tokens);
        Generation {
            stream,
            decoder,
            stops: StopStrings::new(stop_strings),
            metrics,
            prompt_tokens,
            completion_tokens: 0,
            started,
            last_tokens_at: None,
            finished: false,
        }
    }

    /// The token counts so far.
    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            total_tokens: self.prompt_tokens + self.completion_tokens,
        }
    }

    /// The engine serving this generation.
    pub fn engine(&self) -> u32 {
        self.stream.engine()
    }

    /// The next non-empty delta (or the final one); `None` once finished.
    /// Outputs that queued up while the caller was busy come as one delta.
    pub async fn next_delta(&mut self) -> Option<Result<Delta, GenerationError>> {
        while !self.finished {
            let (token_ids, finish_reason, stop_reason) = match self.stream.recv().await {
                None => return Some(self.fail(GenerationError::Unavailable("the engine client stopped".into()))),
                Some(RequestEvent::Failed(reason)) => return Some(self.fail(GenerationError::Unavailable(reason))),
                Some(RequestEvent::Rejected(error)) => return Some(self.fail(GenerationError::Rejected(error))),
                Some(RequestEvent::Output { token_ids, finish_reason, stop_reason }) => {
                    (token_ids, finish_reason, stop_reason)
                }
            };
            self.count_tokens(token_ids.len());
            if finish_reason == Some(FinishReason::Error) {
                return Some(self.fail(GenerationError::Engine));
            }
            let mut finish = finish_reason.map(|reason| Finish { reason, stop_reason });
            // As in vLLM, the token that stopped generation in the engine (EOS,
            // a stop token id) is counted but left out of the text.
            let decoded = match finish_reason {
                Some(FinishReason::Stop) => &token_ids[..token_ids.len().saturating_sub(1)],
                _ => &token_ids[..],
            };
            let mut text = self.decoder.push(decoded);
            if finish.is_some() {
                text.push_str(&self.decoder.flush());
            }
            let (mut emit, matched) = self.stops.push(&text);
            if let Some(stop) = matched {
                self.stream.abort();
                finish = Some(Finish { reason: FinishReason::Stop, stop_reason: Some(StopReason::Text(stop)) });
            } else if finish.is_some() {
                emit.push_str(&self.stops.flush());
            }
            if let Some(f) = &finish {
                self.finish(f.reason);
            }
            if !emit.is_empty() || finish.is_some() {
                return Some(Ok(Delta { text: emit, finish }));
            }
        }
        None
    }

    /// Runs to the end, returning the whole text and the finish.
    pub async fn collect(&mut self) -> Result<(String, Finish), GenerationError> {
        let mut text = String::new();
        while let Some(delta) = self.next_delta().await {
            let delta = delta?;
            text.push_str(&delta.text);
            if let Some(finish) = delta.finish {
                return Ok((text, finish));
            }
        }
        Err(GenerationError::Unavailable("the generation ended without a finish reason".into()))
    }

    fn count_tokens(&mut self, count: usize) {
        if count == 0 {
            return;
        }
        let now = Instant::now();
        let (first, gap) = match self.last_tokens_at {
            None => (Some(now - self.started), None),
            Some(last) => (None, Some(now - last)),
        };
        self.metrics.record_tokens(self.engine(), count, first, gap);
        self.last_tokens_at = Some(now);
        self.completion_tokens += count;
    }

    fn finish(&mut self, reason: FinishReason) {
        self.finished = true;
        self.metrics.record_finished(self.engine(), reason, self.elapsed());
    }

    fn fail(&mut self, error: GenerationError) -> Result<Delta, GenerationError> {
        self.finish(FinishReason::Error);
        Err(error)
    }

    fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.finished {
            // The client went away first; the stream's own drop sends the ABORT.
            self.finish(FinishReason::Abort);
        }
    }
}
