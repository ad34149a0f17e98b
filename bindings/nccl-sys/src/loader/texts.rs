//! What a loaded library says about its own result codes: [`Nccl::check`] turns a call's `ncclResult_t` into a
//! `Result`, with `ncclGetErrorString`'s text and, where the library has it, `ncclGetLastError`'s message.

use std::ffi::CStr;

use super::Nccl;
use crate::function::Function;
use crate::result::{NcclError, ResultCode};
use crate::sys;

impl Nccl {
    /// Turns the return code of a call to `function` into a `Result`, attaching `ncclGetErrorString`'s text and,
    /// when non-empty, `ncclGetLastError(comm)`'s (pass a null `comm` for calls that have none).
    ///
    /// # Safety
    ///
    /// `comm` must be null or a communicator created by this library and not yet destroyed.
    pub unsafe fn check(
        &self,
        function: Function,
        raw: sys::ncclResult_t,
        comm: sys::ncclComm_t,
    ) -> Result<(), NcclError> {
        let code = match ResultCode::from_raw(raw) {
            Ok(()) => return Ok(()),
            Err(code) => code,
        };
        let description = self.error_string(code);
        // SAFETY: the caller guarantees `comm` is null or a live communicator of this library.
        let last_error = unsafe { self.last_error(comm) };
        Err(NcclError::Call {
            function,
            code,
            description,
            last_error,
        })
    }

    /// `ncclGetErrorString(code)`, or `None` when the library lacks it or returns null.
    pub fn error_string(&self, code: ResultCode) -> Option<String> {
        let f = *self
            .api(Function::GetErrorString)
            .ok()?
            .ncclGetErrorString
            .as_ref()
            .ok()?;
        // SAFETY: ncclGetErrorString takes any result value and returns null or a pointer to a static,
        // NUL-terminated string; it touches no other state.
        let ptr = unsafe { f(code.raw()) };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: checked non-null; NCCL's strings are static and NUL-terminated.
        let text = unsafe { CStr::from_ptr(ptr) };
        Some(text.to_string_lossy().into_owned())
    }

    /// `ncclGetLastError(comm)`, or `None` when the library lacks it (before 2.13) or the message is empty.
    ///
    /// # Safety
    ///
    /// `comm` must be null or a communicator created by this library and not yet destroyed.
    pub unsafe fn last_error(&self, comm: sys::ncclComm_t) -> Option<String> {
        let f = *self
            .api(Function::GetLastError)
            .ok()?
            .ncclGetLastError
            .as_ref()
            .ok()?;
        // SAFETY: the caller guarantees `comm` is null (accepted by NCCL: the message is per thread) or live.
        let ptr = unsafe { f(comm) };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: non-null pointer to NCCL's NUL-terminated message buffer, copied out at once.
        let message = unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned();
        (!message.is_empty()).then_some(message)
    }
}
