//! The `ncclResult_t` codes the fake answers with, in one place that every file of the NCCL half imports and that
//! imports nothing of it back.

use nccl_sys::sys::ncclResult_t;

/// `ncclSuccess`.
pub(crate) const SUCCESS: ncclResult_t = 0;
/// `ncclUnhandledCudaError`: what NCCL reports when its kernel faults (here: touched memory not allocated).
pub(crate) const UNHANDLED_CUDA_ERROR: ncclResult_t = 1;
/// `ncclSystemError`.
pub(crate) const SYSTEM_ERROR: ncclResult_t = 2;
/// `ncclInvalidArgument`.
pub(crate) const INVALID_ARGUMENT: ncclResult_t = 4;
/// `ncclInvalidUsage`.
pub(crate) const INVALID_USAGE: ncclResult_t = 5;
/// `ncclRemoteError`.
pub(crate) const REMOTE_ERROR: ncclResult_t = 6;
/// `ncclInProgress`.
pub(crate) const IN_PROGRESS: ncclResult_t = 7;
