//! The GGUF weight formats the kernels read, and their dequantization to
//! float32 exactly as the `gguf` Python package (ggml's reference) does:
//! the same float32 operations in the same order, so every weight has the
//! same bits.

/// Weights per block of the legacy formats (Q8_0, Q4_0, ...), and the
/// grouping of the 16-bit formats the kernels read 32 at a time.
pub const BLOCK: usize = 32;
/// Weights per super-block of the K-quants and IQ4_XS.
pub const SUPER_BLOCK: usize = 256;

/// IQ4_NL's and IQ4_XS's 16 non-linear levels.
pub(crate) const IQ4_LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// A GGUF weight type the kernels read in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QuantType {
    /// 34 bytes: f16 `d`, 32 x i8 `q`; `w = q * d`.
    Q8_0,
    /// 18 bytes: f16 `d`, 16 bytes of nibbles; `w = (q - 8) * d`.
    Q4_0,
    /// 20 bytes: f16 `d`, f16 `m`, 16 bytes of nibbles; `w = q * d + m`.
    Q4_1,
    /// 22 bytes: f16 `d`, 32 high bits, 16 bytes of nibbles; `w = (q - 16) * d`.
    Q5_0,
    /// 24 bytes: f16 `d`, f16 `m`, 32 high bits, 16 bytes of nibbles; `w = q * d + m`.
    Q5_1,
    /// 18 bytes: f16 `d`, 16 bytes of nibbles indexing `IQ4_LEVELS`; `w = d * level`.
    Iq4Nl,
    /// IEEE half precision, read 32 weights (64 bytes) at a time.
    F16,
    /// bfloat16, read 32 weights (64 bytes) at a time.
    Bf16,
    /// 84 bytes per 256: 16 4-bit scale/min pairs, 2-bit quants, f16 `d`, `dmin`.
    Q2K,
    /// 110 bytes per 256: high-bit mask, 2-bit quants, 16 6-bit scales, f16 `d`.
    Q3K,
    /// 144 bytes per 256: f16 `d`, `dmin`, 8 6-bit scale/min pairs, 4-bit quants.
    Q4K,
    /// 176 bytes per 256: as Q4_K with a fifth bit per weight.
    Q5K,
    /// 210 bytes per 256: 4 low and 2 high bits per weight, 16 i8 scales, f16 `d`.
    Q6K,
    /// 136 bytes per 256: f16 `d`, 8 6-bit scales, nibbles indexing `IQ4_LEVELS`.
    Iq4Xs,
}

impl QuantType {
    /// Every type, in `repr` order.
    pub const ALL: [QuantType; 14] = [
        QuantType::Q8_0,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Iq4Nl,
        QuantType::F16,
        QuantType::Bf16,
        QuantType::Q2K,
        QuantType::Q3K,
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
        QuantType::Iq4Xs,
    ];

    /// The type of ggml type id `id` (GGUF's tensor type), if the kernels read it.
    pub fn from_ggml(id: u32) -> Option<QuantType> {
        QuantType::ALL.into_iter().find(|q| q.ggml_id() == id)
    }

    /// The ggml type id (GGUF's tensor type).
    pub const fn ggml_id(self) -> u32 {
        match self {
            QuantType::F16 => 1,
            QuantType::Q4_0 => 2,
            QuantType::Q4_1 => 3,
            QuantType::Q5_0 => 6,
            QuantType::Q5_1 => 7,
            QuantType::Q8_0 => 8,
            QuantType::Q2K => 10,
            QuantType::Q3K => 11,
            QuantType::Q4K => 12,
            QuantType::Q5K => 13,
            QuantType::Q6K => 14,
            QuantType::Iq4Nl => 20,
            QuantType::Iq4Xs => 23,
            QuantType::Bf16 => 30,
        }
    }

