//! Serving HTTP/1.1 on the inherited listener: keep-alive timeout, graceful
//! shutdown (stop accepting, let requests in flight finish, bounded drain).

use crate::fds::{LocalAddress, ListeningSocket};
use anyhow::{Context, Result};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};

/// The HTTP listener: TCP or Unix.
pub enum HttpListener {
    /// TCP, IPv4 or IPv6.
    Tcp(TcpListener),
    /// A Unix socket.
    Unix(UnixListener),
}

impl HttpListener {
    /// Wraps an adopted listening socket for tokio.
    pub fn from_socket(socket: ListeningSocket) -> Result<Self> {
        Ok(match socket.address {
            LocalAddress::Tcp(_) => {
                let std_listener = std::net::TcpListener::from(socket.fd);
                std_listener.set_nonblocking(true).context("making the HTTP socket non-blocking")?;
                HttpListener::Tcp(TcpListener::from_std(std_listener).context("registering the HTTP socket")?)
            }
            LocalAddress::Unix(_) | LocalAddress::UnixAbstract(_) => {
                let std_listener = std::os::unix::net::UnixListener::from(socket.fd);
                std_listener.set_nonblocking(true).context("making the HTTP socket non-blocking")?;
                HttpListener::Unix(UnixListener::from_std(std_listener).context("registering the HTTP socket")?)
            }
        })
    }
}

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
pub async fn serve(listener: HttpListener, app: Router, options: ServeOptions, shutdown: impl Future<Output = ()>) -> bool {
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(options.keep_alive_timeout).keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = accept(&listener) => accepted,
        };
        match accepted {
            Ok(Connection::Tcp(stream)) => {
                let _ = stream.set_nodelay(true);
                spawn_connection(&builder, &graceful, stream, app.clone());
            }
            Ok(Connection::Unix(stream)) => spawn_connection(&builder, &graceful, stream, app.clone()),
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

enum Connection {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

async fn accept(listener: &HttpListener) -> std::io::Result<Connection> {
    match listener {
        HttpListener::Tcp(l) => l.accept().await.map(|(s, _)| Connection::Tcp(s)),
        HttpListener::Unix(l) => l.accept().await.map(|(s, _)| Connection::Unix(s)),
    }
}

fn spawn_connection<IO>(builder: &hyper::server::conn::http1::Builder, graceful: &GracefulShutdown, io: IO, app: Router)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    let connection = graceful.watch(connection);
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("HTTP connection ended: {e}");
        }
    });
}
