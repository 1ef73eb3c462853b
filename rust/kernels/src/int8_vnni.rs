//! The int8 path for many activation rows on AVX-512 VNNI (`int8.rs` says
//! what it computes). `int8_x86.rs` unpacks a weight row again for every
//! tile of up to 4 activation rows, which made the int8 path slower than
//! the exact one from 4 rows on; here a panel of `COLS` weight rows is
//! decoded once into signed bytes laid out for `vpdpbusd` (4 consecutive
//! weights of 16 rows per 64-byte vector) and multiplied with every
//! activation row of the call, each activation's 4 bytes broadcast to the
//! 16 lanes: one instruction, 64 byte products.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes, so the activations come
//! biased by 128 (`q + 128`, `Q8Rows::biased`) and each group's integer sum
//! starts from `-128 *` the sum of its weights (`Panel::bias`): the integer
//! sums are exact. Per group of `GROUP` weights (16 for Q6_K, whose scales
//! are per 16) `sum * (d_w * d_x)` is then added in float32 with one FMA,
//! and for the types with a minimum (Q4_1, Q4_K, Q5_K) `min * d_x * (the
//! sum of the activations' quants)` per 32 weights. Each output is summed
//! in group order whatever the tile or the thread split, so it does not
//! depend on the batch's other rows; it differs from `int8_x86.rs`'s
//! results (which the same rows would get in a step of fewer rows) only by
//! float32 summation order.

use std::arch::x86_64::*;

use crate::int8_x86::{nibbles, q5_0, q5_k_fifth, q6_k_half};
use crate::q8::Q8Rows;
use crate::quant::{f16_to_f32, scale_min_k4, QuantType};
use crate::{Dims, Job};

/// The fewest activation rows the panels run: below it decoding the panels
/// (about 0.23 ns a weight) costs more than the exact path's whole product.
/// Measured with `--example speed` on the 2-core AMD EPYC with AVX-512 (one
/// thread), panels' time over the exact path's: Q4_0 1536 x 576 1.31x at
/// 24 rows, 1.03x at 32, 0.88x at 48, 0.35x at 512; Q4_K 2048 x 2048 0.84x
/// at 24, 0.62x at 32, 0.40x at 512.
pub(crate) const MIN_ROWS: usize = 32;

/// Weight rows per panel: two vectors of 16 lanes.
const COLS: usize = 32;
/// Activation rows per register tile: 6 x 2 integer and 6 x 2 float
/// accumulators and the panel's vectors fit the 32 registers.
const TILE_M: usize = 4;
/// Bytes of activations a pass over the panels keeps hot: the call's rows
/// are taken in blocks of this many bytes, each panel decoded once per block.
const ROW_BLOCK_BYTES: usize = 4 << 20;

/// Whether this CPU runs the panels.
pub(crate) fn supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && crate::x86::supported()
}

/// Weights per scale of `quant` in the panels.
pub(crate) fn group(quant: QuantType) -> usize {
    if quant == QuantType::Q6K {
        16
    } else {
        32
    }
}

/// Whether `quant` has a minimum per 32 weights (`w = d q + m`).
pub(crate) fn has_min(quant: QuantType) -> bool {
    matches!(quant, QuantType::Q4_1 | QuantType::Q4K | QuantType::Q5K)
}

/// `COLS` weight rows decoded for `vpdpbusd`.
struct Panel {
    /// Signed quants: for each 4 weights of k, 16 lanes of 4 bytes per
    /// vector, `COLS / 16` vectors.
    q: Vec<i8>,
    /// Each group's scale, `[k / group][COLS]`.
    scale: Vec<f32>,
    /// Each group's `-128 * sum of its quants`, `[k / group][COLS]`.
    bias: Vec<i32>,
    /// Each 32 weights' minimum, `[k / 32][COLS]` (types with one).
    min: Vec<f32>,
    /// The panel's rows as `Rows`: quants row by row, before the gather
    /// into `q`'s layout.
    rows: Rows,
}

/// Weight rows decoded one after the other: `q` `[COLS][k]`, `scale` and
/// `bias` `[COLS][k / group]`, `min` `[COLS][k / 32]`.
struct Rows {
    q: Vec<i8>,
    scale: Vec<f32>,
    bias: Vec<i32>,
    min: Vec<f32>,
}