    /// ggml's name of the type (`Q4_K`, `IQ4_NL`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q5_0 => "Q5_0",
            QuantType::Q5_1 => "Q5_1",
            QuantType::Iq4Nl => "IQ4_NL",
            QuantType::F16 => "F16",
            QuantType::Bf16 => "BF16",
            QuantType::Q2K => "Q2_K",
            QuantType::Q3K => "Q3_K",
            QuantType::Q4K => "Q4_K",
            QuantType::Q5K => "Q5_K",
            QuantType::Q6K => "Q6_K",
            QuantType::Iq4Xs => "IQ4_XS",
        }
    }

    /// Weights per block: 256 for the K-quants and IQ4_XS, else 32.
    pub const fn block_elems(self) -> usize {
        if self.is_super_block() {
            SUPER_BLOCK
        } else {
            BLOCK
        }
    }

    /// Whether blocks are 256-weight super-blocks.
    pub const fn is_super_block(self) -> bool {
        matches!(
            self,
            QuantType::Q2K | QuantType::Q3K | QuantType::Q4K | QuantType::Q5K | QuantType::Q6K | QuantType::Iq4Xs
        )
    }

    /// Bytes of one block.
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantType::Q8_0 => 34,
            QuantType::Q4_0 | QuantType::Iq4Nl => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q5_0 => 22,
            QuantType::Q5_1 => 24,
            QuantType::F16 | QuantType::Bf16 => 64,
            QuantType::Q2K => 84,
            QuantType::Q3K => 110,
            QuantType::Q4K => 144,
            QuantType::Q5K => 176,
            QuantType::Q6K => 210,
            QuantType::Iq4Xs => 136,
        }
    }

    /// Bytes of a row of `k` weights (`k` a multiple of `block_elems`).
    pub const fn row_bytes(self, k: usize) -> usize {
        k / self.block_elems() * self.block_bytes()
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

/// The 6-bit scale and minimum of sub-block `j` (0..8) of Q4_K and Q5_K,
/// unpacked from their 12 bytes as ggml's `get_scale_min_k4`.
pub(crate) fn scale_min_k4(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        ((scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4), (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))
    }
}

/// The signed 6-bit scale of sub-block `i` (0..16) of Q3_K.
pub(crate) fn scale_q3k(scales: &[u8], i: usize) -> i8 {
    let low = if i < 8 { scales[i] & 0x0f } else { scales[i - 8] >> 4 };
    let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

/// The signed 6-bit scale of sub-block `i` (0..8) of IQ4_XS.
pub(crate) fn scale_iq4xs(block: &[u8], i: usize) -> i8 {
    let high = u16::from_le_bytes([block[2], block[3]]);
    let low = (block[4 + i / 2] >> (4 * (i % 2))) & 0x0f;
    (low | ((((high >> (2 * i)) & 3) as u8) << 4)) as i8 - 32
}

/// One block's weights (`out.len()` is the type's `block_elems`), as the
/// `gguf` package dequantizes them.
pub(crate) fn dequantize_block(quant: QuantType, block: &[u8], out: &mut [f32]) {
    let nibbles = |start: usize, out: &mut [f32], f: &dyn Fn(u8) -> f32| {
        // Low nibbles of the 16 bytes are weights 0..16, high ones 16..32.
        for (i, &b) in block[start..start + 16].iter().enumerate() {
            out[i] = f(b & 0x0f);
            out[i + 16] = f(b >> 4);
        }
    };
    let fifth = |at: usize| {
        let qh = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
        move |e: usize| (((qh >> e) & 1) as u8) << 4
    };
    match quant {
        QuantType::Q8_0 => {
            let d = half(block, 0);
            for (o, &q) in out.iter_mut().zip(&block[2..34]) {
                *o = f32::from(q as i8) * d;
            }
        }
        QuantType::Q4_0 => {
            let d = half(block, 0);
            nibbles(2, out, &|q| f32::from(q as i8 - 8) * d);
        }
        QuantType::Q4_1 => {
            let (d, m) = (half(block, 0), half(block, 2));
            nibbles(4, out, &|q| f32::from(q) * d + m);
        }
        QuantType::Q5_0 => {
            let (d, high) = (half(block, 0), fifth(2));
            for (i, &b) in block[6..22].iter().enumerate() {
                out[i] = f32::from(((b & 0x0f) | high(i)) as i8 - 16) * d;
                out[i + 16] = f32::from(((b >> 4) | high(i + 16)) as i8 - 16) * d;
            }
        }
        QuantType::Q5_1 => {
            let (d, m, high) = (half(block, 0), half(block, 2), fifth(4));
            for (i, &b) in block[8..24].iter().enumerate() {
                out[i] = f32::from((b & 0x0f) | high(i)) * d + m;
                out[i + 16] = f32::from((b >> 4) | high(i + 16)) * d + m;
            }
        }
        QuantType::Iq4Nl => {
            let d = half(block, 0);
            nibbles(2, out, &|q| d * f32::from(IQ4_LEVELS[usize::from(q)]));
        }
        QuantType::F16 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = half(block, 2 * i);
            }
        }
        QuantType::Bf16 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([block[2 * i], block[2 * i + 1]])) << 16);
            }
        }
        QuantType::Q2K => {
            let (d, dmin) = (half(block, 80), half(block, 82));
            for (e, o) in out.iter_mut().enumerate() {
                let (group, shift, l) = (e / 128, (e / 32) % 4, e % 32);
                let q = (block[16 + group * 32 + l] >> (2 * shift)) & 3;
                let sc = block[e / 16];
                *o = d * f32::from(sc & 0x0f) * f32::from(q) - dmin * f32::from(sc >> 4);
            }
        }
        QuantType::Q3K => {
            let d = half(block, 108);
            for (e, o) in out.iter_mut().enumerate() {
                let (group, shift, l) = (e / 128, (e / 32) % 4, e % 32);
                let low = ((block[32 + group * 32 + l] >> (2 * shift)) & 3) as i8;
                let high = (block[l] >> (e / 32)) & 1;
                let q = if high == 0 { low - 4 } else { low };
                *o = d * f32::from(scale_q3k(&block[96..108], e / 16)) * f32::from(q);
            }
        }
        QuantType::Q4K | QuantType::Q5K => {
            let (d, dmin) = (half(block, 0), half(block, 2));
            let qs = if quant == QuantType::Q4K { 16 } else { 48 };
            for (e, o) in out.iter_mut().enumerate() {
                let (sub, l) = (e / 32, e % 32);
                let (sc, m) = scale_min_k4(&block[4..16], sub);
                let mut q = (block[qs + (sub / 2) * 32 + l] >> (4 * (sub % 2))) & 0x0f;
                if quant == QuantType::Q5K {
                    q |= ((block[16 + l] >> sub) & 1) << 4;
                }
                *o = d * f32::from(sc) * f32::from(q) - dmin * f32::from(m);
            }
        }
        QuantType::Q6K => {
            let d = half(block, 208);
            for (e, o) in out.iter_mut().enumerate() {
                let (group, t, l) = (e / 128, (e / 32) % 4, e % 32);
                let low = (block[group * 64 + (t % 2) * 32 + l] >> (4 * (t / 2))) & 0x0f;
                let high = (block[128 + group * 32 + l] >> (2 * t)) & 3;
                let q = (low | (high << 4)) as i8 - 32;
                *o = d * f32::from(block[192 + e / 16] as i8) * f32::from(q);
            }
        }
        QuantType::Iq4Xs => {
            let d = half(block, 0);
            for (e, o) in out.iter_mut().enumerate() {
                let (sub, l) = (e / 32, e % 32);
                let q = (block[8 + sub * 16 + l % 16] >> (4 * (l / 16))) & 0x0f;
                let dl = d * f32::from(scale_iq4xs(block, sub));
                *o = dl * f32::from(IQ4_LEVELS[usize::from(q)]);
            }
        }
    }
}

