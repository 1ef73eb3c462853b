//! `n` > 1 against mock engines over real ZeroMQ sockets: child requests as
//! vLLM forms them, choices by index (whole and streamed), usage over all
//! choices, and every child aborted when the client goes away.

mod common;

use common::mock_engine::{EngineEvent, MockEngine};
use common::{post_json, sse_payloads, Frontend, Options};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

async fn start(engine_count: u32) -> (Frontend, Vec<MockEngine>) {
    Frontend::start_with_engines(Options { engine_count, dp_size: engine_count, ..Default::default() }, |_| {}).await
}

/// Every ADD the engines got: (request id, external id, seed).
fn children(engines: &[MockEngine]) -> Vec<(String, String, Option<i64>)> {
    let mut out: Vec<_> = engines
        .iter()
        .flat_map(MockEngine::added)
        .map(|event| match event {
            EngineEvent::Added { id, external_id, sampling, .. } => {
                let seed = sampling
                    .as_map()
                    .unwrap()
                    .iter()
                    .find(|(key, _)| key.as_str() == Some("seed"))
                    .and_then(|(_, v)| v.as_i64());
                (id, external_id.unwrap(), seed)
            }
            _ => unreachable!(),
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn n_choices_are_child_requests_with_seeds_and_summed_usage() {
    let (fe, engines) = start(2).await;
    let body = json!({"prompt": "hello", "max_tokens": 4, "n": 3, "seed": 10, "stop": "l"});
    let (status, answer) = post_json(&fe.url("/v1/completions"), &body).await;
    assert_eq!(status, 200, "{answer}");
    let choices = answer["choices"].as_array().unwrap();
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        // Each choice's stop string is matched on its own text.
        assert_eq!(
            (&choice["text"], &choice["finish_reason"], &choice["stop_reason"]),
            (&json!("he"), &json!("stop"), &json!("l"))
        );
    }
    assert_eq!(choices.len(), 3);
    let usage = &answer["usage"];
    assert_eq!(usage["prompt_tokens"], 5, "the prompt counts once: {usage}");
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((9..=12).contains(&completion), "3 choices of 3 or 4 tokens each: {usage}");
    assert_eq!(usage["total_tokens"], 5 + completion);
    let external = answer["id"].as_str().unwrap();
    let added = children(&engines);
    let parent = added[0].0.strip_prefix("0_").unwrap().to_owned();
    assert!(parent.starts_with(&format!("{external}-")), "{parent}");
    let expected: Vec<_> =
        (0..3).map(|i| (format!("{i}_{parent}"), external.to_owned(), Some(10 + i as i64))).collect();
    assert_eq!(added, expected);
    // vLLM routes each child as any request: with two engines both get some.
    assert!(engines.iter().all(|e| !e.added().is_empty()), "{added:?}");
}

#[tokio::test]
async fn one_choice_stays_one_request_and_unseeded_children_get_no_seed() {
    let (fe, engines) = start(1).await;
    let (status, answer) = post_json(&fe.url("/v1/completions"), &json!({"prompt": "ab", "max_tokens": 2})).await;
    assert_eq!((status, answer["choices"].as_array().unwrap().len()), (200, 1), "{answer}");
    let (status, answer) =
        post_json(&fe.url("/v1/completions"), &json!({"prompt": "ab", "max_tokens": 2, "n": 2})).await;
    assert_eq!(status, 200, "{answer}");
    let added = children(&engines);
    let prefixes: Vec<_> = added.iter().map(|(id, _, _)| &id[..2]).collect();
    assert_eq!(prefixes, ["0_", "1_", "cm"], "{added:?}");
    assert!(added.iter().all(|(_, _, seed)| seed.is_none()), "{added:?}");
}

#[tokio::test]
async fn streamed_choices_interleave_with_a_finish_each_and_usage_of_all() {
    let (fe, _engines) = start(2).await;
    let body = json!({"prompt": "hey", "max_tokens": 5, "n": 3, "stream": true,
                      "stream_options": {"include_usage": true}});
    let r = reqwest::Client::new().post(fe.url("/v1/completions")).json(&body).send().await.unwrap();
    let payloads = sse_payloads(&r.text().await.unwrap());
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = payloads[..payloads.len() - 1].iter().map(|p| serde_json::from_str(p).unwrap()).collect();
    let (usage_chunk, choice_chunks) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(
        usage_chunk["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 15, "total_tokens": 18, "prompt_tokens_details": null,
               "completion_tokens_details": {"reasoning_tokens": 0}})
    );
    let mut texts = BTreeMap::new();
    let mut finishes = BTreeMap::new();
    for chunk in choice_chunks {
        assert!(chunk.get("usage").is_none(), "{chunk}");
        let choice = &chunk["choices"][0];
        let index = choice["index"].as_u64().unwrap();
        texts.entry(index).or_insert_with(String::new).push_str(choice["text"].as_str().unwrap());
        if !choice["finish_reason"].is_null() {
            assert!(finishes.insert(index, choice["finish_reason"].clone()).is_none(), "two finishes for {index}");
        }
    }
    assert_eq!(texts, (0..3).map(|i| (i, "heyhe".to_owned())).collect());
    assert_eq!(finishes, (0..3).map(|i| (i, json!("length"))).collect());
}

#[tokio::test]
async fn chat_choices_whole_and_streamed_each_announce_the_role() {
    let (fe, _engines) = start(1).await;
    let messages = json!([{"role": "user", "content": "x"}]);
    let (status, answer) =
        post_json(&fe.url("/v1/chat/completions"), &json!({"messages": messages, "max_tokens": 3, "n": 2})).await;
    assert_eq!(status, 200, "{answer}");
    let choices: Vec<_> = answer["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["index"].clone(), c["message"]["role"].clone(), c["message"]["content"].clone()))
        .collect();
    assert_eq!(choices, (0..2).map(|i| (json!(i), json!("assistant"), json!("use"))).collect::<Vec<_>>());
    assert_eq!(answer["usage"]["completion_tokens"], 6);
    let body = json!({"messages": messages, "max_tokens": 3, "n": 2, "stream": true});
    let r = reqwest::Client::new().post(fe.url("/v1/chat/completions")).json(&body).send().await.unwrap();
    let payloads = sse_payloads(&r.text().await.unwrap());
    let chunks: Vec<Value> = payloads[..payloads.len() - 1].iter().map(|p| serde_json::from_str(p).unwrap()).collect();
    // The role chunks come first, one per choice.
    let roles: Vec<_> =
        chunks[..2].iter().map(|c| (c["choices"][0]["index"].clone(), c["choices"][0]["delta"].clone())).collect();
    assert_eq!(
        roles,
        vec![
            (json!(0), json!({"role": "assistant", "content": ""})),
            (json!(1), json!({"role": "assistant", "content": ""}))
        ]
    );
    for index in 0..2 {
        let content: String = chunks[2..]
            .iter()
            .filter(|c| c["choices"][0]["index"] == index)
            // The finish comes in a chunk of its own, with an empty delta.
            .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(content, "use", "choice {index}");
    }
}

#[tokio::test]
async fn greedy_sampling_with_n_is_refused_as_vllm_refuses_it() {
    let (fe, engines) = start(1).await;
    let (status, answer) =
        post_json(&fe.url("/v1/completions"), &json!({"prompt": "a", "n": 2, "temperature": 0})).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["message"], "n must be 1 when using greedy sampling, got 2.");
    let (status, answer) = post_json(&fe.url("/v1/completions"), &json!({"prompt": "a", "n": 0})).await;
    assert_eq!((status, &answer["error"]["param"]), (400, &json!("n")), "{answer}");
    assert!(engines[0].added().is_empty());
}

#[tokio::test]
async fn a_failed_choice_fails_the_answer() {
    let (fe, _engines) = start(1).await;
    let (status, answer) =
        post_json(&fe.url("/v1/completions"), &json!({"prompt": "ERROR", "max_tokens": 3, "n": 2})).await;
    assert_eq!(status, 500, "{answer}");
    let body = json!({"prompt": "ERROR", "max_tokens": 3, "n": 2, "stream": true});
    let r = reqwest::Client::new().post(fe.url("/v1/completions")).json(&body).send().await.unwrap();
    let payloads = sse_payloads(&r.text().await.unwrap());
    let error: Value = serde_json::from_str(&payloads[0]).unwrap();
    assert_eq!(error["error"]["code"], 500, "{payloads:?}");
    assert_eq!(&payloads[1..], ["[DONE]"]);
}

#[tokio::test]
async fn client_disconnect_aborts_every_choice() {
    let (fe, engines) = Frontend::start_with_engines(Options::default(), |s| s.step = Duration::from_millis(20)).await;
    let mut r = reqwest::Client::new()
        .post(fe.url("/v1/completions"))
        .json(&json!({"prompt": "abc", "max_tokens": 1000, "n": 3, "stream": true}))
        .send()
        .await
        .unwrap();
    let first = r.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    drop(r);
    let ids: Vec<String> = children(&engines).into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(ids.len(), 3);
    assert!(
        engines[0]
            .wait_for(Duration::from_secs(10), |events| {
                ids.iter()
                    .all(|id| events.iter().any(|e| matches!(e, EngineEvent::Aborted(aborted) if aborted.contains(id))))
            })
            .await,
        "not every child was aborted: {:?}",
        engines[0].events()
    );
    let load: Value = reqwest::get(fe.url("/load")).await.unwrap().json().await.unwrap();
    assert_eq!(load["server_load"], 0);
}
