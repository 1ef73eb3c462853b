//! Streaming detokenization for byte-level BPE vocabularies (GPT-2, Llama 3,
//! Qwen, SmolLM2: a `tokenizer.json` whose decoder is `ByteLevel`): every
//! token is a fixed byte string, so a generated token's text is its bytes
//! appended to what is still pending, released once it is complete UTF-8.
//!
//! The `tokenizers` decode stream ([`super::incremental`]) gives the same text
//! but decodes the context twice per token (a vocabulary lookup, a string per
//! token and the decoder chain each time), which was 9.3% of the frontend's
//! samples at `max_tokens=1` (`bench/profile_frontends.py`;
//! docs/frontend-performance.md, "The fast paths").

use super::incremental::{joined_added_tokens, AddedTokens, PROMPT_CONTEXT};
use super::{DecodeOptions, TextDecoder};
use std::sync::Arc;

/// The bytes of every token of a byte-level BPE vocabulary, as the
/// `ByteLevel` decoder turns each token string into bytes.
pub struct TokenBytes {
    /// Token `id`'s bytes are `bytes[ends[id - 1]..ends[id]]` (from 0 for id 0).
    bytes: Vec<u8>,
    ends: Vec<u32>,
    /// Whether each id is a special added token (left out by `skip_special_tokens`).
    special: Vec<bool>,
}

/// Whether byte `b` stands for itself in GPT-2's byte-to-unicode alphabet.
const fn is_printable(b: u32) -> bool {
    (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)
}