/// A row of raw blocks (`row.len()` a multiple of the block's bytes)
/// dequantized into `out` (the type's `block_elems` weights per block).
pub fn dequantize_row(quant: QuantType, row: &[u8], out: &mut [f32]) {
    let (bytes, elems) = (quant.block_bytes(), quant.block_elems());
    assert_eq!(row.len() % bytes, 0, "a row is whole blocks");
    assert_eq!(out.len(), row.len() / bytes * elems, "out holds the row's weights");
    for (raw, dst) in row.chunks_exact(bytes).zip(out.chunks_exact_mut(elems)) {
        dequantize_block(quant, raw, dst);
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

    #[test]
    fn the_fifth_bit_of_q5_0_is_bit_e_of_qh() {
        // d = 1, every nibble 0, qh with bits 0 and 31 set: weights 0 and 31 are 16 - 16 = 0, the rest -16.
        let mut block = vec![0x00, 0x3c];
        block.extend(0x8000_0001u32.to_le_bytes());
        block.extend([0u8; 16]);
        let mut out = [0.0; BLOCK];
        dequantize_block(QuantType::Q5_0, &block, &mut out);
        assert_eq!((out[0], out[1], out[30], out[31]), (0.0, -16.0, -16.0, 0.0));
    }

    #[test]
    fn k4_scales_unpack_as_ggml() {
        // Sub-block 5: low 4 bits from byte 9, high 2 from byte 1's top bits; its min from byte 9's high nibble and byte 5's top bits.
        let mut scales = [0u8; 12];
        scales[1] = 0b1100_0000;
        scales[5] = 0b0100_0000;
        scales[9] = 0x7a;
        assert_eq!(scale_min_k4(&scales, 5), (0x3a, 0x17));
        assert_eq!(scale_min_k4(&scales, 1), (0, 0));
    }

    #[test]
    fn type_ids_and_sizes_are_ggmls() {
        for q in QuantType::ALL {
            assert_eq!(QuantType::from_ggml(q.ggml_id()), Some(q));
            assert_eq!(QuantType::ALL[q as usize], q);
        }
        assert_eq!(QuantType::from_ggml(0), None);
        assert_eq!(QuantType::Q4K.row_bytes(512), 288);
        assert_eq!(QuantType::Q5_0.row_bytes(64), 44);
    }
}
