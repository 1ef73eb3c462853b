//! The OpenAI API's routes, one module per route: chat completions (and
//! their batch), completions, responses (and the stored-response routes),
//! models, tokenize/detokenize and the pooling routes.

pub mod chat_completions;
pub mod completions;
pub mod models;
pub mod pooling;
pub mod responses;
pub mod tokenize;
