//! The model's generation config as vLLM 0.33 applies it to OpenAI requests:
//! sampling defaults for what a request leaves unset (`get_diff_sampling_param`),
//! a server-wide `max_tokens` cap, and the extra EOS ids that become stop
//! tokens (`SamplingParams.update_from_generation_config`).
//!
//! Where it comes from (`generation_config` in `--args-json`): `auto` (the
//! default) reads the model's `generation_config.json` (else the generation
//! keys of its `config.json`); `vllm` uses no sampling defaults but still
//! takes the model's EOS ids, as vLLM does; any other value is a folder (or
//! cached hub model) to read instead. `override_generation_config` is merged
//! over the sampling defaults (a `null` removes one).
//!
//! The frontend applies it to requests; `serve` loads it too (through
//! `vllm_rs._core`), only to refuse a bad one before anything starts.

use crate::{served_model_dir, HubCache};
use serde_json::{Map, Value};
use std::path::Path;
use vllm_rs_config::error::ExitError;
use vllm_rs_config::ServerConfig;
use vllm_rs_wire::protocol::SamplingParams;

/// The generation config file of a model.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// The model config, read when there is no generation config file.
const MODEL_CONFIG_FILE: &str = "config.json";
/// Generation keys a `config.json` may carry (those of Hugging Face's
/// `GenerationConfig` that vLLM reads), taken when it has no generation config.
const MODEL_CONFIG_KEYS: &[&str] =
    &["temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_new_tokens", "eos_token_id"];
/// Nested configs whose generation keys fill what the top level leaves unset.
const TEXT_CONFIG_KEYS: &[&str] = &["decoder", "generator", "text_config"];

/// Sampling defaults from the generation config; `None` leaves vLLM's default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplingDefaults {
    /// `temperature`.
    pub temperature: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `top_k`.
    pub top_k: Option<i64>,
    /// `min_p`.
    pub min_p: Option<f64>,
    /// `repetition_penalty`.
    pub repetition_penalty: Option<f64>,
    /// `presence_penalty`.
    pub presence_penalty: Option<f64>,
    /// `frequency_penalty`.
    pub frequency_penalty: Option<f64>,
    /// `max_new_tokens`: the default `max_tokens` of chat requests.
    pub max_tokens: Option<u64>,
}

/// What the server applies to every request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    /// Defaults for sampling parameters a request does not set.
    pub defaults: SamplingDefaults,
    /// Upper bound on every request's `max_tokens`: `max_new_tokens` of a
    /// generation config folder, or of `override_generation_config`.
    pub max_tokens_cap: Option<u64>,
    /// The generation config's `eos_token_id`s (never affected by the override).
    pub eos_token_ids: Vec<u32>,
}

/// Where the generation config is read from.
pub struct GenerationConfigSource<'a> {
    /// `generation_config`: `auto`, `vllm` or a folder.
    pub mode: &'a str,
    /// `override_generation_config`.
    pub overrides: &'a Map<String, Value>,
    /// The model's directory, when it could be found.
    pub model_dir: Option<&'a Path>,
    /// How errors name the two options.
    pub names: OptionNames,
}

/// How errors name `generation_config` and `override_generation_config`:
/// as the frontend's `--args-json` keys, or as `serve`'s flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionNames {
    /// `--args-json: \`generation_config\``, `--args-json: \`override_generation_config.KEY\``.
    ArgsJson,
    /// `--generation-config`, `override_generation_config.KEY`.
    ServeFlags,
}

impl OptionNames {
    /// The name of `generation_config`.
    fn folder(self) -> &'static str {
        match self {
            OptionNames::ArgsJson => "--args-json: `generation_config`",
            OptionNames::ServeFlags => "--generation-config",
        }
    }

    /// The name of the override of `key`.
    fn overridden(self, key: &str) -> String {
        match self {
            OptionNames::ArgsJson => format!("--args-json: `override_generation_config.{key}`"),
            OptionNames::ServeFlags => format!("override_generation_config.{key}"),
        }
    }
}

