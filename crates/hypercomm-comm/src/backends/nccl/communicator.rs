//! [`DeviceCommunicator`]: collectives on device memory through NCCL, and [`DeviceWork`], their handles.
//!
//! Buffers move into an operation and come back from its handle, as on the host face. The handle holds a CUDA
//! event (from the [`Gpu`]'s pool) recorded on the communicator's stream after the operation:
//! [`DeviceWork::wait`] makes another stream wait on it without blocking the CPU; [`DeviceWork::synchronize`]
//! blocks the CPU until it completes, polling NCCL for asynchronous errors, and aborts the communicator when the
//! timeout passes (every other pending handle then fails too).

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use hypercomm_store::Store;

use super::comm::NcclComm;
use super::config::{NcclSettings, StreamPriority, translate};
use super::gpu::{DeviceBuffer, Gpu, cuda_err};
use super::raw::{self, Call, Progress};
use super::unique_id::exchange_unique_id;
use crate::CommError;
use crate::device::StridedLayout;
use crate::element::{Element, ReduceOp};
use crate::options::CommOptions;

/// A communicator whose collectives run on one GPU through NCCL.
pub struct DeviceCommunicator {
    /// Splits and shrinks made so far, numbering the children's names as the host communicator does.
    children: std::sync::atomic::AtomicUsize,
    gpu: Arc<Gpu>,
    comm: Arc<NcclComm>,
    stream: Arc<CudaStream>,
    options: CommOptions,
    ranks: Vec<usize>,
    rank: usize,
}

impl std::fmt::Debug for DeviceCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCommunicator")
            .field("name", &self.options.name)
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .field("device", &self.gpu.ordinal())
            .finish()
    }
}

/// The pending result of a device operation: the buffers it took, once the operation is ordered or done.
#[must_use = "an operation's buffers come back only through wait() or synchronize()"]
pub struct DeviceWork<R> {
    value: Option<R>,
    event: Option<CudaEvent>,
    /// The stream the operation was enqueued on.
    stream: Arc<CudaStream>,
    comm: Arc<NcclComm>,
    gpu: Arc<Gpu>,
    /// Staging buffers that must outlive the operation.
    _keep: Vec<DeviceBuffer<u8>>,
}

impl<R> DeviceWork<R> {
    /// Makes `stream` wait for the operation (no CPU block) and gives the buffers back. Work enqueued on
    /// `stream` afterwards sees the result. On the communicator's own stream this costs nothing: the stream
    /// already runs in order.
    pub fn wait(mut self, stream: &CudaStream) -> Result<R, CommError> {
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
    pub fn synchronize(mut self) -> Result<R, CommError> {
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
    pub fn is_completed(&self) -> bool {
        self.event.as_ref().is_none_or(|e| e.is_complete())
    }

    fn fail_if_broken(&self) -> Result<(), CommError> {
        match self.comm.broken() {
            Some(cause) => Err(CommError::Broken {
                comm: self.comm.name.clone(),
                cause,
            }),
            None => Ok(()),
        }
    }

    fn take(&mut self) -> Result<R, CommError> {
        self.value.take().ok_or_else(|| CommError::Broken {
            comm: self.comm.name.clone(),
            cause: "the operation's buffers were already taken".into(),
        })
    }
}

impl<R> Drop for DeviceWork<R> {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            self.gpu.return_event(e);
        }
    }
}

/// What an out-of-place device operation gives back: `(input, output)`.
pub type DeviceInOut<T> = (DeviceBuffer<T>, DeviceBuffer<T>);

impl DeviceCommunicator {
    /// Joins communicator `options.name` over `ranks` as member `me`, on `gpu`. Rank 0 makes the NCCL unique id
    /// and publishes it in `store`; the others read it. Collective; bounded by `options.timeout`.
    pub fn new(
        gpu: Arc<Gpu>,
        store: Arc<dyn Store>,
        ranks: Vec<usize>,
        me: usize,
        options: CommOptions,
    ) -> Result<DeviceCommunicator, CommError> {
        let nccl = gpu.runtime().nccl();
        let settings = translate(&options, nccl.version())?;
        let rank = member_position(&options.name, &ranks, me)?;
        let id = exchange_unique_id(store.as_ref(), &options.name, rank, options.timeout, || {
            raw::unique_id(nccl).map_err(|e| nccl_err(&options.name, "ncclGetUniqueId", e))
        })?;
        gpu.context()
            .bind_to_thread()
            .map_err(cuda_err(&options.name, "binding the context"))?;
        let (handle, first) = raw::init_rank(nccl, ranks.len(), &id, rank, &settings)
            .map_err(|e| nccl_err(&options.name, "creating the communicator", e))?;
        let comm = NcclComm::adopt(
            Arc::clone(gpu.runtime()),
            handle,
            first,
            options.name.clone(),
            options.timeout,
            settings.non_blocking(),
        )?;
        Self::assemble(gpu, comm, settings, options, ranks, rank)
    }

