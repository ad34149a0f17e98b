//! Megatron's column- and row-parallel linear layers over a tensor-parallel group.
//!
//! Both hold this rank's shard of a full weight `[out, in]` (candle's and PyTorch's `Linear` convention):
//!
//! - [`ColumnParallelLinear`] splits the *output* features: rank `r` of `n` keeps rows `r·out/n .. (r+1)·out/n`
//!   of the weight and the same slice of the bias, takes the full (replicated) input and returns its slice of the
//!   output. Its input passes [`copy_to_tp_region`] so that the input's gradient is summed over the group.
//! - [`RowParallelLinear`] splits the *input* features: rank `r` keeps columns `r·in/n .. (r+1)·in/n` of the
//!   weight, takes its slice of the input (what a column-parallel layer returns) and returns the full output:
//!   the partial products meet in [`reduce_from_tp_region`], then the full, replicated bias is added once.
//!
//! Build them from the full weight with `from_full` on every rank (the same weight everywhere): each rank keeps
//! its shard, and the layer computes what a single-rank `candle_nn::Linear` over the full weight computes.

use candle_core::{Module, Tensor, Var};

use crate::tp::ops::{copy_to_tp_region, reduce_from_tp_region};
use crate::{Error, Result, TensorGroup};

/// `x · wᵀ (+ b)` for inputs of any rank, as `candle_nn::Linear` computes it.
fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> candle_core::Result<Tensor> {
    let y = match *x.dims() {
        [b1, b2, m, k] => x
            .reshape((b1 * b2 * m, k))?
            .matmul(&w.t()?)?
            .reshape((b1, b2, m, ()))?,
        [bsize, m, k] => x
            .reshape((bsize * m, k))?
            .matmul(&w.t()?)?
            .reshape((bsize, m, ()))?,
        _ => x.matmul(&w.t()?)?,
    };
    match b {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

/// Rank `rank`'s `1/n` slice of `t` along `dim`, as a new variable.
fn shard(t: &Tensor, dim: usize, group: &TensorGroup, what: &str) -> Result<Var> {
    let n = group.size();
    let size = t.dim(dim)?;
    if size % n != 0 {
        return Err(Error::Shape {
            op: "tensor-parallel split",
            group: group.name().to_owned(),
            what: format!(
                "{what} of shape {:?} has {size} along dim {dim}, not a multiple of {n} ranks",
                t.shape()
            ),
        });
    }
    let len = size / n;
    Ok(Var::from_tensor(
        &t.narrow(dim, group.rank() * len, len)?
            .contiguous()?
            .detach(),
    )?)
}

fn check_weight(
    weight: &Tensor,
    bias: Option<&Tensor>,
    group: &TensorGroup,
    layer: &'static str,
) -> Result<()> {
    let bad = |what: String| Error::Shape {
        op: layer,
        group: group.name().to_owned(),
        what,
    };
    if weight.rank() != 2 {
        return Err(bad(format!(
            "the weight must be [out, in], got shape {:?}",
            weight.shape()
        )));
    }
    if let Some(b) = bias
        && b.dims() != [weight.dim(0)?]
    {
        return Err(bad(format!(
            "the bias must be [{}] to match the weight {:?}, got {:?}",
            weight.dim(0)?,
            weight.shape(),
            b.shape()
        )));
    }
    Ok(())
}

/// A linear layer whose output features are split over the tensor-parallel group (see the module docs).
#[derive(Debug, Clone)]
pub struct ColumnParallelLinear {
    weight: Var,
    bias: Option<Var>,
    group: TensorGroup,
}

impl ColumnParallelLinear {
    /// This rank's shard of the full `weight` (`[out, in]`, `out` a multiple of the group size) and `bias`
    /// (`[out]`).
    pub fn from_full(weight: &Tensor, bias: Option<&Tensor>, group: TensorGroup) -> Result<Self> {
        check_weight(weight, bias, &group, "ColumnParallelLinear")?;
        Ok(ColumnParallelLinear {
            weight: shard(weight, 0, &group, "the weight")?,
            bias: bias.map(|b| shard(b, 0, &group, "the bias")).transpose()?,
            group,
        })
    }

    /// The layer over shards this rank holds already: `weight` `[out / n, in]` and `bias` `[out / n]`. An
    /// inference engine builds its layers so (zeros, say) and a weight refit fills the variables in place.
    pub fn from_shards(weight: Var, bias: Option<Var>, group: TensorGroup) -> Result<Self> {
        check_weight(
            weight.as_tensor(),
            bias.as_ref().map(Var::as_tensor),
            &group,
            "ColumnParallelLinear",
        )?;
        Ok(ColumnParallelLinear {
            weight,
            bias,
            group,
        })
    }

    /// The tensor-parallel group the layer is split over.
    pub fn group(&self) -> &TensorGroup {
        &self.group
    }

    /// This rank's weight shard, `[out / n, in]`.
    pub fn weight(&self) -> &Var {
        &self.weight
    }

    /// This rank's bias shard, `[out / n]`.
    pub fn bias(&self) -> Option<&Var> {
        self.bias.as_ref()
    }

    /// The trainable variables (all sharded: their gradients are this rank's alone).
    pub fn vars(&self) -> Vec<Var> {
        std::iter::once(self.weight.clone())
            .chain(self.bias.clone())
            .collect()
    }
}

impl Module for ColumnParallelLinear {
    /// `x`: the full input `[.., in]`, the same on every rank. Returns this rank's output slice `[.., out / n]`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = copy_to_tp_region(x, &self.group)?;
        linear(
            &x,
            self.weight.as_tensor(),
            self.bias.as_ref().map(Var::as_tensor),
        )
    }
}

/// A linear layer whose input features are split over the tensor-parallel group (see the module docs).
#[derive(Debug, Clone)]
pub struct RowParallelLinear {
    weight: Var,
    bias: Option<Var>,
    group: TensorGroup,
}

impl RowParallelLinear {
    /// This rank's shard of the full `weight` (`[out, in]`, `in` a multiple of the group size); the `bias`
    /// (`[out]`) is kept whole on every rank.
    pub fn from_full(weight: &Tensor, bias: Option<&Tensor>, group: TensorGroup) -> Result<Self> {
        check_weight(weight, bias, &group, "RowParallelLinear")?;
        Ok(RowParallelLinear {
            weight: shard(weight, 1, &group, "the weight")?,
            bias: bias
                .map(|b| Var::from_tensor(&b.contiguous()?.detach()))
                .transpose()?,
            group,
        })
    }

    /// The layer over shards this rank holds already: `weight` `[out, in / n]` and the whole `bias` `[out]` (see
    /// [`ColumnParallelLinear::from_shards`]).
    pub fn from_shards(weight: Var, bias: Option<Var>, group: TensorGroup) -> Result<Self> {
        check_weight(
            weight.as_tensor(),
            bias.as_ref().map(Var::as_tensor),
            &group,
            "RowParallelLinear",
        )?;
        Ok(RowParallelLinear {
            weight,
            bias,
            group,
        })
    }

    /// The tensor-parallel group the layer is split over.
    pub fn group(&self) -> &TensorGroup {
        &self.group
    }

    /// This rank's weight shard, `[out, in / n]`.
    pub fn weight(&self) -> &Var {
        &self.weight
    }

    /// The full bias, `[out]`, replicated on every rank of the group.
    pub fn bias(&self) -> Option<&Var> {
        self.bias.as_ref()
    }

    /// The trainable variables: the weight shard, then the replicated bias (whose gradient is the same on every
    /// rank of the group).
    pub fn vars(&self) -> Vec<Var> {
        std::iter::once(self.weight.clone())
            .chain(self.bias.clone())
            .collect()
    }
}

impl Module for RowParallelLinear {
    /// `x`: this rank's input slice `[.., in / n]`. Returns the full output `[.., out]`, the same on every rank.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let partial = linear(x, self.weight.as_tensor(), None)?;
        let y = reduce_from_tp_region(&partial, &self.group)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b.as_tensor()),
            None => Ok(y),
        }
    }
}
