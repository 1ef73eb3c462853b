//! vLLM 0.33's scale-out schemas (`vllm/entrypoints/serve/disagg/protocol.py`):
//! `GenerateRequest` (what render answers and `/inference/v1/generate`
//! takes), `GenerateResponse`, and the derender requests.

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A rendered request, ready for `/inference/v1/generate` (vLLM's `GenerateRequest`).
#[derive(Debug, Serialize)]
pub struct RenderedRequest {
    /// The id the request will run under.
    pub request_id: String,
    /// The prompt's token ids.
    pub token_ids: Vec<u32>,
    /// Multimodal features: always null (no multimodal input here).
    pub features: Option<()>,
    /// The sampling parameters, by vLLM's `SamplingParams` names.
    pub sampling_params: Map<String, Value>,
    /// The model asked for.
    pub model: Option<String>,
    /// Whether the request asked to stream.
    pub stream: bool,
    /// Its stream options, when it streams.
    pub stream_options: Option<Map<String, Value>>,
    /// Prefix-cache salt: always null (none is taken here).
    pub cache_salt: Option<()>,
    /// Scheduling priority: always 0.
    pub priority: i64,
    /// KV transfer: always null.
    pub kv_transfer_params: Option<()>,
}

/// A `/inference/v1/generate` body as sent.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct GenerateBody {
    /// The id to run under (random when absent).
    pub request_id: Option<String>,
    /// The prompt's token ids (required).
    pub token_ids: Option<Vec<i64>>,
    /// vLLM's `SamplingParams` fields (required).
    pub sampling_params: Option<Map<String, Value>>,
    /// The model asked for.
    pub model: Option<String>,
    /// Refused: streamed token output is not served.
    pub stream: Option<bool>,
    /// Only with `stream`.
    pub stream_options: Option<IgnoredAny>,
    /// Refused when set: no multimodal input.
    pub features: Option<IgnoredAny>,
    /// Refused when set: prefix-cache salts are not served.
    pub cache_salt: Option<IgnoredAny>,
    /// Only 0 is served (no priority scheduling).
    pub priority: Option<i64>,
    /// Refused when set: no KV transfer.
    pub kv_transfer_params: Option<IgnoredAny>,
}

/// One choice of a generate answer (vLLM's `GenerateResponseChoice`).
#[derive(Debug, Serialize, Deserialize)]
pub struct GenerateChoice {
    /// The choice's index.
    pub index: u32,
    /// Logprobs: null (as the completion answer has them, when asked for).
    #[serde(default)]
    pub logprobs: Option<Value>,
    /// Why it ended.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// The generated token ids.
    #[serde(default)]
    pub token_ids: Option<Vec<u32>>,
}

/// A generate answer (vLLM's `GenerateResponse`).
#[derive(Debug, Serialize, Deserialize)]
pub struct GenerateResponse {
    /// The request's id.
    pub request_id: String,
    /// The served model name.
    #[serde(default)]
    pub model: Option<String>,
    /// When it was created (unix seconds).
    #[serde(default)]
    pub created: Option<u64>,
    /// The choices.
    pub choices: Vec<GenerateChoice>,
    /// Token counts, as the completions answer has them.
    #[serde(default)]
    pub usage: Option<Value>,
    /// Prompt logprobs, when asked for.
    #[serde(default)]
    pub prompt_logprobs: Option<Value>,
    /// KV transfer: null.
    #[serde(default)]
    pub kv_transfer_params: Option<Value>,
}

/// A `/v1/chat/completions/derender` body (vLLM's `DerenderChatRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct DerenderChatBody {
    /// Only false is served.
    pub stream: Option<bool>,
    /// The served name to report.
    pub model: Option<String>,
    /// The generate answer to turn into a chat answer (required).
    pub generate_response: Option<GenerateResponse>,
    /// The prompt's token count, for the usage.
    pub prompt_tokens: Option<u64>,
    /// The chat request that was rendered: its tools and options read the output.
    pub chat_request: Option<Map<String, Value>>,
}

/// A `/v1/completions/derender` body (vLLM's `DerenderCompletionRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct DerenderCompletionBody {
    /// Only false is served.
    pub stream: Option<bool>,
    /// The served name to report.
    pub model: Option<String>,
    /// One generate answer per prompt (required).
    pub generate_responses: Option<Vec<GenerateResponse>>,
    /// One prompt token count per answer.
    pub prompt_tokens: Option<Vec<u64>>,
    /// The completion request that was rendered: its decoding options apply.
    pub completion_request: Option<Map<String, Value>>,
}

/// An `/inference/v1/abort_requests` body.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct AbortBody {
    /// The ids of the requests to abort (required).
    pub request_ids: Option<Vec<String>>,
}
