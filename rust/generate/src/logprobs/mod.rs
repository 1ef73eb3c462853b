//! Logprobs in answers, as vLLM 0.33 shows them: the engine's rows read into
//! positions (`positions.rs`), rendered as the completions and chat
//! endpoints render them (`render.rs`), numbers written as Python writes
//! them (`py_float.rs`), so that both frontends answer byte for byte alike.

pub mod positions;
pub mod py_float;
pub mod render;

pub use positions::{Entry, Position, PositionReader, Scored};
pub use render::{Echo, Rendering, TokenStrings};
