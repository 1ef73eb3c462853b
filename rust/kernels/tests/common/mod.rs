//! What the kernels' integration tests share.

use vllm_rs_kernels::Path;

/// The kernel paths this CPU can run: the scalar one always, the AVX2 and
/// AVX-512 ones where the CPU has them (said on stderr where it has neither).
pub fn paths() -> Vec<Path> {
    let paths = Path::supported();
    if paths.len() == 1 {
        eprintln!("this CPU has no AVX2+FMA+F16C: only the scalar path is tested");
    }
    paths
}

/// splitmix64: reproducible operands from a seed without an RNG crate.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A float in [-2, 2).
    pub fn float(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    }
}
