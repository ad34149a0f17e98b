//! The collectives and point-to-point operations of a [`DeviceCommunicator`], and how each is enqueued: the
//! buffers' addresses on the communicator's stream, an NCCL group for several calls, the handle's event after.

use std::sync::Arc;

use super::super::gpu::{DeviceBuffer, cuda_err};
use super::super::raw::{self, Call, Progress};
use super::{DeviceCommunicator, DeviceInOut, DeviceWork};
use crate::CommError;
use crate::element::{Element, ReduceOp};

impl DeviceCommunicator {
    /// Enqueues `calls` on this communicator's stream, as one NCCL group when there are several.
    ///
    /// Every address in `calls` comes from [`DeviceBuffer::address_on`] on this stream, taken while the caller
    /// holds the buffer, which it hands to the returned handle afterwards: the buffer's release, and any use on
    /// another stream, wait for this work.
    pub(super) fn enqueue(&self, calls: &[Call]) -> Result<(), CommError> {
        let nccl = self.gpu.runtime().nccl();
        let stream = self.stream.cu_stream() as nccl_sys::sys::cudaStream_t;
        let pending = self.comm.with_handle(|h| {
            let err = |e| self.comm.error("enqueueing", e);
            let grouped = calls.len() > 1;
            if grouped {
                raw::group_start(nccl).map_err(err)?;
            }
            let mut pending = false;
            let mut failed = None;
            for &call in calls {
                // SAFETY: `h` is live and serialised by `with_handle`; `stream` belongs to this communicator's
                // device; every address in `calls` comes from a buffer on this device that the caller checked
                // is large enough, and whose guard the caller holds, and which the returned handle keeps until
                // the work completes.
                match unsafe { raw::enqueue(nccl, h, call, stream) } {
                    Ok(p) => pending |= p == Progress::Pending,
                    Err(e) => {
                        failed = Some(err(e));
                        break;
                    }
                }
            }
            if grouped {
                // Close the group even after a failed call: NCCL's group state belongs to this thread, and a
                // group left open would swallow its later calls on every communicator.
                let end = raw::group_end(nccl);
                if failed.is_none() {
                    pending |= end.map_err(err)? == Progress::Pending;
                }
            }
            match failed {
                Some(e) => Err(e),
                None => Ok(pending),
            }
        })?;
        if pending {
            self.comm.wait_ready("enqueueing")?;
        }
        Ok(())
    }

    /// Records the handle's event after everything enqueued so far on the stream, and wraps `value` (and the
    /// staging buffers in `keep`, which must outlive the work).
    pub(super) fn finish<R>(
        &self,
        value: R,
        keep: Vec<DeviceBuffer<u8>>,
    ) -> Result<DeviceWork<R>, CommError> {
        let event = self.gpu.take_event()?;
        if let Err(e) = event.record(&self.stream) {
            self.gpu.return_event(event);
            return Err(cuda_err(&self.options.name, "recording an event")(e));
        }
        Ok(DeviceWork {
            value: Some(value),
            event: Some(event),
            stream: Arc::clone(&self.stream),
            comm: Arc::clone(&self.comm),
            gpu: Arc::clone(&self.gpu),
            _keep: keep,
        })
    }

    /// Runs the calls `make` builds from the address of `buf` and its length, and hands `buf` to the returned
    /// handle.
    pub(super) fn one_buffer<T: Element, C: AsRef<[Call]>>(
        &self,
        mut buf: DeviceBuffer<T>,
        make: impl FnOnce(u64, usize) -> C,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        self.check_device("buffer", &buf)?;
        let count = buf.len();
        let p = buf.address_on(&self.stream);
        self.enqueue(make(p, count).as_ref())?;
        self.finish(buf, Vec::new())
    }

    /// Runs the calls `make` builds from the addresses of `input` (read) and `output` (written), with both
    /// guards held across the enqueue, and hands both buffers to the returned handle. The caller checks lengths.
    pub(super) fn two_buffers<T: Element, C: AsRef<[Call]>>(
        &self,
        mut input: DeviceBuffer<T>,
        mut output: DeviceBuffer<T>,
        make: impl FnOnce(u64, u64) -> C,
    ) -> Result<DeviceWork<DeviceInOut<T>>, CommError> {
        self.check_device("input", &input)?;
        self.check_device("output", &output)?;
        let s = input.address_on(&self.stream);
        let r = output.address_on(&self.stream);
        self.enqueue(make(s, r).as_ref())?;
        self.finish((input, output), Vec::new())
    }

