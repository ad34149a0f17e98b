//! [`DeviceSide`]: the device half of a [`ProcessGroup`](super::ProcessGroup), as a trait so the routing is
//! tested with a fake device on machines without a GPU; [`DeviceCommunicator`] is the real one.

use crate::backends::nccl::communicator::{DeviceCommunicator, DeviceWork};
use crate::backends::nccl::gpu::DeviceBuffer;
use crate::{CommError, Element, ReduceOp};

/// The device half of a [`ProcessGroup`](crate::device::ProcessGroup): collectives on the side's own buffer type.
pub trait DeviceSide: Send + Sync {
    /// A buffer of `T` on a device.
    type Buffer<T: Element>: Send + 'static;
    /// A pending operation giving back `R`.
    type Work<R>;
    /// The device the communicator runs on.
    fn device(&self) -> usize;
    /// The member list (must equal the host communicator's).
    fn members(&self) -> &[usize];
    /// Stops the communicator: pending and later operations fail.
    fn abort(&self);
    /// The device a buffer lives on.
    fn buffer_device<T: Element>(buf: &Self::Buffer<T>) -> usize;
    /// In-place all-reduce.
    fn all_reduce<T: Element>(
        &self,
        buf: Self::Buffer<T>,
        op: ReduceOp,
    ) -> Result<Self::Work<Self::Buffer<T>>, CommError>;
    /// In-place broadcast.
    fn broadcast<T: Element>(
        &self,
        buf: Self::Buffer<T>,
        root: usize,
    ) -> Result<Self::Work<Self::Buffer<T>>, CommError>;
    /// In-place reduce to `root`.
    fn reduce<T: Element>(
        &self,
        buf: Self::Buffer<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<Self::Work<Self::Buffer<T>>, CommError>;
    /// Sends the buffer to `peer`.
    fn send<T: Element>(
        &self,
        buf: Self::Buffer<T>,
        peer: usize,
    ) -> Result<Self::Work<Self::Buffer<T>>, CommError>;
    /// Receives into the buffer from `peer`.
    fn recv<T: Element>(
        &self,
        buf: Self::Buffer<T>,
        peer: usize,
    ) -> Result<Self::Work<Self::Buffer<T>>, CommError>;
    /// Out-of-place all-to-all with equal blocks.
    #[allow(clippy::type_complexity)]
    fn all_to_all_into<T: Element>(
        &self,
        input: Self::Buffer<T>,
        output: Self::Buffer<T>,
    ) -> Result<Self::Work<(Self::Buffer<T>, Self::Buffer<T>)>, CommError>;
    /// Out-of-place all-gather.
    #[allow(clippy::type_complexity)]
    fn all_gather_into<T: Element>(
        &self,
        input: Self::Buffer<T>,
        output: Self::Buffer<T>,
    ) -> Result<Self::Work<(Self::Buffer<T>, Self::Buffer<T>)>, CommError>;
    /// Out-of-place reduce-scatter.
    #[allow(clippy::type_complexity)]
    fn reduce_scatter_into<T: Element>(
        &self,
        input: Self::Buffer<T>,
        output: Self::Buffer<T>,
        op: ReduceOp,
    ) -> Result<Self::Work<(Self::Buffer<T>, Self::Buffer<T>)>, CommError>;
    /// Blocks until `work` completes.
    fn synchronize<R>(work: Self::Work<R>) -> Result<R, CommError>;
}

impl DeviceSide for DeviceCommunicator {
    type Buffer<T: Element> = DeviceBuffer<T>;
    type Work<R> = DeviceWork<R>;
    fn device(&self) -> usize {
        self.gpu().ordinal()
    }
    fn members(&self) -> &[usize] {
        self.ranks()
    }
    fn abort(&self) {
        DeviceCommunicator::abort(self);
    }
    fn buffer_device<T: Element>(buf: &DeviceBuffer<T>) -> usize {
        buf.device()
    }
    fn all_reduce<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        DeviceCommunicator::all_reduce(self, buf, op)
    }
    fn broadcast<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        root: usize,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        DeviceCommunicator::broadcast(self, buf, root)
    }
    fn reduce<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        DeviceCommunicator::reduce(self, buf, op, root)
    }
    fn send<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        peer: usize,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        DeviceCommunicator::send(self, buf, peer)
    }
    fn recv<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        peer: usize,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        DeviceCommunicator::recv(self, buf, peer)
    }
    fn all_to_all_into<T: Element>(
        &self,
        input: DeviceBuffer<T>,
        output: DeviceBuffer<T>,
    ) -> Result<DeviceWork<(DeviceBuffer<T>, DeviceBuffer<T>)>, CommError> {
        DeviceCommunicator::all_to_all_into(self, input, output)
    }
    fn all_gather_into<T: Element>(
        &self,
        input: DeviceBuffer<T>,
        output: DeviceBuffer<T>,
    ) -> Result<DeviceWork<(DeviceBuffer<T>, DeviceBuffer<T>)>, CommError> {
        DeviceCommunicator::all_gather_into(self, input, output)
    }
    fn reduce_scatter_into<T: Element>(
        &self,
        input: DeviceBuffer<T>,
        output: DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork<(DeviceBuffer<T>, DeviceBuffer<T>)>, CommError> {
        DeviceCommunicator::reduce_scatter_into(self, input, output, op)
    }
    fn synchronize<R>(work: DeviceWork<R>) -> Result<R, CommError> {
        work.synchronize()
    }
}
