//! The progress thread's side of a [`Communicator`](super::Communicator): the jobs it runs in issue order, and
//! the [`Engine`] that runs them on the backend, turning the first fatal error into a broken communicator (with
//! its cause published for the peers) and naming the rank really lost when a messenger vanished.

use std::sync::{Arc, Mutex, MutexGuard};

use hypercomm_store::Store;

use crate::CommError;
use crate::backend::Backend;
use crate::failure;

/// One operation for the progress thread.
pub(super) type Job = Box<dyn FnOnce(&mut Engine) + Send>;

/// The progress thread's state: the backend, whether the communicator is broken, and where to report a failure.
pub(super) struct Engine {
    pub(super) backend: Box<dyn Backend>,
    pub(super) broken: Arc<Mutex<Option<String>>>,
    pub(super) comm: String,
    pub(super) store: Arc<dyn Store>,
    pub(super) rank: usize,
    pub(super) size: usize,
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
            return Err(CommError::Broken {
                comm: self.comm.clone(),
                cause,
            });
        }
        let mut result = f(self.backend.as_mut());
        if let Err(CommError::AbortedByPeer { by, lost, .. }) = &mut result
            && lost.is_empty()
        {
            *lost = failure::fetch(self.store.as_ref(), &self.comm, *by, self.size);
        }
        // A peer that vanished may have been the messenger: it lost another rank, published that, aborted and
        // exited before its abort reached us. Name the rank it lost, not the messenger.
        if let Err(CommError::PeerDied {
            comm,
            ranks,
            during,
        }) = &result
            && let Some((by, lost)) =
                failure::messenger(self.store.as_ref(), &self.comm, ranks, self.size)
        {
            result = Err(CommError::AbortedByPeer {
                comm: comm.clone(),
                by,
                during: during.clone(),
                lost,
            });
        }
        if let Err(e) = &result
            && e.is_fatal()
        {
            *lock(&self.broken) = Some(e.to_string());
            let lost = failure::lost_ranks(e).unwrap_or(&[]);
            failure::publish(&self.store, &self.comm, self.rank, lost);
            self.backend.abort();
        }
        result
    }
}
