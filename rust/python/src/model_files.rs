//! `vllm_rs._core.locate_model`, `hub_cache_roots` and
//! `load_generation_config`: `vllm-rs-model-files` (where a model's files
//! are, its generation config) over Python arguments, so `serve` finds and
//! checks a model exactly as the frontend will. Its errors are
//! `ModelNotFoundError` (a `LookupError`) and `GenerationConfigError` (a
//! `ValueError`), with the messages the crate writes, names quoted as
//! Python's `repr` does. The GIL is released while the hub is asked.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;

use pyo3::create_exception;
use pyo3::exceptions::{PyLookupError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use vllm_rs_model_files::generation_config::{GenerationConfig, GenerationConfigSource, OptionNames};
use vllm_rs_model_files::{Announce, HubCache};

create_exception!(
    vllm_rs._core,
    ModelNotFoundError,
    PyLookupError,
    "A model that is neither a directory, nor in the hub cache, nor downloaded."
);
create_exception!(
    vllm_rs._core,
    GenerationConfigError,
    PyValueError,
    "A generation config that cannot be used; the message names the key and its source."
);

/// The hub cache `env` (the Hugging Face variables) and `download_dir` describe.
fn hub_cache(env: &HashMap<String, String>, download_dir: Option<&str>) -> HubCache {
    HubCache::from_env(&|name| env.get(name).map(OsString::from), download_dir)
}

/// Python's `repr` of `s`.
fn py_repr(py: Python<'_>, s: &str) -> String {
    PyString::new(py, s).repr().map_or_else(|_| format!("{s:?}"), |r| r.to_string())
}

/// The directory holding `name`'s files (`HubCache::locate`, with
/// `weights` also `locate_with_weights`); downloads are announced to `announce`.
#[pyfunction]
#[pyo3(signature = (name, revision, download_dir, env, weights, announce))]
fn locate_model(
    py: Python<'_>,
    name: &str,
    revision: Option<&str>,
    download_dir: Option<&str>,
    env: HashMap<String, String>,
    weights: bool,
    announce: Py<PyAny>,
) -> PyResult<String> {
    let hub = hub_cache(&env, download_dir).announcing(Announce::new(move |message| {
        // A logging failure must not fail the download it reports.
        Python::attach(|py| drop(announce.call1(py, (message,))));
    }));
    let found = py.detach(|| {
        if weights {
            hub.locate_with_weights(name, revision)
        } else {
            hub.locate(name, revision).map_err(vllm_rs_model_files::ModelFilesError::NotFound)
        }
    });
    match found {
        Ok(dir) => Ok(dir.to_string_lossy().into_owned()),
        Err(e) => Err(ModelNotFoundError::new_err(e.describe(&|s| py_repr(py, s)))),
    }
}

/// The hub cache folders searched, in order.
#[pyfunction]
fn hub_cache_roots(env: HashMap<String, String>, download_dir: Option<&str>) -> Vec<String> {
    hub_cache(&env, download_dir).roots().iter().map(|r| r.to_string_lossy().into_owned()).collect()
}

/// The generation config (`GenerationConfig::load`, errors naming `serve`'s
/// flags) as `(defaults, max_tokens_cap, eos_token_ids)`.
#[pyfunction]
fn load_generation_config<'py>(
    py: Python<'py>,
    mode: &str,
    overrides_json: &str,
    model_dir: Option<&str>,
    env: HashMap<String, String>,
) -> PyResult<(Bound<'py, PyDict>, Option<u64>, Vec<u32>)> {
    let overrides: serde_json::Map<String, serde_json::Value> = serde_json::from_str(overrides_json)
        .map_err(|e| GenerationConfigError::new_err(format!("override_generation_config: not a JSON object: {e}")))?;
    let source = GenerationConfigSource {
        mode,
        overrides: &overrides,
        model_dir: model_dir.map(Path::new),
        names: OptionNames::ServeFlags,
    };
    let hub = hub_cache(&env, None);
    let config = py
        .detach(|| GenerationConfig::load(&source, &hub))
        .map_err(|e| GenerationConfigError::new_err(e.to_string()))?;
    let d = &config.defaults;
    let defaults = PyDict::new(py);
    for (key, value) in [
        ("temperature", d.temperature),
        ("top_p", d.top_p),
        ("min_p", d.min_p),
        ("repetition_penalty", d.repetition_penalty),
        ("presence_penalty", d.presence_penalty),
        ("frequency_penalty", d.frequency_penalty),
    ] {
        if let Some(value) = value {
            defaults.set_item(key, value)?;
        }
    }
    if let Some(top_k) = d.top_k {
        defaults.set_item("top_k", top_k)?;
    }
    if let Some(max_tokens) = d.max_tokens {
        defaults.set_item("max_tokens", max_tokens)?;
    }
    Ok((defaults, config.max_tokens_cap, config.eos_token_ids))
}

/// Adds the functions and exceptions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ModelNotFoundError", py.get_type::<ModelNotFoundError>())?;
    m.add("GenerationConfigError", py.get_type::<GenerationConfigError>())?;
    m.add_function(wrap_pyfunction!(locate_model, m)?)?;
    m.add_function(wrap_pyfunction!(hub_cache_roots, m)?)?;
    m.add_function(wrap_pyfunction!(load_generation_config, m)?)?;
    Ok(())
}
