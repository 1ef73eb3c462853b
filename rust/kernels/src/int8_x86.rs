//! The int8 path on AVX2 (`int8.rs` says what it computes): per block,
//! `_mm256_maddubs_epi16` (unsigned x signed bytes, pairs summed into i16,
//! never saturating for these quants) and `_mm256_madd_epi16` (the block's
//! or sub-block's integer scale, pairs summed into i32) give the integer
//! sums exactly as the scalar reference does; the float32 scales then
//! multiply them in 8 lanes, reduced at the end of the row, so only the
//! float32 summation order differs from the reference. A weight block is
//! unpacked once for a tile of up to 4 activation rows, each with its own
//! accumulators, summed in the same order whatever the tile: an output's
//! bits do not depend on the rest of its batch.

use std::arch::x86_64::*;

use crate::q8::Q8Rows;
use crate::quant::{scale_min_k4, QuantType};
use crate::x86::{prefetch, PREFETCH_BYTES};
use crate::{Dims, Job};

/// Columns `cols` of `y = x · W^T` with `x` as `x8`.
///
/// # Safety
/// As `int8::matmul`, and the CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matmul(job: &Job<'_>, x8: &Q8Rows, cols: std::ops::Range<usize>) {
    let Dims { m, k, .. } = job.dims;
    let row_bytes = job.quant.row_bytes(k);
    let ahead = PREFETCH_BYTES.div_ceil(row_bytes);
    for j in cols.clone() {
        // SAFETY: j < n, so the row is inside w; the row prefetched is
        // inside w too (j + ahead < cols.end <= n); i + MR <= m.
        unsafe {
            if j + ahead < cols.end {
                prefetch(job.w.as_ptr().add((j + ahead) * row_bytes), row_bytes);
            }
            let mut i = 0;
            while i + 4 <= m {
                tile::<4>(job, x8, i, j);
                i += 4;
            }
            match m - i {
                0 => {}
                1 => tile::<1>(job, x8, i, j),
                2 => tile::<2>(job, x8, i, j),
                _ => tile::<3>(job, x8, i, j),
            }
        }
    }
}

/// A tile's activation rows: each one's quants, block scales and sums of 32.
struct Rows<const MR: usize> {
    q: [*const i8; MR],
    d: [*const f32; MR],
    sums: [*const i16; MR],
}

/// `y[i..i + MR, j]`: weight row j times activation rows `i..i + MR`.
///
/// # Safety
/// i + MR <= m, j < n, column j is this thread's; as `matmul`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const MR: usize>(job: &Job<'_>, x8: &Q8Rows, i: usize, j: usize) {
    let Dims { n, k, .. } = job.dims;
    let blocks = k / job.quant.block_elems();
    // SAFETY: every activation row below m has k quants, k / block scales
    // and k / 32 sums in x8; row j of w is inside it; the caller's bounds.
    unsafe {
        let w = job.w.as_ptr().add(j * job.quant.row_bytes(k));
        let x = Rows::<MR> {
            q: std::array::from_fn(|r| x8.qs.as_ptr().add((i + r) * k)),
            d: std::array::from_fn(|r| x8.d.as_ptr().add((i + r) * blocks)),
            sums: std::array::from_fn(|r| x8.sums.as_ptr().add((i + r) * k / 32)),
        };
        let dots = match job.quant {
            QuantType::Q8_0 => dot_q8_0(w, &x, blocks),
            QuantType::Q4_0 => dot_q4_0(w, &x, blocks),
            QuantType::Q4_1 => dot_q4_1(w, &x, blocks),
            QuantType::Q5_0 => dot_q5_0(w, &x, blocks),
            QuantType::Q4K => dot_q45_k::<false, MR>(w, &x, blocks),
            QuantType::Q5K => dot_q45_k::<true, MR>(w, &x, blocks),
            QuantType::Q6K => dot_q6_k(w, &x, blocks),
            _ => unreachable!("the int8 path reads only the types `int8::reads` names"),
        };
        for (r, dot) in dots.into_iter().enumerate() {
            *job.y.0.add((i + r) * n + j) = dot;
        }
    }
}

