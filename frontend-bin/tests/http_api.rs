//! The OpenAI HTTP surface against mock engines over real ZeroMQ sockets,
//! with a real HTTP client.

mod common;

use common::{post_json, sse_payloads, Frontend, Options};
use serde_json::{json, Value};
use std::time::Duration;

async fn start(args: Value) -> (Frontend, Vec<common::mock_engine::MockEngine>) {
    Frontend::start_with_engines(Options { args, ..Default::default() }, |_| {}).await
}

#[tokio::test]
async fn completion_echoes_prompt_tokens_with_usage() {
    let (fe, engines) = start(json!({"model_tag": "toy"})).await;
    let (status, body) =
        post_json(&fe.url("/v1/completions"), &json!({"model": "toy", "prompt": "hello", "max_tokens": 7})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], "toy");
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(body["choices"][0]["text"], "hellohe");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
               "prompt_tokens_details": null, "completion_tokens_details": {"reasoning_tokens": 0}})
    );
    let added = engines[0].added();
    let common::mock_engine::EngineEvent::Added { id, external_id, prompt, sampling, .. } = &added[0] else {
        unreachable!()
    };
    assert_eq!(prompt, &b"hello".iter().map(|&b| b as u32).collect::<Vec<_>>());
    let external_id = external_id.as_deref().unwrap();
    assert_eq!(external_id, body["id"].as_str().unwrap());
    assert!(id.starts_with(&format!("{external_id}-")) && id.len() == external_id.len() + 9, "{id}");
    let get =
        |k: &str| sampling.as_map().unwrap().iter().find(|(key, _)| key.as_str() == Some(k)).map(|(_, v)| v.clone());
    assert_eq!(get("max_tokens").and_then(|v| v.as_u64()), Some(7));
    assert_eq!(get("_eos_token_id").and_then(|v| v.as_u64()), Some(256));
}

#[tokio::test]
async fn completion_accepts_token_ids_and_request_id_header() {
    let (fe, _engines) = start(json!({"model_tag": "toy"})).await;
    let r = reqwest::Client::new()
        .post(fe.url("/v1/completions"))
        .header("X-Request-Id", "abc123")
        .json(&json!({"prompt": [104, 105], "max_tokens": 2, "ignore_eos": true}))
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["id"], "cmpl-abc123");
    assert_eq!(body["choices"][0]["text"], "hi");
}

