//! Activation rows quantized to int8 for the int8 path (`int8.rs`): each
//! block of `block` floats (32 for the legacy weight types, 256 for the
//! K-quants, matching the weight block it meets) becomes `round(x / d)` in
//! -127..=127 with `d = max|x| / 127`, plus the sum of the quants of every
//! 32 (the K-quants' minimums multiply it). Done once per call, before the
//! weight rows are read.

/// `m` rows of `k` activations as int8 blocks.
pub(crate) struct Q8Rows {
    /// The quants, `m x k`.
    pub(crate) qs: Vec<i8>,
    /// Each block's scale, `m x k / block`.
    pub(crate) d: Vec<f32>,
    /// The sum of each 32 quants, `m x k / 32`.
    pub(crate) sums: Vec<i16>,
    /// The quants plus 128 (`vpdpbusd` multiplies unsigned by signed
    /// bytes), `m x k`; empty unless quantized `for_panels`.
    pub(crate) biased: Vec<u8>,
    /// Each 32's sum times its block's scale, `m x k / 32`; empty unless
    /// quantized `for_panels`.
    pub(crate) scaled_sums: Vec<f32>,
    /// The sum of each 16 quants, `m x k / 16` (Q6_K's groups); empty
    /// unless quantized `for_panels`.
    pub(crate) sums16: Vec<i16>,
}

impl Q8Rows {
    /// `x` (`m x k`, `k` a multiple of `block`, `block` a multiple of 32)
    /// quantized block by block; with what `int8_vnni.rs`'s panels read
    /// besides where `for_panels`.
    pub(crate) fn quantize(x: &[f32], block: usize, for_panels: bool) -> Q8Rows {
        let mut qs = vec![0i8; x.len()];
        let mut d = Vec::with_capacity(x.len() / block);
        #[cfg(target_arch = "x86_64")]
        let simd = crate::x86::supported();
        for (xs, q) in x.chunks_exact(block).zip(qs.chunks_exact_mut(block)) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: this CPU has AVX2; xs holds one block, a multiple of 8.
            let amax = if simd { unsafe { abs_max_avx2(xs) } } else { abs_max(xs) };
            #[cfg(not(target_arch = "x86_64"))]
            let amax = abs_max(xs);
            let scale = amax / 127.0;
            let inverse = if scale == 0.0 { 0.0 } else { 1.0 / scale };
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: this CPU has AVX2; xs and q hold one block each.
                unsafe { round_block_avx2(xs, inverse, q) };
                d.push(scale);
                continue;
            }
            for (q, v) in q.iter_mut().zip(xs) {
                *q = (v * inverse).round().clamp(-127.0, 127.0) as i8;
            }
            d.push(scale);
        }
        let sums: Vec<i16> = qs.chunks_exact(32).map(|q| q.iter().map(|&v| i16::from(v)).sum()).collect();
        let (biased, scaled_sums, sums16) = if for_panels {
            let per_block = block / 32;
            (
                qs.iter().map(|&q| (q as u8) ^ 0x80).collect(),
                sums.iter().enumerate().map(|(s, &sum)| d[s / per_block] * f32::from(sum)).collect(),
                qs.chunks_exact(16).map(|q| q.iter().map(|&v| i16::from(v)).sum()).collect(),
            )
        } else {
            (Vec::new(), Vec::new(), Vec::new())
        };
        Q8Rows { qs, d, sums, biased, scaled_sums, sums16 }
    }
}

/// The largest magnitude in `xs`.
fn abs_max(xs: &[f32]) -> f32 {
    xs.iter().fold(0.0f32, |a, v| a.max(v.abs()))
}

/// `abs_max` 8 lanes at a time (the same value: a maximum does not round).
///
/// # Safety
/// The CPU has AVX2; `xs.len()` is a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn abs_max_avx2(xs: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut m = _mm256_setzero_ps();
    for x8 in xs.chunks_exact(8) {
        // SAFETY: 8 floats at x8.
        m = _mm256_max_ps(m, _mm256_and_ps(unsafe { _mm256_loadu_ps(x8.as_ptr()) }, magnitude));
    }
    let mut lanes = [0.0f32; 8];
    // SAFETY: 8 floats of room.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    abs_max(&lanes)
}

/// `q = round(x * inverse)` (halves away from zero, as `f32::round`) for a
/// block of a multiple of 8 floats, 8 at a time: the scalar loop calls
/// `roundf` per element, which took a fifth of a served prefill's time.
/// Every quant equals the scalar loop's: `x * inverse` is the same product,
/// and adding the largest float below one half, then truncating, rounds
/// exactly as `round` does for these magnitudes (at most 127.5).
///
/// # Safety
/// The CPU has AVX2; `xs` and `q` are of one length, a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_block_avx2(xs: &[f32], inverse: f32, q: &mut [i8]) {
    use std::arch::x86_64::*;
    let (inv, below_half, sign) = (_mm256_set1_ps(inverse), _mm256_set1_ps(0.499_999_97), _mm256_set1_ps(-0.0));
    for (x8, q8) in xs.chunks_exact(8).zip(q.chunks_exact_mut(8)) {
        // SAFETY: 8 floats at x8, 8 bytes at q8.
        unsafe {
            let t = _mm256_mul_ps(_mm256_loadu_ps(x8.as_ptr()), inv);
            let half = _mm256_or_ps(below_half, _mm256_and_ps(t, sign));
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(_mm256_add_ps(t, half));
            let i = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0)), _mm256_set1_ps(127.0)));
            // 8 i32 to 8 i8: pack to i16 (lanes 0-3 | 4-7 per 128), then to i8.
            let w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256::<1>(i));
            let b = _mm_packs_epi16(w, w);
            q8.as_mut_ptr().cast::<i64>().write_unaligned(_mm_cvtsi128_si64(b));
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_simd_rounding_equals_the_scalar_one() {
        if !crate::x86::supported() {
            eprintln!("this CPU has no AVX2: nothing to compare");
            return;
        }
        // Every half and its float neighbours up to 127.5, both signs, and
        // the products of a block's scaling.
        let mut values = Vec::new();
        for h in 0..=255 {
            let tie = h as f32 * 0.5;
            values.extend([tie, tie.next_down(), tie.next_up()].into_iter().flat_map(|v| [v, -v]));
        }
        values.extend((0..4096).map(|i| (i as f32 * 0.0371).sin() * 127.4));
        values.truncate(values.len() / 8 * 8);
        let mut simd = vec![0i8; values.len()];
        // SAFETY: AVX2 checked above; the lengths are equal multiples of 8.
        unsafe { super::round_block_avx2(&values, 1.0, &mut simd) };
        for (v, q) in values.iter().zip(&simd) {
            assert_eq!(*q, v.round().clamp(-127.0, 127.0) as i8, "{v}");
        }
    }
}
