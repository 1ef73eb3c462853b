//! Serving HTTP/1.1 on the inherited listener: keep-alive timeout, graceful
//! shutdown (stop accepting, let requests in flight finish, bounded drain).

use crate::listener::{AcceptedStream, StreamListener};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;

/// HTTP settings.
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// Idle time after which a keep-alive connection is closed.
    pub keep_alive_timeout: Duration,
    /// How long requests in flight may run after shutdown starts.
    pub drain_timeout: Duration,
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting
/// and waits at most `drain_timeout` for open connections. Returns whether
/// every connection finished in time.
pub async fn serve(listener: StreamListener, app: Router, options: ServeOptions, shutdown: impl Future<Output = ()>) -> bool {
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(options.keep_alive_timeout).keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok(stream) => spawn_connection(&builder, &graceful, stream, app.clone()),
            Err(e) => {
                tracing::warn!("accepting an HTTP connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    drop(listener);
    tracing::info!("stopped accepting HTTP connections; draining for at most {:?}", options.drain_timeout);
    tokio::time::timeout(options.drain_timeout, graceful.shutdown()).await.is_ok()
}

fn spawn_connection(builder: &hyper::server::conn::http1::Builder, graceful: &GracefulShutdown, io: AcceptedStream, app: Router) {
    let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    let connection = graceful.watch(connection);
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("HTTP connection ended: {e}");
        }
    });
}
