//! TLS on the inherited HTTP socket: the `ssl_*` keys of `--args-json` turned
//! into a rustls acceptor that wraps every accepted connection. Files that
//! cannot be read or hold nothing usable are usage errors naming the key.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;
use vllm_rs_config::error::ExitError;
use vllm_rs_config::{ClientCerts, TlsFiles};

/// The acceptor for `files`: their certificate chain and key, and a client
/// certificate check when `ssl_cert_reqs` asks for one.
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, ExitError> {
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let chain = certificates(&files.certfile, "ssl_certfile")?;
    let key = PrivateKeyDer::from_pem_file(&files.keyfile).map_err(|e| {
        ExitError::usage(format!(
            "--args-json: `ssl_keyfile` {}: no PEM private key could be read ({e})",
            files.keyfile.display()
        ))
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ExitError::usage(format!("TLS: {e}")))?;
    let builder = match (&files.ca_certs, files.client_certs) {
        (Some(ca_certs), ClientCerts::Optional | ClientCerts::Required) => {
            let mut roots = RootCertStore::empty();
            for certificate in certificates(ca_certs, "ssl_ca_certs")? {
                roots.add(certificate).map_err(|e| {
                    ExitError::usage(format!("--args-json: `ssl_ca_certs` {}: {e}", ca_certs.display()))
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match files.client_certs {
                ClientCerts::Optional => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            let verifier = verifier
                .build()
                .map_err(|e| ExitError::usage(format!("--args-json: `ssl_ca_certs` {}: {e}", ca_certs.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        // CA certificates without a client-certificate rule are loaded but
        // unused by Python's ssl too: no client is asked for a certificate.
        _ => builder.with_no_client_auth(),
    };
    let config = builder.with_single_cert(chain, key).map_err(|e| {
        ExitError::usage(format!(
            "--args-json: `ssl_certfile`/`ssl_keyfile` {} and {}: {e}",
            files.certfile.display(),
            files.keyfile.display()
        ))
    })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Every PEM certificate in `path`; none at all is an error naming `key`.
fn certificates(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, ExitError> {
    let bad = |why: String| ExitError::usage(format!("--args-json: `{key}` {}: {why}", path.display()));
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(format!("cannot be read ({e})")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not valid PEM ({e})")))?;
    if certificates.is_empty() {
        return Err(bad("holds no PEM certificate".into()));
    }
    Ok(certificates)
}
