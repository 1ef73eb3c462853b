//! The cap on open HTTP connections (`VLLM_RS_HTTP_MAX_CONNECTIONS`): at the
//! cap, a new connection makes room by closing the one idle the longest (no
//! request of its own running: waiting for its next request head, or for the
//! rest of one), so that clients that open connections and send nothing cannot
//! lock out the others nor use up the fds; when every connection is busy with
//! a request, the new one is closed instead.

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http_body_util::BodyExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Least time between two warnings about refused connections.
const REFUSAL_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// Every open connection, shared by the accept loop and the connections' tasks.
#[derive(Clone)]
pub struct ConnectionTable {
    inner: Arc<Mutex<Table>>,
}

struct Table {
    max: usize,
    next_id: u64,
    open: HashMap<u64, Entry>,
    last_refusal_warning: Option<Instant>,
}

struct Entry {
    /// Requests of this connection in flight (answer not yet fully sent).
    running: usize,
    /// When it last became idle; `None` while a request runs.
    idle_since: Option<Instant>,
    close: Arc<Notify>,
}

/// One admitted connection: its task watches `closed` and ends the connection
/// when told to; dropping it takes the connection off the table.
pub struct Admitted {
    id: u64,
    table: ConnectionTable,
    /// Notified when the connection must close to make room for another.
    pub closed: Arc<Notify>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.table.lock().open.remove(&self.id);
    }
}

impl ConnectionTable {
    /// A table that holds at most `max` connections (at least 1).
    pub fn new(max: usize) -> Self {
        let table = Table { max: max.max(1), next_id: 0, open: HashMap::new(), last_refusal_warning: None };
        Self { inner: Arc::new(Mutex::new(table)) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic elsewhere while holding the lock leaves the table consistent.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Admits a new connection, closing the one idle the longest when at the
    /// cap; `None` (the caller drops the connection) when every open one is
    /// busy with a request.
    pub fn admit(&self) -> Option<Admitted> {
        let mut table = self.lock();
        if table.open.len() >= table.max {
            let oldest = table
                .open
                .iter()
                .filter_map(|(id, entry)| entry.idle_since.map(|since| (since, *id)))
                .min()
                .map(|(_, id)| id);
            match oldest.and_then(|id| table.open.remove(&id)) {
                Some(evicted) => {
                    tracing::debug!(
                        "connection limit ({}) reached: closing the connection idle the longest",
                        table.max
                    );
                    evicted.close.notify_one();
                }
                None => {
                    let now = Instant::now();
                    if table.last_refusal_warning.is_none_or(|at| now - at >= REFUSAL_WARNING_INTERVAL) {
                        table.last_refusal_warning = Some(now);
                        tracing::warn!("refusing a connection: all {} connections are busy with requests", table.max);
                    }
                    return None;
                }
            }
        }
        let id = table.next_id;
        table.next_id += 1;
        let close = Arc::new(Notify::new());
        table.open.insert(id, Entry { running: 0, idle_since: Some(Instant::now()), close: close.clone() });
        drop(table);
        Some(Admitted { id, table: self.clone(), closed: close })
    }

    /// How many connections are open.
    pub fn open_count(&self) -> usize {
        self.lock().open.len()
    }

    fn started(&self, id: u64) {
        if let Some(entry) = self.lock().open.get_mut(&id) {
            entry.running += 1;
            entry.idle_since = None;
        }
    }

    fn finished(&self, id: u64) {
        if let Some(entry) = self.lock().open.get_mut(&id) {
            entry.running = entry.running.saturating_sub(1);
            if entry.running == 0 {
                entry.idle_since = Some(Instant::now());
            }
        }
    }
}

impl Admitted {
    /// Marks the connection busy: runs on every request it receives.
    pub fn track<B>(&self) -> impl Fn(Request<B>) -> Request<B> + Clone + Send + Sync + 'static {
        let (table, id) = (self.table.clone(), self.id);
        move |request| {
            table.started(id);
            request
        }
    }

    /// Wraps an answer so that the connection counts as idle again once its
    /// body is sent (or dropped).
    pub fn untrack(&self) -> impl Fn(Response) -> Response + Clone + Send + Sync + 'static {
        let (table, id) = (self.table.clone(), self.id);
        move |response: Response| {
            let guard = Finished { table: table.clone(), id };
            response.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _keep_until_the_body_is_dropped = &guard;
                    frame
                }))
            })
        }
    }
}

/// Marks its request finished when dropped (with the answer's body).
struct Finished {
    table: ConnectionTable,
    id: u64,
}

impl Drop for Finished {
    fn drop(&mut self) {
        self.table.finished(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_connection_idle_the_longest_makes_room() {
        let table = ConnectionTable::new(2);
        let first = table.admit().unwrap();
        let second = table.admit().unwrap();
        let third = table.admit().expect("an idle connection makes room");
        assert_eq!(table.open_count(), 2);
        // The first (idle the longest) was told to close, the second was not.
        let told = |a: &Admitted| {
            let notified = a.closed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable()
        };
        assert!(told(&first), "the oldest idle connection is closed");
        assert!(!told(&second));
        drop((first, second, third));
        assert_eq!(table.open_count(), 0);
    }

    #[test]
    fn connections_busy_with_requests_are_kept_and_the_new_one_is_refused() {
        let table = ConnectionTable::new(1);
        let busy = table.admit().unwrap();
        let request = (busy.track())(Request::new(Body::empty()));
        drop(request);
        assert!(table.admit().is_none(), "the only connection runs a request");
        let answer = (busy.untrack())(Response::new(Body::empty()));
        assert!(table.admit().is_none(), "still sending its answer");
        drop(answer);
        assert!(table.admit().is_some(), "idle once its answer is gone");
    }
}
