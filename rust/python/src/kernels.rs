//! `vllm_rs._core.gguf_matmul`: the `vllm-rs-kernels` matmul over Python
//! buffers (numpy arrays, or torch CPU tensors through `.numpy()`), without
//! copying them; the GIL is released while it computes.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use vllm_rs_kernels::{matmul, Dims, Path, QuantType};

/// A buffer the kernel can read as a flat C-contiguous array, or the
/// `TypeError`/`ValueError` naming the argument.
fn flat<T: pyo3::buffer::Element>(obj: &Bound<'_, PyAny>, name: &str, dtype: &str) -> PyResult<PyBuffer<T>> {
    let buf = PyBuffer::<T>::get(obj)
        .map_err(|e| PyTypeError::new_err(format!("gguf_matmul: {name} must be a buffer of {dtype} ({e})")))?;
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("gguf_matmul: {name} must be C-contiguous")));
    }
    Ok(buf)
}

fn span<T: pyo3::buffer::Element>(buf: &PyBuffer<T>) -> std::ops::Range<usize> {
    let start = buf.buf_ptr() as usize;
    start..start + buf.len_bytes()
}

/// `out[M,N] = x[M,K] · W[N,K]^T` where `x` and `out` are C-contiguous
/// float32 buffers, `w` is N rows of raw GGUF blocks of `quant_type` (a ggml
/// type id: 2 Q4_0, 3 Q4_1, 8 Q8_0) as a uint8 buffer, N split across
/// `threads` threads. Raises TypeError for a buffer of the wrong type,
/// ValueError for a bad shape, type, thread count, a read-only or
/// overlapping `out`.
#[pyfunction]
#[pyo3(signature = (x, w, out, quant_type, n, k, threads))]
#[allow(clippy::too_many_arguments)] // the Python signature: buffers, shapes and threads
fn gguf_matmul(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    w: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    quant_type: u32,
    n: usize,
    k: usize,
    threads: usize,
) -> PyResult<()> {
    let quant = QuantType::from_ggml(quant_type).ok_or_else(|| {
        PyValueError::new_err(format!("gguf_matmul: quant_type {quant_type} is not Q4_0 (2), Q4_1 (3) or Q8_0 (8)"))
    })?;
    if threads == 0 {
        return Err(PyValueError::new_err("gguf_matmul: threads must be at least 1"));
    }
    let xb = flat::<f32>(x, "x", "float32")?;
    let wb = flat::<u8>(w, "w", "uint8")?;
    let ob = flat::<f32>(out, "out", "float32")?;
    if ob.readonly() {
        return Err(PyValueError::new_err("gguf_matmul: out is read-only"));
    }
    let out_span = span(&ob);
    for (name, other) in [("x", span(&xb)), ("w", span(&wb))] {
        if other.start < out_span.end && out_span.start < other.end {
            return Err(PyValueError::new_err(format!("gguf_matmul: out overlaps {name}")));
        }
    }
    if k == 0 || xb.item_count() % k != 0 {
        return Err(PyValueError::new_err(format!(
            "gguf_matmul: x has {} elements, not a whole number of rows of k = {k}",
            xb.item_count()
        )));
    }
    let dims = Dims { m: xb.item_count() / k, n, k };
    vllm_rs_kernels::check_shapes(quant, xb.item_count(), wb.item_count(), ob.item_count(), dims)
        .map_err(|e| PyValueError::new_err(format!("gguf_matmul: {e}")))?;
    if dims.m == 0 || n == 0 {
        return Ok(()); // nothing to compute; an empty buffer's pointer may be null
    }
    // SAFETY: the buffers are C-contiguous, non-empty (checked: m, n, k > 0)
    // and stay exported (held) until the end of this call; out overlaps
    // neither input, and the lengths are the buffers' own. A Python thread
    // writing into them meanwhile races, as with any GIL-releasing numpy
    // operation.
    let (xs, ws, os) = unsafe {
        (
            std::slice::from_raw_parts(xb.buf_ptr() as *const f32, xb.item_count()),
            std::slice::from_raw_parts(wb.buf_ptr() as *const u8, wb.item_count()),
            std::slice::from_raw_parts_mut(ob.buf_ptr() as *mut f32, ob.item_count()),
        )
    };
    py.detach(|| matmul(Path::best(), quant, xs, ws, os, dims, threads))
        .map_err(|e| PyValueError::new_err(format!("gguf_matmul: {e}")))
}

/// Adds the kernel functions to `vllm_rs._core`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gguf_matmul, m)?)
}
