//! The KV cache's element types: float32, or 16 bits a value (IEEE half
//! precision or bfloat16, `--kv-cache-dtype float16|bfloat16`), which halve
//! the cache's memory and the bytes attention reads. Values are rounded to
//! 16 bits when written (to nearest, ties to even, as torch's `.to()`
//! rounds) and widened to float32 exactly when read, so attention computes
//! in float32 on the rounded keys and values.

/// A layer's keys or values, `[slots, kv_heads, head_dim]`, read.
#[derive(Debug, Clone, Copy)]
pub enum KvCache<'a> {
    /// Float32 values.
    F32(&'a [f32]),
    /// IEEE half-precision bits.
    F16(&'a [u16]),
    /// bfloat16 bits.
    Bf16(&'a [u16]),
}

/// A layer's keys or values, written.
#[derive(Debug)]
pub enum KvCacheMut<'a> {
    /// Float32 values.
    F32(&'a mut [f32]),
    /// IEEE half-precision bits.
    F16(&'a mut [u16]),
    /// bfloat16 bits.
    Bf16(&'a mut [u16]),
}

impl<'a> KvCache<'a> {
    /// Values held.
    pub fn len(&self) -> usize {
        match self {
            KvCache::F32(c) => c.len(),
            KvCache::F16(c) | KvCache::Bf16(c) => c.len(),
        }
    }

    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether both caches hold the same type.
    pub(crate) fn same_type(&self, other: &KvCache<'_>) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }

    /// The `kv_row` values of `slot` as float32: the cache's own row for
    /// float32, else widened into `buf` (`kv_row` floats).
    ///
    /// # Safety
    /// The slot is inside the cache; with `SIMD` the CPU has AVX2 and F16C.
    #[inline(always)]
    pub(crate) unsafe fn row<'b, const SIMD: bool>(self, slot: i64, kv_row: usize, buf: &'b mut [f32]) -> &'b [f32]
    where
        'a: 'b,
    {
        let at = slot as usize * kv_row;
        match self {
            KvCache::F32(c) => &c[at..at + kv_row],
            KvCache::F16(c) => {
                // SAFETY: forwarded.
                unsafe { widen_f16::<SIMD>(&c[at..at + kv_row], buf) };
                buf
            }
            KvCache::Bf16(c) => {
                widen_bf16(&c[at..at + kv_row], buf);
                buf
            }
        }
    }

    /// The address and byte length of `slot`'s row (for prefetching).
    #[inline(always)]
    pub(crate) fn row_bytes(self, slot: i64, kv_row: usize) -> (*const u8, usize) {
        let at = slot as usize * kv_row;
        match self {
            KvCache::F32(c) => (c[at..].as_ptr().cast(), kv_row * 4),
            KvCache::F16(c) | KvCache::Bf16(c) => (c[at..].as_ptr().cast(), kv_row * 2),
        }
    }
}

impl KvCacheMut<'_> {
    /// The cache, to read.
    pub fn as_ref(&self) -> KvCache<'_> {
        match self {
            KvCacheMut::F32(c) => KvCache::F32(c),
            KvCacheMut::F16(c) => KvCache::F16(c),
            KvCacheMut::Bf16(c) => KvCache::Bf16(c),
        }
    }

    /// Writes `row` (`row.len()` values) to `slot`, rounded to the cache's type.
    pub fn write_row(&mut self, slot: i64, row: &[f32]) {
        let at = slot as usize * row.len();
        match self {
            KvCacheMut::F32(c) => c[at..at + row.len()].copy_from_slice(row),
            KvCacheMut::F16(c) => c[at..at + row.len()].iter_mut().zip(row).for_each(|(o, &v)| *o = f32_to_f16(v)),
            KvCacheMut::Bf16(c) => c[at..at + row.len()].iter_mut().zip(row).for_each(|(o, &v)| *o = f32_to_bf16(v)),
        }
    }
}

/// `x` rounded to bfloat16 (to nearest, ties to even; NaN to 0x7fc0, as torch).
pub fn f32_to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fc0 | ((x.to_bits() >> 16) as u16 & 0x8000);
    }
    let bits = x.to_bits();
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// `x` rounded to IEEE half precision (to nearest, ties to even; overflow
/// to infinity, tiny values to subnormals or zero), as F16C's
/// `vcvtps2ph` with round-to-nearest and torch's `.half()` give it.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        // Infinity, or NaN kept quiet with the top of its payload.
        return sign | 0x7c00 | if man != 0 { 0x200 | (man >> 13) as u16 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        // A subnormal half: the 24-bit significand in units of 2^-24.
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let rounded = (m + (1 << (shift - 1)) - 1 + ((m >> shift) & 1)) >> shift;
        return sign | rounded as u16;
    }
    // A carry out of the mantissa raises the exponent (to infinity at the top): still right.
    let rounded = man + 0xfff + ((man >> 13) & 1);
    sign | (((e as u32) << 10) + (rounded >> 13)) as u16
}

