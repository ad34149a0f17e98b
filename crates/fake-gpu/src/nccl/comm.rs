//! One rank's view of a fake communicator: where its ranks meet, its health as `ncclCommGetAsyncError`
//! reports it, and the counters that give every operation its place in the order all ranks agree on.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nccl_sys::sys::{ncclComm_t, ncclResult_t};

use super::exchange::{await_file, publish, publish_once};
use super::red_ops::CreatedOps;
use super::result_codes::{
    IN_PROGRESS, INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR, SUCCESS, SYSTEM_ERROR,
};
use crate::knobs;
use crate::stream::{self, lock};

#[derive(Default)]
struct Health {
    /// An asynchronous job (creation, split, shrink) of this rank is still running.
    job_running: bool,
    /// Further polls answered `ncclInProgress` (see the `*_POLLS` knobs).
    polls_left: u32,
    /// The first asynchronous error, sticky.
    error: Option<ncclResult_t>,
    finalizing: bool,
}

/// One rank of a communicator.
pub(crate) struct Comm {
    /// The directory its ranks meet in.
    pub dir: PathBuf,
    pub rank: usize,
    pub nranks: usize,
    /// The device whose context created it (a split or shrink child's is its parent's).
    pub device: usize,
    pub name: String,
    pub non_blocking: bool,
    health: Mutex<Health>,
    /// Set by `ncclCommAbort` at once, in a group too (NCCL's abort flag), and by a shrink that aborts first:
    /// waiting operations give up.
    pub stop: AtomicBool,
    /// Set by `ncclCommAbort` and destroy: control exchanges give up too.
    pub gone: AtomicBool,
    /// Set by `ncclCommRevoke`: in-flight operations give up without an error, later ones are refused.
    revoked: AtomicBool,
    next_collective: AtomicU64,
    next_control: AtomicU64,
    next_send: Mutex<Vec<u64>>,
    next_recv: Mutex<Vec<u64>>,
    /// This rank has reached its first collective (see [`Comm::arrive`]).
    arrived: AtomicBool,
    /// Operations run (for `FAKE_NCCL_FAIL_AFTER`).
    ops_run: AtomicU64,
    /// Operations enqueued and not yet run (for `ncclCommFinalize`).
    pub in_flight: AtomicU64,
    fail_after: Option<u64>,
    /// The reductions this rank created on the communicator (`ncclRedOpCreatePreMulSum`).
    pub ops: CreatedOps,
}

impl Comm {
    pub(crate) fn new(
        dir: PathBuf,
        rank: usize,
        nranks: usize,
        device: usize,
        name: String,
        non_blocking: bool,
    ) -> Arc<Comm> {
        Arc::new(Comm {
            dir,
            rank,
            nranks,
            device,
            name,
            non_blocking,
            health: Mutex::new(Health::default()),
            stop: AtomicBool::new(false),
            gone: AtomicBool::new(false),
            revoked: AtomicBool::new(false),
            next_collective: AtomicU64::new(0),
            next_control: AtomicU64::new(0),
            next_send: Mutex::new(vec![0; nranks]),
            next_recv: Mutex::new(vec![0; nranks]),
            arrived: AtomicBool::new(false),
            ops_run: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            fail_after: knobs::fail_after(rank),
            ops: CreatedOps::new(),
        })
    }

    /// A label for messages: `name (rank r of n)`.
    pub(crate) fn label(&self) -> String {
        format!("{} (rank {} of {})", self.name, self.rank, self.nranks)
    }

    /// What `ncclCommGetAsyncError` answers now.
    pub(crate) fn async_error(&self) -> ncclResult_t {
        let mut h = lock(&self.health);
        if let Some(e) = h.error {
            return e;
        }
        let draining = h.finalizing || self.revoked();
        if h.job_running || (draining && self.in_flight.load(Ordering::Acquire) > 0) {
            return IN_PROGRESS;
        }
        if h.polls_left > 0 {
            h.polls_left -= 1;
            return IN_PROGRESS;
        }
        SUCCESS
    }

    /// Whether an asynchronous error has been recorded.
    pub(crate) fn has_error(&self) -> bool {
        lock(&self.health).error.is_some()
    }

    /// NCCL's `ncclCommEnsureReady`: a call on a communicator still in progress is refused.
    pub(crate) fn ensure_ready(&self, call: &str) -> Result<(), ncclResult_t> {
        match self.async_error() {
            SUCCESS => Ok(()),
            IN_PROGRESS => {
                eprintln!(
                    "fake-nccl: {call} on {}: Attempt to use communicator before the previous operation \
                     returned ncclSuccess",
                    self.label()
                );
                Err(INVALID_ARGUMENT)
            }
            e => Err(e),
        }
    }

