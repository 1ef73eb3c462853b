//! The `--args-json` keys that say where the model's files are and which
//! generation config applies: `model`, `revision`, `tokenizer_revision`,
//! `download_dir`, `generation_config`, `override_generation_config`
//! (used by `model_files.rs` and `generation_config.rs`).

use super::keys::Keys;
use crate::error::ExitError;
use serde_json::{Map, Value};

/// The `--args-json` keys that say where the model's files are and which
/// generation config applies (`model_files.rs`, `generation_config.rs`).
#[derive(Clone, Debug, Default)]
pub struct ModelFilesConfig {
    /// `model`, where the generation config is looked for: vLLM sets it equal
    /// to `model_tag`; `serve` passes the model directory here while
    /// `model_tag` names the built-in tokenizer.
    pub model: Option<String>,
    /// Revision of the model in the hub cache (default `main`).
    pub revision: Option<String>,
    /// Revision of the tokenizer (default: `revision`).
    pub tokenizer_revision: Option<String>,
    /// A hub cache folder searched after the default one.
    pub download_dir: Option<String>,
    /// `auto` (default), `vllm` or a folder.
    pub generation_config: String,
    /// Overrides of the generation config's sampling defaults.
    pub override_generation_config: Map<String, Value>,
}

impl ModelFilesConfig {
    pub(crate) fn load(keys: &Keys) -> Result<Self, ExitError> {
        let override_generation_config = match keys.get("override_generation_config") {
            None => Map::new(),
            Some(Value::Object(map)) => map.clone(),
            Some(other) => return Err(Keys::wrong_type("override_generation_config", "an object", other)),
        };
        Ok(ModelFilesConfig {
            model: keys.string("model")?,
            revision: keys.string("revision")?,
            tokenizer_revision: keys.string("tokenizer_revision")?,
            download_dir: keys.string("download_dir")?,
            generation_config: keys.string("generation_config")?.unwrap_or_else(|| "auto".to_owned()),
            override_generation_config,
        })
    }
}
