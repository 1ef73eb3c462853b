//! The AVX2 path (x86-64 with AVX2, FMA and F16C). Few activation rows
//! (decode): a tile of up to 4 rows times one weight row at a time, each
//! weight block decoded once per tile: a 32-weight block in registers, 8
//! weights at a time; a 256-weight super-block (K-quants, IQ4_XS) its
//! scales first, then 8 weights at a time (`super_blocks.rs`). Many rows: a few
//! weight rows decoded once into a float32 panel, then multiplied by
//! register tiles. Either way the weights are exactly the float32 values
//! ggml's dequantization gives, multiplied into float32 accumulators with
//! FMA: only the summation order differs from the scalar path (8 lanes,
//! reduced at the end).

use std::arch::x86_64::*;

use crate::operands::{block_bytes, quant, Args};
use crate::panel::{panel_tile, Width, PANEL_ROWS};
use crate::quant::{QuantType, BLOCK, IQ4_LEVELS, SUPER_BLOCK};
use crate::{Dims, Job};

// The types as const generic parameters (`QuantType`'s `repr`).
pub(crate) const Q8_0: u8 = QuantType::Q8_0 as u8;
pub(crate) const Q4_0: u8 = QuantType::Q4_0 as u8;
pub(crate) const Q4_1: u8 = QuantType::Q4_1 as u8;
pub(crate) const Q5_0: u8 = QuantType::Q5_0 as u8;
pub(crate) const Q5_1: u8 = QuantType::Q5_1 as u8;
pub(crate) const IQ4_NL: u8 = QuantType::Iq4Nl as u8;
pub(crate) const F16: u8 = QuantType::F16 as u8;
pub(crate) const BF16: u8 = QuantType::Bf16 as u8;
pub(crate) const Q2_K: u8 = QuantType::Q2K as u8;
pub(crate) const Q3_K: u8 = QuantType::Q3K as u8;
pub(crate) const Q4_K: u8 = QuantType::Q4K as u8;
pub(crate) const Q5_K: u8 = QuantType::Q5K as u8;
pub(crate) const Q6_K: u8 = QuantType::Q6K as u8;
pub(crate) const IQ4_XS: u8 = QuantType::Iq4Xs as u8;

/// `$f::<Q>($args)` for the const id `Q` of the runtime type `$quant`.
macro_rules! for_type {
    ($quant:expr, $f:ident ($($args:expr),*)) => {
        match $quant {
            QuantType::Q8_0 => $f::<{ $crate::x86::Q8_0 }>($($args),*),
            QuantType::Q4_0 => $f::<{ $crate::x86::Q4_0 }>($($args),*),
            QuantType::Q4_1 => $f::<{ $crate::x86::Q4_1 }>($($args),*),
            QuantType::Q5_0 => $f::<{ $crate::x86::Q5_0 }>($($args),*),
            QuantType::Q5_1 => $f::<{ $crate::x86::Q5_1 }>($($args),*),
            QuantType::Iq4Nl => $f::<{ $crate::x86::IQ4_NL }>($($args),*),
            QuantType::F16 => $f::<{ $crate::x86::F16 }>($($args),*),
            QuantType::Bf16 => $f::<{ $crate::x86::BF16 }>($($args),*),
            QuantType::Q2K => $f::<{ $crate::x86::Q2_K }>($($args),*),
            QuantType::Q3K => $f::<{ $crate::x86::Q3_K }>($($args),*),
            QuantType::Q4K => $f::<{ $crate::x86::Q4_K }>($($args),*),
            QuantType::Q5K => $f::<{ $crate::x86::Q5_K }>($($args),*),
            QuantType::Q6K => $f::<{ $crate::x86::Q6_K }>($($args),*),
            QuantType::Iq4Xs => $f::<{ $crate::x86::IQ4_XS }>($($args),*),
        }
    };
}
pub(crate) use for_type;

/// Whether this CPU runs the path.
pub(crate) fn supported() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// Columns `cols` of `y = x · W^T`.
///
/// # Safety
/// As `scalar::matmul`, and the CPU supports the path (`supported`).
pub(crate) unsafe fn matmul(job: &Job<'_>, cols: std::ops::Range<usize>) {
    let Dims { m, n, k } = job.dims;
    let args = Args { x: job.x.as_ptr(), w: job.w.as_ptr(), y: job.y.0, m, n, k };
    // SAFETY: forwarded from the caller.
    unsafe { for_type!(job.quant, columns(&args, cols)) }
}

