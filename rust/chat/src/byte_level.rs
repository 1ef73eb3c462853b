//! The built-in byte-level tokenizer of the built-in models (`toy`, `echo`):
//! ids 0..=255 are the bytes of the UTF-8 text, 256 is end-of-sequence.

use super::{ChatMessage, ChatTemplateError, DecodeOptions, TextDecoder, Tokenizer};
use anyhow::Result;

/// The end-of-sequence id of the byte-level vocabulary.
pub const BYTE_EOS_TOKEN_ID: u32 = 256;

/// Byte-level tokenizer: one token per byte.
#[derive(Debug, Default)]
pub struct ByteLevelTokenizer;

impl Tokenizer for ByteLevelTokenizer {
    fn encode(&self, text: &str, _add_special_tokens: bool) -> Result<Vec<u32>> {
        Ok(text.bytes().map(u32::from).collect())
    }

    /// Bytes are decoded without the prompt's context; there are no special
    /// tokens to skip (EOS has no text).
    fn decoder(&self, _prompt: &[u32], _options: DecodeOptions) -> Box<dyn TextDecoder> {
        Box::new(ByteLevelDecoder::default())
    }

    /// The bytes as UTF-8 (invalid sequences become U+FFFD); EOS has no text.
    fn decode(&self, ids: &[u32]) -> Result<String> {
        let bytes: Vec<u8> = ids.iter().filter_map(|&id| u8::try_from(id).ok()).collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Printable ASCII bytes are themselves, other bytes `<0xNN>` (as
    /// byte-fallback vocabularies name them), EOS `<|eos|>`.
    fn token_strings(&self, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&id| byte_token_string(id)).collect()
    }

    fn eos_token_id(&self) -> Option<u32> {
        Some(BYTE_EOS_TOKEN_ID)
    }

    fn vocab_size(&self) -> usize {
        BYTE_EOS_TOKEN_ID as usize + 1
    }

    /// `role: content` lines, then `assistant: ` when a reply is wanted.
    fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let mut prompt = String::new();
        for m in messages {
            prompt.push_str(&m.role);
            prompt.push_str(": ");
            prompt.push_str(&m.content);
            prompt.push('\n');
        }
        if add_generation_prompt {
            prompt.push_str("assistant: ");
        }
        Ok(prompt)
    }
}

/// The token string of one byte-level id.
fn byte_token_string(id: u32) -> String {
    match id {
        0x20..=0x7e => char::from(id as u8).to_string(),
        0..=0xff => format!("<0x{id:02X}>"),
        BYTE_EOS_TOKEN_ID => "<|eos|>".to_string(),
        _ => String::new(),
    }
}

/// Streams bytes to text, holding back an incomplete UTF-8 sequence.
#[derive(Debug, Default)]
pub struct ByteLevelDecoder {
    pending: Vec<u8>,
}

impl TextDecoder for ByteLevelDecoder {
    fn push(&mut self, ids: &[u32]) -> String {
        // Ids outside the byte range (EOS, special) have no text.
        self.pending.extend(ids.iter().filter_map(|&id| u8::try_from(id).ok()));
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(valid) => {
                    text.push_str(valid);
                    self.pending.clear();
                    return text;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    text.push_str(std::str::from_utf8(&self.pending[..valid]).expect("valid prefix"));
                    match e.error_len() {
                        // An incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return text;
                        }
                        Some(bad) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    fn flush(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_utf8_one_byte_at_a_time_without_splitting_chars() {
        let t = ByteLevelTokenizer;
        let ids = t.encode("añ€😀", true).unwrap();
        let mut d = t.decoder(&[], DecodeOptions::default());
        let pieces: Vec<String> = ids.iter().map(|&id| d.push(&[id])).collect();
        assert_eq!(pieces.concat(), "añ€😀");
        assert!(pieces.iter().all(|p| p.chars().count() <= 1));
        assert_eq!(pieces.iter().filter(|p| !p.is_empty()).count(), 4);
    }

    #[test]
    fn invalid_bytes_become_replacement_characters_and_eos_is_silent() {
        let mut d = ByteLevelTokenizer.decoder(&[], DecodeOptions::default());
        assert_eq!(d.push(&[0x61, 0xff, 0x62, BYTE_EOS_TOKEN_ID, 0xe2, 0x82]), "a\u{fffd}b");
        assert_eq!(d.flush(), "\u{fffd}");
    }

    #[test]
    fn chat_template_lists_roles() {
        let messages = vec![ChatMessage { role: "user".into(), content: "hi".into(), extra: None }];
        assert_eq!(ByteLevelTokenizer.apply_chat_template(&messages, true).unwrap(), "user: hi\nassistant: ");
    }

    #[test]
    fn decodes_whole_and_names_each_token() {
        let t = ByteLevelTokenizer;
        assert_eq!(t.decode(&[0x68, 0xc3, 0xa9, 256]).unwrap(), "hé");
        assert_eq!(t.decode(&[0xc3]).unwrap(), "\u{fffd}");
        assert_eq!(t.token_strings(&[0x68, 0x20, 0x0a, 0xc3, 256]), ["h", " ", "<0x0A>", "<0xC3>", "<|eos|>"]);
    }
}
