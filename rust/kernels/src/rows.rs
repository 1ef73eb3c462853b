//! Row ranges of a step's buffers, split across the kernels' thread pool.

use std::ops::Range;

use crate::Out;

/// Runs `f` over `0..rows` cut into ranges, on the pool's threads when
/// there are several.
pub(crate) fn for_row_ranges(rows: usize, threads: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
    if threads <= 1 || rows < 2 {
        return f(0..rows);
    }
    let parts = crate::parts_for(threads).min(rows);
    crate::pool::run(parts, threads, &|p| f(rows * p / parts..rows * (p + 1) / parts));
}

/// Rows `rows` (of `width`) of the buffer at `base`.
///
/// # Safety
/// The rows are inside the buffer and no other thread touches them.
pub(crate) unsafe fn rows_of<'o>(base: Out, rows: &Range<usize>, width: usize) -> &'o mut [f32] {
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts_mut(base.0.add(rows.start * width), rows.len() * width) }
}
