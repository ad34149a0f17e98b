//! The tensor-parallel layers' parameters as a refit [`Sharding`](hypercomm_refit::Sharding): what a weight refit
//! plan needs to move these layers' weights between layouts.
//!
//! Each layer describes the full tensors its shards come from, as Megatron lays them out: a
//! [`ColumnParallelLinear`]'s weight `[out, in]` and bias `[out]` split along dim 0, a [`RowParallelLinear`]'s
//! weight split along dim 1 and its bias replicated. The full shape is this rank's shard times the group size, the
//! element type the shard's. A layer does not know its pipeline stage or expert: the caller says where it lives
//! ([`Place`]), and marks an expert's parameters with [`ParamSharding::of_expert`].

use hypercomm_refit::{DType, ParamSharding, Place, Split};

use crate::tp::{ColumnParallelLinear, ParallelMlp, RowParallelLinear};
use crate::{Error, Result, TensorGroup};

/// The refit element type of a candle element type, or an error naming it.
pub fn refit_dtype(dtype: candle_core::DType, group: &TensorGroup) -> Result<DType> {
    use candle_core::DType as C;
    Ok(match dtype {
        C::U8 => DType::U8,
        C::U32 => DType::U32,
        C::I16 => DType::I16,
        C::I32 => DType::I32,
        C::I64 => DType::I64,
        C::BF16 => DType::Bf16,
        C::F16 => DType::F16,
        C::F32 => DType::F32,
        C::F64 => DType::F64,
        C::F8E4M3 => DType::F8E4m3,
        other => {
            return Err(Error::UnsupportedDType {
                op: "refit sharding",
                group: group.name().to_owned(),
                dtype: other,
                supported: "u8, u32, i16, i32, i64, bf16, f16, f32, f64, f8e4m3",
            });
        }
    })
}

/// The full tensor `shard` is one of `group.size()` shards of along `split` (whole when replicated).
fn describe(
    name: String,
    shard: &candle_core::Tensor,
    split: Split,
    place: Place,
    group: &TensorGroup,
) -> Result<ParamSharding> {
    let mut shape: Vec<u64> = shard.dims().iter().map(|&d| d as u64).collect();
    if let Split::Tp { dim, .. } = split {
        shape[dim] *= group.size() as u64;
    }
    Ok(ParamSharding::new(
        name,
        shape,
        refit_dtype(shard.dtype(), group)?,
        split,
        place,
    ))
}

impl ColumnParallelLinear {
    /// `{prefix}.weight` (`[out, in]`, split along dim 0) and, with a bias, `{prefix}.bias` (`[out]`, split along
    /// dim 0), held on the stages of `place`.
    pub fn param_shardings(&self, prefix: &str, place: Place) -> Result<Vec<ParamSharding>> {
        let mut params = vec![describe(
            format!("{prefix}.weight"),
            self.weight().as_tensor(),
            Split::COLUMN,
            place,
            self.group(),
        )?];
        if let Some(bias) = self.bias() {
            params.push(describe(
                format!("{prefix}.bias"),
                bias.as_tensor(),
                Split::COLUMN,
                place,
                self.group(),
            )?);
        }
        Ok(params)
    }
}

impl RowParallelLinear {
    /// `{prefix}.weight` (`[out, in]`, split along dim 1) and, with a bias, `{prefix}.bias` (`[out]`, replicated),
    /// held on the stages of `place`.
    pub fn param_shardings(&self, prefix: &str, place: Place) -> Result<Vec<ParamSharding>> {
        let mut params = vec![describe(
            format!("{prefix}.weight"),
            self.weight().as_tensor(),
            Split::ROW,
            place,
            self.group(),
        )?];
        if let Some(bias) = self.bias() {
            params.push(describe(
                format!("{prefix}.bias"),
                bias.as_tensor(),
                Split::Replicated,
                place,
                self.group(),
            )?);
        }
        Ok(params)
    }
}

impl ParallelMlp {
    /// `{prefix}.fc1.*` (column-parallel) then `{prefix}.fc2.*` (row-parallel), in the order of
    /// [`vars`](ParallelMlp::vars), held on the stages of `place`.
    pub fn param_shardings(&self, prefix: &str, place: Place) -> Result<Vec<ParamSharding>> {
        let mut params = self
            .fc1()
            .param_shardings(&format!("{prefix}.fc1"), place)?;
        params.extend(
            self.fc2()
                .param_shardings(&format!("{prefix}.fc2"), place)?,
        );
        Ok(params)
    }
}
