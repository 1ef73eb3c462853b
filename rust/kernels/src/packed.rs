//! Weights repacked once, at load, for the int8 path on AVX-512 VNNI
//! (`Packed`), and their product (`matmul`). `int8_vnni.rs` decodes its
//! panels again in every call, which pays only from 32 activation rows;
//! repacked, a call reads the panels as they lie, so decode of 1 to 31
//! requests runs `vpdpbusd` too.
//!
//! Columns (weight rows) go in blocks of 16, one per 32-bit lane. Each
//! weight is stored unsigned (`u = q + offset`, the type's quant made
//! non-negative: 128 for Q8_0, 8 for Q4_0, 16 for Q5_0, 32 for Q6_K, 0 for
//! the types with a minimum), 4 consecutive weights of the 16 columns per
//! 64-byte vector; the 4-bit types (Q4_0, Q4_1, Q4_K) two vectors per 64
//! bytes, in the low and high nibbles. Beside them each group's float32
//! scale (`d`, `d * sc` for the K-quants) and, for Q4_1, Q4_K and Q5_K,
//! each 32's float32 minimum. `vpdpbusd` multiplies the unsigned weights
//! by the signed activation quants, each group's integer sum starting from
//! `-offset *` the group's activation quants' sum: exact, as in the
//! panels. Then per group `sum * d_w * d_x` in float32 (FMA), and
//! `min * d_x * sum(q_x)` per 32 where the type has a minimum: the
//! arithmetic of `int8_vnni.rs`, summed in the same order, so the two give
//! the same bits.

use std::arch::x86_64::*;

use crate::int8_vnni::{decode_row, group, has_min};
use crate::q8::Q8Rows;
use crate::quant::QuantType;
use crate::{Dims, Job};

/// Columns per block: one per lane of a 512-bit vector of i32.
pub(crate) const LANES: usize = 16;
/// Activation rows per register tile (2 blocks of columns at a time: 4 x 2
/// integer and 4 x 2 float accumulators).
const TILE_M: usize = 4;

/// A weight matrix repacked for the int8 path on AVX-512 VNNI (see the
/// module's documentation): made once, at load, by `Packed::new`, and read
/// by every int8 product of the layer, whatever its row count.
pub struct Packed {
    quant: QuantType,
    n: usize,
    k: usize,
    /// The quants, `[n / 16 blocks][k / 4 steps][16 lanes][4]` bytes (the
    /// 4-bit types: each 64 bytes hold steps s and s + 4 of a group of 8).
    q: Vec<u8>,
    /// `[blocks][k / group][16]`.
    scale: Vec<f32>,
    /// `[blocks][k / 32][16]`, for the types with a minimum.
    min: Vec<f32>,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed({:?}, {} x {})", self.quant, self.n, self.k)
    }
}

/// What the unsigned quants add to the signed ones.
fn offset(quant: QuantType) -> i32 {
    match quant {
        QuantType::Q8_0 => 128,
        QuantType::Q4_0 => 8,
        QuantType::Q5_0 => 16,
        QuantType::Q6K => 32,
        _ => 0,
    }
}

/// Whether `quant`'s unsigned quants fit 4 bits.
fn nibbles(quant: QuantType) -> bool {
    matches!(quant, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q4K)
}

impl Packed {
    /// Whether this CPU repacks weights (AVX-512 VNNI): where it does, a
    /// product of repacked weights multiplies at int8 whatever its rows.
    pub fn supported() -> bool {
        crate::int8_vnni::supported()
    }

    /// `rows` (`n` rows of `k` weights of `quant`) repacked, or `None`
    /// where the int8 path does not read `quant`, `rows` is not `n` rows of
    /// `k`, or this CPU has no AVX-512 VNNI.
    pub fn new(quant: QuantType, rows: &[u8], n: usize, k: usize) -> Option<Packed> {
        if !crate::int8::reads(quant)
            || !Packed::supported()
            || k == 0
            || !k.is_multiple_of(quant.block_elems())
            || rows.len() != n * quant.row_bytes(k)
        {
            return None;
        }
        let (size, blocks) = (group(quant), n.div_ceil(LANES));
        let bytes_per_block = if nibbles(quant) { k * LANES / 2 } else { k * LANES };
        let mut packed = Packed {
            quant,
            n,
            k,
            q: vec![0; blocks * bytes_per_block],
            scale: vec![0.0; blocks * (k / size) * LANES],
            min: if has_min(quant) { vec![0.0; blocks * (k / 32) * LANES] } else { Vec::new() },
        };
        let (mut q, mut scale, mut min) = (vec![0i8; k], vec![0.0f32; k / size], vec![0.0f32; k / 32]);
        let o = offset(quant);
        for j in 0..n {
            // SAFETY: row j is inside rows (length checked); the CPU runs the panels.
            unsafe { decode_row(quant, rows[j * quant.row_bytes(k)..].as_ptr(), k, &mut q, &mut scale, &mut min) };
            let (b, lane) = (j / LANES, j % LANES);
            let block = &mut packed.q[b * bytes_per_block..(b + 1) * bytes_per_block];
            for (e, &v) in q.iter().enumerate() {
                let u = (i32::from(v) + o) as u8;
                let (step, byte) = (e / 4, e % 4);
                if nibbles(quant) {
                    // Group of 8 steps: steps 0-3 low nibbles, 4-7 high, of 4 vectors.
                    let at = ((step / 8) * 4 + step % 4) * 64 + lane * 4 + byte;
                    block[at] |= if step % 8 < 4 { u } else { u << 4 };
                } else {
                    block[step * 64 + lane * 4 + byte] = u;
                }
            }
            for (g, &s) in scale.iter().enumerate() {
                packed.scale[(b * (k / size) + g) * LANES + lane] = s;
            }
            if has_min(quant) {
                for (g, &m) in min.iter().enumerate() {
                    packed.min[(b * (k / 32) + g) * LANES + lane] = m;
                }
            }
        }
        Some(packed)
    }

