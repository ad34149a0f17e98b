//! Tensor parallelism: Megatron's layers over a tensor-parallel [`TensorGroup`](crate::TensorGroup).
//!
//! - [`ops`]: the conjugate autograd operations at a parallel region's edges, as candle custom ops.
//! - [`ColumnParallelLinear`], [`RowParallelLinear`]: linear layers split by output and by input features.
//! - [`ParallelMlp`]: the MLP block built from them.
//! - `param_shardings` on each layer: its parameters as a weight-refit sharding (`hypercomm_refit`), so a refit
//!   plan can move them between layouts; [`refit_dtype`] maps element types.

mod linear;
mod mlp;
pub mod ops;
mod sharding;

pub use linear::{ColumnParallelLinear, RowParallelLinear};
pub use mlp::{MlpWeights, ParallelMlp};
pub use sharding::refit_dtype;

#[cfg(test)]
mod tests;
