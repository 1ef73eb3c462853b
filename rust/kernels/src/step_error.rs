//! `StepError`: what the native step and its layers say when a step or a
//! model's buffers do not fit together.

use crate::{AttentionError, ShapeError};

/// A step or a model whose buffers do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// A buffer's length is not what the shapes need.
    #[error("{what} has {got} elements, the shapes need {need}")]
    Len {
        /// Which buffer.
        what: String,
        /// What it holds.
        got: usize,
        /// What the shapes need.
        need: usize,
    },
    /// A weight's shape is not the model's.
    #[error("{what} is {got_out} x {got_in}, the model needs {need_out} x {need_in}")]
    Weight {
        /// Which weight.
        what: String,
        /// Its output features.
        got_out: usize,
        /// Its input features.
        got_in: usize,
        /// The output features the model needs.
        need_out: usize,
        /// The input features the model needs.
        need_in: usize,
    },
    /// The model's head counts or sizes do not fit together.
    #[error("{0}")]
    Shape(String),
    /// A token's position, cache slot or keys are outside what the step holds.
    #[error("token {token}: {what}")]
    Token {
        /// The token's row in the step.
        token: usize,
        /// What is wrong with it.
        what: String,
    },
    /// A logits row is not one of the step's tokens.
    #[error("logits row {index} is token {row}, not below the step's {tokens} tokens")]
    LogitsRow {
        /// Its index in `logits_rows`.
        index: usize,
        /// The row asked for.
        row: i64,
        /// Tokens of the step.
        tokens: usize,
    },
    /// A projection refused its shapes.
    #[error(transparent)]
    Matmul(#[from] ShapeError),
    /// Attention refused its inputs.
    #[error(transparent)]
    Attention(#[from] AttentionError),
}
