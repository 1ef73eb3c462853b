//! The portable path: each block dequantized to float32, then one dot
//! product per activation row, accumulated in float32 in index order. Every
//! CPU runs it; the tests take it as the reference of the SIMD path.

use crate::quant::dequantize_row;
use crate::{Dims, Job};

/// Columns `cols` of `y = x · W^T`.
///
/// # Safety
/// The shapes are checked (`check_shapes`), `y` points to `m * n` floats and
/// no other thread writes columns `cols` of it.
pub(crate) unsafe fn matmul(job: &Job<'_>, cols: std::ops::Range<usize>) {
    let Job { quant, x, w, y, dims, .. } = *job;
    let (y, Dims { m, n, k }) = (y.0, dims);
    let row_bytes = quant.row_bytes(k);
    let mut weights = vec![0.0f32; k];
    for j in cols {
        dequantize_row(quant, &w[j * row_bytes..(j + 1) * row_bytes], &mut weights);
        for i in 0..m {
            let dot = x[i * k..(i + 1) * k].iter().zip(&weights).fold(0.0f32, |acc, (a, b)| acc + a * b);
            // SAFETY: i < m and j < n, and column j is this thread's.
            unsafe { *y.add(i * n + j) = dot };
        }
    }
}
