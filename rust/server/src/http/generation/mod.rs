//! What the generating routes share: submitting a request to the engines
//! (`submit`), answering it whole or streamed (`answer`, `sse`; a chat stream's chunks in `chat_stream`), with its usage (`usage`) or
//! the error it failed with (`failure`), structured
//! outputs (`structured`), tool calls and reasoning (`tools`), the chat
//! template's variables (`template_kwargs`) and the assistant message of a
//! whole chat answer (`message`).

pub mod answer;
pub mod chat_stream;
pub mod failure;
pub mod message;
pub mod sse;
pub mod structured;
pub mod submit;
pub mod template_kwargs;
pub mod tools;
pub mod usage;
