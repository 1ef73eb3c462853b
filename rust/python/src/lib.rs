//! The PyO3 extension module `vllm_rs._core` (built by maturin): argument
//! conversion and error mapping only. Processes are the process core's
//! (`vllm-rs-core`), parsers are `vllm-rs-parsers`'; nothing here decides
//! anything on its own; the GGUF matmul kernel is `vllm-rs-kernels`', model
//! files and the generation config are `vllm-rs-model-files`'.
//! `python/vllm_rs/_core.pyi` types what it exports.

mod decoder;
#[cfg(target_os = "linux")]
mod errors;
mod kernels;
mod model_files;
mod parsers;
mod process;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    process::register(m)?;
    parsers::register(m)?;
    kernels::register(m)?;
    decoder::register(m)?;
    model_files::register(m)?;
    Ok(())
}
