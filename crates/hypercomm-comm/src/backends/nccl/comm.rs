//! [`NcclComm`]: owns one NCCL communicator, serialises calls on it, polls it, and stops it on a failure.
//!
//! Invariant: `handle` is `Some(live communicator)` until an abort or drop takes it; once `broken` is set it stays
//! set, and every later call fails with [`CommError::Broken`]. A timeout (seen by a waiter or by the GPU's
//! watchdog, `watchdog`) breaks and stops the communicator, which makes every pending work handle fail (they
//! check `broken` before anything else).
//!
//! Stopping from another thread (the watchdog, another member of the failure domain) follows one rule, because
//! `ncclCommAbort` frees the communicator in the same call: it runs only while this side holds the handle's
//! mutex, that is while no call is inside NCCL. When a call is inside NCCL (a blocking communicator waiting for
//! a peer, say), the stopper marks the communicator broken, and where the loaded NCCL has `ncclCommRevoke`
//! (2.28 and later) revokes it, which stops in-flight work and is safe beside that call; the call then returns,
//! and the thread that made it aborts the communicator on its way out of the mutex. Per NCCL version:
//! - **2.28 and later**: abort when no call is inside, else revoke now and abort when the call returns.
//! - **Before 2.28**: abort when no call is inside, else abort when the call returns. A non-blocking
//!   communicator (hypercomm's default) returns from every call at once, so this is prompt; a blocking one
//!   stuck inside NCCL stays stuck until NCCL returns, as nothing can stop it safely from another thread.
//!
//! A failure domain's abort stops all its members at once (`failure::abort`): this communicator takes part by
//! giving up its handle under the mutex ([`Detached`], with every other NCCL communicator of the domain freed
//! in one NCCL group from NCCL 2.22: see `abort` for why), or, with a call inside NCCL, by the same revoke and
//! abort on the way out as above, never inside the group.
//!
//! Every operation is numbered in the communicator's flight recorder (`flight`), which is written out when the
//! communicator breaks; a timeout first asks the peers how far they got (`behind`), to name the rank behind.
//!
//! In a [`FailureDomain`] the communicator is a member: the first fatal failure of its own is settled through the
//! domain (recorded, every other member aborted), and another member's failure stops it.
//!
//! Reductions NCCL does not build in (a premulsum) are created on the communicator the first time a call needs
//! them, once per element type and factor, and kept in `created` for its life. An orderly release destroys them
//! (`ncclRedOpDestroy`) before `ncclCommFinalize`; an abort does not: `ncclCommAbort` frees the communicator's
//! operators with it, and a handle taken by an abort is never used again, so the table is only forgotten.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use cudarc::driver::CudaEvent;
use nccl_sys::sys::ncclRedOp_t;
use nccl_sys::{Function, Nccl, NcclError};

use super::abort::Detached;
use super::backoff::Backoff;
use super::flight::FlightRecorder;
use super::raw::{self, CommHandle, Progress};
use crate::element::{DType, ReduceOp, Scalar};
use crate::error::RootCause;
use crate::failure::{Member, STOP_TRY, Step};
use crate::{CommError, FailureDomain};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections only read or replace a value; a poisoned lock still holds a consistent one.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long a thread that times out while another thread is settling the same timeout waits for that one.
const SETTLING_WAIT: Duration = Duration::from_secs(10);