impl GenerationConfig {
    /// The generation config for the server's model (`model`, else
    /// `model_tag`; `generation_config` and `override_generation_config` of
    /// `--args-json`): the model is located as the tokenizer is, at `revision`; a built-in model, or one that
    /// cannot be found, has no generation config of its own (vLLM's "not
    /// found"), which is logged.
    pub fn for_server(config: &ServerConfig, hub: &HubCache) -> Result<Self, ExitError> {
        let files = &config.model_files;
        let model_dir = served_model_dir(config, hub, "generation config");
        let source = GenerationConfigSource {
            mode: &files.generation_config,
            overrides: &files.override_generation_config,
            model_dir: model_dir.as_deref(),
            names: OptionNames::ArgsJson,
        };
        Self::load(&source, hub)
    }

    /// Reads and validates the generation config; a file that is not valid
    /// JSON, a value of the wrong type or out of range, or a folder that
    /// cannot be found is a usage error naming it.
    pub fn load(source: &GenerationConfigSource, hub: &HubCache) -> Result<Self, ExitError> {
        let (file_keys, origin) = match source.mode {
            "auto" | "vllm" => match source.model_dir {
                Some(dir) => (read_config_dir(dir)?, dir.display().to_string()),
                None => (None, String::new()),
            },
            folder => {
                // vLLM passes no revision for a folder of its own.
                let option = source.names.folder();
                let dir = hub
                    .locate(folder, None)
                    .map_err(|e| ExitError::usage(format!("{option}: {e}; or use `auto` or `vllm`")))?;
                let keys = read_config_dir(&dir)?.ok_or_else(|| {
                    ExitError::usage(format!(
                        "{option}: {} holds neither {GENERATION_CONFIG_FILE} nor {MODEL_CONFIG_FILE}",
                        dir.display()
                    ))
                })?;
                (Some(keys), dir.display().to_string())
            }
        };
        let file_keys = file_keys.unwrap_or_default();
        let eos_token_ids = eos_ids(&file_keys, &origin)?;
        let mut merged = if source.mode == "vllm" { Map::new() } else { file_keys };
        for (key, value) in source.overrides {
            merged.insert(key.clone(), value.clone());
        }
        let from_override = |key: &str| source.overrides.get(key).is_some_and(|v| !v.is_null());
        let name = |key: &str| {
            if from_override(key) {
                source.names.overridden(key)
            } else {
                format!("generation config of {origin}: `{key}`")
            }
        };
        let keys = Typed { map: &merged, name: &name };
        let penalty = |v: f64| (-2.0..=2.0).contains(&v);
        let defaults = SamplingDefaults {
            temperature: keys.float("temperature", |v| v >= 0.0, "a number >= 0")?,
            top_p: keys.float("top_p", |v| v > 0.0 && v <= 1.0, "a number in (0, 1]")?,
            top_k: keys.int("top_k", -1, i64::from(i32::MAX))?,
            min_p: keys.float("min_p", |v| (0.0..=1.0).contains(&v), "a number in [0, 1]")?,
            repetition_penalty: keys.float("repetition_penalty", |v| v > 0.0, "a number > 0")?,
            presence_penalty: keys.float("presence_penalty", penalty, "a number in [-2, 2]")?,
            frequency_penalty: keys.float("frequency_penalty", penalty, "a number in [-2, 2]")?,
            max_tokens: keys.int("max_new_tokens", 1, i64::from(i32::MAX))?.map(|n| n as u64),
        };
        if keys.get("skip_special_tokens") == Some(&Value::Bool(false)) {
            tracing::warn!(
                "{} is false: this frontend always skips special tokens when decoding",
                name("skip_special_tokens")
            );
        }
        let max_tokens_cap = match source.mode {
            "auto" | "vllm" => Typed { map: source.overrides, name: &name }
                .int("max_new_tokens", 1, i64::from(i32::MAX))?
                .map(|n| n as u64),
            _ => defaults.max_tokens,
        };
        let config = GenerationConfig { defaults, max_tokens_cap, eos_token_ids };
        if config.defaults != SamplingDefaults::default() && source.mode != "vllm" {
            tracing::warn!(
                "Default vLLM sampling parameters have been overridden by {}: {:?}. If this is not intended, \
                 set `generation_config` to `vllm`.",
                if source.mode == "auto" { "the model's `generation_config.json`" } else { source.mode },
                config.defaults
            );
        }
        Ok(config)
    }

