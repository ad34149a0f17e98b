//! The watchdog of one [`Gpu`](super::gpu::Gpu): a thread that watches every in-flight operation of every NCCL
//! communicator on the device, so that a GPU job never hangs silently, however its user waits.
//!
//! Why: a handle's `wait()` polls its operation itself and times out, but `wait_on(stream)` only orders a stream,
//! and a dropped handle is waited by nobody: a collective whose peer never comes then blocks whatever the user
//! does next on the device (a copy to the host, a synchronize) for ever. The watchdog bounds every operation by
//! its communicator's timeout, whichever way its user waits.
//!
//! How: each operation's handle shares its CUDA event with the watchdog (`events`) and registers it here when
//! it is made (`Watchdog::watch`: a lock and a push, no driver call). Every [`TICK`] the thread, for each
//! stream with operations in flight:
//! - queries the event of the oldest operation not seen complete, and of the next one each time one is (the
//!   operations of one stream complete in order, so the others need no query): its cost per tick is one query
//!   per stream plus one per completion, however many operations are in flight;
//! - past the operation's deadline (its enqueue plus the communicator's timeout) times the communicator out;
//! - once per communicator with work in flight or just completed, polls `ncclCommGetAsyncError` (skipped for the
//!   tick when a call holds the communicator: the watchdog never waits for one).
//!
//! A timeout or an asynchronous error breaks the communicator with its cause, records the cause and aborts every
//! other member of its failure domain (host and NCCL communicators of the collection; split children where they
//! share it), and stops it: the user's next call or wait on any of them fails with the recorded cause, and a
//! stream waiting on the stuck collective goes on (NCCL's kernels end when their communicator is revoked or
//! aborted). How an NCCL communicator is stopped safely from this thread, per NCCL version, is `comm`'s module
//! doc: abort when no call is inside NCCL, else revoke (2.28 and later) and let the call abort on its way out.
//! A timeout first asks the peers how far they got (`behind`), so the error names the rank behind.
//!
//! The thread starts with the device's first operation and ends when the `Gpu` is dropped (within a tick, or
//! after the settling in progress). It holds no `Gpu` and no communicator, only weak references to the
//! communicators, so it keeps neither alive. Its CPU cost is in `docs/perf/watchdog.md`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;

use super::comm::NcclComm;
use super::events::SharedEvent;
use super::flight::OpState;
use crate::CommError;

/// How often the watchdog looks at the operations in flight: a timeout is noticed within a tick of its deadline.
pub(crate) const TICK: Duration = Duration::from_millis(100);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections push, pop or scan the queues; a poisoned lock still holds consistent queues.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One operation being watched.
#[derive(Clone)]
struct Watched {
    event: SharedEvent,
    comm: Weak<NcclComm>,
    /// Its number in the communicator's flight recorder (none for a fence, which is no operation of its own).
    seq: Option<u64>,
    deadline: Instant,
}

/// The operations in flight on one stream, oldest first.
struct Lane {
    stream: usize,
    ops: VecDeque<Watched>,
}

