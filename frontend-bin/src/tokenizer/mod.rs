//! Tokenization in the frontend: prompts to token ids, generated ids back to
//! text (streaming, never splitting a UTF-8 character), and chat templates.

pub mod byte_level;

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
    /// Token ids of `text` (no special tokens added beyond what the model's tokenizer adds).
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    /// A fresh streaming decoder for one request.
    fn decoder(&self) -> Box<dyn TextDecoder>;
    /// The end-of-sequence token, if the tokenizer has one.
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
/// model names, else a Hugging Face `tokenizer.json`.
pub fn load_tokenizer(config: &crate::config::ServerConfig) -> Result<std::sync::Arc<dyn Tokenizer>, crate::error::ExitError> {
    if config.tokenizer.is_none() && byte_level::BUILTIN_MODELS.contains(&config.model_tag.as_str()) {
        return Ok(std::sync::Arc::new(byte_level::ByteLevelTokenizer));
    }
    Err(crate::error::ExitError::usage(format!(
        "--args-json: `model_tag` {:?} is not a built-in model ({}) and Hugging Face tokenizers are not available",
        config.model_tag,
        byte_level::BUILTIN_MODELS.join(", ")
    )))
}
