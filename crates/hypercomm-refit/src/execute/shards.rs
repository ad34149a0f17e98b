//! [`ShardBuffers`]: where a rank's local shards are, as bytes, so the executor reads and writes them in place.
//!
//! The executor asks for one parameter's shard at a time, by its index in [`RefitPlan::params`](crate::RefitPlan),
//! and copies runs out of it (a sender packing a message) or into it (a receiver unpacking one) inside a callback:
//! buffers that are only reachable under a lock or inside a tensor library's in-place operation (candle's
//! `InplaceOp1`) work as well as plain vectors, and no shard is ever copied whole.

use hypercomm_comm::{Element, as_bytes, as_bytes_mut};

use crate::PlanParam;
use crate::execute::error::ExecError;

/// The callback a [`ShardBuffers`] read calls with a shard's bytes.
pub type ReadShard<'a> = dyn FnMut(&[u8]) -> Result<(), ExecError> + 'a;

/// The callback a [`ShardBuffers`] write calls with a shard's bytes.
pub type WriteShard<'a> = dyn FnMut(&mut [u8]) -> Result<(), ExecError> + 'a;

/// A rank's local shards of a plan's parameters, each row-major, as the plan's [`Runs`](crate::Runs) address them.
///
/// `index` is the parameter's index in [`RefitPlan::params`](crate::RefitPlan::params) and `param` describes it.
/// An implementation calls `f` once with the whole shard and returns what `f` returns; a shard this rank does not
/// hold is an error ([`ExecError::Buffers`]), but the executor asks only for shards the plan says it holds.
///
/// Implemented for vectors indexed by plan index (`Vec<Vec<T>>`, `[Vec<T>]`, with an empty vector for a
/// parameter the rank does not hold), of any element type the communicators move; mixed element types fit
/// `Vec<Vec<u8>>`.
pub trait ShardBuffers {
    /// Calls `f` with the bytes of this rank's shard of parameter `index`.
    fn read_shard(
        &self,
        index: usize,
        param: &PlanParam,
        f: &mut ReadShard<'_>,
    ) -> Result<(), ExecError>;

    /// Calls `f` with the bytes of this rank's shard of parameter `index`, to write into.
    fn write_shard(
        &mut self,
        index: usize,
        param: &PlanParam,
        f: &mut WriteShard<'_>,
    ) -> Result<(), ExecError>;
}

/// The error for a shard a slice of vectors lacks.
fn missing(index: usize, param: &PlanParam, does: &'static str) -> ExecError {
    ExecError::Buffers {
        name: param.name.clone(),
        why: format!("no vector at plan index {index} to {does}"),
    }
}

impl<T: Element> ShardBuffers for [Vec<T>] {
    fn read_shard(
        &self,
        index: usize,
        param: &PlanParam,
        f: &mut ReadShard<'_>,
    ) -> Result<(), ExecError> {
        let shard = self
            .get(index)
            .ok_or_else(|| missing(index, param, "read"))?;
        f(as_bytes(shard))
    }

    fn write_shard(
        &mut self,
        index: usize,
        param: &PlanParam,
        f: &mut WriteShard<'_>,
    ) -> Result<(), ExecError> {
        let shard = self
            .get_mut(index)
            .ok_or_else(|| missing(index, param, "write"))?;
        f(as_bytes_mut(shard))
    }
}

impl<T: Element> ShardBuffers for Vec<Vec<T>> {
    fn read_shard(
        &self,
        index: usize,
        param: &PlanParam,
        f: &mut ReadShard<'_>,
    ) -> Result<(), ExecError> {
        self.as_slice().read_shard(index, param, f)
    }

    fn write_shard(
        &mut self,
        index: usize,
        param: &PlanParam,
        f: &mut WriteShard<'_>,
    ) -> Result<(), ExecError> {
        self.as_mut_slice().write_shard(index, param, f)
    }
}
