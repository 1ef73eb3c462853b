//! AVX2 decoding of the 256-weight super-blocks (Q2_K, Q3_K, Q4_K, Q5_K,
//! Q6_K, IQ4_XS) to float32, 8 weights at a time: each weight the same bits
//! as the `gguf` package's dequantization (`quant::dequantize_block`). A
//! sub-block's scale (and minimum) is one float32 product computed as the
//! reference computes it; the weight is then `scale * q` (minus `min`) as
//! two roundings, a multiply then a subtract: never an FMA, which would
//! round once and differ.

use std::arch::x86_64::*;

use crate::quant::{half, scale_iq4xs, scale_min_k4, scale_q3k, SUPER_BLOCK};
use crate::x86::{iq4_levels, quant, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K};

/// The 256 weights of the super-block at `block` into `out`.
///
/// # Safety
/// `block` holds a whole block of the type of const id `Q` (a super-block
/// type) and `out` room for 256 floats; the CPU runs AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn decode<const Q: u8>(block: *const u8, out: *mut f32) {
    // SAFETY: every read below is inside the block's `block_bytes` (the
    // offsets are the type's layout), every store inside out's 256 floats.
    unsafe {
        let b = std::slice::from_raw_parts(block, quant(Q).block_bytes());
        match Q {
            Q2_K => q2_k(b, out),
            Q3_K => q3_k(b, out),
            Q4_K | Q5_K => q4_k_q5_k::<Q>(b, out),
            Q6_K => q6_k(b, out),
            IQ4_XS => iq4_xs(b, out),
            _ => unreachable!("not a super-block type"),
        }
    }
}

/// Bytes `at..at + 8` of `b`, each widened to a 32-bit lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn widen(b: &[u8], at: usize) -> __m256i {
    let bytes: [u8; 8] = b[at..at + 8].try_into().expect("8 bytes");
    _mm256_cvtepu8_epi32(_mm_set_epi64x(0, i64::from_le_bytes(bytes)))
}

/// `(v >> shift) & mask` in every lane.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn bits(v: __m256i, shift: usize, mask: i32) -> __m256i {
    _mm256_and_si256(_mm256_srl_epi32(v, _mm_cvtsi32_si128(shift as i32)), _mm256_set1_epi32(mask))
}

/// Stores `scale * q - min` (two roundings, as the reference) at `out + at`.
///
/// # Safety
/// `out + at .. out + at + 8` is writable.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn store(out: *mut f32, at: usize, scale: f32, q: __m256i, min: Option<f32>) {
    let mut w = _mm256_mul_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(q));
    if let Some(min) = min {
        w = _mm256_sub_ps(w, _mm256_set1_ps(min));
    }
    // SAFETY: the caller's bound.
    unsafe { _mm256_storeu_ps(out.add(at), w) };
}

/// Q2_K: weight `e` is 2 bits of byte `16 + (e / 128) * 32 + e % 32` at
/// shift `2 * (e / 32 % 4)`; its sub-block of 16 has a 4-bit scale (low
/// nibble) and minimum (high nibble): `d * sc * q - dmin * m`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k(b: &[u8], out: *mut f32) {
    let (d, dmin) = (half(b, 80), half(b, 82));
    for e in (0..SUPER_BLOCK).step_by(8) {
        let q = bits(widen(b, 16 + (e / 128) * 32 + e % 32), 2 * (e / 32 % 4), 3);
        let sc = b[e / 16];
        // SAFETY: e + 8 <= 256.
        unsafe { store(out, e, d * f32::from(sc & 0x0f), q, Some(dmin * f32::from(sc >> 4))) };
    }
}

/// Q3_K: as Q2_K's 2 bits (from byte 32 on), less 4 where weight `e`'s bit
/// `e / 32` of mask byte `e % 32` is clear; a signed 6-bit scale per 16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k(b: &[u8], out: *mut f32) {
    let d = half(b, 108);
    for e in (0..SUPER_BLOCK).step_by(8) {
        let low = bits(widen(b, 32 + (e / 128) * 32 + e % 32), 2 * (e / 32 % 4), 3);
        let clear = _mm256_xor_si256(bits(widen(b, e % 32), e / 32, 1), _mm256_set1_epi32(1));
        let q = _mm256_sub_epi32(low, _mm256_slli_epi32::<2>(clear));
        // SAFETY: e + 8 <= 256.
        unsafe { store(out, e, d * f32::from(scale_q3k(&b[96..108], e / 16)), q, None) };
    }
}

/// Q4_K and Q5_K: sub-block `s` of 32 takes the low (even `s`) or high (odd)
/// nibbles of 32 bytes; Q5_K's fifth bit is bit `s` of byte `16 + e % 32`;
/// `d * sc * q - dmin * m` with 6-bit scale and minimum.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_q5_k<const Q: u8>(b: &[u8], out: *mut f32) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let qs = if Q == Q4_K { 16 } else { 48 };
    for s in 0..8 {
        let (sc, m) = scale_min_k4(&b[4..16], s);
        let (scale, min) = (d * f32::from(sc), dmin * f32::from(m));
        for c in 0..4 {
            let mut q = bits(widen(b, qs + (s / 2) * 32 + c * 8), 4 * (s % 2), 0x0f);
            if Q == Q5_K {
                q = _mm256_or_si256(q, _mm256_slli_epi32::<4>(bits(widen(b, 16 + c * 8), s, 1)));
            }
            // SAFETY: s * 32 + c * 8 + 8 <= 256.
            unsafe { store(out, s * 32 + c * 8, scale, q, Some(min)) };
        }
    }
}

/// Q6_K: weight `e` (group `g = e / 128`, `t = e / 32 % 4`, `l = e % 32`)
/// is a nibble of byte `g * 64 + (t % 2) * 32 + l` (high for `t >= 2`) and
/// 2 bits of byte `128 + g * 32 + l` at shift `2t`, less 32; an i8 scale per 16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k(b: &[u8], out: *mut f32) {
    let d = half(b, 208);
    for e in (0..SUPER_BLOCK).step_by(8) {
        let (g, t, l) = (e / 128, e / 32 % 4, e % 32);
        let low = bits(widen(b, g * 64 + (t % 2) * 32 + l), 4 * (t / 2), 0x0f);
        let high = bits(widen(b, 128 + g * 32 + l), 2 * t, 3);
        let q = _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32::<4>(high)), _mm256_set1_epi32(32));
        // SAFETY: e + 8 <= 256.
        unsafe { store(out, e, d * f32::from(b[192 + e / 16] as i8), q, None) };
    }
}

/// IQ4_XS: sub-block `s` of 32 takes the low then high nibbles of bytes
/// `8 + 16s ..`, each an index into IQ4_NL's levels; a signed 6-bit scale per 32.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_xs(b: &[u8], out: *mut f32) {
    let d = half(b, 0);
    for s in 0..8 {
        let scale = _mm256_set1_ps(d * f32::from(scale_iq4xs(b, s)));
        for c in 0..4 {
            let q = bits(widen(b, 8 + s * 16 + (c % 2) * 8), 4 * (c / 2), 0x0f);
            // SAFETY: s * 32 + c * 8 + 8 <= 256.
            unsafe { _mm256_storeu_ps(out.add(s * 32 + c * 8), _mm256_mul_ps(scale, iq4_levels(q))) };
        }
    }
}
