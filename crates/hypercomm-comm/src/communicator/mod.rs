//! [`Communicator`]: the one public face of a group's communicator, whatever its buffers live on.
//!
//! A communicator is created collectively by every member rank from a store, a rank list and [`CommOptions`],
//! and, when it is given a [`Gpu`], over the same ranks on that GPU too. It owns up to two flavors: the host
//! flavor (always; shared memory on one machine, TCP across machines) and the NCCL flavor (with a GPU). Each
//! operation is described once ([`Op`]), checked once here, and runs on the flavor its buffers' type names
//! ([`Buffer`](crate::Buffer)): a `Vec<T>` on the host, a [`DeviceBuffer<T>`](crate::device::DeviceBuffer) on
//! NCCL. Both give back a [`Work`] for the same buffers.
//!
//! The host flavor moves an operation's buffers into a job on the communicator's lane, where jobs run one at a
//! time in issue order, except that point-to-point operations issued back to back run as one exchange (`p2p`);
//! a job runs on the thread that waits on it when it is next (the usual issue-then-wait),
//! otherwise on the communicator's progress thread. The progress thread starts with the first host operation, not
//! with the communicator: a collection builds a communicator for every group of a layout (22 kinds), and the
//! groups a program never uses then cost no thread. [`Communicator::barrier_now`] runs a barrier on the caller's
//! thread while nothing is queued, so the collection's closing barrier on each group costs none either.
//!
//! The queue and the progress thread are in `lane`; what runs a job on the host backend, in `engine`; how sends
//! and receives run together, in `p2p`; the face's operations, in `collectives`; splits, in `splits`; groups of
//! operations issued together, in `group`.

pub(crate) mod batch;
mod collectives;
mod engine;
pub(crate) mod group;
mod lane;
pub(crate) mod p2p;
pub(crate) mod splits;
mod symmetric;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hypercomm_store::Store;

use crate::CommError;
use crate::backend::Backend;
use crate::backends::host::HostBackend;
use crate::backends::nccl::communicator::group::GroupMark;
use crate::backends::nccl::communicator::{DeviceCommunicator, DeviceWork};
use crate::backends::nccl::gpu::Gpu;
use crate::element::Element;
use crate::failure::{Context, FailureDomain, Member, Step};
use crate::host_work::{Completer, HostWork, RunInline, pair};
use crate::member_ids;
use crate::op::{Group, Message, Op};
use crate::options::CommOptions;

use engine::{Engine, lock};
use lane::Job;
use lane::Lane;

/// What an out-of-place operation gives back: its `(input, output)` buffers.
pub type InOut<B> = (B, B);

/// A group's communicator: host vectors and, when it has a GPU, device buffers alike.
///
/// ```
/// use std::sync::Arc;
/// use hypercomm_comm::{CommOptions, Communicator, ReduceOp};
/// use hypercomm_store::MemoryStore;
///
/// // Two ranks as two threads sharing a store.
/// let store = Arc::new(MemoryStore::new());
/// let ranks: Vec<_> = (0..2)
///     .map(|me| {
///         let store = Arc::clone(&store);
///         std::thread::spawn(move || {
///             let comm = Communicator::new(store, vec![0, 1], me, CommOptions::named("doc"))?;
///             let sum = comm.all_reduce(vec![me as f32 + 1.0; 4], ReduceOp::Sum)?.wait()?;
///             assert_eq!(sum, vec![3.0; 4]);
///             Ok::<_, hypercomm_comm::CommError>(())
///         })
///     })
///     .collect();
/// for r in ranks {
///     r.join().unwrap()?;
/// }
/// # Ok::<(), hypercomm_comm::CommError>(())
/// ```
///
/// With a GPU ([`Communicator::with_gpu`]) the same call takes a
/// [`DeviceBuffer`](crate::device::DeviceBuffer) and runs on NCCL: `comm.all_reduce(device_buf, ReduceOp::Sum)?`
/// gives a [`Work`](crate::Work) whose `wait()` blocks until the GPU is done and whose `wait_on(&stream)` orders a
/// stream instead.
pub struct Communicator {
    name: String,
    rank: usize,
    ranks: Vec<usize>,
    options: CommOptions,
    store: Arc<dyn Store>,
    transport: &'static str,
    shared: Arc<Shared>,
    domain: Arc<FailureDomain>,
    splits: AtomicU64,
    shrinks: AtomicU64,
    /// The symmetric windows, when the options ask for them (see [`crate::symmetric`]).
    windows: Option<Arc<crate::symmetric::Windows>>,
    /// The NCCL flavor, when the communicator has a GPU.
    nccl: Option<DeviceCommunicator>,
    /// The open [`OpGroup`](group::OpGroup) the communicator is in, if any; its NCCL flavor shares it.
    group: Arc<GroupMark>,
}

