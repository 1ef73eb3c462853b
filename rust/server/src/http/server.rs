//! Serving HTTP/1.1 on the inherited listener, plain or in TLS: bounded
//! request heads (time and size), a bounded number of open connections
//! (`connections`), keep-alive timeout, graceful shutdown (stop accepting, let
//! requests in flight finish, bounded drain).

use crate::http::middleware::connections::{Admitted, ConnectionTable};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsAcceptor;
use vllm_rs_engine::listener::StreamListener;

/// Read buffer of a connection (hyper's default), raised to fit a larger head limit.
const READ_BUFFER_BYTES: usize = 8192 + 4096 * 100;

/// HTTP settings.
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// Idle time after which a keep-alive connection is closed.
    pub keep_alive_timeout: Duration,
    /// Time to receive a request head.
    pub header_timeout: Duration,
    /// Largest request head (bytes): a larger one gets 431 and the connection closes.
    pub max_header_bytes: usize,
    /// Most header lines in a request head (hyper's default when not given).
    pub max_header_count: Option<usize>,
    /// Most connections open at once (`connections` says what happens at the cap).
    pub max_connections: usize,
    /// How long requests in flight may run after shutdown starts.
    pub drain_timeout: Duration,
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting
/// and waits at most `drain_timeout` for open connections. Returns whether
/// every connection finished in time. With `tls`, every connection is a TLS
/// one: its handshake runs in the connection's own task, bounded by the
/// header timeout, and a failed handshake only ends that connection.
pub async fn serve(
    listener: StreamListener,
    app: Router,
    options: ServeOptions,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) -> bool {
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    // hyper starts the head clock when a connection waits for its next request,
    // idle time included: one timer bounds both, so it runs the shorter of the two.
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout.min(options.keep_alive_timeout))
        .max_header_size(options.max_header_bytes)
        .max_buf_size(options.max_header_bytes.max(READ_BUFFER_BYTES))
        .keep_alive(true);
    if let Some(count) = options.max_header_count {
        builder.max_headers(count);
    }
    let table = ConnectionTable::new(options.max_connections);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!("accepting an HTTP connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(admitted) = table.admit() else { continue }; // dropping the stream closes it
        match &tls {
            None => spawn_connection(&builder, graceful.watcher(), stream, app.clone(), admitted),
            Some(acceptor) => {
                let (acceptor, builder, watcher, app) =
                    (acceptor.clone(), builder.clone(), graceful.watcher(), app.clone());
                let handshake_timeout = options.header_timeout;
                tokio::spawn(async move {
                    let handshake = tokio::time::timeout(handshake_timeout, acceptor.accept(stream));
                    let handshake = tokio::select! {
                        () = admitted.closed.notified() => return, // evicted mid-handshake
                        handshake = handshake => handshake,
                    };
                    match handshake {
                        Ok(Ok(stream)) => spawn_connection(&builder, watcher, stream, app, admitted),
                        Ok(Err(e)) => tracing::debug!("TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!("TLS handshake timed out after {handshake_timeout:?}"),
                    }
                });
            }
        }
    }
    drop(listener);
    tracing::info!("stopped accepting HTTP connections; draining for at most {:?}", options.drain_timeout);
    tokio::time::timeout(options.drain_timeout, graceful.shutdown()).await.is_ok()
}

/// Serves one connection in its own task, until it ends or the connection
/// table closes it to make room for another.
fn spawn_connection<I>(
    builder: &hyper::server::conn::http1::Builder,
    watcher: Watcher,
    io: I,
    app: Router,
    admitted: Admitted,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let app = tower::ServiceExt::map_request(app, admitted.track::<hyper::body::Incoming>());
    let app = tower::ServiceExt::map_response(app, admitted.untrack());
    let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    let connection = watcher.watch(connection);
    tokio::spawn(async move {
        tokio::select! {
            ended = connection => if let Err(e) = ended {
                tracing::debug!("HTTP connection ended: {e}");
            },
            () = admitted.closed.notified() => {} // dropping the connection closes it
        }
    });
}