    /// Fills the sampling parameters the request left unset with the
    /// defaults (a request value always wins).
    pub fn fill_sampling_defaults(&self, sampling: &mut SamplingParams) {
        let d = &self.defaults;
        for (value, default) in [
            (&mut sampling.temperature, d.temperature),
            (&mut sampling.top_p, d.top_p),
            (&mut sampling.min_p, d.min_p),
            (&mut sampling.repetition_penalty, d.repetition_penalty),
            (&mut sampling.presence_penalty, d.presence_penalty),
            (&mut sampling.frequency_penalty, d.frequency_penalty),
        ] {
            if value.is_none() {
                *value = default;
            }
        }
        if sampling.top_k.is_none() {
            sampling.top_k = d.top_k;
        }
    }

    /// `max_tokens` after the server-wide cap.
    pub fn cap_max_tokens(&self, max_tokens: u64) -> u64 {
        self.max_tokens_cap.map_or(max_tokens, |cap| max_tokens.min(cap))
    }

    /// Fills `_eos_token_id`, `stop_token_ids` and `_all_stop_token_ids` as
    /// vLLM's `update_from_generation_config` does, `eos` being the
    /// tokenizer's: every stop id includes EOS and the generation config's
    /// EOS ids (even with `ignore_eos`, for `min_tokens`); unless `ignore_eos`,
    /// `_eos_token_id` is EOS and the other EOS ids join `stop_token_ids`.
    pub fn set_stop_token_ids(&self, sampling: &mut SamplingParams, eos: Option<u32>) {
        let mut all = Vec::with_capacity(sampling.stop_token_ids.len() + 1 + self.eos_token_ids.len());
        let add = |ids: &mut Vec<u32>, id: u32| {
            if !ids.contains(&id) {
                ids.push(id);
            }
        };
        for &id in &sampling.stop_token_ids {
            add(&mut all, id);
        }
        sampling.eos_token_id = if sampling.ignore_eos { None } else { eos };
        if let Some(id) = eos {
            add(&mut all, id);
        }
        for &id in self.eos_token_ids.iter().filter(|&&id| Some(id) != eos) {
            add(&mut all, id);
            if !sampling.ignore_eos {
                add(&mut sampling.stop_token_ids, id);
            }
        }
        sampling.all_stop_token_ids = all;
    }
}

/// The generation keys of `dir`: its `generation_config.json` (non-null
/// keys), else the generation keys of its `config.json`, else `None`.
fn read_config_dir(dir: &Path) -> Result<Option<Map<String, Value>>, ExitError> {
    if let Some(Value::Object(keys)) = read_json(&dir.join(GENERATION_CONFIG_FILE))? {
        return Ok(Some(keys.into_iter().filter(|(_, v)| !v.is_null()).collect()));
    }
    let Some(Value::Object(config)) = read_json(&dir.join(MODEL_CONFIG_FILE))? else { return Ok(None) };
    let text_config = TEXT_CONFIG_KEYS.iter().find_map(|k| config.get(*k).and_then(Value::as_object));
    let keys = MODEL_CONFIG_KEYS
        .iter()
        .filter_map(|&key| {
            let top = config.get(key).filter(|v| !v.is_null());
            let value = top.or_else(|| text_config.and_then(|c| c.get(key)).filter(|v| !v.is_null()))?;
            Some((key.to_owned(), value.clone()))
        })
        .collect();
    Ok(Some(keys))
}

/// A JSON file, `None` when it does not exist.
pub(crate) fn read_json(path: &Path) -> Result<Option<Value>, ExitError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ExitError::usage(format!("cannot read {}: {e}", path.display()))),
    };
    match serde_json::from_str(&text) {
        Ok(value @ Value::Object(_)) => Ok(Some(value)),
        Ok(_) => Err(ExitError::usage(format!("{} must hold a JSON object", path.display()))),
        Err(e) => Err(ExitError::usage(format!("{} is not valid JSON: {e}", path.display()))),
    }
}

