//! Anthropic's APIs: the Messages API (`messages/`).

pub mod messages;
