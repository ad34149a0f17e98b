//! [`DeviceCommunicator`]: the NCCL flavor of a [`Communicator`](crate::Communicator), which owns it and runs
//! every operation on a device buffer through it.
//!
//! Buffers move into an operation and come back from its handle, as on the host. The handle ([`DeviceWork`],
//! inside the public [`Work`](crate::Work)) holds a CUDA event (from the [`Gpu`]'s pool) recorded on the
//! communicator's stream after the operation: `wait_on(stream)` makes another stream wait on it without blocking
//! the CPU; `wait()` blocks the CPU until it completes, polling NCCL for asynchronous errors, and aborts the
//! communicator when the timeout passes (every other pending handle then fails too).
//!
//! Users reach it through [`Communicator::nccl`](crate::Communicator::nccl) for what only NCCL has: its stream,
//! a health check, the strided all-reduce and the pattern kernels the GPU tests use.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use hypercomm_store::Store;

use super::comm::NcclComm;
use super::config::{NcclSettings, StreamPriority, translate};
use super::flight::FlightRecorder;
use super::gpu::{DeviceBuffer, Gpu, cuda_err};
use super::raw::{self, Progress};
use super::unique_id::exchange_unique_id;
use crate::CommError;
use crate::element::Element;
use crate::options::CommOptions;

/// The NCCL flavor of a communicator: one NCCL communicator on one GPU, and the stream its operations run on.
pub struct DeviceCommunicator {
    gpu: Arc<Gpu>,
    comm: Arc<NcclComm>,
    stream: Arc<CudaStream>,
    options: CommOptions,
    ranks: Vec<usize>,
    rank: usize,
    /// The open [`OpGroup`](crate::OpGroup) the communicator is in, shared with its face: while it holds one,
    /// operations are recorded for the group's end instead of enqueued.
    mark: Arc<GroupMark>,
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
mod collectives;
pub(crate) mod group;
mod kernels;
mod tracking;
mod work;

use group::GroupMark;
pub(crate) use work::DeviceWork;

impl DeviceCommunicator {
    /// Joins communicator `options.name` over `ranks` as member `me`, on `gpu`. Rank 0 makes the NCCL unique id
    /// and publishes it in `store`; the others read it. Collective; bounded by `options.timeout`.
    ///
    /// With `options.failure_domain` set, the communicator (and every split or shrink made from it with those
    /// options) is a member of that domain: another member's failure aborts it, and its own fatal failure is
    /// recorded there and aborts the other members.
    pub(crate) fn new(
        gpu: Arc<Gpu>,
        store: Arc<dyn Store>,
        ranks: Vec<usize>,
        me: usize,
        options: CommOptions,
    ) -> Result<DeviceCommunicator, CommError> {
        let nccl = gpu.runtime().nccl();
        let settings = translate(&options, nccl.version())?;
        let rank = crate::checks::member_position(&options.name, &ranks, me)?;
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
        mut comm: NcclComm,
        settings: NcclSettings,
        options: CommOptions,
        ranks: Vec<usize>,
        rank: usize,
    ) -> Result<DeviceCommunicator, CommError> {
        let stream = gpu.stream(settings.stream_priority == StreamPriority::Highest)?;
        comm.domain = options.failure_domain.clone();
        let dir = options
            .flight_recorder_dir
            .clone()
            .or_else(|| gpu.runtime().flight_recorder_dir().map(Into::into));
        comm.recorder = FlightRecorder::new(&options.name, options.flight_recorder_len, dir);
        comm.recorder
            .set_members(&ranks, ranks.get(rank).copied().unwrap_or(rank));
        let comm = Arc::new(comm);
        if let Some(domain) = &comm.domain {
            domain.register(&comm);
        }
        Ok(DeviceCommunicator {
            gpu,
            comm,
            stream,
            options,
            ranks,
            rank,
            mark: Arc::default(),
        })
    }

    /// This communicator with `mark` as its group mark: the face's, so that a group over the face groups the
    /// device operations too.
    pub(crate) fn with_mark(mut self, mark: Arc<GroupMark>) -> Self {
        self.mark = mark;
        self
    }

