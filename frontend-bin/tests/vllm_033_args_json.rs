//! The `--args-json` strings vLLM 0.33's own `RustFrontendProcessManager`
//! builds for realistic `vllm serve` command lines (tests/fixtures/vllm-0.33,
//! written by scripts/make_vllm_fixtures.py): each one either serves (with the
//! model swapped for `echo` and mock engines) or exits 2 naming the key this
//! frontend cannot honour, so nothing asked for is dropped silently.

mod common;

use common::{post_json, Frontend, Options};
use serde_json::{json, Map, Value};
use std::fs;
use std::path::PathBuf;
use vllm_rs_frontend::config::REFUSED_KEYS;

fn fixtures() -> Map<String, Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/vllm-0.33/args_json.json");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let Value::Object(cases) = serde_json::from_str(&text).unwrap() else { panic!("not an object") };
    cases
}

/// The case's args-json with the model replaced by the built-in `echo` (no
/// hub here) and a short engine wait; the API key moves to the environment.
fn runnable(case: &Value) -> (Map<String, Value>, Vec<(String, String)>) {
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
    (args, env)
}

#[tokio::test]
async fn every_vllm_args_json_serves_or_is_refused_naming_the_key() {
    let cases = fixtures();
    assert!(cases.len() >= 10, "{:?}", cases.keys());
    let (mut served, mut refused) = (0, 0);
    for (name, case) in &cases {
        let (args, env) = runnable(case);
        let refused_key = REFUSED_KEYS.iter().map(|(key, _)| *key).find(|key| args.contains_key(*key));
        let options = Options { args: Value::Object(args.clone()), env: env.clone(), ..Options::default() };
        match refused_key {
            Some(key) => {
                let mut frontend = Frontend::spawn(options);
                let status = frontend.wait_exit(std::time::Duration::from_secs(20)).expect("still running");
                let log = frontend.stderr();
                assert_eq!(status.code(), Some(2), "{name}: {log}");
                assert!(log.contains(key) && !log.contains("panicked"), "{name}: {log}");
                refused += 1;
            }
            None => {
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
                served += 1;
            }
        }
    }
    // The fixtures hold both kinds: TLS, CORS, chat template, root path and
    // generation config are refused; the rest serve.
    assert!(served >= 5 && refused >= 4, "served {served}, refused {refused}");
}
