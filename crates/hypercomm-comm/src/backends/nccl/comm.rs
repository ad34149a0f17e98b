//! [`NcclComm`]: owns one NCCL communicator, serialises calls on it, polls it, and aborts it on timeout.
//!
//! Invariant: `handle` is `Some(live communicator)` until [`NcclComm::abort`] or drop takes it; once `broken` is
//! set it stays set, and every later call fails with [`CommError::Broken`]. A timeout while polling aborts the
//! communicator, which makes every pending work handle fail (they check `broken` before anything else).
//!
//! In a [`FailureDomain`] the communicator is a member: the first fatal failure of its own is settled through the
//! domain (recorded, every other member aborted), and another member's failure aborts it.
//!
//! Reductions NCCL does not build in (a premulsum) are created on the communicator the first time a call needs
//! them, once per element type and factor, and kept in `created` for its life. An orderly release destroys them
//! (`ncclRedOpDestroy`) before `ncclCommFinalize`; an abort does not: `ncclCommAbort` frees the communicator's
//! operators with it, and a handle taken by an abort is never used again, so the table is only forgotten.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::CudaEvent;
use nccl_sys::sys::ncclRedOp_t;
use nccl_sys::{Nccl, NcclError};

use super::gpu::cuda_err;
use super::raw::{self, CommHandle, Progress};
use crate::element::{DType, ReduceOp, Scalar};
use crate::failure::Member;
use crate::{CommError, FailureDomain};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections only read or replace a value; a poisoned lock still holds a consistent one.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long a wait re-polls at once, on the CPU it has. An enqueue that answers `ncclInProgress`, or a small
/// collective's event, usually settles within microseconds, while the shortest `thread::sleep` costs the kernel's
/// timer slack (about 50 µs on Linux): sleeping from the first poll multiplies a two-rank all-reduce's host time
/// several times over (the GPU figures are in `docs/perf/nccl.md`). `yield_now` is no better on a busy machine: it
/// hands the core to another runnable thread for a whole time slice.
const SPIN: Duration = Duration::from_micros(50);

/// After [`SPIN`], how long a wait yields the core between polls before it starts to sleep.
const YIELD: Duration = Duration::from_micros(500);

/// Spin-loop hints between two polls while spinning: a few hundred nanoseconds (a `pause` takes 10-140 cycles
/// depending on the CPU), so that a wait notices NCCL settling within about that. 64 of them took up to 4 us on
/// CPUs with a slow `pause`, which a call that settles in a few microseconds pays on every wait.
const SPIN_PAUSES: u32 = 8;

/// Paces the polls of one bounded wait: spin for [`SPIN`], yield until [`YIELD`], then sleep with doubling
/// pauses up to `max`.
pub(crate) struct Backoff {
    started: Instant,
    pause: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(max: Duration) -> Backoff {
        Backoff {
            started: Instant::now(),
            pause: Duration::from_micros(5),
            max,
        }
    }

    /// Waits before the next poll.
    pub(crate) fn pause(&mut self) {
        let waited = self.started.elapsed();
        if waited < SPIN {
            for _ in 0..SPIN_PAUSES {
                std::hint::spin_loop();
            }
        } else if waited < YIELD {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.pause);
            self.pause = (self.pause * 2).min(self.max);
        }
    }
}

/// One NCCL communicator and what is known about its health.
pub(crate) struct NcclComm {
    pub(crate) runtime: Arc<super::DeviceRuntime>,
    handle: Mutex<Option<CommHandle>>,
    /// The premulsum operators created on `handle`, by element type and factor. Locked only while `handle` is
    /// (taken in that order), so creating one is serialised with every other call on the communicator.
    created: Mutex<Vec<((DType, Scalar), ncclRedOp_t)>>,
    /// Why it broke: set once, by the first failure (read without a lock on every call).
    broken: OnceLock<String>,
    pub(crate) name: String,
    pub(crate) timeout: Duration,
    pub(crate) non_blocking: bool,
    /// The domain its failures are settled in (and which aborts it when another member fails), if any.
    pub(crate) domain: Option<Arc<FailureDomain>>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("name", &self.name)
            .field("broken", &self.broken.get())
            .finish_non_exhaustive()
    }
}

impl NcclComm {
    /// Takes ownership of `handle` and waits until NCCL has finished creating it (`first` is the creating call's
    /// answer).
    pub(crate) fn adopt(
        runtime: Arc<super::DeviceRuntime>,
        handle: CommHandle,
        first: Progress,
        name: String,
        timeout: Duration,
        non_blocking: bool,
    ) -> Result<NcclComm, CommError> {
        let comm = NcclComm {
            runtime,
            handle: Mutex::new(Some(handle)),
            created: Mutex::new(Vec::new()),
            broken: OnceLock::new(),
            name,
            timeout,
            non_blocking,
            domain: None,
        };
        if first == Progress::Pending {
            comm.wait_ready("creating the communicator")?;
        }
        Ok(comm)
    }

    fn nccl(&self) -> &Nccl {
        self.runtime.nccl()
    }

