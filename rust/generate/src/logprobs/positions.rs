//! Engine rows turned into positions as vLLM's `LogprobsProcessor` does.

use std::sync::Arc;
use vllm_rs_chat::Tokenizer;
use vllm_rs_wire::protocol::LogprobRows;

/// One scored token of a position.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The token id.
    pub token_id: u32,
    /// Its logprob (the engine's float32, widened).
    pub logprob: f64,
    /// Its rank (1 = the most likely).
    pub rank: i64,
    /// The token as vLLM decodes it in a logprobs answer.
    pub text: String,
}

/// One position: the scored token first, then the top tokens, each token once.
pub type Position = Vec<Entry>;

/// What a position says about `token_id`, if it lists it.
pub fn entry(position: &Position, token_id: u32) -> Option<&Entry> {
    position.iter().find(|e| e.token_id == token_id)
}

/// The tokens that arrived with a delta and their logprobs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scored {
    /// Every token of the delta (the one that stopped generation too).
    pub token_ids: Vec<u32>,
    /// Their positions, when the engine sent logprobs.
    pub logprobs: Option<Vec<Position>>,
    /// The prompt's positions (the first token's is `None`), with the first delta, when asked for.
    pub prompt_logprobs: Option<Vec<Option<Position>>>,
}

/// Turns rows into positions as vLLM's `LogprobsProcessor` does: ranks are
/// the scored token's, then 1..k; a token listed twice (the scored token
/// among the top k) keeps its first place with its last values; each token
/// is decoded alone, and one whose text ends in U+FFFD (part of a UTF-8
/// character) is decoded again after the scored tokens before it (up to 4)
/// and shows only what it adds, or nothing. One reader per generation and
/// kind (sample or prompt): it keeps the scored tokens as context.
pub struct PositionReader {
    /// `None`: the entries' texts stay empty (answers that show only ids).
    tokenizer: Option<Arc<dyn Tokenizer>>,
    context: Vec<u32>,
}

impl PositionReader {
    /// A reader with no context yet.
    pub fn new(tokenizer: Arc<dyn Tokenizer>) -> Self {
        PositionReader { tokenizer: Some(tokenizer), context: Vec::new() }
    }

    /// A reader for answers that show token ids only (gRPC): the same
    /// positions, every entry's text empty, nothing decoded.
    pub fn ids_only() -> Self {
        PositionReader { tokenizer: None, context: Vec::new() }
    }

    /// The positions of `rows`, in order.
    pub fn read(&mut self, rows: &LogprobRows) -> Vec<Position> {
        let mut positions = Vec::with_capacity(rows.len());
        for i in 0..rows.len() {
            let (token_ids, logprobs, rank) = rows.row(i);
            let context = self.context[self.context.len().saturating_sub(4)..].to_vec();
            let mut position: Position = Vec::with_capacity(token_ids.len());
            for (column, (&token_id, &logprob)) in token_ids.iter().zip(logprobs).enumerate() {
                let rank = if column == 0 { rank } else { column as i64 };
                let logprob = f64::from(logprob);
                // The top k are distinct, so only the scored token (column 0) can come
                // twice from vLLM; short rows are searched whole, for any engine.
                let seen = if token_ids.len() <= 64 {
                    position.iter().position(|e| e.token_id == token_id)
                } else {
                    (column > 0 && position[0].token_id == token_id).then_some(0)
                };
                if let Some(at) = seen {
                    (position[at].logprob, position[at].rank) = (logprob, rank);
                    continue;
                }
                position.push(Entry { token_id, logprob, rank, text: self.text(token_id, &context) });
            }
            if let Some(&scored) = token_ids.first() {
                self.context.push(scored);
            }
            positions.push(position);
        }
        positions
    }

    /// vLLM's `_correct_decoded_token`.
    fn text(&self, token_id: u32, context: &[u32]) -> String {
        let Some(tokenizer) = self.tokenizer.as_deref() else { return String::new() };
        // A decode failure shows as no text, as an unknown id would.
        let decode = |ids: &[u32]| tokenizer.decode(ids).unwrap_or_default();
        let text = decode(&[token_id]);
        if !text.ends_with('\u{FFFD}') {
            return text;
        }
        for size in 1..=context.len() {
            let tail = &context[context.len() - size..];
            let whole = decode(&[tail, &[token_id]].concat());
            if whole.ends_with('\u{FFFD}') {
                continue;
            }
            let mut clean_end = tail.len();
            for j in (0..tail.len()).rev() {
                if !decode(&[tail[j]]).ends_with('\u{FFFD}') {
                    break;
                }
                clean_end = j;
            }
            let prefix = if clean_end > 0 { decode(&tail[..clean_end]) } else { String::new() };
            if let Some(rest) = whole.strip_prefix(prefix.as_str()) {
                return rest.to_owned();
            }
            // Python compares characters: skip the common leading ones.
            let common = prefix.chars().zip(whole.chars()).take_while(|(a, b)| a == b).count();
            return whole.chars().skip(common).collect();
        }
        String::new()
    }
}
