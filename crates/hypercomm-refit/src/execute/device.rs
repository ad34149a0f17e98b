//! [`DeviceShards`]: a rank's shards in device memory, for running a plan on the communicator's NCCL flavor.
//!
//! Packing and unpacking are device-to-device copies ([`DeviceBuffer::copy_range_from`]) between the shards and
//! staging buffers of type `DeviceBuffer<u8>`, all enqueued on one stream and ordered with the batches through the
//! buffers' own stream tracking: nothing blocks the CPU but the batch's wait. Each contiguous run is one copy, so a
//! transfer of many short strided runs (a column slice of a row-major matrix) costs a few microseconds of CPU time
//! per run; the plan's runs are as long as the layouts allow.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use hypercomm_comm::device::{DeviceBuffer, Gpu};
use hypercomm_comm::{CommError, Element};

use crate::execute::error::ExecError;
use crate::execute::shards::{ShardSide, StagedShards, placed};
use crate::{PlanParam, Runs};

/// This rank's shards as device buffers indexed by plan index (an empty buffer for a parameter the rank does not
/// hold), each row-major as the plan's [`Runs`] address them, all on `gpu`; their copies run on `stream` (the
/// communicator's, [`DeviceCommunicator::stream`](hypercomm_comm::device::DeviceCommunicator::stream), keeps
/// them in one stream order with the batches). Mixed element types fit `DeviceBuffer<u8>`.
#[derive(Debug)]
pub struct DeviceShards<'a, T: Element> {
    shards: &'a mut [DeviceBuffer<T>],
    gpu: Arc<Gpu>,
    stream: Arc<CudaStream>,
}

impl<'a, T: Element> DeviceShards<'a, T> {
    /// `shards` on `gpu`, copied through `stream`.
    pub fn new(
        shards: &'a mut [DeviceBuffer<T>],
        gpu: Arc<Gpu>,
        stream: Arc<CudaStream>,
    ) -> DeviceShards<'a, T> {
        DeviceShards {
            shards,
            gpu,
            stream,
        }
    }

    fn shard(&self, index: usize, param: &PlanParam) -> Result<&DeviceBuffer<T>, ExecError> {
        self.shards
            .get(index)
            .ok_or_else(|| missing(index, param, self.shards.len()))
    }
}

/// The error for a plan index past the shards.
fn missing(index: usize, param: &PlanParam, have: usize) -> ExecError {
    ExecError::Buffers {
        name: param.name.clone(),
        why: format!("no device buffer at plan index {index} (there are {have})"),
    }
}

/// A device error of a copy of `param`'s bytes.
fn device(param: &PlanParam) -> impl FnOnce(CommError) -> ExecError {
    let name = param.name.clone();
    move |e| ExecError::Buffers {
        name,
        why: e.to_string(),
    }
}

impl<T: Element> StagedShards for DeviceShards<'_, T> {
    type Staging = DeviceBuffer<u8>;

    fn staging(&self, bytes: usize) -> Result<DeviceBuffer<u8>, ExecError> {
        self.gpu
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| ExecError::Buffers {
                name: "staging".into(),
                why: format!("allocating {bytes} bytes: {e}"),
            })
    }

    fn shard_bytes(&self, index: usize, param: &PlanParam) -> Result<u64, ExecError> {
        let shard = self.shard(index, param)?;
        Ok((shard.len() * T::DTYPE.size()) as u64)
    }

    fn pack(
        &self,
        index: usize,
        param: &PlanParam,
        runs: &Runs,
        out: &mut DeviceBuffer<u8>,
        at: usize,
    ) -> Result<(), ExecError> {
        let shard = self.shard(index, param)?;
        let shard_len = shard.len() * T::DTYPE.size();
        for run in placed(param, runs, ShardSide::Source, shard_len, out.len(), at) {
            let run = run?;
            out.copy_range_from(shard, run.shard, run.message, run.len, &self.stream)
                .map_err(device(param))?;
        }
        Ok(())
    }

    fn unpack(
        &mut self,
        index: usize,
        param: &PlanParam,
        runs: &Runs,
        message: &DeviceBuffer<u8>,
        at: usize,
    ) -> Result<(), ExecError> {
        let have = self.shards.len();
        let shard = self
            .shards
            .get_mut(index)
            .ok_or_else(|| missing(index, param, have))?;
        let shard_len = shard.len() * T::DTYPE.size();
        for run in placed(
            param,
            runs,
            ShardSide::Destination,
            shard_len,
            message.len(),
            at,
        ) {
            let run = run?;
            shard
                .copy_range_from(message, run.message, run.shard, run.len, &self.stream)
                .map_err(device(param))?;
        }
        Ok(())
    }
}