/// The f16 at `p` as float32, in all 8 lanes. Broadcast, not inserted into
/// one lane: LLVM inserts a lone half into whatever register is free, often
/// the accumulator, which chained every block to the one before (Q8_0 ran
/// at 60% of the speed it runs at now).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half8(p: *const u8) -> __m256 {
    // SAFETY: the caller's `p` holds two bytes.
    let bits = unsafe { p.cast::<i16>().read_unaligned() };
    _mm256_cvtph_ps(_mm_set1_epi16(bits))
}

/// The sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane_sum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The quants of a legacy block (32 signed weights, `wq`, scale `dw`) times
/// each row's block `b`, into `acc`.
///
/// # Safety
/// Each row of `x` holds block `b`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_block<const MR: usize>(wq: __m256i, dw: __m256, x: &Rows<MR>, b: usize, acc: &mut [__m256; MR]) {
    let magnitudes = _mm256_sign_epi8(wq, wq);
    for (r, acc) in acc.iter_mut().enumerate() {
        // SAFETY: the caller's bounds.
        unsafe {
            let xq = _mm256_loadu_si256(x.q[r].add(b * 32).cast());
            // The weights' signs moved onto the activations (never -128),
            // so that maddubs multiplies the weights' magnitudes, unsigned.
            let pairs = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(xq, wq));
            let sumi = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
            let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*x.d[r].add(b)));
            *acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sumi), *acc);
        }
    }
}

/// A row of `blocks` Q8_0 blocks at `w` times the rows of `x`.
///
/// # Safety
/// `w` holds the blocks, each row of `x` their activations.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0<const MR: usize>(w: *const u8, x: &Rows<MR>, blocks: usize) -> [f32; MR] {
    let mut acc = [_mm256_setzero_ps(); MR];
    for b in 0..blocks {
        // SAFETY: the caller's bounds.
        unsafe {
            let block = w.add(b * 34);
            legacy_block(_mm256_loadu_si256(block.add(2).cast()), half8(block), x, b, &mut acc);
        }
    }
    std::array::from_fn(|r| lane_sum(acc[r]))
}

/// A row of `blocks` Q4_0 blocks at `w` times the rows of `x`.
///
/// # Safety
/// As `dot_q8_0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0<const MR: usize>(w: *const u8, x: &Rows<MR>, blocks: usize) -> [f32; MR] {
    let mut acc = [_mm256_setzero_ps(); MR];
    for b in 0..blocks {
        // SAFETY: the caller's bounds.
        unsafe {
            let block = w.add(b * 18);
            let wq = _mm256_sub_epi8(nibbles(block.add(2)), _mm256_set1_epi8(8));
            legacy_block(wq, half8(block), x, b, &mut acc);
        }
    }
    std::array::from_fn(|r| lane_sum(acc[r]))
}

/// The 16 bytes at `p` as 32 nibbles: low ones (weights 0..16), then high.
///
/// # Safety
/// `p` holds 16 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller's bounds.
    let bytes = unsafe { _mm_loadu_si128(p.cast()) };
    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(bytes), bytes), _mm256_set1_epi8(0x0f))
}

/// A row of `blocks` Q4_1 blocks at `w` times the rows of `x`: the nibbles
/// unsigned, the minimum times the activations' sum.
///
/// # Safety
/// As `dot_q8_0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1<const MR: usize>(w: *const u8, x: &Rows<MR>, blocks: usize) -> [f32; MR] {
    let mut acc = [_mm256_setzero_ps(); MR];
    // Every lane the same: the minimums' sum, block by block.
    let mut mins = [_mm256_setzero_ps(); MR];
    for b in 0..blocks {
        // SAFETY: the caller's bounds.
        unsafe {
            let block = w.add(b * 20);
            let (wq, dw, m) = (nibbles(block.add(4)), half8(block), half8(block.add(2)));
            for r in 0..MR {
                let xq = _mm256_loadu_si256(x.q[r].add(b * 32).cast());
                let sumi = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq), _mm256_set1_epi16(1));
                let dx = _mm256_set1_ps(*x.d[r].add(b));
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(sumi), acc[r]);
                let sum = _mm256_set1_ps(f32::from(*x.sums[r].add(b)));
                mins[r] = _mm256_fmadd_ps(_mm256_mul_ps(m, dx), sum, mins[r]);
            }
        }
    }
    std::array::from_fn(|r| lane_sum(acc[r]) + _mm256_cvtss_f32(mins[r]))
}