    /// Records an asynchronous error (the first one sticks) and says why on stderr. Once revoked, work that gave
    /// up is no error: the communicator stays usable as a parent, as NCCL's does.
    pub(crate) fn fail(&self, code: ncclResult_t, why: &str) {
        if self.revoked() {
            eprintln!("fake-nccl: {}: revoked: {why}", self.label());
            return;
        }
        eprintln!("fake-nccl: {}: {why}", self.label());
        lock(&self.health).error.get_or_insert(code);
    }

    pub(crate) fn set_job_running(&self, running: bool) {
        lock(&self.health).job_running = running;
    }

    /// Stays in progress for `polls` more polls (non-blocking communicators only).
    pub(crate) fn linger(&self, polls: u32) {
        if self.non_blocking {
            let mut h = lock(&self.health);
            h.polls_left = h.polls_left.max(polls);
        }
    }

    /// `ncclCommRevoke`: operations waiting for peers give up, and later ones are refused.
    pub(crate) fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
        self.stop.store(true, Ordering::Release);
    }

    /// Whether the communicator was revoked.
    pub(crate) fn revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    pub(crate) fn set_finalizing(&self) {
        lock(&self.health).finalizing = true;
    }

    /// The next collective's place in the order.
    pub(crate) fn next_collective(&self) -> u64 {
        self.next_collective.fetch_add(1, Ordering::AcqRel)
    }

    /// The next send to (or receive from) `peer`'s place in that pair's order.
    pub(crate) fn next_p2p(&self, peer: usize, send: bool) -> u64 {
        let counters = if send {
            &self.next_send
        } else {
            &self.next_recv
        };
        let mut c = lock(counters);
        let k = c[peer];
        c[peer] += 1;
        k
    }

    /// The next control exchange's place in the order.
    pub(crate) fn next_control(&self) -> u64 {
        self.next_control.fetch_add(1, Ordering::AcqRel)
    }

    /// NCCL's runtime connection (2.22 and later, unless `NCCL_RUNTIME_CONNECT=0`): a communicator of several
    /// ranks connects its peers on its first collective, send or receive, which needs every rank there. On that
    /// first use this publishes `connect.r<rank>` and answers true: the caller then waits, in
    /// [`Comm::await_connected`], until every rank has. False on every later use, and when there is nothing to
    /// connect.
    pub(crate) fn arrive(&self) -> Result<bool, String> {
        if self.nranks == 1
            || !knobs::runtime_connect()
            || self.arrived.swap(true, Ordering::AcqRel)
        {
            return Ok(false);
        }
        publish(&self.dir, &format!("connect.r{}", self.rank), &[])?;
        Ok(true)
    }

    /// Waits until every rank has [arrived](Comm::arrive): the peers are connected. Gives up on abort or after
    /// the peer timeout, where a real NCCL would wait for ever.
    pub(crate) fn await_connected(&self) -> Result<(), (ncclResult_t, String)> {
        for r in 0..self.nranks {
            await_file(&self.dir, &format!("connect.r{r}"), &self.stop).map_err(|e| {
                (
                    SYSTEM_ERROR,
                    format!(
                        "connecting the peers on the first collective (runtime connection): rank {r} never \
                         reached its first collective: {e}"
                    ),
                )
            })?;
        }
        Ok(())
    }

    /// Whether the next operation should fail by `FAKE_NCCL_FAIL_AFTER`; counts it as run otherwise.
    pub(crate) fn injected_failure(&self) -> bool {
        let run = self.ops_run.fetch_add(1, Ordering::AcqRel);
        match self.fail_after {
            Some(k) if run >= k => {
                self.fail(
                    REMOTE_ERROR,
                    &format!("injected failure after {k} operations (FAKE_NCCL_FAIL_AFTER)"),
                );
                true
            }
            _ => false,
        }
    }

    /// Publishes `mine` as `<tag><k>.r<rank>` and reads the same from each of `among` (ranks of this
    /// communicator), in that order.
    pub(crate) fn gather(
        &self,
        tag: &str,
        k: u64,
        mine: &[u8],
        among: &[usize],
        stop: &AtomicBool,
    ) -> Result<Vec<Vec<u8>>, String> {
        publish(&self.dir, &format!("{tag}{k}.r{}", self.rank), mine)?;
        among
            .iter()
            .map(|&r| {
                await_file(&self.dir, &format!("{tag}{k}.r{r}"), stop)
                    .map_err(|e| format!("waiting for rank {r} in {tag}#{k}: {e}"))
            })
            .collect()
    }

    /// Every rank publishes its rank count and device and waits for the others: the creation of the
    /// communicator. As in NCCL before 2.30 (or without `NCCL_MULTI_RANK_GPU_ENABLE=1`), two ranks on one device
    /// are refused.
    pub(crate) fn join(&self, device: usize) -> Result<(), (ncclResult_t, String)> {
        let sys = |e: String| (SYSTEM_ERROR, e);
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| sys(format!("creating {}: {e}", self.dir.display())))?;
        let n = self.nranks as u64;
        let record = [n.to_le_bytes(), (device as u64).to_le_bytes()].concat();
        if !publish_once(&self.dir, &format!("init.r{}", self.rank), &record).map_err(sys)? {
            return Err((INVALID_USAGE, format!("rank {} joined twice", self.rank)));
        }
        let mut devices = Vec::with_capacity(self.nranks);
        for r in 0..self.nranks {
            let theirs = await_file(&self.dir, &format!("init.r{r}"), &self.gone)
                .map_err(|e| sys(format!("rank {r} never joined: {e}")))?;
            let word = |i: usize| {
                theirs
                    .get(i * 8..(i + 1) * 8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
            };
            if word(0) != Some(n) {
                return Err((
                    INVALID_USAGE,
                    format!("rank {r} joined with a different rank count than this rank's {n}"),
                ));
            }
            devices.push(word(1).unwrap_or(u64::MAX));
        }
        if !knobs::multi_rank_gpu() {
            for (a, da) in devices.iter().enumerate() {
                if let Some(b) = devices[a + 1..].iter().position(|db| db == da) {
                    return Err((
                        INVALID_USAGE,
                        format!(
                            "Duplicate GPU detected : rank {a} and rank {} both on CUDA device {da}",
                            a + 1 + b
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Leaves the communicator; the last rank to leave removes its directory.
    pub(crate) fn leave(&self) {
        self.gone.store(true, Ordering::Release);
        self.stop.store(true, Ordering::Release);
        if publish(&self.dir, &format!("gone.r{}", self.rank), &[]).is_err() {
            return;
        }
        let all_gone = (0..self.nranks).all(|r| self.dir.join(format!("gone.r{r}")).exists());
        if all_gone {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Frees the aborted communicators `handles` (their abort flags are raised already), as NCCL's `commReclaim` does:
/// waits for the work on their devices to end, as freeing device memory does on a GPU (up to the hang timeout,
/// past which it says on stderr that NCCL would hang here), then leaves each. `in_group`: freed by the outermost
/// `ncclGroupEnd` of the group that held their aborts, rather than in `ncclCommAbort` (as traced).
///
/// # Safety
///
/// Every handle came from this library and is not used again.
pub(crate) unsafe fn free_aborted(handles: Vec<ncclComm_t>, in_group: bool) {
    let comms: Vec<Arc<Comm>> = handles
        .into_iter()
        // SAFETY: the caller's contract.
        .map(|c| unsafe { release(c) })
        .collect();
    let mut devices: Vec<usize> = comms.iter().map(|c| c.device).collect();
    devices.sort_unstable();
    devices.dedup();
    for device in devices {
        let limit = knobs::hang_timeout();
        if !stream::settle_device(device, limit) {
            let names: Vec<String> = comms
                .iter()
                .filter(|c| c.device == device)
                .map(|c| c.label())
                .collect();
            eprintln!(
                "fake-nccl: ncclCommAbort of {}: freeing waited {limit:?} for work on device {device} that never \
                 ended (a kernel of another communicator waiting for its peers?); NCCL hangs here: abort such \
                 communicators together, in one group (NCCL 2.22 and later)",
                names.join(", ")
            );
        }
    }
    let others = in_group.then(|| comms.len() - 1);
    for comm in comms {
        knobs::trace_nccl_free(&comm.label(), others);
        comm.leave();
    }
}

/// A communicator handle for the C API: a boxed `Arc<Comm>`.
pub(crate) fn into_handle(comm: Arc<Comm>) -> ncclComm_t {
    Box::into_raw(Box::new(comm)).cast()
}

/// Borrows the communicator behind a handle.
///
/// # Safety
///
/// `c` is null or came from [`into_handle`] and was not released.
pub(crate) unsafe fn from_handle<'a>(c: ncclComm_t) -> Option<&'a Arc<Comm>> {
    // SAFETY: by the contract a non-null handle is a live Box<Arc<Comm>>.
    unsafe { c.cast::<Arc<Comm>>().as_ref() }
}

/// Releases a handle.
///
/// # Safety
///
/// `c` came from [`into_handle`] and is not used again.
pub(crate) unsafe fn release(c: ncclComm_t) -> Arc<Comm> {
    // SAFETY: the contract.
    *unsafe { Box::from_raw(c.cast::<Arc<Comm>>()) }
}
