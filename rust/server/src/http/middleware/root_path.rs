//! `root_path`: a proxy in front may keep a path prefix on every request.
//! As in FastAPI (Starlette's `get_route_path`), a path under the prefix is
//! routed without it and any other path is routed as it is, so both
//! `/api/v1/models` and `/v1/models` work behind `root_path=/api`.

use axum::extract::Request;
use axum::http::uri::{PathAndQuery, Uri};

/// The path routes see: `path` without `root_path` when it lies under it.
pub fn route_path<'a>(path: &'a str, root_path: &str) -> &'a str {
    match path.strip_prefix(root_path) {
        Some("") => "",
        Some(rest) if rest.starts_with('/') => rest,
        _ => path,
    }
}

/// `request` with its path rewritten by [`route_path`].
pub fn strip_root_path(mut request: Request, root_path: &str) -> Request {
    let uri = request.uri();
    let path = route_path(uri.path(), root_path);
    if path.len() == uri.path().len() {
        return request;
    }
    let rewritten = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    // Starlette routes the empty remainder of `/api` as "", which matches no
    // route; "/" would match none here either, and is a valid URI path.
    let rewritten =
        if rewritten.is_empty() || rewritten.starts_with('?') { format!("/{rewritten}") } else { rewritten };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = PathAndQuery::try_from(rewritten).ok();
    if let Ok(uri) = Uri::from_parts(parts) {
        *request.uri_mut() = uri;
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_the_root_lose_it_and_others_stay() {
        assert_eq!(route_path("/api/v1/models", "/api"), "/v1/models");
        assert_eq!(route_path("/v1/models", "/api"), "/v1/models");
        assert_eq!(route_path("/apiv1/models", "/api"), "/apiv1/models");
        assert_eq!(route_path("/api", "/api"), "");
        let request = Request::builder().uri("/api/v1/models?x=1").body(axum::body::Body::empty()).unwrap();
        assert_eq!(strip_root_path(request, "/api").uri().to_string(), "/v1/models?x=1");
    }
}
