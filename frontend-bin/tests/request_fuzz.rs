//! Fuzzing the request parsing with proptest: arbitrary JSON bodies, valid
//! bodies with one field replaced by arbitrary JSON, and valid bodies with
//! their bytes mutated. The parsing functions are called directly (a parsed
//! request or a 4xx in the OpenAI error shape, never a panic), then one batch
//! goes to the real binary over HTTP.

mod common;

use common::{Frontend, Options};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Value};
use std::time::Duration;
use vllm_rs_server::http::body::parse_body;
use vllm_rs_server::http::error::ApiError;
use vllm_rs_server::http::routes::openai::chat_completions::validate::parse_chat_request;
use vllm_rs_server::http::routes::openai::completions::validate::parse_completion_request;

/// Parameter names the parsers read, so random objects hit them often.
const FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "n",
    "best_of",
    "stream",
    "stream_options",
    "include_usage",
    "logprobs",
    "echo",
    "suffix",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "structured_outputs",
    "json",
    "regex",
    "choice",
    "function",
    "name",
    "add_generation_prompt",
    "logit_bias",
    "bad_words",
    "allowed_token_ids",
    "role",
    "content",
    "type",
    "text",
];

fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![3 => prop::sample::select(FIELDS).prop_map(str::to_owned), 1 => "[a-z_]{0,8}"]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-3i64..3).prop_map(Value::from),
        any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()).prop_map(Value::from),
        prop::sample::select(vec![0.0, 0.5, 1.0, 1.5, -1.0, 2.0, 1e300, -1e-300]).prop_map(Value::from),
    ]
}

/// Any JSON value, up to 4 levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        number(),
        "\\PC{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(field_name(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn valid_completion() -> Value {
    json!({"model": "toy", "prompt": "hello", "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 3,
        "seed": 1, "stop": ["x"], "stop_token_ids": [1], "stream": false, "min_tokens": 1})
}

fn valid_chat() -> Value {
    json!({"model": "toy", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5,
        "temperature": 0.5, "stream": true, "stream_options": {"include_usage": true}, "add_generation_prompt": true})
}

/// A valid body with one field set to (or added as) arbitrary JSON.
fn replaced_field(valid: Value) -> impl Strategy<Value = Value> {
    (field_name(), any_json()).prop_map(move |(name, value)| {
        let mut body = valid.clone();
        body[name] = value;
        body
    })
}

/// A valid body's bytes with up to 4 bytes overwritten, inserted or removed.
fn mutated_bytes(valid: Value) -> impl Strategy<Value = Vec<u8>> {
    let bytes = serde_json::to_vec(&valid).unwrap();
    let len = bytes.len();
    prop::collection::vec((0..len, any::<u8>(), 0..3u8), 1..5).prop_map(move |edits| {
        let mut out = bytes.clone();
        for (at, byte, kind) in edits {
            let at = at.min(out.len().saturating_sub(1));
            match kind {
                0 if !out.is_empty() => out[at] = byte,
                1 => out.insert(at, byte),
                _ if !out.is_empty() => {
                    out.remove(at);
                }
                _ => {}
            }
        }
        out
    })
}

/// A body for either endpoint, as bytes: any JSON, a replaced field, or mutated bytes.
fn any_body(valid: Value) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any_json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        replaced_field(valid.clone()).prop_map(|v| serde_json::to_vec(&v).unwrap()),
        mutated_bytes(valid),
    ]
}

fn check_client_error(error: &ApiError) -> Result<(), TestCaseError> {
    prop_assert!(error.status.is_client_error(), "{error:?}");
    let body = serde_json::to_value(error.body()).unwrap();
    prop_assert_eq!(&body["error"]["code"], &json!(error.status.as_u16()));
    prop_assert!(body["error"]["type"].is_string());
    prop_assert!(body["error"]["param"].is_null() || body["error"]["param"].is_string());
    prop_assert!(!error.message.is_empty());
    Ok(())
}

/// Parses `bytes` as either endpoint would: every failure must be a 4xx in the OpenAI shape.
fn parse_both(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Err(error) = parse_body::<serde_json::Map<String, serde_json::Value>>(bytes) {
        check_client_error(&error)?;
    }
    if let Err(error) = parse_completion_request(bytes) {
        check_client_error(&error)?;
    }
    if let Err(error) = parse_chat_request(bytes) {
        check_client_error(&error)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: 400, failure_persistence: None, ..Config::default() })]

    #[test]
    fn completion_bodies_parse_or_get_a_4xx(bytes in any_body(valid_completion())) {
        parse_both(&bytes)?;
    }

    #[test]
    fn chat_bodies_parse_or_get_a_4xx(bytes in any_body(valid_chat())) {
        parse_both(&bytes)?;
    }
}

#[test]
fn valid_bodies_parse() {
    let completion = parse_completion_request(&serde_json::to_vec(&valid_completion()).unwrap()).unwrap();
    assert_eq!(completion.common.sampling.max_tokens, Some(5));
    let chat = parse_chat_request(&serde_json::to_vec(&valid_chat()).unwrap()).unwrap();
    assert_eq!((chat.messages.len(), chat.common.include_usage), (1, true));
}

/// What the real server answered: a completed 200 or a 4xx in the OpenAI shape.
async fn check_served(client: &reqwest::Client, url: &str, body: Vec<u8>) {
    let shown = String::from_utf8_lossy(&body).chars().take(200).collect::<String>();
    let r = client.post(url).header("content-type", "application/json").body(body).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    if status == 200 {
        assert!(
            text.ends_with("data: [DONE]\n\n")
                || serde_json::from_str::<Value>(&text).is_ok_and(|v| v["choices"].is_array()),
            "{shown} -> {text}"
        );
        return;
    }
    assert!((400..500).contains(&status), "{shown} -> {status} {text}");
    let error: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{shown} -> {status} {text}"));
    assert_eq!(error["error"]["code"], status, "{shown} -> {text}");
    assert!(error["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{shown} -> {text}");
}

#[tokio::test]
async fn the_server_answers_fuzzed_bodies_with_a_response_or_a_4xx() {
    let (mut fe, engines) = Frontend::start_with_engines(Options::default(), |s| s.tokens_per_step = 64).await;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let mut runner = TestRunner::deterministic();
    for (path, valid) in [("/v1/completions", valid_completion()), ("/v1/chat/completions", valid_chat())] {
        let strategy = any_body(valid);
        for _ in 0..60 {
            let body = strategy.new_tree(&mut runner).unwrap().current();
            check_served(&client, &fe.url(path), body).await;
        }
    }
    assert!(fe.child.try_wait().unwrap().is_none(), "the frontend died:\n{}", fe.stderr());
    assert_eq!(client.get(fe.url("/health")).send().await.unwrap().status(), 200);
    assert!(!engines[0].added().is_empty(), "no fuzzed body was valid: the test exercised only errors");
}
