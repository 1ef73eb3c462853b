//! One generation as the HTTP handlers see it: engine outputs turned into text
//! deltas, with detokenization, stop strings, usage counts and metrics.

pub mod logprobs;
pub mod stop;

use crate::logprobs::{PositionReader, Scored};
use crate::stop::StopStrings;
use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;
use vllm_rs_chat::{TextDecoder, Tokenizer};
use vllm_rs_engine::inbox::OutputLogprobs;
use vllm_rs_engine::{RequestEvent, RequestStream, Take};
use vllm_rs_metrics::{Metrics, TokenClock};
use vllm_rs_parsers::{ReasoningParser, ReasoningTokenTally};
use vllm_rs_wire::protocol::{FinishReason, RequestError, StopReason};

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
    /// The tokens of the delta and their logprobs, when the request asked for logprobs.
    pub scored: Option<Box<Scored>>,
    /// The tokens of the delta, when the request asked for them (`return_token_ids`).
    pub token_ids: Option<Vec<u32>>,
}

impl Delta {
    /// A final delta as vLLM's frontend streams it: its text, tokens and
    /// logprobs first, when it has any, then the finish in a chunk of its
    /// own (empty text, and empty token ids when they were asked for).
    /// `None` first for a delta with nothing but the finish; `self`
    /// unchanged (and no finish delta) when it is not the final one.
    pub fn split_finish(mut self) -> (Option<Delta>, Option<Delta>) {
        let Some(finish) = self.finish.take() else { return (Some(self), None) };
        let finish_only = Delta {
            text: String::new(),
            finish: Some(finish),
            scored: None,
            token_ids: self.token_ids.as_ref().map(|_| Vec::new()),
        };
        let has_logprobs = self
            .scored
            .as_ref()
            .is_some_and(|s| s.prompt_logprobs.is_some() || s.logprobs.as_ref().is_some_and(|l| !l.is_empty()));
        let has_tokens = self.token_ids.as_ref().is_some_and(|ids| !ids.is_empty());
        let content = (!self.text.is_empty() || has_logprobs || has_tokens).then_some(self);
        (content, finish_only.into())
    }

    /// This delta followed by `later`, as one.
    fn followed_by(mut self, later: Delta) -> Delta {
        self.text.push_str(&later.text);
        self.finish = later.finish;
        self.token_ids = match (self.token_ids, later.token_ids) {
            (Some(mut ids), Some(more)) => {
                ids.extend(more);
                Some(ids)
            }
            (ids, more) => ids.or(more),
        };
        self.scored = match (self.scored, later.scored) {
            (Some(mut whole), Some(part)) => {
                Scoring::merge(&mut whole, *part);
                Some(whole)
            }
            (whole, part) => whole.or(part),
        };
        self
    }
}

/// Reads a generation's logprobs: sampled and prompt positions, each
/// reader keeping its scored tokens as context.
struct Scoring {
    sample: PositionReader,
    prompt: PositionReader,
}

impl Scoring {
    fn read(&mut self, token_ids: &[u32], logprobs: Option<Box<OutputLogprobs>>) -> Scored {
        let mut scored = Scored { token_ids: token_ids.to_vec(), ..Scored::default() };
        if let Some(logprobs) = logprobs {
            if !logprobs.sample.is_empty() {
                scored.logprobs = Some(logprobs.sample.iter().flat_map(|rows| self.sample.read(rows)).collect());
            }
            if let Some(rows) = &logprobs.prompt {
                scored.prompt_logprobs =
                    Some(std::iter::once(None).chain(self.prompt.read(rows).into_iter().map(Some)).collect());
            }
        }
        scored
    }

    /// Adds a later delta's tokens and positions to `whole`.
    fn merge(whole: &mut Scored, delta: Scored) {
        whole.token_ids.extend(delta.token_ids);
        if let Some(positions) = delta.logprobs {
            whole.logprobs.get_or_insert_with(Vec::new).extend(positions);
        }
        if delta.prompt_logprobs.is_some() {
            whole.prompt_logprobs = delta.prompt_logprobs;
        }
    }
}