    /// The error for a failed NCCL call during `what`.
    pub(crate) fn error(&self, what: &str, e: NcclError) -> CommError {
        CommError::Device {
            comm: self.name.clone(),
            what: format!("{what}: {e}"),
        }
    }

    /// A [`CommError::Device`] for `what`, with a sentence of hypercomm's own.
    pub(crate) fn error_text(&self, what: &str, why: String) -> CommError {
        CommError::Device {
            comm: self.name.clone(),
            what: format!("{what}: {why}"),
        }
    }

    /// The number of ranks NCCL reports (`ncclCommCount`).
    pub(crate) fn count(&self) -> Result<usize, CommError> {
        self.with_handle(|h| raw::count(self.nccl(), h).map_err(|e| self.error("ncclCommCount", e)))
    }

    /// This rank's rank as NCCL reports it (`ncclCommUserRank`).
    pub(crate) fn user_rank(&self) -> Result<usize, CommError> {
        self.with_handle(|h| {
            raw::user_rank(self.nccl(), h).map_err(|e| self.error("ncclCommUserRank", e))
        })
    }

    /// NCCL's reduction for `op` on elements of `dtype` on this communicator: a built-in one, or the premulsum
    /// operator for `dtype` and the factor, created (`ncclRedOpCreatePreMulSum`) the first time it is asked for
    /// and kept until the communicator is released. A factor that is no value of `dtype` is an invalid argument
    /// naming it (the face refuses it before this).
    pub(crate) fn reduction(&self, op: ReduceOp, dtype: DType) -> Result<ncclRedOp_t, CommError> {
        if let Some(builtin) = raw::builtin_op(op) {
            return Ok(builtin);
        }
        let ReduceOp::PreMulSum(factor) = op else {
            return Err(self.error_text(
                "choosing the reduction",
                format!("{op} is neither built into nccl nor one hypercomm creates"),
            ));
        };
        let scalar = factor
            .element_bytes(dtype)
            .map_err(|why| crate::checks::invalid(&self.name, format!("{op} on {dtype}: {why}")))?;
        self.with_handle(|h| {
            let mut created = lock(&self.created);
            if let Some((_, made)) = created.iter().find(|(key, _)| *key == (dtype, factor)) {
                return Ok(*made);
            }
            let made = raw::create_pre_mul_sum(self.nccl(), h, scalar, dtype).map_err(|e| {
                self.error(&format!("ncclRedOpCreatePreMulSum for {op} on {dtype}"), e)
            })?;
            created.push(((dtype, factor), made));
            Ok(made)
        })
    }

    /// The first fatal error, if any.
    pub(crate) fn broken(&self) -> Option<String> {
        self.broken.get().cloned()
    }

    fn fail_if_broken(&self) -> Result<(), CommError> {
        match self.broken() {
            Some(cause) => Err(CommError::Broken {
                comm: self.name.clone(),
                cause,
            }),
            None => Ok(()),
        }
    }

    /// Runs `f` with the live handle, calls on this communicator serialised. Fails if broken or aborted.
    pub(crate) fn with_handle<R>(
        &self,
        f: impl FnOnce(CommHandle) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        self.fail_if_broken()?;
        let guard = lock(&self.handle);
        let handle = guard.ok_or_else(|| CommError::Broken {
            comm: self.name.clone(),
            cause: "the communicator was aborted".into(),
        })?;
        let result = f(handle);
        drop(guard);
        if let Err(e) = &result
            && e.is_fatal()
        {
            self.fail(e);
        }
        result
    }

    /// Runs `f` with the live handles of `comms` (distinct communicators), in the same order, calls on every one
    /// of them serialised for the whole of `f`: what one NCCL group over several communicators needs. The locks
    /// are taken in address order, so that two threads locking overlapping sets cannot deadlock. Fails, without
    /// running `f`, naming the first communicator that is broken or aborted. A fatal error of `f` breaks every
    /// one of them: NCCL does not say which communicator of a failed group failed.
    pub(crate) fn with_handles<R>(
        comms: &[&NcclComm],
        f: impl FnOnce(&[CommHandle]) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        for comm in comms {
            comm.fail_if_broken()?;
        }
        let mut order: Vec<usize> = (0..comms.len()).collect();
        order.sort_by_key(|&i| std::ptr::from_ref(comms[i]) as usize);
        let mut guards: Vec<Option<MutexGuard<'_, Option<CommHandle>>>> =
            comms.iter().map(|_| None).collect();
        for i in order {
            guards[i] = Some(lock(&comms[i].handle));
        }
        let handles = guards
            .iter()
            .zip(comms)
            .map(|(guard, comm)| {
                guard
                    .as_deref()
                    .copied()
                    .flatten()
                    .ok_or_else(|| CommError::Broken {
                        comm: comm.name.clone(),
                        cause: "the communicator was aborted".into(),
                    })
            })
            .collect::<Result<Vec<CommHandle>, CommError>>()?;
        let result = f(&handles);
        drop(guards);
        if let Err(e) = &result
            && e.is_fatal()
        {
            for comm in comms {
                comm.fail(e);
            }
        }
        result
    }

