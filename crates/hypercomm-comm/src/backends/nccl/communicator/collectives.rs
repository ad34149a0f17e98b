//! The NCCL flavor's executor: an [`Op`] the face has checked becomes NCCL calls on the communicator's stream (the
//! buffers' addresses taken there, an NCCL group for several calls, the handle's event after), or, while the
//! communicator is in an [`OpGroup`](crate::OpGroup), calls recorded for the group's end (see `group`).

use std::sync::Arc;

use super::super::flight::Partners;
use super::super::gpu::{DeviceBuffer, cuda_err};
use super::super::raw::{self, Call, Progress};
use super::{DeviceCommunicator, DeviceWork};
use crate::element::{DType, Element};
use crate::op::{Op, Shape};
use crate::{CommError, Work};

/// An out-of-place operation's `(input, output)` device buffers.
type Pair<T> = (DeviceBuffer<T>, DeviceBuffer<T>);

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

    /// Runs `calls` on this communicator's stream and wraps `value` (and the staging buffers in `keep`, which must
    /// outlive the work) in the operation's handle: enqueued now, with the handle's event after them, or, while
    /// the communicator is in an open group, recorded for the group's end, with a handle that completes once the
    /// group has issued them. The addresses in `calls` are taken as [`enqueue`](Self::enqueue) requires.
    pub(super) fn issue<R: Send + 'static>(
        &self,
        calls: &[Call],
        value: R,
        keep: Vec<DeviceBuffer<u8>>,
    ) -> Result<DeviceWork<R>, CommError> {
        let Some(group) = self.mark.current() else {
            self.enqueue(calls)?;
            return self.finish(value, keep);
        };
        // Numbered now (by `recorded`), watched once the group has issued it and recorded its event.
        let seq = self.comm.recorder.take_pending();
        let deferred = group.record(
            (&self.comm, &self.stream, &self.gpu),
            calls.to_vec(),
            value,
            keep,
            seq,
        )?;
        Ok(DeviceWork {
            value: None,
            event: None,
            deferred: Some(deferred),
            stream: Arc::clone(&self.stream),
            comm: Arc::clone(&self.comm),
            gpu: Arc::clone(&self.gpu),
            _keep: Vec::new(),
        })
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
        self.watch(&event)?;
        Ok(DeviceWork {
            value: Some(value),
            event: Some(event),
            deferred: None,
            stream: Arc::clone(&self.stream),
            comm: Arc::clone(&self.comm),
            gpu: Arc::clone(&self.gpu),
            _keep: keep,
        })
    }

    /// Runs the calls `make` builds from the address of `buf` and its length (or fails with `make`'s error before
    /// enqueueing anything), and hands `buf` to the returned handle.
    pub(super) fn one_buffer<T: Element, C: AsRef<[Call]>>(
        &self,
        mut buf: DeviceBuffer<T>,
        make: impl FnOnce(u64, usize) -> Result<C, CommError>,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        self.check_device("buffer", &buf)?;
        let count = buf.len();
        let p = buf.address_on(&self.stream);
        let calls = make(p, count)?;
        self.issue(calls.as_ref(), buf, Vec::new())
    }

    /// Runs the calls `make` builds from the addresses of `input` (read) and `output` (written), with both
    /// guards held across the enqueue, and hands both buffers to the returned handle. The caller checks lengths.
    pub(super) fn two_buffers<T: Element, C: AsRef<[Call]>>(
        &self,
        mut input: DeviceBuffer<T>,
        mut output: DeviceBuffer<T>,
        make: impl FnOnce(u64, u64) -> Result<C, CommError>,
    ) -> Result<DeviceWork<Pair<T>>, CommError> {
        self.check_device("input", &input)?;
        self.check_device("output", &output)?;
        let s = input.address_on(&self.stream);
        let r = output.address_on(&self.stream);
        let calls = make(s, r)?;
        self.issue(calls.as_ref(), (input, output), Vec::new())
    }

    /// A handle whose event follows the work enqueued so far: what a barrier on a communicator with a GPU waits for.
    /// Refused while the communicator is in an open group, whose operations are enqueued only at its end: a fence
    /// now would not follow them.
    pub(crate) fn fence(&self) -> Result<DeviceWork<()>, CommError> {
        self.refuse_in_group("a barrier (which waits for the device work issued before it)")?;
        self.finish((), Vec::new())
    }

    /// Runs `op`, which the face has checked, in place on `buf`.
    pub(crate) fn launch_one<T: Element>(
        &self,
        op: &Op,
        buf: DeviceBuffer<T>,
    ) -> Result<Work<DeviceBuffer<T>>, CommError> {
        let shape = Shape::InPlace(buf.len());
        self.recorded(op.name(), Partners::of(op), T::DTYPE, buf.len(), || {
            self.one_buffer(buf, |p, _| self.calls(op, shape, T::DTYPE, p, p))
        })
        .map(Work::from)
    }

    /// Runs `op`, which the face has checked, from `input` into `output`.
    pub(crate) fn launch_two<T: Element>(
        &self,
        op: &Op,
        input: DeviceBuffer<T>,
        output: DeviceBuffer<T>,
    ) -> Result<Work<Pair<T>>, CommError> {
        let shape = Shape::OutOfPlace {
            input: input.len(),
            output: output.len(),
        };
        let count = input.len();
        self.recorded(op.name(), Partners::of(op), T::DTYPE, count, || {
            self.two_buffers(input, output, |s, r| self.calls(op, shape, T::DTYPE, s, r))
        })
        .map(Work::from)
    }

    /// Runs the batch `op`, which the face has checked, over `bufs` (one per part, all on this device) as one
    /// NCCL group of sends and receives.
    pub(crate) fn launch_many<T: Element>(
        &self,
        op: &Op,
        mut bufs: Vec<DeviceBuffer<T>>,
    ) -> Result<Work<Vec<DeviceBuffer<T>>>, CommError> {
        let Op::Batch(messages) = op else {
            return Err(self.invalid(format!("{} is not a batch", op.name())));
        };
        if let Some(m) = messages.iter().find(|m| m.tag != 0) {
            return Err(self.invalid(format!(
                "batch part with tag {} on a device buffer: NCCL matches messages by order and has no tags; \
                 pass tag 0 to peer {}",
                m.tag, m.peer
            )));
        }
        for b in &bufs {
            self.check_device("batch part", b)?;
        }
        // Every buffer's address is taken (and ordered on this stream) while the buffers are held here, and the
        // buffers go to the handle after the enqueue.
        let calls: Vec<Call> = bufs
            .iter_mut()
            .zip(messages)
            .map(|(b, m)| {
                let buf = b.address_on(&self.stream);
                let (count, dtype, peer) = (m.count, T::DTYPE, m.peer);
                if m.send {
                    Call::Send {
                        buf,
                        count,
                        dtype,
                        peer,
                    }
                } else {
                    Call::Recv {
                        buf,
                        count,
                        dtype,
                        peer,
                    }
                }
            })
            .collect();
        let count = bufs.iter().map(DeviceBuffer::len).sum();
        self.recorded(op.name(), Partners::of(op), T::DTYPE, count, || {
            self.issue(&calls, bufs, Vec::new())
        })
        .map(Work::from)
    }

    /// The NCCL calls that run `op` over buffers of `shape` at device addresses `send` (read) and `recv`
    /// (written; the same address in place), as one group when there are several; or why NCCL cannot run it.
    fn calls(
        &self,
        op: &Op,
        shape: Shape,
        dtype: DType,
        send: u64,
        recv: u64,
    ) -> Result<Vec<Call>, CommError> {
        let (n, rank, width) = (self.size(), self.rank, dtype.size() as u64);
        let at = |base: u64, elements: usize| base + elements as u64 * width;
        let (input, output) = match shape {
            Shape::InPlace(len) => (len, len),
            Shape::OutOfPlace { input, output } => (input, output),
            Shape::Parts(_) => {
                return Err(self.invalid(format!("{} takes a buffer per part", op.name())));
            }
        };
        let in_place = matches!(shape, Shape::InPlace(_));
        let send_to = |buf, count, peer| Call::Send {
            buf,
            count,
            dtype,
            peer,
        };
        let recv_from = |buf, count, peer| Call::Recv {
            buf,
            count,
            dtype,
            peer,
        };
        // NCCL's reduction on this communicator (a premulsum's created here the first time).
        let reduction = |op| self.comm.reduction(op, dtype);
        Ok(match op {
            Op::AllReduce(op) => vec![Call::AllReduce {
                send,
                recv,
                count: input,
                dtype,
                op: reduction(*op)?,
            }],
            Op::Broadcast { root } => vec![Call::Broadcast {
                send,
                recv,
                count: output,
                dtype,
                root: *root,
            }],
            Op::Reduce { op, root } => vec![Call::Reduce {
                send,
                recv,
                count: input,
                dtype,
                op: reduction(*op)?,
                root: *root,
            }],
            // In place, NCCL reads this rank's block where the output keeps it.
            Op::AllGather => {
                let count = if in_place { output / n } else { input };
                let from = if in_place {
                    at(recv, rank * count)
                } else {
                    send
                };
                vec![Call::AllGather {
                    send: from,
                    recv,
                    count,
                    dtype,
                }]
            }
            // In place, NCCL writes this rank's result into its own block of the input.
            Op::ReduceScatter(op) => {
                let count = if in_place { input / n } else { output };
                let to = if in_place {
                    at(send, rank * count)
                } else {
                    recv
                };
                vec![Call::ReduceScatter {
                    send,
                    recv: to,
                    count,
                    dtype,
                    op: reduction(*op)?,
                }]
            }
            Op::AllToAll if in_place => {
                return Err(self.invalid(
                    "all_to_all in place is not available on a device buffer: NCCL's sends and receives \
                     cannot share one buffer; use all_to_all_into with a separate output"
                        .into(),
                ));
            }
            // One group of sends and receives: works on every NCCL with point-to-point, not only 2.28's
            // ncclAlltoAll.
            Op::AllToAll => {
                let block = input / n;
                (0..n)
                    .flat_map(|peer| {
                        [
                            send_to(at(send, peer * block), block, peer),
                            recv_from(at(recv, peer * block), block, peer),
                        ]
                    })
                    .collect()
            }
            Op::AllToAllV {
                send_counts,
                recv_counts,
            } => {
                let offsets = |counts: &[usize]| {
                    counts
                        .iter()
                        .scan(0, |next, &c| {
                            let at = *next;
                            *next += c;
                            Some(at)
                        })
                        .collect::<Vec<usize>>()
                };
                let (sends, recvs) = (offsets(send_counts), offsets(recv_counts));
                let mut calls = Vec::with_capacity(2 * n);
                for peer in 0..n {
                    if send_counts[peer] > 0 {
                        calls.push(send_to(at(send, sends[peer]), send_counts[peer], peer));
                    }
                    if recv_counts[peer] > 0 {
                        calls.push(recv_from(at(recv, recvs[peer]), recv_counts[peer], peer));
                    }
                }
                calls
            }
            // Sends and receives in one group, this rank's own block included (NCCL sends to itself within a
            // group); a zero count is skipped on both sides alike, since every rank holds the same counts.
            Op::AllGatherV { counts } => {
                let mut calls = Vec::with_capacity(2 * n);
                let mut at_block = 0;
                for (peer, &count) in counts.iter().enumerate() {
                    if counts[rank] > 0 {
                        calls.push(send_to(send, counts[rank], peer));
                    }
                    if count > 0 {
                        calls.push(recv_from(at(recv, at_block), count, peer));
                    }
                    at_block += count;
                }
                calls
            }
            // One ncclReduce per block, rank r the root of block r, in one group (as torchcomms does).
            Op::ReduceScatterV { op, counts } => {
                let op = reduction(*op)?;
                let mut calls = Vec::with_capacity(n);
                let mut at_block = 0;
                for (root, &count) in counts.iter().enumerate() {
                    if count > 0 {
                        calls.push(Call::Reduce {
                            send: at(send, at_block),
                            recv,
                            count,
                            dtype,
                            op,
                            root,
                        });
                    }
                    at_block += count;
                }
                calls
            }
            // Point-to-point in one group (NCCL sends to itself within a group), so it runs on NCCL versions
            // without ncclGather.
            Op::Gather { root } => {
                let mut calls = vec![send_to(send, input, *root)];
                if rank == *root {
                    calls.extend((0..n).map(|r| recv_from(at(recv, r * input), input, r)));
                }
                calls
            }
            Op::Scatter { root } => {
                let mut calls = Vec::with_capacity(n + 1);
                if rank == *root {
                    calls.extend((0..n).map(|r| send_to(at(send, r * output), output, r)));
                }
                calls.push(recv_from(recv, output, *root));
                calls
            }
            Op::Send { peer, tag } | Op::Recv { peer, tag } if *tag != 0 => {
                return Err(self.invalid(format!(
                    "{} with tag {tag} on a device buffer: NCCL matches messages by order and has no tags; \
                     pass tag 0 to {} peer {peer}",
                    op.name(),
                    op.name()
                )));
            }
            Op::Send { peer, .. } => vec![send_to(send, input, *peer)],
            Op::Recv { peer, .. } => vec![recv_from(recv, output, *peer)],
            Op::Batch(_) => {
                return Err(self.invalid("a batch takes a buffer per part".into()));
            }
        })
    }
}
