//! `vllm_rs._core.gguf_matmul`, `vllm_rs._core.gguf_dequantize` and
//! `vllm_rs._core.paged_decode_attention`:
//! the `vllm-rs-kernels` kernels over Python buffers (numpy arrays, or torch
//! CPU tensors through `.numpy()`), without copying them; the GIL is released
//! while they compute.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use vllm_rs_kernels::{
    decode_attention, dequantize_row, matmul, AttentionDims, DecodeInputs, Dims, KvCache, Path, Precision, QuantType,
};

/// A buffer `func` can read as a flat C-contiguous array, or the
/// `TypeError`/`ValueError` naming the argument.
pub(crate) fn flat_for<T: pyo3::buffer::Element>(
    func: &str,
    obj: &Bound<'_, PyAny>,
    name: &str,
    dtype: &str,
) -> PyResult<PyBuffer<T>> {
    let buf = PyBuffer::<T>::get(obj)
        .map_err(|e| PyTypeError::new_err(format!("{func}: {name} must be a buffer of {dtype} ({e})")))?;
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("{func}: {name} must be C-contiguous")));
    }
    Ok(buf)
}

fn flat<T: pyo3::buffer::Element>(obj: &Bound<'_, PyAny>, name: &str, dtype: &str) -> PyResult<PyBuffer<T>> {
    flat_for("gguf_matmul", obj, name, dtype)
}

/// A buffer's elements as a slice (empty for an empty buffer, whose pointer
/// may be null).
///
/// # Safety
/// The buffer stays exported while the slice is used, and nothing writes it
/// meanwhile (as with any GIL-releasing numpy operation, a Python thread
/// writing into it races).
pub(crate) unsafe fn slice<T: pyo3::buffer::Element>(buf: &PyBuffer<T>) -> &[T] {
    if buf.item_count() == 0 {
        return &[];
    }
    // SAFETY: the caller's promise; the buffer is C-contiguous (`flat_for`).
    unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const T, buf.item_count()) }
}

/// `buf`'s elements as a mutable slice (empty for an empty buffer).
///
/// # Safety
/// As [`slice`], and no other slice of the buffer is alive meanwhile.
#[allow(clippy::mut_from_ref)] // the buffer is Python's memory, not `buf`'s
pub(crate) unsafe fn slice_mut<T: pyo3::buffer::Element>(buf: &PyBuffer<T>) -> &mut [T] {
    if buf.item_count() == 0 {
        return &mut [];
    }
    // SAFETY: the caller's promise; the buffer is C-contiguous (`flat_for`).
    unsafe { std::slice::from_raw_parts_mut(buf.buf_ptr() as *mut T, buf.item_count()) }
}

pub(crate) fn span<T: pyo3::buffer::Element>(buf: &PyBuffer<T>) -> std::ops::Range<usize> {
    let start = buf.buf_ptr() as usize;
    start..start + buf.len_bytes()
}

/// Whether `func` may write `out` while it reads the `inputs` (name and
/// byte span each): `out` writable and sharing no byte with any of them;
/// else the `ValueError` naming what is wrong.
pub(crate) fn check_out<T: pyo3::buffer::Element>(
    func: &str,
    out: &PyBuffer<T>,
    inputs: &[(&str, std::ops::Range<usize>)],
) -> PyResult<()> {
    if out.readonly() {
        return Err(PyValueError::new_err(format!("{func}: out is read-only")));
    }
    let out_span = span(out);
    match inputs.iter().find(|(_, other)| other.start < out_span.end && out_span.start < other.end) {
        Some((name, _)) => Err(PyValueError::new_err(format!("{func}: out overlaps {name}"))),
        None => Ok(()),
    }
}

/// The kernel's type of ggml type id `id`, or the `ValueError` of `func`
/// naming the ids it reads.
pub(crate) fn quant_type_for(func: &str, id: u32) -> PyResult<QuantType> {
    QuantType::from_ggml(id).ok_or_else(|| {
        let known: Vec<String> = QuantType::ALL.iter().map(|q| format!("{} ({})", q.name(), q.ggml_id())).collect();
        PyValueError::new_err(format!("{func}: quant_type {id} is not one the kernel reads: {}", known.join(", ")))
    })
}

