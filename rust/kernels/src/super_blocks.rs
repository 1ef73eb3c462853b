//! AVX2 decoding of the 256-weight super-blocks (Q2_K, Q3_K, Q4_K, Q5_K,
//! Q6_K, IQ4_XS) to float32, 8 weights at a time: each weight the same bits
//! as the `gguf` package's dequantization (`quant::dequantize_block`). A
//! sub-block's scale (and minimum) is one float32 product computed as the
//! reference computes it; the weight is then `scale * q` (minus `min`) as
//! two roundings, a multiply then a subtract: never an FMA, which would
//! round once and differ.

use std::arch::x86_64::*;

use crate::quant::{half, scale_iq4xs, scale_min_k4, scale_q3k, SUPER_BLOCK};
use crate::x86::{iq4_levels, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K};

/// Chunks of 8 weights in a super-block.
pub(crate) const CHUNKS: usize = SUPER_BLOCK / 8;

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

/// The scales of the super-block at `block`.
///
/// # Safety
/// `block` holds a whole block of the super-block type of const id `Q`.
#[inline]
pub(crate) unsafe fn scales<const Q: u8>(block: *const u8) -> Scales {
    // SAFETY: the caller's block is whole: these are its scale bytes.
    let b = unsafe { std::slice::from_raw_parts(block, crate::x86::block_bytes(Q)) };
    let mut s = Scales { scale: [0.0; 16], min: [0.0; 16] };
    // The super-block's f16 scale and minimum, converted once.
    let (d, dmin) = match Q {
        Q2_K => (half(b, 80), half(b, 82)),
        Q3_K => (half(b, 108), 0.0),
        Q6_K => (half(b, 208), 0.0),
        _ => (half(b, 0), half(b, 2)),
    };
    for i in 0..sub_blocks(Q) {
        (s.scale[i], s.min[i]) = match Q {
            Q2_K => (d * f32::from(b[i] & 0x0f), dmin * f32::from(b[i] >> 4)),
            Q3_K => (d * f32::from(scale_q3k(&b[96..108], i)), 0.0),
            Q4_K | Q5_K => {
                let (sc, m) = scale_min_k4(&b[4..16], i);
                (d * f32::from(sc), dmin * f32::from(m))
            }
            Q6_K => (d * f32::from(b[192 + i] as i8), 0.0),
            _ => (d * f32::from(scale_iq4xs(b, i)), 0.0),
        };
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
    // SAFETY: forwarded; chunk c's 8 floats are out[8c..8c + 8].
    unsafe {
        let s = scales::<Q>(block);
        for c in 0..CHUNKS {
            _mm256_storeu_ps(out.add(8 * c), chunk::<Q>(block, c, &s));
        }
    }
}

/// Bytes `p..p + 8`, each widened to a 32-bit lane.
///
/// # Safety
/// The 8 bytes are readable.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn widen(p: *const u8) -> __m256i {
    // SAFETY: the caller's bound.
    unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())) }
}

/// `(v >> shift) & mask` in every lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn bits(v: __m256i, shift: usize, mask: i32) -> __m256i {
    _mm256_and_si256(_mm256_srl_epi32(v, _mm_cvtsi32_si128(shift as i32)), _mm256_set1_epi32(mask))
}

/// Weights `8c..8c + 8` of the super-block at `block` (scales `s`), with
/// the reference's roundings: `scale * q`, then (Q2_K, Q4_K, Q5_K) minus
/// `min`, never fused.
///
/// Layouts, for weight `e` (`g = e / 128`, `t = e / 32 % 4`, `l = e % 32`):
/// - Q2_K: 2 bits of byte `16 + 32g + l` at shift `2t`.
/// - Q3_K: as Q2_K's from byte 32 on, less 4 where bit `e / 32` of byte `l` is clear.
/// - Q4_K: sub-block `s = e / 32` takes the low (even `s`) or high nibbles
///   of bytes `16 + 32 (s / 2) + l`; Q5_K the same from byte 48, and bit
///   `s` of byte `16 + l` as the fifth.
/// - Q6_K: a nibble of byte `64g + 32 (t % 2) + l` (high for `t >= 2`) and 2
///   bits of byte `128 + 32g + l` at shift `2t`, less 32.
/// - IQ4_XS: low then high nibbles of bytes `8 + 16s ..`, IQ4_NL's levels.
///
/// # Safety
/// `block` holds a whole block of the type of const id `Q`; c < CHUNKS.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn chunk<const Q: u8>(block: *const u8, c: usize, s: &Scales) -> __m256 {
    let e = 8 * c;
    let (g, t, l) = (e / 128, e / 32 % 4, e % 32);
    let sub = c * sub_blocks(Q) / CHUNKS;
    // SAFETY: every offset below is inside the type's block (the layouts
    // above; the largest read ends at the block's last quant byte).
    unsafe {
        let scale = _mm256_set1_ps(s.scale[sub]);
        let q = match Q {
            Q2_K => bits(widen(block.add(16 + 32 * g + l)), 2 * t, 3),
            Q3_K => {
                let low = bits(widen(block.add(32 + 32 * g + l)), 2 * t, 3);
                let clear = _mm256_xor_si256(bits(widen(block.add(l)), e / 32, 1), _mm256_set1_epi32(1));
                _mm256_sub_epi32(low, _mm256_slli_epi32::<2>(clear))
            }
            Q4_K | Q5_K => {
                let at = if Q == Q4_K { 16 } else { 48 };
                let q = bits(widen(block.add(at + 32 * (sub / 2) + l)), 4 * (sub % 2), 0x0f);
                if Q == Q4_K {
                    q
                } else {
                    _mm256_or_si256(q, _mm256_slli_epi32::<4>(bits(widen(block.add(16 + l)), sub, 1)))
                }
            }
            Q6_K => {
                let low = bits(widen(block.add(64 * g + 32 * (t % 2) + l)), 4 * (t / 2), 0x0f);
                let high = bits(widen(block.add(128 + 32 * g + l)), 2 * t, 3);
                _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32::<4>(high)), _mm256_set1_epi32(32))
            }
            _ => {
                let q = bits(widen(block.add(8 + 16 * sub + 8 * (c % 2))), 4 * (c % 4 / 2), 0x0f);
                return _mm256_mul_ps(scale, iq4_levels(q));
            }
        };
        let w = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(q));
        if matches!(Q, Q2_K | Q4_K | Q5_K) {
            _mm256_sub_ps(w, _mm256_set1_ps(s.min[sub]))
        } else {
            w
        }
    }
}
