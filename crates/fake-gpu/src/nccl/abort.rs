//! `ncclCommAbort`, as NCCL's: the communicator's abort flag is raised in the call, and the communicator is freed
//! at once, or, inside a group (NCCL 2.22 and later), at the outermost `ncclGroupEnd` with the group's other
//! aborted communicators ([`hold_abort`]).
//!
//! Freeing a communicator frees its device memory, and on a GPU that waits for every kernel running on the device
//! (NVIDIA/nccl issue 1013, pytorch/pytorch issue 119797). A kernel of another communicator waiting for a peer
//! that never comes holds such an abort until that communicator is aborted too: aborted one at a time, the first
//! abort hangs. NCCL's way out is to abort them in one group, where every abort flag is raised in the
//! `ncclCommAbort` calls, before the group's end frees anything. The fake does the same: freeing
//! ([`free_aborted`]) waits for the streams of the communicators' devices to run what
//! they hold (up to `FAKE_GPU_HANG_SECS`; then it says on stderr that NCCL would hang there, and goes on).

use std::sync::atomic::Ordering;

use nccl_sys::sys::{ncclComm_t, ncclResult_t};

use super::comm::{free_aborted, from_handle};
use super::enqueue::hold_abort;
use super::result_codes::{INVALID_ARGUMENT, SUCCESS};
use crate::knobs;

/// `ncclCommAbort`: waiting operations of this rank give up at once (NCCL's abort flag, raised in the call, in a
/// group too); the communicator is freed now, or at the outermost `ncclGroupEnd` of an open group (NCCL 2.22 and
/// later), once the work on its device has ended. Created reductions go with the communicator.
///
/// # Safety
///
/// `c` came from this library and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommAbort(c: ncclComm_t) -> ncclResult_t {
    // SAFETY: the caller's contract.
    let Some(comm) = (unsafe { from_handle(c) }) else {
        return INVALID_ARGUMENT;
    };
    knobs::trace_nccl_call("ncclCommAbort", Some(&comm.label()));
    comm.stop.store(true, Ordering::Release);
    if !hold_abort(c) {
        // SAFETY: the caller's contract; not held by a group, so freed only here.
        unsafe { free_aborted(vec![c], false) };
    }
    SUCCESS
}
