//! A communicator's lane: its operations in issue order, and the one engine that runs them, one at a time (the
//! point-to-point operations queued back to back count as one: they run as one exchange, see [`super::p2p`]).
//!
//! Whoever runs the job at the head of the queue holds the engine meanwhile: the progress thread, or the thread
//! that waits on that very job. [`Work::wait`](crate::Work::wait) runs its job inline when the job is next and
//! the engine is free, so the usual issue-then-wait costs no hand-off to the progress thread and back (two
//! wake-ups, several microseconds each, and two more threads competing for the cores). The progress thread starts
//! with the first job and runs every job nobody is waiting on, so operations still progress in the background,
//! and a rank blocked on one communicator never starves another's operations.
//!
//! Waking the progress thread for every job would cost what running inline saves (on two cores, the woken
//! thread preempts a rank in the middle of its operation). So while the lane is busy — a job issued within the
//! last [`BUSY_WINDOW`] — the progress thread naps in [`NAP`] slices and takes any job still waiting when it
//! wakes; issuing a job wakes it only from its long sleep, and so do a wait that cannot run its job, a poll
//! ([`Work::is_completed`](crate::Work::is_completed), [`Work::wait_timeout`](crate::Work::wait_timeout)) and a
//! dropped handle. An operation nobody waits on therefore starts within one nap, at most [`NAP`] after it was
//! issued. While a job runs inline, the progress thread does not nap: nothing can start before the engine comes
//! back, so it sleeps until then. Napping through a long job would wake it every [`NAP`] on the running rank's core,
//! and each such wake-up delays that rank's next round for every peer (the barrier's cost per round, with and
//! without: `docs/perf/host-collectives.md`).
//!
//! Closing (abort or drop) refuses new jobs; the queued ones still run (they fail fast once the communicator is
//! broken), and then whoever holds the engine last retires it: after an abort, it first tells the peers that this
//! rank gives up.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::engine::Engine;
use super::p2p::{Exchange, P2pOp};
use crate::CommError;
use crate::host_work::RunInline;

/// How long the progress thread of a busy lane sleeps between looks at the queue.
pub(crate) const NAP: Duration = Duration::from_micros(500);

/// How long after the last job a lane counts as busy (its progress thread naps rather than sleeping until woken).
const BUSY_WINDOW: Duration = Duration::from_millis(5);

/// One operation for the lane.
pub(crate) enum Job {
    /// Runs on the engine, alone.
    Run(Box<dyn FnOnce(&mut Engine) + Send>),
    /// A point-to-point operation: runs in one exchange with those queued next to it (see [`super::p2p`]).
    P2p(Box<dyn P2pOp>),
}

/// A queued entry: a job to run alone, or the consecutive point-to-point operations that run as one exchange.
enum Queued {
    Run(Box<dyn FnOnce(&mut Engine) + Send>),
    P2p(Exchange),
}

impl Queued {
    /// Whether job `id` is this entry (filed under `at`) or one of its operations.
    fn holds(&self, at: u64, id: u64) -> bool {
        match self {
            Queued::Run(_) => at == id,
            Queued::P2p(exchange) => exchange.contains(id),
        }
    }
}

/// Where the engine is.
enum Slot {
    /// Free: nobody runs a job.
    Here(Box<Engine>),
    /// A job (or [`Lane::borrow_idle`]'s caller) runs on some thread.
    Busy,
    /// Retired after the lane closed.
    Gone,
}

struct State {
    engine: Slot,
    jobs: VecDeque<(u64, Queued)>,
    /// The id the next job gets.
    next: u64,
    /// The progress thread was started.
    started: bool,
    /// No new jobs; the engine retires once the queue is empty.
    closed: bool,
    /// The engine tells the peers this rank gives up when it retires.
    tell_peers: bool,
    /// When the last job was queued.
    last_push: Option<Instant>,
    /// The progress thread is napping (it looks again within [`NAP`] unwoken); otherwise, if it waits, it sleeps
    /// until woken.
    napping: bool,
    /// The progress thread sleeps until the engine comes back from a job that runs on another thread: the engine's
    /// return wakes it, and nothing else needs to.
    awaits_engine: bool,
}

