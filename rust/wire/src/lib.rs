//! vLLM's engine-core protocol on the wire (docs/engine-protocol.md): the
//! messages as Rust types whose serde derives are their encoding
//! (`protocol`, the logprob arrays in `logprob_rows`), and the functions that
//! encode and decode payloads with them (`codec`). No sockets: the engine
//! client and the metrics read these types without depending on each other.

pub mod codec;
pub mod logprob_rows;
pub mod protocol;