/// A whole generation: its text, how it ended, and its scored tokens when asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct Whole {
    /// All the text.
    pub text: String,
    /// How it ended.
    pub finish: Finish,
    /// All the tokens and their logprobs, when the request asked for logprobs.
    pub scored: Option<Box<Scored>>,
    /// All the tokens, when the request asked for them (`return_token_ids`).
    pub token_ids: Option<Vec<u32>>,
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Prompt tokens the engine found in its prefix cache (its prefill
    /// stats' `num_cached_tokens`; 0 until it reported them).
    pub cached_tokens: usize,
    /// Generated tokens the request's reasoning parser classifies as
    /// reasoning (0 without one).
    pub reasoning_tokens: usize,
}

impl Usage {
    /// Adds `choice`, another choice of the same prompt: the prompt counts
    /// once, the completions and their reasoning add up (as vLLM counts
    /// n > 1); the cached prompt tokens are the first choice's added.
    pub fn add_choice(&mut self, choice: Usage) {
        if self.prompt_tokens == 0 {
            self.cached_tokens = choice.cached_tokens;
        }
        self.prompt_tokens = choice.prompt_tokens;
        self.completion_tokens += choice.completion_tokens;
        self.reasoning_tokens += choice.reasoning_tokens;
        self.total_tokens = self.prompt_tokens + self.completion_tokens;
    }
}

/// Counts a generation's reasoning tokens: its text as streamed so far and
/// where each generated token's text ends in it.
struct ReasoningCount {
    parser: ReasoningParser,
    /// The text sent so far (after stop strings).
    text: String,
    /// The decoded text's length after each generated token.
    token_ends: Vec<usize>,
    /// Length of all the text decoded so far.
    decoded: usize,
    /// The tokens counted for good by earlier counts (a stream with
    /// continuous usage counts after every delta).
    tally: Cell<ReasoningTokenTally>,
}

impl ReasoningCount {
    fn new(parser: ReasoningParser) -> Self {
        ReasoningCount { parser, text: String::new(), token_ends: Vec::new(), decoded: 0, tally: Cell::default() }
    }

    fn count(&self, finished: bool) -> usize {
        let mut tally = self.tally.get();
        let count = self.parser.count_reasoning_tokens_since(&self.text, &self.token_ends, finished, &mut tally);
        self.tally.set(tally);
        count
    }
}

/// A running generation.
pub struct Generation {
    stream: RequestStream,
    decoder: Box<dyn TextDecoder>,
    stops: StopStrings,
    prompt_tokens: usize,
    clock: TokenClock,
    /// Set when the request asked for logprobs.
    scoring: Option<Box<Scoring>>,
    /// Set when the request asked for its token ids: every output with
    /// tokens makes a delta carrying them, as in vLLM.
    return_token_ids: bool,
    /// The text of the token that stopped generation in the engine is kept
    /// (`include_stop_str_in_output`).
    keep_stop: bool,
    /// vLLM's `stream_interval`: a delta goes out once this many tokens are
    /// unsent (and always with the first tokens and the finish).
    stream_interval: usize,
    /// Tokens received and not yet in a delta.
    unsent_tokens: usize,
    /// Whether a delta with tokens went out yet.
    sent_tokens: bool,
    /// What is held back until `stream_interval` tokens are unsent.
    held: Option<Delta>,
    /// Set when the request's output goes through a reasoning parser.
    reasoning: Option<Box<ReasoningCount>>,
}

impl Generation {
    /// Follows `stream`, decoding with `decoder` and stopping at `stop_strings`.
    pub fn new(
        stream: RequestStream,
        decoder: Box<dyn TextDecoder>,
        stop_strings: Vec<String>,
        prompt_tokens: usize,
        metrics: Arc<Metrics>,
        n: u32,
        started: Instant,
    ) -> Self {
        let clock = TokenClock::start(metrics, stream.engine(), stream.times(), n, started);
        Generation {
            stream,
            decoder,
            stops: StopStrings::new(stop_strings),
            prompt_tokens,
            clock,
            scoring: None,
            return_token_ids: false,
            keep_stop: false,
            stream_interval: 1,
            unsent_tokens: 0,
            sent_tokens: false,
            held: None,
            reasoning: None,
        }
    }

