//! [`DeviceWork`]: the NCCL flavor's handle of an operation, holding its buffers until the operation is ordered
//! ([`DeviceWork::wait`] on a stream) or done ([`DeviceWork::synchronize`]). The public [`Work`](crate::Work)
//! wraps it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;

use super::super::backoff::Backoff;
use super::super::comm::NcclComm;
use super::super::events::SharedEvent;
use super::super::gpu::{DeviceBuffer, Gpu, cuda_err};
use super::group::Deferred;
use crate::CommError;

/// The pending result of a device operation: the buffers it took, once the operation is ordered or done.
///
/// An operation issued inside an [`OpGroup`](crate::OpGroup) starts without buffers or event: they wait in its
/// `deferred` slot until the group ends, and every way of waiting takes them from there first
/// ([`DeviceWork::settle`]); before the end that is an error, not a wait.
pub(crate) struct DeviceWork<R> {
    pub(super) value: Option<R>,
    pub(super) event: Option<SharedEvent>,
    /// The slot of an operation recorded in a group, until the handle takes the buffers and the event from it.
    pub(super) deferred: Option<Arc<Deferred<R>>>,
    /// The stream the operation was enqueued on.
    pub(super) stream: Arc<CudaStream>,
    pub(super) comm: Arc<NcclComm>,
    pub(super) gpu: Arc<Gpu>,
    /// Staging buffers that must outlive the operation.
    pub(super) _keep: Vec<DeviceBuffer<u8>>,
}

impl<R> DeviceWork<R> {
    /// Makes `stream` wait for the operation (no CPU block) and gives the buffers back. Work enqueued on
    /// `stream` afterwards sees the result. On the communicator's own stream this costs nothing: the stream
    /// already runs in order.
    pub(crate) fn wait(mut self, stream: &CudaStream) -> Result<R, CommError> {
        self.settle()?;
        self.fail_if_broken()?;
        if stream.cu_stream() == self.stream.cu_stream() {
            return self.take();
        }
        if let Some(event) = &self.event {
            stream.wait(event).map_err(cuda_err(
                &self.comm.name,
                "making a stream wait on an event",
            ))?;
        }
        self.take()
    }

    /// Blocks the CPU until the operation completes (or the communicator's timeout passes, which aborts it) and
    /// gives the buffers back.
    pub(crate) fn synchronize(mut self) -> Result<R, CommError> {
        self.settle()?;
        match &self.event {
            Some(e) => self.comm.wait_event(e, "waiting for an operation")?,
            None => {
                self.fail_if_broken()?;
                self.comm.poll("checking a completed operation")?;
            }
        }
        self.take()
    }

    /// Whether the operation has finished on the device. Never blocks.
    pub(crate) fn is_completed(&self) -> bool {
        match &self.deferred {
            Some(deferred) => deferred.is_settled(),
            None => self.event.as_ref().is_none_or(|e| e.is_complete()),
        }
    }

    /// Waits up to `timeout` for the operation to finish on the device (for one in a group, for the group to
    /// end first); says whether it has.
    pub(crate) fn wait_timeout(&self, timeout: Duration) -> bool {
        if self.deferred.is_none() && self.event.is_none() {
            return true;
        }
        let deadline = Instant::now() + timeout;
        let mut backoff = Backoff::new(Duration::from_micros(200));
        // Bounded by the deadline.
        loop {
            if self.is_completed() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            backoff.pause();
        }
    }

    /// For an operation recorded in a group: takes its buffers and event from the slot once the group has
    /// issued it; fails while the group is open (the operation has not started, so waiting could only hang), or
    /// when the group failed or was dropped. Before the end the buffers stay in the slot, which the group holds
    /// until its calls are enqueued, whatever becomes of the handle.
    fn settle(&mut self) -> Result<(), CommError> {
        if let Some(deferred) = &self.deferred {
            let (value, event) = deferred.take(&self.comm.name)?;
            self.value = Some(value);
            self.event = Some(event);
            self.deferred = None;
        }
        Ok(())
    }

    fn fail_if_broken(&self) -> Result<(), CommError> {
        match self.comm.broken() {
            Some(cause) => Err(self.comm.broken_error(cause)),
            None => Ok(()),
        }
    }

    fn take(&mut self) -> Result<R, CommError> {
        self.value.take().ok_or_else(|| {
            CommError::broken(
                &self.comm.name,
                "the operation's buffers were already taken",
                None,
            )
        })
    }
}

impl<R> Drop for DeviceWork<R> {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            self.gpu.return_event(e);
        }
        if let Some(e) = self.deferred.as_ref().and_then(|d| d.take_event()) {
            self.gpu.return_event(e);
        }
    }
}
