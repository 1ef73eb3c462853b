//! Answering a submitted completion or chat request: a server-sent-event
//! stream, or one JSON body once the generation finished.

use crate::http::error::ApiError;
use crate::http::generation::failure::generation_error;
use crate::http::generation::sse::{choices_sse_response, sse_response, ChunkHeader, ChunkWriter, StreamUsage};
use crate::http::generation::submit::{stop_reason_json, Submitted};
use crate::http::generation::usage::UsageInfo;
use crate::http::sampling::CommonParams;
use crate::http::state::AppState;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::try_join_all;
use serde::{Serialize, Serializer};
use serde_json::value::{to_raw_value, RawValue};
use vllm_rs_generate::{Generation, Usage, Whole};

/// A JSON object written with its keys in the order they were put (values
/// already JSON: logprobs are written as the Python server writes them).
#[derive(Default)]
pub struct Fields(Vec<(&'static str, Box<RawValue>)>);

impl Fields {
    /// Adds `key` with `value` serialized.
    pub fn put(&mut self, key: &'static str, value: &impl Serialize) {
        self.0.push((key, to_raw_value(value).expect("answer fields serialize")));
    }

    /// Adds `key` with JSON text `value` (`null` when `None`).
    pub fn put_raw(&mut self, key: &'static str, value: Option<Box<RawValue>>) {
        match value {
            Some(raw) => self.0.push((key, raw)),
            None => self.put(key, &()),
        }
    }
}

impl Serialize for Fields {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// What one endpoint puts in a whole (unstreamed) choice between `index` and
/// `finish_reason`, after `token_ids`, and `prompt_logprobs` for the
/// response itself (chat).
pub struct ChoiceBody {
    /// The choice's own fields (text or message, logprobs, ...).
    pub fields: Fields,
    /// The fields after `token_ids` (completions: `prompt_logprobs`, `prompt_token_ids`).
    pub tail: Fields,
    /// `prompt_logprobs` on the response, when it goes there.
    pub response_prompt_logprobs: Option<Box<RawValue>>,
}

/// What a whole chat answer has on the response itself, null when not asked for.
#[derive(Debug, Serialize)]
pub struct ChatExtras {
    /// The prompt's logprobs (`prompt_logprobs`).
    pub prompt_logprobs: Option<Box<RawValue>>,
    /// The prompt's token ids (`return_token_ids`).
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// A whole (unstreamed) answer, in vLLM's key order.
#[derive(Serialize)]
pub struct WholeAnswer<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<Fields>,
    /// Always null: responses carry no fingerprint.
    system_fingerprint: Option<&'a str>,
    usage: UsageInfo,
    #[serde(flatten)]
    chat: Option<ChatExtras>,
}

/// How one endpoint shapes its answers.
pub struct AnswerFormat<MakeWriter, Content> {
    /// `object` of the whole answer.
    pub object: &'static str,
    /// `object` of each streamed chunk.
    pub chunk_object: &'static str,
    /// Makes the chunk writer of one choice of a stream: (header, index).
    pub writer: MakeWriter,
    /// The body of the whole choice.
    pub content: Content,
    /// Chat: `prompt_logprobs` and `prompt_token_ids` go on the response.
    pub chat: bool,
}

/// Where a stream of `common` carries usage, as vLLM's `should_include_usage`
/// decides: as the request asks, or everywhere when the server forces it
/// (`enable_force_include_usage`); with prompt details as the server says.
pub fn stream_usage(state: &AppState, common: &CommonParams) -> StreamUsage {
    let forced = state.config.enable_force_include_usage;
    StreamUsage {
        last: forced || common.include_usage,
        continuous: forced || common.continuous_usage,
        prompt_details: state.config.enable_prompt_tokens_details,
    }
}

/// Streams `submitted` or waits for it and answers in one body; a stream
/// carries usage where `usage` says.
pub async fn answer<W, MakeWriter, Content>(
    state: &AppState,
    mut submitted: Submitted,
    stream: bool,
    usage: StreamUsage,
    mut format: AnswerFormat<MakeWriter, Content>,
) -> Result<Response, ApiError>
where
    W: ChunkWriter,
    MakeWriter: FnMut(ChunkHeader, u32) -> W,
    Content: FnMut(Whole) -> ChoiceBody,
{
    let model = state.config.primary_model_name().to_string();
    if stream {
        let header = ChunkHeader::new(&submitted.id, format.chunk_object, submitted.created, &model);
        return Ok(stream_choices(submitted.generation, submitted.more_choices, header, usage, format.writer).await);
    }
    let mut response_prompt_logprobs = None;
    let (choices, usage) = whole_choices(&mut submitted, |index, mut whole| {
        let finish = whole.finish.clone();
        let token_ids = whole.token_ids.take();
        let body = (format.content)(whole);
        if response_prompt_logprobs.is_none() {
            response_prompt_logprobs = body.response_prompt_logprobs;
        }
        let mut choice = Fields::default();
        choice.put("index", &index);
        choice.0.extend(body.fields.0);
        choice.put("finish_reason", &finish.reason.as_str());
        choice.put("stop_reason", &stop_reason_json(&finish.stop_reason));
        choice.put("token_ids", &token_ids);
        choice.0.extend(body.tail.0);
        choice
    })
    .await?;
    let chat = format.chat.then(|| ChatExtras {
        prompt_logprobs: response_prompt_logprobs,
        prompt_token_ids: submitted.prompt_token_ids.take(),
    });
    let usage = UsageInfo::of(usage, state.config.enable_prompt_tokens_details);
    Ok(Json(whole_answer(&submitted, format.object, &model, choices, usage, chat)).into_response())
}

/// The body of a whole answer holding `choices`; `chat` (chat only) puts
/// `prompt_logprobs` and `prompt_token_ids` on the response itself.
pub fn whole_answer<'a>(
    submitted: &'a Submitted,
    object: &'static str,
    model: &'a str,
    choices: Vec<Fields>,
    usage: UsageInfo,
    chat: Option<ChatExtras>,
) -> WholeAnswer<'a> {
    WholeAnswer {
        id: &submitted.id,
        object,
        created: submitted.created,
        model,
        choices,
        system_fingerprint: None,
        usage,
        chat,
    }
}

/// Streams the choices of a request (`first`, then `more`, as `Submitted`
/// holds them), each through the writer `writer(header, index)` makes.
pub async fn stream_choices<W: ChunkWriter>(
    first: Generation,
    more: Vec<Generation>,
    header: ChunkHeader,
    usage: StreamUsage,
    mut writer: impl FnMut(ChunkHeader, u32) -> W,
) -> Response {
    if more.is_empty() {
        return sse_response(first, writer(header, 0), usage).await;
    }
    let mut generations = more;
    generations.insert(0, first);
    let writers = (0..generations.len() as u32).map(|index| writer(header.clone(), index)).collect();
    choices_sse_response(generations, writers, usage)
}

/// Runs every choice of `submitted` to its end, concurrently, and makes each
/// one's body with `choice(index, whole)`: the choices by index and the
/// usage of all of them. The first failure fails the whole answer (the
/// other choices are aborted when `submitted` is dropped).
pub async fn whole_choices<T>(
    submitted: &mut Submitted,
    mut choice: impl FnMut(u32, Whole) -> T,
) -> Result<(Vec<T>, Usage), ApiError> {
    if submitted.more_choices.is_empty() {
        let whole = submitted.generation.collect_whole().await.map_err(|e| generation_error(&e))?;
        return Ok((vec![choice(0, whole)], submitted.generation.usage()));
    }
    let generations = std::iter::once(&mut submitted.generation).chain(submitted.more_choices.iter_mut());
    let wholes = try_join_all(generations.map(Generation::collect_whole)).await.map_err(|e| generation_error(&e))?;
    let choices = wholes.into_iter().zip(0..).map(|(whole, index)| choice(index, whole)).collect();
    let mut usage = Usage::default();
    for generation in std::iter::once(&submitted.generation).chain(&submitted.more_choices) {
        usage.add_choice(generation.usage());
    }
    Ok((choices, usage))
}