/// What a communicator shares with its [`FailureDomain`]: enough to abort it from another communicator's
/// progress thread.
pub(crate) struct Shared {
    broken: Arc<Mutex<Option<String>>>,
    lane: Arc<Lane>,
}

impl Shared {
    /// Marks the communicator broken with `cause` and tells its peers, unless it is broken already (then it has
    /// told them itself). Queued operations fail fast; one in flight ends on its own (its peers stop it).
    pub(crate) fn abort_with(&self, cause: &str) {
        {
            let mut broken = lock(&self.broken);
            if broken.is_some() {
                return;
            }
            *broken = Some(cause.to_owned());
        }
        self.lane.close(true);
    }
}

impl Member for Shared {
    fn abort_with(&self, cause: &str) {
        Shared::abort_with(self, cause);
    }

    /// Marks the communicator broken and closes its lane now; telling the peers, when the engine is free to do it
    /// now, is left for the domain to run beside the other members' steps.
    fn try_stop(&self, cause: &str) -> Step {
        {
            let mut broken = lock(&self.broken);
            if broken.is_some() {
                return Step::Stopped;
            }
            *broken = Some(cause.to_owned());
        }
        match self.lane.close_handing_back() {
            Some(tell_peers) => Step::Blocking(Box::new(tell_peers)),
            None => Step::Stopped,
        }
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("name", &self.name)
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .field("transport", &self.transport)
            .field("gpu", &self.nccl.as_ref().map(|d| d.gpu().ordinal()))
            .finish()
    }
}

/// Where a communicator's NCCL flavor comes from.
pub(crate) enum DeviceSource<'a> {
    /// A new NCCL communicator on this GPU, its unique id exchanged through the store.
    Fresh(Arc<Gpu>),
    /// `ncclCommSplit` of the parent's NCCL flavor with this color and key (every parent rank calls it).
    Split {
        parent: &'a DeviceCommunicator,
        color: u32,
        key: i64,
    },
}

impl Communicator {
    /// Joins the communicator `options.name` whose members are `ranks` (ids in any numbering the caller uses,
    /// for example global ranks), as member `me`, with the host flavor only. Every member must call this with
    /// the same list and name; the call returns once all have connected (or fails after `options.timeout`). This
    /// rank's rank in the communicator is `me`'s position in `ranks`. NCCL knobs in `options` are refused: they
    /// need a GPU ([`with_gpu`](Self::with_gpu)).
    pub fn new(
        store: Arc<dyn Store>,
        ranks: Vec<usize>,
        me: usize,
        options: CommOptions,
    ) -> Result<Communicator, CommError> {
        Communicator::connect(None, store, ranks, me, options)
    }

    /// [`new`](Self::new), and an NCCL communicator over the same ranks on `gpu`, named `<name>/device`: device
    /// buffers given to this communicator run there. The NCCL knobs of `options` go to NCCL (each honoured or
    /// refused by name), the host-only knobs to the host flavor; both flavors share one failure domain, so a
    /// failure of either stops both. Every member must pass a GPU.
    pub fn with_gpu(
        gpu: Arc<Gpu>,
        store: Arc<dyn Store>,
        ranks: Vec<usize>,
        me: usize,
        options: CommOptions,
    ) -> Result<Communicator, CommError> {
        Communicator::connect(Some(gpu), store, ranks, me, options)
    }

    /// [`with_gpu`](Self::with_gpu) when `gpu` is given, [`new`](Self::new) otherwise: for code that builds
    /// groups either way (a collection, a benchmark).
    pub fn connect(
        gpu: Option<Arc<Gpu>>,
        store: Arc<dyn Store>,
        ranks: Vec<usize>,
        me: usize,
        options: CommOptions,
    ) -> Result<Communicator, CommError> {
        Communicator::create(store, ranks, me, options, gpu.map(DeviceSource::Fresh))
    }

