//! Random weight blocks and activations, shared by the matmul and int8 tests.

use crate::common::Rng;
use vllm_rs_kernels::QuantType;

/// Where a block of `quant` keeps its f16 scales (and minimums).
fn scale_offsets(quant: QuantType) -> &'static [usize] {
    match quant {
        QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K | QuantType::Q5K => &[0, 2],
        QuantType::Q2K => &[80, 82],
        QuantType::Q3K => &[108],
        QuantType::Q6K => &[208],
        QuantType::F16 | QuantType::Bf16 => &[],
        _ => &[0],
    }
}

/// A random block: finite f16 scales in a realistic range, random quants;
/// F16 and BF16 blocks are 32 random finite values.
fn block(quant: QuantType, rng: &mut Rng) -> Vec<u8> {
    let half = |rng: &mut Rng| {
        // Sign, exponent 5..=19 (about 2^-10 .. 2^4), random mantissa.
        let bits = (rng.below(2) << 15) | ((5 + rng.below(15)) << 10) | rng.below(1024);
        (bits as u16).to_le_bytes()
    };
    let mut out: Vec<u8> = (0..quant.block_bytes()).map(|_| rng.next() as u8).collect();
    match quant {
        QuantType::F16 => out.chunks_exact_mut(2).for_each(|v| v.copy_from_slice(&half(rng))),
        // Sign, exponent 2^-10 .. 2^4, 7 random mantissa bits.
        QuantType::Bf16 => out.chunks_exact_mut(2).for_each(|v| {
            let bits = (rng.below(2) << 15) | ((117 + rng.below(15)) << 7) | rng.below(128);
            v.copy_from_slice(&(bits as u16).to_le_bytes());
        }),
        _ => scale_offsets(quant).iter().for_each(|&at| out[at..at + 2].copy_from_slice(&half(rng))),
    }
    out
}

/// `x[m,k]` and `w` (n rows of blocks) from a seed.
pub fn operands(quant: QuantType, m: usize, n: usize, k: usize, seed: u64) -> (Vec<f32>, Vec<u8>) {
    let mut rng = Rng(seed);
    let x = (0..m * k).map(|_| rng.float()).collect();
    let w = (0..n * k / quant.block_elems()).flat_map(|_| block(quant, &mut rng)).collect();
    (x, w)
}
