//! A deadline on receiving a request body, so a client that trickles its body
//! cannot hold a connection and a handler open: the body is wrapped as soon as
//! the request head has arrived, and reading it past the deadline fails with
//! [`BodyTimedOut`] (the JSON extractor answers 408 and closes the connection;
//! a handler that never reads the body leaves hyper to drop the connection).

use crate::http::state::SharedState;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Sleep;

/// The body did not arrive in full within the deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimedOut(pub Duration);

/// A request body that fails with [`BodyTimedOut`] once its deadline passes.
pub struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
}

impl DeadlineBody {
    /// `inner`, which must arrive in full within `timeout` from now.
    pub fn new(inner: Body, timeout: Duration) -> Self {
        DeadlineBody { inner, deadline: Box::pin(tokio::time::sleep(timeout)), timeout }
    }
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match this.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut(this.timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Middleware: puts the configured body deadline on every request that has a body.
pub async fn limit_body_time(State(state): State<SharedState>, request: Request, next: Next) -> Response {
    let timeout = state.config.http_body_timeout;
    let request =
        request.map(|body| if body.is_end_stream() { body } else { Body::new(DeadlineBody::new(body, timeout)) });
    next.run(request).await
}

/// Whether `error` or anything it wraps is a [`BodyTimedOut`].
pub fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(error), |e| e.source()).any(|e| e.is::<BodyTimedOut>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use std::convert::Infallible;

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_fails_at_the_deadline() {
        let stalled = Body::from_stream(stream::pending::<Result<Bytes, Infallible>>());
        let body = Body::new(DeadlineBody::new(stalled, Duration::from_secs(30)));
        let error = axum::body::to_bytes(body, 1024).await.unwrap_err();
        assert!(is_body_timeout(&error), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_arrives_in_time_is_unchanged() {
        let chunks = stream::iter([Ok::<_, Infallible>(Bytes::from("ab")), Ok(Bytes::from("c"))]);
        let body = Body::new(DeadlineBody::new(Body::from_stream(chunks), Duration::from_secs(30)));
        assert_eq!(axum::body::to_bytes(body, 1024).await.unwrap(), "abc");
    }
}
