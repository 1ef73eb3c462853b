//! Streaming detokenization for Hugging Face tokenizers, as vLLM 0.33's
//! `FastIncrementalDetokenizer` does it: a `tokenizers` decode stream primed
//! with the prompt's ids, stepped one generated id at a time. Decoding each new
//! token after the prompt's text is what gives the first generated token its
//! leading space (SentencePiece `▁`), and text is released only once it no
//! longer ends in an incomplete UTF-8 character.
use super::{DecodeOptions, TextDecoder};
use std::collections::HashMap;
use std::sync::Arc;

/// The text of every added token by id (special or not), for
/// `spaces_between_special_tokens: false`.
pub type AddedTokens = Arc<HashMap<u32, String>>;

/// The added-token table a decoder joins adjacent added tokens with, when
/// `options` keep special tokens without the decoder's spaces between them.
pub(super) fn joined_added_tokens(options: DecodeOptions, added_tokens: &AddedTokens) -> Option<AddedTokens> {
    let joined = !options.skip_special_tokens && !options.spaces_between_special_tokens;
    (joined && !added_tokens.is_empty()).then(|| added_tokens.clone())
}

/// Prompt tokens a decoder keeps as the context of the first generated token.
pub(super) const PROMPT_CONTEXT: usize = 8;

/// Decodes one request's generated ids, releasing text as it becomes final.
pub struct IncrementalDecoder {
    tokenizer: Arc<tokenizers::Tokenizer>,
    skip_special_tokens: bool,
    /// Set when adjacent added tokens are joined without the decoder's spaces.
    joined_added_tokens: Option<AddedTokens>,
    /// Whether the previous generated id was an added token.
    last_was_added: bool,
    /// The decode stream's state (see `tokenizers::step_decode_stream`): the
    /// ids still needed as context, the text of `ids[..prefix_index]`, and
    /// that index.
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
}

impl IncrementalDecoder {
    /// A decoder for one request whose prompt is `prompt`; `added_tokens` is
    /// the tokenizer's added-token table.
    pub fn new(
        tokenizer: Arc<tokenizers::Tokenizer>,
        added_tokens: &AddedTokens,
        prompt: &[u32],
        options: DecodeOptions,
    ) -> Self {
        let mut decoder = IncrementalDecoder {
            tokenizer,
            skip_special_tokens: options.skip_special_tokens,
            joined_added_tokens: joined_added_tokens(options, added_tokens),
            last_was_added: false,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        };
        decoder.prefill(prompt);
        decoder
    }

    /// Primes the stream with the prompt's last [`PROMPT_CONTEXT`] tokens,
    /// where vLLM's `DecodeStream(ids=prompt)` takes the whole prompt: the
    /// text a new token adds is the same with that much context (decoders
    /// join a token only with its neighbours: a leading space, a character
    /// split over at most 4 byte tokens), and the whole prompt was decoded
    /// twice per request. One deliberate difference: when the prompt's text
    /// ends in an incomplete character, vLLM's stream has no prefix and its
    /// first output repeats the whole prompt; here the context stops before
    /// that character, so only the character itself comes out once the output
    /// completes it.
    fn prefill(&mut self, prompt: &[u32]) {
        let context = &prompt[prompt.len().saturating_sub(PROMPT_CONTEXT)..];
        // A UTF-8 character spans at most 4 tokens (one byte each).
        for end in (context.len().saturating_sub(4)..=context.len()).rev() {
            let text = self.decode(&context[..end]);
            if !text.ends_with(char::REPLACEMENT_CHARACTER) {
                self.ids = context.to_vec();
                self.prefix = text;
                self.prefix_index = end;
                return;
            }
        }
    }

    fn decode(&self, ids: &[u32]) -> String {
        // Decoding cannot fail short of a broken tokenizer; such ids give no text.
        self.tokenizer.decode(ids, self.skip_special_tokens).unwrap_or_default()
    }

    /// One step of the decode stream: the text `id` completes, if any.
    fn step(&mut self, id: u32) -> Option<String> {
        let step = |d: &mut Self| {
            tokenizers::step_decode_stream(
                &d.tokenizer,
                vec![id],
                d.skip_special_tokens,
                &mut d.ids,
                &mut d.prefix,
                &mut d.prefix_index,
            )
        };
        match step(self) {
            Ok(text) => text,
            Err(e) if e.downcast_ref::<tokenizers::DecodeStreamError>().is_some() => {
                // Decoding with more context changed the earlier text (rare
                // non-monotonic decoders): restart without context, as vLLM does.
                tracing::warn!("Encountered invalid prefix detokenization error, resetting decode stream.");
                self.ids.clear();
                self.prefix.clear();
                self.prefix_index = 0;
                step(self).unwrap_or_default()
            }
            Err(_) => None,
        }
    }
}

impl TextDecoder for IncrementalDecoder {
    fn push(&mut self, ids: &[u32]) -> String {
        let mut out = String::new();
        for &id in ids {
            let text = self.step(id);
            match &self.joined_added_tokens {
                Some(added) => {
                    let added_token = added.get(&id);
                    match added_token {
                        // Two added tokens in a row: the raw token, without the decoder's space.
                        Some(content) if self.last_was_added => out.push_str(content),
                        _ => out.push_str(text.as_deref().unwrap_or_default()),
                    }
                    self.last_was_added = added_token.is_some();
                }
                None => out.push_str(text.as_deref().unwrap_or_default()),
            }
        }
        out
    }

    /// Nothing: like vLLM, an incomplete character at the end is never emitted.
    fn flush(&mut self) -> String {
        String::new()
    }
}
