//! Tensor parallelism: Megatron's layers over a tensor-parallel [`TensorGroup`](crate::TensorGroup).
//!
//! - [`ops`]: the conjugate autograd operations at a parallel region's edges, as candle custom ops.
//! - [`ColumnParallelLinear`], [`RowParallelLinear`]: linear layers split by output and by input features.
//! - [`ParallelMlp`]: the MLP block built from them.

mod linear;
mod mlp;
pub mod ops;

pub use linear::{ColumnParallelLinear, RowParallelLinear};
pub use mlp::{MlpWeights, ParallelMlp};

#[cfg(test)]
mod tests;