#[tokio::test]
async fn streamed_completion_with_usage() {
    let (fe, _engines) = start(json!({"model_tag": "toy"})).await;
    let r = reqwest::Client::new()
        .post(fe.url("/v1/completions"))
        .json(&json!({"prompt": "abc", "max_tokens": 6, "stream": true, "stream_options": {"include_usage": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let payloads = sse_payloads(&r.text().await.unwrap());
    assert_eq!(payloads.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = payloads[..payloads.len() - 1].iter().map(|p| serde_json::from_str(p).unwrap()).collect();
    let text: String = chunks.iter().filter_map(|c| c["choices"].get(0)).map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(text, "abcabc");
    let finishes: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, vec!["length"]);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    assert!(chunks[..chunks.len() - 1].iter().all(|c| c.get("usage").is_none()));
}

#[tokio::test]
async fn chat_completion_streamed_and_not() {
    let (fe, _engines) = start(json!({"model_tag": "echo", "served_model_name": ["echo", "alias"]})).await;
    let messages = json!([{"role": "user", "content": "hi"}]);
    let (status, body) =
        post_json(&fe.url("/v1/chat/completions"), &json!({"model": "alias", "messages": messages, "max_tokens": 8}))
            .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "echo");
    assert_eq!(
        body["choices"][0]["message"],
        json!({"role": "assistant", "content": "user: hi", "refusal": null, "annotations": null, "audio": null,
               "function_call": null, "reasoning": null})
    );
    assert_eq!(body["usage"]["prompt_tokens"], "user: hi\nassistant: ".len());

    let r = reqwest::Client::new()
        .post(fe.url("/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "yo"}]}], "max_completion_tokens": 4, "stream": true}))
        .send()
        .await
        .unwrap();
    let payloads = sse_payloads(&r.text().await.unwrap());
    assert_eq!(payloads.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = payloads[..payloads.len() - 1].iter().map(|p| serde_json::from_str(p).unwrap()).collect();
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String =
        chunks.iter().map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap_or_default()).collect();
    assert_eq!(text, "user");
    // The finish comes in a chunk of its own, with an empty delta, as vLLM's frontend sends it.
    let last = &chunks.last().unwrap()["choices"][0];
    assert_eq!((&last["finish_reason"], &last["delta"]), (&json!("length"), &json!({})));
}

#[tokio::test]
async fn stop_string_truncates_and_aborts_in_the_engine() {
    let (fe, engines) = start(json!({"model_tag": "toy"})).await;
    let (status, body) = post_json(
        &fe.url("/v1/completions"),
        &json!({"prompt": "abcSTOPdefghijk", "max_tokens": 15, "stop": ["STOP"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], "abc");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["choices"][0]["stop_reason"], "STOP");
    assert!(
        engines[0]
            .wait_for(Duration::from_secs(5), |events| events
                .iter()
                .any(|e| matches!(e, common::mock_engine::EngineEvent::Aborted(_))))
            .await
    );
}

#[tokio::test]
async fn stop_token_ids_reach_the_engine() {
    let (fe, _engines) = start(json!({"model_tag": "toy"})).await;
    let (_, body) =
        post_json(&fe.url("/v1/completions"), &json!({"prompt": "abcd", "max_tokens": 10, "stop_token_ids": [99]}))
            .await;
    // As in vLLM, the stop token itself is left out of the text.
    assert_eq!(body["choices"][0]["text"], "ab");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["choices"][0]["stop_reason"], 99);
}

#[tokio::test]
async fn streaming_never_splits_a_utf8_character() {
    let (fe, _engines) = start(json!({"model_tag": "toy"})).await;
    let prompt = "é€😀";
    let r = reqwest::Client::new()
        .post(fe.url("/v1/completions"))
        .json(&json!({"prompt": prompt, "max_tokens": prompt.len(), "stream": true}))
        .send()
        .await
        .unwrap();
    let payloads = sse_payloads(&r.text().await.unwrap());
    let pieces: Vec<String> = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str::<Value>(p).unwrap()["choices"][0]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(pieces.concat(), prompt);
    assert!(pieces.iter().all(|p| !p.contains('\u{fffd}')));
}

#[tokio::test]
async fn errors_have_the_openai_shape() {
    let (fe, _engines) = start(json!({"model_tag": "toy", "max_model_len": 32})).await;
    let url = fe.url("/v1/completions");
    let cases = [
        (json!({"model": "nope", "prompt": "x"}), 404, Some("model")),
        (json!({"prompt": "x", "max_tokens": -3}), 400, Some("max_tokens")),
        (json!({"prompt": "x", "temperature": "hot"}), 400, Some("temperature")),
        (json!({"prompt": "x", "n": 0}), 400, Some("n")),
        (json!({"prompt": 5}), 400, Some("prompt")),
        (json!({"max_tokens": 3}), 400, Some("prompt")),
        (json!({"prompt": "x", "max_tokens": 40}), 400, Some("max_tokens")),
        (json!({"prompt": "x".repeat(40)}), 400, Some("prompt")),
        (json!({"prompt": [1, 99999]}), 400, Some("prompt")),
    ];
    for (request, status, param) in cases {
        let (got, body) = post_json(&url, &request).await;
        assert_eq!(got, status, "{request} -> {body}");
        let error = &body["error"];
        assert_eq!(error["code"], status, "{body}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert!(error["type"].is_string());
        assert_eq!(error["param"].as_str(), param, "{request} -> {body}");
    }
    let (status, body) = post_json(&fe.url("/v1/chat/completions"), &json!({"messages": []})).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("messages")));

    let client = reqwest::Client::new();
    let r = client.post(&url).header("content-type", "application/json").body("{not json").send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], 400);
    let r = reqwest::Client::new().post(&url).body(vec![b' '; 17 * 1024 * 1024]).send().await.unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], 413);
    let r = client.get(fe.url("/no/such/route")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], 404);
    let r = client.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], 405);
}

#[tokio::test]
async fn engine_error_is_a_500() {
    let (fe, _engines) = start(json!({"model_tag": "toy"})).await;
    let (status, body) = post_json(&fe.url("/v1/completions"), &json!({"prompt": "ERROR now", "max_tokens": 3})).await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["error"]["code"], 500);
    // The server stays healthy after a per-request engine error.
    assert_eq!(reqwest::get(fe.url("/health")).await.unwrap().status(), 200);
}

