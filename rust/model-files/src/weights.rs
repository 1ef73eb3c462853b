//! A hub model's safetensors weights, which `serve`'s engines load: one
//! `model.safetensors`, or the shards `model.safetensors.index.json` names;
//! which of them a snapshot lacks, and their download into the cache.

use crate::{status, Hub};
use hf_hub::api::sync::{ApiError, ApiRepo};
use std::path::{Path, PathBuf};

/// The weights of a model in one file.
pub const SAFETENSORS_FILE: &str = "model.safetensors";
/// The index naming the shards of a model's weights.
pub const SAFETENSORS_INDEX: &str = "model.safetensors.index.json";
/// Model types of `config.json` that have no weights to download (the built-in models).
pub const WEIGHTLESS_MODEL_TYPES: &[&str] = &["toy", "echo"];

/// Why a model's weights could not be had.
#[derive(Debug)]
pub enum WeightsError {
    /// The cache lacks them and `HF_HUB_OFFLINE` is set.
    Offline {
        /// The model name as given.
        name: String,
        /// The snapshot that lacks them.
        snapshot: PathBuf,
        /// The files it lacks (empty: not yet known which).
        missing: Vec<String>,
    },
    /// The hub has neither the single file nor the index.
    NotOnHub {
        /// The model name as given.
        name: String,
        /// The revision asked for.
        revision: String,
        /// The hub asked.
        endpoint: String,
    },
    /// A download failed (network, disk, a file the index names but the hub lacks).
    Download {
        /// The model name as given.
        name: String,
        /// The hub asked.
        endpoint: String,
        /// What went wrong.
        reason: String,
    },
}

impl WeightsError {
    /// The message, with names quoted by `quote` (as `LocateError::describe`).
    pub fn describe(&self, quote: &dyn Fn(&str) -> String) -> String {
        match self {
            WeightsError::Offline { name, snapshot, missing } => {
                let lacking = if missing.is_empty() {
                    format!("{SAFETENSORS_FILE} (or {SAFETENSORS_INDEX})")
                } else {
                    missing.join(", ")
                };
                format!(
                    "{}: the Hugging Face cache ({}) lacks its weights ({lacking}) and HF_HUB_OFFLINE is set, \
                     so nothing was downloaded",
                    quote(name),
                    snapshot.display()
                )
            }
            WeightsError::NotOnHub { name, revision, endpoint } => format!(
                "{} (revision {}) on {endpoint} has neither {SAFETENSORS_FILE} nor {SAFETENSORS_INDEX}: \
                 this engine loads safetensors weights (or a .gguf file)",
                quote(name),
                quote(revision)
            ),
            WeightsError::Download { name, endpoint, reason } => {
                format!("downloading the weights of {} from {endpoint} failed: {reason}", quote(name))
            }
        }
    }
}

impl std::fmt::Display for WeightsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe(&|s| format!("{s:?}")))
    }
}

impl std::error::Error for WeightsError {}

/// The safetensors files the model folder `snapshot` lacks: `None` when it
/// needs none (no `config.json`, or a built-in model type) or has them all;
/// `Some([])` when it is not yet known which (neither `model.safetensors`
/// nor the index is there).
pub fn missing(snapshot: &Path) -> Option<Vec<String>> {
    let json = |file: &str| -> Option<serde_json::Value> {
        serde_json::from_str(&std::fs::read_to_string(snapshot.join(file)).ok()?).ok()
    };
    let config = json("config.json")?;
    let model_type = config.as_object()?.get("model_type").and_then(|t| t.as_str());
    if model_type.is_some_and(|t| WEIGHTLESS_MODEL_TYPES.contains(&t)) || snapshot.join(SAFETENSORS_FILE).is_file() {
        return None;
    }
    let shards = json(SAFETENSORS_INDEX).and_then(|index| {
        let map = index.get("weight_map")?.as_object()?;
        map.values().map(|v| v.as_str().map(str::to_owned)).collect::<Option<Vec<_>>>()
    });
    let Some(mut shards) = shards else { return Some(Vec::new()) };
    shards.sort();
    shards.dedup();
    shards.retain(|shard| !snapshot.join(shard).is_file());
    (!shards.is_empty()).then_some(shards)
}

/// Downloads `lacking` of `name` at `revision` from `hub` into the cache
/// `into`; when `lacking` is empty, `model.safetensors`, else the index and
/// the shards it names.
pub(crate) fn download(
    name: &str,
    revision: &str,
    hub: &Hub,
    into: &Path,
    lacking: Vec<String>,
) -> Result<(), WeightsError> {
    let failed = |e: ApiError| WeightsError::Download {
        name: name.to_owned(),
        endpoint: hub.endpoint.clone(),
        reason: e.to_string(),
    };
    let repo = hub.repo(name, revision, into).map_err(failed)?;
    let mut shards = lacking;
    if shards.is_empty() {
        if fetch(&repo, SAFETENSORS_FILE).map_err(failed)?.is_some() {
            return Ok(());
        }
        let index = fetch(&repo, SAFETENSORS_INDEX).map_err(failed)?.ok_or_else(|| WeightsError::NotOnHub {
            name: name.to_owned(),
            revision: revision.to_owned(),
            endpoint: hub.endpoint.clone(),
        })?;
        shards = index.parent().and_then(missing).unwrap_or_default();
    }
    for shard in &shards {
        repo.download(shard).map_err(failed)?;
    }
    Ok(())
}

/// `file` downloaded; `None` when the hub lacks it (404).
fn fetch(repo: &ApiRepo, file: &str) -> Result<Option<PathBuf>, ApiError> {
    match repo.download(file) {
        Ok(path) => Ok(Some(path)),
        Err(e) if status(&e) == Some(404) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_names_the_shards_a_snapshot_lacks() {
        let dir = std::env::temp_dir().join(format!("vllm-rs-weights-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(missing(&dir), None, "no config.json: nothing to fetch");
        std::fs::write(dir.join("config.json"), r#"{"model_type": "echo"}"#).unwrap();
        assert_eq!(missing(&dir), None, "a built-in model type has no weights");
        std::fs::write(dir.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
        assert_eq!(missing(&dir), Some(vec![]), "neither file nor index: not yet known which");
        let index = r#"{"weight_map": {"a": "s2.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}}"#;
        std::fs::write(dir.join(SAFETENSORS_INDEX), index).unwrap();
        std::fs::write(dir.join("s2.safetensors"), b"").unwrap();
        assert_eq!(missing(&dir), Some(vec!["s1.safetensors".to_owned()]));
        std::fs::write(dir.join("s1.safetensors"), b"").unwrap();
        assert_eq!(missing(&dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