    /// Counts this generation's reasoning tokens, from now on, as `parser`
    /// classifies its text (`completion_tokens_details.reasoning_tokens`).
    pub fn count_reasoning(&mut self, parser: ReasoningParser) {
        self.reasoning = Some(Box::new(ReasoningCount::new(parser)));
    }

    /// This generation as the request's output options ask: stop strings and
    /// the stop token's text kept (`include_stop_str_in_output`, as vLLM's
    /// detokenizer keeps them), token ids on every delta (`return_token_ids`).
    pub fn with_output_options(mut self, include_stop_str_in_output: bool, return_token_ids: bool) -> Self {
        if include_stop_str_in_output {
            self.stops = std::mem::take(&mut self.stops).keeping_stop();
            self.keep_stop = true;
        }
        self.return_token_ids = return_token_ids;
        self
    }

    /// This generation streamed as vLLM's `--stream-interval N` streams: one
    /// delta per `interval` tokens (the first tokens and the finish at once),
    /// instead of one per engine output.
    pub fn with_stream_interval(mut self, interval: usize) -> Self {
        self.stream_interval = interval.max(1);
        self
    }

    /// This generation with its tokens' logprobs read into positions
    /// (decoded with `tokenizer`), for a request that asked for logprobs.
    pub fn with_logprobs(mut self, tokenizer: Arc<dyn Tokenizer>) -> Self {
        self.scoring = Some(Box::new(Scoring {
            sample: PositionReader::new(tokenizer.clone()),
            prompt: PositionReader::new(tokenizer),
        }));
        self
    }

