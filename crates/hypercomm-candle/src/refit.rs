//! [`TensorShards`]: candle tensors (a layer's [`Var`](candle_core::Var)s) as the shard buffers of a weight refit
//! (`hypercomm_refit`), read and written where they are.
//!
//! A sender's runs are copied out of its tensors' storage under candle's read lock; a receiver's runs are copied
//! into its tensors' storage inside an in-place operation ([`InplaceOp1`]), so an engine's layers hold the new
//! weights when the refit returns, with no tensor built, copied or replaced. Host (CPU) tensors only: a CUDA
//! tensor's bytes live on the GPU, which needs the refit's device path (not yet there), and is an error naming it.

use std::cell::RefCell;

use candle_core::{CpuStorage, InplaceOp1, Layout, Storage, Tensor};
use hypercomm_comm::{as_bytes, as_bytes_mut};
use hypercomm_refit::execute::{ReadShard, WriteShard};
use hypercomm_refit::{ExecError, PlanParam, RefitPlan, ShardBuffers};

/// A rank's shard tensors by plan index; see the module docs.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use hypercomm_candle::refit::TensorShards;
/// use hypercomm_refit::{DType, ParamSharding, Place, PlanOptions, RefitPlan, Sharding, Side, Split, parse_layout};
///
/// let mut model = Sharding::new(1, 0);
/// model.push(ParamSharding::new("w", [4, 2], DType::F32, Split::COLUMN, Place::First));
/// let (from, to) = (parse_layout("tp=1")?, parse_layout("tp=2")?);
/// let plan = RefitPlan::build(Side::new(&from, &model), Side::new(&to, &model), PlanOptions::default())?;
/// // Destination rank 1's shard of `w`, which the refit fills in place.
/// let w = Tensor::zeros((2, 2), candle_core::DType::F32, &Device::Cpu)?;
/// let shards = TensorShards::new(&plan, [("w".to_owned(), w)])?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct TensorShards {
    tensors: Vec<Option<(String, Tensor)>>,
}

impl TensorShards {
    /// The tensors `named` (each this rank's shard of the parameter of that name), at their plan indices. A
    /// parameter not named is one this rank does not hold; a name the plan lacks is an error.
    pub fn new(
        plan: &RefitPlan,
        named: impl IntoIterator<Item = (String, Tensor)>,
    ) -> Result<TensorShards, ExecError> {
        let mut tensors = vec![None; plan.params().len()];
        for (name, tensor) in named {
            let index = plan
                .params()
                .iter()
                .position(|p| p.name == name)
                .ok_or_else(|| ExecError::Buffers {
                    name: name.clone(),
                    why: "the plan has no parameter of this name".into(),
                })?;
            tensors[index] = Some((name, tensor));
        }
        Ok(TensorShards { tensors })
    }

    fn tensor(&self, index: usize, param: &PlanParam) -> Result<&Tensor, ExecError> {
        self.tensors
            .get(index)
            .and_then(Option::as_ref)
            .map(|(_, t)| t)
            .ok_or_else(|| ExecError::Buffers {
                name: param.name.clone(),
                why: "this rank was given no tensor for it".into(),
            })
    }
}

/// The error for a tensor whose bytes cannot be lent.
fn refused(param: &PlanParam, why: impl std::fmt::Display) -> ExecError {
    ExecError::Buffers {
        name: param.name.clone(),
        why: why.to_string(),
    }
}

/// Runs `$f` on the elements of every variant of `$storage` whose type the communicators move, `None` otherwise.
macro_rules! on_elements {
    ($storage:expr, $v:ident => $f:expr) => {
        match $storage {
            CpuStorage::U8($v) => $f,
            CpuStorage::U32($v) => $f,
            CpuStorage::I32($v) => $f,
            CpuStorage::I64($v) => $f,
            CpuStorage::BF16($v) => $f,
            CpuStorage::F16($v) => $f,
            CpuStorage::F32($v) => $f,
            CpuStorage::F64($v) => $f,
            CpuStorage::F8E4M3($v) => $f,
            _ => None,
        }
    };
}

/// The bytes of elements `range` of `storage`; `None` for an element type the communicators do not move (i16,
/// the 6- and 4-bit formats) or a range outside the storage.
fn cpu_bytes(storage: &CpuStorage, (start, end): (usize, usize)) -> Option<&[u8]> {
    on_elements!(storage, v => v.get(start..end).map(as_bytes))
}

/// [`cpu_bytes`], to write into.
fn cpu_bytes_mut(storage: &mut CpuStorage, (start, end): (usize, usize)) -> Option<&mut [u8]> {
    on_elements!(storage, v => v.get_mut(start..end).map(as_bytes_mut))
}

