//! The int8 path (`Precision::Int8Activations`): the activation rows
//! quantized once per call (`Q8Rows`), then each weight block's quants
//! multiplied with the activation quants in integers, exactly, and the
//! block's scales (weight's and activation's) applied to that integer sum
//! in float32, as llama.cpp's `ggml_vec_dot_*_q8_*` do. Every output is
//! summed on its own, in block order, so it does not depend on the other
//! rows of the batch. This file holds the portable reference of that
//! arithmetic (every CPU runs it; the tests take it as the reference of the
//! AVX2 code, `int8_x86.rs`) and picks the path.

use crate::q8::Q8Rows;
use crate::quant::{f16_to_f32, scale_min_k4, QuantType};
use crate::{Dims, Job, Path};

/// Whether the int8 path reads weights of `quant` (other types run the
/// exact path whatever the precision asked for).
pub(crate) fn reads(quant: QuantType) -> bool {
    matches!(
        quant,
        QuantType::Q8_0
            | QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q5_0
            | QuantType::Q4K
            | QuantType::Q5K
            | QuantType::Q6K
    )
}

/// The most activation rows of a call that `int8_x86.rs` multiplies at
/// `Precision::Int8Activations`: it unpacks a weight row for every 4
/// activation rows, and the exact path's panels overtake it beyond. On the
/// 2-core AMD EPYC with AVX-512 (one thread, 2048 x 2048): at 1 row it took
/// 0.35x (Q4_K) to 0.66x (Q8_0) of the exact time, at 2 rows 0.49x (Q4_K)
/// to 1.06x (Q4_0), at 4 rows 0.82x (Q4_K) to 1.28x (Q4_0), at 16 rows
/// 1.26-1.56x.
pub const INT8_FEW_ROWS: usize = 2;

/// Whether a call of `m` activation rows on `path` multiplies at int8 when
/// `Precision::Int8Activations` asks for it (for the types the int8 path
/// reads): at most `INT8_FEW_ROWS` rows, or enough rows for `int8_vnni.rs`'s
/// panels on a CPU that runs them; in between the exact path is faster.
pub fn int8_runs(path: Path, m: usize) -> bool {
    m <= INT8_FEW_ROWS || runs_panels(path, m)
}

/// Whether a call of `m` activation rows on `path` runs `int8_vnni.rs`'s
/// panels (its rows then quantized `for_panels`): on the AVX-512 path of a
/// CPU with VNNI, from `int8_vnni::MIN_ROWS` rows on.
pub(crate) fn runs_panels(path: Path, m: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        path == Path::Avx512 && m >= crate::int8_vnni::MIN_ROWS && crate::int8_vnni::supported()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (path, m);
        false
    }
}

