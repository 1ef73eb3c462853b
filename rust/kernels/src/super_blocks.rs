//! AVX2 decoding of the 256-weight super-blocks (Q2_K, Q3_K, Q4_K, Q5_K,
//! Q6_K, IQ4_XS) to float32, 32 weights at a time (gathered as bytes from
//! 32-byte loads, then widened 8 at a time): each weight the same bits
//! as the `gguf` package's dequantization (`quant::dequantize_block`). A
//! sub-block's scale (and minimum) is one float32 product computed as the
//! reference computes it; the weight is then `scale * q` (minus `min`) as
//! two roundings, a multiply then a subtract: never an FMA, which would
//! round once and differ.

use std::arch::x86_64::*;

use crate::quant::{half, scale_iq4xs, scale_q3k, IQ4_LEVELS, SUPER_BLOCK};
use crate::x86::{Q2_K, Q3_K, Q4_K, Q5_K, Q6_K};

/// Groups of 32 weights in a super-block.
pub(crate) const GROUPS: usize = SUPER_BLOCK / 32;

/// A super-block's float32 sub-block scales and minimums (the products the
/// reference computes), one per sub-block: 16 of 16 weights (Q2_K, Q3_K,
/// Q6_K) or 8 of 32 (Q4_K, Q5_K, IQ4_XS).
pub(crate) struct Scales {
    scale: [f32; 16],
    min: [f32; 16],
}

/// Sub-blocks of the type of const id `Q`.
const fn sub_blocks(q: u8) -> usize {
    if matches!(q, Q2_K | Q3_K | Q6_K) {
        16
    } else {
        8
    }
}

/// The scales of the super-block at `block`: Q2_K's, Q4_K's, Q5_K's and
/// Q6_K's 8 at a time in vectors (the same float32 products), Q3_K's and
/// IQ4_XS's one at a time from their packed bits.
///
/// # Safety
/// `block` holds a whole block of the super-block type of const id `Q`;
/// the CPU runs AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn scales<const Q: u8>(block: *const u8) -> Scales {
    // SAFETY: the caller's block is whole: these are its scale bytes.
    let b = unsafe { std::slice::from_raw_parts(block, crate::operands::block_bytes(Q)) };
    let mut s = Scales { scale: [0.0; 16], min: [0.0; 16] };
    // The super-block's f16 scale and minimum, converted once.
    let (d, dmin) = match Q {
        Q2_K => (half(b, 80), half(b, 82)),
        Q3_K => (half(b, 108), 0.0),
        Q6_K => (half(b, 208), 0.0),
        _ => (half(b, 0), half(b, 2)),
    };
    // `factor * byte` for 8 bytes (unsigned or signed), stored at `out`.
    let products = |out: &mut [f32], factor: f32, bytes: [u8; 8], signed: bool| {
        let raw = _mm_loadl_epi64(bytes.as_ptr().cast());
        let ints = if signed { _mm256_cvtepi8_epi32(raw) } else { _mm256_cvtepu8_epi32(raw) };
        let values = _mm256_mul_ps(_mm256_set1_ps(factor), _mm256_cvtepi32_ps(ints));
        // SAFETY: out holds 8 floats (a half of a 16-float array).
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), values) };
    };
    let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let join = |low: u32, high: u32| (u64::from(low) | (u64::from(high) << 32)).to_le_bytes();
    let halves = |at: usize| -> ([u8; 8], [u8; 8]) {
        (b[at..at + 8].try_into().expect("8 bytes"), b[at + 8..at + 16].try_into().expect("8 bytes"))
    };
    match Q {
        Q2_K => {
            let (first, second) = halves(0);
            for (part, bytes) in [first, second].into_iter().enumerate() {
                let raw = u64::from_le_bytes(bytes);
                let range = 8 * part..8 * part + 8;
                products(&mut s.scale[range.clone()], d, (raw & 0x0f0f_0f0f_0f0f_0f0f).to_le_bytes(), false);
                products(&mut s.min[range], dmin, ((raw >> 4) & 0x0f0f_0f0f_0f0f_0f0f).to_le_bytes(), false);
            }
        }
        Q4_K | Q5_K => {
            // `get_scale_min_k4` for all 8 sub-blocks at once, 4 bytes a word.
            let (sc, m, md) = (word(4), word(8), word(12));
            let scale_high = (md & 0x0f0f_0f0f) | ((sc >> 2) & 0x3030_3030);
            let min_high = ((md >> 4) & 0x0f0f_0f0f) | ((m >> 2) & 0x3030_3030);
            products(&mut s.scale[..8], d, join(sc & 0x3f3f_3f3f, scale_high), false);
            products(&mut s.min[..8], dmin, join(m & 0x3f3f_3f3f, min_high), false);
        }
        Q6_K => {
            let (first, second) = halves(192);
            products(&mut s.scale[..8], d, first, true);
            products(&mut s.scale[8..], d, second, true);
        }
        _ => {
            for i in 0..sub_blocks(Q) {
                let sub_scale = if Q == Q3_K { scale_q3k(&b[96..108], i) } else { scale_iq4xs(b, i) };
                s.scale[i] = d * f32::from(sub_scale);
            }
        }
    }
    s
}

