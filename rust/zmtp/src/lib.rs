//! ZeroMQ's wire protocol (ZMTP 3.0, NULL security mechanism) on a stream,
//! for the vllm-rs frontend's sockets: on accepted streams, a PULL for the
//! engines' PUSH (outputs) and a ROUTER for their DEALER (inputs); on a
//! connected one, an XSUB to the data-parallel coordinator's XPUB.
//!
//! With libzmq, every message crosses its I/O thread, a pipe and a mailbox
//! wake-up between the socket and the async runtime. Speaking the protocol in
//! the runtime itself takes one `read` or `write` per many messages and no
//! thread hop. Only what those sockets need is here: the greeting, the
//! READY handshake (checking the peer's socket type, reading its identity),
//! data frames, and PING (the caller answers with [`pong_frame`]; the
//! reader honours the TTL it announces, below). The first
//! frame of each incoming message is returned; its later (aux) frames, which
//! vLLM's engines use for large arrays (logprobs), are kept beside it
//! ([`FrameReader::aux_frames`]): a message without them costs nothing extra.
//!
//! A PING carries a TTL (ZMTP 3.1: 16 bits, in tenths of a second) telling
//! the receiver to drop the connection when nothing arrives from the peer
//! for that long, which is how a peer whose link was cut (no FIN, no RST)
//! is noticed. libzmq arms that timer at each PING with a non-zero TTL and
//! disarms it on any later traffic; a peer that keeps its heartbeat sends
//! PINGs more often than its TTL, so the reader here keeps the simpler form
//! of the same rule: once a PING announced a TTL, a read that waits longer
//! than it after the last bytes received fails with
//! [`ZmtpError::PeerSilent`]; a PING with TTL 0 lifts the bound.
//!
//! Spec: <https://rfc.zeromq.org/spec/23/> (ZMTP 3.0), <https://rfc.zeromq.org/spec/37/> (3.1 commands).

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};

/// The default for [`FrameLimits::max_message_bytes`]: 256 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 256 << 20;

/// A command frame (READY, PING, ...) may be at most this large: the ones we
/// read carry a few properties or a 16-byte context.
pub const MAX_COMMAND_BYTES: u64 = 64 << 10;

/// What a connection accepts from its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// The largest message (all its frames together) accepted; a frame
    /// announcing more ends the connection before any of it is buffered.
    pub max_message_bytes: u64,
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits { max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES }
    }
}

/// How long a connecting peer has to complete the handshake.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

const GREETING_LEN: usize = 64;
const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;
/// Bytes read from the stream at a time (at least).
const READ_CHUNK: usize = 64 << 10;
/// At most this much is reserved for a frame before its bytes arrive.
const UPFRONT_RESERVE_LIMIT: usize = 1 << 20;

/// Why a connection cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum ZmtpError {
    /// The stream failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the protocol (or is not a ZeroMQ PUSH socket).
    #[error("ZMTP protocol error: {0}")]
    Protocol(String),
    /// Nothing arrived from the peer within the TTL its last PING announced.
    #[error("the peer sent nothing for {0:?}, the heartbeat TTL its last PING announced")]
    PeerSilent(std::time::Duration),
}

fn protocol(why: impl Into<String>) -> ZmtpError {
    ZmtpError::Protocol(why.into())
}

