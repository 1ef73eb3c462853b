//! The hand-off of one request's outputs from the output task to the handler
//! that waits for them.
//!
//! An inbox keeps the engine's outputs apart, in order: a streaming handler
//! takes them one at a time (one SSE event per engine output, as vLLM
//! streams), while a handler that only wants the whole answer takes
//! everything that arrived in one event. Either way the output task wakes the
//! handler at most once per look, however many engine messages arrive in
//! between.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use vllm_rs_wire::protocol::{FinishReason, LogprobRows, RequestError, StopReason};

/// What a request's handler receives.
#[derive(Debug, PartialEq)]
pub enum RequestEvent {
    /// The tokens of one engine output (or, taken merged, of every output
    /// that arrived since the previous event); the last event carries the finish reason.
    Output {
        /// The new tokens, oldest first.
        token_ids: Vec<u32>,
        /// Set when the request is finished.
        finish_reason: Option<FinishReason>,
        /// What stopped it, when known.
        stop_reason: Option<StopReason>,
        /// The logprobs that came with the tokens, when the request asked for them.
        logprobs: Option<Box<OutputLogprobs>>,
    },
    /// The request failed outside the engine's control (engine dead, protocol error, send failure).
    Failed(String),
    /// The engine finished the request with ERROR and said why.
    Rejected(RequestError),
    /// A pooling request's result (its one output, the request finished).
    Pooled(Vec<f32>),
}

/// Logprobs of the outputs in one event.
#[derive(Debug, Default, PartialEq)]
pub struct OutputLogprobs {
    /// Rows of the new tokens, one batch per engine output, in order.
    pub sample: Vec<LogprobRows>,
    /// The prompt's rows (they come once, with the first output).
    pub prompt: Option<LogprobRows>,
}

/// How a handler takes its outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// The oldest engine output not yet taken, alone.
    One,
    /// Every output that arrived, merged into one event.
    All,
}

/// One request's pending outputs. Shared by the output task (which fills it)
/// and the request's handler (which empties it).
#[derive(Default)]
pub struct Inbox {
    state: Mutex<Pending>,
}

/// One engine output not yet taken.
struct Queued {
    token_ids: Vec<u32>,
    logprobs: Option<Box<OutputLogprobs>>,
    finish: Option<(FinishReason, Option<StopReason>)>,
}

#[derive(Default)]
struct Pending {
    outputs: VecDeque<Queued>,
    failure: Option<String>,
    rejection: Option<RequestError>,
    pooled: Option<Vec<f32>>,
    /// The producer is gone: after what is pending, nothing more comes.
    closed: bool,
    waiting: Option<Waker>,
}

impl Inbox {
    /// Adds the tokens of one engine output and, on the last one, its finish.
    pub fn push_output(&self, token_ids: &[u32], finish_reason: Option<FinishReason>, stop_reason: Option<StopReason>) {
        self.push_scored_output(token_ids, None, None, finish_reason, stop_reason);
    }

    /// Adds the tokens of one engine output with their logprobs (`sample`)
    /// and the prompt's (`prompt`), when the engine sent them.
    pub fn push_scored_output(
        &self,
        token_ids: &[u32],
        sample: Option<Box<LogprobRows>>,
        prompt: Option<Box<LogprobRows>>,
        finish_reason: Option<FinishReason>,
        stop_reason: Option<StopReason>,
    ) {
        let logprobs = (sample.is_some() || prompt.is_some()).then(|| {
            Box::new(OutputLogprobs {
                sample: sample.map(|rows| *rows).into_iter().collect(),
                prompt: prompt.map(|rows| *rows),
            })
        });
        let queued = Queued {
            token_ids: token_ids.to_vec(),
            logprobs,
            finish: finish_reason.map(|reason| (reason, stop_reason)),
        };
        self.update(|pending| pending.outputs.push_back(queued));
    }

