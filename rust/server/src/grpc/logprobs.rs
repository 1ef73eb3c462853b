//! Logprobs in Generate answers, filled as vLLM's servicer fills
//! `OutputLogProbs`, `InputLogProbs` and `TopLogProbs` from vLLM's logprob
//! dicts. The engine's rows become positions through the same
//! [`PositionReader`] as on HTTP (a position is that dict: the scored token
//! first, then the top tokens, each token once), without texts.

use vllm_rs_engine::inbox::OutputLogprobs;
use vllm_rs_generate::logprobs::positions::entry;
use vllm_rs_generate::logprobs::{Position, PositionReader};
use vllm_rs_grpc::engine::{InputLogProbs, InputTokenLogProb, OutputLogProbs, TopLogProbs};

/// vLLM's `_build_top_logprobs`: the first `count` entries of the position
/// (the scored token comes first, then the top tokens), none unless `count`
/// is positive (so `-1`, "the whole vocabulary", lists none, as in vLLM).
fn top(position: Option<&Position>, count: i64) -> TopLogProbs {
    let take = usize::try_from(count).unwrap_or(0);
    let entries = position.map_or(&[][..], |p| &p[..take.min(p.len())]);
    TopLogProbs {
        values: entries.iter().map(|e| e.logprob as f32).collect(),
        token_ids: entries.iter().map(|e| e.token_id).collect(),
    }
}

/// vLLM's `_build_output_logprobs`: each token its own logprob and, when
/// `count` is set and not 0, its top logprobs; `None` when no token is scored.
fn output_logprobs(token_ids: &[u32], positions: &[Position], count: i64) -> Option<OutputLogProbs> {
    let mut out = OutputLogProbs::default();
    for (&token_id, position) in token_ids.iter().zip(positions) {
        if let Some(scored) = entry(position, token_id) {
            out.token_logprobs.push(scored.logprob as f32);
            out.token_ids.push(token_id);
            if count != 0 {
                out.top_logprobs.push(top(Some(position), count));
            }
        }
    }
    (!out.token_ids.is_empty()).then_some(out)
}

/// vLLM's `_build_input_logprobs`: every prompt token with its logprob (none
/// for the first, which nothing predicts) and, when `count` is set and not
/// 0, its top logprobs (none for the first).
fn input_logprobs(prompt: &[u32], positions: &[Option<Position>], count: i64) -> Option<InputLogProbs> {
    let mut out = InputLogProbs::default();
    for (&token_id, position) in prompt.iter().zip(positions) {
        let value = position.as_ref().and_then(|p| entry(p, token_id)).map(|e| e.logprob as f32);
        out.token_logprobs.push(InputTokenLogProb { value });
        out.token_ids.push(token_id);
        if count != 0 {
            out.top_logprobs.push(top(position.as_ref(), count));
        }
    }
    (!out.token_ids.is_empty()).then_some(out)
}

/// Adds a later chunk's output logprobs to the ones so far.
pub fn extend(whole: &mut Option<OutputLogProbs>, more: Option<OutputLogProbs>) {
    let Some(more) = more else { return };
    match whole {
        None => *whole = Some(more),
        Some(whole) => {
            whole.token_logprobs.extend(more.token_logprobs);
            whole.token_ids.extend(more.token_ids);
            whole.top_logprobs.extend(more.top_logprobs);
        }
    }
}

/// The logprobs one choice of a request asked for, read as its outputs come.
pub struct ChoiceLogprobs {
    sample: PositionReader,
    prompt: PositionReader,
    /// `sampling_params.logprobs`.
    count: Option<i64>,
    /// `sampling_params.prompt_logprobs`.
    prompt_count: Option<i64>,
}

impl ChoiceLogprobs {
    /// A reader for a request with these `logprobs` and `prompt_logprobs`;
    /// `None` when it asked for neither.
    pub fn new(count: Option<i64>, prompt_count: Option<i64>) -> Option<Self> {
        (count.is_some() || prompt_count.is_some()).then(|| ChoiceLogprobs {
            sample: PositionReader::ids_only(),
            prompt: PositionReader::ids_only(),
            count,
            prompt_count,
        })
    }