impl Panel {
    fn new(k: usize, group: usize) -> Panel {
        let groups = k / group;
        Panel {
            q: vec![0; k * COLS],
            scale: vec![0.0; groups * COLS],
            bias: vec![0; groups * COLS],
            min: vec![0.0; k / 32 * COLS],
            rows: Rows {
                q: vec![0; k * COLS],
                scale: vec![0.0; groups * COLS],
                bias: vec![0; groups * COLS],
                min: vec![0.0; k / 32 * COLS],
            },
        }
    }

    /// Weight rows `w` (`width` <= COLS rows of k weights of `quant`) as
    /// the panel; the columns past `width` are zero.
    ///
    /// # Safety
    /// `w` holds `width` rows; the CPU runs the panels.
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode(&mut self, quant: QuantType, w: *const u8, width: usize, k: usize) {
        let (groups, row_bytes) = (k / group(quant), quant.row_bytes(k));
        let rows = &mut self.rows;
        for c in 0..COLS {
            let (q, scale, bias) = (
                &mut rows.q[c * k..][..k],
                &mut rows.scale[c * groups..][..groups],
                &mut rows.bias[c * groups..][..groups],
            );
            let min = &mut rows.min[c * (k / 32)..][..k / 32];
            if c < width {
                // SAFETY: row c is inside w (the caller's bounds).
                unsafe { decode_row(quant, w.add(c * row_bytes), k, q, scale, min) };
                // SAFETY: this CPU runs the panels.
                unsafe { group_biases(q, bias) };
            } else {
                q.fill(0);
                scale.fill(0.0);
                bias.fill(0);
                min.fill(0.0);
            }
        }
        // q[t][c] (4 bytes each) is rows.q[c][t]: 16 columns per gather.
        let index = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32((k / 4) as i32),
        );
        let src = rows.q.as_ptr().cast::<i32>();
        let dst = self.q.as_mut_ptr().cast::<i32>();
        for t in 0..k / 4 {
            for half in 0..COLS / 16 {
                // SAFETY: column 16 half + l, dword t lies inside rows.q;
                // dst's dwords t COLS .. (t + 1) COLS inside q.
                unsafe {
                    let v = _mm512_i32gather_epi32::<4>(index, src.add(half * 16 * (k / 4) + t));
                    _mm512_storeu_si512(dst.add(t * COLS + half * 16).cast(), v);
                }
            }
        }
        for (dst, src, per) in [(&mut self.scale, &rows.scale, groups), (&mut self.min, &rows.min, k / 32)] {
            for c in 0..COLS {
                for g in 0..per {
                    dst[g * COLS + c] = src[c * per + g];
                }
            }
        }
        for c in 0..COLS {
            for g in 0..groups {
                self.bias[g * COLS + c] = rows.bias[c * groups + g];
            }
        }
    }
}