/// Columns `cols` of `y = x · W^T` with `x` as `x8`, on `path`.
///
/// # Safety
/// As `scalar::matmul`; `x8` is the job's `x` quantized in blocks of the
/// type's `block_elems`, the type is one the path `reads`, and the CPU runs
/// `path`.
pub(crate) unsafe fn matmul(path: Path, job: &Job<'_>, x8: &Q8Rows, cols: std::ops::Range<usize>) {
    match path {
        Path::Scalar => {
            let Dims { m, n, k } = job.dims;
            let row_bytes = job.quant.row_bytes(k);
            for j in cols {
                let w = &job.w[j * row_bytes..(j + 1) * row_bytes];
                for i in 0..m {
                    // SAFETY: i < m and j < n, and column j is this thread's.
                    unsafe { *job.y.0.add(i * n + j) = row_dot(job.quant, w, x8, i, k) };
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 if !x8.biased.is_empty() => {
            assert!(crate::int8_vnni::supported(), "the int8 panels need AVX-512 VNNI");
            // SAFETY: forwarded; the rows were quantized for the panels.
            unsafe { crate::int8_vnni::matmul(job, x8, cols) }
        }
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 | Path::Avx512 => {
            assert!(crate::x86::supported(), "the int8 path's SIMD code needs AVX2, FMA and F16C");
            // SAFETY: forwarded; an AVX-512 CPU of this crate has AVX2.
            unsafe { crate::int8_x86::matmul(job, x8, cols) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Path::Avx2 | Path::Avx512 => panic!("the SIMD paths need an x86-64 CPU"),
    }
}

/// Weight row `w` times activation row `i` of `x8` (rows of `k`): each
/// block's float32 result added in block order.
pub(crate) fn row_dot(quant: QuantType, w: &[u8], x8: &Q8Rows, i: usize, k: usize) -> f32 {
    let elems = quant.block_elems();
    let blocks = k / elems;
    let qs = &x8.qs[i * k..(i + 1) * k];
    let mut acc = 0.0f32;
    for b in 0..blocks {
        let block = &w[b * quant.block_bytes()..(b + 1) * quant.block_bytes()];
        let q = &qs[b * elems..(b + 1) * elems];
        let dx = x8.d[i * blocks + b];
        let sums = &x8.sums[(i * k + b * elems) / 32..(i * k + (b + 1) * elems) / 32];
        acc += block_dot(quant, block, q, dx, sums);
    }
    acc
}

/// One weight block times its activation block (quants `q`, scale `dx`,
/// sums of each 32 quants `sums`): integer sums, then the scales.
fn block_dot(quant: QuantType, block: &[u8], q: &[i8], dx: f32, sums: &[i16]) -> f32 {
    let half = |at: usize| f16_to_f32(u16::from_le_bytes([block[at], block[at + 1]]));
    let dot = |w: &mut dyn Iterator<Item = i32>, q: &[i8]| -> i32 { w.zip(q).map(|(w, &q)| w * i32::from(q)).sum() };
    match quant {
        QuantType::Q8_0 => {
            let sumi = dot(&mut block[2..34].iter().map(|&b| i32::from(b as i8)), q);
            half(0) * dx * sumi as f32
        }
        QuantType::Q4_0 => {
            // Low nibbles are weights 0..16, high ones 16..32.
            let nibbles = block[2..18]
                .iter()
                .map(|&b| i32::from(b & 0x0f))
                .chain(block[2..18].iter().map(|&b| i32::from(b >> 4)));
            let sumi = dot(&mut nibbles.map(|v| v - 8), q);
            half(0) * dx * sumi as f32
        }
        QuantType::Q4_1 => {
            // w = q d + m: the minimum multiplies the sum of the activations.
            let nibbles = block[4..20]
                .iter()
                .map(|&b| i32::from(b & 0x0f))
                .chain(block[4..20].iter().map(|&b| i32::from(b >> 4)));
            let sumi = dot(&mut nibbles.into_iter(), q);
            half(0) * dx * sumi as f32 + half(2) * dx * f32::from(sums[0])
        }
        QuantType::Q5_0 => {
            // The fifth bit of weight e is bit e of the 32 bits at 2.
            let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            let low = (0..32).map(|e| i32::from((block[6 + e % 16] >> (4 * (e / 16))) & 0x0f));
            let sumi = dot(&mut low.enumerate().map(|(e, v)| (v | (((qh >> e) & 1) << 4) as i32) - 16), q);
            half(0) * dx * sumi as f32
        }
        QuantType::Q4K | QuantType::Q5K => {
            // Sub-blocks of 32: 2s and 2s + 1 share 32 bytes, low and high
            // nibbles; Q5_K's fifth bit of sub-block s is bit s of byte 16 + l.
            let five = quant == QuantType::Q5K;
            let qs = if five { 48 } else { 16 };
            let (mut sumi, mut summ) = (0i32, 0i32);
            for s in 0..8 {
                let (sc, m) = scale_min_k4(&block[4..16], s);
                let bytes = &block[qs + (s / 2) * 32..qs + (s / 2) * 32 + 32];
                let value = |l: usize, b: u8| {
                    let high = if five { ((block[16 + l] >> s) & 1) << 4 } else { 0 };
                    i32::from(((b >> (4 * (s % 2))) & 0x0f) | high)
                };
                let sub = dot(&mut bytes.iter().enumerate().map(|(l, &b)| value(l, b)), &q[s * 32..s * 32 + 32]);
                sumi += i32::from(sc) * sub;
                summ += i32::from(m) * i32::from(sums[s]);
            }
            half(0) * dx * sumi as f32 - half(2) * dx * summ as f32
        }
        QuantType::Q6K => {
            let mut sumi = 0i32;
            for e16 in 0..16 {
                let six = (e16 * 16..e16 * 16 + 16).map(|e| {
                    let (group, t, l) = (e / 128, (e / 32) % 4, e % 32);
                    let low = (block[group * 64 + (t % 2) * 32 + l] >> (4 * (t / 2))) & 0x0f;
                    let high = (block[128 + group * 32 + l] >> (2 * t)) & 3;
                    i32::from(low | (high << 4)) - 32
                });
                let sub = dot(&mut six.into_iter(), &q[e16 * 16..e16 * 16 + 16]);
                sumi += i32::from(block[192 + e16] as i8) * sub;
            }
            half(208) * dx * sumi as f32
        }
        _ => unreachable!("the int8 path reads only the types `reads` names"),
    }
}
