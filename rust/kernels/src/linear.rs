//! What the decoder's dense layers and the routed experts share: a linear
//! layer over blocks read in place, its product for `matmuls`, and the
//! MLP's gated activation.

use crate::rows::{for_row_ranges, rows_of};
use crate::{Dims, Matmul, Out, Packed, QuantType};

/// A linear layer: `y = x · W^T (+ bias)`, `W` as `out_features` rows of
/// blocks of `quant` (read in place).
#[derive(Debug, Clone, Copy)]
pub struct Linear<'a> {
    /// The type of the blocks.
    pub quant: QuantType,
    /// The rows of blocks.
    pub rows: &'a [u8],
    /// Rows of `W`.
    pub out_features: usize,
    /// Weights per row.
    pub in_features: usize,
    /// Added to each output row, when the layer has one.
    pub bias: Option<&'a [f32]>,
    /// The same rows repacked for the int8 path (`Packed::new`), which its
    /// products read instead of `rows` at `Precision::Int8Activations`.
    pub packed: Option<&'a Packed>,
}

/// The activation of the MLP's gate, multiplied by its up projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(g) = g / (1 + exp(-g))` (SwiGLU: Llama and its kin).
    Silu,
    /// GELU's tanh approximation, `0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))`
    /// (GeGLU: Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
}

/// A `matmuls` product of `m` rows of `x` through `l` into `y`.
pub(crate) fn product<'a, 'y>(l: &Linear<'a>, x: &'a [f32], y: &'y mut [f32], m: usize) -> Matmul<'a, 'y> {
    Matmul { quant: l.quant, x, w: l.rows, y, dims: Dims { m, n: l.out_features, k: l.in_features }, packed: l.packed }
}

/// `gate = activation(gate) * up`, rows split across `threads`.
pub(crate) fn gated(gate: &mut [f32], up: &[f32], activation: Activation, threads: usize) {
    const CHUNK: usize = 4096;
    let gate_ptr = Out(gate.as_mut_ptr());
    for_row_ranges(gate.len().div_ceil(CHUNK), threads, &|chunks| {
        let range = chunks.start * CHUNK..(chunks.end * CHUNK).min(up.len());
        // SAFETY: each range of chunks is its own part of `gate`.
        let gate = unsafe { rows_of(gate_ptr, &range, 1) };
        match activation {
            Activation::Silu => gate.iter_mut().zip(&up[range]).for_each(|(g, &u)| *g = *g / (1.0 + (-*g).exp()) * u),
            Activation::GeluTanh => gate.iter_mut().zip(&up[range]).for_each(|(g, &u)| *g = gelu_tanh(*g) * u),
        }
    });
}

/// GELU's tanh approximation as torch computes it in float32
/// (`0.5·x·(1 + tanh(√2·(2/√π)·0.5·(x + 0.044715·x³)))`).
fn gelu_tanh(x: f32) -> f32 {
    const BETA: f32 = std::f32::consts::SQRT_2 * std::f32::consts::FRAC_2_SQRT_PI * 0.5;
    const KAPPA: f32 = 0.044715;
    let inner = BETA * (x + KAPPA * (x * x * x));
    0.5 * x * (1.0 + inner.tanh())
}
