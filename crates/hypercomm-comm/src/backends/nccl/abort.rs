//! Freeing an NCCL communicator that its owner has let go of ([`Detached`]): alone, or together with the others of
//! a failure domain in one NCCL group.
//!
//! NCCL's rule for aborting several communicators, as its source and release notes have it:
//! - **NCCL 2.22 and later**: `ncclCommAbort` may be called between `ncclGroupStart` and `ncclGroupEnd` (2.22.3
//!   release notes, "Support ncclGroupStart/End for ncclCommAbort/Destroy"). The call raises the communicator's
//!   abort flag at once, so its kernels and proxy give up, and queues the freeing (`commReclaim`, through
//!   `ncclAsyncLaunch` in `src/init.cc`); the outermost `ncclGroupEnd` frees every queued communicator, each on a
//!   thread of its own, before any other work of the group, and returns once all are freed. A group holding an
//!   abort is a blocking group, whatever the communicators' `blocking` setting (`src/group.cc`, `ncclAsyncLaunch`),
//!   so `ncclGroupEnd` never answers `ncclInProgress` here. A group that fails drops its queued freeings (the
//!   communicators stay allocated, their flags raised).
//! - **Before 2.22** `ncclCommAbort` frees the communicator in the call, group or not: the aborts go one at a
//!   time.
//!
//! Why a group: freeing a communicator frees device memory, and freeing device memory waits for the kernels
//! running on the device. A kernel of another communicator, waiting for a peer that will never come, holds that
//! abort until its own communicator is aborted, which a one-at-a-time abort in the wrong order never reaches
//! (NVIDIA/nccl issue 1013; pytorch/pytorch issue 119797, and PR 150690, where a receive on one communicator and a
//! send on another, on one stream, hung their aborts one at a time in one order). In one group every flag is
//! raised before anything is freed. A split child that shares its parent's resources (`splitShare`) shares its
//! abort flag too, so aborting either stops the other's work; their shared resources go with the last of them
//! (`src/init.cc`, `ncclCommInitChildComm`, `commFree`).

use std::sync::Arc;

use nccl_sys::Version;

use super::DeviceRuntime;
use super::raw::{self, CommHandle};
use crate::failure::JointStop;

/// The first NCCL release whose `ncclCommAbort` waits for the group's end inside `ncclGroupStart`/`ncclGroupEnd`.
pub(crate) const GROUPED_ABORT_VERSION: Version = Version::new(2, 22, 0);

/// A live NCCL communicator taken from its owner (`NcclComm`), which never uses the handle again: only
/// [`abort`](Detached::abort) or a domain's joint stop ([`JointStop`]) frees it.
pub(crate) struct Detached {
    runtime: Arc<DeviceRuntime>,
    handle: CommHandle,
    name: String,
}

impl Detached {
    /// `handle`, of the NCCL that `runtime` loaded, named `name` in messages; its owner has let go of it.
    pub(crate) fn new(runtime: Arc<DeviceRuntime>, handle: CommHandle, name: String) -> Detached {
        Detached {
            runtime,
            handle,
            name,
        }
    }

    /// `ncclCommAbort`: stops the communicator's work and frees it.
    pub(crate) fn abort(self) {
        if let Err(e) = raw::abort(self.runtime.nccl(), self.handle) {
            tracing::warn!(comm = %self.name, error = %e, "ncclCommAbort failed");
        }
    }
}

/// In a failure domain's abort, the NCCL communicators of one loaded library are freed together: in one NCCL group
/// from NCCL 2.22, one after another before.
impl JointStop for Detached {
    fn kind(&self) -> usize {
        Arc::as_ptr(&self.runtime).addr()
    }

    fn open(&self) -> Option<Box<dyn FnOnce() + Send>> {
        let nccl = self.runtime.nccl();
        if nccl.version() < GROUPED_ABORT_VERSION {
            return None;
        }
        if let Err(e) = raw::group_start(nccl) {
            tracing::warn!(error = %e, "ncclGroupStart for grouped aborts failed: aborting one at a time");
            return None;
        }
        let runtime = Arc::clone(&self.runtime);
        Some(Box::new(move || {
            if let Err(e) = raw::group_end(runtime.nccl()) {
                tracing::warn!(
                    error = %e,
                    "ncclGroupEnd of grouped aborts failed: its communicators may stay allocated"
                );
            }
        }))
    }

    fn finish(self: Box<Self>) {
        self.abort();
    }
}