    /// The token counts so far.
    pub fn usage(&self) -> Usage {
        let finished = self.clock.is_finished();
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.clock.generated(),
            total_tokens: self.prompt_tokens + self.clock.generated(),
            cached_tokens: self.clock.cached_tokens(),
            reasoning_tokens: self.reasoning.as_ref().map_or(0, |r| r.count(finished)),
        }
    }

    /// The token counts before any output: the prompt alone (what vLLM's
    /// continuous usage shows on a stream's opening chunk).
    pub fn usage_before_output(&self) -> Usage {
        Usage { prompt_tokens: self.prompt_tokens, total_tokens: self.prompt_tokens, ..Usage::default() }
    }

    /// The engine serving this generation.
    pub fn engine(&self) -> u32 {
        self.stream.engine()
    }

    /// The next delta (the final one carries the finish); `None` once
    /// finished. One delta per engine output that brought tokens or text (as
    /// vLLM streams: a token whose text is not complete yet makes a delta with
    /// empty text), or per `stream_interval` tokens.
    pub async fn next_delta(&mut self) -> Option<Result<Delta, GenerationError>> {
        self.next_delta_taking(Take::One).await
    }

    async fn next_delta_taking(&mut self, take: Take) -> Option<Result<Delta, GenerationError>> {
        while !self.clock.is_finished() {
            let (token_ids, finish_reason, stop_reason, logprobs) = match self.stream.recv(take).await {
                None => return Some(self.fail(GenerationError::Unavailable("the engine client stopped".into()))),
                Some(RequestEvent::Failed(reason)) => return Some(self.fail(GenerationError::Unavailable(reason))),
                Some(RequestEvent::Rejected(error)) => return Some(self.fail(GenerationError::Rejected(error))),
                Some(RequestEvent::Pooled(_)) => {
                    return Some(
                        self.fail(GenerationError::Unavailable("the engine pooled a generation request".into())),
                    )
                }
                Some(RequestEvent::Output { token_ids, finish_reason, stop_reason, logprobs }) => {
                    (token_ids, finish_reason, stop_reason, logprobs)
                }
            };
            self.clock.tokens(token_ids.len());
            if finish_reason == Some(FinishReason::Error) {
                return Some(self.fail(GenerationError::Engine));
            }
            let mut finish = finish_reason.map(|reason| Finish { reason, stop_reason });
            // As in vLLM, the token that stopped generation in the engine (EOS,
            // a stop token id) is counted but left out of the text.
            let decoded = match finish_reason {
                Some(FinishReason::Stop) if !self.keep_stop => &token_ids[..token_ids.len().saturating_sub(1)],
                _ => &token_ids[..],
            };
            let mut text = match &mut self.reasoning {
                None => self.decoder.push(decoded),
                Some(count) => {
                    // One token at a time, to know where each one's text ends.
                    let mut text = String::new();
                    for token in decoded {
                        text.push_str(&self.decoder.push(std::slice::from_ref(token)));
                        count.token_ends.push(count.decoded + text.len());
                    }
                    text
                }
            };
            if finish.is_some() {
                text.push_str(&self.decoder.flush());
            }
            if let Some(count) = &mut self.reasoning {
                // The stop token, not decoded, ends where the text does.
                count.decoded += text.len();
                count.token_ends.resize(count.token_ends.len().max(self.clock.generated()), count.decoded);
            }
            let (mut emit, matched) = self.stops.push(&text);
            if let Some(stop) = matched {
                self.stream.abort();
                finish = Some(Finish { reason: FinishReason::Stop, stop_reason: Some(StopReason::Text(stop)) });
            } else if finish.is_some() {
                emit.push_str(&self.stops.flush());
            }
            if let Some(count) = &mut self.reasoning {
                count.text.push_str(&emit);
            }
            if let Some(f) = &finish {
                self.clock.finish(f.reason);
            }
            let scored = match &mut self.scoring {
                Some(scoring) if !token_ids.is_empty() || logprobs.is_some() || finish.is_some() => {
                    Some(Box::new(scoring.read(&token_ids, logprobs)))
                }
                _ => None,
            };
            if token_ids.is_empty() && emit.is_empty() && finish.is_none() && scored.is_none() {
                continue;
            }
            self.unsent_tokens += token_ids.len();
            let token_ids = self.return_token_ids.then_some(token_ids);
            let delta = Delta { text: emit, finish, scored, token_ids };
            let delta = match self.held.take() {
                Some(held) => held.followed_by(delta),
                None => delta,
            };
            // vLLM's rule (OutputProcessor): send the first tokens, the finish,
            // and otherwise once `stream_interval` tokens are unsent.
            if delta.finish.is_some() || !self.sent_tokens || self.unsent_tokens >= self.stream_interval {
                self.sent_tokens |= self.unsent_tokens > 0;
                self.unsent_tokens = 0;
                return Some(Ok(delta));
            }
            self.held = Some(delta);
        }
        None
    }

    /// Runs to the end, returning the whole text and the finish.
    pub async fn collect(&mut self) -> Result<(String, Finish), GenerationError> {
        self.collect_whole().await.map(|whole| (whole.text, whole.finish))
    }

    /// Runs to the end, returning all of it, scored tokens included.
    pub async fn collect_whole(&mut self) -> Result<Whole, GenerationError> {
        let mut text = String::new();
        let mut scored: Option<Box<Scored>> = None;
        let mut token_ids: Option<Vec<u32>> = None;
        // Nobody sees the deltas one by one: take whatever arrived at once.
        while let Some(delta) = self.next_delta_taking(Take::All).await {
            let delta = delta?;
            text.push_str(&delta.text);
            if let Some(ids) = delta.token_ids {
                token_ids.get_or_insert_with(Vec::new).extend(ids);
            }
            if let Some(part) = delta.scored {
                match &mut scored {
                    None => scored = Some(part),
                    Some(whole) => Scoring::merge(whole, *part),
                }
            }
            if let Some(finish) = delta.finish {
                let token_ids = token_ids.or_else(|| self.return_token_ids.then(Vec::new));
                return Ok(Whole { text, finish, scored, token_ids });
            }
        }
        Err(GenerationError::Unavailable("the generation ended without a finish reason".into()))
    }

    fn fail(&mut self, error: GenerationError) -> Result<Delta, GenerationError> {
        self.clock.finish(FinishReason::Error);
        Err(error)
    }
}