    /// Whether NCCL calls on it are non-blocking (`NcclOptions::blocking` unset or false).
    pub(crate) fn non_blocking(&self) -> bool {
        self.comm.non_blocking
    }

    /// Refuses `what` while the communicator is in an open group, saying why: `what` would run at once, before
    /// the operations the group issues only at its end.
    fn refuse_in_group(&self, what: &str) -> Result<(), CommError> {
        match self.mark.current() {
            Some(group) => Err(self.invalid(format!(
                "{what} inside an open OpGroup (over {}): the group issues its operations only when it ends, so \
                 this would run before them; call it after OpGroup::end",
                group.label()
            ))),
            None => Ok(()),
        }
    }

    /// This communicator with its member list given as `members` (for instance the global ranks of a split
    /// child, whose NCCL ranks are positions). `me` is this process's entry: it must be `members[self.rank()]`,
    /// and `members` must have one entry per rank, with no repeats.
    pub(crate) fn with_members(
        mut self,
        members: Vec<usize>,
        me: usize,
    ) -> Result<Self, CommError> {
        if members.len() != self.size() || members.get(self.rank) != Some(&me) {
            return Err(self.invalid(format!(
                "member list {members:?} does not fit a {}-rank communicator where rank {me} is rank {}",
                self.size(),
                self.rank
            )));
        }
        crate::checks::member_position(&self.options.name, &members, me)?;
        self.comm.recorder.set_members(&members, me);
        self.ranks = members;
        Ok(self)
    }

