//! The GGUF block formats the kernels read, and their dequantization to
//! float32 exactly as ggml's reference (and the `gguf` Python package) does.

/// Weights per block, for every supported type.
pub const BLOCK: usize = 32;

/// A GGUF block-quantized type the kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantType {
    /// 34 bytes: f16 `d`, 32 x i8 `q`; `w = q * d`.
    Q8_0,
    /// 18 bytes: f16 `d`, 16 bytes of nibbles; `w = (q - 8) * d`.
    Q4_0,
    /// 20 bytes: f16 `d`, f16 `m`, 16 bytes of nibbles; `w = q * d + m`.
    Q4_1,
}

impl QuantType {
    /// The type of ggml type id `id` (GGUF's tensor type), if supported.
    pub fn from_ggml(id: u32) -> Option<QuantType> {
        match id {
            2 => Some(QuantType::Q4_0),
            3 => Some(QuantType::Q4_1),
            8 => Some(QuantType::Q8_0),
            _ => None,
        }
    }

    /// Bytes of one block of 32 weights.
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantType::Q8_0 => 34,
            QuantType::Q4_0 => 18,
            QuantType::Q4_1 => 20,
        }
    }

    /// Bytes of a row of `k` weights (`k` a multiple of 32).
    pub const fn row_bytes(self, k: usize) -> usize {
        k / BLOCK * self.block_bytes()
    }
}

/// IEEE half precision bits to float32 (exact; subnormals, infinities and
/// NaN included), for CPUs without F16C.
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits >> 15) << 31;
    let exp = u32::from((bits >> 10) & 0x1f);
    let man = u32::from(bits & 0x3ff);
    let magnitude = match (exp, man) {
        (0, 0) => 0,
        // Subnormal: man * 2^-24, exact in float32.
        (0, _) => (man as f32 * f32::from_bits(0x3380_0000)).to_bits(),
        (0x1f, _) => 0x7f80_0000 | (man << 13),
        _ => ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// The f16 at `bytes[at..at + 2]` (little endian) as float32.
pub(crate) fn half(bytes: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// One block's 32 weights, as ggml dequantizes them: the low nibbles of the
/// 16 bytes are elements 0..15, the high nibbles elements 16..31.
pub(crate) fn dequantize_block(quant: QuantType, block: &[u8], out: &mut [f32; BLOCK]) {
    let d = half(block, 0);
    match quant {
        QuantType::Q8_0 => {
            for (o, &q) in out.iter_mut().zip(&block[2..34]) {
                *o = f32::from(q as i8) * d;
            }
        }
        QuantType::Q4_0 => {
            for (i, &b) in block[2..18].iter().enumerate() {
                out[i] = f32::from((b & 0x0f) as i8 - 8) * d;
                out[i + 16] = f32::from((b >> 4) as i8 - 8) * d;
            }
        }
        QuantType::Q4_1 => {
            let m = half(block, 2);
            for (i, &b) in block[4..20].iter().enumerate() {
                out[i] = f32::from(b & 0x0f) * d + m;
                out[i + 16] = f32::from(b >> 4) * d + m;
            }
        }
    }
}

/// A row of raw blocks (`row.len()` a multiple of the block size) dequantized
/// into `out` (32 weights per block).
pub fn dequantize_row(quant: QuantType, row: &[u8], out: &mut [f32]) {
    let bytes = quant.block_bytes();
    assert_eq!(row.len() % bytes, 0, "a row is whole blocks");
    assert_eq!(out.len(), row.len() / bytes * BLOCK, "out holds the row's weights");
    let mut block = [0.0; BLOCK];
    for (raw, dst) in row.chunks_exact(bytes).zip(out.chunks_exact_mut(BLOCK)) {
        dequantize_block(quant, raw, &mut block);
        dst.copy_from_slice(&block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_convert_exactly() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8001), -(2f32.powi(-24)));
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
    }

    #[test]
    fn nibbles_are_low_first_then_high() {
        // d = 1, m = 0.5; byte i holds low nibble i % 16 and high nibble 15 - i % 16.
        let mut block = vec![0x00, 0x3c, 0x00, 0x38];
        block.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
        let mut out = [0.0; BLOCK];
        dequantize_block(QuantType::Q4_1, &block, &mut out);
        for i in 0..16 {
            assert_eq!(out[i], i as f32 + 0.5);
            assert_eq!(out[i + 16], (15 - i) as f32 + 0.5);
        }
        let q4_0: Vec<u8> = [0x00, 0x40].into_iter().chain(block[4..].iter().copied()).collect();
        dequantize_block(QuantType::Q4_0, &q4_0, &mut out);
        assert_eq!(out[0], -16.0);
        assert_eq!(out[16], 14.0);
    }
}