    /// The output logprobs of the new `token_ids`, and the input logprobs
    /// of `prompt` when the engine sent the prompt's rows (with the first output).
    pub fn read(
        &mut self,
        token_ids: &[u32],
        rows: Option<Box<OutputLogprobs>>,
        prompt: &[u32],
    ) -> (Option<OutputLogProbs>, Option<InputLogProbs>) {
        let Some(rows) = rows else { return (None, None) };
        let output = self.count.and_then(|count| {
            let positions: Vec<Position> = rows.sample.iter().flat_map(|r| self.sample.read(r)).collect();
            output_logprobs(token_ids, &positions, count)
        });
        let input = match (self.prompt_count, &rows.prompt) {
            (Some(count), Some(prompt_rows)) => {
                let positions: Vec<Option<Position>> =
                    std::iter::once(None).chain(self.prompt.read(prompt_rows).into_iter().map(Some)).collect();
                input_logprobs(prompt, &positions, count)
            }
            _ => None,
        };
        (output, input)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vllm_rs_wire::protocol::LogprobRows;

    /// Rows as the echo model scores `targets`: the token at -ln 2, then
    /// `t, t+1, ...` at -ln 2, -2 ln 2, ... (k = 2).
    fn echo_rows(targets: &[u32]) -> LogprobRows {
        let ln2 = std::f32::consts::LN_2;
        LogprobRows {
            width: 3,
            token_ids: targets.iter().flat_map(|&t| [t, t, t + 1]).collect(),
            logprobs: targets.iter().flat_map(|_| [-ln2, -ln2, -2.0 * ln2]).collect(),
            ranks: vec![1; targets.len()],
        }
    }

    #[test]
    fn fills_output_and_input_logprobs_as_vllms_servicer() {
        let ln2 = std::f32::consts::LN_2;
        let mut reader = ChoiceLogprobs::new(Some(2), Some(1)).unwrap();
        let rows = OutputLogprobs { sample: vec![echo_rows(&[7, 9])], prompt: Some(echo_rows(&[6])) };
        let (output, input) = reader.read(&[7, 9], Some(Box::new(rows)), &[5, 6]);
        let output = output.unwrap();
        assert_eq!((output.token_ids, output.token_logprobs), (vec![7, 9], vec![-ln2, -ln2]));
        // The scored token and the next, each once (the scored token is among the top 2).
        assert_eq!(output.top_logprobs[1], TopLogProbs { values: vec![-ln2, -2.0 * ln2], token_ids: vec![9, 10] });
        let input = input.unwrap();
        assert_eq!(input.token_ids, vec![5, 6]);
        assert_eq!(
            input.token_logprobs,
            vec![InputTokenLogProb { value: None }, InputTokenLogProb { value: Some(-ln2) }]
        );
        assert_eq!(
            input.top_logprobs,
            vec![TopLogProbs::default(), TopLogProbs { values: vec![-ln2], token_ids: vec![6] }]
        );
    }

    #[test]
    fn zero_lists_no_top_logprobs_and_minus_one_empty_ones() {
        for (count, tops) in [(0, 0), (-1, 1)] {
            let mut reader = ChoiceLogprobs::new(Some(count), None).unwrap();
            let rows = OutputLogprobs { sample: vec![echo_rows(&[3])], prompt: Some(echo_rows(&[1])) };
            let (output, input) = reader.read(&[3], Some(Box::new(rows)), &[0, 1]);
            let output = output.unwrap();
            assert_eq!(output.top_logprobs.len(), tops);
            assert!(output.top_logprobs.iter().all(|t| t.token_ids.is_empty()));
            assert!(input.is_none(), "no prompt logprobs were asked for");
        }
        assert!(ChoiceLogprobs::new(None, None).is_none());
    }

    #[test]
    fn chunks_add_up() {
        let mut whole = None;
        let mut reader = ChoiceLogprobs::new(Some(1), None).unwrap();
        for token in [4, 8] {
            let rows = OutputLogprobs { sample: vec![echo_rows(&[token])], prompt: None };
            extend(&mut whole, reader.read(&[token], Some(Box::new(rows)), &[1]).0);
        }
        let whole = whole.unwrap();
        assert_eq!((whole.token_ids, whole.top_logprobs.len()), (vec![4, 8], 2));
    }
}
