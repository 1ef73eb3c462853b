//! The model's generation config and its files as vLLM 0.33 finds and applies
//! them: the sampling params the frontend sends match what vLLM's own OpenAI
//! server builds (tests/fixtures/vllm-0.33/genconfig_*, written by
//! scripts/make_vllm_fixtures.py), an extra EOS id of the generation config
//! finishes a request, and a hub model id is served from a Hugging Face cache
//! laid out on disk (no network).

mod common;

use common::mock_engine::EngineEvent;
use common::{exit_of, post_json, temp_dir, Frontend, Options};
use rmpv::Value as Mp;
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/vllm-0.33")
}

/// A model folder with the byte-BPE test tokenizer (EOS `<|eot|>` = 258) and
/// `generation` as its generation_config.json (none when null).
fn model_dir(dir: &Path, generation: &Value) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let tokenizer = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizers/byte-bpe");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        fs::copy(tokenizer.join(file), dir.join(file)).unwrap();
    }
    if !generation.is_null() {
        fs::write(dir.join("generation_config.json"), generation.to_string()).unwrap();
    }
    dir.to_path_buf()
}

fn map_get<'a>(map: &'a Mp, key: &str) -> Option<&'a Mp> {
    map.as_map()?.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
}

/// The fields vLLM's engine acts on, with vLLM's default for a field left
/// out (its encoder omits defaults); stop-id lists as sorted sets, which is
/// how the engine uses them.
fn normalized(sampling: &Mp) -> Value {
    let float = |key: &str, default: f64| map_get(sampling, key).and_then(Mp::as_f64).unwrap_or(default);
    let ids = |key: &str| {
        let mut ids: Vec<u64> = map_get(sampling, key)
            .and_then(Mp::as_array)
            .map_or(Vec::new(), |a| a.iter().filter_map(Mp::as_u64).collect());
        ids.sort();
        ids.dedup();
        ids
    };
    let top_k = map_get(sampling, "top_k").and_then(Mp::as_i64).unwrap_or(0);
    json!({
        "max_tokens": map_get(sampling, "max_tokens").and_then(Mp::as_u64).unwrap_or(16),
        "temperature": float("temperature", 1.0),
        "top_p": float("top_p", 1.0),
        "top_k": if top_k == -1 { 0 } else { top_k },
        "min_p": float("min_p", 0.0),
        "repetition_penalty": float("repetition_penalty", 1.0),
        "presence_penalty": float("presence_penalty", 0.0),
        "frequency_penalty": float("frequency_penalty", 0.0),
        "eos_token_id": map_get(sampling, "_eos_token_id").and_then(Mp::as_u64),
        "stop_token_ids": ids("stop_token_ids"),
        "all_stop_token_ids": ids("_all_stop_token_ids"),
        "ignore_eos": map_get(sampling, "ignore_eos").and_then(Mp::as_bool).unwrap_or(false),
    })
}

fn added_sampling(engine: &common::mock_engine::MockEngine) -> Mp {
    match engine.added().pop() {
        Some(EngineEvent::Added { sampling, .. }) => sampling,
        other => panic!("no ADD: {other:?}"),
    }
}

fn path_for(endpoint: &str) -> &'static str {
    if endpoint == "chat" {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    }
}

#[tokio::test]
async fn sampling_params_match_what_vllm_builds_under_each_generation_config() {
    let manifest: Value = serde_json::from_str(&fs::read_to_string(fixtures().join("manifest.json")).unwrap()).unwrap();
    let cases: Vec<(&String, &Value)> = manifest["files"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, case)| case["kind"] == "generation_config_request" && name.ends_with("_eos258.msgpack"))
        .collect();
    assert!(cases.len() >= 8, "{cases:?}");
    for (name, case) in cases {
        let root = temp_dir(&format!("genconfig-{}", case["case"].as_str().unwrap()));
        let model = model_dir(&root.join("model"), &case["model_generation_config"]);
        let mode = match case["generation_config"].as_str().unwrap() {
            "folder" => {
                let folder = root.join("folder");
                fs::create_dir_all(&folder).unwrap();
                fs::write(folder.join("generation_config.json"), case["folder_generation_config"].to_string()).unwrap();
                folder.display().to_string()
            }
            mode => mode.to_owned(),
        };
        let args = json!({"model_tag": model, "generation_config": mode,
            "override_generation_config": case["override_generation_config"], "engine_ready_timeout_secs": 20});
        let max_model_len = case["max_model_len"].as_u64().unwrap();
        let (fe, engines) = Frontend::start_with_engines(Options { args, ..Default::default() }, |spec| {
            spec.registration = Some((max_model_len, 100))
        })
        .await;
        let (status, reply) = post_json(&fe.url(path_for(case["endpoint"].as_str().unwrap())), &case["body"]).await;
        assert_eq!(status, 200, "{name}: {reply}");
        let vllm_request = rmpv::decode::read_value(&mut &fs::read(fixtures().join(name)).unwrap()[..]).unwrap();
        let vllm = normalized(&vllm_request.as_array().unwrap()[3]);
        assert_eq!(vllm, json!(case["expect"]), "{name}: the fixture decodes to what the manifest says");
        assert_eq!(normalized(&added_sampling(&engines[0])), vllm, "{name}");
    }
}