/// One weight row of `quant` (k weights at `row`) as signed quants `q`,
/// each group's scale, and each 32's minimum (`w = scale * q + min`; zero
/// for the types without one).
///
/// # Safety
/// `row` holds the row's blocks; the CPU runs the panels.
#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn decode_row(
    quant: QuantType,
    row: *const u8,
    k: usize,
    q: &mut [i8],
    scale: &mut [f32],
    min: &mut [f32],
) {
    let half = |p: *const u8| f16_to_f32(unsafe { p.cast::<u16>().read_unaligned() });
    let low = _mm256_set1_epi8(0x0f);
    // SAFETY: each block read lies inside the row (k / block_elems blocks);
    // each store inside q (32 bytes at a multiple of 32 below k).
    unsafe {
        let mut put = |at: usize, v: __m256i| _mm256_storeu_si256(q.as_mut_ptr().add(at).cast(), v);
        match quant {
            QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 => {
                for b in 0..k / 32 {
                    let block = row.add(b * quant.block_bytes());
                    let (v, m) = match quant {
                        QuantType::Q8_0 => (_mm256_loadu_si256(block.add(2).cast()), 0.0),
                        QuantType::Q4_0 => (_mm256_sub_epi8(nibbles(block.add(2)), _mm256_set1_epi8(8)), 0.0),
                        QuantType::Q4_1 => (nibbles(block.add(4)), half(block.add(2))),
                        _ => (q5_0(block), 0.0),
                    };
                    put(b * 32, v);
                    scale[b] = half(block);
                    min[b] = m;
                }
            }
            QuantType::Q4K | QuantType::Q5K => {
                let five = quant == QuantType::Q5K;
                for b in 0..k / 256 {
                    let block = row.add(b * quant.block_bytes());
                    let packed = std::slice::from_raw_parts(block.add(4), 12);
                    let (d, dmin) = (half(block), half(block.add(2)));
                    let fifth = if five { _mm256_loadu_si256(block.add(16).cast()) } else { _mm256_setzero_si256() };
                    for pair in 0..4 {
                        let bits = _mm256_loadu_si256(block.add(if five { 48 } else { 16 } + 32 * pair).cast());
                        let mut halves =
                            [_mm256_and_si256(bits, low), _mm256_and_si256(_mm256_srli_epi16::<4>(bits), low)];
                        for (h, v) in halves.iter_mut().enumerate() {
                            let s = 2 * pair + h;
                            if five {
                                *v = _mm256_or_si256(*v, q5_k_fifth(fifth, s));
                            }
                            let (sc, m) = scale_min_k4(packed, s);
                            put(b * 256 + 32 * s, *v);
                            scale[b * 8 + s] = d * f32::from(sc);
                            min[b * 8 + s] = -(dmin * f32::from(m));
                        }
                    }
                }
            }
            QuantType::Q6K => {
                for b in 0..k / 256 {
                    let block = row.add(b * 210);
                    let d = half(block.add(208));
                    for part in 0..2 {
                        for (t, v) in q6_k_half(block, part).into_iter().enumerate() {
                            put(b * 256 + 128 * part + 32 * t, _mm256_sub_epi8(v, _mm256_set1_epi8(32)));
                        }
                    }
                    for g in 0..16 {
                        scale[b * 16 + g] = d * f32::from(*block.add(192 + g).cast::<i8>());
                    }
                }
            }
            _ => unreachable!("the int8 path reads only the types `int8::reads` names"),
        }
    }
}

/// Each group's `-128 *` the sum of its quants `q` into `bias` (one per
/// group; each group a multiple of 16 quants).
///
/// # Safety
/// The CPU runs the panels.
#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_biases(q: &[i8], bias: &mut [i32]) {
    // |q + 128| summed per 8 bytes, less 128 each.
    let size = q.len() / bias.len();
    for (g, bias) in bias.iter_mut().enumerate() {
        let mut sum = 0i64;
        for at in (g * size..(g + 1) * size).step_by(16) {
            // SAFETY: at + 16 <= q.len().
            let v = unsafe { _mm_xor_si128(_mm_loadu_si128(q.as_ptr().add(at).cast()), _mm_set1_epi8(-128)) };
            let s = _mm_sad_epu8(v, _mm_setzero_si128());
            sum += _mm_cvtsi128_si64(s) + _mm_extract_epi64::<1>(s) - 16 * 128;
        }
        *bias = -128 * sum as i32;
    }
}

/// Columns `cols` of `y = x · W^T` with `x` as `x8` (which holds the
/// biased quants and scaled sums, `Q8Rows::for_panels`).
///
/// # Safety
/// As `int8::matmul`, and the CPU runs the panels (`supported`).
pub(crate) unsafe fn matmul(job: &Job<'_>, x8: &Q8Rows, cols: std::ops::Range<usize>) {
    let Dims { m, k, .. } = job.dims;
    let quant = job.quant;
    let row_bytes = quant.row_bytes(k);
    let mut panel = Panel::new(k, group(quant));
    let block_rows = (ROW_BLOCK_BYTES / k).max(TILE_M) / TILE_M * TILE_M;
    let mut i0 = 0;
    while i0 < m {
        let i1 = (i0 + block_rows).min(m);
        let mut j = cols.start;
        while j < cols.end {
            let width = COLS.min(cols.end - j);
            // SAFETY: the panel holds COLS rows of k; rows i0..i1 < m and
            // columns j..j + width <= n are this call's and this thread's.
            unsafe {
                panel.decode(quant, job.w.as_ptr().add(j * row_bytes), width, k);
                let mut i = i0;
                while i + TILE_M <= i1 {
                    tile_for::<TILE_M>(job, x8, &panel, i, j, width);
                    i += TILE_M;
                }
                match i1 - i {
                    0 => {}
                    1 => tile_for::<1>(job, x8, &panel, i, j, width),
                    2 => tile_for::<2>(job, x8, &panel, i, j, width),
                    _ => tile_for::<3>(job, x8, &panel, i, j, width),
                }
            }
            j += width;
        }
        i0 = i1;
    }
}

