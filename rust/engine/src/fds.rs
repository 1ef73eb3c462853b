//! Inherited socket fds: checked (a bad fd is a usage error naming its flag),
//! set listening when only bound, and described by their local address.

use std::ffi::OsStr;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use vllm_rs_config::error::ExitError;

/// Backlog used when an inherited socket is bound but not yet listening.
const LISTEN_BACKLOG: libc::c_int = 4096;

/// The local address of a listening socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalAddress {
    /// A TCP socket (IPv4 or IPv6).
    Tcp(SocketAddr),
    /// A Unix socket bound to a path.
    Unix(PathBuf),
    /// A Unix socket in the abstract namespace (name without the leading NUL).
    UnixAbstract(Vec<u8>),
}

impl LocalAddress {
    /// The ZeroMQ endpoint naming this address (`tcp://...` or `ipc://...`).
    pub fn zmq_endpoint(&self) -> String {
        match self {
            LocalAddress::Tcp(SocketAddr::V4(a)) => format!("tcp://{}:{}", a.ip(), a.port()),
            LocalAddress::Tcp(SocketAddr::V6(a)) => format!("tcp://[{}]:{}", a.ip(), a.port()),
            LocalAddress::Unix(path) => format!("ipc://{}", path.display()),
            LocalAddress::UnixAbstract(name) => format!("ipc://@{}", String::from_utf8_lossy(name)),
        }
    }
}

/// An inherited stream socket that is now listening.
#[derive(Debug)]
pub struct ListeningSocket {
    /// The socket itself; closed on drop unless taken.
    pub fd: OwnedFd,
    /// Its local address.
    pub address: LocalAddress,
}

/// Takes ownership of the inherited socket `fd` given by `--{flag}`: checks that
/// it is an open stream socket, calls `listen` on it (harmless when it already
/// listens) and reads its address. Any problem is a usage error naming the flag.
pub fn adopt_listening_socket(fd: RawFd, flag: &str) -> Result<ListeningSocket, ExitError> {
    let bad = |why: String| ExitError::usage(format!("--{flag} {fd}: {why}"));
    if fd < 0 {
        return Err(bad("not a file descriptor".into()));
    }
    // SAFETY: F_GETFD only inspects the descriptor table.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(bad(format!("not an open file descriptor ({})", io::Error::last_os_error())));
    }
    let sock_type = getsockopt_int(fd, libc::SO_TYPE).map_err(|e| bad(format!("not a socket ({e})")))?;
    if sock_type != libc::SOCK_STREAM {
        return Err(bad(format!("not a stream socket (type {sock_type})")));
    }
    let address = local_address(fd).map_err(|e| bad(format!("cannot read its address ({e})")))?;
    if let LocalAddress::Tcp(a) = &address {
        if a.port() == 0 {
            return Err(bad("socket is not bound".into()));
        }
    }
    // SAFETY: plain syscalls on a descriptor we checked; we take ownership below.
    unsafe {
        if libc::listen(fd, LISTEN_BACKLOG) != 0 {
            return Err(bad(format!("cannot listen ({})", io::Error::last_os_error())));
        }
        let flags = libc::fcntl(fd, libc::F_GETFD);
        libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
    }
    // SAFETY: the fd is open, ours (inherited for us), and owned by nobody else here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(ListeningSocket { fd, address })
}

fn getsockopt_int(fd: RawFd, option: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: value/len describe a valid c_int buffer.
    let rc =
        unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, option, (&mut value as *mut libc::c_int).cast(), &mut len) };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn local_address(fd: RawFd) -> io::Result<LocalAddress> {
    // SAFETY: sockaddr_storage is plain data; getsockname writes at most `len` bytes.
    let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    if unsafe { libc::getsockname(fd, (&mut storage as *mut libc::sockaddr_storage).cast(), &mut len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says this is a sockaddr_in.
            let a: libc::sockaddr_in = unsafe { *(&storage as *const libc::sockaddr_storage).cast() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Ok(LocalAddress::Tcp(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port)))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this is a sockaddr_in6.
            let a: libc::sockaddr_in6 = unsafe { *(&storage as *const libc::sockaddr_storage).cast() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            let addr = SocketAddrV6::new(ip, u16::from_be(a.sin6_port), a.sin6_flowinfo, a.sin6_scope_id);
            Ok(LocalAddress::Tcp(SocketAddr::V6(addr)))
        }
        libc::AF_UNIX => {
            // SAFETY: the family says this is a sockaddr_un.
            let a: libc::sockaddr_un = unsafe { *(&storage as *const libc::sockaddr_storage).cast() };
            let path_len = (len as usize).saturating_sub(size_of::<libc::sa_family_t>());
            let raw: Vec<u8> = a.sun_path[..path_len.min(a.sun_path.len())].iter().map(|&c| c as u8).collect();
            match raw.first() {
                None => Err(io::Error::new(io::ErrorKind::InvalidInput, "unix socket is not bound")),
                Some(0) => Ok(LocalAddress::UnixAbstract(raw[1..].to_vec())),
                Some(_) => {
                    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
                    Ok(LocalAddress::Unix(PathBuf::from(OsStr::from_bytes(&raw[..end]))))
                }
            }
        }
        family => Err(io::Error::new(io::ErrorKind::InvalidInput, format!("unsupported address family {family}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    #[test]
    fn bound_tcp_socket_is_set_listening() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let sock = adopt_listening_socket(listener.into_raw_fd(), "listen-fd").unwrap();
        assert_eq!(sock.address.zmq_endpoint(), format!("tcp://127.0.0.1:{port}"));
    }

    #[test]
    fn unix_socket_address_is_an_ipc_endpoint() {
        let dir = std::env::temp_dir().join(format!("vllm-rs-fds-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let listener = std::os::unix::net::UnixListener::bind(&dir).unwrap();
        let sock = adopt_listening_socket(listener.into_raw_fd(), "listen-fd").unwrap();
        assert_eq!(sock.address.zmq_endpoint(), format!("ipc://{}", dir.display()));
        std::fs::remove_file(&dir).unwrap();
    }

    #[test]
    fn bad_fds_name_the_flag() {
        let err = adopt_listening_socket(987, "input-listener-fd").unwrap_err().to_string();
        assert!(err.contains("--input-listener-fd 987"), "{err}");
        let file = std::fs::File::open("/dev/null").unwrap();
        let err = adopt_listening_socket(file.into_raw_fd(), "listen-fd").unwrap_err().to_string();
        assert!(err.contains("--listen-fd") && err.contains("not a socket"), "{err}");
    }
}
