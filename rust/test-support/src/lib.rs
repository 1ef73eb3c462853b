//! What the workspace's tests share: one way to wait for something to
//! happen. Tests never sleep a fixed time to let something happen; they wait
//! until it has, with a deadline that fails the test naming what never came.

use std::time::{Duration, Instant};

/// How often a condition is asked again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// What a condition answers: `true` / `Some(value)` once it holds.
pub trait Outcome {
    /// What `wait_until` returns once the condition holds.
    type Value;
    /// `Some` once the condition holds.
    fn holds(self) -> Option<Self::Value>;
}

impl Outcome for bool {
    type Value = ();
    fn holds(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn holds(self) -> Option<T> {
        self
    }
}

/// Asks `condition` every `POLL_INTERVAL` until it holds and returns its
/// value; panics saying `what` did not happen within `within`.
pub fn wait_until<R: Outcome>(what: &str, within: Duration, condition: impl FnMut() -> R) -> R::Value {
    poll_until(within, condition).unwrap_or_else(|| panic!("waited {within:?} for {what}, in vain"))
}

/// `wait_until` that answers `None` at the deadline instead of panicking, for
/// tests that go on to say what went wrong. The condition is asked once more
/// at the deadline, so a slow last poll cannot fail it.
pub fn poll_until<R: Outcome>(within: Duration, mut condition: impl FnMut() -> R) -> Option<R::Value> {
    let deadline = Instant::now() + within;
    loop {
        let past_deadline = Instant::now() >= deadline;
        if let Some(value) = condition().holds() {
            return Some(value);
        }
        if past_deadline {
            return None;
        }
        std::thread::sleep(POLL_INTERVAL.min(deadline.saturating_duration_since(Instant::now())));
    }
}

/// `wait_until` for tests on tokio: the condition is a future, and the wait
/// yields to the runtime between polls.
#[cfg(feature = "tokio")]
pub async fn wait_until_async<R, F>(what: &str, within: Duration, condition: impl FnMut() -> F) -> R::Value
where
    R: Outcome,
    F: std::future::Future<Output = R>,
{
    poll_until_async(within, condition).await.unwrap_or_else(|| panic!("waited {within:?} for {what}, in vain"))
}

/// `poll_until` for tests on tokio.
#[cfg(feature = "tokio")]
pub async fn poll_until_async<R, F>(within: Duration, mut condition: impl FnMut() -> F) -> Option<R::Value>
where
    R: Outcome,
    F: std::future::Future<Output = R>,
{
    let deadline = Instant::now() + within;
    loop {
        let past_deadline = Instant::now() >= deadline;
        if let Some(value) = condition().await.holds() {
            return Some(value);
        }
        if past_deadline {
            return None;
        }
        tokio::time::sleep(POLL_INTERVAL.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_value_once_the_condition_holds() {
        let mut asked = 0;
        let value = wait_until("the third ask", Duration::from_secs(5), || {
            asked += 1;
            (asked == 3).then_some(asked * 10)
        });
        assert_eq!(value, 30);
    }

    #[test]
    #[should_panic(expected = "waited 50ms for something that never happens, in vain")]
    fn panics_naming_what_never_happened() {
        wait_until("something that never happens", Duration::from_millis(50), || false);
    }
}