    /// Polls `ncclCommGetAsyncError`: `Ok(true)` when idle and healthy, `Ok(false)` while still in progress.
    /// An asynchronous error breaks the communicator.
    pub(crate) fn poll(&self, during: &str) -> Result<bool, CommError> {
        self.with_handle(|h| match raw::async_error(self.nccl(), h) {
            Ok(Progress::Done) => Ok(true),
            Ok(Progress::Pending) => Ok(false),
            Err(e) => Err(self.error(during, e)),
        })
    }

    /// Waits until the communicator is no longer in progress, up to the timeout; on timeout aborts it.
    pub(crate) fn wait_ready(&self, during: &str) -> Result<(), CommError> {
        if !self.non_blocking {
            // A blocking communicator finished its call before returning; one poll reports its errors.
            return self.poll(during).map(|_| ());
        }
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Backoff::new(Duration::from_millis(1));
        // Bounded by the deadline.
        loop {
            if self.poll(during)? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.time_out(during));
            }
            backoff.pause();
        }
    }

    /// Blocks the CPU until `event` (recorded after work on this communicator) completes, polling NCCL for
    /// asynchronous errors meanwhile and once more at the end; past the timeout aborts the communicator.
    pub(crate) fn wait_event(&self, event: &CudaEvent, during: &str) -> Result<(), CommError> {
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Backoff::new(Duration::from_micros(200));
        // Bounded by the deadline.
        loop {
            self.fail_if_broken()?;
            let done = event
                .try_is_complete()
                .map_err(cuda_err(&self.name, "querying an event"))?;
            // An operation that completed may still have raised an asynchronous error.
            self.poll(during)?;
            if done {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.time_out(during));
            }
            backoff.pause();
        }
    }

    /// Aborts after a timeout in `during` and returns the error every waiter sees.
    pub(crate) fn time_out(&self, during: &str) -> CommError {
        let error = CommError::timeout(
            &self.name,
            Vec::new(),
            self.timeout,
            format!("{during}; the nccl communicator was aborted"),
        );
        self.fail(&error);
        self.abort();
        error
    }

    /// Marks the communicator broken by `error`; the first failure is also settled through the domain: recorded
    /// as this rank's root cause (unless it has one) and every other member aborted.
    fn fail(&self, error: &CommError) {
        if self.mark_broken(error.to_string())
            && let Some(domain) = &self.domain
        {
            domain.settle_device(&self.name, error);
        }
    }

    /// Marks the communicator broken with `cause`, unless it is broken already; says whether it was not.
    pub(crate) fn mark_broken(&self, cause: String) -> bool {
        self.broken.set(cause).is_ok()
    }

    /// Aborts the communicator (`ncclCommAbort`): its work stops, every later call and pending work fails.
    pub(crate) fn abort(&self) {
        self.abort_with("aborted by this rank");
    }

    /// [`abort`](Self::abort) with `cause` as the reason later calls see (unless it was broken already).
    fn abort_with(&self, cause: &str) {
        self.mark_broken(cause.to_owned());
        let mut handle = lock(&self.handle);
        if let Some(h) = handle.take() {
            // ncclCommAbort frees the created reductions with the communicator.
            lock(&self.created).clear();
            if let Err(e) = raw::abort(self.nccl(), h) {
                tracing::warn!(comm = %self.name, error = %e, "ncclCommAbort failed");
            }
        }
    }
}

impl Member for NcclComm {
    fn abort_with(&self, cause: &str) {
        NcclComm::abort_with(self, cause);
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        let Some(h) = lock(&self.handle).take() else {
            return;
        };
        let nccl = self.runtime.nccl();
        let created = std::mem::take(&mut *lock(&self.created));
        if self.broken().is_some() {
            // ncclCommAbort frees the created reductions with the communicator.
            let _ = raw::abort(nccl, h);
            return;
        }
        // The created reductions first: NCCL allows it once the calls given them have returned, which they all
        // have (work still in flight keeps its own copy). A failure costs a few bytes until the destroy below.
        for ((dtype, factor), op) in created {
            if let Err(e) = raw::destroy_op(nccl, h, op) {
                tracing::warn!(
                    comm = %self.name, error = %e, %dtype, %factor,
                    "ncclRedOpDestroy of a premulsum failed"
                );
            }
        }
        // Finalize, wait (bounded) for outstanding work, then destroy; abort if that does not settle.
        let settled = match raw::finalize(nccl, h) {
            Ok(Progress::Done) => true,
            Ok(Progress::Pending) => {
                let deadline = Instant::now() + self.timeout;
                let mut backoff = Backoff::new(Duration::from_millis(1));
                // Bounded by the deadline.
                loop {
                    match raw::async_error(nccl, h) {
                        Ok(Progress::Done) => break true,
                        Ok(Progress::Pending) if Instant::now() < deadline => backoff.pause(),
                        _ => break false,
                    }
                }
            }
            Err(_) => false,
        };
        let result = if settled {
            raw::destroy(nccl, h)
        } else {
            raw::abort(nccl, h)
        };
        if let Err(e) = result {
            tracing::warn!(comm = %self.name, error = %e, "releasing the nccl communicator failed");
        }
    }
}
