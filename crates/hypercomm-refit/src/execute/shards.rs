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
fn outside(param: &PlanParam, end: usize, len: usize) -> ExecError {
    ExecError::Buffers {
        name: param.name.clone(),
        why: format!(
            "the plan's run ends at byte {end} of a shard of {len} bytes: was the plan built for these shardings?"
        ),
    }
}

/// The error for a run past the end of a staging buffer (a message shorter than its transfers).
fn short_message(param: &PlanParam, len: usize, end: usize) -> ExecError {
    ExecError::Buffers {
        name: param.name.clone(),
        why: format!("a message of {len} bytes ends before byte {end}"),
    }
}

/// Which side of a transfer's runs a shard is: the sender's (runs read from their `src` offsets) or the
/// receiver's (written at their `dst` offsets).
#[derive(Clone, Copy, Debug)]
pub(crate) enum ShardSide {
    /// Packing a message: the runs' sources.
    Source,
    /// Unpacking a message: the runs' destinations.
    Destination,
}

/// One run of a transfer placed in a shard and in a message, in bytes; both ranges checked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placed {
    /// Where the run starts in the shard.
    pub shard: usize,
    /// Where it starts in the message.
    pub message: usize,
    /// Its length.
    pub len: usize,
}

/// The runs of `runs` in order, each placed in the shard (its `side`'s offset) and in the message (back to back
/// from byte `at`), and checked before it is handed out: the shard's range within `shard_len` bytes (else
/// [`outside`]), then the message's within `message_len` (else [`short_message`]). Every pack and unpack walks
/// its runs through this, whatever it copies with.
pub(crate) fn placed<'a>(
    param: &'a PlanParam,
    runs: &'a Runs,
    side: ShardSide,
    shard_len: usize,
    message_len: usize,
    mut at: usize,
) -> impl Iterator<Item = Result<Placed, ExecError>> + 'a {
    runs.iter().map(move |(src, dst, len)| {
        let shard = match side {
            ShardSide::Source => src,
            ShardSide::Destination => dst,
        };
        let (shard, len) = (shard as usize, len as usize);
        if shard + len > shard_len {
            return Err(outside(param, shard + len, shard_len));
        }
        if at + len > message_len {
            return Err(short_message(param, message_len, at + len));
        }
        let run = Placed {
            shard,
            message: at,
            len,
        };
        at += len;
        Ok(run)
    })
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
        at: usize,
    ) -> Result<(), ExecError> {
        let out_len = out.len();
        self.read_shard(index, param, &mut |shard| {
            for run in placed(param, runs, ShardSide::Source, shard.len(), out_len, at) {
                let run = run?;
                // Both ranges were checked by `placed`.
                out[run.message..run.message + run.len]
                    .copy_from_slice(&shard[run.shard..run.shard + run.len]);
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
        at: usize,
    ) -> Result<(), ExecError> {
        self.write_shard(index, param, &mut |shard| {
            let shard_len = shard.len();
            for run in placed(
                param,
                runs,
                ShardSide::Destination,
                shard_len,
                message.len(),
                at,
            ) {
                let run = run?;
                // Both ranges were checked by `placed`.
                shard[run.shard..run.shard + run.len]
                    .copy_from_slice(&message[run.message..run.message + run.len]);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn param() -> PlanParam {
        PlanParam {
            name: "w".into(),
            shape: vec![16],
            dtype: DType::U8,
            bytes: 16,
            source_parts: 1,
            destination_parts: 1,
            destination_ranks: 1,
        }
    }

    /// The placements of `runs` as (shard, message, len), or the first error's text.
    fn walk(
        runs: &Runs,
        side: ShardSide,
        shard_len: usize,
        message_len: usize,
    ) -> Result<Vec<(usize, usize, usize)>, String> {
        let p = param();
        placed(&p, runs, side, shard_len, message_len, 2)
            .map(|r| {
                r.map(|r| (r.shard, r.message, r.len))
                    .map_err(|e| e.to_string())
            })
            .collect()
    }

    #[test]
    fn runs_are_placed_on_their_side_back_to_back_and_checked_in_order() {
        let runs = Runs::contiguous(1, 5, 4);
        assert_eq!(walk(&runs, ShardSide::Source, 8, 8), Ok(vec![(1, 2, 4)]));
        assert_eq!(
            walk(&runs, ShardSide::Destination, 9, 8),
            Ok(vec![(5, 2, 4)])
        );
        // The shard's range is checked first, then the message's.
        let e = walk(&runs, ShardSide::Destination, 8, 3).unwrap_err();
        assert!(e.contains("ends at byte 9 of a shard of 8 bytes"), "{e}");
        let e = walk(&runs, ShardSide::Source, 8, 5).unwrap_err();
        assert!(e.contains("a message of 5 bytes ends before byte 6"), "{e}");
    }
}
