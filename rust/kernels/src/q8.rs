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
}

impl Q8Rows {
    /// `x` (`m x k`, `k` a multiple of `block`, `block` a multiple of 32)
    /// quantized block by block; with what `int8_vnni.rs`'s panels read
    /// besides where `for_panels`.
    pub(crate) fn quantize(x: &[f32], block: usize, for_panels: bool) -> Q8Rows {
        let mut qs = vec![0i8; x.len()];
        let mut d = Vec::with_capacity(x.len() / block);
        for (xs, q) in x.chunks_exact(block).zip(qs.chunks_exact_mut(block)) {
            let amax = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let scale = amax / 127.0;
            let inverse = if scale == 0.0 { 0.0 } else { 1.0 / scale };
            for (q, v) in q.iter_mut().zip(xs) {
                *q = (v * inverse).round().clamp(-127.0, 127.0) as i8;
            }
            d.push(scale);
        }
        let sums: Vec<i16> = qs.chunks_exact(32).map(|q| q.iter().map(|&v| i16::from(v)).sum()).collect();
        let (biased, scaled_sums) = if for_panels {
            let per_block = block / 32;
            (
                qs.iter().map(|&q| (q as u8) ^ 0x80).collect(),
                sums.iter().enumerate().map(|(s, &sum)| d[s / per_block] * f32::from(sum)).collect(),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        Q8Rows { qs, d, sums, biased, scaled_sums }
    }
}