/// Weight rows outermost, each read from memory once per call and
/// sequentially (rows are contiguous, so the whole matrix streams; the
/// few-rows path also prefetches PREFETCH_BYTES ahead). Few activation rows
/// (decode): blocks decoded in registers for a tile of up to 4 rows. Many
/// (batched decode, prefill): PANEL_ROWS weight rows decoded once into a
/// float32 scratch that stays in L1, then multiplied by PANEL_TILE_M x
/// PANEL_ROWS register tiles, so decoding is paid once per weight row however
/// many activation rows there are.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn columns<const Q: u8>(a: &Args, cols: std::ops::Range<usize>) {
    if a.m >= PANEL_MIN_M {
        // SAFETY: forwarded.
        return unsafe { panels::<Q>(a, cols) };
    }
    let row_bytes = quant(Q).row_bytes(a.k);
    let ahead = PREFETCH_BYTES.div_ceil(row_bytes);
    if quant(Q).is_super_block() {
        // SAFETY: forwarded.
        return unsafe { super_columns::<Q>(a, cols, ahead) };
    }
    for j in cols.clone() {
        let mut i = 0;
        // SAFETY (all calls below): i + MR <= m and j < n; the row
        // prefetched is inside w (j + ahead < cols.end <= n).
        unsafe {
            if j + ahead < cols.end {
                prefetch(a.w.add((j + ahead) * row_bytes), row_bytes);
            }
            while i + 4 <= a.m {
                tile::<Q, 4, 2>(a, i, j);
                i += 4;
            }
            match a.m - i {
                0 => {}
                1 => tile::<Q, 1, 4>(a, i, j),
                2 => tile::<Q, 2, 4>(a, i, j),
                _ => tile::<Q, 3, 2>(a, i, j),
            }
        }
    }
}

/// How far ahead of the row it multiplies the few-rows path asks for weight
/// rows (whole rows, at least this many bytes): the hardware prefetcher
/// alone left the Q8_0 output head 17% slower, streaming from memory.
pub(crate) const PREFETCH_BYTES: usize = 2048;

/// Asks for the `len` bytes at `p` to be brought into the caches.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn prefetch(p: *const u8, len: usize) {
    for off in (0..len).step_by(64) {
        // A prefetch never faults, whatever the address.
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast());
    }
}

/// From this many activation rows on, weights are decoded into a scratch
/// panel (`panels`) rather than in registers per tile of 4 rows (measured:
/// 5 to 7 rows run 10-15% faster in panels, 4 rows 20% slower).
pub(crate) const PANEL_MIN_M: usize = 5;
/// Activation rows per register tile of a panel: 3 x 4 accumulators, 3
/// activation vectors and one weight vector fill the 16 registers; 3 + 4
/// loads feed 12 FMAs.
const PANEL_TILE_M: usize = 3;

/// The AVX2 width of the panel loop (`panel.rs`): 8 lanes, 16 registers.
struct Avx2;

