//! Model files downloaded from the hub as vLLM does when the cache lacks
//! them: against a local stand-in for the Hugging Face Hub
//! (`tests/fake_hub.py`, pointed to by `HF_ENDPOINT`), never the internet.
//! The files land in the cache layout (`refs/`, `blobs/`, `snapshots/`) and
//! the frontend serves with them; `HF_HUB_OFFLINE`, a repo the hub does not
//! have and an unreachable hub each exit 2 naming the model and where it looked.

mod common;

use common::mock_engine::EngineEvent;
use common::{exit_of, post_json, temp_dir, Frontend, Options};
use serde_json::json;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The commit the fake hub reports for `main` (tests/fake_hub.py).
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// The fake hub process; it stops when dropped (its stdin closes).
struct FakeHub {
    child: Child,
    url: String,
}

impl FakeHub {
    /// Serves `Org/Name`: the byte-BPE test tokenizer (EOS 258) and a
    /// generation config naming one more EOS id, 10.
    fn start(root: &Path) -> FakeHub {
        let repo = root.join("Org/Name");
        fs::create_dir_all(&repo).unwrap();
        let tokenizer = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizers/byte-bpe");
        for file in ["tokenizer.json", "tokenizer_config.json"] {
            fs::copy(tokenizer.join(file), repo.join(file)).unwrap();
        }
        fs::write(repo.join("generation_config.json"), json!({"eos_token_id": [258, 10]}).to_string()).unwrap();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fake_hub.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(root)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the fake hub");
        let mut url = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut url).unwrap();
        assert!(url.starts_with("http://127.0.0.1:"), "fake hub said {url:?}");
        FakeHub { child, url: url.trim().to_owned() }
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// The environment of a frontend with an empty Hugging Face home and the fake hub.
fn hub_env(home: &Path, hub: &FakeHub) -> Vec<(String, String)> {
    vec![
        ("HF_HOME".into(), home.display().to_string()),
        ("HF_HUB_CACHE".into(), String::new()),
        ("HF_ENDPOINT".into(), hub.url.clone()),
        ("HF_HUB_OFFLINE".into(), String::new()),
    ]
}

#[tokio::test]
async fn a_model_missing_from_the_cache_is_downloaded_into_it_and_served() {
    let root = temp_dir("download");
    let hub = FakeHub::start(&root.join("hub-files"));
    let home = root.join("hf-home");
    let options = Options { args: json!({"model_tag": "Org/Name"}), env: hub_env(&home, &hub), ..Options::default() };
    let (fe, engines) = Frontend::start_with_engines(options, |_| {}).await;
    let (status, reply) =
        post_json(&fe.url("/v1/completions"), &json!({"model": "Org/Name", "prompt": "ab\ncd", "max_tokens": 12}))
            .await;
    assert_eq!(status, 200, "{reply}");
    // The downloaded generation config's extra EOS (10, "\n") stops the echo engine.
    assert_eq!(
        (reply["choices"][0]["text"].as_str(), reply["choices"][0]["stop_reason"].as_u64()),
        (Some("ab"), Some(10))
    );
    match engines[0].added().pop() {
        Some(EngineEvent::Added { .. }) => {}
        other => panic!("no ADD: {other:?}"),
    }
    let repo = home.join("hub/models--Org--Name");
    assert_eq!(fs::read_to_string(repo.join("refs/main")).unwrap().trim(), COMMIT);
    let snapshot = repo.join("snapshots").join(COMMIT);
    for file in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        let link = fs::read_link(snapshot.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(link.to_string_lossy().contains("blobs/"), "{file} -> {}", link.display());
        assert_eq!(
            fs::read(snapshot.join(file)).unwrap(),
            fs::read(root.join("hub-files/Org/Name").join(file)).unwrap()
        );
    }
    assert!(!snapshot.join("chat_template.jinja").exists(), "a file the hub lacks is skipped");
    assert!(fe.stderr().contains("downloading"), "{}", fe.stderr());
}

#[test]
fn offline_with_an_empty_cache_exits_2_naming_the_model_and_where_it_looked() {
    let root = temp_dir("download-offline");
    let hub = FakeHub::start(&root.join("hub-files"));
    let home = root.join("hf-home");
    let mut env = hub_env(&home, &hub);
    env.retain(|(k, _)| k != "HF_HUB_OFFLINE");
    env.push(("HF_HUB_OFFLINE".into(), "1".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (code, log) = exit_of(&json!({"model_tag": "Org/Name"}).to_string(), &[], &env);
    assert_eq!(code, Some(2), "{log}");
    let looked = home.join("hub/models--Org--Name").display().to_string();
    assert!(log.contains("Org/Name") && log.contains(&looked) && log.contains("HF_HUB_OFFLINE"), "{log}");
    assert!(!home.join("hub/models--Org--Name").exists(), "nothing was downloaded");
}

#[test]
fn a_repo_the_hub_lacks_or_an_unreachable_hub_exits_2_with_a_clear_message() {
    let root = temp_dir("download-missing");
    let hub = FakeHub::start(&root.join("hub-files"));
    let home = root.join("hf-home");
    let env = hub_env(&home, &hub);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (code, log) = exit_of(&json!({"model_tag": "Org/Missing"}).to_string(), &[], &env);
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("Org/Missing") && log.contains(&hub.url) && log.contains("has no such model"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    let (code, log) = exit_of(&json!({"model_tag": "Org/Name", "revision": "v9"}).to_string(), &[], &env);
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("\"v9\"") && log.contains("has no such model"), "{log}");
    // Nothing listens on port 1: the download itself fails.
    let mut env = env.clone();
    env.retain(|(k, _)| *k != "HF_ENDPOINT");
    env.push(("HF_ENDPOINT", "http://127.0.0.1:1"));
    let (code, log) = exit_of(&json!({"model_tag": "Org/Name"}).to_string(), &[], &env);
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("Org/Name") && log.contains("http://127.0.0.1:1") && log.contains("failed"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}
