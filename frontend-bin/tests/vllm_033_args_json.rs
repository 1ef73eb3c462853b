//! The `--args-json` strings vLLM 0.33's own `RustFrontendProcessManager`
//! builds for realistic `vllm serve` command lines (tests/fixtures/vllm-0.33,
//! written by scripts/make_vllm_fixtures.py): each one either serves (with the
//! model swapped for `echo`, mock engines, and the files it names made here)
//! or exits 2 naming the key this frontend refuses, as the table in
//! `serve_args` (and docs/frontend.md) says. And every key vLLM's `serve`
//! parser has is in that table.

mod common;

use common::{post_json, temp_dir, Frontend, Options};
use serde_json::{json, Map, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use vllm_rs_config::serve_args::{HONOURED_KEYS, IGNORED_KEYS, REFUSED_KEYS, REFUSED_VALUES};

fn fixture(name: &str) -> Map<String, Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/vllm-0.33").join(name);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let Value::Object(cases) = serde_json::from_str(&text).unwrap() else { panic!("not an object") };
    cases
}

/// The key this frontend refuses in `args`, if any.
fn refused_key(args: &Map<String, Value>) -> Option<&'static str> {
    let set = |key: &str| args.get(key).is_some_and(|v| !v.is_null() && *v != Value::Bool(false));
    REFUSED_KEYS.iter().map(|(key, _)| *key).find(|key| set(key)).or_else(|| {
        REFUSED_VALUES
            .iter()
            .find(|(key, allowed, _)| args.get(*key).and_then(Value::as_str).is_some_and(|v| !allowed.contains(&v)))
            .map(|(key, _, _)| *key)
    })
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("running openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA and server and client certificates it signed, in `dir`.
fn make_pki(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test-ca"]);
    ca.extend(["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"]);
    openssl(dir, &ca);
    for (name, usage, san) in [("server", "serverAuth", "IP:127.0.0.1"), ("client", "clientAuth", "DNS:client")] {
        let (key, csr, pem, ext) =
            (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
        let mut req = vec!["req"];
        req.extend(ec);
        req.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=test"]);
        openssl(dir, &req);
        fs::write(
            dir.join(&ext),
            format!("subjectAltName={san}\nbasicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"),
        )
        .unwrap();
        openssl(
            dir,
            &["x509", "-req", "-in", &csr, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", &pem]
                .into_iter()
                .chain(["-days", "1", "-extfile", &ext])
                .collect::<Vec<_>>(),
        );
    }
}

/// The case's args-json made runnable here: the built-in `echo` model, a
/// short engine wait, the API key in the environment, and the files it names
/// (TLS, chat template) made in `dir`.
fn runnable(case: &Value, dir: &Path) -> (Map<String, Value>, Vec<(String, String)>) {
    let Value::Object(mut args) = serde_json::from_str(case["args_json"].as_str().unwrap()).unwrap() else {
        panic!("args_json is not an object")
    };
    args.insert("model_tag".into(), json!("echo"));
    args.remove("model");
    args.insert("engine_ready_timeout_secs".into(), json!(20));
    let mut env = Vec::new();
    if let Some(Value::Array(keys)) = args.remove("api_key") {
        env.push(("VLLM_API_KEY".to_owned(), keys[0].as_str().unwrap().to_owned()));
    }
    for (key, file) in [("ssl_keyfile", "server.key"), ("ssl_certfile", "server.pem"), ("ssl_ca_certs", "ca.pem")] {
        if args.contains_key(key) {
            args.insert(key.into(), json!(dir.join(file)));
        }
    }
    if let Some(Value::String(template)) = args.get("chat_template") {
        if !template.contains(['{', '}', '\n']) {
            let file = dir.join("template.jinja");
            fs::write(&file, "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
            args.insert("chat_template".into(), json!(file));
        }
    }
    (args, env)
}

/// GET /health over TLS, trusting `dir`'s CA, with its client certificate when `client_cert`.
async fn https_health(port: u16, dir: &Path, client_cert: bool) -> std::io::Result<String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = if client_cert {
        let chain: Vec<_> =
            CertificateDer::pem_file_iter(dir.join("client.pem")).unwrap().map(Result::unwrap).collect();
        builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(dir.join("client.key")).unwrap()).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let mut tls = connector.connect(ServerName::try_from("127.0.0.1").unwrap(), tcp).await?;
    tls.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").await?;
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await?;
    Ok(answer)
}

async fn wait_https_ready(frontend: &mut Frontend, dir: &Path, client_cert: bool) -> String {
    let port: u16 = frontend.base_url.rsplit(':').next().unwrap().parse().unwrap();
    let fe = &*frontend;
    let ready = vllm_rs_test_support::poll_until_async(Duration::from_secs(30), || async move {
        if fe.has_exited() {
            return Some(None);
        }
        let answer = https_health(port, dir, client_cert).await.ok();
        answer.filter(|answer| answer.starts_with("HTTP/1.1 200")).map(Some)
    })
    .await;
    if let Some(status) = frontend.child.try_wait().unwrap() {
        panic!("frontend exited early ({status}):\n{}", frontend.stderr());
    }
    ready.flatten().unwrap_or_else(|| panic!("not ready over TLS:\n{}", frontend.stderr()))
}

#[tokio::test]
async fn every_vllm_args_json_serves_or_is_refused_as_the_table_says() {
    let cases = fixture("args_json.json");
    assert!(cases.len() >= 18, "{:?}", cases.keys());
    let dir = temp_dir("args-json-pki");
    make_pki(&dir);
    let (mut served, mut refused) = (Vec::new(), Vec::new());
    for (name, case) in &cases {
        let (args, env) = runnable(case, &dir);
        let options = Options { args: Value::Object(args.clone()), env: env.clone(), ..Options::default() };
        if let Some(key) = refused_key(&args) {
            let mut frontend = Frontend::spawn(options);
            let status = frontend.wait_exit(Duration::from_secs(20)).expect("still running");
            let log = frontend.stderr();
            assert_eq!(status.code(), Some(2), "{name}: {log}");
            assert!(log.contains(key) && !log.contains("panicked"), "{name}: {log}");
            refused.push(name.as_str());
        } else if args.contains_key("ssl_certfile") {
            let client_cert = args.get("ssl_cert_reqs").is_some_and(|v| v != &json!(0));
            let mut frontend = Frontend::spawn(options);
            let _engine = common::mock_engine::MockEngine::start(common::mock_engine::EngineSpec::new(
                0,
                &frontend.input_address,
                &frontend.output_address,
            ));
            wait_https_ready(&mut frontend, &dir, client_cert).await;
            let port: u16 = frontend.base_url.rsplit(':').next().unwrap().parse().unwrap();
            if client_cert {
                assert!(
                    https_health(port, &dir, false).await.is_err(),
                    "{name}: served a client without a certificate"
                );
            }
            served.push(name.as_str());
        } else {
            let (frontend, _engines) = Frontend::start_with_engines(options, |_| {}).await;
            let model = match args.get("served_model_name") {
                Some(Value::Array(names)) => names[0].clone(),
                Some(name) => name.clone(),
                None => json!("echo"),
            };
            let body = json!({"model": model, "prompt": "hi", "max_tokens": 2});
            let (status, reply) = post_json(&frontend.url("/v1/completions"), &body).await;
            let expected = if env.is_empty() { 200 } else { 401 };
            assert_eq!(status, expected, "{name}: {reply}");
            served.push(name.as_str());
        }
    }
    for name in [
        "tls",
        "tls_client_certs",
        "cors",
        "uds_root_path",
        "chat_template",
        "chat_template_inline",
        "frontend_options",
        "tool_calling",
        "generation_config",
    ] {
        assert!(served.contains(&name), "{name} should serve: served {served:?}, refused {refused:?}");
    }
    for name in ["tls_ciphers", "sse_keep_alive"] {
        assert!(refused.contains(&name), "{name} should be refused: served {served:?}, refused {refused:?}");
    }
}

#[test]
fn every_key_of_vllm_serve_has_a_treatment() {
    let keys = fixture("serve_keys.json");
    let names = |group: &str| -> Vec<String> {
        keys[group].as_array().unwrap().iter().map(|k| k.as_str().unwrap().to_owned()).collect()
    };
    let (frontend, engine) = (names("frontend"), names("engine"));
    assert!(frontend.len() > 50 && engine.len() > 100, "{} {}", frontend.len(), engine.len());
    // vLLM never puts these in --args-json (RustFrontendProcessManager excludes them).
    let never_passed =
        ["api_server_count", "data_parallel_rank", "data_parallel_external_lb", "data_parallel_hybrid_lb"];
    let treated = |key: &str| {
        HONOURED_KEYS.contains(&key)
            || IGNORED_KEYS.iter().any(|(k, _)| *k == key)
            || REFUSED_KEYS.iter().any(|(k, _)| *k == key)
            || REFUSED_VALUES.iter().any(|(k, _, _)| *k == key)
    };
    let untreated: Vec<&String> =
        frontend.iter().filter(|k| !never_passed.contains(&k.as_str()) && !treated(k)).collect();
    assert!(untreated.is_empty(), "server keys with no treatment: {untreated:?}");
    // Every key the table names is one vLLM has (or one of this frontend's own).
    let own =
        ["engine_ready_timeout_secs", "http_timeout_keep_alive", "engine_stall_timeout_s", "max_engine_message_bytes"];
    let listed = HONOURED_KEYS
        .iter()
        .copied()
        .chain(IGNORED_KEYS.iter().map(|(k, _)| *k))
        .chain(REFUSED_KEYS.iter().map(|(k, _)| *k))
        .chain(REFUSED_VALUES.iter().map(|(k, _, _)| *k));
    let unknown: Vec<&str> =
        listed.filter(|k| !own.contains(k) && !frontend.iter().chain(&engine).any(|name| name == k)).collect();
    assert!(unknown.is_empty(), "keys vLLM 0.33 does not have: {unknown:?}");
}
