//! Stream granularity as vLLM's: one SSE event per engine output by default,
//! one per `stream_interval` tokens when `--args-json` sets it. The mock
//! engine sends a request's whole answer at once, one message per output, so
//! the outputs arrive together: counting events per output needs no timing.

mod common;

use common::mock_engine::{EngineSpec, MockEngine};
use common::{exit_of, sse_payloads, Frontend, Options};
use serde_json::{json, Value};

async fn start(args: Value, tokens_per_output: usize) -> (Frontend, Vec<MockEngine>) {
    let options = Options { args, ..Default::default() };
    Frontend::start_with_engines(options, |spec: &mut EngineSpec| spec.tokens_per_step = tokens_per_output).await
}

/// The texts of the streamed chunks that carry text, in order (a chunk that
/// only carries the finish reason or the usage is left out).
async fn streamed_texts(fe: &Frontend, path: &str, body: Value) -> Vec<String> {
    let r = reqwest::Client::new().post(fe.url(path)).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let payloads = sse_payloads(&r.text().await.unwrap());
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str::<Value>(p).unwrap())
        .filter_map(|chunk| {
            let choice = chunk["choices"].get(0)?;
            let text = choice.get("text").or_else(|| choice["delta"].get("content"))?;
            Some(text.as_str().unwrap().to_owned()).filter(|t| !t.is_empty())
        })
        .collect()
}

fn completion(prompt: &str, max_tokens: usize) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "stream": true, "stream_options": {"include_usage": true}})
}

#[tokio::test]
async fn every_engine_output_is_one_event() {
    let (fe, _engines) = start(json!({"model_tag": "toy"}), 1).await;
    let texts = streamed_texts(&fe, "/v1/completions", completion("BURST-abcdefghij", 40)).await;
    let expected: Vec<String> = "BURST-abcdefghij".chars().cycle().take(40).map(String::from).collect();
    assert_eq!(texts, expected, "one event per one-token output, none merged");
}

#[tokio::test]
async fn an_output_of_several_tokens_is_one_event() {
    let (fe, _engines) = start(json!({"model_tag": "toy"}), 3).await;
    let texts = streamed_texts(&fe, "/v1/completions", completion("BURST-abcdefghij", 10)).await;
    assert_eq!(texts, vec!["BUR", "ST-", "abc", "d"], "one event per output, as the engine batched its tokens");
}

#[tokio::test]
async fn chat_streams_one_event_per_engine_output() {
    let (fe, _engines) = start(json!({"model_tag": "echo"}), 1).await;
    let body = json!({"messages": [{"role": "user", "content": "BURST"}], "max_tokens": 12, "stream": true});
    let texts = streamed_texts(&fe, "/v1/chat/completions", body).await;
    // The echo template renders "user: BURST\nassistant: ", echoed back token by token.
    let expected: Vec<String> = "user: BURST\n".chars().map(String::from).collect();
    assert_eq!(texts, expected);
}

#[tokio::test]
async fn stream_interval_sends_the_first_tokens_then_every_n_then_the_rest() {
    let (fe, _engines) = start(json!({"model_tag": "toy", "stream_interval": 4}), 1).await;
    let texts = streamed_texts(&fe, "/v1/completions", completion("BURST-abcdefghij", 10)).await;
    // vLLM's rule: the first token at once, then 4 tokens per event, the finish with what is left.
    assert_eq!(texts, vec!["B", "URST", "-abc", "d"]);
}

#[tokio::test]
async fn stream_interval_counts_tokens_not_outputs() {
    let (fe, _engines) = start(json!({"model_tag": "toy", "stream_interval": 4}), 3).await;
    let texts = streamed_texts(&fe, "/v1/completions", completion("BURST-abcdefghij", 14)).await;
    // Outputs of 3 tokens: 3 sent at once (the first), then 3 + 3 >= 4, then 3 + 2 (finished).
    assert_eq!(texts, vec!["BUR", "ST-abc", "defgh"]);
}

#[tokio::test]
async fn a_request_may_raise_the_stream_interval_never_lower_it() {
    let (fe, _engines) = start(json!({"model_tag": "toy", "stream_interval": 4}), 1).await;
    let mut body = completion("BURST-abcdefghij", 10);
    body["stream_interval"] = json!(2);
    assert_eq!(streamed_texts(&fe, "/v1/completions", body.clone()).await, vec!["B", "URST", "-abc", "d"]);
    body["stream_interval"] = json!(5);
    assert_eq!(streamed_texts(&fe, "/v1/completions", body).await, vec!["B", "URST-", "abcd"]);
}

#[tokio::test]
async fn a_request_stream_interval_applies_to_chat_too() {
    let (fe, _engines) = start(json!({"model_tag": "echo"}), 1).await;
    let body = json!({"messages": [{"role": "user", "content": "BURST"}], "max_tokens": 12, "stream": true,
                      "stream_interval": 8});
    assert_eq!(streamed_texts(&fe, "/v1/chat/completions", body).await, vec!["u", "ser: BUR", "ST\n"]);
}

#[tokio::test]
async fn stream_interval_leaves_whole_answers_alone() {
    let (fe, _engines) = start(json!({"model_tag": "toy", "stream_interval": 4}), 1).await;
    let (status, body) =
        common::post_json(&fe.url("/v1/completions"), &json!({"prompt": "BURST-abcdefghij", "max_tokens": 10})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], "BURST-abcd");
    assert_eq!(body["usage"]["completion_tokens"], 10);
}

#[test]
fn a_stream_interval_below_one_is_refused_naming_the_key() {
    for bad in ["0", "-2", "1.5", "\"4\""] {
        let (code, text) = exit_of(&format!(r#"{{"model_tag": "toy", "stream_interval": {bad}}}"#), &[], &[]);
        assert_eq!(code, Some(2), "stream_interval {bad}: {text}");
        assert!(text.contains("stream_interval"), "stream_interval {bad}: {text}");
    }
}