/// A row of `blocks` Q5_0 blocks at `w` times the rows of `x`.
///
/// # Safety
/// As `dot_q8_0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0<const MR: usize>(w: *const u8, x: &Rows<MR>, blocks: usize) -> [f32; MR] {
    let mut acc = [_mm256_setzero_ps(); MR];
    for b in 0..blocks {
        // SAFETY: the caller's bounds.
        unsafe {
            let block = w.add(b * 22);
            legacy_block(q5_0(block), half8(block), x, b, &mut acc);
        }
    }
    std::array::from_fn(|r| lane_sum(acc[r]))
}

/// A Q5_0 block's 32 signed quants (`q - 16`).
///
/// # Safety
/// `block` holds the block's 22 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_0(block: *const u8) -> __m256i {
    // Byte e of the shuffled bits holds byte e / 8 of qh; OR-ing all bits but
    // bit e % 8 leaves 0xff exactly where weight e's fifth bit is set.
    let spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    // SAFETY: the caller's bounds.
    unsafe {
        let qh = block.add(2).cast::<i32>().read_unaligned();
        let bytes = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread), others);
        let set = _mm256_cmpeq_epi8(bytes, _mm256_set1_epi8(-1));
        // (q | 16) - 16 is q where the bit is set, else q - 16 is q | 0xf0.
        _mm256_or_si256(nibbles(block.add(6)), _mm256_andnot_si256(set, _mm256_set1_epi8(0xf0u8 as i8)))
    }
}

/// A row of `blocks` Q4_K (`FIVE` false) or Q5_K super-blocks at `w` times
/// the rows of `x`.
///
/// # Safety
/// As `dot_q8_0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q45_k<const FIVE: bool, const MR: usize>(w: *const u8, x: &Rows<MR>, blocks: usize) -> [f32; MR] {
    let (bytes, qs) = if FIVE { (176, 48) } else { (144, 16) };
    let low = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); MR];
    // Every lane the same: the minimums' sum, block by block.
    let mut mins = [_mm256_setzero_ps(); MR];
    for b in 0..blocks {
        // SAFETY: the caller's bounds.
        unsafe {
            let block = w.add(b * bytes);
            let packed = std::slice::from_raw_parts(block.add(4), 12);
            let mut scales = [0i16; 8];
            let mut summ = [0i32; MR];
            for (s, scale) in scales.iter_mut().enumerate() {
                let (sc, m) = scale_min_k4(packed, s);
                *scale = i16::from(sc);
                for (r, summ) in summ.iter_mut().enumerate() {
                    *summ += i32::from(m) * i32::from(*x.sums[r].add(b * 8 + s));
                }
            }
            let fifth = if FIVE { _mm256_loadu_si256(block.add(16).cast()) } else { _mm256_setzero_si256() };
            let mut sumi = [_mm256_setzero_si256(); MR];
            for pair in 0..4 {
                // Sub-blocks 2 pair and 2 pair + 1: the low and high nibbles of 32 bytes.
                let bits = _mm256_loadu_si256(block.add(qs + 32 * pair).cast());
                let mut w_low = _mm256_and_si256(bits, low);
                let mut w_high = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), low);
                if FIVE {
                    w_low = _mm256_or_si256(w_low, q5_k_fifth(fifth, 2 * pair));
                    w_high = _mm256_or_si256(w_high, q5_k_fifth(fifth, 2 * pair + 1));
                }
                let (sc_low, sc_high) = (_mm256_set1_epi16(scales[2 * pair]), _mm256_set1_epi16(scales[2 * pair + 1]));
                for (r, sumi) in sumi.iter_mut().enumerate() {
                    let xq = x.q[r].add(b * 256);
                    let x_low = _mm256_loadu_si256(xq.add(64 * pair).cast());
                    let x_high = _mm256_loadu_si256(xq.add(64 * pair + 32).cast());
                    let p_low = _mm256_madd_epi16(sc_low, _mm256_maddubs_epi16(w_low, x_low));
                    let p_high = _mm256_madd_epi16(sc_high, _mm256_maddubs_epi16(w_high, x_high));
                    *sumi = _mm256_add_epi32(*sumi, _mm256_add_epi32(p_low, p_high));
                }
            }
            let (dw, dmin) = (half8(block), half8(block.add(2)));
            for r in 0..MR {
                let dx = _mm256_set1_ps(*x.d[r].add(b));
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
                mins[r] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_set1_ps(summ[r] as f32), mins[r]);
            }
        }
    }
    std::array::from_fn(|r| lane_sum(acc[r]) - _mm256_cvtss_f32(mins[r]))
}