impl Width for Avx2 {
    type V = __m256;
    const LANES: usize = 8;
    const TILE_M: usize = PANEL_TILE_M;
    const MIN_BLOCK_ROWS: usize = PANEL_MIN_M;

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: the caller's 8 floats at p.
        unsafe { _mm256_loadu_ps(p) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn sums(v: &[__m256; PANEL_ROWS]) -> __m128 {
        sum4(v)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn decode_row<const Q: u8>(row: *const u8, k: usize, dst: *mut f32) {
        // SAFETY: forwarded.
        unsafe { decode_row::<Q>(row, k, dst) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tiles(a: &Args, w: *const f32, i0: usize, i1: usize, j: usize, cols: usize) {
        // Tiles of 3 rows; a remainder of 4 goes as 2 + 2, not 3 + 1
        // (a 1-row tile's 4 FMA chains wait on the FMA latency).
        let mut i = i0;
        // SAFETY: every tile lies in i0..i1; the rest is the caller's.
        unsafe {
            while i + PANEL_TILE_M <= i1 && i1 - i != 4 {
                panel_tile::<Self, PANEL_TILE_M>(a, w, i, j, cols);
                i += PANEL_TILE_M;
            }
            while i + 2 <= i1 {
                panel_tile::<Self, 2>(a, w, i, j, cols);
                i += 2;
            }
            if i < i1 {
                panel_tile::<Self, 1>(a, w, i, j, cols);
            }
        }
    }
}

/// `columns` for many activation rows (see there): the panel loop at 8 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panels<const Q: u8>(a: &Args, cols: std::ops::Range<usize>) {
    // SAFETY: forwarded; this function enables the AVX2 path's features.
    unsafe { crate::panel::panels::<Avx2, Q>(a, cols) }
}

/// The `k` weights of the row of blocks at `row` into `dst`, as float32.
///
/// # Safety
/// `row` holds `k / block_elems` whole blocks and `dst` room for `k` floats.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn decode_row<const Q: u8>(row: *const u8, k: usize, dst: *mut f32) {
    let (bytes, elems) = (block_bytes(Q), quant(Q).block_elems());
    // SAFETY: the caller's bounds; each block decodes to `elems` floats.
    unsafe {
        for b in 0..k / elems {
            let block = row.add(b * bytes);
            if quant(Q).is_super_block() {
                crate::super_blocks::decode::<Q>(block, dst.add(b * elems));
                continue;
            }
            let (d, min) = scales::<Q>(block);
            for c in 0..4 {
                _mm256_storeu_ps(dst.add(b * BLOCK + c * 8), decode::<Q>(block, c, d, min));
            }
        }
    }
}

/// `columns` for a super-block type and fewer than PANEL_MIN_M activation
/// rows: each super-block of a weight row decoded once, in registers, and
/// multiplied into every activation row.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn super_columns<const Q: u8>(a: &Args, cols: std::ops::Range<usize>, ahead: usize) {
    let row_bytes = quant(Q).row_bytes(a.k);
    for j in cols.clone() {
        // SAFETY: as in `columns`.
        unsafe {
            if j + ahead < cols.end {
                prefetch(a.w.add((j + ahead) * row_bytes), row_bytes);
            }
            match a.m {
                1 => super_tile::<Q, 1, 4>(a, 0, j),
                2 => super_tile::<Q, 2, 4>(a, 0, j),
                3 => super_tile::<Q, 3, 2>(a, 0, j),
                _ => super_tile::<Q, 4, 2>(a, 0, j),
            }
        }
    }
}

/// `y[i..i+MR, j]` for a super-block type: as `tile`, each super-block of
/// weight row `j` decoded once, 8 weights at a time in registers (its
/// scales first), into accumulator `chunk % A` of every row.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn super_tile<const Q: u8, const MR: usize, const A: usize>(a: &Args, i: usize, j: usize) {
    use crate::super_blocks::{group, scales, GROUPS};
    let bytes = block_bytes(Q);
    let mut acc = [[_mm256_setzero_ps(); A]; MR];
    // SAFETY: the shapes were checked, i + MR <= m and j < n, so every
    // pointer below stays inside x, w and y.
    unsafe {
        let row = a.w.add(j * quant(Q).row_bytes(a.k));
        for b in 0..a.k / SUPER_BLOCK {
            let block = row.add(b * bytes);
            let s = scales::<Q>(block);
            let x = a.x.add(i * a.k + b * SUPER_BLOCK);
            for g in 0..GROUPS {
                // Vector v of the group into accumulator v % A: known at
                // compile time, so the accumulators stay in registers.
                for (v, wv) in group::<Q>(block, g, &s).into_iter().enumerate() {
                    for (r, acc_r) in acc.iter_mut().enumerate() {
                        let xv = _mm256_loadu_ps(x.add(r * a.k + 32 * g + 8 * v));
                        acc_r[v % A] = _mm256_fmadd_ps(xv, wv, acc_r[v % A]);
                    }
                }
            }
        }
        for (r, acc_r) in acc.iter().enumerate() {
            let mut lanes = acc_r[0];
            for part in &acc_r[1..] {
                lanes = _mm256_add_ps(lanes, *part);
            }
            *a.y.add((i + r) * a.n + j) = sum(lanes);
        }
    }
}

/// The lane sums of 4 accumulators, as one vector (pairwise: lanes 0+1,
/// 2+3, then those, then the two halves).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn sum4(v: &[__m256; PANEL_ROWS]) -> __m128 {
    let quads = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    _mm_add_ps(_mm256_castps256_ps128(quads), _mm256_extractf128_ps::<1>(quads))
}

/// A block's scale `d` and (Q4_1, Q5_1) minimum `m`, broadcast to 8
/// lanes (unused by F16 and BF16, which have none).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scales<const Q: u8>(block: *const u8) -> (__m256, __m256) {
    if Q == F16 || Q == BF16 {
        return (_mm256_setzero_ps(), _mm256_setzero_ps());
    }
    // SAFETY: the caller's block is whole.
    unsafe {
        let d = _mm256_cvtph_ps(_mm_set1_epi16(block.cast::<i16>().read_unaligned()));
        let min = if Q == Q4_1 || Q == Q5_1 {
            _mm256_cvtph_ps(_mm_set1_epi16(block.add(2).cast::<i16>().read_unaligned()))
        } else {
            _mm256_setzero_ps()
        };
        (d, min)
    }
}

