//! The `--args-json` keys of what wraps the routes: TLS, CORS, the root path
//! and request id headers, read and checked the way vLLM 0.33 reads them.

use super::keys::Keys;
use crate::error::ExitError;
use std::path::PathBuf;

/// What the HTTP layer adds on top of the routes.
#[derive(Clone, Debug, Default)]
pub struct HttpLayers {
    /// TLS on every accepted connection (`ssl_*` keys); `None` serves plain HTTP.
    pub tls: Option<TlsFiles>,
    /// Cross-origin rules, applied as vLLM applies Starlette's `CORSMiddleware`.
    pub cors: CorsRules,
    /// Prefix a proxy may put in front of every path (`root_path`).
    pub root_path: Option<String>,
    /// Echo (or make up) `X-Request-Id` on every response.
    pub request_id_headers: bool,
}

/// Whether clients must show a certificate (Python's `ssl.CERT_*` numbers, as vLLM takes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientCerts {
    /// `CERT_NONE` (0): none asked for.
    None,
    /// `CERT_OPTIONAL` (1): asked for, verified when given.
    Optional,
    /// `CERT_REQUIRED` (2): a verified certificate or no connection.
    Required,
}

/// The TLS files and the client-certificate rule.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// PEM private key (`ssl_keyfile`).
    pub keyfile: PathBuf,
    /// PEM certificate chain (`ssl_certfile`).
    pub certfile: PathBuf,
    /// PEM CA certificates that client certificates must chain to (`ssl_ca_certs`).
    pub ca_certs: Option<PathBuf>,
    /// `ssl_cert_reqs`.
    pub client_certs: ClientCerts,
}

/// vLLM's CORS settings (`allowed_origins`, `allowed_methods`, `allowed_headers`, `allow_credentials`).
#[derive(Clone, Debug)]
pub struct CorsRules {
    /// Origins allowed; `*` allows all. Empty by default: no cross-origin access.
    pub origins: Vec<String>,
    /// Methods allowed; `*` (the default) allows all.
    pub methods: Vec<String>,
    /// Request headers allowed; `*` (the default) allows all.
    pub headers: Vec<String>,
    /// Allow credentials (cookies, authorization) cross-origin.
    pub credentials: bool,
}

impl Default for CorsRules {
    fn default() -> Self {
        CorsRules { origins: Vec::new(), methods: vec!["*".into()], headers: vec!["*".into()], credentials: false }
    }
}

impl HttpLayers {
    /// Reads the keys; a TLS option without the key and certificate, or a
    /// client-certificate rule without CA certificates, is a usage error:
    /// serving plain HTTP or unverified clients would not be what was asked.
    pub(crate) fn load(keys: &Keys) -> Result<Self, ExitError> {
        let defaults = CorsRules::default();
        let cors = CorsRules {
            origins: keys.string_or_list("allowed_origins")?.unwrap_or(defaults.origins),
            methods: keys.string_or_list("allowed_methods")?.unwrap_or(defaults.methods),
            headers: keys.string_or_list("allowed_headers")?.unwrap_or(defaults.headers),
            credentials: keys.bool("allow_credentials")?.unwrap_or(false),
        };
        let root_path = keys.string("root_path")?.filter(|path| !path.is_empty());
        Ok(HttpLayers {
            tls: tls_files(keys)?,
            cors,
            root_path,
            request_id_headers: keys.bool("enable_request_id_headers")?.unwrap_or(false),
        })
    }
}

fn tls_files(keys: &Keys) -> Result<Option<TlsFiles>, ExitError> {
    let keyfile = keys.string("ssl_keyfile")?.filter(|s| !s.is_empty());
    let certfile = keys.string("ssl_certfile")?.filter(|s| !s.is_empty());
    let ca_certs = keys.string("ssl_ca_certs")?.filter(|s| !s.is_empty());
    let client_certs = match keys.get("ssl_cert_reqs") {
        None => ClientCerts::None,
        Some(value) => match value.as_u64() {
            Some(0) => ClientCerts::None,
            Some(1) => ClientCerts::Optional,
            Some(2) => ClientCerts::Required,
            _ => return Err(Keys::wrong_type("ssl_cert_reqs", "0 (none), 1 (optional) or 2 (required)", value)),
        },
    };
    let (keyfile, certfile) = match (keyfile, certfile) {
        (Some(key), Some(cert)) => (key, cert),
        (None, None) => {
            if ca_certs.is_some() || client_certs != ClientCerts::None {
                return Err(ExitError::usage(
                    "--args-json: `ssl_ca_certs`/`ssl_cert_reqs` are set without `ssl_keyfile` and `ssl_certfile`: \
                     TLS needs both; refusing to serve plain HTTP",
                ));
            }
            return Ok(None);
        }
        (Some(_), None) => {
            return Err(ExitError::usage("--args-json: `ssl_keyfile` is set without `ssl_certfile`: TLS needs both"))
        }
        (None, Some(_)) => {
            return Err(ExitError::usage("--args-json: `ssl_certfile` is set without `ssl_keyfile`: TLS needs both"))
        }
    };
    if client_certs != ClientCerts::None && ca_certs.is_none() {
        return Err(ExitError::usage(
            "--args-json: `ssl_cert_reqs` asks for client certificates, but `ssl_ca_certs` is not set: \
             there is nothing to verify them against",
        ));
    }
    Ok(Some(TlsFiles {
        keyfile: keyfile.into(),
        certfile: certfile.into(),
        ca_certs: ca_certs.map(PathBuf::from),
        client_certs,
    }))
}
