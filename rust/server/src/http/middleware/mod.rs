//! What wraps every route: authentication (`auth`), cross-origin rules
//! (`cors`), the proxy's path prefix (`root_path`), `X-Request-Id` headers
//! (`request_id`), the body deadline (`body_deadline`), the cap on open
//! connections (`connections`) and the first-response hook (`first_response`).

pub mod auth;
pub mod body_deadline;
pub mod connections;
pub mod cors;
pub mod first_response;
pub mod request_id;
pub mod root_path;