/// A row of `blocks` Q6_K super-blocks at `w` times the rows of `x`.
///
/// # Safety
/// As `dot_q8_0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k<const MR: usize>(w: *const u8, x: &Rows<MR>, blocks: usize) -> [f32; MR] {
    let mut acc = [_mm256_setzero_ps(); MR];
    for b in 0..blocks {
        // SAFETY: the caller's bounds.
        unsafe {
            let block = w.add(b * 210);
            let scales = block.add(192).cast::<i8>();
            let mut sumi = [_mm256_setzero_si256(); MR];
            for group in 0..2 {
                // Weights 128 group + 32 t + l, unsigned (q + 32).
                for (t, w6) in q6_k_half(block, group).into_iter().enumerate() {
                    let sub = 8 * group + 2 * t;
                    let scale = _mm256_set_m128i(
                        _mm_set1_epi16(i16::from(*scales.add(sub + 1))),
                        _mm_set1_epi16(i16::from(*scales.add(sub))),
                    );
                    for (r, sumi) in sumi.iter_mut().enumerate() {
                        let xv = _mm256_loadu_si256(x.q[r].add(b * 256 + 128 * group + 32 * t).cast());
                        // (q + 32) x - 32 x: the weights' offset taken off in i16.
                        let pairs = _mm256_sub_epi16(
                            _mm256_maddubs_epi16(w6, xv),
                            _mm256_maddubs_epi16(_mm256_set1_epi8(32), xv),
                        );
                        *sumi = _mm256_add_epi32(*sumi, _mm256_madd_epi16(scale, pairs));
                    }
                }
            }
            let dw = half8(block.add(208));
            for r in 0..MR {
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*x.d[r].add(b)));
                acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sumi[r]), acc[r]);
            }
        }
    }
    std::array::from_fn(|r| lane_sum(acc[r]))
}

/// 16 where bit `s` of the Q5_K bytes `fifth` (a super-block's 32 bytes at
/// 16) is set, else 0: the fifth bit of sub-block `s`'s weight l is bit s
/// of byte l.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q5_k_fifth(fifth: __m256i, s: usize) -> __m256i {
    let bit = _mm256_set1_epi8((1u8 << s) as i8);
    _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(fifth, bit), bit), _mm256_set1_epi8(16))
}

/// Weights `128 part .. 128 (part + 1)` of the Q6_K super-block at `block`,
/// unsigned (`q + 32`), as 4 vectors of 32 (weights 128 part + 32 t + l):
/// 4 low bits from ql (bytes 0..32 for t = 0, 2; 32..64 for t = 1, 3; the
/// high nibble for t >= 2), 2 high bits from qh's bits 2t, 2t + 1.
///
/// # Safety
/// `block` holds the super-block's 210 bytes; `part` is 0 or 1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6_k_half(block: *const u8, part: usize) -> [__m256i; 4] {
    let (low, two) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
    // SAFETY: the caller's bounds.
    let (ql0, ql1, qh) = unsafe {
        (
            _mm256_loadu_si256(block.add(64 * part).cast()),
            _mm256_loadu_si256(block.add(64 * part + 32).cast()),
            _mm256_loadu_si256(block.add(128 + 32 * part).cast()),
        )
    };
    let high = |shift: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(shift, two));
    [
        _mm256_or_si256(_mm256_and_si256(ql0, low), high(qh)),
        _mm256_or_si256(_mm256_and_si256(ql1, low), high(_mm256_srli_epi16::<2>(qh))),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low), high(_mm256_srli_epi16::<4>(qh))),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low), high(_mm256_srli_epi16::<6>(qh))),
    ]
}