/// `tile` with the group size and minimum of the job's type.
///
/// # Safety
/// As `tile`.
unsafe fn tile_for<const MR: usize>(job: &Job<'_>, x8: &Q8Rows, panel: &Panel, i: usize, j: usize, width: usize) {
    // SAFETY: forwarded.
    unsafe {
        match (group(job.quant), has_min(job.quant)) {
            (16, _) => tile::<MR, 16, false>(job, x8, panel, i, j, width),
            (_, true) => tile::<MR, 32, true>(job, x8, panel, i, j, width),
            _ => tile::<MR, 32, false>(job, x8, panel, i, j, width),
        }
    }
}

/// `y[i..i + MR, j..j + width]`: the panel times activation rows `i..i + MR`.
///
/// # Safety
/// i + MR <= m, j + width <= n, width <= COLS, the columns are this
/// thread's, `x8` holds the biased quants, and the CPU runs the panels.
#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const MR: usize, const GROUP: usize, const MIN: bool>(
    job: &Job<'_>,
    x8: &Q8Rows,
    panel: &Panel,
    i: usize,
    j: usize,
    width: usize,
) {
    let Dims { n, k, .. } = job.dims;
    let x_block = job.quant.block_elems();
    let blocks = k / x_block;
    // SAFETY: every row below m has k biased quants, k / x_block scales and
    // k / 32 scaled sums; the panel has k / GROUP groups; the caller's bounds.
    unsafe {
        let xq: [*const u8; MR] = std::array::from_fn(|r| x8.biased.as_ptr().add((i + r) * k));
        let xd: [*const f32; MR] = std::array::from_fn(|r| x8.d.as_ptr().add((i + r) * blocks));
        let xs: [*const f32; MR] = std::array::from_fn(|r| x8.scaled_sums.as_ptr().add((i + r) * k / 32));
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        let q = panel.q.as_ptr();
        for g in 0..k / GROUP {
            let bias = [
                _mm512_loadu_si512(panel.bias.as_ptr().add(g * COLS).cast()),
                _mm512_loadu_si512(panel.bias.as_ptr().add(g * COLS + 16).cast()),
            ];
            let mut sums = [bias; MR];
            for step in 0..GROUP / 4 {
                let at = g * GROUP + 4 * step;
                let w = [_mm512_loadu_si512(q.add(at * COLS).cast()), _mm512_loadu_si512(q.add(at * COLS + 64).cast())];
                for (r, sums) in sums.iter_mut().enumerate() {
                    let xv = _mm512_set1_epi32(xq[r].add(at).cast::<i32>().read_unaligned());
                    sums[0] = _mm512_dpbusd_epi32(sums[0], xv, w[0]);
                    sums[1] = _mm512_dpbusd_epi32(sums[1], xv, w[1]);
                }
            }
            let scale = [
                _mm512_loadu_ps(panel.scale.as_ptr().add(g * COLS)),
                _mm512_loadu_ps(panel.scale.as_ptr().add(g * COLS + 16)),
            ];
            for r in 0..MR {
                let dx = _mm512_set1_ps(*xd[r].add(g * GROUP / x_block));
                for c in 0..2 {
                    let s = _mm512_mul_ps(scale[c], dx);
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r][c]), s, acc[r][c]);
                }
            }
            if MIN {
                let min = [
                    _mm512_loadu_ps(panel.min.as_ptr().add(g * COLS)),
                    _mm512_loadu_ps(panel.min.as_ptr().add(g * COLS + 16)),
                ];
                for r in 0..MR {
                    let s = _mm512_set1_ps(*xs[r].add(g));
                    for c in 0..2 {
                        acc[r][c] = _mm512_fmadd_ps(min[c], s, acc[r][c]);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let y = job.y.0.add((i + r) * n + j);
            for (c, v) in acc.iter().enumerate() {
                let lanes = width.saturating_sub(16 * c).min(16);
                let mask: __mmask16 = if lanes == 16 { 0xffff } else { (1u16 << lanes) - 1 };
                // Masked lanes are neither read nor written: the address
                // may lie past y's end where the mask is empty.
                _mm512_mask_storeu_ps(y.wrapping_add(16 * c), mask, *v);
            }
        }
    }
}