#[tokio::test]
async fn engine_request_errors_map_as_vllm_maps_them() {
    let (fe, _engines) = start(json!({"model_tag": "toy"})).await;
    for (prompt, status, kind, message) in [
        ("REJECT this", 400, "BadRequestError", "validation_error from the mock engine"),
        ("PAUSED now", 503, "ServiceUnavailableError", "engine_paused from the mock engine"),
    ] {
        let (got, body) = post_json(&fe.url("/v1/completions"), &json!({"prompt": prompt, "max_tokens": 3})).await;
        let expected = json!({"error": {"message": message, "type": kind, "param": null, "code": status}});
        assert_eq!((got, &body), (status, &expected), "{prompt}");
        let request = json!({"messages": [{"role": "user", "content": prompt}], "stream": true});
        let r = reqwest::Client::new().post(fe.url("/v1/chat/completions")).json(&request).send().await.unwrap();
        assert_eq!(r.status(), 200, "{prompt}: a stream has started");
        let text = r.text().await.unwrap();
        let events: Vec<&str> = text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).collect();
        assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
        assert_eq!(serde_json::from_str::<Value>(events[events.len() - 2]).unwrap(), expected, "{text}");
    }
    assert_eq!(reqwest::get(fe.url("/health")).await.unwrap().status(), 200);
}

#[tokio::test]
async fn api_key_guards_everything_but_health_and_metrics() {
    let (fe, _engines) = start(json!({"model_tag": "toy", "api_key": "sk-test-secret"})).await;
    let client = reqwest::Client::new();
    for path in ["/health", "/metrics"] {
        assert_eq!(client.get(fe.url(path)).send().await.unwrap().status(), 200, "{path}");
    }
    for path in ["/v1/models", "/load", "/version"] {
        let r = client.get(fe.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], 401);
    }
    let body = json!({"prompt": "hi", "max_tokens": 1});
    let r = client.post(fe.url("/v1/completions")).bearer_auth("wrong").json(&body).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = client.post(fe.url("/v1/completions")).bearer_auth("sk-test-secret").json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(!fe.stderr().contains("sk-test-secret"), "the key reached the log");
}

#[tokio::test]
async fn models_version_load_and_metrics() {
    let (fe, _engines) =
        start(json!({"model_tag": "toy", "served_model_name": "my-model", "max_model_len": 512})).await;
    let models: Value = reqwest::get(fe.url("/v1/models")).await.unwrap().json().await.unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "my-model");
    assert_eq!(models["data"][0]["root"], "toy");
    assert_eq!(models["data"][0]["max_model_len"], 512);
    let version: Value = reqwest::get(fe.url("/version")).await.unwrap().json().await.unwrap();
    assert_eq!(version["version"], env!("CARGO_PKG_VERSION"));
    let load: Value = reqwest::get(fe.url("/load")).await.unwrap().json().await.unwrap();
    assert_eq!(load["server_load"], 0);

    for _ in 0..2 {
        let (status, _) = post_json(&fe.url("/v1/completions"), &json!({"prompt": "abc", "max_tokens": 4})).await;
        assert_eq!(status, 200);
    }
    let metrics = reqwest::get(fe.url("/metrics")).await.unwrap().text().await.unwrap();
    let labels = "model_name=\"my-model\",engine=\"0\"";
    for line in [
        format!("vllm:request_success_total{{{labels},finished_reason=\"length\"}} 2"),
        format!("vllm:prompt_tokens_total{{{labels}}} 6"),
        format!("vllm:generation_tokens_total{{{labels}}} 8"),
        format!("vllm:num_requests_running{{{labels}}} 0"),
        format!("vllm:time_to_first_token_seconds_count{{{labels}}} 2"),
        format!("vllm:e2e_request_latency_seconds_count{{{labels}}} 2"),
    ] {
        assert!(metrics.contains(&line), "missing {line} in\n{metrics}");
    }
    // One gap per batch of tokens a request receives after its first: 3 per
    // request when each of the 4 tokens arrives alone, fewer when engine
    // outputs reach the request together (a loaded machine).
    let gaps_prefix = format!("vllm:inter_token_latency_seconds_count{{{labels}}} ");
    let gaps: u64 = metrics.lines().find_map(|line| line.strip_prefix(&gaps_prefix)).expect(&metrics).parse().unwrap();
    assert!((2..=6).contains(&gaps), "{gaps} inter-token gaps for 2 requests of 4 tokens\n{metrics}");
}