    fn assemble(
        gpu: Arc<Gpu>,
        comm: NcclComm,
        settings: NcclSettings,
        options: CommOptions,
        ranks: Vec<usize>,
        rank: usize,
    ) -> Result<DeviceCommunicator, CommError> {
        let stream = gpu.stream(settings.stream_priority == StreamPriority::Highest)?;
        Ok(DeviceCommunicator {
            children: std::sync::atomic::AtomicUsize::new(0),
            gpu,
            comm: Arc::new(comm),
            stream,
            options,
            ranks,
            rank,
        })
    }

    /// This communicator with its member list given as `members` (for instance the global ranks of a split
    /// child, whose NCCL ranks are positions). `me` is this process's entry: it must be `members[self.rank()]`,
    /// and `members` must have one entry per rank, with no repeats.
    pub fn with_members(mut self, members: Vec<usize>, me: usize) -> Result<Self, CommError> {
        if members.len() != self.size() || members.get(self.rank) != Some(&me) {
            return Err(self.invalid(format!(
                "member list {members:?} does not fit a {}-rank communicator where rank {me} is rank {}",
                self.size(),
                self.rank
            )));
        }
        member_position(&self.options.name, &members, me)?;
        self.ranks = members;
        Ok(self)
    }

    fn next_child(&self) -> usize {
        self.children
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// This rank's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// The member list.
    pub fn ranks(&self) -> &[usize] {
        &self.ranks
    }

    /// The communicator's name.
    pub fn name(&self) -> &str {
        &self.options.name
    }

    /// The device.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The stream every operation of this communicator runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The NCCL communicator itself (for the benchmark's raw-call baseline).
    pub(crate) fn nccl_comm(&self) -> &NcclComm {
        &self.comm
    }

    /// The options it was created with.
    pub fn options(&self) -> &CommOptions {
        &self.options
    }

    /// The first fatal error, if the communicator is broken.
    pub fn broken(&self) -> Option<String> {
        self.comm.broken()
    }

    /// Polls NCCL for an asynchronous error (a failed peer, a network error); such an error breaks the
    /// communicator.
    pub fn check(&self) -> Result<(), CommError> {
        self.comm.poll("checking the communicator").map(|_| ())
    }

    /// Aborts: NCCL's work on this communicator stops, and every pending and later operation fails.
    pub fn abort(&self) {
        self.comm.abort();
    }

    /// Splits with `ncclCommSplit`, NCCL's semantics: equal `color`s form a child ordered by `key`, then rank;
    /// `None` joins nothing. Collective over this communicator. The child's name is
    /// `<parent>/split<n>/color<c>`, `n` counting this communicator's splits and shrinks from 0 (as on the host),
    /// so two splits never share a name; use [`split_with`](Self::split_with) for other options.
    pub fn split(
        &self,
        color: Option<u32>,
        key: i64,
    ) -> Result<Option<DeviceCommunicator>, CommError> {
        let n = self.next_child();
        let name = format!(
            "{}/split{n}/color{}",
            self.options.name,
            color.map_or("none".to_owned(), |c| c.to_string())
        );
        self.split_with(
            color,
            key,
            CommOptions {
                name,
                ..self.options.clone()
            },
        )
    }

    /// [`split`](Self::split) with the child's options (its `ncclConfig_t`).
    pub fn split_with(
        &self,
        color: Option<u32>,
        key: i64,
        options: CommOptions,
    ) -> Result<Option<DeviceCommunicator>, CommError> {
        if let Some(c) = color
            && i32::try_from(c).is_err()
        {
            return Err(self.invalid(format!("color {c} does not fit nccl's int colors")));
        }
        let nccl = self.gpu.runtime().nccl();
        let settings = translate(&options, nccl.version())?;
        let (mut slot, first) = self.comm.with_handle(|parent| {
            raw::split(nccl, parent, color, key, &settings)
                .map_err(|e| self.comm.error("ncclCommSplit", e))
        })?;
        // A non-blocking split is in progress on the parent, and NCCL writes the child into the slot only when it
        // completes: wait for the parent to settle before reading it. (On an error the slot is leaked, not
        // freed: NCCL may still write to it.)
        if first == Progress::Pending {
            self.comm.wait_ready("splitting")?;
        }
        slot.settle();
        let handle = match (color, slot.child()) {
            (None, _) => return Ok(None),
            (Some(_), Some(h)) => h,
            (Some(c), None) => {
                return Err(self.comm.error_text(
                    "ncclCommSplit",
                    format!("the split with color {c} completed without a child communicator"),
                ));
            }
        };
        let child = NcclComm::adopt(
            Arc::clone(self.gpu.runtime()),
            handle,
            Progress::Pending,
            options.name.clone(),
            options.timeout,
            settings.non_blocking(),
        )?;
        let count = child.count()?;
        let rank = child.user_rank()?;
        Self::assemble(
            Arc::clone(&self.gpu),
            child,
            settings,
            options,
            (0..count).collect(),
            rank,
        )
        .map(Some)
    }

    /// A communicator without the ranks in `exclude` (positions in this communicator), with `ncclCommShrink`
    /// (NCCL 2.27 or newer; older is [`CommError::Unavailable`]). With `abort_first`, in-flight work is aborted
    /// first, for shrinking after a failure. Collective over the remaining ranks.
    pub fn shrink(
        &self,
        exclude: &[usize],
        abort_first: bool,
    ) -> Result<DeviceCommunicator, CommError> {
        let nccl = self.gpu.runtime().nccl();
        nccl.require(nccl_sys::Function::CommShrink)
            .map_err(|e| CommError::Unavailable {
                what: "ncclCommShrink".into(),
                why: e.to_string(),
            })?;
        if let Some(&bad) = exclude.iter().find(|&&r| r >= self.size()) {
            return Err(self.invalid(format!(
                "rank {bad} to exclude is not a rank of a {}-rank communicator",
                self.size()
            )));
        }
        let options = CommOptions {
            name: format!("{}/shrink{}", self.options.name, self.next_child()),
            ..self.options.clone()
        };
        let settings = translate(&options, nccl.version())?;
        let (mut slot, first) = self.comm.with_handle(|parent| {
            raw::shrink(nccl, parent, exclude, &settings, abort_first)
                .map_err(|e| self.comm.error("ncclCommShrink", e))
        })?;
        // As for split: the child is written when the shrink completes on the parent.
        if first == Progress::Pending {
            self.comm.wait_ready("shrinking")?;
        }
        slot.settle();
        let handle = slot.child().ok_or_else(|| {
            self.comm.error_text(
                "ncclCommShrink",
                "the shrink completed without a child communicator".into(),
            )
        })?;
        let child = NcclComm::adopt(
            Arc::clone(self.gpu.runtime()),
            handle,
            Progress::Pending,
            options.name.clone(),
            options.timeout,
            settings.non_blocking(),
        )?;
        let ranks: Vec<usize> = (0..self.size())
            .filter(|r| !exclude.contains(r))
            .map(|r| self.ranks[r])
            .collect();
        let rank = child.user_rank()?;
        Self::assemble(Arc::clone(&self.gpu), child, settings, options, ranks, rank)
    }

    fn invalid(&self, what: String) -> CommError {
        crate::checks::invalid(&self.options.name, what)
    }

    fn check_device<T: Element>(&self, what: &str, b: &DeviceBuffer<T>) -> Result<(), CommError> {
        if b.device() != self.gpu.ordinal() {
            return Err(self.invalid(format!(
                "{what} is on device {} but the communicator is on device {}",
                b.device(),
                self.gpu.ordinal()
            )));
        }
        Ok(())
    }

    fn check_root(&self, root: usize) -> Result<(), CommError> {
        crate::checks::root(&self.options.name, self.size(), root)
    }

    fn check_peer(&self, peer: usize) -> Result<(), CommError> {
        crate::checks::peer(&self.options.name, self.size(), self.rank, peer)
    }

    fn check_len(&self, what: &str, got: usize, expected: usize) -> Result<(), CommError> {
        crate::checks::len(&self.options.name, what, got, expected)
    }

    /// Enqueues `calls` on this communicator's stream, as one NCCL group when there are several.
    ///
    /// Callers hold the cudarc guards of every buffer named in `calls` (from [`DeviceBuffer::read_ptr`] and
    /// [`DeviceBuffer::write_ptr`]) until this returns: the guards record the buffers' read and write events when
    /// they drop, and those events must come after the NCCL work, or a later reader on another stream, or the
    /// buffer's own release, would not wait for it.
    fn enqueue(&self, calls: &[Call]) -> Result<(), CommError> {
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
    fn finish<R>(&self, value: R, keep: Vec<DeviceBuffer<u8>>) -> Result<DeviceWork<R>, CommError> {
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

    /// Runs the calls `make` builds from the address of `buf` (written to when `writes`, read otherwise), with
    /// the buffer's cudarc guard held across the enqueue, and hands `buf` to the returned handle.
    fn one_buffer<T: Element, C: AsRef<[Call]>>(
        &self,
        mut buf: DeviceBuffer<T>,
        writes: bool,
        make: impl FnOnce(u64, usize) -> C,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        self.check_device("buffer", &buf)?;
        let count = buf.len();
        {
            let (p, _g) = if writes {
                buf.write_ptr(&self.stream)
            } else {
                buf.read_ptr(&self.stream)
            };
            self.enqueue(make(p, count).as_ref())?;
        }
        self.finish(buf, Vec::new())
    }

    /// Runs the calls `make` builds from the addresses of `input` (read) and `output` (written), with both
    /// guards held across the enqueue, and hands both buffers to the returned handle. The caller checks lengths.
    fn two_buffers<T: Element, C: AsRef<[Call]>>(
        &self,
        input: DeviceBuffer<T>,
        mut output: DeviceBuffer<T>,
        make: impl FnOnce(u64, u64) -> C,
    ) -> Result<DeviceWork<DeviceInOut<T>>, CommError> {
        self.check_device("input", &input)?;
        self.check_device("output", &output)?;
        {
            let (s, _gs) = input.read_ptr(&self.stream);
            let (r, _gr) = output.write_ptr(&self.stream);
            self.enqueue(make(s, r).as_ref())?;
        }
        self.finish((input, output), Vec::new())
    }

    /// All-reduce in place.
    pub fn all_reduce<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        self.one_buffer(buf, true, |p, count| {
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
        self.one_buffer(buf, true, |p, count| {
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
        self.one_buffer(buf, true, |p, count| {
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
        self.one_buffer(buf, false, |p, count| {
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
        self.one_buffer(buf, true, |p, count| {
            [Call::Recv {
                buf: p,
                count,
                dtype: T::DTYPE,
                peer,
            }]
        })
    }

    /// All-reduce in place over the elements of `view` in `buf`. A contiguous view runs directly on its part of
    /// the buffer; any other is packed into a staging buffer, reduced there, and unpacked back into the view, so
    /// the result always lands in the caller's elements.
    pub fn all_reduce_strided<T: Element>(
        &self,
        mut buf: DeviceBuffer<T>,
        view: StridedLayout,
        op: ReduceOp,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        self.check_device("buffer", &buf)?;
        view.check_fits(buf.len())
            .map_err(|what| self.invalid(what))?;
        let width = T::DTYPE.size();
        let reduce = |at: u64| Call::AllReduce {
            send: at,
            recv: at,
            count: view.len(),
            dtype: T::DTYPE,
            op,
        };
        if view.is_contiguous() {
            let offset = (view.offset() * width) as u64;
            return self.one_buffer(buf, true, |p, _| [reduce(p + offset)]);
        }
        let kernels = self.gpu.kernels()?;
        let mut staging = self.gpu.alloc_zeros::<u8>(view.len() * width)?;
        let (pack, unpack) = match (kernels.pack(width), kernels.unpack(width)) {
            (Some(p), Some(u)) => (p, u),
            _ => return Err(self.invalid(format!("no pack kernel for {width}-byte elements"))),
        };
        let dims = [
            view.offset() as u64,
            view.rows() as u64,
            view.cols() as u64,
            view.row_stride() as u64,
        ];
        let cfg = launch_config(view.len());
        {
            let mut launch = self.stream.launch_builder(pack);
            launch.arg(&mut staging.slice).arg(&buf.slice);
            for d in &dims {
                launch.arg(d);
            }
            // SAFETY: hypercomm_pack_<width>(dst, src, offset, rows, cols, row_stride) reads view.end() <=
            // buf.len() elements of `width` bytes from `buf` and writes view.len() to `staging`, sized for that.
            unsafe { launch.launch(cfg) }
                .map_err(cuda_err(&self.options.name, "launching pack"))?;
        }
        // Reduce the staging buffer, then unpack; the handle's event comes after the unpack, so waiting on it
        // sees the caller's view updated.
        {
            let (p, _g) = staging.write_ptr(&self.stream);
            self.enqueue(&[reduce(p)])?;
        }
        {
            let mut launch = self.stream.launch_builder(unpack);
            launch.arg(&mut buf.slice).arg(&staging.slice);
            for d in &dims {
                launch.arg(d);
            }
            // SAFETY: hypercomm_unpack_<width> reads view.len() elements from `staging` and writes the view's
            // elements of `buf`, all below view.end() <= buf.len() (checked above); rows do not overlap.
            unsafe { launch.launch(cfg) }
                .map_err(cuda_err(&self.options.name, "launching unpack"))?;
        }
        self.finish(buf, vec![staging])
    }

    /// Fills `buf` with the pattern `a * (i % 61) + b` on this communicator's stream (NVRTC kernel).
    pub fn fill_pattern<T: Element>(
        &self,
        buf: &mut DeviceBuffer<T>,
        a: i64,
        b: i64,
    ) -> Result<(), CommError> {
        let kernels = self.gpu.kernels()?;
        let f = kernels
            .fill(T::DTYPE)
            .ok_or_else(|| self.invalid(format!("no fill kernel for {}", T::DTYPE)))?;
        let n = buf.len() as u64;
        let cfg = launch_config(buf.len());
        let mut launch = self.stream.launch_builder(f);
        launch.arg(&mut buf.slice).arg(&n).arg(&a).arg(&b);
        // SAFETY: hypercomm_fill_<dtype>(data, n, a, b) writes n elements of T; the buffer holds n.
        unsafe { launch.launch(cfg) }.map_err(cuda_err(&self.options.name, "launching fill"))?;
        Ok(())
    }

    /// Counts the elements of `buf` that differ from the pattern `a * (i % 61) + b`, and the first such index
    /// (after the work enqueued on this communicator's stream; blocks the CPU).
    pub fn verify_pattern<T: Element>(
        &self,
        buf: &DeviceBuffer<T>,
        a: i64,
        b: i64,
    ) -> Result<(u64, Option<u64>), CommError> {
        let kernels = self.gpu.kernels()?;
        let f = kernels
            .verify(T::DTYPE)
            .ok_or_else(|| self.invalid(format!("no verify kernel for {}", T::DTYPE)))?;
        let counters = self.gpu.upload(&[0u64, u64::MAX])?;
        let n = buf.len() as u64;
        {
            let mut launch = self.stream.launch_builder(f);
            // The kernel takes two counter pointers; both point into one two-element buffer.
            let (base, _g) = counters.slice.device_ptr(&self.stream);
            let (mismatches, first_bad) = (base, base + 8);
            launch
                .arg(&buf.slice)
                .arg(&n)
                .arg(&a)
                .arg(&b)
                .arg(&mismatches)
                .arg(&first_bad);
            // SAFETY: hypercomm_verify_<dtype>(data, n, a, b, mismatches, first_bad) reads n elements of `buf`
            // and updates two u64 counters at `base` and `base + 8`, which `counters` holds.
            unsafe { launch.launch(launch_config(buf.len())) }
                .map_err(cuda_err(&self.options.name, "launching verify"))?;
        }
        self.stream
            .synchronize()
            .map_err(cuda_err(&self.options.name, "synchronizing verify"))?;
        let host = counters.download()?;
        Ok((host[0], (host[1] != u64::MAX).then_some(host[1])))
    }
}

/// Grid for `n` elements: 256 threads per block, at most 1024 blocks (the kernels loop over the rest).
fn launch_config(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 1024) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn nccl_err(comm: &str, what: &str, e: nccl_sys::NcclError) -> CommError {
    CommError::Device {
        comm: comm.to_owned(),
        what: format!("{what}: {e}"),
    }
}

/// This rank's position in `ranks`, refusing duplicates.
pub(crate) fn member_position(name: &str, ranks: &[usize], me: usize) -> Result<usize, CommError> {
    let invalid = |what: String| CommError::InvalidArgument {
        comm: name.to_owned(),
        what,
    };
    let rank = ranks
        .iter()
        .position(|&r| r == me)
        .ok_or_else(|| invalid(format!("rank {me} is not in the member list {ranks:?}")))?;
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(invalid(format!(
            "rank {} appears twice in the member list {ranks:?}",
            w[0]
        )));
    }
    Ok(rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_position_refuses_strangers_and_duplicates() {
        assert_eq!(member_position("c", &[4, 7, 9], 7).unwrap(), 1);
        let e = member_position("c", &[4, 7], 5).unwrap_err().to_string();
        assert!(e.contains("rank 5 is not in the member list [4, 7]"), "{e}");
        let e = member_position("c", &[4, 7, 4], 7).unwrap_err().to_string();
        assert!(e.contains("rank 4 appears twice"), "{e}");
    }

    #[test]
    fn launch_grid_covers_small_sizes_and_caps_large_ones() {
        assert_eq!(launch_config(0).grid_dim.0, 1);
        assert_eq!(launch_config(257).grid_dim.0, 2);
        assert_eq!(launch_config(1 << 30).grid_dim.0, 1024);
    }
}