/// The 68 bytes the alphabet does not print as themselves, in byte order:
/// it numbers their characters from U+0100 up.
const UNPRINTABLE: [u8; 68] = {
    let mut bytes = [0u8; 68];
    let (mut b, mut n) = (0u32, 0usize);
    while b < 256 {
        if !is_printable(b) {
            bytes[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    bytes
};

/// The byte each character of GPT-2's byte-to-unicode alphabet stands for;
/// `None` for characters outside it.
fn byte_of(c: char) -> Option<u8> {
    let c = u32::from(c);
    if is_printable(c) {
        return Some(c as u8);
    }
    UNPRINTABLE.get(c.checked_sub(256)? as usize).copied()
}

impl TokenBytes {
    /// The table for `tokenizer`, whose vocabulary (added tokens included)
    /// has `vocab_size` ids, when its decoder is `ByteLevel` (alone); `None`
    /// for any other decoder, which the decode stream handles. The size is
    /// passed in because the library builds its whole vocabulary map to count it.
    pub fn of(tokenizer: &tokenizers::Tokenizer, vocab_size: usize) -> Option<Self> {
        if !matches!(tokenizer.get_decoder(), Some(tokenizers::DecoderWrapper::ByteLevel(_))) {
            return None;
        }
        let mut special = vec![false; vocab_size];
        for (id, token) in tokenizer.get_added_tokens_decoder() {
            if let Some(slot) = special.get_mut(id as usize) {
                *slot = token.special;
            }
        }
        let mut table = TokenBytes { bytes: Vec::new(), ends: Vec::with_capacity(vocab_size), special };
        for id in 0..vocab_size as u32 {
            let token = tokenizer.id_to_token(id).unwrap_or_default();
            // As the `ByteLevel` decoder: a token with a character outside the
            // alphabet (an added token with a space, say) is its UTF-8 bytes.
            let mapped: Option<Vec<u8>> = token.chars().map(byte_of).collect();
            table.bytes.extend(mapped.as_deref().unwrap_or(token.as_bytes()));
            table.ends.push(u32::try_from(table.bytes.len()).ok()?);
        }
        Some(table)
    }

    /// Token `id`'s bytes; empty for an id outside the vocabulary.
    fn get(&self, id: u32) -> &[u8] {
        let id = id as usize;
        match self.ends.get(id) {
            Some(&end) => &self.bytes[if id == 0 { 0 } else { self.ends[id - 1] as usize }..end as usize],
            None => &[],
        }
    }

    fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }
}

/// Decodes one request's generated ids with a [`TokenBytes`] table.
pub struct TokenBytesDecoder {
    table: Arc<TokenBytes>,
    skip_special_tokens: bool,
    /// Set when adjacent added tokens are joined without the decoder's spaces.
    joined_added_tokens: Option<AddedTokens>,
    /// Whether the previous generated id was an added token.
    last_was_added: bool,
    /// Bytes not released yet: their text ends in U+FFFD (an incomplete
    /// character, or an invalid byte not followed by anything yet).
    pending: Vec<u8>,
}

impl TokenBytesDecoder {
    /// A decoder for one request whose prompt is `prompt`. Byte-level text
    /// needs no context, except the bytes of a character the prompt leaves
    /// incomplete: as with the decode stream, that character comes out once
    /// the output completes it.
    pub fn new(table: Arc<TokenBytes>, added_tokens: &AddedTokens, prompt: &[u32], options: DecodeOptions) -> Self {
        let mut decoder = TokenBytesDecoder {
            table,
            skip_special_tokens: options.skip_special_tokens,
            joined_added_tokens: joined_added_tokens(options, added_tokens),
            last_was_added: false,
            pending: Vec::new(),
        };
        // The decode stream's priming (`IncrementalDecoder::prefill`): the
        // context ends before a character the prompt leaves incomplete (one
        // spans at most 4 byte tokens), whose bytes stay pending.
        let context = &prompt[prompt.len().saturating_sub(PROMPT_CONTEXT)..];
        for end in (context.len().saturating_sub(4)..=context.len()).rev() {
            if !String::from_utf8_lossy(&decoder.bytes_of_all(&context[..end])).ends_with(char::REPLACEMENT_CHARACTER) {
                decoder.pending = decoder.bytes_of_all(&context[end..]);
                break;
            }
        }
        decoder
    }

    fn bytes_of_all(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter().flat_map(|&id| self.bytes_of(id).iter().copied()).collect()
    }

    /// Token `id`'s bytes as decoding with these options writes them.
    fn bytes_of(&self, id: u32) -> &[u8] {
        if self.skip_special_tokens && self.table.is_special(id) {
            return &[];
        }
        self.table.get(id)
    }
}

/// Releases the `pending` bytes into `out` unless their text still ends in
/// U+FFFD (invalid bytes inside it become U+FFFD, as decoding whole does).
fn release(pending: &mut Vec<u8>, out: &mut String) {
    let text = String::from_utf8_lossy(pending);
    if !text.ends_with(char::REPLACEMENT_CHARACTER) {
        out.push_str(&text);
        pending.clear();
    }
}

impl TextDecoder for TokenBytesDecoder {
    fn push(&mut self, ids: &[u32]) -> String {
        let mut out = String::new();
        for &id in ids {
            let added = self.joined_added_tokens.as_ref().and_then(|added| added.get(&id));
            match added {
                // Two added tokens in a row: the raw token, without the decoder's space.
                Some(content) if self.last_was_added => {
                    out.push_str(&String::from_utf8_lossy(&self.pending));
                    self.pending.clear();
                    out.push_str(content);
                }
                _ => {
                    if !(self.skip_special_tokens && self.table.is_special(id)) {
                        self.pending.extend_from_slice(self.table.get(id));
                    }
                    release(&mut self.pending, &mut out);
                }
            }
            if self.joined_added_tokens.is_some() {
                self.last_was_added = added.is_some();
            }
        }
        out
    }

    /// Nothing: like vLLM, an incomplete character at the end is never emitted.
    fn flush(&mut self) -> String {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::super::incremental::IncrementalDecoder;
    use super::*;
    use proptest::prelude::*;
    use std::path::Path;

    fn fixture() -> (Arc<tokenizers::Tokenizer>, AddedTokens) {
        let file =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizers/byte-bpe/tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_file(file).unwrap();
        let added = tokenizer.get_added_tokens_decoder().into_iter().map(|(id, t)| (id, t.content)).collect();
        (Arc::new(tokenizer), Arc::new(added))
    }

    #[test]
    fn the_alphabet_stands_for_every_byte_once() {
        let mut seen = [false; 256];
        for c in (0u32..512).filter_map(char::from_u32) {
            if let Some(b) = byte_of(c) {
                assert!(!seen[b as usize], "{c:?} maps to byte {b} twice");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(
            (byte_of('Ġ'), byte_of('Ċ'), byte_of('a'), byte_of('é')),
            (Some(b' '), Some(b'\n'), Some(b'a'), Some(0xe9))
        );
    }

    #[test]
    fn every_token_is_what_decoding_it_alone_gives() {
        let (tokenizer, _) = fixture();
        let table =
            TokenBytes::of(&tokenizer, tokenizer.get_vocab_size(true)).expect("the fixture's decoder is ByteLevel");
        for id in 0..tokenizer.get_vocab_size(true) as u32 {
            let whole = tokenizer.decode(&[id], false).unwrap();
            assert_eq!(String::from_utf8_lossy(table.get(id)), whole, "token {id}");
        }
        assert!(table.is_special(258) && !table.is_special(104));
        assert_eq!(table.get(100_000), b"");
    }

    #[test]
    fn other_decoders_have_no_table() {
        let file =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizers/metaspace/tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_file(file).unwrap();
        assert!(TokenBytes::of(&tokenizer, tokenizer.get_vocab_size(true)).is_none());
    }

    /// What each decoder streams for `outputs` after `prompt`, one id per push.
    fn pieces(mut decoder: Box<dyn TextDecoder>, outputs: &[u32]) -> Vec<String> {
        let mut pieces: Vec<String> = outputs.iter().map(|&id| decoder.push(&[id])).collect();
        pieces.push(decoder.flush());
        pieces
    }

    proptest! {
        /// Any ids (incomplete and invalid UTF-8, special tokens, unknown
        /// ids), any options: the same pieces as the `tokenizers` decode stream.
        #[test]
        fn streams_what_the_tokenizers_decode_stream_streams(
            prompt in proptest::collection::vec(prop_oneof![0u32..262, 250u32..262], 0..14),
            outputs in proptest::collection::vec(prop_oneof![0u32..262, 250u32..262, 0xc0u32..0xff], 0..24),
            skip_special_tokens: bool,
            spaces_between_special_tokens: bool,
        ) {
            let (tokenizer, added) = fixture();
            let table = Arc::new(TokenBytes::of(&tokenizer, tokenizer.get_vocab_size(true)).unwrap());
            let options = DecodeOptions { skip_special_tokens, spaces_between_special_tokens };
            let ours = pieces(Box::new(TokenBytesDecoder::new(table, &added, &prompt, options)), &outputs);
            let stream = pieces(Box::new(IncrementalDecoder::new(tokenizer, &added, &prompt, options)), &outputs);
            prop_assert_eq!(ours, stream);
        }
    }
}