    /// Takes ownership of a split's or shrink's child and waits until NCCL has finished creating it.
    fn adopt_child(
        &self,
        handle: raw::CommHandle,
        options: &CommOptions,
        settings: &NcclSettings,
    ) -> Result<NcclComm, CommError> {
        NcclComm::adopt(
            Arc::clone(self.gpu.runtime()),
            handle,
            Progress::Pending,
            options.name.clone(),
            options.timeout,
            settings.non_blocking(),
        )
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

    /// Runs `f` with the raw NCCL communicator and the loaded NCCL, for calls hypercomm does not make (an NCCL
    /// function it does not wrap, a baseline that calls `ncclAllReduce` directly). `f` runs under the lock that
    /// serialises every call on this communicator, so no operation of hypercomm's overlaps it; it fails, without
    /// running `f`, with [`CommError::Broken`] once the communicator is broken or aborted, and with
    /// [`CommError::InvalidArgument`] while it is in an open [`OpGroup`](crate::OpGroup), whose operations are
    /// enqueued only at its end, after anything `f` would enqueue now.
    ///
    /// Work `f` enqueues belongs on [`stream`](Self::stream), the stream hypercomm's own operations run on, so
    /// that stream order keeps it and them apart. Device buffers give their address for that stream through
    /// [`DeviceBuffer::address_on`], which orders it after the buffer's earlier uses.
    ///
    /// ```no_run
    /// # use hypercomm_comm::Communicator;
    /// # use hypercomm_comm::device::DeviceBuffer;
    /// # fn raw(comm: &Communicator, mut buf: DeviceBuffer<f32>) -> Result<(), Box<dyn std::error::Error>> {
    /// use nccl_sys::{Function, NcclError, sys};
    ///
    /// // `comm` was made `with_gpu` and blocking NCCL communicators (`NcclOptions::blocking`); on a
    /// // non-blocking one, a call that answers ncclInProgress is followed by polling ncclCommGetAsyncError.
    /// let dev = comm.nccl().ok_or("a communicator with a gpu")?;
    /// let addr = buf.address_on(dev.stream()) as usize as *mut std::ffi::c_void;
    /// let stream = dev.stream().cu_stream() as sys::cudaStream_t;
    /// let count = buf.len();
    /// // SAFETY: the closure enqueues one in-place all-reduce of `buf` on the communicator's stream, with `h`
    /// // (lent for the closure) and keeps nothing; `buf` holds `count` f32s on the communicator's gpu and is not
    /// // dropped before the work is done.
    /// let done = unsafe {
    ///     dev.with_raw_comm(|h, nccl| -> Result<(), NcclError> {
    ///         let api = nccl.api(Function::AllReduce)?;
    ///         let raw = api.ncclAllReduce(addr, addr, count, sys::ncclFloat32, sys::ncclSum, h, stream);
    ///         nccl.check(Function::AllReduce, raw, h)
    ///     })
    /// };
    /// done??;
    /// // The buffer's next use through hypercomm (an operation, a download) is ordered after the all-reduce.
    /// let _sums = buf.download()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    ///
    /// The handle is the communicator's own, lent for the duration of `f`. The caller must ensure that `f`:
    /// - enqueues work only on this communicator's [`stream`](Self::stream), with device memory of this
    ///   communicator's GPU that stays allocated until that work completes there;
    /// - polls `ncclCommGetAsyncError` until the communicator settles before returning, when a call answered
    ///   `ncclInProgress` (a non-blocking communicator, hypercomm's default), as NCCL requires before the next
    ///   call on it;
    /// - never destroys, finalizes, aborts, splits, shrinks or revokes the communicator, nor changes its
    ///   configuration (hypercomm owns it and releases it on drop);
    /// - does not keep the handle past its return, nor pass it to another thread that could use it later.
    pub unsafe fn with_raw_comm<R>(
        &self,
        f: impl FnOnce(nccl_sys::sys::ncclComm_t, &nccl_sys::Nccl) -> R,
    ) -> Result<R, CommError> {
        self.refuse_in_group("with_raw_comm")?;
        let nccl = self.gpu.runtime().nccl();
        self.comm.with_handle(|h| Ok(f(h.0, nccl)))
    }

    /// Aborts: NCCL's work on this communicator stops, and every pending and later operation fails.
    pub fn abort(&self) {
        self.comm.abort();
    }

    /// Splits with `ncclCommSplit`, NCCL's semantics: equal `color`s form a child ordered by `key`, then rank;
    /// `None` joins nothing. Collective over this communicator. `options` are the child's (its `ncclConfig_t`).
    pub(crate) fn split_with(
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
        let mut slot = self.comm.with_handle(|parent| {
            raw::split(nccl, parent, color, key, &settings)
                .map_err(|e| self.comm.error("ncclCommSplit", e))
        })?;
        // On a non-blocking parent the split goes on in NCCL's own thread and NCCL writes the child into the slot
        // only when it completes, and `ncclCommSplit` answers ncclSuccess, not ncclInProgress, all the same
        // (seen on an H100 with NCCL 2.28.3 and 2.30.7): whatever it answered, wait for the parent to settle
        // before reading the slot. (On an error the slot is leaked, not freed: NCCL may still write to it.)
        self.comm.wait_ready("splitting")?;
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
        let child = self.adopt_child(handle, &options, &settings)?;
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

    fn invalid(&self, what: String) -> CommError {
        crate::checks::invalid(&self.options.name, what)
    }

    /// `b` must be on this communicator's device, of a type the loaded NCCL carries.
    fn check_device<T: Element>(&self, what: &str, b: &DeviceBuffer<T>) -> Result<(), CommError> {
        let version = self.gpu.runtime().nccl().version();
        if T::DTYPE.is_float8() && version < super::raw::FLOAT8_VERSION {
            return Err(CommError::Unavailable {
                what: format!("{} on communicator {}", T::DTYPE, self.options.name),
                why: format!(
                    "the 8-bit float types need NCCL {} or newer; the loaded NCCL is {version}",
                    super::raw::FLOAT8_VERSION
                ),
            });
        }
        if b.device() != self.gpu.ordinal() {
            return Err(self.invalid(format!(
                "{what} is on device {} but the communicator is on device {}",
                b.device(),
                self.gpu.ordinal()
            )));
        }
        Ok(())
    }
}

fn nccl_err(comm: &str, what: &str, e: nccl_sys::NcclError) -> CommError {
    CommError::Device {
        comm: comm.to_owned(),
        what: format!("{what}: {e}"),
    }
}
