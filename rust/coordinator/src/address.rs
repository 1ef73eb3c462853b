//! The coordinator's publish address: `tcp://HOST:PORT`, `ipc://PATH` or
//! `ipc://@NAME` (Linux's abstract namespace), as vLLM formats it.

use std::io;
use std::os::unix::net::SocketAddr as UnixAddr;
use tokio::net::{TcpStream, UnixStream};

/// Why an address is unusable.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    /// Not one of the supported forms (the address is not repeated: command
    /// line errors never echo a value).
    #[error("unsupported coordinator address: expected tcp://HOST:PORT (port 1-65535), ipc://PATH or ipc://@NAME")]
    Unsupported,
}

/// Where the coordinator publishes, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorAddress {
    /// `tcp://HOST:PORT` (`HOST` may be a bracketed IPv6 address).
    Tcp {
        /// Host name or address, brackets removed.
        host: String,
        /// Port.
        port: u16,
    },
    /// `ipc://PATH`: a Unix socket file.
    Ipc(String),
    /// `ipc://@NAME`: an abstract Unix socket.
    Abstract(String),
}

/// A connected stream to the coordinator.
#[derive(Debug)]
pub enum Connection {
    /// Over TCP.
    Tcp(TcpStream),
    /// Over a Unix socket (file or abstract).
    Unix(UnixStream),
}

impl CoordinatorAddress {
    /// Parses `address`; an empty path, a missing or zero port, or another
    /// scheme is an error.
    pub fn parse(address: &str) -> Result<Self, AddressError> {
        let bad = || AddressError::Unsupported;
        if let Some(rest) = address.strip_prefix("ipc://") {
            return match rest.strip_prefix('@') {
                Some("") => Err(bad()),
                Some(name) => Ok(CoordinatorAddress::Abstract(name.to_string())),
                None if rest.is_empty() => Err(bad()),
                None => Ok(CoordinatorAddress::Ipc(rest.to_string())),
            };
        }
        let rest = address.strip_prefix("tcp://").ok_or_else(bad)?;
        let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        let port: u16 = port.parse().ok().filter(|&p| p != 0).ok_or_else(bad)?;
        if host.is_empty() || host == "*" {
            return Err(bad());
        }
        Ok(CoordinatorAddress::Tcp { host: host.to_string(), port })
    }

    /// Connects. On a Unix socket the peer must run as this process's
    /// effective user (`SO_PEERCRED`): the coordinator's messages steer
    /// where every request goes, so nobody else may play its part.
    pub async fn connect(&self) -> io::Result<Connection> {
        match self {
            CoordinatorAddress::Tcp { host, port } => {
                let stream = TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                Ok(Connection::Tcp(stream))
            }
            CoordinatorAddress::Ipc(path) => check_peer_user(UnixStream::connect(path).await?).map(Connection::Unix),
            CoordinatorAddress::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                let address = UnixAddr::from_abstract_name(name.as_bytes())?;
                let stream = std::os::unix::net::UnixStream::connect_addr(&address)?;
                stream.set_nonblocking(true)?;
                check_peer_user(UnixStream::from_std(stream)?).map(Connection::Unix)
            }
        }
    }
}

impl std::fmt::Display for CoordinatorAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CoordinatorAddress::Tcp { host, port } if host.contains(':') => write!(f, "tcp://[{host}]:{port}"),
            CoordinatorAddress::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            CoordinatorAddress::Ipc(path) => write!(f, "ipc://{path}"),
            CoordinatorAddress::Abstract(name) => write!(f, "ipc://@{name}"),
        }
    }
}

fn check_peer_user(stream: UnixStream) -> io::Result<UnixStream> {
    let peer = stream.peer_cred()?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let ours = unsafe { libc::geteuid() };
    if peer.uid() != ours {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the coordinator socket belongs to uid {} (pid {:?}), not to us (uid {ours})",
                peer.uid(),
                peer.pid()
            ),
        ));
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_vllm_formats() {
        assert_eq!(CoordinatorAddress::parse("ipc:///tmp/abc").unwrap(), CoordinatorAddress::Ipc("/tmp/abc".into()));
        assert_eq!(CoordinatorAddress::parse("ipc://@n").unwrap(), CoordinatorAddress::Abstract("n".into()));
        assert_eq!(
            CoordinatorAddress::parse("tcp://10.0.0.1:5555").unwrap(),
            CoordinatorAddress::Tcp { host: "10.0.0.1".into(), port: 5555 }
        );
        let v6 = CoordinatorAddress::parse("tcp://[::1]:7").unwrap();
        assert_eq!(v6, CoordinatorAddress::Tcp { host: "::1".into(), port: 7 });
        assert_eq!(v6.to_string(), "tcp://[::1]:7");
    }

    #[test]
    fn refuses_what_cannot_be_connected_to() {
        for bad in [
            "",
            "ipc://",
            "ipc://@",
            "tcp://host",
            "tcp://host:0",
            "tcp://:5",
            "tcp://*:5",
            "tcp://h:x",
            "udp://h:1",
            "/tmp/x",
        ] {
            let error = CoordinatorAddress::parse(bad).err().unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert!(error.to_string().contains("tcp://HOST:PORT"), "{error}");
        }
    }
}
