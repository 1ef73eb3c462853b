//! vLLM's engine-core protocol on the wire (docs/engine-protocol.md): the
//! messages as Rust types (`protocol`), their MessagePack encoding and
//! decoding (`codec`, over the reader in `msgpack`), and the logprob rows
//! engines send (`logprob_rows`). No sockets: the engine client and the
//! metrics read these types without depending on each other.

pub mod codec;
pub mod logprob_rows;
pub mod msgpack;
pub mod protocol;
