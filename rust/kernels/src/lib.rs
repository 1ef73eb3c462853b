//! `y[M,N] = x[M,K] · W[N,K]^T` where `x` is float32 and `W` is N rows of raw
//! GGUF blocks (the legacy Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL; the
//! K-quants Q2_K to Q6_K and IQ4_XS; F16 and BF16 as stored), read in place:
//! each weight is dequantized exactly as ggml (and the `gguf` Python package)
//! dequantize it,
//! then multiplied with float32 activations and accumulated in float32, so the
//! result equals "dequantize to float32, then multiply" up to summation order.
//! An AVX-512 path, else an AVX2+FMA+F16C one, is chosen at run time; the
//! portable scalar path serves every other CPU and is the tests' reference.
//! N is split across threads. Why a kernel of our own: torch's weight-only
//! int8/int4 kernels ran 10-20x slower than float32 on these CPUs, and held
//! this way the packaged SmolLM2 decodes 1.7x faster at batch 1 than as
//! fp16 packs, which read 4x the bytes (`bench/bench_quantization.py`;
//! docs/real-model-speed.md, "The matmul kernel").
//!
//! Opt-in beside it, `Precision::Int8Activations`: for Q8_0, Q4_0, Q4_1,
//! Q5_0, Q4_K, Q5_K and Q6_K weights the activations quantized to int8 once per call (`q8.rs`)
//! and integer dot products per block (`int8.rs`, its AVX2 code
//! `int8_x86.rs`), llama.cpp's arithmetic, within a stated bound of the
//! exact result.
//!
//! Beside it, `decode_attention`: one query per sequence attending over its
//! keys and values where they lie in a paged KV cache (`attention.rs`); and
//! `Decoder`: a whole Llama-family decoder step (norms, RoPE, attention,
//! MLP, the output head) over those kernels, with no interpreter between
//! its layers (`decoder.rs`).

mod attention;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod decoder;
mod experts;
mod int8;
#[cfg(target_arch = "x86_64")]
mod int8_vnni;
#[cfg(target_arch = "x86_64")]
mod int8_x86;
mod kv_cache;
mod linear;
#[cfg(target_arch = "x86_64")]
mod operands;
#[cfg(target_arch = "x86_64")]
mod packed;
#[cfg(target_arch = "x86_64")]
mod panel;
mod pool;
mod q8;
mod quant;
mod rows;
mod scalar;
mod step_error;
#[cfg(target_arch = "x86_64")]
mod super_blocks;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use attention::{check_attention, decode_attention, AttentionDims, AttentionError, DecodeInputs};
pub use decoder::{Decoder, GroupSlots, Layer, LayerCache, Mlp, Shape, StepInputs};
pub use experts::{Expert, Experts};
pub use int8::{int8_runs, INT8_FEW_ROWS};
#[cfg(target_arch = "x86_64")]
pub use packed::Packed;

/// Weights repacked for the int8 path exist only on x86-64 (AVX-512 VNNI):
/// elsewhere the type has no value, and every `Option<&Packed>` is `None`.
#[cfg(not(target_arch = "x86_64"))]
#[derive(Debug)]
pub enum Packed {}
pub use kv_cache::{f32_to_bf16, f32_to_f16, KvCache, KvCacheMut};
pub use linear::{Activation, Linear};
pub use quant::{dequantize_row, f16_to_f32 as dequantize_f16, QuantType, BLOCK, SUPER_BLOCK};
pub use step_error::StepError;

/// A call whose buffers do not match the shapes it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// K is not a positive multiple of the type's block size.
    #[error("k = {k} is not a positive multiple of {block} (the {name} block size)")]
    K {
        /// The K asked for.
        k: usize,
        /// Weights per block of the type.
        block: usize,
        /// The type's name.
        name: &'static str,
    },
    /// A buffer's length is not what the shapes need.
    #[error("{what} has {got} {unit}, m = {m}, n = {n}, k = {k} need {need}")]
    Len {
        /// Which buffer: "x", "w" or "y".
        what: &'static str,
        /// What it holds.
        got: usize,
        /// What the shapes need.
        need: usize,
        /// "elements" or "bytes".
        unit: &'static str,
        /// The shapes.
        m: usize,
        /// The shapes.
        n: usize,
        /// The shapes.
        k: usize,
    },
}

