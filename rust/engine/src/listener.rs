//! Listening sockets in the async runtime, TCP or Unix: adopted from an
//! inherited fd, or bound to a ZeroMQ-style endpoint (`tcp://HOST:PORT`,
//! `ipc://PATH`, `ipc://@NAME`), the streams they accept, and the accept loop
//! of the engine sockets, which only lets this user's processes in.

use crate::fds::{ListeningSocket, LocalAddress};
use anyhow::{bail, Context, Result};
use std::future::Future;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// At most this many engine connections may be pending at once (accepted,
/// and not yet past their handshake or registration); more are refused.
pub const MAX_PENDING_CONNECTIONS: usize = 64;

/// A listening socket registered with the runtime.
pub enum StreamListener {
    /// TCP, IPv4 or IPv6.
    Tcp(TcpListener),
    /// A Unix socket; `socket_file` is the path this process bound, removed on drop.
    Unix {
        /// The listener.
        listener: UnixListener,
        /// The socket file created by `bind_endpoint`, if any.
        socket_file: Option<PathBuf>,
    },
}

/// A connection accepted by a [`StreamListener`]; reads and writes go to
/// whichever stream it holds.
pub enum AcceptedStream {
    /// From a TCP listener (`TCP_NODELAY` set).
    Tcp(TcpStream),
    /// From a Unix listener.
    Unix(UnixStream),
}

impl StreamListener {
    /// Wraps an adopted listening socket.
    pub fn from_socket(socket: ListeningSocket) -> Result<Self> {
        Ok(match socket.address {
            LocalAddress::Tcp(_) => {
                let std_listener = std::net::TcpListener::from(socket.fd);
                std_listener.set_nonblocking(true).context("making the socket non-blocking")?;
                StreamListener::Tcp(TcpListener::from_std(std_listener).context("registering the socket")?)
            }
            LocalAddress::Unix(_) | LocalAddress::UnixAbstract(_) => {
                let std_listener = std::os::unix::net::UnixListener::from(socket.fd);
                std_listener.set_nonblocking(true).context("making the socket non-blocking")?;
                let listener = UnixListener::from_std(std_listener).context("registering the socket")?;
                StreamListener::Unix { listener, socket_file: None }
            }
        })
    }

    /// Binds `endpoint` as libzmq would: `tcp://*:PORT` means every interface;
    /// for `ipc://PATH` a leftover socket file is replaced, and the file is
    /// removed again when the listener is dropped.
    pub fn bind_endpoint(endpoint: &str) -> Result<Self> {
        if let Some(address) = endpoint.strip_prefix("tcp://") {
            let address =
                address.strip_prefix("*:").map_or_else(|| address.to_string(), |port| format!("0.0.0.0:{port}"));
            let std_listener = std::net::TcpListener::bind(&address).with_context(|| format!("binding {endpoint}"))?;
            std_listener.set_nonblocking(true).context("making the socket non-blocking")?;
            return Ok(StreamListener::Tcp(TcpListener::from_std(std_listener).context("registering the socket")?));
        }
        let Some(path) = endpoint.strip_prefix("ipc://") else {
            bail!("{endpoint}: unsupported endpoint (tcp://HOST:PORT or ipc://PATH)");
        };
        let (std_listener, socket_file) = if let Some(name) = path.strip_prefix('@') {
            let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                .with_context(|| format!("{endpoint}: bad abstract socket name"))?;
            (
                std::os::unix::net::UnixListener::bind_addr(&address).with_context(|| format!("binding {endpoint}"))?,
                None,
            )
        } else {
            let path = PathBuf::from(path);
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket()) {
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing the old socket file {}", path.display()))?;
            }
            let listener =
                std::os::unix::net::UnixListener::bind(&path).with_context(|| format!("binding {endpoint}"))?;
            (listener, Some(path))
        };
        std_listener.set_nonblocking(true).context("making the socket non-blocking")?;
        let listener = UnixListener::from_std(std_listener).context("registering the socket")?;
        Ok(StreamListener::Unix { listener, socket_file })
    }

    /// The next connection.
    pub async fn accept(&self) -> io::Result<AcceptedStream> {
        match self {
            StreamListener::Tcp(listener) => {
                let (stream, _) = listener.accept().await?;
                let _ = stream.set_nodelay(true);
                Ok(AcceptedStream::Tcp(stream))
            }
            StreamListener::Unix { listener, .. } => Ok(AcceptedStream::Unix(listener.accept().await?.0)),
        }
    }
}

