//! The `/v1/chat/completions` request as sent, as read and checked, and as
//! prepared for the engine.

use crate::http::generation::tools::{ChatTools, ToolsInput};
use crate::http::sampling::{CommonParams, SamplingRequest};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{Map, Value};
use vllm_rs_chat::ChatMessage;

/// A chat request whose parameters are all read and checked.
#[derive(Debug)]
pub struct ChatRequest {
    /// The parameters shared with completions.
    pub common: CommonParams,
    /// The conversation, each content flattened to text.
    pub messages: Vec<ChatMessage>,
    /// End the prompt with the assistant's turn (false by default with
    /// `continue_final_message`, as vLLM's frontend reads an omitted value).
    pub add_generation_prompt: bool,
    /// Leave the final message open for the model to continue.
    pub continue_final_message: bool,
    /// Put the last message before the answer when it has the answer's role.
    pub echo: bool,
    /// The request's own chat template (`chat_template`), served only when the server trusts it.
    pub chat_template: Option<String>,
    /// The requested reasoning effort (`reasoning_effort`), before the server's map.
    pub reasoning_effort: Option<String>,
    /// The tool fields, read with the server's options by [`read_chat_tools`](crate::http::generation::tools::read_chat_tools).
    pub tools: ToolsInput,
    /// The request's `chat_template_kwargs`, merged over the server's by [`read_template_kwargs`](crate::http::generation::template_kwargs::read_template_kwargs).
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// One message as sent.
#[derive(Debug, Deserialize)]
pub struct MessageInput {
    pub(super) role: String,
    #[serde(default)]
    pub(super) content: Option<ContentInput>,
    /// The other fields: what templates get beyond role and content (see [`template_extra`](crate::http::generation::tools::template_extra)).
    #[serde(flatten)]
    pub(super) extra: Map<String, Value>,
}

/// A message's content: text, or a list of parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum ContentInput {
    Text(String),
    Parts(Vec<PartInput>),
}

/// One content part; only text parts are supported.
#[derive(Debug, Deserialize)]
pub(super) struct PartInput {
    #[serde(rename = "type")]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) text: Option<String>,
}

/// A `/v1/chat/completions` body as sent: the shared sampling fields and [`ChatFields`].
pub type ChatBody = SamplingRequest<ChatFields>;

/// The fields of a `/v1/chat/completions` body its own, as sent (the sampling fields aside).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ChatFields {
    /// The conversation.
    pub messages: Option<Vec<MessageInput>>,
    /// The token limit; wins over `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    /// Return logprobs of the generated tokens.
    pub logprobs: Option<bool>,
    /// Top logprobs per generated token (with `logprobs`).
    pub top_logprobs: Option<i64>,
    /// Functions the model may call.
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or a named function.
    pub tool_choice: Option<Value>,
    /// Let the model call several functions at once (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `json_object` / `json_schema`: a structured-outputs constraint.
    pub response_format: Option<Map<String, Value>>,
    /// vLLM's structured-outputs constraint.
    pub structured_outputs: Option<Map<String, Value>>,
    /// End the prompt with the assistant's turn.
    pub add_generation_prompt: Option<bool>,
    /// Leave the final message open for the model to continue.
    pub continue_final_message: Option<bool>,
    /// The reasoning effort the template gets.
    pub reasoning_effort: Option<Value>,
    /// Put the last message before the answer.
    pub echo: Option<bool>,
    /// The request's own chat template.
    pub chat_template: Option<String>,
    /// Variables for the chat template.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Refused: there is no multimodal processor here.
    pub mm_processor_kwargs: Option<IgnoredAny>,
}

/// A chat request checked, its prompt rendered by the chat template and
/// tokenized: what answering it, rendering it (`/v1/chat/completions/render`)
/// and counting its tokens (`/v1/messages/count_tokens`) share.
pub struct PreparedChat {
    /// The checked request.
    pub request: ChatRequest,
    /// Its tools and `tool_choice`, read with the server's options.
    pub tools: ChatTools,
    /// The chat template's variables: the server's defaults, the request's, the reasoning effort.
    pub template_kwargs: Map<String, Value>,
    /// The prompt's token ids.
    pub prompt_token_ids: Vec<u32>,
}
