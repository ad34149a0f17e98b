//! Stopping every member of a failure domain at once, within one bound: [`stop_all`].
//!
//! A domain's members are host communicators and NCCL communicators, a collection's groups and their split and
//! shrink children. Stopped one after another, each waits for the last: a host communicator that tells its TCP
//! peers it gives up may wait on a slow peer's socket, and an NCCL communicator freed alone may wait for the
//! others. `ncclCommAbort` frees the communicator's device memory, and freeing device memory waits for every
//! kernel on the device: a kernel of another communicator of the domain, still waiting for a peer that will
//! never come, holds that abort until it ends, which it does only once that other communicator is aborted too.
//! NCCL's rule is to abort such communicators together, in one group (`ncclGroupStart`, `ncclCommAbort` of each,
//! `ncclGroupEnd`: NCCL 2.22 and later): every abort flag is raised in the calls, before `ncclGroupEnd` frees
//! anything, so every kernel ends before any memory is freed. So [`stop_all`] goes in two steps:
//!
//! 1. **Break every member**, on the calling thread, without waiting for anything ([`Member::try_stop`]): each
//!    is marked broken (its later operations fail at once) and says what is left. A host communicator leaves its
//!    peers' notice ([`Step::Blocking`]); an NCCL communicator with no call inside NCCL gives up its handle
//!    ([`Step::Joint`]). One with a call of another thread inside NCCL may not be freed under that call
//!    (`ncclCommAbort` frees in the call), so it answers [`Step::Busy`] and is asked again, all of them in one
//!    loop, for at most [`STOP_TRY`]; past that the stop is left to the call ([`Member::leave_to_call`]: NCCL
//!    2.28's `ncclCommRevoke` stops its work beside the call, and the call aborts the communicator on its way
//!    out).
//! 2. **Finish all of them concurrently**, each blocking step on a thread of its own and the joint steps of one
//!    kind (the NCCL communicators of one loaded library) together on one thread, which frees them in one NCCL
//!    group where the library allows, one at a time where it does not ([`JointStop`]). The caller waits for all
//!    of it at most [`STOP_WAIT`]; what is not done by then finishes in the background (the handles were taken
//!    from their owners, so nothing uses them meanwhile).
//!
//! So [`stop_all`] returns within `STOP_TRY + STOP_WAIT` (50 ms + 1 s), whatever the members and NCCL do.

use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

/// How long a stop tries for a member that is busy (an NCCL communicator with a call inside NCCL on another
/// thread) before it leaves the stop to that call: longer than a non-blocking NCCL call takes, short enough not to
/// hold up the watchdog.
pub(crate) const STOP_TRY: Duration = Duration::from_millis(50);

/// How long [`stop_all`] waits for the members' remaining steps (peers told, NCCL communicators freed) after the
/// first step; what is not done by then finishes in the background.
pub(crate) const STOP_WAIT: Duration = Duration::from_secs(1);

/// Something a domain aborts when another member fails: a host communicator's shared state, an NCCL
/// communicator. Held weakly by the domain: a dropped member leaves it.
pub(crate) trait Member: Send + Sync {
    /// Breaks the member with `cause` and stops its work, unless it is broken already. Never reports back to the
    /// domain (the domain calls this while settling another member's failure).
    fn abort_with(&self, cause: &str);

    /// The first step of stopping the member as part of its whole domain (see the module doc): breaks it with
    /// `cause`, without waiting for anything, and says what is left. Called again while it answers
    /// [`Step::Busy`]. By default, [`abort_with`](Self::abort_with) and nothing left.
    fn try_stop(&self, cause: &str) -> Step {
        self.abort_with(cause);
        Step::Stopped
    }

    /// The domain stopped asking a member that stayed [`Step::Busy`]: its stop is left to the call that keeps it
    /// busy. May block (it runs on a thread of its own).
    fn leave_to_call(&self) {}
}

/// What is left of stopping a member after [`Member::try_stop`].
pub(crate) enum Step {
    /// Nothing: the member is stopped (or was already).
    Stopped,
    /// A call of another thread keeps the member from being stopped now: ask again.
    Busy,
    /// A step that may block (telling the peers over a socket), run beside the others.
    Blocking(Box<dyn FnOnce() + Send>),
    /// A step best made together with the other members' of its kind (see [`JointStop`]).
    Joint(Box<dyn JointStop>),
}

