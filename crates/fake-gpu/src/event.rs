//! Events: recorded on a stream, complete when the stream reaches them, not when they are recorded.
//!
//! Each record bumps a generation; the stream's work marks the generation reached. A query or wait is about the
//! latest record at the time of the call, as in CUDA; an event never recorded counts as complete.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::stream::lock;

#[derive(Default)]
struct State {
    recorded: u64,
    reached: u64,
    /// When the latest reached record was reached.
    at: Option<Instant>,
}

/// One event.
#[derive(Default)]
pub(crate) struct Event {
    state: Mutex<State>,
    changed: Condvar,
}

impl Event {
    /// Starts a record; the returned closure, run when the stream reaches it, completes it.
    pub(crate) fn record(self: &Arc<Self>) -> impl FnOnce() -> Result<(), String> + Send + 'static {
        let generation = {
            let mut s = lock(&self.state);
            s.recorded += 1;
            s.recorded
        };
        let event = Arc::clone(self);
        move || {
            let mut s = lock(&event.state);
            if generation > s.reached {
                s.reached = generation;
                s.at = Some(Instant::now());
            }
            event.changed.notify_all();
            Ok(())
        }
    }

    /// Whether the latest record has been reached.
    pub(crate) fn complete(&self) -> bool {
        let s = lock(&self.state);
        s.reached >= s.recorded
    }

    /// The generation a wait issued now waits for.
    pub(crate) fn target(&self) -> u64 {
        lock(&self.state).recorded
    }

    /// Blocks until generation `target` is reached, up to `limit`; whether it was.
    pub(crate) fn wait_for(&self, target: u64, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut s = lock(&self.state);
        while s.reached < target {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// When the latest record was reached, if it was.
    pub(crate) fn reached_at(&self) -> Option<Instant> {
        let s = lock(&self.state);
        if s.reached >= s.recorded && s.recorded > 0 {
            s.at
        } else {
            None
        }
    }
}