/// Half-precision bits to float32 (exact): 8 at a time with F16C under `SIMD`.
///
/// # Safety
/// With `SIMD` the CPU has AVX2 and F16C.
#[inline(always)]
unsafe fn widen_f16<const SIMD: bool>(src: &[u16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if SIMD {
        use std::arch::x86_64::*;
        let done = dst.len() / 8 * 8;
        for (out, bits) in dst.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
            // SAFETY: 8 halves in, 8 floats out; F16C is the caller's promise.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(bits.as_ptr().cast()))) };
        }
        dst[done..].iter_mut().zip(&src[done..]).for_each(|(o, &b)| *o = crate::quant::f16_to_f32(b));
        return;
    }
    dst.iter_mut().zip(src).for_each(|(o, &b)| *o = crate::quant::f16_to_f32(b));
}

/// bfloat16 bits to float32 (exact: the bits are float32's top half).
#[inline(always)]
fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    dst.iter_mut().zip(src).for_each(|(o, &b)| *o = f32::from_bits(u32::from(b) << 16));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Float32 values of every kind: random bits, halfway cases, the edges
    /// of half precision's range.
    fn values() -> Vec<f32> {
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut values: Vec<f32> = (0..200_000)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                f32::from_bits((state >> 32) as u32)
            })
            .collect();
        for e in -30..20 {
            for m in [0x1000u32, 0x3000, 0x2000, 0x1fff, 0x0001] {
                values.push(f32::from_bits((((e + 127) as u32) << 23) | m));
                values.push(-f32::from_bits((((e + 127) as u32) << 23) | m));
            }
        }
        values.extend([0.0, -0.0, 65504.0, 65520.0, 65519.99, 6.0e-8, 2.98e-8, 2.9802322e-8, f32::INFINITY]);
        values
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16_rounding_equals_f16c() {
        use std::arch::x86_64::*;
        if !is_x86_feature_detected!("f16c") {
            eprintln!("no F16C: the software rounding is not compared with it");
            return;
        }
        for v in values() {
            // SAFETY: F16C is present (checked above).
            let hardware = unsafe { _mm_extract_epi16::<0>(_mm_cvtps_ph::<0>(_mm_set1_ps(v))) } as u16;
            let ours = f32_to_f16(v);
            if v.is_nan() {
                assert_eq!(ours & 0x7c00, 0x7c00, "{v:?}");
                assert_ne!(ours & 0x3ff, 0, "{v:?}");
            } else {
                assert_eq!(ours, hardware, "{v:e} ({:#x})", v.to_bits());
            }
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_widens_back_exactly() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // a tie: down to even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82); // a tie: up to even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(f32::NAN), 0x7fc0);
        // Normal values keep 8 significant bits (subnormals fewer, as in float32).
        for v in values().into_iter().filter(|v| v.is_normal()) {
            let mut back = [0.0f32];
            widen_bf16(&[f32_to_bf16(v)], &mut back);
            let error = (back[0] as f64 - v as f64).abs();
            assert!(back[0].is_infinite() || error <= (v.abs() as f64) / 256.0, "{v:e} -> {}", back[0]);
        }
    }

    #[test]
    fn rows_widen_as_written() {
        let row: Vec<f32> = (0..19).map(|i| i as f32 * 0.37 - 3.0).collect();
        for make in [0, 1] {
            let mut bits = vec![0u16; 2 * 19];
            let mut cache = if make == 0 { KvCacheMut::F16(&mut bits) } else { KvCacheMut::Bf16(&mut bits) };
            cache.write_row(1, &row);
            let mut buf = vec![0.0f32; 19];
            for simd in [false, true] {
                if simd && !crate::Path::supported().contains(&crate::Path::Avx2) {
                    continue;
                }
                // SAFETY: slot 1 of 2; the SIMD path only where the CPU has it.
                let got = unsafe {
                    if simd {
                        cache.as_ref().row::<true>(1, 19, &mut buf).to_vec()
                    } else {
                        cache.as_ref().row::<false>(1, 19, &mut buf).to_vec()
                    }
                };
                for (g, v) in got.iter().zip(&row) {
                    let want = if make == 0 {
                        crate::quant::f16_to_f32(f32_to_f16(*v))
                    } else {
                        f32::from_bits(u32::from(f32_to_bf16(*v)) << 16)
                    };
                    assert_eq!(g.to_bits(), want.to_bits());
                }
            }
        }
    }
}