/// Our greeting: ZMTP 3.0, mechanism NULL, not a server of a security handshake.
fn greeting() -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[0] = 0xFF;
    g[8] = 0x01; // padding read as a ZMTP 1.0 length by old peers
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = 0;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// Appends a frame with `flags` holding `body`: a short header when the body
/// fits in 255 bytes, else a long one.
fn push_frame(flags: u8, body: &[u8], out: &mut Vec<u8>) {
    match u8::try_from(body.len()) {
        Ok(len) => out.extend_from_slice(&[flags, len]),
        Err(_) => {
            out.push(flags | FLAG_LONG);
            out.extend_from_slice(&(body.len() as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(body);
}

/// A command frame holding `body`.
fn command_frame(body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(body.len() + 9);
    push_frame(FLAG_COMMAND, body, &mut frame);
    frame
}

/// The READY command announcing a `socket_type` socket.
fn ready_command(socket_type: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.push(5);
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    command_frame(&body)
}

/// Splits a command body into its name and data.
fn command_parts(body: &[u8]) -> Result<(&[u8], &[u8]), ZmtpError> {
    let (&len, rest) = body.split_first().ok_or_else(|| protocol("empty command"))?;
    if rest.len() < len as usize {
        return Err(protocol("command name longer than its frame"));
    }
    Ok(rest.split_at(len as usize))
}

/// The value of property `wanted` in READY metadata.
fn property<'a>(mut metadata: &'a [u8], wanted: &[u8]) -> Result<Option<&'a [u8]>, ZmtpError> {
    while !metadata.is_empty() {
        let name_len = metadata[0] as usize;
        if metadata.len() < 1 + name_len + 4 {
            return Err(protocol("truncated READY property"));
        }
        let name = &metadata[1..1 + name_len];
        let value_len = u32::from_be_bytes(metadata[1 + name_len..5 + name_len].try_into().unwrap()) as usize;
        let rest = &metadata[5 + name_len..];
        if rest.len() < value_len {
            return Err(protocol("truncated READY property value"));
        }
        if name.eq_ignore_ascii_case(wanted) {
            return Ok(Some(&rest[..value_len]));
        }
        metadata = &rest[value_len..];
    }
    Ok(None)
}

/// A frame header: flags and body size, and how many bytes the header took.
struct FrameHeader {
    flags: u8,
    size: u64,
    len: usize,
}

fn parse_header(buf: &[u8]) -> Option<FrameHeader> {
    let &flags = buf.first()?;
    if flags & FLAG_LONG != 0 {
        let size = u64::from_be_bytes(buf.get(1..9)?.try_into().unwrap());
        Some(FrameHeader { flags, size, len: 9 })
    } else {
        Some(FrameHeader { flags, size: u64::from(*buf.get(1)?), len: 2 })
    }
}

/// What a peer sent: a message (its first frame) or a PING to answer.
#[derive(Debug, PartialEq)]
pub enum Incoming {
    /// The first frame of a message.
    Message(Bytes),
    /// A PING; answer with `pong_frame(&context)`.
    Ping(Vec<u8>),
}

/// A peer past the handshake: its frames, the write half, its identity.
pub struct Peer<S> {
    /// Reads the peer's frames.
    pub reader: FrameReader<ReadHalf<S>>,
    /// Writes to the peer.
    pub writer: WriteHalf<S>,
    /// The peer's `Identity` property (empty when it sent none).
    pub identity: Vec<u8>,
}

/// Runs the ZMTP handshake on `stream` as a `socket_type` socket and checks
/// that the peer is a `peer_type` socket; a peer that has not finished it
/// within `HANDSHAKE_TIMEOUT` is dropped.
pub async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    socket_type: &str,
    peer_type: &str,
    limits: FrameLimits,
) -> Result<Peer<S>, ZmtpError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, run_handshake(stream, socket_type, peer_type, limits))
        .await
        .unwrap_or_else(|_| Err(protocol(format!("no ZMTP handshake within {HANDSHAKE_TIMEOUT:?}"))))
}

async fn run_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    socket_type: &str,
    peer_type: &str,
    limits: FrameLimits,
) -> Result<Peer<S>, ZmtpError> {
    stream.write_all(&greeting()).await?;
    let mut peer = [0u8; GREETING_LEN];
    stream.read_exact(&mut peer).await?;
    if peer[0] != 0xFF || peer[9] != 0x7F {
        return Err(protocol("the peer did not send a ZMTP 3 greeting"));
    }
    if peer[10] < 3 {
        return Err(protocol(format!("the peer speaks ZMTP {}.x; 3.0 or later is needed", peer[10])));
    }
    let mechanism = &peer[12..32];
    if !mechanism.starts_with(b"NULL") || mechanism[4..].iter().any(|&b| b != 0) {
        let name = String::from_utf8_lossy(mechanism).trim_end_matches('\0').to_string();
        return Err(protocol(format!("security mechanism {name:?} is not supported (NULL only)")));
    }
    stream.write_all(&ready_command(socket_type)).await?;
    let (read_half, writer) = tokio::io::split(stream);
    let mut reader = FrameReader::new(read_half, limits);
    let header = reader.read_header().await?;
    if header.flags & FLAG_COMMAND == 0 {
        return Err(protocol("the peer sent data before READY"));
    }
    let body = reader.read_body(header, MAX_COMMAND_BYTES, "command").await?;
    let (name, metadata) = command_parts(&body)?;
    if name != b"READY" {
        return Err(protocol(format!("expected READY, got {}", String::from_utf8_lossy(name))));
    }
    match property(metadata, b"Socket-Type")? {
        Some(t) if t == peer_type.as_bytes() => {}
        Some(t) => {
            return Err(protocol(format!(
                "the peer is a {} socket, a {socket_type} needs a {peer_type}",
                String::from_utf8_lossy(t)
            )))
        }
        None => return Err(protocol("the peer's READY has no Socket-Type")),
    }
    let identity = property(metadata, b"Identity")?.unwrap_or_default().to_vec();
    Ok(Peer { reader, writer, identity })
}

