//! The request and response bodies of the pooling routes, with vLLM 0.33's
//! field names: `/v1/embeddings`, `/pooling`, `/classify`, `/score`,
//! `/rerank`, and Cohere's `/v2/embed`.

use crate::http::routes::openai::chat_completions::types::MessageInput;
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
    /// Removed in vLLM 0.33 (`use_activation` replaces it): refused with vLLM's 400.
    pub normalize: Option<IgnoredAny>,
    /// Apply the pooler's activation: L2-normalize an embedding, the
    /// classifier's sigmoid or softmax (None: the model's default).
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
    /// The most likely class's name: its `id2label` entry, else `LABEL_<n>`.
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

/// A `/v2/embed` body (vLLM's `CohereEmbedRequest`): exactly one of
/// `texts`, `images` and `inputs`, non-empty.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CohereEmbedRequest {
    /// A served model name, when given.
    pub model: Option<String>,
    /// A task whose instruction prefixes the texts (`search_query`, ...).
    pub input_type: Option<String>,
    /// Texts to embed, echoed back in the answer.
    pub texts: Option<Vec<String>>,
    /// Images (data URIs or URLs) to embed.
    pub images: Option<Vec<String>>,
    /// Inputs of text and image parts, each rendered as one chat message.
    pub inputs: Option<Vec<CohereEmbedInput>>,
    /// Matryoshka output size (models that allow it).
    pub output_dimension: Option<i64>,
    /// The encodings to answer (absent or empty: `float`).
    pub embedding_types: Option<Vec<CohereEmbeddingType>>,
    /// Which end of a too-long input is cut (default `END`).
    pub truncate: CohereTruncate,
    /// The most tokens an input may keep (absent: the model length).
    pub max_tokens: Option<i64>,
    /// The scheduling priority: accepted, as vLLM's default scheduler ignores it.
    pub priority: Option<IgnoredAny>,
}

/// One of `/v2/embed`'s encodings of an embedding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CohereEmbeddingType {
    /// The floats.
    Float,
    /// One bit per value (set when >= 0), packed MSB-first, each byte less 128.
    Binary,
    /// One bit per value, packed MSB-first, each byte as is.
    Ubinary,
    /// Base64 of the little-endian float32 bytes.
    Base64,
}

/// `/v2/embed`'s `truncate`: where a too-long input is cut.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum CohereTruncate {
    /// Never: a too-long input is refused.
    None,
    /// Drop its first tokens.
    Start,
    /// Drop its last tokens.
    #[default]
    End,
}

/// One `/v2/embed` input of several parts.
#[derive(Debug, Deserialize)]
pub struct CohereEmbedInput {
    /// Its parts, in order.
    pub content: Vec<CohereEmbedContent>,
}

/// One part of a `/v2/embed` input.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CohereEmbedContent {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// An image.
    ImageUrl {
        /// Where it is (`url`).
        image_url: Map<String, Value>,
    },
}

/// The `/v2/embed` answer (vLLM's `CohereEmbedResponse`).
#[derive(Debug, Serialize)]
pub struct CohereEmbedResponse {
    /// `embd-` and the request id.
    pub id: String,
    /// The embeddings in each requested encoding.
    pub embeddings: CohereEmbeddings,
    /// The request's `texts`, when it sent texts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub texts: Option<Vec<String>>,
    /// The API version and the tokens billed.
    pub meta: CohereMeta,
    /// Always `embeddings_by_type`.
    pub response_type: &'static str,
}

/// The embeddings by encoding, each present only when requested.
#[derive(Debug, Default, PartialEq, Serialize)]
pub struct CohereEmbeddings {
    /// The floats.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub float: Option<Vec<Value>>,
    /// Packed bits, signed bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binary: Option<Vec<Vec<i16>>>,
    /// Packed bits, unsigned bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ubinary: Option<Vec<Vec<u8>>>,
    /// Base64 of the little-endian float32 bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<Vec<Value>>,
}

/// `/v2/embed`'s `meta`.
#[derive(Debug, Serialize)]
pub struct CohereMeta {
    /// Always version `2`.
    pub api_version: CohereApiVersion,
    /// The tokens pooled.
    pub billed_units: CohereBilledUnits,
}

/// `meta.api_version`.
#[derive(Debug, Serialize)]
pub struct CohereApiVersion {
    /// Always `2`.
    pub version: &'static str,
}

/// `meta.billed_units`.
#[derive(Debug, Serialize)]
pub struct CohereBilledUnits {
    /// Text tokens pooled.
    pub input_tokens: usize,
    /// Image tokens pooled: always 0, as images are refused here.
    pub image_tokens: usize,
}
