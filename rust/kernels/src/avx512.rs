//! The AVX-512 path (x86-64 with AVX-512F and VL beside the AVX2 path's
//! features): the AVX2 path's panels (`x86.rs`) with vectors of 16 floats
//! and 32 registers, from two activation rows on; one row runs the AVX2
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

use crate::quant::{QuantType, BLOCK};
use crate::x86::{block_bytes, decode_row, for_type, quant, store_sums, sum4, Args, PANEL_ROWS, PANEL_X_BYTES};
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

/// Columns `cols` for two activation rows or more: PANEL_ROWS weight rows
/// at a time decoded once into a float32 scratch that stays in L1, then
/// multiplied by register tiles of up to PANEL_TILE_M activation rows (as
/// the AVX2 path's `panels`); weight rows outermost, each read from memory
/// once per call (per block of activation rows that stays in L2).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn panels<const Q: u8>(a: &Args, cols: std::ops::Range<usize>) {
    let bytes = block_bytes(Q);
    let row_bytes = quant(Q).row_bytes(a.k);
    // Rows past the end of `cols` stay zero: a last panel of fewer rows is
    // computed whole and only its own columns are stored.
    let mut scratch = vec![0.0f32; PANEL_ROWS * a.k];
    let block_rows = (PANEL_X_BYTES / (4 * a.k)).clamp(PANEL_TILE_M, 256) / PANEL_TILE_M * PANEL_TILE_M;
    let mut i0 = 0;
    while i0 < a.m {
        let i1 = (i0 + block_rows).min(a.m);
        let mut j = cols.start;
        while j < cols.end {
            let rows = PANEL_ROWS.min(cols.end - j);
            // SAFETY: j + rows <= n, so every block read is inside w; the
            // scratch holds PANEL_ROWS rows of k floats; i1 <= m.
            unsafe {
                if rows < PANEL_ROWS {
                    scratch.fill(0.0);
                }
                for r in 0..rows {
                    let row = a.w.add((j + r) * row_bytes);
                    let dst = scratch.as_mut_ptr().add(r * a.k);
                    if !matches!(Q, Q8_0 | Q4_0 | Q4_1) {
                        // The other types decode with the AVX2 path's code.
                        decode_row::<Q>(row, a.k, dst);
                        continue;
                    }
                    for b in 0..a.k / BLOCK {
                        let (lo, hi) = decode_block::<Q>(row.add(b * bytes));
                        _mm512_storeu_ps(dst.add(b * BLOCK), lo);
                        _mm512_storeu_ps(dst.add(b * BLOCK + 16), hi);
                    }
                }
                let w = scratch.as_ptr();
                let mut i = i0;
                while i + PANEL_TILE_M <= i1 {
                    panel_tile::<PANEL_TILE_M>(a, w, i, j, rows);
                    i += PANEL_TILE_M;
                }
                match i1 - i {
                    0 => {}
                    1 => panel_tile::<1>(a, w, i, j, rows),
                    2 => panel_tile::<2>(a, w, i, j, rows),
                    3 => panel_tile::<3>(a, w, i, j, rows),
                    4 => panel_tile::<4>(a, w, i, j, rows),
                    _ => panel_tile::<5>(a, w, i, j, rows),
                }
            }
            j += rows;
        }
        i0 = i1;
    }
}

/// `y[i..i+MR, j..j+cols]` from the PANEL_ROWS decoded weight rows at `w`
/// (k floats each). Every output has one accumulator, summed over k in
/// order and reduced the same way whatever MR and `cols`: an output's bits
/// do not depend on its place in the batch or on the thread split.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn panel_tile<const MR: usize>(a: &Args, w: *const f32, i: usize, j: usize, cols: usize) {
    let mut acc = [[_mm512_setzero_ps(); PANEL_ROWS]; MR];
    // SAFETY: i + MR <= m, j + cols <= n, and w holds PANEL_ROWS rows of k floats.
    unsafe {
        let x = a.x.add(i * a.k);
        for kc in (0..a.k).step_by(16) {
            let mut xv = [_mm512_setzero_ps(); MR];
            for (row, v) in xv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(x.add(row * a.k + kc));
            }
            for r in 0..PANEL_ROWS {
                let wv = _mm512_loadu_ps(w.add(r * a.k + kc));
                for (acc_row, xr) in acc.iter_mut().zip(&xv) {
                    acc_row[r] = _mm512_fmadd_ps(*xr, wv, acc_row[r]);
                }
            }
        }
        for (row, acc_row) in acc.iter().enumerate() {
            let mut folded = [_mm256_setzero_ps(); PANEL_ROWS];
            for (f, v) in folded.iter_mut().zip(acc_row) {
                *f = halves(*v);
            }
            store_sums(a, sum4(&folded), i + row, j, cols);
        }
    }
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