/// The shapes of a call: `x` is `m x k`, `W` is `n x k`, `y` is `m x n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Activation rows (tokens).
    pub m: usize,
    /// Weight rows (output features).
    pub n: usize,
    /// Input features, a multiple of the type's block (32 or 256 weights).
    pub k: usize,
}

/// Which implementation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Portable Rust, one weight at a time.
    Scalar,
    /// AVX2, FMA and F16C (x86-64).
    Avx2,
    /// AVX-512F and VL beside the AVX2 path's features (x86-64); decode
    /// attention and single-row matmuls run the AVX2 path's code.
    Avx512,
}

impl Path {
    /// The fastest path this CPU supports.
    pub fn best() -> Path {
        *Path::supported().last().expect("the scalar path runs everywhere")
    }

    /// Every path this CPU runs, slowest (scalar) first.
    pub fn supported() -> Vec<Path> {
        let mut paths = vec![Path::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if x86::supported() {
                paths.push(Path::Avx2);
            }
            if avx512::supported() {
                paths.push(Path::Avx512);
            }
        }
        paths
    }
}

/// How a call multiplies: the float path, or int8 activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Weights dequantized to their exact float32 values, multiplied with
    /// the float32 activations: "dequantize, then multiply" up to float32
    /// summation order.
    #[default]
    Exact,
    /// For Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K and Q6_K weights (every
    /// other type runs `Exact`): each activation row quantized once per call to int8 in
    /// blocks of the weight type's block (32, or 256 for the K-quants),
    /// `q = round(x / d)`, `d = max|x| / 127` over the block, then integer
    /// dot products per block with the weight quants and the scales applied
    /// per block, in float32 (llama.cpp's `vec_dot_*_q8_*` arithmetic).
    /// Each activation moves by at most `d / 2`, so an output differs from
    /// the exact one by at most `sum over blocks b of max|x_b| / 254 *
    /// sum |w_b|` (plus float32 summation error): about 0.4% of `sum |x|
    /// |w|` where a block's activations are of one magnitude, more where
    /// one outlier sets a block's scale. It runs in the calls whose row
    /// count `int8_runs` names, where it is faster than the exact path:
    /// decode's few rows (`int8_x86.rs`) and, on a CPU with AVX-512 VNNI,
    /// calls of many rows, prefill's among them (`int8_vnni.rs`); the
    /// calls in between multiply exactly. Within each of the two codes an
    /// output does not depend on the batch's other rows; between them it
    /// moves by float32 summation order.
    Int8Activations,
}

/// Checks that `x` is `m x k`, `w` is `n` rows of `k / block_elems` blocks
/// of `quant` and `y` is `m x n`.
pub fn check_shapes(quant: QuantType, x: usize, w: usize, y: usize, dims: Dims) -> Result<(), ShapeError> {
    let Dims { m, n, k } = dims;
    let block = quant.block_elems();
    if k == 0 || !k.is_multiple_of(block) {
        return Err(ShapeError::K { k, block, name: quant.name() });
    }
    let len = |what, got, need, unit| {
        if got == need {
            Ok(())
        } else {
            Err(ShapeError::Len { what, got, need, unit, m, n, k })
        }
    };
    len("x", x, m * k, "elements")?;
    len("w", w, n * quant.row_bytes(k), "bytes")?;
    len("y", y, m * n, "elements")
}

/// `y = x · W^T` on `path` (which must be supported: `Path::best()` is the
/// fastest this CPU runs) at `precision`, N split across `threads` (at
/// least 1).
// The operands of one product beside `matmuls`' three settings.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    path: Path,
    precision: Precision,
    quant: QuantType,
    x: &[f32],
    w: &[u8],
    y: &mut [f32],
    dims: Dims,
    threads: usize,
) -> Result<(), ShapeError> {
    matmuls(path, precision, &mut [Matmul { quant, x, w, y, dims, packed: None }], threads)
}