/// A member's last step that is made together with the same step of the other members of its kind, on one thread:
/// the NCCL communicators of one loaded library, freed in one NCCL group.
pub(crate) trait JointStop: Send {
    /// Which steps go together: those with equal keys (the address of the library they belong to).
    fn kind(&self) -> usize;
    /// Opens the joint stop on this thread, for this step and the others of its kind (`ncclGroupStart`); returns
    /// what closes it (`ncclGroupEnd`), or `None` when the steps are made one at a time.
    fn open(&self) -> Option<Box<dyn FnOnce() + Send>>;
    /// Makes this member's step (`ncclCommAbort`), inside the joint stop if one is open.
    fn finish(self: Box<Self>);
}

/// Stops every one of `members` with `cause`, all at once (see the module doc): returns within
/// `STOP_TRY + STOP_WAIT`.
pub(crate) fn stop_all(members: Vec<Arc<dyn Member>>, cause: &str) {
    let mut blocking: Vec<Box<dyn FnOnce() + Send>> = Vec::new();
    let mut joint: Vec<(usize, Vec<Box<dyn JointStop>>)> = Vec::new();
    let mut busy = members;
    let deadline = Instant::now() + STOP_TRY;
    let mut pause = Duration::from_micros(50);
    // Bounded by the deadline.
    loop {
        busy.retain(|m| match m.try_stop(cause) {
            Step::Stopped => false,
            Step::Busy => true,
            Step::Blocking(step) => {
                blocking.push(step);
                false
            }
            Step::Joint(step) => {
                let kind = step.kind();
                match joint.iter_mut().find(|(k, _)| *k == kind) {
                    Some((_, steps)) => steps.push(step),
                    None => joint.push((kind, vec![step])),
                }
                false
            }
        });
        if busy.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
    for member in busy {
        blocking.push(Box::new(move || member.leave_to_call()));
    }
    let (done, finished) = mpsc::channel::<()>();
    let mut started = 0;
    for step in blocking {
        started += usize::from(run_beside(step, &done));
    }
    for (_, steps) in joint {
        started += usize::from(run_beside(Box::new(move || finish_together(steps)), &done));
    }
    drop(done);
    let deadline = Instant::now() + STOP_WAIT;
    let mut left = started;
    while left > 0 {
        let wait = deadline.saturating_duration_since(Instant::now());
        match finished.recv_timeout(wait) {
            Ok(()) => left -= 1,
            // Every thread is over (one that panicked sends nothing).
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => break,
        }
    }
    if left > 0 {
        tracing::warn!(
            left,
            of = started,
            wait = ?STOP_WAIT,
            "stopping the failure domain: steps still running; they finish in the background"
        );
    }
}

/// Runs `step` on a thread of its own, which says on `done` when it is over, and returns true; when no thread can
/// be started, runs it here (then nothing bounds it) and returns false.
fn run_beside(step: Box<dyn FnOnce() + Send>, done: &mpsc::Sender<()>) -> bool {
    let slot = Arc::new(Mutex::new(Some(step)));
    let (theirs, done) = (Arc::clone(&slot), done.clone());
    let spawned = std::thread::Builder::new()
        .name("hypercomm-stop".into())
        .spawn(move || {
            let step = lock(&theirs).take();
            if let Some(step) = step {
                step();
            }
            let _ = done.send(());
        });
    match spawned {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "no thread to stop a member beside the others: stopping it here");
            let step = lock(&slot).take();
            if let Some(step) = step {
                step();
            }
            false
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The one critical section takes a value out; a poisoned lock still holds a consistent one.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes `steps` (one kind) together on this thread: opened by the first, each finished, closed.
fn finish_together(steps: Vec<Box<dyn JointStop>>) {
    let close = steps.first().and_then(|s| s.open());
    for step in steps {
        step.finish();
    }
    if let Some(close) = close {
        close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// What the test members did, in order.
    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl Log {
        fn push(&self, what: impl Into<String>) {
            lock(&self.0).push(what.into());
        }
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *lock(&self.0))
        }
    }

    /// A member whose last step sleeps `hold` (a peer's full socket), or that stays busy for `busy` tries.
    struct Slow {
        name: &'static str,
        hold: Duration,
        busy: AtomicUsize,
        log: Arc<Log>,
    }

    impl Member for Slow {
        fn abort_with(&self, _cause: &str) {
            unreachable!("a domain's abort takes the steps");
        }
        fn try_stop(&self, cause: &str) -> Step {
            if self.busy.load(Ordering::Acquire) > 0 {
                self.busy.fetch_sub(1, Ordering::AcqRel);
                return Step::Busy;
            }
            self.log.push(format!("{} broken: {cause}", self.name));
            let (hold, log, name) = (self.hold, Arc::clone(&self.log), self.name);
            Step::Blocking(Box::new(move || {
                std::thread::sleep(hold);
                log.push(format!("{name} told"));
            }))
        }
        fn leave_to_call(&self) {
            self.log.push(format!("{} left to its call", self.name));
        }
    }

    fn slow(name: &'static str, hold: Duration, busy: usize, log: &Arc<Log>) -> Arc<dyn Member> {
        Arc::new(Slow {
            name,
            hold,
            busy: AtomicUsize::new(busy),
            log: Arc::clone(log),
        })
    }

    /// A member whose last step joins the others of its `kind`.
    struct Freed {
        name: &'static str,
        kind: usize,
        log: Arc<Log>,
    }

    impl Member for Freed {
        fn abort_with(&self, _cause: &str) {
            unreachable!("a domain's abort takes the steps");
        }
        fn try_stop(&self, _cause: &str) -> Step {
            Step::Joint(Box::new(FreeStep {
                name: self.name,
                kind: self.kind,
                log: Arc::clone(&self.log),
            }))
        }
    }

    struct FreeStep {
        name: &'static str,
        kind: usize,
        log: Arc<Log>,
    }

    impl JointStop for FreeStep {
        fn kind(&self) -> usize {
            self.kind
        }
        fn open(&self) -> Option<Box<dyn FnOnce() + Send>> {
            self.log.push(format!("open {}", self.kind));
            let (log, kind) = (Arc::clone(&self.log), self.kind);
            Some(Box::new(move || log.push(format!("close {kind}"))))
        }
        fn finish(self: Box<Self>) {
            self.log.push(format!("free {}", self.name));
        }
    }

    fn freed(name: &'static str, kind: usize, log: &Arc<Log>) -> Arc<dyn Member> {
        Arc::new(Freed {
            name,
            kind,
            log: Arc::clone(log),
        })
    }

    #[test]
    fn members_that_block_are_stopped_beside_each_other() {
        let log = Arc::new(Log::default());
        let members: Vec<_> = ["a", "b", "c", "d"]
            .into_iter()
            .map(|n| slow(n, Duration::from_millis(300), 0, &log))
            .collect();
        let started = Instant::now();
        stop_all(members, "why");
        let took = started.elapsed();
        // One after another: 1.2 s.
        assert!(took < Duration::from_millis(900), "{took:?}");
        let lines = log.take();
        // Every member is broken before any is told.
        assert!(
            lines[..4].iter().all(|l| l.ends_with("broken: why")),
            "{lines:?}"
        );
        assert_eq!(lines.iter().filter(|l| l.ends_with(" told")).count(), 4);
    }

    #[test]
    fn joint_steps_of_one_kind_go_together_in_one_opening() {
        let log = Arc::new(Log::default());
        stop_all(
            vec![
                freed("x", 1, &log),
                freed("y", 2, &log),
                freed("z", 1, &log),
            ],
            "why",
        );
        let lines = log.take();
        // The two kinds run on two threads: look at each alone.
        let of = |kind: &str, names: &[&str]| {
            lines
                .iter()
                .filter(|l| {
                    l.ends_with(kind) || names.iter().any(|n| l.ends_with(&format!("free {n}")))
                })
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            of(" 1", &["x", "z"]),
            ["open 1", "free x", "free z", "close 1"]
        );
        assert_eq!(of(" 2", &["y"]), ["open 2", "free y", "close 2"]);
    }

    #[test]
    fn a_busy_member_is_asked_again_then_left_to_its_call() {
        let log = Arc::new(Log::default());
        // Busy for two tries, then free: stopped by the loop.
        stop_all(vec![slow("brief", Duration::ZERO, 2, &log)], "why");
        assert_eq!(log.take(), ["brief broken: why", "brief told"]);
        // Busy for ever: left to its call once STOP_TRY is over.
        let started = Instant::now();
        stop_all(vec![slow("stuck", Duration::ZERO, usize::MAX, &log)], "why");
        let took = started.elapsed();
        assert!(took >= STOP_TRY && took < STOP_TRY + STOP_WAIT, "{took:?}");
        assert_eq!(log.take(), ["stuck left to its call"]);
    }

    #[test]
    fn a_step_that_never_ends_does_not_hold_the_stop_past_its_bound() {
        let log = Arc::new(Log::default());
        let started = Instant::now();
        stop_all(
            vec![
                slow("stuck", Duration::from_secs(5), 0, &log),
                slow("quick", Duration::ZERO, 0, &log),
            ],
            "why",
        );
        let took = started.elapsed();
        assert!(
            took >= STOP_WAIT && took < STOP_TRY + STOP_WAIT + Duration::from_millis(300),
            "{took:?}"
        );
        assert!(log.take().contains(&"quick told".to_owned()));
    }
}
