//! Streaming detokenization for Hugging Face tokenizers: text is released
//! only once it no longer ends in an incomplete UTF-8 sequence, and tokens are
//! decoded with a little left context so that merges and prefix spaces come out
//! as the full decode would produce them.

use super::TextDecoder;
use std::sync::Arc;

/// Decodes a growing list of ids, releasing text as it becomes final.
pub struct IncrementalDecoder {
    tokenizer: Arc<tokenizers::Tokenizer>,
    ids: Vec<u32>,
    /// Start of the context window decoded with the new tokens.
    prefix_offset: usize,
    /// End of the text already released.
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder for one request.
    pub fn new(tokenizer: Arc<tokenizers::Tokenizer>) -> Self {
        IncrementalDecoder { tokenizer, ids: Vec::new(), prefix_offset: 0, read_offset: 0 }
    }

    fn decode(&self, ids: &[u32]) -> String {
        // Decoding known ids cannot fail short of a broken tokenizer; such ids give no text.
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }

    /// The text after what is already released, and whether it is complete.
    fn pending_text(&self) -> (String, bool) {
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset]);
        let full = self.decode(&self.ids[self.prefix_offset..]);
        let complete = !full.ends_with(char::REPLACEMENT_CHARACTER);
        let new = match full.get(prefix.len()..) {
            Some(tail) if full.starts_with(&prefix) => tail.to_string(),
            // The context decoded differently (rare normalizations): release all of it.
            _ => full,
        };
        (new, complete)
    }
}

impl TextDecoder for IncrementalDecoder {
    fn push(&mut self, ids: &[u32]) -> String {
        self.ids.extend_from_slice(ids);
        let (text, complete) = self.pending_text();
        if text.is_empty() || !complete {
            return String::new();
        }
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        text
    }

    fn flush(&mut self) -> String {
        let (text, _) = self.pending_text();
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        text
    }
}