/// Appends `frames`, as one message, to `out`.
pub fn encode_message(frames: &[&[u8]], out: &mut Vec<u8>) {
    for (i, frame) in frames.iter().enumerate() {
        let more = if i + 1 < frames.len() { FLAG_MORE } else { 0 };
        push_frame(more, frame, out);
    }
}

/// The PONG command answering a PING with `context`.
pub fn pong_frame(context: &[u8]) -> Vec<u8> {
    let mut body = vec![4];
    body.extend_from_slice(b"PONG");
    body.extend_from_slice(&context[..context.len().min(16)]);
    command_frame(&body)
}

/// The TTL a PING's data announces (its first two bytes, big-endian, in
/// tenths of a second); `None` for 0, which asks for no bound.
fn ping_ttl(data: &[u8]) -> Result<Option<std::time::Duration>, ZmtpError> {
    let ttl: [u8; 2] =
        data.get(..2).and_then(|ttl| ttl.try_into().ok()).ok_or_else(|| protocol("a PING without its 2-byte TTL"))?;
    let deciseconds = u64::from(u16::from_be_bytes(ttl));
    Ok((deciseconds > 0).then(|| std::time::Duration::from_millis(deciseconds * 100)))
}

/// Reads frames from one peer, buffered.
pub struct FrameReader<R> {
    stream: R,
    buffer: BytesMut,
    limits: FrameLimits,
    /// The aux frames of the message last returned (empty for most messages).
    aux: Vec<Bytes>,
    /// Bytes of the message being read so far (all its frames).
    message_bytes: u64,
    /// The TTL of the peer's last PING, when it announced one.
    peer_ttl: Option<std::time::Duration>,
    /// When bytes last arrived from the peer (or the reader was made).
    last_heard: tokio::time::Instant,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    fn new(stream: R, limits: FrameLimits) -> Self {
        FrameReader {
            stream,
            buffer: BytesMut::with_capacity(READ_CHUNK),
            limits,
            aux: Vec::new(),
            message_bytes: 0,
            peer_ttl: None,
            last_heard: tokio::time::Instant::now(),
        }
    }

    /// The heartbeat TTL the peer's last PING announced (`None` before any,
    /// or after one with TTL 0): the longest silence [`Self::next`] waits.
    pub fn peer_ttl(&self) -> Option<std::time::Duration> {
        self.peer_ttl
    }

    /// Counts a frame of `size` bytes towards the current message; past the
    /// limit is an error, before any of the frame is read.
    fn count_message_bytes(&mut self, size: u64) -> Result<(), ZmtpError> {
        let max = self.limits.max_message_bytes;
        match self.message_bytes.checked_add(size) {
            Some(total) if total <= max => {
                self.message_bytes = total;
                Ok(())
            }
            _ => Err(protocol(format!(
                "a message of more than {max} bytes is over the limit (max_engine_message_bytes)"
            ))),
        }
    }

    /// The next message's first frame (its aux frames are then in
    /// [`Self::aux_frames`]) or PING; `None` when the peer closed the
    /// connection between messages.
    pub async fn next(&mut self) -> Result<Option<Incoming>, ZmtpError> {
        self.aux.clear();
        loop {
            let Some(header) = parse_header(&self.buffer) else {
                if !self.fill_or_eof().await? {
                    return Ok(None);
                }
                continue;
            };
            if header.flags & FLAG_COMMAND != 0 {
                let body = self.read_body(header, MAX_COMMAND_BYTES, "command").await?;
                let (name, data) = command_parts(&body)?;
                if name == b"PING" {
                    self.peer_ttl = ping_ttl(data)?;
                    return Ok(Some(Incoming::Ping(data[2..].to_vec())));
                }
                continue; // other commands carry nothing for us
            }
            self.message_bytes = 0;
            self.count_message_bytes(header.size)?;
            let mut more = header.flags & FLAG_MORE != 0;
            let frame = self.read_body(header, self.limits.max_message_bytes, "message").await?;
            while more {
                let header = self.read_header().await?;
                if header.flags & FLAG_COMMAND != 0 {
                    return Err(protocol("a command frame inside a multi-frame message"));
                }
                self.count_message_bytes(header.size)?;
                more = header.flags & FLAG_MORE != 0;
                let aux = self.read_body(header, self.limits.max_message_bytes, "message").await?;
                self.aux.push(aux);
            }
            return Ok(Some(Incoming::Message(frame)));
        }
    }