/// One NCCL communicator and what is known about its health.
pub(crate) struct NcclComm {
    pub(crate) runtime: Arc<super::DeviceRuntime>,
    /// Serialises calls; `None` once aborted.
    handle: Mutex<Option<CommHandle>>,
    /// The premulsum operators created on `handle`, by element type and factor. Locked only while `handle` is
    /// (taken in that order), so creating one is serialised with every other call on the communicator.
    created: Mutex<Vec<((DType, Scalar), ncclRedOp_t)>>,
    /// A copy of the handle for `ncclCommRevoke`, which runs beside a call: taken (under this lock, after
    /// `handle`'s) before the communicator is freed, so a revoke never meets a freed communicator.
    live: Mutex<Option<CommHandle>>,
    /// Revoked already (a revoke is made once).
    revoked: AtomicBool,
    /// A stopper gave up waiting for the call inside NCCL: that call aborts the communicator on its way out, and
    /// later stoppers need not wait for it again.
    left_to_call: AtomicBool,
    /// A thread is settling a timeout (the exchange with the peers takes a moment; one thread makes it).
    settling: AtomicBool,
    /// The timeout is settled: recorded in the domain, every member stopped. A waiter that meets the timeout while
    /// another thread settles it returns only after this (bounded), so that what it then sees of the rank's other
    /// communicators is already stopped.
    settled: AtomicBool,
    /// Why it broke: set once, by the first failure (read without a lock on every call).
    broken: OnceLock<String>,
    /// The timeout that broke it, when one did: what a waiter on its operations reports (later calls report
    /// [`CommError::Broken`]).
    timed_out: OnceLock<TimedOut>,
    pub(crate) name: String,
    pub(crate) timeout: Duration,
    pub(crate) non_blocking: bool,
    /// The domain its failures are settled in (and which aborts it when another member fails), if any.
    pub(crate) domain: Option<Arc<FailureDomain>>,
    /// Its operations, numbered (see `flight`).
    pub(crate) recorder: FlightRecorder,
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
            live: Mutex::new(Some(handle)),
            revoked: AtomicBool::new(false),
            left_to_call: AtomicBool::new(false),
            settling: AtomicBool::new(false),
            settled: AtomicBool::new(false),
            broken: OnceLock::new(),
            timed_out: OnceLock::new(),
            recorder: FlightRecorder::new(&name, 0, None),
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

    /// The error of a call on this communicator once it is broken by `cause`, with the root cause its failure
    /// domain settled, if any.
    pub(crate) fn broken_error(&self, cause: String) -> CommError {
        let root = self.domain.as_deref().and_then(FailureDomain::root_cause);
        CommError::broken(&self.name, cause, root)
    }

    fn fail_if_broken(&self) -> Result<(), CommError> {
        match self.broken() {
            Some(cause) => Err(self.broken_error(cause)),
            None => Ok(()),
        }
    }