/// One product of a `matmuls` call: `y = x · W^T`.
pub struct Matmul<'a, 'y> {
    /// The type of `w`'s blocks.
    pub quant: QuantType,
    /// The activations, `m x k`.
    pub x: &'a [f32],
    /// The weights, `n` rows of blocks.
    pub w: &'a [u8],
    /// The result, `m x n`.
    pub y: &'y mut [f32],
    /// The shapes.
    pub dims: Dims,
    /// `w` repacked (`Packed::new`), read instead of `w` where the product
    /// multiplies at int8 (`packed_runs`).
    pub packed: Option<&'a Packed>,
}

/// Several independent products in one call of the pool (the Q, K and V
/// projections of a layer; its gate and up projections), so the threads
/// meet once for all of them, not once each: each product's N is cut into
/// parts and the threads take the parts of every product. Each is checked
/// as `matmul` checks it, before any is computed; at `Int8Activations`,
/// each product's activations are quantized once, before the threads meet.
pub fn matmuls(
    path: Path,
    precision: Precision,
    calls: &mut [Matmul<'_, '_>],
    threads: usize,
) -> Result<(), ShapeError> {
    for call in calls.iter() {
        check_shapes(call.quant, call.x.len(), call.w.len(), call.y.len(), call.dims)?;
    }
    fn packed<'a>(c: &Matmul<'a, '_>, path: Path, precision: Precision) -> Option<&'a Packed> {
        #[cfg(target_arch = "x86_64")]
        return c.packed.filter(|p| {
            precision == Precision::Int8Activations
                && path == Path::Avx512
                && p.fits(c.quant, c.dims.n, c.dims.k)
                && packed::reads_at(c.quant, c.dims.m)
        });
        #[cfg(not(target_arch = "x86_64"))]
        return c.packed.filter(|_| precision == Precision::Int8Activations && path == Path::Avx512);
    }
    let quantized: Vec<Option<q8::Q8Rows>> = calls
        .iter()
        .map(|c| {
            let on_packed = packed(c, path, precision).is_some();
            let int8 = precision == Precision::Int8Activations
                && int8::reads(c.quant)
                && (on_packed || int8_runs(path, c.dims.m));
            let panels = on_packed || int8::runs_panels(path, c.dims.m);
            int8.then(|| q8::Q8Rows::quantize(c.x, c.quant.block_elems(), panels))
        })
        .collect();
    let jobs: Vec<Job<'_>> = calls
        .iter_mut()
        .zip(&quantized)
        .map(|(c, x8)| {
            let packed = packed(c, path, precision);
            Job { quant: c.quant, x: c.x, x8: x8.as_ref(), w: c.w, y: Out(c.y.as_mut_ptr()), dims: c.dims, packed }
        })
        .collect();
    let parts: Vec<(usize, std::ops::Range<usize>)> = jobs
        .iter()
        .enumerate()
        .filter(|(_, job)| job.dims.m > 0)
        .flat_map(|(i, job)| {
            // A packed product's parts are whole pairs of its blocks of 16 columns.
            let align = if job.packed.is_some() { 32 } else { 8 };
            split(job.dims.n, parts_for(threads), align).into_iter().map(move |cols| (i, cols))
        })
        .collect();
    let run = |(i, cols): &(usize, std::ops::Range<usize>)| {
        let job = &jobs[*i];
        // SAFETY: the shapes were checked above; the column ranges of one
        // product are disjoint and each product has its own y, so no two
        // parts write one element.
        unsafe {
            #[cfg(target_arch = "x86_64")]
            if let (Some(x8), Some(p)) = (job.x8, job.packed) {
                return packed::matmul(job, x8, p, cols.clone());
            }
            if let Some(x8) = job.x8 {
                return int8::matmul(path, job, x8, cols.clone());
            }
            match path {
                Path::Scalar => scalar::matmul(job, cols.clone()),
                #[cfg(target_arch = "x86_64")]
                Path::Avx2 => {
                    assert!(x86::supported(), "the AVX2 path needs AVX2, FMA and F16C");
                    x86::matmul(job, cols.clone())
                }
                #[cfg(target_arch = "x86_64")]
                Path::Avx512 => {
                    assert!(avx512::supported(), "the AVX-512 path needs AVX-512F and VL, AVX2, FMA and F16C");
                    avx512::matmul(job, cols.clone())
                }
                #[cfg(not(target_arch = "x86_64"))]
                Path::Avx2 | Path::Avx512 => panic!("the SIMD paths need an x86-64 CPU"),
            }
        }
    };
    pool::run(parts.len(), threads, &|p| run(&parts[p]));
    Ok(())
}