    /// Ends a pooling request with its result: the handler's next event is `Pooled(values)`.
    pub fn push_pooled(&self, values: Vec<f32>) {
        self.update(|pending| pending.pooled = Some(values));
    }

    /// Ends the request as the engine refused it: the handler's next event is `Rejected(error)`.
    pub fn reject(&self, error: RequestError) {
        self.update(|pending| {
            pending.rejection.get_or_insert(error);
        });
    }

    /// Fails the request: the handler's next event is `Failed(reason)`.
    pub fn fail(&self, reason: String) {
        self.update(|pending| {
            pending.failure.get_or_insert(reason);
        });
    }

    /// Marks the end of the outputs, finished or not.
    pub fn close(&self) {
        self.update(|pending| pending.closed = true);
    }

    fn update(&self, change: impl FnOnce(&mut Pending)) {
        let waiting = {
            let mut pending = self.state.lock().unwrap();
            change(&mut pending);
            pending.waiting.take()
        };
        if let Some(waker) = waiting {
            waker.wake();
        }
    }

    /// The next event, outputs taken as `take` says; `Ready(None)` once
    /// closed and empty; `Pending` (with a wake-up registered) when nothing
    /// arrived yet.
    pub fn poll_event(&self, cx: &mut Context<'_>, take: Take) -> Poll<Option<RequestEvent>> {
        let mut pending = self.state.lock().unwrap();
        if let Some(reason) = pending.failure.take() {
            return Poll::Ready(Some(RequestEvent::Failed(reason)));
        }
        if let Some(error) = pending.rejection.take() {
            return Poll::Ready(Some(RequestEvent::Rejected(error)));
        }
        if let Some(values) = pending.pooled.take() {
            return Poll::Ready(Some(RequestEvent::Pooled(values)));
        }
        if let Some(first) = pending.outputs.pop_front() {
            let merged = match take {
                Take::One => first,
                Take::All => pending.outputs.drain(..).fold(first, merge),
            };
            let (finish_reason, stop_reason) = merged.finish.unzip();
            return Poll::Ready(Some(RequestEvent::Output {
                token_ids: merged.token_ids,
                finish_reason,
                stop_reason: stop_reason.flatten(),
                logprobs: merged.logprobs,
            }));
        }
        if pending.closed {
            return Poll::Ready(None);
        }
        match &mut pending.waiting {
            Some(waker) => waker.clone_from(cx.waker()),
            none => *none = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// `earlier` followed by `later`, as one output.
fn merge(mut earlier: Queued, later: Queued) -> Queued {
    earlier.token_ids.extend_from_slice(&later.token_ids);
    if let Some(more) = later.logprobs {
        let logprobs = earlier.logprobs.get_or_insert_with(Default::default);
        logprobs.sample.extend(more.sample);
        if more.prompt.is_some() {
            logprobs.prompt = more.prompt;
        }
    }
    if later.finish.is_some() {
        earlier.finish = later.finish;
    }
    earlier
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::sync::Arc;

    fn poll_now(inbox: &Inbox, take: Take) -> Poll<Option<RequestEvent>> {
        let mut cx = Context::from_waker(Waker::noop());
        inbox.poll_event(&mut cx, take)
    }

    fn output(token_ids: Vec<u32>, finish_reason: Option<FinishReason>) -> Poll<Option<RequestEvent>> {
        Poll::Ready(Some(RequestEvent::Output { token_ids, finish_reason, stop_reason: None, logprobs: None }))
    }

    #[test]
    fn outputs_that_queued_up_are_taken_one_per_engine_output() {
        let inbox = Inbox::default();
        assert_eq!(poll_now(&inbox, Take::One), Poll::Pending);
        inbox.push_output(&[1, 2], None, None);
        inbox.push_output(&[3], None, None);
        inbox.push_output(&[4], Some(FinishReason::Length), None);
        assert_eq!(poll_now(&inbox, Take::One), output(vec![1, 2], None));
        assert_eq!(poll_now(&inbox, Take::One), output(vec![3], None));
        assert_eq!(poll_now(&inbox, Take::One), output(vec![4], Some(FinishReason::Length)));
        assert_eq!(poll_now(&inbox, Take::One), Poll::Pending);
    }

    #[test]
    fn outputs_that_queued_up_can_be_taken_merged_in_order() {
        let inbox = Inbox::default();
        inbox.push_output(&[1, 2], None, None);
        inbox.push_output(&[3], None, None);
        inbox.push_output(&[4], Some(FinishReason::Length), None);
        assert_eq!(poll_now(&inbox, Take::All), output(vec![1, 2, 3, 4], Some(FinishReason::Length)));
        assert_eq!(poll_now(&inbox, Take::All), Poll::Pending);
    }

    #[test]
    fn logprobs_of_merged_outputs_arrive_with_their_tokens() {
        let inbox = Inbox::default();
        let rows = |t: u32| LogprobRows { width: 1, token_ids: vec![t], logprobs: vec![-1.0], ranks: vec![1] };
        inbox.push_scored_output(&[1], Some(Box::new(rows(1))), Some(Box::new(rows(9))), None, None);
        inbox.push_scored_output(&[2], Some(Box::new(rows(2))), None, None, None);
        let Poll::Ready(Some(RequestEvent::Output { token_ids, logprobs: Some(logprobs), .. })) =
            poll_now(&inbox, Take::All)
        else {
            panic!("expected an output with logprobs")
        };
        assert_eq!(token_ids, vec![1, 2]);
        assert_eq!(logprobs.sample, vec![rows(1), rows(2)]);
        assert_eq!(logprobs.prompt, Some(rows(9)));
    }

    #[test]
    fn logprobs_of_one_output_stay_with_it() {
        let inbox = Inbox::default();
        let rows = |t: u32| LogprobRows { width: 1, token_ids: vec![t], logprobs: vec![-1.0], ranks: vec![1] };
        inbox.push_scored_output(&[1], Some(Box::new(rows(1))), Some(Box::new(rows(9))), None, None);
        inbox.push_scored_output(&[2], Some(Box::new(rows(2))), None, None, None);
        let first = OutputLogprobs { sample: vec![rows(1)], prompt: Some(rows(9)) };
        let second = OutputLogprobs { sample: vec![rows(2)], prompt: None };
        for (tokens, logprobs) in [(vec![1], first), (vec![2], second)] {
            let event = RequestEvent::Output {
                token_ids: tokens,
                finish_reason: None,
                stop_reason: None,
                logprobs: Some(Box::new(logprobs)),
            };
            assert_eq!(poll_now(&inbox, Take::One), Poll::Ready(Some(event)));
        }
    }

    #[test]
    fn a_failure_comes_first_and_closing_ends_the_events() {
        let inbox = Inbox::default();
        inbox.push_output(&[7], None, None);
        inbox.fail("engine died".into());
        inbox.close();
        assert_eq!(poll_now(&inbox, Take::One), Poll::Ready(Some(RequestEvent::Failed("engine died".into()))));
        assert_eq!(poll_now(&inbox, Take::One), output(vec![7], None));
        assert_eq!(poll_now(&inbox, Take::One), Poll::Ready(None));
    }

    #[tokio::test]
    async fn a_waiting_handler_is_woken_by_the_producer() {
        let inbox = Arc::new(Inbox::default());
        let producer = inbox.clone();
        let waiter = tokio::spawn(async move { poll_fn(|cx| inbox.poll_event(cx, Take::One)).await });
        tokio::task::yield_now().await;
        producer.push_output(&[5], Some(FinishReason::Stop), Some(StopReason::Token(5)));
        let event = RequestEvent::Output {
            token_ids: vec![5],
            finish_reason: Some(FinishReason::Stop),
            stop_reason: Some(StopReason::Token(5)),
            logprobs: None,
        };
        assert_eq!(waiter.await.unwrap(), Some(event));
    }
}
