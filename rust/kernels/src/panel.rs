//! The panel loop of the AVX2 and AVX-512 paths, written once over the
//! vector width (`Width`): PANEL_ROWS weight rows decoded once into a
//! float32 scratch that stays in L1, then multiplied by register tiles of a
//! few activation rows, so decoding is paid once per weight row however many
//! activation rows there are. Each path implements `Width` (its vector, its
//! decoding, its tile sizes) and keeps its own `#[target_feature]` entry
//! point, into which this loop is inlined (`#[inline(always)]`) and compiled
//! for that path's features.

use std::arch::x86_64::__m128;

use crate::operands::{quant, Args};

/// Weight rows per panel: the 4 outputs of an activation row are reduced
/// together and stored as one vector.
pub(crate) const PANEL_ROWS: usize = 4;
/// Bytes of activations a panel pass keeps hot (half a 512 KiB L2).
pub(crate) const PANEL_X_BYTES: usize = 256 << 10;

/// A vector width and what a path does at that width. Every method runs
/// only on a CPU that has the path's features (its implementations enable
/// them), hence `unsafe`.
pub(crate) trait Width {
    /// A vector of `LANES` float32.
    type V: Copy;
    /// Floats per vector.
    const LANES: usize;
    /// Activation rows per full register tile.
    const TILE_M: usize;
    /// The fewest activation rows in a block of them kept in L2 (before
    /// rounding down to whole tiles).
    const MIN_BLOCK_ROWS: usize;

    /// A vector of zeros.
    unsafe fn zero() -> Self::V;
    /// `LANES` floats from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self::V;
    /// `a * b + c`, fused.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// The lane sums of PANEL_ROWS accumulators, as one vector of 4.
    unsafe fn sums(v: &[Self::V; PANEL_ROWS]) -> __m128;
    /// The `k` weights of the row of blocks at `row` into `dst`, as float32.
    unsafe fn decode_row<const Q: u8>(row: *const u8, k: usize, dst: *mut f32);
    /// Activation rows `i0..i1` times the panel at `w`, as register tiles
    /// (`panel_tile`) of the sizes this width runs best.
    unsafe fn tiles(a: &Args, w: *const f32, i0: usize, i1: usize, j: usize, cols: usize);
}

/// Columns `cols` of `y = x · W^T` for many activation rows: PANEL_ROWS
/// weight rows at a time decoded into the scratch, then multiplied by
/// `S::tiles`; weight rows outermost, each read from memory once per call
/// (per block of activation rows that stays in L2).
///
/// # Safety
/// As the path's `matmul`, and the CPU has `S`'s features; called from a
/// `#[target_feature]` function of that path.
#[inline(always)]
pub(crate) unsafe fn panels<S: Width, const Q: u8>(a: &Args, cols: std::ops::Range<usize>) {
    let row_bytes = quant(Q).row_bytes(a.k);
    // Rows past the end of `cols` stay zero: a last panel of fewer rows is
    // computed whole and only its own columns are stored.
    let mut scratch = vec![0.0f32; PANEL_ROWS * a.k];
    // Activation rows in blocks that stay in L2 while every weight row of
    // `cols` passes: prefill's thousands of rows would otherwise stream from
    // memory once per panel.
    let block_rows = (PANEL_X_BYTES / (4 * a.k)).clamp(S::MIN_BLOCK_ROWS, 256) / S::TILE_M * S::TILE_M;
    let mut i0 = 0;
    while i0 < a.m {
        let i1 = (i0 + block_rows).min(a.m);
        let mut j = cols.start;
        while j < cols.end {
            let rows = PANEL_ROWS.min(cols.end - j);
            // SAFETY: j + rows <= n, so every block read is inside w; the
            // scratch holds PANEL_ROWS rows of k floats; i1 <= m.
            unsafe {
                if rows < PANEL_ROWS {
                    scratch.fill(0.0);
                }
                for r in 0..rows {
                    S::decode_row::<Q>(a.w.add((j + r) * row_bytes), a.k, scratch.as_mut_ptr().add(r * a.k));
                }
                S::tiles(a, scratch.as_ptr(), i0, i1, j, rows);
            }
            j += rows;
        }
        i0 = i1;
    }
}

/// `y[i..i+MR, j..j+cols]` from the PANEL_ROWS decoded weight rows at `w`
/// (k floats each). Every output has one accumulator, summed over k in
/// order and reduced by `S::sums`, whatever MR and `cols`: an output's bits
/// do not depend on its place in the batch or on the thread split.
///
/// # Safety
/// i + MR <= m, j + cols <= n, cols <= PANEL_ROWS, `w` holds PANEL_ROWS rows
/// of k floats, and the CPU has `S`'s features.
#[inline(always)]
pub(crate) unsafe fn panel_tile<S: Width, const MR: usize>(a: &Args, w: *const f32, i: usize, j: usize, cols: usize) {
    // SAFETY: the caller's bounds and features.
    unsafe {
        let mut acc = [[S::zero(); PANEL_ROWS]; MR];
        let x = a.x.add(i * a.k);
        for kc in (0..a.k).step_by(S::LANES) {
            let mut xv = [S::zero(); MR];
            for (row, v) in xv.iter_mut().enumerate() {
                *v = S::load(x.add(row * a.k + kc));
            }
            for r in 0..PANEL_ROWS {
                let wv = S::load(w.add(r * a.k + kc));
                for (acc_row, xr) in acc.iter_mut().zip(&xv) {
                    acc_row[r] = S::fmadd(*xr, wv, acc_row[r]);
                }
            }
        }
        for (row, acc_row) in acc.iter().enumerate() {
            store_sums(a, S::sums(acc_row), i + row, j, cols);
        }
    }
}

/// `y[i, j..j+cols]` from the first `cols` lanes of `sums` (a panel's
/// outputs of one activation row).
///
/// # Safety
/// i < m and j + cols <= n, cols <= PANEL_ROWS.
#[inline(always)]
unsafe fn store_sums(a: &Args, sums: __m128, i: usize, j: usize, cols: usize) {
    // SAFETY: the caller's bounds keep the stores inside y.
    unsafe {
        let dst = a.y.add(i * a.n + j);
        if cols == PANEL_ROWS {
            std::arch::x86_64::_mm_storeu_ps(dst, sums);
        } else {
            let mut lanes = [0.0f32; PANEL_ROWS];
            std::arch::x86_64::_mm_storeu_ps(lanes.as_mut_ptr(), sums);
            std::ptr::copy_nonoverlapping(lanes.as_ptr(), dst, cols);
        }
    }
}
