//! Tokenization in the frontend: prompts to token ids, generated ids back to
//! text (streaming, never splitting a UTF-8 character), and chat templates.

pub mod byte_level;
pub mod chat_template;
pub mod hf;
pub mod incremental;

use anyhow::Result;

/// One chat message, its content already flattened to text.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The text of the message.
    pub content: String,
}

/// A tokenizer as the server uses it.
pub trait Tokenizer: Send + Sync {
    /// Token ids of `text`; `add_special_tokens` adds what the model's tokenizer
    /// adds around a text (BOS...): true for raw prompts, false for chat
    /// prompts, whose template writes them.
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>>;
    /// A fresh streaming decoder for one request.
    fn decoder(&self) -> Box<dyn TextDecoder>;
    /// The end-of-sequence token, if the tokenizer has one (the generation
    /// config may name more stop tokens: `generation_config.rs`).
    fn eos_token_id(&self) -> Option<u32>;
    /// Number of token ids (valid ids are `0..vocab_size`).
    fn vocab_size(&self) -> usize;
    /// The prompt text for `messages`; errors are the client's fault (HTTP 400).
    fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, String>;
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
    config: &crate::config::ServerConfig,
    hub: &crate::model_files::HubCache,
) -> Result<std::sync::Arc<dyn Tokenizer>, crate::error::ExitError> {
    let (key, location) = match &config.tokenizer {
        Some(tokenizer) => ("tokenizer", tokenizer.as_str()),
        None if byte_level::BUILTIN_MODELS.contains(&config.model_tag.as_str()) => {
            return Ok(std::sync::Arc::new(byte_level::ByteLevelTokenizer));
        }
        None => ("model_tag", config.model_tag.as_str()),
    };
    let files = &config.model_files;
    let path = if std::path::Path::new(location).exists() {
        std::path::PathBuf::from(location)
    } else {
        let revision = files.tokenizer_revision.as_deref().or(files.revision.as_deref());
        hub.locate(location, revision).map_err(|e| {
            crate::error::ExitError::usage(format!(
                "--args-json: `{key}`: {e}; built-in models: {}",
                byte_level::BUILTIN_MODELS.join(", ")
            ))
        })?
    };
    match hf::HfTokenizer::load(&path) {
        Ok(tokenizer) => {
            tracing::info!("tokenizer: {}", path.display());
            Ok(std::sync::Arc::new(tokenizer))
        }
        Err(e) => Err(crate::error::ExitError::usage(format!(
            "--args-json: `{key}` {location:?}: no usable tokenizer.json ({e:#}); built-in models: {}",
            byte_level::BUILTIN_MODELS.join(", ")
        ))),
    }
}
