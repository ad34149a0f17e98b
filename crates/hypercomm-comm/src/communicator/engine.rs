//! The progress thread's side of a [`Communicator`](super::Communicator): the [`Engine`] that runs its jobs on
//! the backend, turning backend errors (ranks as positions) into member ids, and the first fatal one into a
//! broken communicator, its root cause settled through the failure domain.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::CommError;
use crate::backend::Backend;
use crate::failure::{Context, FailureDomain};
use crate::member_ids;

/// The progress thread's state: the backend, whether the communicator is broken, and where to report a failure.
pub(super) struct Engine {
    pub(super) backend: Box<dyn Backend>,
    pub(super) broken: Arc<Mutex<Option<String>>>,
    pub(super) comm: String,
    pub(super) domain: Arc<FailureDomain>,
    /// The member ids, by position.
    pub(super) members: Vec<usize>,
    pub(super) timeout: Duration,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a single assignment or read; a poisoned lock holds a consistent value.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Engine {
    pub(super) fn execute<R>(
        &mut self,
        f: impl FnOnce(&mut dyn Backend) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        if let Some(cause) = lock(&self.broken).clone() {
            return Err(CommError::broken(
                &self.comm,
                cause,
                self.domain.root_cause(),
            ));
        }
        f(self.backend.as_mut()).map_err(|e| {
            let e = member_ids::to_members(e, &self.members);
            let fatal = e.is_fatal();
            if fatal {
                // Broken first, so that the domain's abort of its other communicators passes this one by.
                *lock(&self.broken) = Some(e.to_string());
            }
            let cx = Context {
                comm: &self.comm,
                timeout: self.timeout,
            };
            let e = self.domain.settle(e, &cx);
            if fatal {
                *lock(&self.broken) = Some(e.to_string());
                self.backend.abort();
            }
            e
        })
    }
}
