//! `vllm_rs._core.locate_model` and `hub_cache_roots`: `vllm-rs-model-files`
//! (where a model's files are) over Python arguments, so `serve` finds a
//! model exactly as the frontend will. Its error is `ModelNotFoundError` (a
//! `LookupError`), with the message the crate writes, names quoted as
//! Python's `repr` does. The GIL is released while the hub is asked.

use std::collections::HashMap;
use std::ffi::OsString;

use pyo3::create_exception;
use pyo3::exceptions::PyLookupError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use vllm_rs_model_files::{Announce, HubCache};

create_exception!(
    vllm_rs._core,
    ModelNotFoundError,
    PyLookupError,
    "A model that is neither a directory, nor in the hub cache, nor downloaded."
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

/// Adds the functions and exceptions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ModelNotFoundError", py.get_type::<ModelNotFoundError>())?;
    m.add_function(wrap_pyfunction!(locate_model, m)?)?;
    m.add_function(wrap_pyfunction!(hub_cache_roots, m)?)?;
    Ok(())
}