/// Parts of a call the pool's threads take one at a time: a few per thread,
/// so that a thread held up (preempted, or woken late) delays the call by
/// one small part; one for a single thread, which would only pay for the cuts.
pub(crate) fn parts_for(threads: usize) -> usize {
    if threads > 1 {
        (threads * PARTS_PER_THREAD).min(pool::MAX_PARTS)
    } else {
        1
    }
}

/// See `parts_for`. 4 took 4-6% off a batch-16 decode step beside a noisy
/// neighbour against 1 (the layout of fixed halves), and 2 gained less; quiet,
/// and at batch 1, the count made no difference (one engine, the count
/// switched step by step: docs/real-model-speed.md, "Parts taken, not given").
const PARTS_PER_THREAD: usize = 4;

/// One checked call, as each thread's part of it sees it.
pub(crate) struct Job<'a> {
    pub(crate) quant: QuantType,
    pub(crate) x: &'a [f32],
    /// `x` quantized, where the call runs the int8 path.
    pub(crate) x8: Option<&'a q8::Q8Rows>,
    pub(crate) w: &'a [u8],
    pub(crate) y: Out,
    pub(crate) dims: Dims,
    /// `w` repacked, where the call multiplies at int8 on it.
    pub(crate) packed: Option<&'a Packed>,
}

/// `y`'s base pointer, shared by the threads that write disjoint columns.
#[derive(Clone, Copy)]
pub(crate) struct Out(pub(crate) *mut f32);
// SAFETY: every thread writes only its own columns (see `matmul`).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// `0..n` cut into at most `parts` ranges of whole groups of `align`
/// columns (so each thread's tiles are full), the last one taking the
/// remainder.
fn split(n: usize, parts: usize, align: usize) -> Vec<std::ops::Range<usize>> {
    let groups = n.div_ceil(align);
    let parts = parts.min(groups).max(1);
    (0..parts)
        .map(|p| (groups * p / parts * align).min(n)..(groups * (p + 1) / parts * align).min(n))
        .filter(|r| !r.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_every_column_once() {
        for n in [1, 7, 8, 9, 64, 1000] {
            for parts in 1..5 {
                let ranges = split(n, parts, 8);
                assert!(ranges.len() <= parts);
                assert_eq!(ranges.first().unwrap().start, 0);
                assert_eq!(ranges.last().unwrap().end, n);
                for pair in ranges.windows(2) {
                    assert_eq!(pair[0].end, pair[1].start);
                    assert_eq!(pair[0].end % 8, 0);
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_named() {
        let q = QuantType::Q8_0;
        let dims = |m, n, k| Dims { m, n, k };
        assert_eq!(check_shapes(q, 0, 0, 0, dims(1, 1, 30)), Err(ShapeError::K { k: 30, block: 32, name: "Q8_0" }));
        let err = check_shapes(QuantType::Q4K, 0, 0, 0, dims(1, 1, 576)).unwrap_err();
        assert_eq!(err.to_string(), "k = 576 is not a positive multiple of 256 (the Q4_K block size)");
        let err = check_shapes(q, 32, 33, 1, dims(1, 1, 32)).unwrap_err();
        assert_eq!(err.to_string(), "w has 33 bytes, m = 1, n = 1, k = 32 need 34");
        assert!(check_shapes(q, 64, 68, 4, dims(2, 2, 32)).is_ok());
        assert!(matches!(check_shapes(q, 64, 68, 3, dims(2, 2, 32)), Err(ShapeError::Len { what: "y", .. })));
    }
}
