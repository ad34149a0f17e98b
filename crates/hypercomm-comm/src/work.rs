//! [`Work`]: the handle of one operation, whichever flavor runs it.
//!
//! Why ownership: an asynchronous operation reads and writes its buffers after the call returns, so the caller
//! must not touch them until it completes. The simplest design the compiler checks without `unsafe` is to move the
//! buffers into the operation and hand them back from the handle. There is no way to reach a buffer that is still
//! in use, and dropping a handle early is harmless (the operation finishes and frees its buffers).
//!
//! Two ways to take the buffers back:
//! - [`Work::wait`] blocks the calling thread until the operation has completed. Host buffers come back filled;
//!   device buffers come back after the device has finished the operation. Bounded by the communicator's timeout.
//! - [`Work::wait_on`] makes a CUDA stream wait for the operation instead, without blocking the CPU: work the caller
//!   enqueues on that stream afterwards sees the result. For a host operation, which has no stream, it is
//!   [`Work::wait`].
//!
//! A device operation is bounded by its communicator's timeout whichever way it is waited for, or if its handle is
//! dropped: its GPU's watchdog watches it until it completes, and past the timeout (or on an asynchronous NCCL
//! error) stops the communicator, so a stream ordered after it goes on, and every communicator of its failure
//! domain, whose next call or wait fails with the recorded cause.

use std::time::Duration;

use cudarc::driver::CudaStream;

use crate::CommError;
use crate::backends::nccl::communicator::DeviceWork;
use crate::host_work::HostWork;

/// The pending result of an operation: the buffers it took, or the error that stopped it.
///
/// Operations on one communicator and one flavor complete in the order they were issued, except host sends and
/// receives issued back to back, which progress together and complete each on its own. A device operation issued
/// inside an [`OpGroup`](crate::OpGroup) starts only when the group ends: until then it is not completed, and
/// waiting on it fails at once rather than hang.
#[must_use = "an operation's buffers come back only through wait() or wait_on()"]
pub struct Work<R> {
    flavor: Flavor<R>,
}

enum Flavor<R> {
    Host(HostWork<R>),
    Device(DeviceWork<R>),
}

impl<R> From<HostWork<R>> for Work<R> {
    fn from(work: HostWork<R>) -> Self {
        Work {
            flavor: Flavor::Host(work),
        }
    }
}

impl<R> From<DeviceWork<R>> for Work<R> {
    fn from(work: DeviceWork<R>) -> Self {
        Work {
            flavor: Flavor::Device(work),
        }
    }
}

impl<R> Work<R> {
    /// Blocks until the operation completes and gives its buffers back, or its error. A host operation that has
    /// not started and is its communicator's next runs here, on the calling thread. A device operation is polled
    /// for NCCL's asynchronous errors meanwhile; past the communicator's timeout its communicator is aborted and
    /// this fails.
    pub fn wait(self) -> Result<R, CommError> {
        match self.flavor {
            Flavor::Host(w) => w.wait(),
            Flavor::Device(w) => w.synchronize(),
        }
    }

    /// Orders `stream` after the operation and gives its buffers back, without blocking the CPU on a device
    /// operation (on the communicator's own stream this costs nothing); the GPU's watchdog still bounds the
    /// operation by the communicator's timeout. A host operation has no stream to order: this waits for it, as
    /// [`wait`](Self::wait) does.
    pub fn wait_on(self, stream: &CudaStream) -> Result<R, CommError> {
        match self.flavor {
            Flavor::Host(w) => w.wait(),
            Flavor::Device(w) => w.wait(stream),
        }
    }

    /// Waits up to `timeout` for completion and says whether the operation has completed; the result stays in
    /// the handle for [`wait`](Self::wait).
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        match &self.flavor {
            Flavor::Host(w) => w.wait_timeout(timeout),
            Flavor::Device(w) => w.wait_timeout(timeout),
        }
    }

    /// Whether the operation has completed (successfully or not). Never blocks.
    pub fn is_completed(&self) -> bool {
        match &self.flavor {
            Flavor::Host(w) => w.is_completed(),
            Flavor::Device(w) => w.is_completed(),
        }
    }

    /// Whether a device flavor runs the operation (its buffers live on a GPU).
    pub fn is_device(&self) -> bool {
        matches!(self.flavor, Flavor::Device(_))
    }
}

impl<R> std::fmt::Debug for Work<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("device", &self.is_device())
            .field("completed", &self.is_completed())
            .finish()
    }
}