/// The 256 weights of the super-block at `block` into `out`.
///
/// # Safety
/// `block` holds a whole block of the type of const id `Q` (a super-block
/// type) and `out` room for 256 floats; the CPU runs AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn decode<const Q: u8>(block: *const u8, out: *mut f32) {
    // SAFETY: forwarded; group j's 32 floats are out[32j..32j + 32].
    unsafe {
        let s = scales::<Q>(block);
        for j in 0..GROUPS {
            for (v, w) in group::<Q>(block, j, &s).into_iter().enumerate() {
                _mm256_storeu_ps(out.add(32 * j + 8 * v), w);
            }
        }
    }
}

/// The 32 bytes at `p`.
///
/// # Safety
/// The 32 bytes are readable.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: the caller's bound.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// `(byte >> shift) & mask` in every byte (the 16-bit shift's bits that
/// cross into a byte from its neighbour are masked off).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn bits(v: __m256i, shift: usize, mask: i8) -> __m256i {
    _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift as i32)), _mm256_set1_epi8(mask))
}

/// The 32 signed bytes of `q` as 4 vectors of 8 float32 (bytes 0..8, ..., 24..32).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn widen(q: __m256i) -> [__m256; 4] {
    let (low, high) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
    [low, _mm_srli_si128::<8>(low), high, _mm_srli_si128::<8>(high)]
        .map(|part| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part)))
}

/// Weights `32j..32j + 32` of the super-block at `block` (scales `s`), as 4
/// vectors of 8, with the reference's roundings: `scale * q`, then (Q2_K,
/// Q4_K, Q5_K) minus `min`, never fused. The 32 quants are first gathered
/// as signed bytes from 32-byte loads.
///
/// Layouts, for group `j` (`g = j / 4`, `t = j % 4`) and its weight `l`:
/// - Q2_K: 2 bits of byte `16 + 32g + l` at shift `2t`.
/// - Q3_K: as Q2_K's from byte 32 on, less 4 where bit `j` of byte `l` is clear.
/// - Q4_K: the low (even `j`) or high nibbles of bytes `16 + 32 (j / 2) + l`;
///   Q5_K the same from byte 48, and bit `j` of byte `16 + l` as the fifth.
/// - Q6_K: a nibble of byte `64g + 32 (t % 2) + l` (high for `t >= 2`) and 2
///   bits of byte `128 + 32g + l` at shift `2t`, less 32.
/// - IQ4_XS: low then high nibbles of bytes `8 + 16j ..`, IQ4_NL's levels.
///
/// # Safety
/// `block` holds a whole block of the type of const id `Q`; j < GROUPS.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn group<const Q: u8>(block: *const u8, j: usize, s: &Scales) -> [__m256; 4] {
    let (g, t) = (j / 4, j % 4);
    // SAFETY: every load below is inside the type's block (the layouts
    // above; the largest read ends at the block's last quant byte).
    let q = unsafe {
        match Q {
            Q2_K => bits(load32(block.add(16 + 32 * g)), 2 * t, 3),
            Q3_K => {
                let low = bits(load32(block.add(32 + 32 * g)), 2 * t, 3);
                let clear = _mm256_xor_si256(bits(load32(block), j, 1), _mm256_set1_epi8(1));
                _mm256_sub_epi8(low, _mm256_slli_epi16::<2>(clear))
            }
            Q4_K | Q5_K => {
                let at = if Q == Q4_K { 16 } else { 48 };
                let q = bits(load32(block.add(at + 32 * (j / 2))), 4 * (j % 2), 0x0f);
                if Q == Q4_K {
                    q
                } else {
                    _mm256_or_si256(q, _mm256_slli_epi16::<4>(bits(load32(block.add(16)), j, 1)))
                }
            }
            Q6_K => {
                let low = bits(load32(block.add(64 * g + 32 * (t % 2))), 4 * (t / 2), 0x0f);
                let high = bits(load32(block.add(128 + 32 * g)), 2 * t, 3);
                _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16::<4>(high)), _mm256_set1_epi8(32))
            }
            _ => {
                let bytes = _mm_loadu_si128(block.add(8 + 16 * j).cast());
                let nibbles =
                    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(bytes), bytes), _mm256_set1_epi8(0x0f));
                _mm256_shuffle_epi8(iq4_level_bytes(), nibbles)
            }
        }
    };
    let mut w = widen(q);
    // Sub-blocks of 16 (Q2_K, Q3_K, Q6_K) change scale every 2 vectors.
    let per_vector = |v: usize| if sub_blocks(Q) == 16 { 2 * j + v / 2 } else { j };
    for (v, w) in w.iter_mut().enumerate() {
        let sub = per_vector(v);
        *w = _mm256_mul_ps(_mm256_set1_ps(s.scale[sub]), *w);
        if matches!(Q, Q2_K | Q4_K | Q5_K) {
            *w = _mm256_sub_ps(*w, _mm256_set1_ps(s.min[sub]));
        }
    }
    w
}

/// IQ4_NL's 16 levels as bytes, in both 128-bit lanes (for a byte shuffle).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn iq4_level_bytes() -> __m256i {
    let l = IQ4_LEVELS;
    let lane = _mm_setr_epi8(
        l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7], l[8], l[9], l[10], l[11], l[12], l[13], l[14], l[15],
    );
    _mm256_set_m128i(lane, lane)
}