    /// Whether this is `n` rows of `k` weights of `quant`.
    pub(crate) fn fits(&self, quant: QuantType, n: usize, k: usize) -> bool {
        self.quant == quant && self.n == n && self.k == k
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.q.len() + 4 * (self.scale.len() + self.min.len())
    }
}

/// Whether a product of `m` rows reads the repacked weights rather than
/// the blocks (`int8_x86.rs`): at one or two rows a step reads every weight
/// once, so bytes count, and the repacked K-quants and Q8_0 are larger than
/// their blocks (Q6_K a byte a weight against 0.82). Two threads, one row,
/// 32768 x 2048 (out of the caches), repacked time over the blocks':
/// Q4_0 0.63x, Q4_1 0.63x, Q5_0 0.96x, Q4_K 1.03x, Q8_0 1.07x, Q5_K 1.49x,
/// Q6_K 1.37x; at two rows Q4_K 0.79x, Q8_0 1.05x, Q6_K 1.25x.
pub(crate) fn reads_at(quant: QuantType, m: usize) -> bool {
    m > crate::int8::INT8_FEW_ROWS || matches!(quant, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0)
}

/// Columns `cols` (whole blocks of 16, but for the last) of `y = x · W^T`
/// with `x` as `x8` (quantized `for_panels`) and `W` as `p`.
///
/// # Safety
/// As `int8::matmul`; `p` is the job's weights repacked; the CPU runs the
/// panels.
pub(crate) unsafe fn matmul(job: &Job<'_>, x8: &Q8Rows, p: &Packed, cols: std::ops::Range<usize>) {
    let m = job.dims.m;
    let (first, last) = (cols.start / LANES, cols.end.div_ceil(LANES));
    let mut b = first;
    while b < last {
        let pair = if b + 1 < last { 2 } else { 1 };
        let mut i = 0;
        // SAFETY: blocks b..b + pair are this thread's; rows below m.
        unsafe {
            while i + TILE_M <= m {
                tile_for::<TILE_M>(job, x8, p, i, b, pair);
                i += TILE_M;
            }
            match m - i {
                0 => {}
                1 => tile_for::<1>(job, x8, p, i, b, pair),
                2 => tile_for::<2>(job, x8, p, i, b, pair),
                _ => tile_for::<3>(job, x8, p, i, b, pair),
            }
        }
        b += pair;
    }
}

/// `tile` for the type's layout, group, minimum and block count.
///
/// # Safety
/// As `tile`.
unsafe fn tile_for<const MR: usize>(job: &Job<'_>, x8: &Q8Rows, p: &Packed, i: usize, b: usize, pair: usize) {
    // SAFETY: forwarded.
    unsafe {
        match (nibbles(p.quant), group(p.quant), has_min(p.quant), pair) {
            (true, _, true, 2) => tile::<MR, 2, true, 32, true>(job, x8, p, i, b),
            (true, _, true, _) => tile::<MR, 1, true, 32, true>(job, x8, p, i, b),
            (true, _, false, 2) => tile::<MR, 2, true, 32, false>(job, x8, p, i, b),
            (true, _, false, _) => tile::<MR, 1, true, 32, false>(job, x8, p, i, b),
            (false, 16, _, 2) => tile::<MR, 2, false, 16, false>(job, x8, p, i, b),
            (false, 16, _, _) => tile::<MR, 1, false, 16, false>(job, x8, p, i, b),
            (false, _, true, 2) => tile::<MR, 2, false, 32, true>(job, x8, p, i, b),
            (false, _, true, _) => tile::<MR, 1, false, 32, true>(job, x8, p, i, b),
            (false, _, false, 2) => tile::<MR, 2, false, 32, false>(job, x8, p, i, b),
            (false, _, false, _) => tile::<MR, 1, false, 32, false>(job, x8, p, i, b),
        }
    }
}

