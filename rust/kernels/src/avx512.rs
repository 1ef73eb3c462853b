//! The AVX-512 path (x86-64 with AVX-512F and VL beside the AVX2 path's
//! features): the panel loop the AVX2 path runs (`panel.rs`) with vectors
//! of 16 floats and 32 registers, from two activation rows on; one row runs the AVX2
//! path's register tile. Q8_0, Q4_0 and Q4_1 blocks decode 16 weights at a
//! time; the other types decode into the panel with the AVX2 path's code.
//! On a CPU with two 512-bit FMA units that is twice the FMAs per
//! cycle of AVX2 (measured on this project's 2-core Xeon: 166 against 82
//! GFLOP/s of one core): 1.3-1.7x the AVX2 path on 2 to 128 rows
//! (`--example speed`; docs/real-model-speed.md, "The matmul kernel").
//! The weights are the same float32 values ggml's dequantization gives, multiplied into float32
//! accumulators with FMA: only the summation order differs from the other
//! paths (16 lanes, reduced at the end).

use std::arch::x86_64::*;

use crate::operands::{block_bytes, Args};
use crate::panel::{panel_tile, Width, PANEL_ROWS};
use crate::quant::{QuantType, BLOCK};
use crate::x86::{decode_row, for_type, sum4};
use crate::x86::{Q4_0, Q4_1, Q8_0};
use crate::{Dims, Job};

/// Whether this CPU runs the path.
pub(crate) fn supported() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl") && crate::x86::supported()
}

/// Columns `cols` of `y = x · W^T`.
///
/// # Safety
/// As `scalar::matmul`, and the CPU supports the path (`supported`).
pub(crate) unsafe fn matmul(job: &Job<'_>, cols: std::ops::Range<usize>) {
    let Dims { m, n, k } = job.dims;
    if m == 1 {
        // One activation row (decode of one sequence) runs faster on the
        // AVX2 path's register tile than in panels or 16-lane tiles (1536 x
        // 576 Q4_1: 0.096-0.10 ms against 0.11-0.13 ms for the 16-lane tile,
        // `--example speed`); from 2 rows on, panels win by 20-30%.
        // SAFETY: forwarded; this CPU runs the AVX2 path (`supported`).
        return unsafe { crate::x86::matmul(job, cols) };
    }
    let args = Args { x: job.x.as_ptr(), w: job.w.as_ptr(), y: job.y.0, m, n, k };
    // SAFETY: forwarded from the caller.
    unsafe { for_type!(job.quant, panels(&args, cols)) }
}

/// Activation rows per register tile of a panel: 6 x 4 accumulators, 6
/// activation vectors and one weight vector take 31 of the 32 registers.
const PANEL_TILE_M: usize = 6;

/// The AVX-512 width of the panel loop (`panel.rs`): 16 lanes, 32 registers.
struct Avx512;

impl Width for Avx512 {
    type V = __m512;
    const LANES: usize = 16;
    const TILE_M: usize = PANEL_TILE_M;
    const MIN_BLOCK_ROWS: usize = PANEL_TILE_M;

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: the caller's 16 floats at p.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }

    /// Each accumulator's 16 lanes folded into 8 (`halves`), then the AVX2
    /// path's `sum4`.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn sums(v: &[__m512; PANEL_ROWS]) -> __m128 {
        let mut folded = [_mm256_setzero_ps(); PANEL_ROWS];
        for (f, v) in folded.iter_mut().zip(v) {
            *f = halves(*v);
        }
        sum4(&folded)
    }

    /// Q8_0, Q4_0 and Q4_1 16 weights at a time (`decode_block`); the other
    /// types with the AVX2 path's code.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn decode_row<const Q: u8>(row: *const u8, k: usize, dst: *mut f32) {
        // SAFETY: the caller's bounds: k / BLOCK whole blocks at row, k floats at dst.
        unsafe {
            if !matches!(Q, Q8_0 | Q4_0 | Q4_1) {
                return decode_row::<Q>(row, k, dst);
            }
            for b in 0..k / BLOCK {
                let (lo, hi) = decode_block::<Q>(row.add(b * block_bytes(Q)));
                _mm512_storeu_ps(dst.add(b * BLOCK), lo);
                _mm512_storeu_ps(dst.add(b * BLOCK + 16), hi);
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    unsafe fn tiles(a: &Args, w: *const f32, i0: usize, i1: usize, j: usize, cols: usize) {
        let mut i = i0;
        // SAFETY: every tile lies in i0..i1; the rest is the caller's.
        unsafe {
            while i + PANEL_TILE_M <= i1 {
                panel_tile::<Self, PANEL_TILE_M>(a, w, i, j, cols);
                i += PANEL_TILE_M;
            }
            match i1 - i {
                0 => {}
                1 => panel_tile::<Self, 1>(a, w, i, j, cols),
                2 => panel_tile::<Self, 2>(a, w, i, j, cols),
                3 => panel_tile::<Self, 3>(a, w, i, j, cols),
                4 => panel_tile::<Self, 4>(a, w, i, j, cols),
                _ => panel_tile::<Self, 5>(a, w, i, j, cols),
            }
        }
    }
}

/// Columns `cols` for two activation rows or more: the panel loop
/// (`panel.rs`) at 16 lanes, tiles of up to PANEL_TILE_M activation rows.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn panels<const Q: u8>(a: &Args, cols: std::ops::Range<usize>) {
    // SAFETY: forwarded; this function enables the AVX-512 path's features.
    unsafe { crate::panel::panels::<Avx512, Q>(a, cols) }
}

/// The 16 lanes of `v` added pairwise into 8 (lane l + lane l + 8).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[inline]
fn halves(v: __m512) -> __m256 {
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    _mm256_add_ps(_mm512_castps512_ps256(v), high)
}

/// A block's 32 weights as two vectors of 16 float32 (weights 0..16 and
/// 16..32), equal to ggml's dequantization: `q * d` (Q8_0), `(q - 8) * d`
/// (Q4_0), `q * d + m` (Q4_1, one FMA: `q * d` is exact in float32, so it
/// rounds as the reference's product-then-sum does).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn decode_block<const Q: u8>(block: *const u8) -> (__m512, __m512) {
    // SAFETY: the caller's block is whole; each load below ends inside it.
    unsafe {
        let d = _mm512_cvtph_ps(_mm256_set1_epi16(block.cast::<i16>().read_unaligned()));
        if Q == Q8_0 {
            let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(block.add(2).cast())));
            let hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(block.add(18).cast())));
            return (_mm512_mul_ps(lo, d), _mm512_mul_ps(hi, d));
        }
        let start = if Q == Q4_1 { 4 } else { 2 };
        // Weights 0..16 are the low nibbles of the 16 bytes, 16..32 the high ones.
        let bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(block.add(start).cast()));
        let lo = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(0x0f)));
        let hi = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(bytes));
        if Q == Q4_0 {
            let eight = _mm512_set1_ps(8.0);
            // q - 8 is exact in float32 as it is in integers.
            (_mm512_mul_ps(_mm512_sub_ps(lo, eight), d), _mm512_mul_ps(_mm512_sub_ps(hi, eight), d))
        } else {
            let min = _mm512_cvtph_ps(_mm256_set1_epi16(block.add(2).cast::<i16>().read_unaligned()));
            (_mm512_fmadd_ps(lo, d, min), _mm512_fmadd_ps(hi, d, min))
        }
    }
}
