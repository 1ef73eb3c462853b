//! ZeroMQ's wire protocol (ZMTP 3.0, NULL security mechanism) on an accepted
//! stream, for the frontend's side of its two engine sockets: a PULL for the
//! engines' PUSH (outputs) and a ROUTER for their DEALER (inputs).
//!
//! With libzmq, every message crosses its I/O thread, a pipe and a mailbox
//! wake-up between the socket and the async runtime. Speaking the protocol in
//! the runtime itself takes one `read` or `write` per many messages and no
//! thread hop. Only what those two sockets need is here: the greeting, the
//! READY handshake (checking the peer's socket type, reading its identity),
//! data frames, and PING (the caller answers with [`pong_frame`]). The first
//! frame of each incoming message is returned; later (aux) frames are skipped
//! without being buffered.
//!
//! Spec: <https://rfc.zeromq.org/spec/23/> (ZMTP 3.0), <https://rfc.zeromq.org/spec/37/> (3.1 commands).

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};

/// The first frame of a message may be at most this large (the outputs of one
/// engine step are far smaller); a bigger one is a protocol error.
pub const MAX_FIRST_FRAME: u64 = 1 << 30;

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
) -> Result<Peer<S>, ZmtpError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, run_handshake(stream, socket_type, peer_type))
        .await
        .unwrap_or_else(|_| Err(protocol(format!("no ZMTP handshake within {HANDSHAKE_TIMEOUT:?}"))))
}

async fn run_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    socket_type: &str,
    peer_type: &str,
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
    let mut reader = FrameReader::new(read_half);
    let header = reader.read_header().await?;
    if header.flags & FLAG_COMMAND == 0 {
        return Err(protocol("the peer sent data before READY"));
    }
    let body = reader.read_body(header).await?;
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

/// Reads frames from one peer, buffered.
pub struct FrameReader<R> {
    stream: R,
    buffer: BytesMut,
    /// Bytes of an aux frame still to discard.
    skipping: u64,
    /// The message being read has more (aux) frames to come.
    in_aux_frames: bool,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    fn new(stream: R) -> Self {
        FrameReader { stream, buffer: BytesMut::with_capacity(READ_CHUNK), skipping: 0, in_aux_frames: false }
    }

    /// The next message's first frame (its aux frames are skipped) or PING;
    /// `None` when the peer closed the connection between messages.
    pub async fn next(&mut self) -> Result<Option<Incoming>, ZmtpError> {
        loop {
            if self.skipping > 0 {
                let n = self.skipping.min(self.buffer.len() as u64) as usize;
                self.buffer.advance(n);
                self.skipping -= n as u64;
                if self.skipping > 0 {
                    self.fill().await?;
                    continue;
                }
            }
            let Some(header) = parse_header(&self.buffer) else {
                if !self.fill_or_eof().await? {
                    return Ok(None);
                }
                continue;
            };
            if header.flags & FLAG_COMMAND != 0 {
                let body = self.read_body(header).await?;
                let (name, data) = command_parts(&body)?;
                if name == b"PING" {
                    return Ok(Some(Incoming::Ping(data.get(2..).unwrap_or_default().to_vec())));
                }
                continue; // other commands carry nothing for us
            }
            let more = header.flags & FLAG_MORE != 0;
            if self.in_aux_frames {
                self.buffer.advance(header.len);
                self.skipping = header.size;
                self.in_aux_frames = more;
                continue;
            }
            if header.size > MAX_FIRST_FRAME {
                return Err(protocol(format!("a {}-byte message is over the {MAX_FIRST_FRAME}-byte limit", header.size)));
            }
            let frame = self.read_body(header).await?;
            self.in_aux_frames = more;
            return Ok(Some(Incoming::Message(frame)));
        }
    }

    async fn read_header(&mut self) -> Result<FrameHeader, ZmtpError> {
        loop {
            if let Some(header) = parse_header(&self.buffer) {
                return Ok(header);
            }
            self.fill().await?;
        }
    }

    /// The body of the frame whose header starts the buffer.
    async fn read_body(&mut self, header: FrameHeader) -> Result<Bytes, ZmtpError> {
        let size = usize::try_from(header.size).map_err(|_| protocol("frame too large"))?;
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

    /// Reads more bytes; false at end of stream.
    async fn fill_or_eof(&mut self) -> Result<bool, ZmtpError> {
        if self.buffer.capacity() - self.buffer.len() < READ_CHUNK / 4 {
            self.buffer.reserve(READ_CHUNK);
        }
        Ok(self.stream.read_buf(&mut self.buffer).await? > 0)
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
    async fn reads_first_frames_and_skips_aux_frames_across_reads() {
        let (ours, mut peer) = duplex(64);
        let pull = tokio::spawn(async move {
            let mut connection = handshake(ours, "PULL", "PUSH").await.unwrap();
            let mut got = Vec::new();
            while let Some(incoming) = connection.reader.next().await.unwrap() {
                got.push(incoming);
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
        let messages = [Bytes::from_static(b"abc"), Bytes::from_static(b"x"), Bytes::from(long)];
        assert_eq!(pull.await.unwrap(), Vec::from(messages.map(Incoming::Message)));
    }

    #[tokio::test]
    async fn a_frame_larger_than_the_upfront_reservation_arrives_whole() {
        let (ours, mut peer) = duplex(64 << 10);
        let pull = tokio::spawn(async move {
            let mut connection = handshake(ours, "PULL", "PUSH").await.unwrap();
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
            let mut connection = handshake(ours, "ROUTER", "DEALER").await.unwrap();
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
        let pull = tokio::spawn(async move { handshake(ours, "PULL", "PUSH").await.err().unwrap().to_string() });
        peer_handshake(&mut peer, &[(b"Socket-Type", b"PUB")]).await;
        let error = pull.await.unwrap();
        assert!(error.contains("PUB socket"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_never_finishes_the_handshake_is_dropped() {
        let (ours, _silent_peer) = duplex(1024);
        let error = handshake(ours, "PULL", "PUSH").await.err().unwrap().to_string();
        assert!(error.contains("no ZMTP handshake"), "{error}");
    }

    #[tokio::test]
    async fn a_peer_that_does_not_speak_zmtp_is_refused() {
        let (ours, mut peer) = duplex(1024);
        let pull = tokio::spawn(async move { handshake(ours, "PULL", "PUSH").await.err().unwrap().to_string() });
        peer.write_all(&[b'G'; GREETING_LEN]).await.unwrap();
        let error = pull.await.unwrap();
        assert!(error.contains("greeting"), "{error}");
    }

    #[tokio::test]
    async fn ping_comes_out_with_its_context_for_a_pong() {
        let (ours, mut peer) = duplex(1024);
        let pull = tokio::spawn(async move {
            let mut connection = handshake(ours, "PULL", "PUSH").await.unwrap();
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

    #[tokio::test]
    async fn an_oversized_first_frame_is_a_protocol_error() {
        let (ours, mut peer) = duplex(1024);
        let pull = tokio::spawn(async move {
            let mut connection = handshake(ours, "PULL", "PUSH").await.unwrap();
            connection.reader.next().await.err().unwrap().to_string()
        });
        peer_handshake(&mut peer, &[(b"Socket-Type", b"PUSH")]).await;
        peer.write_all(&[0x02]).await.unwrap();
        peer.write_all(&(MAX_FIRST_FRAME + 1).to_be_bytes()).await.unwrap();
        let error = pull.await.unwrap();
        assert!(error.contains("limit"), "{error}");
    }
}