impl State {
    /// Takes the engine out for good once the lane is closed, empty and the engine free; with whether the peers
    /// must be told. The caller does that outside the lock.
    fn retire(&mut self) -> Option<(Box<Engine>, bool)> {
        if !self.closed || !self.jobs.is_empty() {
            return None;
        }
        match std::mem::replace(&mut self.engine, Slot::Gone) {
            Slot::Here(engine) => Some((engine, self.tell_peers)),
            other => {
                self.engine = other;
                None
            }
        }
    }

    /// The next entry and the engine, when the engine is free and an entry is queued (and, with `only`, it holds
    /// job `only`).
    fn take_next(&mut self, only: Option<u64>) -> Option<(Queued, Box<Engine>)> {
        let (at, front) = self.jobs.front()?;
        if only.is_some_and(|want| !front.holds(*at, want)) {
            return None;
        }
        let engine = match std::mem::replace(&mut self.engine, Slot::Busy) {
            Slot::Here(engine) => engine,
            other => {
                self.engine = other;
                return None;
            }
        };
        match self.jobs.pop_front() {
            Some((_, job)) => Some((job, engine)),
            // `front` saw a job a moment ago under the same lock: not reached, but the engine stays free if it is.
            None => {
                self.engine = Slot::Here(engine);
                None
            }
        }
    }

    /// Whether the next entry is point-to-point operations.
    fn p2p_next(&self) -> bool {
        matches!(self.jobs.front(), Some((_, Queued::P2p(_))))
    }
}

fn retire((mut engine, tell_peers): (Box<Engine>, bool)) {
    if tell_peers {
        engine.backend.abort();
    }
}

/// The queue and the engine of one communicator, shared by its handle, its progress thread and its [`Work`]s.
///
/// [`Work`]: crate::Work
pub(crate) struct Lane {
    state: Mutex<State>,
    /// Signalled whenever a job is queued, the engine comes back or the lane closes.
    changed: Condvar,
    progress: Mutex<Option<JoinHandle<()>>>,
    comm: String,
    /// The next entry is point-to-point operations: a running exchange should stop and take them in. Read without
    /// the lock in an exchange's waits; written under it.
    p2p_next: AtomicBool,
}

