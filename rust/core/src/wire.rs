//! The private protocol between a supervising process and its guardian.
//!
//! One Unix stream socket carries length-prefixed messages (`u32` little
//! endian length, then the body). File descriptors ride along with a message
//! as `SCM_RIGHTS` ancillary data on its first bytes.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Most descriptors one message may carry (the kernel's `SCM_MAX_FD` is 253).
pub const MAX_FDS: usize = 250;

/// Messages from the supervisor to the guardian.
#[derive(Debug)]
pub enum Request {
    /// Start `program` with `argv`, `env` and `cwd`; the attached fds land at
    /// `fd_targets` (same order) and nothing else stays open.
    Spawn {
        id: u64,
        program: Vec<u8>,
        argv: Vec<Vec<u8>>,
        env: Vec<Vec<u8>>,
        cwd: Option<Vec<u8>>,
        fd_targets: Vec<RawFd>,
    },
    /// When the supervisor is gone, remove `path` if it is still the file or
    /// directory with this device, inode and file type (`st_mode & S_IFMT`;
    /// see [`crate::removal`]). Answered with [`Reply::Acknowledged`] once
    /// registered.
    RemoveOnExit { id: u64, path: Vec<u8>, dev: u64, ino: u64, file_type: u32 },
    /// Forget every registration of `path` (the supervisor removed it
    /// itself). Answered with [`Reply::Acknowledged`].
    CancelRemoveOnExit { id: u64, path: Vec<u8> },
}

/// Where a spawn failed, as reported back to the supervisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailStage {
    /// `execve` itself failed (missing file, not executable, ...).
    Exec = 0,
    /// Changing to the working directory failed.
    Chdir = 1,
    /// Placing an inherited fd failed.
    Fd = 2,
    /// `fork` failed in the guardian.
    Fork = 3,
}

impl FailStage {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => FailStage::Exec,
            1 => FailStage::Chdir,
            2 => FailStage::Fd,
            _ => FailStage::Fork,
        }
    }
}

/// Messages from the guardian to the supervisor.
#[derive(Debug)]
pub enum Reply {
    /// The guardian is set up (subreaper, parent-death signal) and listening.
    Ready { pid: i32 },
    /// Spawn `id` is running as `pid`; its pid fd is attached.
    Spawned { id: u64, pid: i32 },
    /// Spawn `id` failed with `errno` at `stage` (`detail`: the fd, if any).
    Failed { id: u64, errno: i32, stage: FailStage, detail: i32 },
    /// Child `id` was reaped with this raw wait status.
    Exited { id: u64, status: i32 },
    /// Request `id` (a registration or its cancellation) has taken effect.
    Acknowledged { id: u64 },
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
    }
    fn list(&mut self, v: &[Vec<u8>]) {
        self.u32(v.len() as u32);
        for item in v {
            self.bytes(item);
        }
    }
}

struct Reader<'a>(&'a [u8]);

fn truncated() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "truncated guardian message")
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        if self.0.len() < n {
            return Err(truncated());
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn i32(&mut self) -> io::Result<i32> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn bytes(&mut self) -> io::Result<Vec<u8>> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn list(&mut self) -> io::Result<Vec<Vec<u8>>> {
        let n = self.u32()? as usize;
        (0..n).map(|_| self.bytes()).collect()
    }
}

impl Request {
    /// Serializes the request body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        match self {
            Request::Spawn { id, program, argv, env, cwd, fd_targets } => {
                w.u8(1);
                w.u64(*id);
                w.bytes(program);
                w.list(argv);
                w.list(env);
                match cwd {
                    Some(c) => {
                        w.u8(1);
                        w.bytes(c);
                    }
                    None => w.u8(0),
                }
                w.u32(fd_targets.len() as u32);
                for fd in fd_targets {
                    w.i32(*fd);
                }
            }
            Request::RemoveOnExit { id, path, dev, ino, file_type } => {
                w.u8(2);
                w.u64(*id);
                w.bytes(path);
                w.u64(*dev);
                w.u64(*ino);
                w.u32(*file_type);
            }
            Request::CancelRemoveOnExit { id, path } => {
                w.u8(3);
                w.u64(*id);
                w.bytes(path);
            }
        }
        w.0
    }

    /// Parses a request body.
    pub fn decode(body: &[u8]) -> io::Result<Self> {
        let mut r = Reader(body);
        match r.u8()? {
            1 => {
                let id = r.u64()?;
                let program = r.bytes()?;
                let argv = r.list()?;
                let env = r.list()?;
                let cwd = if r.u8()? == 1 { Some(r.bytes()?) } else { None };
                let n = r.u32()? as usize;
                let fd_targets = (0..n).map(|_| r.i32()).collect::<io::Result<_>>()?;
                Ok(Request::Spawn { id, program, argv, env, cwd, fd_targets })
            }
            2 => Ok(Request::RemoveOnExit {
                id: r.u64()?,
                path: r.bytes()?,
                dev: r.u64()?,
                ino: r.u64()?,
                file_type: r.u32()?,
            }),
            3 => Ok(Request::CancelRemoveOnExit { id: r.u64()?, path: r.bytes()? }),
            kind => Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown guardian request kind {kind}"))),
        }
    }
}

