//! What the x86 paths (`x86.rs`, `avx512.rs`, `super_blocks.rs` and their
//! panel loop, `panel.rs`) know of one call: its operands, and the type
//! behind a const type id (`QuantType`'s `repr`, a const generic parameter
//! there).

use crate::quant::QuantType;

/// The operands: `x` is `m x k`, `w` `n` rows of blocks, `y` `m x n`.
pub(crate) struct Args {
    pub(crate) x: *const f32,
    pub(crate) w: *const u8,
    pub(crate) y: *mut f32,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
}

/// The type of const id `q`.
pub(crate) const fn quant(q: u8) -> QuantType {
    QuantType::ALL[q as usize]
}

/// Bytes of a block of the type of const id `q`.
pub(crate) const fn block_bytes(q: u8) -> usize {
    quant(q).block_bytes()
}
