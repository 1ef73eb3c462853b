//! The OpenAI-compatible HTTP API: the route table and its handlers
//! (`routes/`), what wraps every route (`middleware/`), the generating
//! plumbing the generating routes share (`generation/`), request bodies and
//! their rules (`params`, `rules`), the error answer (`error`), what every
//! handler shares (`state`) and the HTTP/1.1 server (`server`).

pub mod error;
pub mod generation;
pub mod middleware;
pub mod params;
pub mod routes;
pub mod rules;
pub mod server;
pub mod state;
