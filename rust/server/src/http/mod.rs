//! The OpenAI-compatible HTTP API: the route table and its handlers
//! (`routes/`), what wraps every route (`middleware/`), the generating
//! plumbing the generating routes share (`generation/`), request bodies
//! (`body`), the sampling fields every generating route shares (`sampling`),
//! the request rules (`rules`), the error answer (`error`), what every
//! handler shares (`state`) and the HTTP/1.1 server (`server`).

pub mod body;
pub mod error;
pub mod generation;
pub mod middleware;
pub mod routes;
pub mod rules;
pub mod sampling;
pub mod server;
pub mod state;
