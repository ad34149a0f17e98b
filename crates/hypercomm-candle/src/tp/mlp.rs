//! [`ParallelMlp`]: Megatron's tensor-parallel MLP block, a column-parallel layer, an activation and a
//! row-parallel layer.
//!
//! The hidden activation stays split over the group; the block communicates once forward (the row layer's
//! all-reduce) and once backward (the column layer's input gradient), as in Megatron-LM.

use candle_core::{Module, Tensor, Var};
use candle_nn::Activation;

use crate::tp::{ColumnParallelLinear, RowParallelLinear};
use crate::{Result, TensorGroup};

/// `fc2(activation(fc1(x)))` with `fc1` column-parallel and `fc2` row-parallel over one group.
#[derive(Debug, Clone)]
pub struct ParallelMlp {
    fc1: ColumnParallelLinear,
    activation: Activation,
    fc2: RowParallelLinear,
}

/// The full (unsplit) weights of an MLP block, as a single-rank model holds them.
#[derive(Debug, Clone, Copy)]
pub struct MlpWeights<'a> {
    /// `[hidden, in]`; `hidden` a multiple of the group size.
    pub fc1_weight: &'a Tensor,
    /// `[hidden]`.
    pub fc1_bias: Option<&'a Tensor>,
    /// `[out, hidden]`.
    pub fc2_weight: &'a Tensor,
    /// `[out]`.
    pub fc2_bias: Option<&'a Tensor>,
}

impl ParallelMlp {
    /// This rank's shards of the full weights, split over `group`.
    pub fn from_full(
        weights: MlpWeights<'_>,
        activation: Activation,
        group: TensorGroup,
    ) -> Result<Self> {
        Ok(ParallelMlp {
            fc1: ColumnParallelLinear::from_full(
                weights.fc1_weight,
                weights.fc1_bias,
                group.clone(),
            )?,
            activation,
            fc2: RowParallelLinear::from_full(weights.fc2_weight, weights.fc2_bias, group)?,
        })
    }

    /// The block of two layers built already (from their shards, say).
    pub fn new(fc1: ColumnParallelLinear, activation: Activation, fc2: RowParallelLinear) -> Self {
        ParallelMlp {
            fc1,
            activation,
            fc2,
        }
    }

    /// The column-parallel first layer.
    pub fn fc1(&self) -> &ColumnParallelLinear {
        &self.fc1
    }

    /// The row-parallel second layer.
    pub fn fc2(&self) -> &RowParallelLinear {
        &self.fc2
    }

    /// The trainable variables, in a fixed order: fc1's weight and bias shards, fc2's weight shard and bias.
    pub fn vars(&self) -> Vec<Var> {
        let mut vars = self.fc1.vars();
        vars.extend(self.fc2.vars());
        vars
    }
}

impl Module for ParallelMlp {
    /// `x`: the full input `[.., in]`, the same on every rank. Returns the full output `[.., out]`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let hidden = self.activation.forward(&self.fc1.forward(x)?)?;
        self.fc2.forward(&hidden)
    }
}
