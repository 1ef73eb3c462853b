//! A hook run once, when the server has its first response ready.
//!
//! What a frontend defers until then (building its tokenizer's tables) does
//! not compete for the CPU, or for the address-space lock that the first
//! requests' page faults take, with the first answer, which is usually a
//! launcher's readiness probe.

use axum::response::Response;
use axum::Router;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The hook, taken by the first response.
type Hook = Arc<Mutex<Option<Box<dyn FnOnce() + Send>>>>;

/// `router`, running `hook` once its first response (any route, any status)
/// is ready to be written; later responses pay one atomic load.
pub fn on_first_response(router: Router, hook: impl FnOnce() + Send + 'static) -> Router {
    let fired = Arc::new(AtomicBool::new(false));
    let hook: Hook = Arc::new(Mutex::new(Some(Box::new(hook))));
    router.layer(axum::middleware::map_response(move |response: Response| {
        if !fired.load(Ordering::Relaxed) && !fired.swap(true, Ordering::AcqRel) {
            if let Some(hook) = hook.lock().unwrap_or_else(|e| e.into_inner()).take() {
                hook();
            }
        }
        std::future::ready(response)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use axum::routing::get;
    use std::sync::atomic::AtomicUsize;
    use tower::ServiceExt;

    #[tokio::test]
    async fn the_hook_runs_once_with_the_first_response_whatever_its_status() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let app = on_first_response(Router::new().route("/ok", get(|| async { "ok" })), move || {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(runs.load(Ordering::SeqCst), 0, "ran before any request");
        let missing = app.clone().oneshot(Request::get("/missing").body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(missing.status(), 404);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        for _ in 0..3 {
            let ok = app.clone().oneshot(Request::get("/ok").body(Body::empty()).unwrap()).await.unwrap();
            assert_eq!(ok.status(), 200);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1, "ran again after the first response");
    }
}
