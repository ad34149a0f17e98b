//! [`HostWork`]: the handle of an operation queued on a communicator's host lane (run by its progress thread, or
//! by the thread that waits on it when it is next). The public [`Work`](crate::Work) wraps it.
//!
//! Why ownership: an asynchronous collective reads and writes its buffers after the call returns, so the caller
//! must not touch them until it completes. The simplest design that the compiler checks without `unsafe` is to
//! move the buffers into the operation and hand them back from [`HostWork::wait`]. There is no way to reach a buffer
//! that is still in use, and dropping a handle early is harmless (the operation finishes and frees its buffers).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::CommError;

struct Slot<R> {
    result: Mutex<Option<Result<R, CommError>>>,
    done: Condvar,
}

impl<R> Slot<R> {
    fn lock(&self) -> MutexGuard<'_, Option<Result<R, CommError>>> {
        // Critical sections only move an Option in or out; a poisoned lock still holds a consistent value.
        self.result.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The pending result of an operation: the buffers it borrowed, or the error that stopped it.
///
/// Operations on one communicator complete in the order they were issued, except sends and receives issued back to
/// back, which progress together and complete each on its own.
pub(crate) struct HostWork<R> {
    slot: Arc<Slot<R>>,
    /// Where the operation is queued, and its id there: [`HostWork::wait`] runs it on the waiting thread when it is
    /// next and nothing else runs.
    queued: Option<(Arc<dyn RunInline>, u64)>,
}

/// A queue that can run one of its jobs on the calling thread (a communicator's lane).
pub(crate) trait RunInline: Send + Sync {
    /// Runs job `id` here, to completion, if it is the next job and the queue's engine is free; says whether it
    /// ran. When it did not, the queue's own thread is woken to run it.
    fn run_if_next(&self, id: u64) -> bool;
    /// Wakes the queue's own thread to run what is queued (someone is polling or gave up a handle).
    fn nudge(&self);
}

/// The progress thread's side of a [`HostWork`]. Dropping it without completing reports a broken communicator, so a
/// waiter never hangs on an operation that will not run.
pub(crate) struct Completer<R> {
    slot: Option<Arc<Slot<R>>>,
    comm: String,
}

/// A new handle and the completer that fulfils it.
pub(crate) fn pair<R>(comm: &str) -> (HostWork<R>, Completer<R>) {
    let slot = Arc::new(Slot {
        result: Mutex::new(None),
        done: Condvar::new(),
    });
    (
        HostWork {
            slot: Arc::clone(&slot),
            queued: None,
        },
        Completer {
            slot: Some(slot),
            comm: comm.to_owned(),
        },
    )
}

impl<R> Completer<R> {
    pub(crate) fn complete(mut self, result: Result<R, CommError>) {
        if let Some(slot) = self.slot.take() {
            *slot.lock() = Some(result);
            slot.done.notify_all();
        }
    }
}

impl<R> Drop for Completer<R> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            *slot.lock() = Some(Err(CommError::broken(
                &self.comm,
                "the operation was dropped before it ran (progress thread stopped)",
                None,
            )));
            slot.done.notify_all();
        }
    }
}

impl<R> HostWork<R> {
    /// This handle's operation is job `id` of `queue`.
    pub(crate) fn runs_inline(mut self, queue: Arc<dyn RunInline>, id: u64) -> Self {
        self.queued = Some((queue, id));
        self
    }

    /// Blocks until the operation completes; returns its buffers or its error. The operation's own waits are
    /// bounded by the communicator's timeout, so this returns within about that long after the operations issued
    /// before it. When the operation has not started and is the communicator's next, it runs here, on the
    /// calling thread, instead of on the progress thread.
    pub(crate) fn wait(mut self) -> Result<R, CommError> {
        // Taken out, so that dropping the handle at the end does not wake the queue's thread.
        if let Some((queue, id)) = self.queued.take()
            && self.slot.lock().is_none()
        {
            queue.run_if_next(id);
        }
        let mut guard = self.slot.lock();
        loop {
            if let Some(result) = guard.take() {
                return result;
            }
            guard = self
                .slot
                .done
                .wait(guard)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits up to `timeout` for completion and says whether the operation has completed; the result stays in
    /// the handle for [`HostWork::wait`].
    pub(crate) fn wait_timeout(&self, timeout: Duration) -> bool {
        self.nudge();
        let deadline = Instant::now() + timeout;
        let mut guard = self.slot.lock();
        while guard.is_none() {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            guard = self
                .slot
                .done
                .wait_timeout(guard, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        true
    }

    /// Whether the operation has completed (successfully or not). Never blocks.
    pub(crate) fn is_completed(&self) -> bool {
        let done = self.slot.lock().is_some();
        if !done {
            self.nudge();
        }
        done
    }

    /// Has the queue's thread run this operation as soon as it can, where nobody will run it inline.
    fn nudge(&self) {
        if let Some((queue, _)) = &self.queued {
            queue.nudge();
        }
    }
}

impl<R> Drop for HostWork<R> {
    fn drop(&mut self) {
        // Dropped unwaited: nobody will run it inline.
        if self.queued.is_some() && self.slot.lock().is_none() {
            self.nudge();
        }
    }
}

impl<R> std::fmt::Debug for HostWork<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostWork")
            .field("completed", &self.is_completed())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completes_once_and_reports_drops() {
        let (work, done) = pair::<u32>("c");
        assert!(!work.is_completed());
        assert!(!work.wait_timeout(Duration::from_millis(1)));
        done.complete(Ok(7));
        assert!(work.is_completed());
        assert_eq!(work.wait().unwrap(), 7);

        let (work, done) = pair::<u32>("c");
        drop(done);
        assert!(matches!(work.wait(), Err(CommError::Broken { .. })));
    }
}