    /// Runs `f` with the live handle, calls on this communicator serialised. Fails if broken or aborted. When the
    /// communicator was stopped from another thread while `f` was inside NCCL, aborts it before letting go.
    pub(crate) fn with_handle<R>(
        &self,
        f: impl FnOnce(CommHandle) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        self.fail_if_broken()?;
        let mut guard = lock(&self.handle);
        let handle =
            guard.ok_or_else(|| self.broken_error("the communicator was aborted".into()))?;
        let result = f(handle);
        if self.broken.get().is_some() {
            self.abort_locked(&mut guard);
        }
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
                    .ok_or_else(|| comm.broken_error("the communicator was aborted".into()))
            })
            .collect::<Result<Vec<CommHandle>, CommError>>()?;
        let result = f(&handles);
        // A communicator stopped while the group was inside NCCL (revoked rather than aborted then) is aborted
        // on the way out, as `with_handle` does.
        for (guard, comm) in guards.iter_mut().zip(comms) {
            if comm.broken.get().is_some()
                && let Some(guard) = guard
            {
                comm.abort_locked(guard);
            }
        }
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

    /// [`poll`](Self::poll) from the watchdog: `None` without asking when broken, or when a call holds the handle
    /// (the watchdog never waits for a call). An asynchronous error breaks and stops the communicator.
    pub(crate) fn try_poll(&self) -> Option<Result<bool, CommError>> {
        if self.broken().is_some() {
            return None;
        }
        let answer = {
            let guard = match self.handle.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return None,
            };
            raw::async_error(self.nccl(), (*guard)?)
        };
        Some(match answer {
            Ok(Progress::Done) => Ok(true),
            Ok(Progress::Pending) => Ok(false),
            Err(e) => {
                let error = self.error("an asynchronous error seen by the watchdog", e);
                self.fail(&error);
                self.stop(&error.to_string());
                Err(error)
            }
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
            if let Some(t) = self.timed_out.get() {
                self.await_settled();
                return Err(t.error(&self.name));
            }
            self.fail_if_broken()?;
            let done = event
                .try_is_complete()
                .map_err(|e| self.error_text("querying an event", e.to_string()))?;
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

    /// Stops the communicator after a timeout in `during` and returns the error every waiter sees. The oldest
    /// operation not seen complete is the one that timed out; before settling, the ranks compare how far they got
    /// (`behind`), so that the error names the rank behind. When another thread is settling the same timeout
    /// already (the watchdog, or a waiter), waits for it instead and reports what it found.
    pub(crate) fn time_out(&self, during: &str) -> CommError {
        if self.settling.swap(true, Ordering::AcqRel) {
            self.await_settled();
            if let Some(t) = self.timed_out.get() {
                return t.error(&self.name);
            }
            return self.broken_error(
                self.broken()
                    .unwrap_or_else(|| format!("timed out in {during}")),
            );
        }
        let during = format!("{during}; the nccl communicator was aborted");
        let error = super::behind::diagnose(
            &self.name,
            self.timeout,
            &self.recorder.record(),
            self.domain.as_deref(),
            during,
        );
        self.recorder.time_out_oldest();
        if let Some(t) = TimedOut::of(&error) {
            let _ = self.timed_out.set(t);
        }
        self.fail(&error);
        self.stop(&error.to_string());
        self.settled.store(true, Ordering::Release);
        error
    }

    /// Waits (at most [`SETTLING_WAIT`]) until the thread settling this communicator's timeout is done, if one is.
    fn await_settled(&self) {
        if !self.settling.load(Ordering::Acquire) {
            return;
        }
        let deadline = Instant::now() + SETTLING_WAIT;
        let mut backoff = Backoff::new(Duration::from_millis(5));
        // Bounded by the deadline.
        while !self.settled.load(Ordering::Acquire) && Instant::now() < deadline {
            backoff.pause();
        }
    }

    /// Marks the communicator broken by `error`; the first failure is also settled through the domain: recorded
    /// as this rank's root cause (unless it has one) and every other member aborted.
    pub(crate) fn fail(&self, error: &CommError) {
        if self.mark_broken(error.to_string())
            && let Some(domain) = &self.domain
        {
            domain.settle_device(&self.name, error);
        }
    }

    /// Marks the communicator broken with `cause`, unless it is broken already; says whether it was not. The first
    /// time, the flight recorder records the failure (and writes itself out).
    pub(crate) fn mark_broken(&self, cause: String) -> bool {
        let first = self.broken.set(cause.clone()).is_ok();
        if first {
            self.recorder.fail(&cause);
        }
        first
    }

    /// Aborts the communicator (`ncclCommAbort`): its work stops, every later call and pending work fails. A
    /// deliberate abort: the flight recorder writes nothing.
    pub(crate) fn abort(&self) {
        let _ = self.broken.set("aborted by this rank".to_owned());
        self.stop_work();
    }

    /// Breaks the communicator with `cause` (unless it is broken already) and stops its work: see the module doc
    /// for how, per NCCL version.
    pub(crate) fn stop(&self, cause: &str) {
        self.mark_broken(cause.to_owned());
        self.stop_work();
    }

    /// Aborts now if no call is inside NCCL; otherwise revokes (where NCCL has it) and leaves the abort to the
    /// call, which makes it on its way out of [`with_handle`](Self::with_handle). `broken` is set already.
    fn stop_work(&self) {
        // When an earlier stop left the abort to a call inside NCCL, one try is enough: that call aborts on its way
        // out (and was revoked where NCCL can), unless it has returned already.
        let wait = if self.left_to_call.load(Ordering::Acquire) {
            Duration::ZERO
        } else {
            STOP_TRY
        };
        let deadline = Instant::now() + wait;
        let mut backoff = Backoff::new(Duration::from_millis(2));
        // Bounded by the deadline.
        loop {
            match self.handle.try_lock() {
                Ok(mut guard) => return self.abort_locked(&mut guard),
                Err(TryLockError::Poisoned(p)) => return self.abort_locked(&mut p.into_inner()),
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => backoff.pause(),
                Err(TryLockError::WouldBlock) => break,
            }
        }
        self.leave_to_call();
    }

    /// Leaves the abort to the call inside NCCL, which makes it on its way out of [`with_handle`](Self::with_handle),
    /// and revokes the communicator where NCCL has `ncclCommRevoke`, so that the call returns.
    fn leave_to_call(&self) {
        self.left_to_call.store(true, Ordering::Release);
        self.revoke();
    }

    /// `ncclCommRevoke`, once, where the loaded NCCL has it: safe beside a call inside NCCL on another thread.
    fn revoke(&self) {
        if !self.nccl().has(Function::CommRevoke) || self.revoked.swap(true, Ordering::AcqRel) {
            return;
        }
        let live = lock(&self.live);
        if let Some(h) = *live
            && let Err(e) = raw::revoke(self.nccl(), h)
        {
            tracing::warn!(comm = %self.name, error = %e, "ncclCommRevoke failed");
        }
    }

    /// Aborts the communicator with the handle's mutex held (`guard`): no call is inside NCCL.
    fn abort_locked(&self, guard: &mut Option<CommHandle>) {
        if let Some(detached) = self.detach_locked(guard) {
            detached.abort();
        }
    }

    /// Takes the handle for an abort with the handle's mutex held (`guard`), so that no call and no revoke of this
    /// communicator uses it again; `None` when it was taken already.
    fn detach_locked(&self, guard: &mut Option<CommHandle>) -> Option<Detached> {
        let h = guard.take()?;
        // No revoke runs past this point on a communicator about to be freed.
        lock(&self.live).take();
        // ncclCommAbort frees the created reductions with the communicator.
        lock(&self.created).clear();
        Some(Detached::new(
            Arc::clone(&self.runtime),
            h,
            self.name.clone(),
        ))
    }
}

/// A [`CommError::Timeout`] kept to hand each waiter a copy (`CommError` itself is not `Clone`).
#[derive(Clone, Debug)]
struct TimedOut {
    members: Vec<usize>,
    missing: Vec<usize>,
    after: Duration,
    during: String,
    cause: Option<Box<RootCause>>,
}

impl TimedOut {
    fn of(error: &CommError) -> Option<TimedOut> {
        match error {
            CommError::Timeout {
                members,
                missing,
                after,
                during,
                cause,
                ..
            } => Some(TimedOut {
                members: members.clone(),
                missing: missing.clone(),
                after: *after,
                during: during.clone(),
                cause: cause.clone(),
            }),
            _ => None,
        }
    }

    fn error(&self, comm: &str) -> CommError {
        CommError::Timeout {
            comm: comm.to_owned(),
            members: self.members.clone(),
            missing: self.missing.clone(),
            after: self.after,
            during: self.during.clone(),
            cause: self.cause.clone(),
        }
    }
}

impl Member for NcclComm {
    fn abort_with(&self, cause: &str) {
        self.stop(cause);
    }

    /// Breaks the communicator; gives up its handle for the domain to free with the others when no call is inside
    /// NCCL, [`Step::Busy`] while one is.
    fn try_stop(&self, cause: &str) -> Step {
        self.mark_broken(cause.to_owned());
        let detached = match self.handle.try_lock() {
            Ok(mut guard) => self.detach_locked(&mut guard),
            Err(TryLockError::Poisoned(p)) => self.detach_locked(&mut p.into_inner()),
            // An earlier stop left the abort to the call inside: it makes it on its way out.
            Err(TryLockError::WouldBlock) if self.left_to_call.load(Ordering::Acquire) => {
                return Step::Stopped;
            }
            Err(TryLockError::WouldBlock) => return Step::Busy,
        };
        match detached {
            Some(d) => Step::Joint(Box::new(d)),
            None => Step::Stopped,
        }
    }

    fn leave_to_call(&self) {
        NcclComm::leave_to_call(self);
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        let Some(h) = lock(&self.handle).take() else {
            return;
        };
        lock(&self.live).take();
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