    /// The communicator over ranks `0..size`, as rank `rank`, with the host flavor only.
    pub fn world(
        store: Arc<dyn Store>,
        size: usize,
        rank: usize,
        options: CommOptions,
    ) -> Result<Communicator, CommError> {
        Communicator::new(store, (0..size).collect(), rank, options)
    }

    /// Checks `options` as a communicator with `gpu` (or without one) would, before anything is created: the
    /// host knobs against the host flavor, the NCCL knobs against the loaded NCCL, or, without a GPU, that no
    /// NCCL knob is set. The split of the options between the flavors happens here and nowhere else.
    pub fn check_options(gpu: Option<&Gpu>, options: &CommOptions) -> Result<(), CommError> {
        Self::flavor_options(gpu, options).map(|_| ())
    }

    /// `options` split between the flavors, each checked: the host flavor's and, with a GPU, the NCCL flavor's.
    fn flavor_options(
        gpu: Option<&Gpu>,
        options: &CommOptions,
    ) -> Result<(CommOptions, Option<CommOptions>), CommError> {
        let (host, device) = match gpu {
            Some(_) => (options.without_nccl_knobs(), Some(options.for_device())),
            None => (options.clone(), None),
        };
        host.validate_host()?;
        if let (Some(gpu), Some(device)) = (gpu, &device) {
            gpu.check_options(device)?;
        }
        Ok((host, device))
    }

    /// The one constructor: the host flavor through the store, then, from `device`, the NCCL flavor in the host
    /// flavor's failure domain.
    pub(crate) fn create(
        store: Arc<dyn Store>,
        ranks: Vec<usize>,
        me: usize,
        options: CommOptions,
        device: Option<DeviceSource<'_>>,
    ) -> Result<Communicator, CommError> {
        // Every option checked before any peer is met: a knob the loaded NCCL refuses fails here, not after the
        // host flavor has connected.
        let gpu = device.as_ref().map(|source| match source {
            DeviceSource::Fresh(gpu) => &**gpu,
            DeviceSource::Split { parent, .. } => &**parent.gpu(),
        });
        let (host_options, device_options) = Self::flavor_options(gpu, &options)?;
        let mut comm = Communicator::host(Arc::clone(&store), ranks.clone(), me, host_options)?;
        if let (Some(source), Some(device_options)) = (device, device_options) {
            let device_options = CommOptions {
                failure_domain: Some(Arc::clone(&comm.domain)),
                ..device_options
            };
            let nccl = match source {
                DeviceSource::Fresh(gpu) => {
                    DeviceCommunicator::new(gpu, store, ranks.clone(), me, device_options)?
                }
                DeviceSource::Split { parent, color, key } => parent
                    .split_with(Some(color), key, device_options)?
                    .ok_or_else(|| {
                        crate::checks::invalid(
                            &options.name,
                            "ncclCommSplit with a color gave no child communicator".into(),
                        )
                    })?
                    .with_members(ranks.clone(), me)?,
            };
            comm.nccl = Some(nccl.with_mark(Arc::clone(&comm.group)));
        }
        comm.options = options;
        Ok(comm)
    }

    /// The host flavor alone, from options [`flavor_options`](Self::flavor_options) checked.
    fn host(
        store: Arc<dyn Store>,
        ranks: Vec<usize>,
        me: usize,
        options: CommOptions,
    ) -> Result<Communicator, CommError> {
        let rank = crate::checks::member_position(&options.name, &ranks, me)?;
        let domain = match &options.failure_domain {
            Some(d) if d.rank() != me => {
                return Err(crate::checks::invalid(
                    &options.name,
                    format!(
                        "joined as rank {me} but its failure domain belongs to rank {}",
                        d.rank()
                    ),
                ));
            }
            Some(d) => Arc::clone(d),
            None => FailureDomain::new(
                Arc::clone(&store),
                hypercomm_store::Key::new("comm")
                    .push(options.name.as_str())
                    .push("failure"),
                me,
            ),
        };
        let cx = Context {
            comm: &options.name,
            timeout: options.timeout,
        };
        let backend: Box<dyn Backend> = Box::new(
            HostBackend::connect(store.as_ref(), ranks.len(), rank, &options)
                .map_err(|e| domain.settle(member_ids::to_members(e, &ranks), &cx))?,
        );
        let transport = backend.transport_name();
        let windows = backend.symmetric_windows();
        let broken = Arc::new(Mutex::new(None));
        let engine = Engine {
            backend,
            broken: Arc::clone(&broken),
            comm: options.name.clone(),
            domain: Arc::clone(&domain),
            members: ranks.clone(),
            timeout: options.timeout,
        };
        let shared = Arc::new(Shared {
            broken,
            lane: Lane::new(&options.name, Box::new(engine)),
        });
        domain.register(&shared);
        Ok(Communicator {
            name: options.name.clone(),
            rank,
            ranks,
            options,
            store,
            transport,
            shared,
            domain,
            splits: AtomicU64::new(0),
            shrinks: AtomicU64::new(0),
            windows,
            nccl: None,
            group: Arc::default(),
        })
    }

