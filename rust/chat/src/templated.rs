//! A tokenizer whose chat template is replaced (`chat_template`) or rendered
//! with another content format (`chat_template_content_format`); everything
//! else is the model's tokenizer's.

use super::chat_template::ChatTemplate;
use super::{ChatMessage, ChatTemplateError, DecodeOptions, TextDecoder, Tokenizer};
use anyhow::Result;
use std::sync::Arc;
use vllm_rs_config::error::ExitError;
use vllm_rs_config::ChatOptions;

/// `inner` with `template` for chat prompts.
pub struct TemplatedTokenizer {
    inner: Arc<dyn Tokenizer>,
    template: ChatTemplate,
}

/// `base` as the chat options want it: unchanged unless they name a template
/// or a content format. A template that does not compile is a usage error.
pub fn with_chat_options(base: Arc<dyn Tokenizer>, options: &ChatOptions) -> Result<Arc<dyn Tokenizer>, ExitError> {
    let source = match (&options.template, options.content_format) {
        (Some(source), _) => source.clone(),
        (None, Some(_)) => match base.chat_template_source() {
            Some(source) => source.to_owned(),
            None => return Ok(base),
        },
        (None, None) => return Ok(base),
    };
    let (bos, eos) = base.template_tokens();
    let template = ChatTemplate::new(source, bos, eos)
        .map_err(|e| ExitError::usage(format!("--args-json: `chat_template` does not compile: {e}")))?
        .with_content_format(options.content_format);
    tracing::info!(
        "chat template: {} (content format {:?})",
        if options.template.is_some() { "from chat_template" } else { "the model's" },
        template.content_format()
    );
    Ok(Arc::new(TemplatedTokenizer { inner: base, template }))
}

impl Tokenizer for TemplatedTokenizer {
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.inner.encode(text, add_special_tokens)
    }

    fn encode_pair(&self, first: &str, second: &str) -> Result<(Vec<u32>, usize)> {
        self.inner.encode_pair(first, second)
    }

    fn decoder(&self, prompt: &[u32], options: DecodeOptions) -> Box<dyn TextDecoder> {
        self.inner.decoder(prompt, options)
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids)
    }

    fn token_strings(&self, ids: &[u32]) -> Vec<String> {
        self.inner.token_strings(ids)
    }

    fn eos_token_id(&self) -> Option<u32> {
        self.inner.eos_token_id()
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.template.render(messages, add_generation_prompt)
    }

    fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ChatTemplateError> {
        self.template.render_with_tools(messages, add_generation_prompt, tools, kwargs)
    }

    fn template_tokens(&self) -> (String, String) {
        self.inner.template_tokens()
    }
}