/// `out[M,N] = x[M,K] · W[N,K]^T` where `x` and `out` are C-contiguous
/// float32 buffers, `w` is N rows of raw GGUF blocks of `quant_type` (a ggml
/// type id: any of the kernel's types, legacy, K-quant, IQ4_NL/XS, F16,
/// BF16) as a uint8 buffer, N split across `threads` threads. Raises
/// TypeError for a buffer of the wrong type, ValueError for a bad shape,
/// type, thread count, a read-only or overlapping `out`.
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
    let quant = quant_type_for("gguf_matmul", quant_type)?;
    if threads == 0 {
        return Err(PyValueError::new_err("gguf_matmul: threads must be at least 1"));
    }
    let xb = flat::<f32>(x, "x", "float32")?;
    let wb = flat::<u8>(w, "w", "uint8")?;
    let ob = flat::<f32>(out, "out", "float32")?;
    check_out("gguf_matmul", &ob, &[("x", span(&xb)), ("w", span(&wb))])?;
    if k == 0 || xb.item_count() % k != 0 {
        return Err(PyValueError::new_err(format!(
            "gguf_matmul: x has {} elements, not a whole number of rows of k = {k}",
            xb.item_count()
        )));
    }
    let dims = Dims { m: xb.item_count() / k, n, k };
    vllm_rs_kernels::check_shapes(quant, xb.item_count(), wb.item_count(), ob.item_count(), dims)
        .map_err(|e| PyValueError::new_err(format!("gguf_matmul: {e}")))?;
    // SAFETY: the buffers stay exported (held) until the end of this call
    // and out overlaps neither input (checked above).
    let (xs, ws, os) = unsafe { (slice(&xb), slice(&wb), slice_mut(&ob)) };
    py.detach(|| matmul(Path::best(), Precision::Exact, quant, xs, ws, os, dims, threads))
        .map_err(|e| PyValueError::new_err(format!("gguf_matmul: {e}")))
}

/// `out` (C-contiguous float32) = the weights of `rows` (C-contiguous uint8,
/// whole blocks of `quant_type`, a ggml type id the kernel reads), each
/// exactly as the `gguf` package dequantizes it; the GIL is released.
/// Raises TypeError for a buffer of the wrong type, ValueError for an
/// unknown type, a partial block, an `out` of the wrong size, read-only or
/// overlapping `rows`.
#[pyfunction]
#[pyo3(signature = (rows, out, quant_type))]
fn gguf_dequantize(py: Python<'_>, rows: &Bound<'_, PyAny>, out: &Bound<'_, PyAny>, quant_type: u32) -> PyResult<()> {
    const NAME: &str = "gguf_dequantize";
    let quant = quant_type_for(NAME, quant_type)?;
    let rb = flat_for::<u8>(NAME, rows, "rows", "uint8")?;
    let ob = flat_for::<f32>(NAME, out, "out", "float32")?;
    check_out(NAME, &ob, &[("rows", span(&rb))])?;
    let (bytes, elems) = (quant.block_bytes(), quant.block_elems());
    if rb.item_count() % bytes != 0 {
        return Err(PyValueError::new_err(format!(
            "{NAME}: rows has {} bytes, not whole {}-byte blocks of {}",
            rb.item_count(),
            bytes,
            quant.name()
        )));
    }
    let need = rb.item_count() / bytes * elems;
    if ob.item_count() != need {
        return Err(PyValueError::new_err(format!("{NAME}: out has {} elements, rows hold {need}", ob.item_count())));
    }
    // SAFETY: the buffers stay exported until the end of this call and out
    // overlaps rows nowhere (checked above).
    let (rs, os) = unsafe { (slice(&rb), slice_mut(&ob)) };
    py.detach(|| dequantize_row(quant, rs, os));
    Ok(())
}

