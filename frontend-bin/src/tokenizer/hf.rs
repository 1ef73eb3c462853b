//! Hugging Face tokenizers: `tokenizer.json` through the `tokenizers` crate,
//! special tokens and the chat template from `tokenizer_config.json`.

use super::chat_template::{special_token, template_source, ChatTemplate};
use super::incremental::IncrementalDecoder;
use super::{ChatMessage, TextDecoder, Tokenizer};
use anyhow::{anyhow, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A model's Hugging Face tokenizer.
pub struct HfTokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    eos_token_id: Option<u32>,
    chat_template: Option<ChatTemplate>,
    source: PathBuf,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            Ok(Some(serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))?))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

impl HfTokenizer {
    /// Loads from `location`: a directory holding `tokenizer.json` (and
    /// optionally `tokenizer_config.json`), or a
    /// `tokenizer.json` file itself.
    pub fn load(location: &Path) -> Result<Self> {
        let (dir, file) = if location.is_dir() {
            (location.to_path_buf(), location.join("tokenizer.json"))
        } else {
            (location.parent().unwrap_or(Path::new(".")).to_path_buf(), location.to_path_buf())
        };
        if !file.is_file() {
            return Err(anyhow!("{} does not exist", file.display()));
        }
        let inner = tokenizers::Tokenizer::from_file(&file).map_err(|e| anyhow!("loading {}: {e}", file.display()))?;
        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let token_id = |name: Option<String>| name.and_then(|t| inner.token_to_id(&t));
        let eos_token_id = token_id(special_token(&config, "eos_token"));
        let chat_template = match template_source(&config) {
            Some(source) => Some(
                ChatTemplate::new(
                    source,
                    special_token(&config, "bos_token").unwrap_or_default(),
                    special_token(&config, "eos_token").unwrap_or_default(),
                )
                .with_context(|| format!("compiling the chat template of {}", dir.display()))?,
            ),
            None => None,
        };
        Ok(HfTokenizer { inner: Arc::new(inner), eos_token_id, chat_template, source: file })
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self.inner.encode_fast(text, add_special_tokens).map_err(|e| anyhow!("{e}"))?;
        Ok(encoding.get_ids().to_vec())
    }

    fn decoder(&self) -> Box<dyn TextDecoder> {
        Box::new(IncrementalDecoder::new(self.inner.clone()))
    }

    fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, String> {
        match &self.chat_template {
            Some(template) => template.render(messages, add_generation_prompt),
            None => Err(format!("the tokenizer at {} has no chat template", self.source.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> HfTokenizer {
        HfTokenizer::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/byte-bpe")).unwrap()
    }

    #[test]
    fn loads_ids_stop_tokens_and_template() {
        let t = fixture();
        assert_eq!(t.vocab_size(), 260);
        assert_eq!(t.eos_token_id(), Some(258));
        // "he" merges; " w" merges into "Ġw"; BOS only for raw prompts.
        assert_eq!(t.encode("hello world", true).unwrap(), [259, 256, 108, 108, 111, 257, 111, 114, 108, 100]);
        assert_eq!(t.encode("hi", false).unwrap(), [104, 105]);
        let messages = vec![ChatMessage { role: "user".into(), content: " yo ".into() }];
        assert_eq!(t.apply_chat_template(&messages, true).unwrap(), "<|bos|>[user] yo<|eot|>\n[assistant] ");
    }

    #[test]
    fn streaming_decode_never_splits_characters_and_matches_the_full_decode() {
        let t = fixture();
        let text = "hello wörld 😀 €!";
        let ids = t.encode(text, false).unwrap();
        let mut decoder = t.decoder();
        let mut pieces: Vec<String> = ids.iter().map(|&id| decoder.push(&[id])).collect();
        pieces.push(decoder.flush());
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().all(|p| !p.contains('\u{fffd}')), "{pieces:?}");
    }

    #[test]
    fn special_tokens_are_skipped_and_flush_releases_leftovers() {
        let t = fixture();
        let mut decoder = t.decoder();
        assert_eq!(decoder.push(&[259, 104, 105, 258]), "hi");
        // Half of "€" (e2 82 ac): held back, then released lossily at the end.
        assert_eq!(decoder.push(&[0xe2, 0x82]), "");
        assert_eq!(decoder.flush(), "\u{fffd}");
    }

    #[test]
    fn missing_tokenizer_is_an_error_naming_the_file() {
        let err = HfTokenizer::load(Path::new("/nonexistent/model")).err().unwrap().to_string();
        assert!(err.contains("/nonexistent/model"), "{err}");
    }
}