/// `y[i..i + MR, 16 b..16 (b + NB)]` (the columns below n): activation rows
/// `i..i + MR` times column blocks `b..b + NB`.
///
/// # Safety
/// i + MR <= m, blocks b..b + NB exist and their columns are this
/// thread's; `x8` was quantized `for_panels`; the CPU runs the panels.
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const MR: usize, const NB: usize, const NIBBLES: bool, const GROUP: usize, const MIN: bool>(
    job: &Job<'_>,
    x8: &Q8Rows,
    p: &Packed,
    i: usize,
    b: usize,
) {
    let Dims { n, k, .. } = job.dims;
    let (x_block, groups) = (job.quant.block_elems(), k / GROUP);
    let blocks = k / x_block;
    let bytes_per_block = if NIBBLES { k * LANES / 2 } else { k * LANES };
    let o = offset(job.quant);
    let low = _mm512_set1_epi8(0x0f);
    // SAFETY: every row below m has k quants, k / x_block scales, k / 16
    // sums of 16 and k / 32 scaled sums; blocks b..b + NB hold k / GROUP
    // groups; the caller's bounds.
    unsafe {
        let xq: [*const i8; MR] = std::array::from_fn(|r| x8.qs.as_ptr().add((i + r) * k));
        let xd: [*const f32; MR] = std::array::from_fn(|r| x8.d.as_ptr().add((i + r) * blocks));
        let xs: [*const f32; MR] = std::array::from_fn(|r| x8.scaled_sums.as_ptr().add((i + r) * k / 32));
        let x16: [*const i16; MR] = std::array::from_fn(|r| x8.sums16.as_ptr().add((i + r) * k / 16));
        let q: [*const u8; NB] = std::array::from_fn(|c| p.q.as_ptr().add((b + c) * bytes_per_block));
        let mut acc = [[_mm512_setzero_ps(); NB]; MR];
        for g in 0..groups {
            let mut sums = [[_mm512_setzero_si512(); NB]; MR];
            if o != 0 {
                for (r, sums) in sums.iter_mut().enumerate() {
                    let total: i32 = (0..GROUP / 16).map(|h| i32::from(*x16[r].add(g * GROUP / 16 + h))).sum();
                    *sums = [_mm512_set1_epi32(-o * total); NB];
                }
            }
            if NIBBLES {
                for v in 0..4 {
                    let packed: [__m512i; NB] =
                        std::array::from_fn(|c| _mm512_loadu_si512(q[c].add((g * 4 + v) * 64).cast()));
                    let lo: [__m512i; NB] = std::array::from_fn(|c| _mm512_and_si512(packed[c], low));
                    let hi: [__m512i; NB] =
                        std::array::from_fn(|c| _mm512_and_si512(_mm512_srli_epi16::<4>(packed[c]), low));
                    for (r, sums) in sums.iter_mut().enumerate() {
                        let at = g * 32 + 4 * v;
                        let xlo = _mm512_set1_epi32(xq[r].add(at).cast::<i32>().read_unaligned());
                        let xhi = _mm512_set1_epi32(xq[r].add(at + 16).cast::<i32>().read_unaligned());
                        for c in 0..NB {
                            sums[c] = _mm512_dpbusd_epi32(sums[c], lo[c], xlo);
                            sums[c] = _mm512_dpbusd_epi32(sums[c], hi[c], xhi);
                        }
                    }
                }
            } else {
                for step in 0..GROUP / 4 {
                    let at = g * GROUP + 4 * step;
                    let w: [__m512i; NB] = std::array::from_fn(|c| _mm512_loadu_si512(q[c].add(at * 16).cast()));
                    for (r, sums) in sums.iter_mut().enumerate() {
                        let xv = _mm512_set1_epi32(xq[r].add(at).cast::<i32>().read_unaligned());
                        for c in 0..NB {
                            sums[c] = _mm512_dpbusd_epi32(sums[c], w[c], xv);
                        }
                    }
                }
            }
            let scale: [__m512; NB] =
                std::array::from_fn(|c| _mm512_loadu_ps(p.scale.as_ptr().add(((b + c) * groups + g) * LANES)));
            for r in 0..MR {
                let dx = _mm512_set1_ps(*xd[r].add(g * GROUP / x_block));
                for c in 0..NB {
                    let s = _mm512_mul_ps(scale[c], dx);
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r][c]), s, acc[r][c]);
                }
            }
            if MIN {
                let min: [__m512; NB] =
                    std::array::from_fn(|c| _mm512_loadu_ps(p.min.as_ptr().add(((b + c) * (k / 32) + g) * LANES)));
                for r in 0..MR {
                    let s = _mm512_set1_ps(*xs[r].add(g));
                    for c in 0..NB {
                        acc[r][c] = _mm512_fmadd_ps(min[c], s, acc[r][c]);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let y = job.y.0.add((i + r) * n);
            for (c, v) in acc.iter().enumerate() {
                let col = (b + c) * LANES;
                let lanes = n.saturating_sub(col).min(LANES);
                let mask: __mmask16 = if lanes == LANES { 0xffff } else { (1u16 << lanes) - 1 };
                // Masked lanes are neither read nor written.
                _mm512_mask_storeu_ps(y.wrapping_add(col), mask, *v);
            }
        }
    }
}
