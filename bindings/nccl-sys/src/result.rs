//! NCCL return codes as Rust `Result`s, with NCCL's own text attached.
//!
//! Every NCCL call returns an `ncclResult_t`: [`ResultCode`] names it, and [`NcclError::Call`] carries it with the
//! function and NCCL's texts, which the loaded library supplies ([`Nccl::check`](crate::Nccl::check), in the
//! loader, since only a loaded library can describe its codes). [`NcclError::Unavailable`] and
//! [`NcclError::NotExported`] are the errors for calling what the loaded library does not have ([`availability`];
//! see [`Nccl::require`](crate::Nccl::require)). This module knows nothing of the loader.
//!
//! `ncclInProgress` is reported as an error with code [`ResultCode::InProgress`]: on a non-blocking communicator
//! it means "started, poll `ncclCommGetAsyncError`", which the caller must handle explicitly
//! ([`NcclError::is_in_progress`]).

use std::fmt;

use crate::function::Function;
use crate::sys;
use crate::version::Version;

/// A non-success `ncclResult_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResultCode {
    /// `ncclUnhandledCudaError` (1): a CUDA call failed.
    UnhandledCudaError,
    /// `ncclSystemError` (2): a system call failed.
    SystemError,
    /// `ncclInternalError` (3): an internal check failed (NCCL bug or memory corruption).
    InternalError,
    /// `ncclInvalidArgument` (4): an argument has an invalid value.
    InvalidArgument,
    /// `ncclInvalidUsage` (5): the call is incorrect, usually a programming error.
    InvalidUsage,
    /// `ncclRemoteError` (6): a peer failed or the network did.
    RemoteError,
    /// `ncclInProgress` (7): the operation continues in the background (non-blocking communicators).
    InProgress,
    /// A code this header does not name, from a newer library.
    Unknown(u32),
}

impl ResultCode {
    /// `Ok(())` for `ncclSuccess`, the code otherwise.
    pub fn from_raw(raw: sys::ncclResult_t) -> Result<(), ResultCode> {
        Err(match raw {
            sys::ncclSuccess => return Ok(()),
            sys::ncclUnhandledCudaError => ResultCode::UnhandledCudaError,
            sys::ncclSystemError => ResultCode::SystemError,
            sys::ncclInternalError => ResultCode::InternalError,
            sys::ncclInvalidArgument => ResultCode::InvalidArgument,
            sys::ncclInvalidUsage => ResultCode::InvalidUsage,
            sys::ncclRemoteError => ResultCode::RemoteError,
            sys::ncclInProgress => ResultCode::InProgress,
            other => ResultCode::Unknown(other),
        })
    }

    /// The raw `ncclResult_t` value.
    pub fn raw(self) -> sys::ncclResult_t {
        match self {
            ResultCode::UnhandledCudaError => sys::ncclUnhandledCudaError,
            ResultCode::SystemError => sys::ncclSystemError,
            ResultCode::InternalError => sys::ncclInternalError,
            ResultCode::InvalidArgument => sys::ncclInvalidArgument,
            ResultCode::InvalidUsage => sys::ncclInvalidUsage,
            ResultCode::RemoteError => sys::ncclRemoteError,
            ResultCode::InProgress => sys::ncclInProgress,
            ResultCode::Unknown(raw) => raw,
        }
    }

    /// The C enumerator name, e.g. `"ncclInvalidArgument"`; `"unknown"` for [`ResultCode::Unknown`].
    pub fn name(self) -> &'static str {
        match self {
            ResultCode::UnhandledCudaError => "ncclUnhandledCudaError",
            ResultCode::SystemError => "ncclSystemError",
            ResultCode::InternalError => "ncclInternalError",
            ResultCode::InvalidArgument => "ncclInvalidArgument",
            ResultCode::InvalidUsage => "ncclInvalidUsage",
            ResultCode::RemoteError => "ncclRemoteError",
            ResultCode::InProgress => "ncclInProgress",
            ResultCode::Unknown(_) => "unknown",
        }
    }
}

impl fmt::Display for ResultCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.raw())
    }
}

/// An NCCL call that failed, or one that the loaded library cannot make.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NcclError {
    /// The call returned a code other than `ncclSuccess`.
    #[error(
        "{function} returned {code}{}{}",
        text(": ", description),
        text("; last error: ", last_error)
    )]
    Call {
        /// The entry point called.
        function: Function,
        /// What it returned.
        code: ResultCode,
        /// `ncclGetErrorString(code)`, when the library has it.
        description: Option<String>,
        /// `ncclGetLastError`, when the library has it and it is not empty.
        last_error: Option<String>,
    },
    /// The entry point is newer than the loaded library.
    #[error("{function} needs nccl {needs} or newer, but the loaded library is {loaded}")]
    Unavailable {
        /// The entry point asked for.
        function: Function,
        /// The release that introduced it.
        needs: Version,
        /// The loaded release.
        loaded: Version,
    },
    /// The loaded library is new enough but does not export the symbol (a stripped or patched build).
    #[error("{function} is not exported by the loaded nccl {loaded} ({detail})")]
    NotExported {
        /// The entry point asked for.
        function: Function,
        /// The loaded release.
        loaded: Version,
        /// The dynamic loader's message.
        detail: String,
    },
}