/// The generation config's `eos_token_id`: a token id or a list of them.
fn eos_ids(keys: &Map<String, Value>, origin: &str) -> Result<Vec<u32>, ExitError> {
    let id = |v: &Value| v.as_u64().and_then(|id| u32::try_from(id).ok());
    let wrong = || {
        ExitError::usage(format!("generation config of {origin}: `eos_token_id` must be a token id or a list of them"))
    };
    match keys.get("eos_token_id") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(ids)) => ids.iter().map(|v| id(v).ok_or_else(wrong)).collect(),
        Some(v) => Ok(vec![id(v).ok_or_else(wrong)?]),
    }
}

/// Typed reads of a merged config whose errors name where each key came from.
struct Typed<'a> {
    map: &'a Map<String, Value>,
    name: &'a dyn Fn(&str) -> String,
}

impl Typed<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn float(&self, key: &str, ok: impl Fn(f64) -> bool, what: &str) -> Result<Option<f64>, ExitError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && ok(x) && !v.is_boolean() => Ok(Some(x)),
                _ => Err(ExitError::usage(format!("{} must be {what}", (self.name)(key)))),
            },
        }
    }

    fn int(&self, key: &str, min: i64, max: i64) -> Result<Option<i64>, ExitError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(ExitError::usage(format!("{} must be an integer from {min} to {max}", (self.name)(key)))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::PathBuf;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn model_dir(tag: &str, files: &[(&str, Value)]) -> Dir {
        let dir = std::env::temp_dir().join(format!("vllm-rs-genconfig-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, value) in files {
            std::fs::write(dir.join(name), value.to_string()).unwrap();
        }
        Dir(dir)
    }

    fn load(mode: &str, overrides: Value, dir: Option<&Path>) -> Result<GenerationConfig, ExitError> {
        let overrides = overrides.as_object().unwrap().clone();
        GenerationConfig::load(
            &GenerationConfigSource { mode, overrides: &overrides, model_dir: dir, names: OptionNames::ArgsJson },
            &HubCache::default(),
        )
    }

    fn usage(result: Result<GenerationConfig, ExitError>) -> String {
        match result {
            Err(ExitError::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn auto_reads_defaults_and_eos_ids_and_the_override_wins() {
        let dir = model_dir(
            "auto",
            &[(
                GENERATION_CONFIG_FILE,
                json!({"temperature": 0.6, "top_p": 0.9, "top_k": 20, "eos_token_id": [258, 10],
                       "max_new_tokens": 100, "do_sample": true, "min_p": null}),
            )],
        );
        let c = load("auto", json!({"temperature": 0.2, "top_p": null}), Some(&dir.0)).unwrap();
        assert_eq!(
            c.defaults,
            SamplingDefaults { temperature: Some(0.2), top_k: Some(20), max_tokens: Some(100), ..Default::default() }
        );
        assert_eq!((c.max_tokens_cap, c.eos_token_ids.clone()), (None, vec![258, 10]));
        let c = load("vllm", json!({"max_new_tokens": 7}), Some(&dir.0)).unwrap();
        assert_eq!(c.defaults, SamplingDefaults { max_tokens: Some(7), ..Default::default() });
        assert_eq!((c.max_tokens_cap, c.eos_token_ids), (Some(7), vec![258, 10]), "vllm keeps the EOS ids");
        let c = load(dir.0.to_str().unwrap(), json!({}), None).unwrap();
        assert_eq!(c.max_tokens_cap, Some(100), "a folder's max_new_tokens caps every request");
    }

    #[test]
    fn config_json_stands_in_for_a_missing_generation_config() {
        let dir = model_dir(
            "fallback",
            &[(
                MODEL_CONFIG_FILE,
                json!({"eos_token_id": 5, "presence_penalty": 0.3, "hidden_size": 8, "temperature": null,
                       "text_config": {"temperature": 0.4, "top_k": 3}}),
            )],
        );
        let c = load("auto", json!({}), Some(&dir.0)).unwrap();
        assert_eq!(c.defaults, SamplingDefaults { temperature: Some(0.4), top_k: Some(3), ..Default::default() });
        assert_eq!(c.eos_token_ids, vec![5]);
        assert_eq!(load("auto", json!({}), None).unwrap(), GenerationConfig::default());
    }

    #[test]
    fn bad_values_name_the_key_and_where_it_came_from() {
        let dir = model_dir("bad", &[(GENERATION_CONFIG_FILE, json!({"temperature": -1}))]);
        let m = usage(load("auto", json!({}), Some(&dir.0)));
        assert!(m.contains("`temperature`") && m.contains(&dir.0.display().to_string()), "{m}");
        let m = usage(load("auto", json!({"top_p": 2}), None));
        assert!(m.contains("override_generation_config.top_p"), "{m}");
        let m = usage(load("auto", json!({"top_k": 1.5}), None));
        assert!(m.contains("top_k"), "{m}");
        let m = usage(load("/nonexistent/genconfig", json!({}), None));
        assert!(m.contains("generation_config") && m.contains("/nonexistent/genconfig"), "{m}");
        std::fs::write(dir.0.join(GENERATION_CONFIG_FILE), "{").unwrap();
        assert!(usage(load("auto", json!({}), Some(&dir.0))).contains("not valid JSON"));
        std::fs::write(dir.0.join(GENERATION_CONFIG_FILE), r#"{"eos_token_id": [-1]}"#).unwrap();
        assert!(usage(load("auto", json!({}), Some(&dir.0))).contains("eos_token_id"));
    }

    #[test]
    fn errors_name_serves_flags_for_serve() {
        let load = |mode: &str, overrides: Value| {
            let overrides = overrides.as_object().unwrap().clone();
            let source =
                GenerationConfigSource { mode, overrides: &overrides, model_dir: None, names: OptionNames::ServeFlags };
            usage(GenerationConfig::load(&source, &HubCache::default()))
        };
        let m = load("auto", json!({"top_p": 2}));
        assert!(m.starts_with("override_generation_config.top_p must be"), "{m}");
        let m = load("/nonexistent/genconfig", json!({}));
        assert!(m.starts_with("--generation-config: ") && m.contains("/nonexistent/genconfig"), "{m}");
    }

    #[test]
    fn stop_tokens_follow_update_from_generation_config() {
        let config = GenerationConfig { eos_token_ids: vec![258, 10], ..Default::default() };
        let mut s = SamplingParams { stop_token_ids: vec![7], ..Default::default() };
        config.set_stop_token_ids(&mut s, Some(258));
        assert_eq!(
            (s.eos_token_id, s.stop_token_ids.clone(), s.all_stop_token_ids.clone()),
            (Some(258), vec![7, 10], vec![7, 258, 10])
        );
        let mut s = SamplingParams { stop_token_ids: vec![7], ignore_eos: true, ..Default::default() };
        config.set_stop_token_ids(&mut s, Some(258));
        assert_eq!(
            (s.eos_token_id, s.stop_token_ids, s.all_stop_token_ids),
            (None, vec![7], vec![7, 258, 10]),
            "ignore_eos keeps every EOS in _all_stop_token_ids (min_tokens) but stops on none"
        );
    }

    #[test]
    fn defaults_fill_only_what_the_request_left_unset() {
        let config = GenerationConfig {
            defaults: SamplingDefaults { temperature: Some(0.6), top_k: Some(20), ..Default::default() },
            max_tokens_cap: Some(64),
            ..Default::default()
        };
        let mut s = SamplingParams { temperature: Some(1.0), ..Default::default() };
        config.fill_sampling_defaults(&mut s);
        assert_eq!((s.temperature, s.top_k, s.top_p), (Some(1.0), Some(20), None));
        assert_eq!((config.cap_max_tokens(100), config.cap_max_tokens(3)), (64, 3));
    }
}
