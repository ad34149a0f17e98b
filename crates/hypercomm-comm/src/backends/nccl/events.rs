//! A [`Gpu`](super::gpu::Gpu)'s pool of CUDA events, and [`SharedEvent`]: one event of it that an operation's
//! handle and the GPU's watchdog hold together.
//!
//! Why a pool: creating an event costs several microseconds of driver time, reusing one costs nothing. Why shared:
//! the handle waits on its operation's event, and the watchdog (`watchdog`) queries the same event from its own
//! thread, so the operation costs one event record whoever looks at it. The event goes back to the pool when the
//! last holder lets go, whichever that is.

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::CudaEvent;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections push or pop one value; a poisoned lock still holds a consistent one.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Events waiting to be reused, shared by the `Gpu` and every event taken from it (which returns itself here when
/// dropped, even after the `Gpu` is gone).
#[derive(Default)]
pub(crate) struct EventPool {
    idle: Mutex<Vec<CudaEvent>>,
}

impl EventPool {
    /// An idle event, if there is one.
    pub(crate) fn pop(&self) -> Option<CudaEvent> {
        lock(&self.idle).pop()
    }

    /// Events waiting in the pool.
    pub(crate) fn len(&self) -> usize {
        lock(&self.idle).len()
    }

    /// Wraps `event` so that it comes back to this pool when its last holder drops it.
    pub(crate) fn share(self: &Arc<Self>, event: CudaEvent) -> SharedEvent {
        Arc::new(PooledEvent {
            event: Some(event),
            pool: Arc::clone(self),
        })
    }
}

/// One event of a pool; dereferences to the [`CudaEvent`].
pub(crate) struct PooledEvent {
    /// `Some` until dropped.
    event: Option<CudaEvent>,
    pool: Arc<EventPool>,
}

/// An event of a pool that several holders share (an operation's handle and the watchdog).
pub(crate) type SharedEvent = Arc<PooledEvent>;

impl std::ops::Deref for PooledEvent {
    type Target = CudaEvent;

    fn deref(&self) -> &CudaEvent {
        // `event` is `Some` from `share` until `drop`, which no `&self` outlives.
        self.event
            .as_ref()
            .unwrap_or_else(|| unreachable!("a pooled event is taken only when dropped"))
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            lock(&self.pool.idle).push(e);
        }
    }
}