fn text(prefix: &str, value: &Option<String>) -> String {
    value
        .as_ref()
        .map(|v| format!("{prefix}{v}"))
        .unwrap_or_default()
}

impl NcclError {
    /// Whether this is `ncclInProgress`, which on a non-blocking communicator means "poll again", not failure.
    pub fn is_in_progress(&self) -> bool {
        matches!(
            self,
            NcclError::Call {
                code: ResultCode::InProgress,
                ..
            }
        )
    }

    /// The return code, for [`NcclError::Call`].
    pub fn code(&self) -> Option<ResultCode> {
        match self {
            NcclError::Call { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Decides whether `function` may be called on a library of release `loaded` that does (`exported`) or does not
/// export its symbol: the release gate comes first, so a too-old library reports what release is needed.
///
/// [`Nccl::require`](crate::Nccl::require) calls this with the loaded library's facts; it is public so the rule can be checked against
/// any version, e.g. that `ncclCommShrink` on 2.26 is refused:
///
/// ```
/// use nccl_sys::{Function, NcclError, version::Version, result::availability};
///
/// let err = availability(Function::CommShrink, Version::new(2, 26, 3), Ok(())).unwrap_err();
/// assert!(matches!(err, NcclError::Unavailable { .. }));
/// assert_eq!(err.to_string(), "ncclCommShrink needs nccl 2.27.0 or newer, but the loaded library is 2.26.3");
/// assert!(availability(Function::CommShrink, Version::new(2, 27, 3), Ok(())).is_ok());
/// ```
pub fn availability(
    function: Function,
    loaded: Version,
    exported: Result<(), String>,
) -> Result<(), NcclError> {
    let needs = function.introduced();
    if loaded < needs {
        return Err(NcclError::Unavailable {
            function,
            needs,
            loaded,
        });
    }
    exported.map_err(|detail| NcclError::NotExported {
        function,
        loaded,
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_is_ok_and_every_named_code_round_trips() {
        assert_eq!(ResultCode::from_raw(sys::ncclSuccess), Ok(()));
        for raw in 1..sys::ncclNumResults {
            let code = ResultCode::from_raw(raw).unwrap_err();
            assert!(
                !matches!(code, ResultCode::Unknown(_)),
                "{raw} should be named"
            );
            assert_eq!(code.raw(), raw);
            assert!(code.name().starts_with("nccl"));
        }
        assert_eq!(ResultCode::from_raw(42), Err(ResultCode::Unknown(42)));
        assert_eq!(ResultCode::Unknown(42).raw(), 42);
    }

    #[test]
    fn names_match_header_values() {
        assert_eq!(ResultCode::from_raw(4), Err(ResultCode::InvalidArgument));
        assert_eq!(
            ResultCode::InvalidArgument.to_string(),
            "ncclInvalidArgument (4)"
        );
        assert_eq!(ResultCode::from_raw(7), Err(ResultCode::InProgress));
        assert_eq!(ResultCode::from_raw(6), Err(ResultCode::RemoteError));
    }

    #[test]
    fn call_error_message_names_function_code_and_texts() {
        let e = NcclError::Call {
            function: Function::CommInitRank,
            code: ResultCode::InvalidArgument,
            description: Some("invalid argument".into()),
            last_error: Some("rank 5 out of range".into()),
        };
        assert_eq!(
            e.to_string(),
            "ncclCommInitRank returned ncclInvalidArgument (4): invalid argument; last error: rank 5 out of range"
        );
        let bare = NcclError::Call {
            function: Function::AllReduce,
            code: ResultCode::InProgress,
            description: None,
            last_error: None,
        };
        assert_eq!(
            bare.to_string(),
            "ncclAllReduce returned ncclInProgress (7)"
        );
        assert!(bare.is_in_progress());
        assert!(!e.is_in_progress());
        assert_eq!(e.code(), Some(ResultCode::InvalidArgument));
    }

    #[test]
    fn gate_refuses_functions_newer_than_the_library() {
        let old = Version::new(2, 18, 3);
        let err = availability(Function::CommShrink, old, Ok(())).unwrap_err();
        assert_eq!(
            err,
            NcclError::Unavailable {
                function: Function::CommShrink,
                needs: Version::new(2, 27, 0),
                loaded: old
            }
        );
        // The version gate wins even when a symbol of that name happens to be exported.
        assert!(matches!(
            availability(
                Function::CommInitRankScalable,
                Version::new(2, 22, 3),
                Ok(())
            ),
            Err(NcclError::Unavailable { .. })
        ));
        // Boundary: the introducing release itself is enough.
        assert!(availability(Function::CommSplit, Version::new(2, 18, 0), Ok(())).is_ok());
        assert!(availability(Function::CommSplit, Version::new(2, 17, 9), Ok(())).is_err());
    }

    #[test]
    fn gate_reports_missing_symbols_on_new_enough_libraries() {
        let err = availability(
            Function::CommShrink,
            Version::new(2, 28, 9),
            Err("undefined symbol".into()),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "ncclCommShrink is not exported by the loaded nccl 2.28.9 (undefined symbol)"
        );
    }
}