impl Reply {
    /// Serializes the reply body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        match self {
            Reply::Ready { pid } => {
                w.u8(1);
                w.i32(*pid);
            }
            Reply::Spawned { id, pid } => {
                w.u8(2);
                w.u64(*id);
                w.i32(*pid);
            }
            Reply::Failed { id, errno, stage, detail } => {
                w.u8(3);
                w.u64(*id);
                w.i32(*errno);
                w.u8(*stage as u8);
                w.i32(*detail);
            }
            Reply::Exited { id, status } => {
                w.u8(4);
                w.u64(*id);
                w.i32(*status);
            }
            Reply::Acknowledged { id } => {
                w.u8(5);
                w.u64(*id);
            }
        }
        w.0
    }

    /// Parses a reply body.
    pub fn decode(body: &[u8]) -> io::Result<Self> {
        let mut r = Reader(body);
        Ok(match r.u8()? {
            1 => Reply::Ready { pid: r.i32()? },
            2 => Reply::Spawned { id: r.u64()?, pid: r.i32()? },
            3 => Reply::Failed { id: r.u64()?, errno: r.i32()?, stage: FailStage::from_u8(r.u8()?), detail: r.i32()? },
            4 => Reply::Exited { id: r.u64()?, status: r.i32()? },
            5 => Reply::Acknowledged { id: r.u64()? },
            kind => {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown guardian reply kind {kind}")))
            }
        })
    }
}

/// Sends one framed message with `fds` attached.
pub fn send(sock: &UnixStream, body: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot pass {} fds to one child (at most {MAX_FDS})", fds.len()),
        ));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(body);

    let sent = sendmsg_with_fds(sock.as_raw_fd(), &frame, fds)?;
    (&*sock).write_all(&frame[sent..])
}

fn sendmsg_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() };
    let fd_bytes = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: an all-zero msghdr is valid; we fill in the fields we use.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr() as *mut _;
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer is large enough for one cmsg of `fd_bytes`.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg) as *mut RawFd, fds.len());
        }
    }
    loop {
        // SAFETY: `msg` points at live buffers for the duration of the call.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Receives one framed message and the fds attached to it. `Ok(None)` means
/// the peer closed the connection cleanly between messages.
pub fn recv(sock: &UnixStream) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut header = [0u8; 4];
    let (n, fds) = recvmsg_with_fds(sock.as_raw_fd(), &mut header)?;
    if n == 0 {
        return Ok(None);
    }
    (&*sock).read_exact(&mut header[n..])?;
    let len = u32::from_le_bytes(header) as usize;
    let mut body = vec![0u8; len];
    (&*sock).read_exact(&mut body)?;
    Ok(Some((body, fds)))
}

fn recvmsg_with_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut _, iov_len: buf.len() };
    // SAFETY: pure computation.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: an all-zero msghdr is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut _;
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: `msg` points at live buffers for the duration of the call.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `cbuf`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "guardian message carried too many fds"));
    }
    Ok((n, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_request_round_trips() {
        let req = Request::Spawn {
            id: 7,
            program: b"/bin/true".to_vec(),
            argv: vec![b"true".to_vec(), b"x y".to_vec()],
            env: vec![b"A=1".to_vec()],
            cwd: Some(b"/tmp".to_vec()),
            fd_targets: vec![0, 1, 2, 9],
        };
        match Request::decode(&req.encode()).unwrap() {
            Request::Spawn { id, program, argv, env, cwd, fd_targets } => {
                assert_eq!(id, 7);
                assert_eq!(program, b"/bin/true");
                assert_eq!(argv, vec![b"true".to_vec(), b"x y".to_vec()]);
                assert_eq!(env, vec![b"A=1".to_vec()]);
                assert_eq!(cwd.as_deref(), Some(&b"/tmp"[..]));
                assert_eq!(fd_targets, vec![0, 1, 2, 9]);
            }
            other => panic!("decoded {other:?}"),
        }
        let req = Request::RemoveOnExit { id: 8, path: b"/tmp/s".to_vec(), dev: 3, ino: 99, file_type: 0o140000 };
        match Request::decode(&req.encode()).unwrap() {
            Request::RemoveOnExit { id, path, dev, ino, file_type } => {
                assert_eq!((id, path, dev, ino, file_type), (8, b"/tmp/s".to_vec(), 3, 99, 0o140000))
            }
            other => panic!("decoded {other:?}"),
        }
        let req = Request::CancelRemoveOnExit { id: 9, path: b"/tmp/d".to_vec() };
        match Request::decode(&req.encode()).unwrap() {
            Request::CancelRemoveOnExit { id, path } => assert_eq!((id, path), (9, b"/tmp/d".to_vec())),
            other => panic!("decoded {other:?}"),
        }
    }

    #[test]
    fn truncated_reply_is_an_error_not_a_panic() {
        for reply in [Reply::Exited { id: 1, status: 0 }, Reply::Acknowledged { id: 2 }] {
            let body = reply.encode();
            for cut in 0..body.len() {
                assert!(Reply::decode(&body[..cut]).is_err(), "cut at {cut} of {reply:?}");
            }
        }
        assert!(matches!(Reply::decode(&Reply::Acknowledged { id: 5 }.encode()), Ok(Reply::Acknowledged { id: 5 })));
    }

    #[test]
    fn fds_travel_with_a_message() {
        let (a, b) = UnixStream::pair().unwrap();
        let (r, w) = crate::sys::pipe().unwrap();
        send(&a, &Reply::Spawned { id: 3, pid: 42 }.encode(), &[r.as_raw_fd()]).unwrap();
        drop(r);
        let (body, fds) = recv(&b).unwrap().unwrap();
        assert!(matches!(Reply::decode(&body).unwrap(), Reply::Spawned { id: 3, pid: 42 }));
        assert_eq!(fds.len(), 1);
        // The received fd is the pipe's read end: data written shows up there.
        (&std::fs::File::from(w)).write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        std::fs::File::from(fds.into_iter().next().unwrap()).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
    }
}