/// Where a tensor's elements lie in its storage, if contiguously.
fn contiguous(layout: &Layout, param: &PlanParam) -> Result<(usize, usize), ExecError> {
    layout
        .contiguous_offsets()
        .ok_or_else(|| refused(param, "the tensor is not contiguous"))
}

/// Lends a receiver's storage to the executor's write, inside candle's in-place operation.
struct WriteBytes<'a, 'f> {
    param: &'a PlanParam,
    f: RefCell<&'a mut WriteShard<'f>>,
    failed: RefCell<Option<ExecError>>,
}

impl InplaceOp1 for WriteBytes<'_, '_> {
    fn name(&self) -> &'static str {
        "refit-write"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let outcome = contiguous(layout, self.param).and_then(|range| {
            let dtype = candle_core::backend::BackendStorage::dtype(storage);
            let bytes = cpu_bytes_mut(storage, range).ok_or_else(|| {
                refused(self.param, format!("tensors of {dtype:?} are not moved"))
            })?;
            (self.f.borrow_mut())(bytes)
        });
        outcome.map_err(|e| {
            let text = e.to_string();
            *self.failed.borrow_mut() = Some(e);
            candle_core::Error::Msg(text)
        })
    }
}

impl ShardBuffers for TensorShards {
    fn read_shard(
        &self,
        index: usize,
        param: &PlanParam,
        f: &mut ReadShard<'_>,
    ) -> Result<(), ExecError> {
        let tensor = self.tensor(index, param)?;
        let (storage, layout) = tensor.storage_and_layout();
        let Storage::Cpu(cpu) = &*storage else {
            return Err(refused(
                param,
                format!(
                    "the tensor is on {:?}; the refit moves host tensors",
                    tensor.device()
                ),
            ));
        };
        let bytes = cpu_bytes(cpu, contiguous(layout, param)?).ok_or_else(|| {
            refused(
                param,
                format!("tensors of {:?} are not moved", tensor.dtype()),
            )
        })?;
        f(bytes)
    }

    fn write_shard(
        &mut self,
        index: usize,
        param: &PlanParam,
        f: &mut WriteShard<'_>,
    ) -> Result<(), ExecError> {
        let tensor = self.tensor(index, param)?;
        if !tensor.device().is_cpu() {
            return Err(refused(
                param,
                format!(
                    "the tensor is on {:?}; the refit moves host tensors",
                    tensor.device()
                ),
            ));
        }
        let op = WriteBytes {
            param,
            f: RefCell::new(f),
            failed: RefCell::new(None),
        };
        let result = tensor.inplace_op1(&op);
        if let Some(e) = op.failed.into_inner() {
            return Err(e);
        }
        result.map_err(|e| refused(param, e))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Var};
    use hypercomm_refit::{ParamSharding, Place, PlanOptions, Sharding, Side, Split, parse_layout};

    use super::*;

    #[test]
    fn tensors_lend_their_bytes_and_take_writes_in_place() {
        let mut model = Sharding::new(1, 0);
        model.push(ParamSharding::new(
            "w",
            [2, 2],
            hypercomm_refit::DType::F32,
            Split::Replicated,
            Place::First,
        ));
        let one = parse_layout("tp=1").unwrap();
        let plan = RefitPlan::build(
            Side::new(&one, &model),
            Side::new(&one, &model),
            PlanOptions::default(),
        )
        .unwrap();
        let var = Var::zeros((2, 2), DType::F32, &Device::Cpu).unwrap();
        let mut shards =
            TensorShards::new(&plan, [("w".to_owned(), var.as_tensor().clone())]).unwrap();
        let param = &plan.params()[0];
        shards
            .write_shard(0, param, &mut |bytes| {
                assert_eq!(bytes.len(), 16);
                bytes.copy_from_slice(as_bytes(&[1f32, 2.0, 3.0, 4.0]));
                Ok(())
            })
            .unwrap();
        // The variable itself changed: the layer holding it sees the new weights.
        assert_eq!(
            var.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            [1.0, 2.0, 3.0, 4.0]
        );
        let mut seen = Vec::new();
        shards
            .read_shard(0, param, &mut |bytes| {
                seen.extend_from_slice(bytes);
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, as_bytes(&[1f32, 2.0, 3.0, 4.0]));
        // An error inside the write comes back as itself.
        let err = shards
            .write_shard(0, param, &mut |_| {
                Err(ExecError::Buffers {
                    name: "w".into(),
                    why: "no".into(),
                })
            })
            .unwrap_err();
        assert_eq!(err.to_string(), "the buffers of parameter \"w\": no");
        assert!(TensorShards::new(&plan, [("v".to_owned(), var.as_tensor().clone())]).is_err());
    }
}