/// Why an accepted Unix-socket peer was refused.
#[derive(Debug, thiserror::Error)]
pub enum PeerCheckError {
    /// The kernel did not say who the peer is.
    #[error("cannot read the peer's credentials: {0}")]
    Unknown(#[source] io::Error),
    /// The peer runs as another user.
    #[error("the peer (pid {pid:?}) runs as uid {peer_uid}, not as this process's uid {own_uid}")]
    OtherUser {
        /// The peer's pid, when the kernel gives it.
        pid: Option<i32>,
        /// The peer's effective uid when it connected.
        peer_uid: u32,
        /// Ours.
        own_uid: u32,
    },
}

/// Checks that a Unix-socket peer is this process's user (`SO_PEERCRED`). A
/// TCP peer cannot be checked: engine sockets on TCP carry no authentication.
pub fn check_peer_user(stream: &AcceptedStream) -> Result<(), PeerCheckError> {
    let AcceptedStream::Unix(stream) = stream else { return Ok(()) };
    let credentials = stream.peer_cred().map_err(PeerCheckError::Unknown)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let own_uid = unsafe { libc::geteuid() };
    if credentials.uid() == own_uid {
        Ok(())
    } else {
        Err(PeerCheckError::OtherUser { pid: credentials.pid(), peer_uid: credentials.uid(), own_uid })
    }
}

/// A pending connection's place among the [`MAX_PENDING_CONNECTIONS`]; the
/// connection counts as pending until this is dropped.
pub type PendingPermit = OwnedSemaphorePermit;

/// Accepts engine connections on `listener` for as long as the task runs,
/// serving each with `serve` on a task of its own. A Unix-socket peer of
/// another user is refused, and so is any connection beyond
/// [`MAX_PENDING_CONNECTIONS`] pending ones (both logged, naming `what`). A
/// failed accept (out of fds, say) is logged and retried shortly after.
pub async fn accept_engine_connections<F, Fut>(listener: StreamListener, what: &str, serve: F)
where
    F: Fn(AcceptedStream, PendingPermit) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let pending = Arc::new(Semaphore::new(MAX_PENDING_CONNECTIONS));
    loop {
        match listener.accept().await {
            Ok(stream) => {
                if let Err(e) = check_peer_user(&stream) {
                    tracing::warn!("refused {what}: {e}");
                    continue;
                }
                let Ok(permit) = pending.clone().try_acquire_owned() else {
                    tracing::warn!("refused {what}: {MAX_PENDING_CONNECTIONS} connections are already pending");
                    continue;
                };
                tokio::spawn(serve(stream, permit));
            }
            Err(e) => {
                tracing::warn!("accepting {what} failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

impl AsyncRead for AcceptedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AcceptedStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            AcceptedStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for AcceptedStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            AcceptedStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            AcceptedStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            AcceptedStream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            AcceptedStream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AcceptedStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            AcceptedStream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AcceptedStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            AcceptedStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl Drop for StreamListener {
    fn drop(&mut self) {
        if let StreamListener::Unix { socket_file: Some(path), .. } = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_ipc_endpoint_replaces_a_stale_socket_file_and_removes_its_own() {
        let dir = std::env::temp_dir().join(format!("vllm-rs-listener-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("output.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap()); // leaves a stale socket file
        let listener = StreamListener::bind_endpoint(&format!("ipc://{}", path.display())).unwrap();
        let client = tokio::spawn({
            let path = path.clone();
            async move { UnixStream::connect(path).await.unwrap() }
        });
        assert!(matches!(listener.accept().await.unwrap(), AcceptedStream::Unix(_)));
        client.await.unwrap();
        drop(listener);
        assert!(!path.exists(), "the socket file outlived its listener");
        std::fs::remove_dir(&dir).unwrap();
    }

    #[tokio::test]
    async fn connections_beyond_the_pending_cap_are_refused_until_one_finishes() {
        use tokio::io::AsyncReadExt;
        let name = format!("vllm-rs-pending-cap-{}-{}", std::process::id(), crate::ids::random_hex(6));
        let listener = StreamListener::bind_endpoint(&format!("ipc://@{name}")).unwrap();
        let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        // Each connection stays pending until its client closes it.
        let accepting =
            tokio::spawn(accept_engine_connections(listener, "a test connection", move |mut stream, permit| {
                let events_tx = events_tx.clone();
                async move {
                    let _ = events_tx.send("served");
                    let _ = stream.read(&mut [0u8; 1]).await;
                    drop(permit);
                    let _ = events_tx.send("released");
                }
            }));
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let connect = || {
            let stream = std::os::unix::net::UnixStream::connect_addr(&address).unwrap();
            stream.set_nonblocking(true).unwrap();
            UnixStream::from_std(stream).unwrap()
        };
        let mut held: Vec<UnixStream> = (0..MAX_PENDING_CONNECTIONS).map(|_| connect()).collect();
        for _ in 0..MAX_PENDING_CONNECTIONS {
            assert_eq!(events.recv().await, Some("served"));
        }
        let mut refused = connect();
        let closed = tokio::time::timeout(Duration::from_secs(10), refused.read(&mut [0u8; 1])).await;
        assert_eq!(closed.expect("the connection over the cap was served").unwrap(), 0);
        drop(held.pop());
        assert_eq!(events.recv().await, Some("released"));
        let _admitted = connect();
        assert_eq!(events.recv().await, Some("served"), "a connection under the cap was not served");
        accepting.abort();
    }

    #[tokio::test]
    async fn unsupported_and_unbindable_endpoints_are_errors_naming_them() {
        let error = StreamListener::bind_endpoint("udp://127.0.0.1:5").err().unwrap().to_string();
        assert!(error.contains("udp://127.0.0.1:5"), "{error}");
        let error = StreamListener::bind_endpoint("ipc:///nonexistent-dir/x.sock").err().unwrap();
        assert!(format!("{error:#}").contains("ipc:///nonexistent-dir/x.sock"), "{error:#}");
    }
}