impl Lane {
    pub(super) fn new(comm: &str, engine: Box<Engine>) -> Arc<Lane> {
        Arc::new(Lane {
            state: Mutex::new(State {
                engine: Slot::Here(engine),
                jobs: VecDeque::new(),
                next: 0,
                started: false,
                closed: false,
                tell_peers: false,
                last_push: None,
                napping: false,
                awaits_engine: false,
            }),
            changed: Condvar::new(),
            progress: Mutex::new(None),
            comm: comm.to_owned(),
            p2p_next: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent before anything that could panic runs.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `job` and returns its id; the first job starts the progress thread.
    pub(super) fn push(self: &Arc<Self>, job: Job) -> Result<u64, CommError> {
        let mut state = self.lock();
        if state.closed {
            return Err(CommError::broken(
                &self.comm,
                "the communicator was aborted",
                None,
            ));
        }
        if !state.started {
            let lane = Arc::clone(self);
            let thread = std::thread::Builder::new()
                .name(format!("hypercomm-{}", self.comm))
                .spawn(move || lane.progress())
                .map_err(|source| CommError::Io {
                    comm: self.comm.clone(),
                    what: "starting the progress thread".into(),
                    source,
                })?;
            *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
            state.started = true;
        }
        let id = state.next;
        state.next += 1;
        match job {
            Job::Run(f) => state.jobs.push_back((id, Queued::Run(f))),
            Job::P2p(op) => {
                let exchange = Exchange::new(id, op);
                match state.jobs.back_mut() {
                    Some((_, Queued::P2p(last))) => last.absorb(exchange),
                    _ => state.jobs.push_back((id, Queued::P2p(exchange))),
                }
            }
        }
        self.p2p_next.store(state.p2p_next(), Ordering::SeqCst);
        state.last_push = Some(Instant::now());
        // A napping progress thread looks within a nap; one waiting for the engine looks when it comes back; one
        // asleep is woken (the first job after a quiet spell).
        if !state.napping && !state.awaits_engine {
            self.changed.notify_all();
        }
        Ok(id)
    }

    /// The progress thread: runs jobs as the engine is free, until the lane is closed and empty.
    fn progress(&self) {
        let mut state = self.lock();
        // Started by the first job's push, whose issuer usually waits on it next: one nap first lets that wait run
        // it inline, as every later job is while the lane is busy, instead of racing the new thread for it.
        state.napping = true;
        state = self
            .changed
            .wait_timeout(state, NAP)
            .map(|(s, _)| s)
            .unwrap_or_else(|p| p.into_inner().0);
        state.napping = false;
        loop {
            if let Some(last) = state.retire() {
                drop(state);
                retire(last);
                return;
            }
            if state.closed && state.jobs.is_empty() && matches!(state.engine, Slot::Gone) {
                return;
            }
            if let Some((job, mut engine)) = state.take_next(None) {
                self.p2p_next.store(state.p2p_next(), Ordering::SeqCst);
                drop(state);
                self.run(job, &mut engine, None);
                state = self.put_back(engine);
                continue;
            }
            // While a job runs inline on the thread that waits on it, napping would wake this thread every NAP on
            // that thread's core for nothing (a job queued meanwhile cannot start before the engine is back).
            state.awaits_engine = matches!(state.engine, Slot::Busy) && !state.closed;
            let busy = state.last_push.is_some_and(|at| at.elapsed() < BUSY_WINDOW);
            state.napping = busy && !state.closed && !state.awaits_engine;
            state = if state.napping {
                self.changed
                    .wait_timeout(state, NAP)
                    .map(|(s, _)| s)
                    .unwrap_or_else(|p| p.into_inner().0)
            } else {
                self.changed.wait(state).unwrap_or_else(|p| p.into_inner())
            };
            state.napping = false;
            state.awaits_engine = false;
        }
    }

    /// Runs `job` on `engine`; with `until`, a point-to-point exchange returns once job `until` has completed,
    /// and its rest goes back to the front of the queue for the progress thread.
    fn run(&self, job: Queued, engine: &mut Engine, until: Option<u64>) {
        match job {
            Queued::Run(f) => f(engine),
            Queued::P2p(exchange) => {
                let queued = || self.p2p_next.load(Ordering::SeqCst);
                let mut more = || self.take_p2p_next();
                if let Some(rest) = exchange.run(engine, until, &queued, &mut more) {
                    self.put_front(rest);
                }
            }
        }
    }

    /// The point-to-point operations queued next, taken out for a running exchange to take in.
    fn take_p2p_next(&self) -> Option<Exchange> {
        let mut state = self.lock();
        if !state.p2p_next() {
            return None;
        }
        let taken = match state.jobs.pop_front() {
            Some((_, Queued::P2p(exchange))) => Some(exchange),
            // `p2p_next` saw point-to-point operations first under the same lock: not reached.
            Some(other) => {
                state.jobs.push_front(other);
                None
            }
            None => None,
        };
        self.p2p_next.store(state.p2p_next(), Ordering::SeqCst);
        taken
    }

    /// Puts the rest of an exchange back at the front of the queue (joined with point-to-point operations queued
    /// next meanwhile), for the progress thread to go on with.
    fn put_front(&self, mut rest: Exchange) {
        let mut state = self.lock();
        if let Some((_, Queued::P2p(_))) = state.jobs.front()
            && let Some((_, Queued::P2p(next))) = state.jobs.pop_front()
        {
            rest.absorb(next);
        }
        let at = rest.first_id().unwrap_or(state.next);
        state.jobs.push_front((at, Queued::P2p(rest)));
        self.p2p_next.store(true, Ordering::SeqCst);
        self.changed.notify_all();
    }

    /// Wakes the progress thread to run whatever is queued as soon as the engine is free (for a waiter that
    /// cannot run its job, a poll, a dropped handle).
    pub(crate) fn nudge(&self) {
        let _state = self.lock();
        self.changed.notify_all();
    }

    /// Puts the engine back after a job or a borrow; returns the lock.
    fn put_back(&self, engine: Box<Engine>) -> MutexGuard<'_, State> {
        let mut state = self.lock();
        state.engine = Slot::Here(engine);
        // The progress thread waits for the engine when there is a job to run, when the lane closed, and when it
        // stopped napping because the engine was out.
        if !state.jobs.is_empty() || state.closed || state.awaits_engine {
            self.changed.notify_all();
        }
        state
    }

    /// Releases the lock, retiring the engine first (outside the lock) if the lane is closed, empty and the
    /// engine free.
    fn retire_if_due(mut state: MutexGuard<'_, State>) {
        let last = state.retire();
        drop(state);
        if let Some(last) = last {
            retire(last);
        }
    }

    /// Takes the engine for an operation on the calling thread when no job is queued or running; `None`
    /// otherwise (then the operation must be queued).
    pub(super) fn borrow_idle(&self) -> Option<Box<Engine>> {
        let mut state = self.lock();
        if state.closed || !state.jobs.is_empty() {
            return None;
        }
        match std::mem::replace(&mut state.engine, Slot::Busy) {
            Slot::Here(engine) => Some(engine),
            other => {
                state.engine = other;
                None
            }
        }
    }

    /// Gives back an engine from [`borrow_idle`](Self::borrow_idle); retires it if the lane closed meanwhile.
    pub(super) fn give_back(&self, engine: Box<Engine>) {
        Self::retire_if_due(self.put_back(engine));
    }

    /// Closes the lane: no new jobs; the queued ones still run. With `tell_peers`, the engine's last act is to
    /// tell the peers this rank gives up. Returns at once; the engine retires here when it is free and idle.
    pub(super) fn close(&self, tell_peers: bool) {
        let mut state = self.lock();
        state.closed = true;
        state.tell_peers |= tell_peers;
        self.changed.notify_all();
        Self::retire_if_due(state);
    }

    /// Closes the lane as [`close`](Self::close)`(true)` does, but hands the engine's last act (telling the peers,
    /// which may wait on a slow peer's socket) to the caller when it is due now, to run where it likes; `None` when
    /// the progress thread makes it later.
    pub(super) fn close_handing_back(&self) -> Option<impl FnOnce() + Send + 'static> {
        let mut state = self.lock();
        state.closed = true;
        state.tell_peers = true;
        self.changed.notify_all();
        let last = state.retire();
        drop(state);
        last.map(|last| move || retire(last))
    }

    /// Closes the lane and waits for the progress thread to finish the queued jobs and end.
    pub(super) fn shut(&self) {
        self.close(false);
        let thread = self
            .progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl RunInline for Lane {
    fn run_if_next(&self, id: u64) -> bool {
        let taken = {
            let mut state = self.lock();
            let taken = state.take_next(Some(id));
            self.p2p_next.store(state.p2p_next(), Ordering::SeqCst);
            taken
        };
        let Some((job, mut engine)) = taken else {
            self.nudge();
            return false;
        };
        self.run(job, &mut engine, Some(id));
        self.give_back(engine);
        true
    }

    fn nudge(&self) {
        Lane::nudge(self);
    }
}