#[tokio::test]
async fn an_extra_eos_id_of_the_generation_config_finishes_the_request() {
    let root = temp_dir("genconfig-eot");
    // Llama-3 style: the tokenizer's EOS plus an end-of-turn id (here "\n", 10).
    let with_eot = model_dir(&root.join("with"), &json!({"eos_token_id": [258, 10]}));
    let without = model_dir(&root.join("without"), &Value::Null);
    let body = json!({"prompt": "ab\ncd", "max_tokens": 12});
    let (fe, engines) =
        Frontend::start_with_engines(Options { args: json!({"model_tag": with_eot}), ..Default::default() }, |_| {})
            .await;
    let (status, reply) = post_json(&fe.url("/v1/completions"), &body).await;
    assert_eq!(status, 200, "{reply}");
    // The echo engine (stopping as vLLM's does: on stop_token_ids and EOS) replays the prompt.
    assert_eq!(
        (reply["choices"][0]["finish_reason"].clone(), reply["choices"][0]["stop_reason"].clone()),
        (json!("stop"), json!(10))
    );
    assert_eq!(reply["choices"][0]["text"], "ab");
    let stop_ids = map_get(&added_sampling(&engines[0]), "stop_token_ids").unwrap().to_string();
    assert_eq!(stop_ids, "[10]");
    drop((fe, engines));
    let (fe, _engines) =
        Frontend::start_with_engines(Options { args: json!({"model_tag": without}), ..Default::default() }, |_| {})
            .await;
    let (_, reply) = post_json(&fe.url("/v1/completions"), &body).await;
    assert_eq!(
        reply["choices"][0]["finish_reason"], "length",
        "without the generation config nothing stops it: {reply}"
    );
}

/// A Hugging Face hub cache with `Org/Name` at two revisions: `main` (extra
/// EOS 10) and the tag `v2` (extra EOS 11).
fn fake_hub_cache(root: &Path) -> PathBuf {
    let hub = root.join("hub");
    let repo = hub.join("models--Org--Name");
    fs::create_dir_all(repo.join("refs")).unwrap();
    for (reference, commit, extra_eos) in [("main", "1111aaaa", 10), ("v2", "2222bbbb", 11)] {
        fs::write(repo.join("refs").join(reference), commit).unwrap();
        model_dir(&repo.join("snapshots").join(commit), &json!({"eos_token_id": [258, extra_eos]}));
    }
    hub
}

#[tokio::test]
async fn a_hub_model_id_is_served_from_the_hugging_face_cache_at_its_revision() {
    let root = temp_dir("genconfig-hub");
    let hub = fake_hub_cache(&root);
    for (extra, env_var, env_value, revision) in [
        (10, "HF_HUB_CACHE", hub.display().to_string(), Value::Null),
        (11, "HF_HUB_CACHE", hub.display().to_string(), json!("v2")),
        (11, "HF_HUB_CACHE", hub.display().to_string(), json!("2222bbbb")),
        (10, "HF_HOME", root.display().to_string(), Value::Null),
    ] {
        let options = Options {
            args: json!({"model_tag": "Org/Name", "revision": revision}),
            env: vec![(env_var.to_owned(), env_value)],
            ..Default::default()
        };
        let (fe, engines) = Frontend::start_with_engines(options, |_| {}).await;
        let (status, reply) =
            post_json(&fe.url("/v1/completions"), &json!({"model": "Org/Name", "prompt": "hi", "max_tokens": 2})).await;
        assert_eq!(status, 200, "{reply}");
        let sampling = added_sampling(&engines[0]);
        assert_eq!(
            map_get(&sampling, "stop_token_ids").unwrap().to_string(),
            format!("[{extra}]"),
            "revision {revision}"
        );
        assert_eq!(map_get(&sampling, "_eos_token_id").and_then(Mp::as_u64), Some(258));
    }
}

#[test]
fn a_model_that_is_nowhere_exits_2_naming_it_and_where_it_looked() {
    let root = temp_dir("genconfig-missing");
    let hub = fake_hub_cache(&root);
    let hub_env = hub.display().to_string();
    // Offline: the model is looked for in the cache only (frontend-bin/tests/model_download.rs downloads).
    let env = [("HF_HUB_CACHE", hub_env.as_str()), ("HF_HUB_OFFLINE", "1")];
    for (args, needle) in [
        (json!({"model_tag": "Org/Missing"}), "models--Org--Missing"),
        (json!({"model_tag": "Org/Name", "revision": "v3"}), "\"v3\""),
        (json!({"model_tag": "toy", "tokenizer": "Org/Missing"}), "`tokenizer`"),
        (json!({"model_tag": "toy", "generation_config": "/nonexistent/folder"}), "`generation_config`"),
        (
            json!({"model_tag": "toy", "override_generation_config": {"temperature": "hot"}}),
            "override_generation_config.temperature",
        ),
    ] {
        let (code, log) = exit_of(&args.to_string(), &[], &env);
        assert_eq!(code, Some(2), "{args}: {log}");
        assert!(log.contains(needle) && !log.contains("panicked"), "{args}: {log}");
    }
    let (_, log) = exit_of(&json!({"model_tag": "Org/Missing"}).to_string(), &[], &env);
    assert!(log.contains("Org/Missing") && log.contains(&hub_env), "{log}");
}