    /// All-reduce in place.
    pub fn all_reduce<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        self.one_buffer(buf, |p, count| {
            [Call::AllReduce {
                send: p,
                recv: p,
                count,
                dtype: T::DTYPE,
                op,
            }]
        })
    }

    /// All-reduce out of place; returns `(input, output)`.
    pub fn all_reduce_into<T: Element>(
        &self,
        input: DeviceBuffer<T>,
        output: DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork<DeviceInOut<T>>, CommError> {
        self.check_len("all_reduce output", output.len(), input.len())?;
        let count = input.len();
        self.two_buffers(input, output, |send, recv| {
            [Call::AllReduce {
                send,
                recv,
                count,
                dtype: T::DTYPE,
                op,
            }]
        })
    }

    /// Broadcast in place from `root`.
    pub fn broadcast<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        root: usize,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        self.check_root(root)?;
        self.one_buffer(buf, |p, count| {
            [Call::Broadcast {
                send: p,
                recv: p,
                count,
                dtype: T::DTYPE,
                root,
            }]
        })
    }

    /// Reduce in place to `root` (other ranks' buffers are left unchanged).
    pub fn reduce<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        self.check_root(root)?;
        self.one_buffer(buf, |p, count| {
            [Call::Reduce {
                send: p,
                recv: p,
                count,
                dtype: T::DTYPE,
                op,
                root,
            }]
        })
    }

    /// All-gather: `output` (`size() * input.len()`) receives every rank's `input` in rank order.
    pub fn all_gather_into<T: Element>(
        &self,
        input: DeviceBuffer<T>,
        output: DeviceBuffer<T>,
    ) -> Result<DeviceWork<DeviceInOut<T>>, CommError> {
        self.check_len("all_gather output", output.len(), input.len() * self.size())?;
        let count = input.len();
        self.two_buffers(input, output, |send, recv| {
            [Call::AllGather {
                send,
                recv,
                count,
                dtype: T::DTYPE,
            }]
        })
    }

    /// Reduce-scatter: `input` holds `size()` blocks of `output.len()`; `output` receives the reduction of every
    /// rank's block `rank()`.
    pub fn reduce_scatter_into<T: Element>(
        &self,
        input: DeviceBuffer<T>,
        output: DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork<DeviceInOut<T>>, CommError> {
        self.check_len(
            "reduce_scatter input",
            input.len(),
            output.len() * self.size(),
        )?;
        let count = output.len();
        self.two_buffers(input, output, |send, recv| {
            [Call::ReduceScatter {
                send,
                recv,
                count,
                dtype: T::DTYPE,
                op,
            }]
        })
    }

    /// All-to-all with equal blocks, as one NCCL group of sends and receives (works on every NCCL with
    /// send/recv, not only 2.28's `ncclAlltoAll`).
    pub fn all_to_all_into<T: Element>(
        &self,
        input: DeviceBuffer<T>,
        output: DeviceBuffer<T>,
    ) -> Result<DeviceWork<DeviceInOut<T>>, CommError> {
        self.check_len("all_to_all output", output.len(), input.len())?;
        let n = self.size();
        if input.len() % n != 0 {
            return Err(self.invalid(format!(
                "all_to_all input has {} elements, not a multiple of {n} ranks",
                input.len()
            )));
        }
        let block = input.len() / n;
        let bytes = (block * T::DTYPE.size()) as u64;
        self.two_buffers(input, output, |s, r| {
            (0..n)
                .flat_map(|peer| {
                    let off = peer as u64 * bytes;
                    [
                        Call::Send {
                            buf: s + off,
                            count: block,
                            dtype: T::DTYPE,
                            peer,
                        },
                        Call::Recv {
                            buf: r + off,
                            count: block,
                            dtype: T::DTYPE,
                            peer,
                        },
                    ]
                })
                .collect::<Vec<Call>>()
        })
    }

    /// Sends `buf` to `peer` (another rank; NCCL matches sends and receives between two ranks by order, and an
    /// ungrouped send waits until the peer receives).
    pub fn send<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        peer: usize,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        self.check_peer(peer)?;
        self.one_buffer(buf, |p, count| {
            [Call::Send {
                buf: p,
                count,
                dtype: T::DTYPE,
                peer,
            }]
        })
    }

    /// Receives into `buf` from `peer`.
    pub fn recv<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        peer: usize,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        self.check_peer(peer)?;
        self.one_buffer(buf, |p, count| {
            [Call::Recv {
                buf: p,
                count,
                dtype: T::DTYPE,
                peer,
            }]
        })
    }
}