fn fixture_dir() -> String {
    format!("{}/../tests/fixtures/tokenizers/byte-bpe", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn hugging_face_tokenizer_and_chat_template_from_the_tokenizer_key() {
    let (fe, engines) = start(json!({"model_tag": "my-model", "tokenizer": fixture_dir()})).await;
    let (status, body) =
        post_json(&fe.url("/v1/chat/completions"), &json!({"messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(status, 200, "{body}");
    // The echo engine replays the templated prompt until EOS, <|eot|> (258): a nil stop_reason.
    assert_eq!(body["choices"][0]["message"]["content"], "[user] hi");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["choices"][0]["stop_reason"], Value::Null);
    let common::mock_engine::EngineEvent::Added { prompt, sampling, .. } = &engines[0].added()[0] else {
        unreachable!()
    };
    assert_eq!(prompt[0], 259, "the template writes BOS; it is not added twice");
    assert_eq!(prompt.iter().filter(|&&t| t == 259).count(), 1);
    let get =
        |k: &str| sampling.as_map().unwrap().iter().find(|(key, _)| key.as_str() == Some(k)).map(|(_, v)| v.clone());
    assert_eq!(get("_eos_token_id").and_then(|v| v.as_u64()), Some(258));
    // The generation config (and its extra EOS id 10) belongs to the model, which
    // `my-model` does not name: only the tokenizer's EOS counts, as in vLLM.
    assert_eq!(get("_all_stop_token_ids").unwrap().to_string(), "[258]");
}

#[tokio::test]
async fn hugging_face_tokenizer_from_the_model_directory() {
    let (fe, _engines) = start(json!({"model_tag": fixture_dir()})).await;
    let (status, body) =
        post_json(&fe.url("/v1/completions"), &json!({"prompt": "hello wörld", "max_tokens": 11})).await;
    assert_eq!(status, 200, "{body}");
    // BOS is added to raw prompts and skipped when decoding.
    assert_eq!(body["choices"][0]["text"], "hello wörld");
    assert_eq!(body["usage"]["prompt_tokens"], 11);
    assert_eq!(body["model"], fixture_dir());
}

#[test]
fn unusable_tokenizer_exits_2_naming_the_key() {
    let args = json!({"model_tag": "toy", "tokenizer": "/nonexistent/tok"}).to_string();
    let (code, text) = common::exit_of(&args, &[], &[]);
    assert_eq!(code, Some(2));
    assert!(text.contains("`tokenizer`") && text.contains("/nonexistent/tok"), "{text}");
}

/// `(status, body)` of a request with a raw body, for bodies `post_json` cannot send.
async fn send_raw(method: reqwest::Method, url: &str, body: Vec<u8>) -> (u16, Value) {
    let r = reqwest::Client::new()
        .request(method, url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn assert_openai_error(status: u16, body: &Value, what: &str) {
    assert!((400..500).contains(&status), "{what}: {status} {body}");
    let error = &body["error"];
    assert_eq!(error["code"], status, "{what}: {body}");
    assert!(error["type"].is_string(), "{what}: {body}");
    assert!(error["param"].is_null() || error["param"].is_string(), "{what}: {body}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty() && !message.contains("panicked") && !message.contains("Error {"), "{what}: {body}");
}

#[tokio::test]
async fn every_bad_request_gets_a_4xx_in_the_openai_shape() {
    let (fe, engines) = start(json!({"model_tag": "toy"})).await;
    let post = reqwest::Method::POST;
    for query in ["level=abc", "level=3", "level=-1", "level=1&level=2", "level=99999999999999999999"] {
        let (status, body) = send_raw(post.clone(), &fe.url(&format!("/sleep?{query}")), Vec::new()).await;
        assert_openai_error(status, &body, query);
        if query != "level=1&level=2" {
            assert_eq!(body["error"]["param"], "level", "{query}: {body}");
        }
    }
    let deep = format!("{{\"prompt\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let huge_integer = format!("{{\"prompt\": \"x\", \"max_tokens\": {}}}", "9".repeat(5000));
    let raw_bodies: Vec<(&str, Vec<u8>)> = vec![
        ("syntax", b"{\"prompt\": ".to_vec()),
        ("not an object", b"[1, 2]".to_vec()),
        ("empty", Vec::new()),
        ("not utf-8", vec![b'{', 0xff, 0xfe, b'}']),
        ("deep", deep.into_bytes()),
        ("5000 digits", huge_integer.into_bytes()),
    ];
    for path in ["/v1/completions", "/v1/chat/completions"] {
        for (what, body) in &raw_bodies {
            let (status, reply) = send_raw(post.clone(), &fe.url(path), body.clone()).await;
            assert_openai_error(status, &reply, &format!("{path} {what}"));
        }
    }
    let many = |item: Value| Value::Array(vec![item; 1025]);
    let logit_bias: serde_json::Map<String, Value> = (0..1025).map(|i| (i.to_string(), json!(1))).collect();
    let completion_cases = [
        (json!({"prompt": "x", "stop": many(json!("s"))}), "stop"),
        (json!({"prompt": "x", "stop_token_ids": many(json!(1))}), "stop_token_ids"),
        (json!({"prompt": "x", "logit_bias": logit_bias}), "logit_bias"),
        (json!({"prompt": "x", "bad_words": many(json!("w"))}), "bad_words"),
        (json!({"prompt": "x", "allowed_token_ids": many(json!(1))}), "allowed_token_ids"),
        (json!({"prompt": "x", "seed": 9223372036854775808u64}), "seed"),
        (json!({"prompt": "x", "top_k": 2147483648u64}), "top_k"),
        (json!({"prompt": "x", "top_k": -2}), "top_k"),
        (json!({"prompt": "x", "max_tokens": 0}), "max_tokens"),
        (json!({"prompt": "x", "max_tokens": 18446744073709551615u64}), "max_tokens"),
        (json!({"prompt": "x", "min_tokens": 4294967296u64}), "min_tokens"),
        (json!({"prompt": "x", "temperature": -0.5}), "temperature"),
        (json!({"prompt": "x", "top_p": 1.01}), "top_p"),
        (json!({"prompt": "x", "min_p": [1]}), "min_p"),
        (json!({"prompt": "x", "stream": 1}), "stream"),
        (json!({"prompt": "x", "stream": true, "stream_options": 5}), "stream_options"),
        (json!({"prompt": {"text": "x"}}), "prompt"),
        (json!({"prompt": [-1]}), "prompt"),
        (json!({"prompt": ["a", "b"]}), "prompt"),
        (json!({"prompt": "x", "model": 7}), "model"),
        (json!({"prompt": "x", "min_tokens": 17}), "min_tokens"), // above the default max_tokens, 16
    ];
    for (request, param) in completion_cases {
        let (status, body) = post_json(&fe.url("/v1/completions"), &request).await;
        assert_openai_error(status, &body, param);
        assert_eq!(body["error"]["param"], param, "{body}");
    }
    let chat_cases = [
        (json!({}), "messages"),
        (json!({"messages": "hi"}), "messages"),
        (json!({"messages": [{"content": "hi"}]}), "messages"),
        (json!({"messages": [{"role": "user", "content": 5}]}), "messages"),
        (json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), "messages"),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2147483648u64}),
            "max_completion_tokens",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": "yes"}),
            "add_generation_prompt",
        ),
    ];
    for (request, param) in chat_cases {
        let (status, body) = post_json(&fe.url("/v1/chat/completions"), &request).await;
        assert_openai_error(status, &body, param);
        assert_eq!(body["error"]["param"], param, "{body}");
    }
    assert!(engines[0].events().is_empty(), "a bad request reached the engine: {:?}", engines[0].events());
    // Good requests still work afterwards, and level 2 reaches the engines.
    let (status, _) = send_raw(post, &fe.url("/sleep?level=2"), Vec::new()).await;
    assert_eq!(status, 200);
    assert_eq!(reqwest::get(fe.url("/health")).await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_model_id_with_slashes_is_retrieved_whole() {
    let (fe, _engines) = start(json!({"model_tag": "toy", "served_model_name": ["Org/Name"]})).await;
    let card = reqwest::get(fe.url("/v1/models/Org/Name")).await.unwrap();
    assert_eq!(card.status(), 200);
    let card: Value = card.json().await.unwrap();
    assert_eq!((card["id"].as_str(), card["object"].as_str()), (Some("Org/Name"), Some("model")), "{card}");
    let other = reqwest::get(fe.url("/v1/models/Org/Other")).await.unwrap();
    assert_eq!(other.status(), 404);
    let error: Value = other.json().await.unwrap();
    assert_eq!(error["error"]["param"], "model", "{error}");
}