    /// The frames after the first of the message [`Self::next`] last returned.
    pub fn aux_frames(&self) -> &[Bytes] {
        &self.aux
    }

    async fn read_header(&mut self) -> Result<FrameHeader, ZmtpError> {
        loop {
            if let Some(header) = parse_header(&self.buffer) {
                return Ok(header);
            }
            self.fill().await?;
        }
    }

    /// The body of the frame whose header starts the buffer; a `what` frame
    /// announcing more than `max` bytes is an error, before any is buffered.
    async fn read_body(&mut self, header: FrameHeader, max: u64, what: &str) -> Result<Bytes, ZmtpError> {
        let size = usize::try_from(header.size)
            .ok()
            .filter(|&size| size as u64 <= max)
            .ok_or_else(|| protocol(format!("a {}-byte {what} frame is over the {max}-byte limit", header.size)))?;
        let total = header.len + size;
        if self.buffer.len() < total {
            // Room for the frame up to a bound: beyond it the buffer grows as
            // bytes arrive, so a size the peer announces but never sends costs nothing.
            self.buffer.reserve((total - self.buffer.len()).min(UPFRONT_RESERVE_LIMIT));
        }
        while self.buffer.len() < total {
            self.fill().await?;
        }
        let mut frame = self.buffer.split_to(total);
        frame.advance(header.len);
        Ok(frame.freeze())
    }

    /// Reads more bytes; the peer closing here (mid-frame) is an error.
    async fn fill(&mut self) -> Result<(), ZmtpError> {
        if self.fill_or_eof().await? {
            Ok(())
        } else {
            Err(protocol("the peer closed the connection in the middle of a frame"))
        }
    }

