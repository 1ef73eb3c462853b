//! The request and response bodies of the pooling routes, with vLLM 0.33's
//! field names: `/v1/embeddings`, `/pooling`, `/classify`, `/score` and
//! `/rerank`.

use super::super::chat::MessageInput;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What `input` may hold: a text, texts, token ids, or lists of token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PoolInput {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<i64>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<i64>>),
}

/// `/v1/embeddings`, `/pooling` and `/classify` bodies: vLLM's completion
/// form (`input`) or chat form (`messages`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PoolRequest {
    /// A served model name, when given.
    pub model: Option<String>,
    /// The inputs (completion form).
    pub input: Option<PoolInput>,
    /// One chat conversation, rendered with the chat template (chat form).
    pub messages: Option<Vec<MessageInput>>,
    /// `float` (default) or `base64` (little-endian float32 bytes).
    pub encoding_format: Option<String>,
    /// Matryoshka output size (models that allow it).
    pub dimensions: Option<i64>,
    /// Keep this many tokens (-1: the model length).
    pub truncate_prompt_tokens: Option<i64>,
    /// L2-normalize the embeddings (None: the model's default).
    pub normalize: Option<bool>,
    /// Apply the classifier's activation (None: the model's default).
    pub use_activation: Option<bool>,
    /// Add the tokenizer's special tokens (default: true for `input`, false for `messages`).
    pub add_special_tokens: Option<bool>,
    /// Chat form: end the rendered prompt with the assistant's turn.
    pub add_generation_prompt: Option<bool>,
    /// Chat form: variables for the chat template.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// The id to answer with (an `X-Request-Id` header wins).
    pub request_id: Option<String>,
    /// `/pooling`: the task (`embed` or `classify`; default: the model's).
    pub task: Option<String>,
    /// OpenAI's end-user id: accepted, not used.
    pub user: Option<IgnoredAny>,
}

/// One text, or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum TextOrTexts {
    /// One text.
    One(String),
    /// Several texts.
    Many(Vec<String>),
}

/// A `/score` body: texts paired one to one, or one with each of the others.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ScoreRequest {
    /// A served model name, when given.
    pub model: Option<String>,
    /// The first texts (`queries` is its other name).
    #[serde(alias = "queries")]
    pub text_1: Option<TextOrTexts>,
    /// The second texts (`documents` is its other name).
    #[serde(alias = "documents")]
    pub text_2: Option<TextOrTexts>,
    /// Keep this many tokens of each input (-1: the model length).
    pub truncate_prompt_tokens: Option<i64>,
    /// Apply a cross-encoder's activation (None: the model's default).
    pub use_activation: Option<bool>,
    /// The id to answer with.
    pub request_id: Option<String>,
}

/// A `/rerank` body.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RerankRequest {
    /// A served model name, when given.
    pub model: Option<String>,
    /// What the documents are ranked for.
    pub query: Option<String>,
    /// The documents.
    pub documents: Option<Vec<String>>,
    /// Answer the best `top_n` (0 or absent: all).
    pub top_n: Option<i64>,
    /// Include each document's text in its result (default true).
    pub return_documents: Option<bool>,
    /// Keep this many tokens of each input (-1: the model length).
    pub truncate_prompt_tokens: Option<i64>,
    /// Apply a cross-encoder's activation (None: the model's default).
    pub use_activation: Option<bool>,
    /// The id to answer with.
    pub request_id: Option<String>,
}

/// vLLM's `UsageInfo` of a pooling answer: prompt tokens only.
#[derive(Debug, Serialize)]
pub struct Usage {
    /// Tokens of every input.
    pub prompt_tokens: usize,
    /// The same: nothing is generated.
    pub total_tokens: usize,
    /// Always 0.
    pub completion_tokens: usize,
    /// Not reported.
    pub prompt_tokens_details: Option<()>,
}

impl Usage {
    /// The usage of `prompt_tokens` input tokens.
    pub fn of(prompt_tokens: usize) -> Self {
        Usage { prompt_tokens, total_tokens: prompt_tokens, completion_tokens: 0, prompt_tokens_details: None }
    }
}

/// The list answer of `/v1/embeddings`, `/pooling`, `/classify` and `/score`.
#[derive(Debug, Serialize)]
pub struct ListResponse<T> {
    /// `embd-`, `pool-`, `classify-` or `score-` and the request id.
    pub id: String,
    /// Always `list`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// One item per input (per pair for `/score`), in input order.
    pub data: Vec<T>,
    /// Token counts.
    pub usage: Usage,
}

/// One embedding: a float list or base64 of little-endian float32.
#[derive(Debug, Serialize)]
pub struct EmbeddingData {
    /// The input's index.
    pub index: usize,
    /// Always `embedding`.
    pub object: &'static str,
    /// The vector.
    pub embedding: Value,
}

/// One `/pooling` result.
#[derive(Debug, Serialize)]
pub struct PoolingData {
    /// The input's index.
    pub index: usize,
    /// Always `pooling`.
    pub object: &'static str,
    /// The pooled vector.
    pub data: Value,
}

/// One `/classify` result.
#[derive(Debug, Serialize)]
pub struct ClassifyData {
    /// The input's index.
    pub index: usize,
    /// The most likely class's label (`LABEL_<n>`).
    pub label: String,
    /// Each class's score.
    pub probs: Vec<f32>,
    /// How many classes.
    pub num_classes: usize,
}

/// One `/score` result.
#[derive(Debug, Serialize)]
pub struct ScoreData {
    /// The pair's index.
    pub index: usize,
    /// Always `score`.
    pub object: &'static str,
    /// The pair's score.
    pub score: f32,
}

/// The `/rerank` answer (vLLM's `RerankResponse`).
#[derive(Debug, Serialize)]
pub struct RerankResponse {
    /// `rerank-` and the request id.
    pub id: String,
    /// The served model name.
    pub model: String,
    /// Token counts.
    pub usage: Usage,
    /// The documents, best first.
    pub results: Vec<RerankResult>,
}

/// One ranked document.
#[derive(Debug, Serialize)]
pub struct RerankResult {
    /// The document's index in the request.
    pub index: usize,
    /// Its text, unless `return_documents` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<RerankDocument>,
    /// Its score for the query.
    pub relevance_score: f32,
}

/// A ranked document's text.
#[derive(Debug, Serialize)]
pub struct RerankDocument {
    /// The text.
    pub text: String,
}
