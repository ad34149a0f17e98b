//! [`ShardBuffers`]: where a rank's local shards are, as bytes, so the executor reads and writes them in place.
//!
//! The executor asks for one parameter's shard at a time, by its index in [`RefitPlan::params`](crate::RefitPlan),
//! and copies runs out of it (a sender packing a message) or into it (a receiver unpacking one) inside a callback:
//! buffers that are only reachable under a lock or inside a tensor library's in-place operation (candle's
//! `InplaceOp1`) work as well as plain vectors, and no shard is ever copied whole.
//!
//! The executor itself asks for less: [`StagedShards`], which packs a transfer's runs into a staging buffer of
//! its flavor and unpacks them back. Every [`ShardBuffers`] is one, staging in `Vec<u8>`; device shards
//! ([`DeviceShards`](crate::DeviceShards)) are another, staging in `DeviceBuffer<u8>`.

use hypercomm_comm::device::DeviceBuffer;
use hypercomm_comm::{Buffer, Element, as_bytes, as_bytes_mut};

use crate::execute::error::ExecError;
use crate::{PlanParam, Runs};

/// A staging buffer the executor keeps between buckets: one message's bytes, sent or received in one batch.
pub trait Staging: Buffer<Elem = u8> {
    /// Bytes it holds without allocating.
    fn capacity_bytes(&self) -> usize;

    /// Makes it `bytes` long, within [`capacity_bytes`](Self::capacity_bytes) (its contents are overwritten
    /// before they are read).
    fn fit(&mut self, bytes: usize) -> Result<(), ExecError>;
}

impl Staging for Vec<u8> {
    fn capacity_bytes(&self) -> usize {
        self.capacity()
    }

    fn fit(&mut self, bytes: usize) -> Result<(), ExecError> {
        self.resize(bytes, 0);
        Ok(())
    }
}

impl Staging for DeviceBuffer<u8> {
    fn capacity_bytes(&self) -> usize {
        self.capacity()
    }

    fn fit(&mut self, bytes: usize) -> Result<(), ExecError> {
        self.set_len(bytes).map_err(|e| ExecError::Buffers {
            name: "staging".into(),
            why: e.to_string(),
        })
    }
}

/// A rank's shards as the executor uses them: their sizes, and a transfer's runs copied into and out of a
/// staging buffer of the shards' flavor (host or device), at a byte offset. Runs address the shards as
/// [`ShardBuffers`] describes; a run outside a shard is an error ([`ExecError::Buffers`]).
pub trait StagedShards {
    /// The buffer messages are staged in.
    type Staging: Staging;

    /// A new staging buffer of `bytes` bytes.
    fn staging(&self, bytes: usize) -> Result<Self::Staging, ExecError>;

    /// The bytes of this rank's shard of parameter `index`.
    fn shard_bytes(&self, index: usize, param: &PlanParam) -> Result<u64, ExecError>;

    /// Copies the sender's side of `runs` (their `src` offsets) of shard `index` into `out` from byte `at` on,
    /// back to back.
    fn pack(
        &self,
        index: usize,
        param: &PlanParam,
        runs: &Runs,
        out: &mut Self::Staging,
        at: usize,
    ) -> Result<(), ExecError>;

    /// Copies `runs.bytes()` bytes of `message` from byte `at` on into the receiver's side of `runs` (their
    /// `dst` offsets) of shard `index`.
    fn unpack(
        &mut self,
        index: usize,
        param: &PlanParam,
        runs: &Runs,
        message: &Self::Staging,
        at: usize,
    ) -> Result<(), ExecError>;
}

/// The error for a run ending past a shard of the checked size (a plan built for other shardings).
pub(crate) fn outside(param: &PlanParam, end: usize, len: usize) -> ExecError {
    ExecError::Buffers {
        name: param.name.clone(),
        why: format!(
            "the plan's run ends at byte {end} of a shard of {len} bytes: was the plan built for these shardings?"
        ),
    }
}

/// The error for a run past the end of a staging buffer (a message shorter than its transfers).
pub(crate) fn short_message(param: &PlanParam, len: usize, end: usize) -> ExecError {
    ExecError::Buffers {
        name: param.name.clone(),
        why: format!("a message of {len} bytes ends before byte {end}"),
    }
}

impl<S: ShardBuffers + ?Sized> StagedShards for S {
    type Staging = Vec<u8>;

    fn staging(&self, bytes: usize) -> Result<Vec<u8>, ExecError> {
        Ok(vec![0; bytes])
    }

    fn shard_bytes(&self, index: usize, param: &PlanParam) -> Result<u64, ExecError> {
        let mut bytes = 0;
        self.read_shard(index, param, &mut |shard| {
            bytes = shard.len() as u64;
            Ok(())
        })?;
        Ok(bytes)
    }

    fn pack(
        &self,
        index: usize,
        param: &PlanParam,
        runs: &Runs,
        out: &mut Vec<u8>,
        mut at: usize,
    ) -> Result<(), ExecError> {
        self.read_shard(index, param, &mut |shard| {
            for (src, _, len) in runs.iter() {
                let (src, len) = (src as usize, len as usize);
                let run = shard
                    .get(src..src + len)
                    .ok_or_else(|| outside(param, src + len, shard.len()))?;
                let out_len = out.len();
                out.get_mut(at..at + len)
                    .ok_or_else(|| short_message(param, out_len, at + len))?
                    .copy_from_slice(run);
                at += len;
            }
            Ok(())
        })
    }

    fn unpack(
        &mut self,
        index: usize,
        param: &PlanParam,
        runs: &Runs,
        message: &Vec<u8>,
        mut at: usize,
    ) -> Result<(), ExecError> {
        self.write_shard(index, param, &mut |shard| {
            let shard_len = shard.len();
            for (_, dst, len) in runs.iter() {
                let (dst, len) = (dst as usize, len as usize);
                let into = shard
                    .get_mut(dst..dst + len)
                    .ok_or_else(|| outside(param, dst + len, shard_len))?;
                into.copy_from_slice(
                    message
                        .get(at..at + len)
                        .ok_or_else(|| short_message(param, message.len(), at + len))?,
                );
                at += len;
            }
            Ok(())
        })
    }
}

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