    /// Reads more bytes; false at end of stream. Past the peer's TTL after
    /// the last bytes it sent, a [`ZmtpError::PeerSilent`].
    async fn fill_or_eof(&mut self) -> Result<bool, ZmtpError> {
        if self.buffer.capacity() - self.buffer.len() < READ_CHUNK / 4 {
            self.buffer.reserve(READ_CHUNK);
        }
        let read = self.stream.read_buf(&mut self.buffer);
        let count = match self.peer_ttl {
            // Bytes already waiting are taken even past the deadline: the
            // timeout polls the read first.
            Some(ttl) => {
                tokio::time::timeout_at(self.last_heard + ttl, read).await.map_err(|_| ZmtpError::PeerSilent(ttl))??
            }
            None => read.await?,
        };
        self.last_heard = tokio::time::Instant::now();
        Ok(count > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{duplex, DuplexStream};

    /// Plays a peer's side of the handshake on `peer`; returns our READY body.
    async fn peer_handshake(peer: &mut DuplexStream, properties: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut ours = [0u8; GREETING_LEN];
        peer.read_exact(&mut ours).await.unwrap();
        assert_eq!((ours[0], ours[9], ours[10]), (0xFF, 0x7F, 3));
        assert_eq!(&ours[12..16], b"NULL");
        let mut g = greeting();
        g[11] = 1; // a 3.1 peer, as libzmq 4.x is
        peer.write_all(&g).await.unwrap();
        let mut body = vec![5];
        body.extend_from_slice(b"READY");
        for (name, value) in properties {
            body.push(name.len() as u8);
            body.extend_from_slice(name);
            body.extend_from_slice(&(value.len() as u32).to_be_bytes());
            body.extend_from_slice(value);
        }
        peer.write_all(&command_frame(&body)).await.unwrap();
        let mut head = [0u8; 2];
        peer.read_exact(&mut head).await.unwrap();
        let mut ready = vec![0u8; head[1] as usize];
        peer.read_exact(&mut ready).await.unwrap();
        ready
    }

    #[tokio::test]
    async fn reads_first_frames_and_keeps_aux_frames_across_reads() {
        let (ours, mut peer) = duplex(64);
        let pull = tokio::spawn(async move {
            let mut connection = handshake(ours, "PULL", "PUSH", FrameLimits::default()).await.unwrap();
            let mut got = Vec::new();
            while let Some(incoming) = connection.reader.next().await.unwrap() {
                got.push((incoming, connection.reader.aux_frames().to_vec()));
            }
            got
        });
        let ready = peer_handshake(&mut peer, &[(b"Socket-Type", b"PUSH")]).await;
        assert_eq!(ready, b"\x05READY\x0bSocket-Type\x00\x00\x00\x04PULL");
        let long = vec![7u8; 300];
        let mut wire = vec![0x00, 3, b'a', b'b', b'c']; // one-frame message
        wire.extend_from_slice(&[0x01, 1, b'x']); // first frame, more to come
        wire.extend_from_slice(&[0x03]); // long aux frame, more
        wire.extend_from_slice(&300u64.to_be_bytes());
        wire.extend_from_slice(&long);
        wire.extend_from_slice(&[0x00, 2, 9, 9]); // last aux frame
        wire.extend_from_slice(&[0x02]); // long first frame, alone
        wire.extend_from_slice(&300u64.to_be_bytes());
        wire.extend_from_slice(&long);
        peer.write_all(&wire).await.unwrap();
        drop(peer);
        let messages = vec![
            (Incoming::Message(Bytes::from_static(b"abc")), vec![]),
            (Incoming::Message(Bytes::from_static(b"x")), vec![Bytes::from(long.clone()), Bytes::from_static(&[9, 9])]),
            (Incoming::Message(Bytes::from(long)), vec![]),
        ];
        assert_eq!(pull.await.unwrap(), messages);
    }

    #[tokio::test]
    async fn a_frame_larger_than_the_upfront_reservation_arrives_whole() {
        let (ours, mut peer) = duplex(64 << 10);
        let pull = tokio::spawn(async move {
            let mut connection = handshake(ours, "PULL", "PUSH", FrameLimits::default()).await.unwrap();
            connection.reader.next().await.unwrap()
        });
        peer_handshake(&mut peer, &[(b"Socket-Type", b"PUSH")]).await;
        let big: Vec<u8> = (0..3 * UPFRONT_RESERVE_LIMIT).map(|i| (i % 251) as u8).collect();
        let mut wire = Vec::new();
        encode_message(&[&big], &mut wire);
        peer.write_all(&wire).await.unwrap();
        assert_eq!(pull.await.unwrap(), Some(Incoming::Message(Bytes::from(big))));
    }

    #[tokio::test]
    async fn a_dealer_peer_gives_its_identity_and_gets_frames_it_can_read() {
        let (ours, mut peer) = duplex(1024);
        let router = tokio::spawn(async move {
            let mut connection = handshake(ours, "ROUTER", "DEALER", FrameLimits::default()).await.unwrap();
            let mut out = Vec::new();
            encode_message(&[b"\x00", &[1u8; 300]], &mut out);
            connection.writer.write_all(&out).await.unwrap();
            (connection.identity, connection.reader.next().await.unwrap())
        });
        peer_handshake(&mut peer, &[(b"Socket-Type", b"DEALER"), (b"Identity", b"\x01\x00")]).await;
        let mut first = [0u8; 3];
        peer.read_exact(&mut first).await.unwrap();
        assert_eq!(first, [FLAG_MORE, 1, 0]);
        let mut second = [0u8; 9];
        peer.read_exact(&mut second).await.unwrap();
        assert_eq!(second[0], FLAG_LONG);
        assert_eq!(u64::from_be_bytes(second[1..].try_into().unwrap()), 300);
        peer.write_all(&[0x00, 2, b'h', b'i']).await.unwrap();
        let (identity, incoming) = router.await.unwrap();
        assert_eq!(identity, b"\x01\x00");
        assert_eq!(incoming, Some(Incoming::Message(Bytes::from_static(b"hi"))));
    }

    #[tokio::test]
    async fn a_peer_of_the_wrong_type_is_refused() {
        let (ours, mut peer) = duplex(1024);
        let pull = tokio::spawn(async move {
            handshake(ours, "PULL", "PUSH", FrameLimits::default()).await.err().unwrap().to_string()
        });
        peer_handshake(&mut peer, &[(b"Socket-Type", b"PUB")]).await;
        let error = pull.await.unwrap();
        assert!(error.contains("PUB socket"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_never_finishes_the_handshake_is_dropped() {
        let (ours, _silent_peer) = duplex(1024);
        let error = handshake(ours, "PULL", "PUSH", FrameLimits::default()).await.err().unwrap().to_string();
        assert!(error.contains("no ZMTP handshake"), "{error}");
    }

    #[tokio::test]
    async fn a_peer_that_does_not_speak_zmtp_is_refused() {
        let (ours, mut peer) = duplex(1024);
        let pull = tokio::spawn(async move {
            handshake(ours, "PULL", "PUSH", FrameLimits::default()).await.err().unwrap().to_string()
        });
        peer.write_all(&[b'G'; GREETING_LEN]).await.unwrap();
        let error = pull.await.unwrap();
        assert!(error.contains("greeting"), "{error}");
    }

    #[tokio::test]
    async fn ping_comes_out_with_its_context_for_a_pong() {
        let (ours, mut peer) = duplex(1024);
        let pull = tokio::spawn(async move {
            let mut connection = handshake(ours, "PULL", "PUSH", FrameLimits::default()).await.unwrap();
            connection.reader.next().await.unwrap()
        });
        peer_handshake(&mut peer, &[(b"Socket-Type", b"PUSH")]).await;
        let mut ping = vec![4];
        ping.extend_from_slice(b"PING");
        ping.extend_from_slice(&[0, 10, b'c', b't', b'x']);
        peer.write_all(&command_frame(&ping)).await.unwrap();
        assert_eq!(pull.await.unwrap(), Some(Incoming::Ping(b"ctx".to_vec())));
        assert_eq!(pong_frame(b"ctx"), b"\x04\x08\x04PONGctx");
    }

    #[test]
    fn a_ping_ttl_is_big_endian_tenths_of_a_second() {
        use std::time::Duration;
        assert_eq!(ping_ttl(&[0, 50]).unwrap(), Some(Duration::from_secs(5)));
        assert_eq!(ping_ttl(&[0, 30, b'c', b't', b'x']).unwrap(), Some(Duration::from_secs(3)));
        assert_eq!(ping_ttl(&[0x8C, 0xA0]).unwrap(), Some(Duration::from_secs(3600)));
        assert_eq!(ping_ttl(&[0xFF, 0xFF]).unwrap(), Some(Duration::from_millis(6_553_500)));
        assert_eq!(ping_ttl(&[0, 0]).unwrap(), None);
        for short in [&[][..], &[7]] {
            assert!(ping_ttl(short).unwrap_err().to_string().contains("2-byte TTL"));
        }
    }

    /// A PING command frame announcing `ttl_deciseconds`.
    fn ping(ttl_deciseconds: u16) -> Vec<u8> {
        let mut body = vec![4];
        body.extend_from_slice(b"PING");
        body.extend_from_slice(&ttl_deciseconds.to_be_bytes());
        command_frame(&body)
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_silent_past_its_ping_ttl_is_dropped_and_traffic_keeps_it() {
        use std::time::Duration;
        use tokio::time::{sleep, Instant};
        let (ours, mut peer) = duplex(1024);
        let pull = tokio::spawn(async move {
            let mut connection = handshake(ours, "PULL", "PUSH", FrameLimits::default()).await.unwrap();
            let mut got = Vec::new();
            loop {
                match connection.reader.next().await {
                    Ok(Some(incoming)) => got.push((incoming, connection.reader.peer_ttl(), Instant::now())),
                    other => return (got, other.map(|_| ()), Instant::now()),
                }
            }
        });
        peer_handshake(&mut peer, &[(b"Socket-Type", b"PUSH")]).await;
        // Before any PING there is no bound: a long silence is fine.
        sleep(Duration::from_secs(600)).await;
        peer.write_all(&ping(10)).await.unwrap(); // 1 s
        for _ in 0..5 {
            // Within the TTL each time, so the connection lives on past 5 TTLs.
            sleep(Duration::from_millis(900)).await;
            peer.write_all(&[0x00, 1, b'm']).await.unwrap();
        }
        let last_message = Instant::now();
        // Without the bound the reader would wait forever: fail instead.
        let (got, end, ended) =
            tokio::time::timeout(Duration::from_secs(60), pull).await.expect("the silent peer was dropped").unwrap();
        assert_eq!(got.len(), 6, "{got:?}");
        assert_eq!(got[0].0, Incoming::Ping(vec![]));
        assert!(got.iter().all(|(_, ttl, _)| *ttl == Some(Duration::from_secs(1))));
        assert!(matches!(end, Err(ZmtpError::PeerSilent(ttl)) if ttl == Duration::from_secs(1)), "{end:?}");
        // Dropped one TTL after the last bytes, on the paused (virtual) clock.
        assert_eq!(ended - last_message, Duration::from_secs(1));
        drop(peer);
    }

    #[tokio::test(start_paused = true)]
    async fn a_ping_with_ttl_zero_lifts_the_bound() {
        use std::time::Duration;
        let (ours, mut peer) = duplex(1024);
        let pull = tokio::spawn(async move {
            let mut connection = handshake(ours, "PULL", "PUSH", FrameLimits::default()).await.unwrap();
            let mut got = Vec::new();
            while let Some(incoming) = connection.reader.next().await.unwrap() {
                got.push((incoming, connection.reader.peer_ttl()));
            }
            got
        });
        peer_handshake(&mut peer, &[(b"Socket-Type", b"PUSH")]).await;
        peer.write_all(&ping(10)).await.unwrap();
        peer.write_all(&ping(0)).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3600)).await;
        peer.write_all(&[0x00, 1, b'm']).await.unwrap();
        drop(peer);
        let got = pull.await.unwrap();
        assert_eq!(
            got,
            vec![
                (Incoming::Ping(vec![]), Some(Duration::from_secs(1))),
                (Incoming::Ping(vec![]), None),
                (Incoming::Message(Bytes::from_static(b"m")), None),
            ]
        );
    }

    /// Handshakes as a PULL with `limits`, lets a PUSH peer write `wire` and
    /// close, and returns what the reader made of it: every message, then the
    /// error that ended the connection, if any.
    async fn read_all_after_handshake(limits: FrameLimits, wire: Vec<u8>) -> (Vec<Incoming>, Option<String>) {
        let (ours, mut peer) = duplex(64 << 10);
        let pull = tokio::spawn(async move {
            let mut connection = handshake(ours, "PULL", "PUSH", limits).await.unwrap();
            let mut got = Vec::new();
            loop {
                match connection.reader.next().await {
                    Ok(Some(incoming)) => got.push(incoming),
                    Ok(None) => return (got, None),
                    Err(e) => return (got, Some(e.to_string())),
                }
            }
        });
        peer_handshake(&mut peer, &[(b"Socket-Type", b"PUSH")]).await;
        // The reader may stop before it took everything: a failed write is fine.
        let _ = peer.write_all(&wire).await;
        drop(peer);
        pull.await.unwrap()
    }

    fn long_header(flags: u8, size: u64) -> Vec<u8> {
        let mut header = vec![flags | FLAG_LONG];
        header.extend_from_slice(&size.to_be_bytes());
        header
    }

    #[tokio::test]
    async fn an_oversized_first_frame_is_refused_before_its_bytes_arrive() {
        let limits = FrameLimits { max_message_bytes: 1000 };
        // Only the header is sent: the reader must not wait for (or reserve) the body.
        let (got, error) = read_all_after_handshake(limits, long_header(0, 1001)).await;
        assert!(got.is_empty());
        let error = error.unwrap();
        assert!(error.contains("1000") && error.contains("limit"), "{error}");
        let mut at_limit = long_header(0, 1000);
        at_limit.extend_from_slice(&[5u8; 1000]);
        let (got, error) = read_all_after_handshake(limits, at_limit).await;
        assert_eq!((got, error), (vec![Incoming::Message(Bytes::from(vec![5u8; 1000]))], None));
    }

    #[tokio::test]
    async fn aux_frames_count_towards_the_message_limit() {
        let limits = FrameLimits { max_message_bytes: 1000 };
        let mut wire = vec![FLAG_MORE, 100];
        wire.extend_from_slice(&[1u8; 100]);
        wire.extend_from_slice(&long_header(0, 901)); // 100 + 901 > 1000
        let (got, error) = read_all_after_handshake(limits, wire).await;
        assert!(got.is_empty(), "a message over the limit is not returned");
        assert!(error.unwrap().contains("limit"));
    }

    #[tokio::test]
    async fn frame_sizes_that_overflow_are_errors_not_panics() {
        for wire in [long_header(0, u64::MAX), long_header(FLAG_COMMAND, u64::MAX), {
            let mut aux = vec![FLAG_MORE, 1, 7];
            aux.extend_from_slice(&long_header(0, u64::MAX));
            aux
        }] {
            let (_, error) = read_all_after_handshake(FrameLimits::default(), wire).await;
            assert!(error.unwrap().contains("limit"));
        }
    }

    #[tokio::test]
    async fn a_command_frame_over_the_command_cap_is_refused() {
        let (got, error) =
            read_all_after_handshake(FrameLimits::default(), long_header(FLAG_COMMAND, MAX_COMMAND_BYTES + 1)).await;
        assert!(got.is_empty());
        assert!(error.unwrap().contains("command frame"));
    }

    /// The property tests run their cases on this runtime.
    fn current_thread_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    /// A valid PUSH peer's greeting and READY.
    fn push_peer_preamble() -> Vec<u8> {
        let mut wire = greeting().to_vec();
        let mut ready = vec![5];
        ready.extend_from_slice(b"READY\x0bSocket-Type\x00\x00\x00\x04PUSH");
        wire.extend_from_slice(&command_frame(&ready));
        wire
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        /// Cap used by the properties: small, so that arbitrary headers often cross it.
        const CAP: u64 = 4096;

        /// Runs a PULL handshake and reader over `wire` (then end of stream);
        /// returns the reader's largest buffer capacity seen, or None if the
        /// handshake failed. Panics are what the properties look for.
        fn read_wire(runtime: &tokio::runtime::Runtime, wire: Vec<u8>) -> Option<usize> {
            runtime.block_on(async move {
                let (ours, mut peer) = duplex(1 << 20);
                peer.write_all(&wire).await.unwrap();
                // End of stream for the reader; what we write still has room.
                peer.shutdown().await.unwrap();
                let mut connection =
                    handshake(ours, "PULL", "PUSH", FrameLimits { max_message_bytes: CAP }).await.ok()?;
                let mut largest = connection.reader.buffer.capacity();
                while let Ok(Some(incoming)) = connection.reader.next().await {
                    largest = largest.max(connection.reader.buffer.capacity());
                    if let Incoming::Message(frame) = incoming {
                        assert!(frame.len() as u64 <= CAP);
                    }
                }
                Some(largest.max(connection.reader.buffer.capacity()))
            })
        }

        /// A frame with arbitrary flags and an announced size that may lie.
        fn frame() -> impl Strategy<Value = Vec<u8>> {
            (
                any::<u8>(),
                prop_oneof![0u64..300, Just(CAP), Just(CAP + 1), Just(u64::MAX), any::<u64>()],
                proptest::collection::vec(any::<u8>(), 0..300),
            )
                .prop_map(|(flags, size, body)| {
                    let mut wire =
                        if flags & FLAG_LONG != 0 { long_header(flags, size) } else { vec![flags, size as u8] };
                    wire.extend_from_slice(&body);
                    wire
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn arbitrary_bytes_during_the_handshake_never_panic(wire in proptest::collection::vec(any::<u8>(), 0..400)) {
                read_wire(&current_thread_runtime(), wire);
            }

            #[test]
            fn arbitrary_bytes_after_the_handshake_never_panic_or_grow_past_the_cap(
                tail in proptest::collection::vec(any::<u8>(), 0..2000),
            ) {
                let mut wire = push_peer_preamble();
                wire.extend_from_slice(&tail);
                let largest = read_wire(&current_thread_runtime(), wire).expect("the preamble is a valid handshake");
                prop_assert!(largest <= 2 * (CAP as usize + 2 * READ_CHUNK), "buffer grew to {largest}");
            }

            #[test]
            fn arbitrary_frames_after_the_handshake_never_panic_or_grow_past_the_cap(
                frames in proptest::collection::vec(frame(), 0..12),
            ) {
                let mut wire = push_peer_preamble();
                wire.extend(frames.concat());
                let largest = read_wire(&current_thread_runtime(), wire).expect("the preamble is a valid handshake");
                prop_assert!(largest <= 2 * (CAP as usize + 2 * READ_CHUNK), "buffer grew to {largest}");
            }
        }
    }
}
