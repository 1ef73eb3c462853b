//! Tokenization in the frontend: prompts to token ids, generated ids back to
//! text (streaming, never splitting a UTF-8 character), and chat templates.

pub mod byte_level;
pub mod chat_template;
pub mod hf;
pub mod incremental;
pub mod templated;
pub mod token_bytes;

use anyhow::Result;

/// Why messages could not be turned into a prompt; the client's fault (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The tokenizer has no chat template.
    #[error("the tokenizer at {} has no chat template", .0.display())]
    Missing(std::path::PathBuf),
    /// The template failed (`raise_exception`, a syntax error, an undefined value ...).
    #[error("{0}")]
    Render(#[from] minijinja::Error),
}

/// One chat message, its content already flattened to text.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The text of the message.
    pub content: String,
    /// What templates get beyond role and content: `name`, `tool_call_id`,
    /// `tool_calls` (arguments read into objects, as vLLM passes them).
    pub extra: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A tokenizer as the server uses it.
pub trait Tokenizer: Send + Sync {
    /// Token ids of `text`; `add_special_tokens` adds what the model's tokenizer
    /// adds around a text (BOS...): true for raw prompts, false for chat
    /// prompts, whose template writes them.
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>>;
    /// A fresh streaming decoder for one request whose prompt is `prompt`:
    /// generated text is decoded in the prompt's context, as vLLM does.
    fn decoder(&self, prompt: &[u32], options: DecodeOptions) -> Box<dyn TextDecoder>;
    /// The whole text of `ids` with special tokens kept, as vLLM's
    /// `tokenizer.decode` gives it (`/detokenize`).
    fn decode(&self, ids: &[u32]) -> Result<String>;
    /// Each id's token as the vocabulary writes it (vLLM's
    /// `convert_ids_to_tokens`, `/tokenize` with `return_token_strs`).
    fn token_strings(&self, ids: &[u32]) -> Vec<String>;
    /// The end-of-sequence token, if the tokenizer has one (the generation
    /// config may name more stop tokens: `generation_config.rs`).
    fn eos_token_id(&self) -> Option<u32>;
    /// Number of token ids (valid ids are `0..vocab_size`).
    fn vocab_size(&self) -> usize;
    /// The prompt text for `messages`; errors are the client's fault (HTTP 400).
    fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError>;
    /// The prompt for `messages` with the request's `tools` and checked
    /// `chat_template_kwargs` (as vLLM passes them to templates); templates
    /// that cannot show tools ignore them, and a template gets only the
    /// kwargs it reads (the built-in one reads none).
    fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        _tools: Option<&serde_json::Value>,
        _kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ChatTemplateError> {
        self.apply_chat_template(messages, add_generation_prompt)
    }
    /// Token ids of a text pair as the tokenizer joins them (a cross-encoder's
    /// query and document, special tokens added), and where the second
    /// text's tokens start (token type 1 from there on).
    fn encode_pair(&self, _first: &str, _second: &str) -> Result<(Vec<u32>, usize)> {
        Err(anyhow::anyhow!("this tokenizer cannot encode text pairs"))
    }
    /// The text of the model's own chat template, when it has one in that form.
    fn chat_template_source(&self) -> Option<&str> {
        None
    }
    /// The BOS and EOS token texts a chat template may print.
    fn template_tokens(&self) -> (String, String) {
        (String::new(), String::new())
    }
}

/// How a request's generated ids become text (vLLM's sampling parameters
/// of the same names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Leave special tokens (BOS, EOS, ...) out of the text.
    pub skip_special_tokens: bool,
    /// With special tokens kept: whether adjacent added tokens are separated
    /// as the tokenizer's decoder does (false joins them as written).
    pub spaces_between_special_tokens: bool,
}

impl Default for DecodeOptions {
    /// vLLM's defaults: both true.
    fn default() -> Self {
        DecodeOptions { skip_special_tokens: true, spaces_between_special_tokens: true }
    }
}

/// Turns a stream of generated token ids into text pieces.
pub trait TextDecoder: Send {
    /// Adds `ids`; returns the text that is now complete (possibly empty).
    fn push(&mut self, ids: &[u32]) -> String;
    /// The stream ended: returns whatever is still held back.
    fn flush(&mut self) -> String;
}

/// The tokenizer for `config`: the built-in byte-level one for the built-in
/// model names, else the Hugging Face tokenizer of the `tokenizer` key or of
/// the model: a directory or `tokenizer.json` file, else the model's snapshot
/// in the hub cache (at `tokenizer_revision`, else `revision`). A tokenizer
/// that cannot be found or loaded is a usage error naming the key it came from.
pub fn load_tokenizer(
    config: &vllm_rs_config::ServerConfig,
    hub: &vllm_rs_model_files::HubCache,
) -> Result<std::sync::Arc<dyn Tokenizer>, vllm_rs_config::error::ExitError> {
    let (key, location) = match &config.tokenizer {
        Some(tokenizer) => ("tokenizer", tokenizer.as_str()),
        None if vllm_rs_model_files::BUILTIN_MODELS.contains(&config.model_tag.as_str()) => {
            return templated::with_chat_options(std::sync::Arc::new(byte_level::ByteLevelTokenizer), &config.chat);
        }
        None => ("model_tag", config.model_tag.as_str()),
    };
    let files = &config.model_files;
    let path = if std::path::Path::new(location).exists() {
        std::path::PathBuf::from(location)
    } else {
        let revision = files.tokenizer_revision.as_deref().or(files.revision.as_deref());
        hub.locate(location, revision).map_err(|e| {
            vllm_rs_config::error::ExitError::usage(format!(
                "--args-json: `{key}`: {e}; built-in models: {}",
                vllm_rs_model_files::BUILTIN_MODELS.join(", ")
            ))
        })?
    };
    match hf::HfTokenizer::load(&path) {
        Ok(tokenizer) => {
            tracing::info!("tokenizer: {}", path.display());
            templated::with_chat_options(std::sync::Arc::new(tokenizer), &config.chat)
        }
        Err(e) => Err(vllm_rs_config::error::ExitError::usage(format!(
            "--args-json: `{key}` {location:?}: no usable tokenizer.json ({e:#}); built-in models: {}",
            vllm_rs_model_files::BUILTIN_MODELS.join(", ")
        ))),
    }
}