#[derive(Default)]
struct State {
    lanes: Vec<Lane>,
    stopping: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// The watchdog of one device: its queues, and its thread once started.
pub(crate) struct Watchdog {
    name: String,
    shared: Arc<Shared>,
    started: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Watchdog {
    /// The watchdog of device `ordinal`; its thread starts with the first [`watch`](Self::watch).
    pub(crate) fn new(ordinal: usize) -> Watchdog {
        Watchdog {
            name: format!("hypercomm-watchdog-gpu{ordinal}"),
            shared: Arc::default(),
            started: AtomicBool::new(false),
            thread: Mutex::new(None),
        }
    }

    /// Watches an operation of `comm` enqueued on `stream`, complete when `event` is, numbered `seq` in the
    /// communicator's flight recorder: no driver call, a lock and a push (and, the first time, the thread's start).
    pub(crate) fn watch(
        &self,
        stream: &CudaStream,
        event: &SharedEvent,
        comm: &Arc<NcclComm>,
        seq: Option<u64>,
    ) -> Result<(), CommError> {
        let op = Watched {
            event: Arc::clone(event),
            comm: Arc::downgrade(comm),
            seq,
            deadline: Instant::now() + comm.timeout,
        };
        let key = stream.cu_stream() as usize;
        {
            let mut s = lock(&self.shared.state);
            match s.lanes.iter_mut().find(|l| l.stream == key) {
                Some(lane) => lane.ops.push_back(op),
                None => s.lanes.push(Lane {
                    stream: key,
                    ops: VecDeque::from([op]),
                }),
            }
        }
        if self.started.load(Ordering::Acquire) {
            return Ok(());
        }
        self.start(&comm.name)
    }

    /// Starts the thread unless it runs.
    fn start(&self, comm: &str) -> Result<(), CommError> {
        let mut slot = lock(&self.thread);
        if slot.is_some() {
            return Ok(());
        }
        let shared = Arc::clone(&self.shared);
        let handle = std::thread::Builder::new()
            .name(self.name.clone())
            .spawn(move || run(&shared))
            .map_err(|e| CommError::Io {
                comm: comm.to_owned(),
                what: format!("starting the gpu's watchdog thread {}", self.name),
                source: e,
            })?;
        *slot = Some(handle);
        self.started.store(true, Ordering::Release);
        Ok(())
    }

    /// Operations being watched.
    pub(crate) fn in_flight(&self) -> usize {
        lock(&self.shared.state)
            .lanes
            .iter()
            .map(|l| l.ops.len())
            .sum()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        lock(&self.shared.state).stopping = true;
        self.shared.wake.notify_all();
        if let Some(handle) = lock(&self.thread).take()
            && handle.thread().id() != std::thread::current().id()
        {
            // Ends within a tick, or after the settling it is in, which is bounded.
            let _ = handle.join();
        }
    }
}

/// The thread: a tick, then a look at every stream, until the `Gpu` goes.
fn run(shared: &Shared) {
    loop {
        {
            let s = lock(&shared.state);
            if s.stopping {
                return;
            }
            let (s, _) = shared
                .wake
                .wait_timeout(s, TICK)
                .unwrap_or_else(|p| p.into_inner());
            if s.stopping {
                return;
            }
        }
        tick(shared, Instant::now());
    }
}

/// What a look at a lane's oldest operation found.
enum Seen {
    /// Done: let go of it, and ask its communicator for an asynchronous error (a completed operation may still
    /// have raised one).
    Done(Arc<NcclComm>),
    /// No longer anyone's business (its communicator is gone or broken): let go of it.
    Gone,
    /// Still running, within its deadline.
    Running(Arc<NcclComm>),
    /// Still running past its deadline.
    Late(Arc<NcclComm>, Option<u64>),
}

/// One look at every stream (see the module doc); what it finds wrong is settled after, outside the queues'
/// lock.
fn tick(shared: &Shared, now: Instant) {
    let streams: Vec<usize> = lock(&shared.state).lanes.iter().map(|l| l.stream).collect();
    // The communicators with operations running or seen complete in this tick: each is polled once.
    let mut running: Vec<Arc<NcclComm>> = Vec::new();
    let mut late: Vec<(Arc<NcclComm>, Option<u64>)> = Vec::new();
    for stream in streams {
        // Bounded: each pass lets go of the oldest operation or leaves the loop.
        loop {
            let front = {
                let s = lock(&shared.state);
                s.lanes
                    .iter()
                    .find(|l| l.stream == stream)
                    .and_then(|l| l.ops.front().cloned())
            };
            let Some(op) = front else { break };
            match look(&op, now) {
                Seen::Gone => pop(shared, stream, &op),
                Seen::Done(comm) => {
                    pop(shared, stream, &op);
                    if !running.iter().any(|c| Arc::ptr_eq(c, &comm)) {
                        running.push(comm);
                    }
                }
                Seen::Running(comm) => {
                    if !running.iter().any(|c| Arc::ptr_eq(c, &comm)) {
                        running.push(comm);
                    }
                    break;
                }
                Seen::Late(comm, seq) => {
                    late.push((comm, seq));
                    break;
                }
            }
        }
    }
    lock(&shared.state).lanes.retain(|l| !l.ops.is_empty());
    for comm in running {
        // An asynchronous error breaks, settles and stops the communicator inside.
        let _ = comm.try_poll();
    }
    for (comm, seq) in late {
        if comm.broken().is_some() {
            continue;
        }
        let during = match seq.and_then(|s| comm.recorder.describe(s)) {
            Some(op) => format!("{op}, watched by the gpu's watchdog"),
            None => "device work watched by the gpu's watchdog".to_owned(),
        };
        let _ = comm.time_out(&during);
    }
}

/// Looks at the oldest operation of a lane: one event query at most.
fn look(op: &Watched, now: Instant) -> Seen {
    let Some(comm) = op.comm.upgrade() else {
        return Seen::Gone;
    };
    if comm.broken().is_some() {
        return Seen::Gone;
    }
    match op.event.try_is_complete() {
        Ok(true) => {
            if let Some(seq) = op.seq {
                comm.recorder.finish(seq, OpState::Completed);
            }
            Seen::Done(comm)
        }
        Ok(false) if now >= op.deadline => Seen::Late(comm, op.seq),
        Ok(false) => Seen::Running(comm),
        Err(e) => {
            let error = comm.error_text("querying an operation's event", e.to_string());
            comm.fail(&error);
            comm.stop(&error.to_string());
            Seen::Gone
        }
    }
}

/// Lets go of `op` if it is still the oldest of its lane.
fn pop(shared: &Shared, stream: usize, op: &Watched) {
    let mut s = lock(&shared.state);
    if let Some(lane) = s.lanes.iter_mut().find(|l| l.stream == stream)
        && lane
            .ops
            .front()
            .is_some_and(|f| Arc::ptr_eq(&f.event, &op.event))
    {
        lane.ops.pop_front();
    }
}