    /// The NCCL flavor, for what only NCCL has (its stream, a health check, the strided all-reduce); `None`
    /// without a GPU. Operations on device buffers go through this communicator itself, not through it.
    pub fn nccl(&self) -> Option<&DeviceCommunicator> {
        self.nccl.as_ref()
    }

    /// The GPU of the NCCL flavor, if the communicator has one.
    pub fn gpu(&self) -> Option<&Arc<Gpu>> {
        self.nccl.as_ref().map(DeviceCommunicator::gpu)
    }

    /// This rank's rank within the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// The communicator's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The member list it was created with (`ranks()[rank()]` is this rank's id).
    pub fn ranks(&self) -> &[usize] {
        &self.ranks
    }

    /// The options it was created with.
    pub fn options(&self) -> &CommOptions {
        &self.options
    }

    /// The transport the backend chose (`"shm"` or `"tcp"` for the host backend).
    pub fn transport(&self) -> &'static str {
        self.transport
    }

    /// The store it bootstrapped through.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The number of the next shrink of this communicator (each call takes one).
    pub(crate) fn next_shrink(&self) -> u64 {
        self.shrinks.fetch_add(1, Ordering::Relaxed)
    }

    /// The first fatal error, if the communicator is broken.
    pub fn broken(&self) -> Option<String> {
        lock(&self.shared.broken).clone()
    }

    /// The member ids of this communicator's ranks at `positions` (ranks within it, as `shrink` takes them).
    ///
    /// Fails naming the first position that is not a rank of this communicator.
    pub fn ids_of(&self, positions: &[usize]) -> Result<Vec<usize>, CommError> {
        positions
            .iter()
            .map(|&p| {
                self.ranks.get(p).copied().ok_or_else(|| {
                    self.invalid(format!(
                        "{p} is not a rank of this {}-rank communicator",
                        self.size()
                    ))
                })
            })
            .collect()
    }

    /// The positions within this communicator (ranks as `shrink` takes them) of the member ids `ids`, such as the
    /// world ranks of [`CommError::lost_ranks`]. Fails naming the first id that is not a member.
    pub fn positions_of(&self, ids: &[usize]) -> Result<Vec<usize>, CommError> {
        ids.iter()
            .map(|&id| {
                self.ranks.iter().position(|&m| m == id).ok_or_else(|| {
                    self.invalid(format!("rank {id} is not a member of {:?}", self.ranks))
                })
            })
            .collect()
    }

    /// The failure domain the communicator reports to: the one in its options, or its own.
    pub fn failure_domain(&self) -> &Arc<FailureDomain> {
        &self.domain
    }

    fn invalid(&self, what: String) -> CommError {
        crate::checks::invalid(&self.name, what)
    }

    fn check_multiple(&self, what: &str, len: usize) -> Result<(), CommError> {
        if len % self.size() != 0 {
            return Err(self.invalid(format!(
                "{what} has {len} elements, not a multiple of {} ranks",
                self.size()
            )));
        }
        Ok(())
    }

    /// The group the operation checks see: name, size and this rank.
    fn group(&self) -> Group<'_> {
        Group {
            comm: &self.name,
            size: self.size(),
            rank: self.rank,
        }
    }

    /// The NCCL flavor for a device buffer on device `device` of an operation `op`, or why there is none.
    pub(crate) fn nccl_for(
        &self,
        op: &Op,
        device: usize,
    ) -> Result<&DeviceCommunicator, CommError> {
        let Some(nccl) = &self.nccl else {
            return Err(self.invalid(format!(
                "{} got a buffer on device {device}, but communicator {} has no gpu: create it with_gpu (or build \
                 its collection with_gpu) to run operations on device buffers",
                op.name(),
                self.name
            )));
        };
        if nccl.gpu().ordinal() != device {
            return Err(self.invalid(format!(
                "{} got a buffer on device {device}, but the communicator is on device {}",
                op.name(),
                nccl.gpu().ordinal()
            )));
        }
        Ok(nccl)
    }

    /// Queues `f` on the host flavor's lane.
    pub(crate) fn submit<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn Backend) -> Result<R, CommError> + Send + 'static,
    ) -> Result<HostWork<R>, CommError> {
        self.queue(|done| {
            Job::Run(Box::new(move |engine: &mut Engine| {
                done.complete(engine.execute(f))
            }))
        })
    }

    /// Queues a point-to-point operation moving `bufs[i]` as `messages[i]` says on the host flavor's lane, where it
    /// progresses together with those queued next to it (see [`p2p`]); its handle holds `wrap(bufs)`.
    pub(crate) fn submit_p2p<T: Element, R: Send + 'static>(
        &self,
        bufs: Vec<Vec<T>>,
        messages: Vec<Message>,
        wrap: fn(Vec<Vec<T>>) -> R,
    ) -> Result<HostWork<R>, CommError> {
        self.queue(|done| Job::P2p(Box::new(p2p::Owned::new(bufs, messages, done, wrap))))
    }

    /// Queues the job `make` builds around the completer of a new handle, unless the communicator is broken.
    fn queue<R>(&self, make: impl FnOnce(Completer<R>) -> Job) -> Result<HostWork<R>, CommError> {
        if let Some(cause) = self.broken() {
            return Err(CommError::broken(
                &self.name,
                cause,
                self.domain.root_cause(),
            ));
        }
        let (work, done) = pair(&self.name);
        let id = self.shared.lane.push(make(done))?;
        Ok(work.runs_inline(Arc::clone(&self.shared.lane) as Arc<dyn RunInline>, id))
    }

    /// A barrier run to completion on the calling thread without queueing it, when nothing is queued or running
    /// (so a communicator whose only operation is this barrier never starts a thread, as a collection's closing
    /// barriers are); otherwise `barrier()?.wait()`, after the queued operations. Errors, failure reporting and
    /// timeouts are those of [`barrier`](Self::barrier). An abort from another thread meanwhile takes effect
    /// when the barrier ends, as it would after an operation already queued.
    pub fn barrier_now(&self) -> Result<(), CommError> {
        // A broken communicator fails either way: the engine checks before running, `barrier()` before queueing.
        let Some(mut engine) = self.shared.lane.borrow_idle() else {
            return self.barrier()?.wait();
        };
        let fence = match self.device_fence() {
            Ok(fence) => fence,
            Err(e) => {
                self.shared.lane.give_back(engine);
                return Err(e);
            }
        };
        if let Some(fence) = fence {
            if let Err(e) = fence.synchronize() {
                self.shared.lane.give_back(engine);
                return Err(e);
            }
        }
        let result = engine.execute(|b| b.barrier());
        self.shared.lane.give_back(engine);
        result
    }

    /// Gives up on the communicator: marks it broken, tells the peers (their pending and later operations fail
    /// at once), lets queued operations fail fast and stops the progress thread (joined when the communicator is
    /// dropped). Every later operation fails with [`CommError::Broken`]. Takes `&self`, as the device
    /// communicator's does, so a communicator shared (say, by a collection) can be aborted.
    pub fn abort(&self) {
        let first = lock(&self.shared.broken).is_none();
        lock(&self.shared.broken).get_or_insert_with(|| "aborted by this rank".to_owned());
        if first {
            // A deliberate abort loses no rank; saying so spares the peers the wait for a failure record (unless
            // this rank already recorded a failure in its domain, which stays its record).
            self.domain.record_abort();
        }
        self.shared.lane.close(true);
        if let Some(nccl) = &self.nccl {
            nccl.abort();
        }
        // Drop joins the progress thread.
    }

    /// An event after the device work issued so far on the NCCL flavor, for a barrier to wait on (`None` without
    /// a GPU): a barrier on a communicator with a GPU also orders its device work.
    fn device_fence(&self) -> Result<Option<DeviceWork<()>>, CommError> {
        self.nccl
            .as_ref()
            .map(DeviceCommunicator::fence)
            .transpose()
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // The progress thread ends after the operations already issued (an engine that never ran an operation
        // retires here).
        self.shared.lane.shut();
    }
}

#[cfg(test)]
mod tests;