/// `y[i..i+MR, j]`: each of the MR rows sums into A accumulators of 8 lanes
/// (chunk c of a block into accumulator c % A), so that at least 4
/// independent FMA chains hide the FMA latency also for one row.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const Q: u8, const MR: usize, const A: usize>(a: &Args, i: usize, j: usize) {
    let bytes = block_bytes(Q);
    let mut acc = [[_mm256_setzero_ps(); A]; MR];
    // SAFETY: the shapes were checked, i + MR <= m and j < n, so every
    // pointer below stays inside x, w and y.
    unsafe {
        let row = a.w.add(j * (a.k / BLOCK * bytes));
        for b in 0..a.k / BLOCK {
            let x = a.x.add(i * a.k + b * BLOCK);
            let block = row.add(b * bytes);
            let (d, min) = scales::<Q>(block);
            for c in 0..4 {
                let wv = decode::<Q>(block, c, d, min);
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(x.add(r * a.k + c * 8));
                    acc_r[c % A] = _mm256_fmadd_ps(xv, wv, acc_r[c % A]);
                }
            }
        }
        for (r, acc_r) in acc.iter().enumerate() {
            let mut lanes = acc_r[0];
            for part in &acc_r[1..] {
                lanes = _mm256_add_ps(lanes, *part);
            }
            *a.y.add((i + r) * a.n + j) = sum(lanes);
        }
    }
}

/// Weights `8c..8c+8` of a 32-weight block, as float32 equal to ggml's
/// dequantization: `q * d` (Q8_0), `(q - 8) * d` (Q4_0), `(q - 16) * d`
/// (Q5_0), `q * d + m` (Q4_1, Q5_1), `d * level` (IQ4_NL), the value
/// itself (F16, BF16). Q4_1's and Q5_1's is one FMA, which rounds as the
/// reference's product-then-sum does: `q * d` (a 4- or 5-bit integer times
/// an f16) is exact in float32, so only the sum rounds.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn decode<const Q: u8>(block: *const u8, c: usize, d: __m256, min: __m256) -> __m256 {
    // SAFETY: the caller's block is whole.
    unsafe {
        if Q == Q8_0 {
            let q = _mm_loadl_epi64(block.add(2 + 8 * c).cast());
            return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
        }
        if Q == F16 {
            return _mm256_cvtph_ps(_mm_loadu_si128(block.add(16 * c).cast()));
        }
        if Q == BF16 {
            let halves = _mm256_cvtepu16_epi32(_mm_loadu_si128(block.add(16 * c).cast()));
            return _mm256_castsi256_ps(_mm256_slli_epi32::<16>(halves));
        }
        let start = match Q {
            Q4_1 => 4,
            Q5_0 => 6,
            Q5_1 => 8,
            _ => 2,
        };
        // Elements 0..16 are the low nibbles of the 16 bytes, 16..32 the
        // high ones; the bytes are widened to 32 bits first (one load-and-
        // widen), so the high nibble is a shift without a mask.
        let bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(block.add(start + 8 * (c & 1)).cast()));
        let mut q =
            if c >= 2 { _mm256_srli_epi32::<4>(bytes) } else { _mm256_and_si256(bytes, _mm256_set1_epi32(0x0f)) };
        if Q == Q5_0 || Q == Q5_1 {
            // Weight e's fifth bit is bit e of the 32-bit word before the nibbles.
            let qh = block.add(start - 4).cast::<i32>().read_unaligned();
            let lanes = _mm256_add_epi32(_mm256_set1_epi32(8 * c as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            let bit = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(qh), lanes), _mm256_set1_epi32(1));
            q = _mm256_or_si256(q, _mm256_slli_epi32::<4>(bit));
        }
        match Q {
            Q4_0 => _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(8))), d),
            Q5_0 => _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(16))), d),
            IQ4_NL => _mm256_mul_ps(d, iq4_levels(q)),
            _ => _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d, min),
        }
    }
}

/// IQ4_NL's levels of 8 indices (0..16, one per 32-bit lane), as float32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn iq4_levels(q: __m256i) -> __m256 {
    let level = |i: usize| f32::from(IQ4_LEVELS[i]);
    let low = _mm256_setr_ps(level(0), level(1), level(2), level(3), level(4), level(5), level(6), level(7));
    let high = _mm256_setr_ps(level(8), level(9), level(10), level(11), level(12), level(13), level(14), level(15));
    // The permutes read the low 3 bits of each index; bit 3 picks the table.
    let upper = _mm256_castsi256_ps(_mm256_cmpgt_epi32(q, _mm256_set1_epi32(7)));
    _mm256_blendv_ps(_mm256_permutevar8x32_ps(low, q), _mm256_permutevar8x32_ps(high, q), upper)
}

/// The sum of the 8 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn sum(v: __m256) -> f32 {
    let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps::<1>(pair, pair)))
}