/// Decode attention over a paged KV cache read in place: for each sequence
/// `s`, the query heads of row `rows[s]` of `q` (`[tokens, heads, head_dim]`
/// float32) attend over the keys and values at its first `lens[s]` slots of
/// `key_slots` (`[seqs, max_keys]` int64) in the caches (`[slots, kv_heads,
/// head_dim]` float32; `heads` a multiple of `kv_heads`), scores scaled by
/// `scale`; the result goes to the same row of `out` (shaped as `q`; other
/// rows untouched). `rows` (int64) must be strictly increasing. Sequences
/// are split across `threads` threads. Raises TypeError for a buffer of the
/// wrong type, ValueError for a bad shape, row, key count or slot, a
/// read-only or overlapping `out`.
#[pyfunction]
#[pyo3(signature = (q, key_cache, value_cache, rows, key_slots, lens, out, heads, kv_heads, head_dim, scale, threads))]
#[allow(clippy::too_many_arguments)] // the Python signature: buffers, shapes and threads
fn paged_decode_attention(
    py: Python<'_>,
    q: &Bound<'_, PyAny>,
    key_cache: &Bound<'_, PyAny>,
    value_cache: &Bound<'_, PyAny>,
    rows: &Bound<'_, PyAny>,
    key_slots: &Bound<'_, PyAny>,
    lens: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
    threads: usize,
) -> PyResult<()> {
    const NAME: &str = "paged_decode_attention";
    let err = |msg: String| PyValueError::new_err(format!("{NAME}: {msg}"));
    if threads == 0 {
        return Err(err("threads must be at least 1".into()));
    }
    let floats = |obj, name| flat_for::<f32>(NAME, obj, name, "float32");
    let ints = |obj, name| flat_for::<i64>(NAME, obj, name, "int64");
    let (qb, kb, vb, ob) =
        (floats(q, "q")?, floats(key_cache, "key_cache")?, floats(value_cache, "value_cache")?, floats(out, "out")?);
    let (rb, sb, lb) = (ints(rows, "rows")?, ints(key_slots, "key_slots")?, ints(lens, "lens")?);
    let inputs = [
        ("q", span(&qb)),
        ("key_cache", span(&kb)),
        ("value_cache", span(&vb)),
        ("rows", span(&rb)),
        ("key_slots", span(&sb)),
        ("lens", span(&lb)),
    ];
    check_out(NAME, &ob, &inputs)?;
    let head = heads * head_dim;
    let kv_head = kv_heads * head_dim;
    if head == 0 || kv_head == 0 {
        return Err(err(format!("heads = {heads}, kv_heads = {kv_heads} and head_dim = {head_dim} must be positive")));
    }
    let seqs = rb.item_count();
    if seqs == 0 {
        return Ok(());
    }
    let whole = |what: &str, count: usize, unit: usize| {
        if count.is_multiple_of(unit) {
            Ok(count / unit)
        } else {
            Err(err(format!("{what} has {count} elements, not a whole number of rows of {unit}")))
        }
    };
    let dims = AttentionDims {
        tokens: whole("q", qb.item_count(), head)?,
        heads,
        kv_heads,
        head_dim,
        slots: whole("key_cache", kb.item_count(), kv_head)?,
        seqs,
        max_keys: whole("key_slots", sb.item_count(), seqs)?,
    };
    // SAFETY: the buffers stay exported until the end of this call and out
    // overlaps none of the inputs (checked above).
    let (qs, ks, vs, rs, ss, ls, os) =
        unsafe { (slice(&qb), slice(&kb), slice(&vb), slice(&rb), slice(&sb), slice(&lb), slice_mut(&ob)) };
    // Sequence s's keys are row s of the padded `key_slots`.
    let key_starts: Vec<i64> = (0..seqs).map(|s| (s * dims.max_keys) as i64).collect();
    let inputs = DecodeInputs {
        q: qs,
        key_cache: KvCache::F32(ks),
        value_cache: KvCache::F32(vs),
        rows: rs,
        key_slots: ss,
        key_starts: &key_starts,
        lens: ls,
        scale,
    };
    py.detach(|| decode_attention(Path::best(), &inputs, os, dims, threads)).map_err(|e| err(e.to_string()))
}

/// Whether a `DecoderStack` built at `precision="int8"` multiplies a
/// product of `rows` activation rows at int8 on this CPU (the rest multiply
/// exactly): every product where the CPU has AVX-512 VNNI (the stack
/// repacks its weights for it), else decode's one or two rows.
#[pyfunction]
fn int8_runs(rows: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if vllm_rs_kernels::Packed::supported() && Path::best() == Path::Avx512 {
        return true;
    }
    vllm_rs_kernels::int8_runs(Path::best(), rows)
}

/// Adds the kernel functions to `vllm_rs._core`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(int8_runs, m)?)?;
    m.add_function(wrap_pyfunction!(gguf_matmul, m)?)?;
    m.add_function(wrap_pyfunction!(gguf_dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(paged_decode_attention, m)?)
}
