//! [`CommError`]: everything a communicator can report, each variant naming the communicator and the culprit.

use std::time::Duration;

use hypercomm_store::StoreError;

/// What went wrong in a communicator. Every variant names the communicator; failures caused by other ranks name
/// those ranks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// An option was set that the chosen backend does not implement. Options are never dropped silently.
    #[error("backend {backend} does not support option {option}; leave it unset")]
    UnsupportedOption {
        /// The backend that rejected it.
        backend: &'static str,
        /// The option's field name in `CommOptions`.
        option: &'static str,
    },
    /// A set option needs a newer release of the backend's library than the one loaded; it is refused rather
    /// than dropped (NCCL silently ignores config fields newer than itself).
    #[error(
        "option {option} needs {library} {needs} or newer, but {library} {loaded} is loaded; leave it unset or upgrade"
    )]
    OptionNeedsNewerLibrary {
        /// The option's field name in `CommOptions`.
        option: &'static str,
        /// The library (`"nccl"`).
        library: &'static str,
        /// The first release that honours the option.
        needs: String,
        /// The loaded release.
        loaded: String,
    },
    /// Something this operation needs is not on this machine (no GPU, no CUDA driver, no NCCL, no NVRTC). Nothing
    /// was started; the error says what is missing and why, and nothing panics on the way.
    #[error("{what} is unavailable: {why}")]
    Unavailable {
        /// What was asked for (`"cuda driver"`, `"nccl"`, `"device communicator"`).
        what: String,
        /// Why it cannot be had, with what was tried.
        why: String,
    },
    /// A caller-side argument is wrong (buffer length, root, peer, rank list). Nothing was sent.
    #[error("communicator {comm}: {what}")]
    InvalidArgument {
        /// The communicator's name.
        comm: String,
        /// What is wrong, with the offending value.
        what: String,
    },
    /// The ranks called the same collective with different arguments, or different collectives. Every rank gets
    /// this error for the same operation; no data moved and the communicator stays usable.
    #[error("communicator {comm}: ranks disagree: {detail}")]
    Mismatch {
        /// The communicator's name.
        comm: String,
        /// Which ranks passed what.
        detail: String,
    },
    /// Some ranks did not reach an operation within the timeout. The communicator is now broken.
    #[error(
        "communicator {comm}: rank(s) {missing:?} did not respond within {after:?} (in {during})"
    )]
    Timeout {
        /// The communicator's name.
        comm: String,
        /// Ranks (within the communicator) that were waited for.
        missing: Vec<usize>,
        /// The timeout.
        after: Duration,
        /// The operation that was waiting.
        during: String,
    },
    /// Some ranks' processes exited or closed their connections. The communicator is now broken.
    #[error("communicator {comm}: rank(s) {ranks:?} died (in {during})")]
    PeerDied {
        /// The communicator's name.
        comm: String,
        /// Ranks (within the communicator) that are gone.
        ranks: Vec<usize>,
        /// The operation that noticed.
        during: String,
    },
    /// Another rank aborted the communicator or hit a fatal error; this rank stops too.
    #[error(
        "communicator {comm}: aborted by rank {by}{} (in {during})",
        lost_suffix(lost)
    )]
    AbortedByPeer {
        /// The communicator's name.
        comm: String,
        /// The rank that aborted.
        by: usize,
        /// The operation that noticed.
        during: String,
        /// The ranks the aborting rank had lost (dead or missing), as it reported them; empty for a deliberate
        /// abort or when its report did not arrive in time.
        lost: Vec<usize>,
    },
    /// The communicator failed earlier or was aborted; no operation runs on it any more.
    #[error("communicator {comm} is broken: {cause}")]
    Broken {
        /// The communicator's name.
        comm: String,
        /// The first failure, as text.
        cause: String,
    },
    /// Rendezvous through the store failed.
    #[error("communicator {comm}: store: {source}")]
    Store {
        /// The communicator's name.
        comm: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// An operating-system call failed (shared memory, sockets).
    #[error("communicator {comm}: {what}: {source}")]
    Io {
        /// The communicator's name.
        comm: String,
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A CUDA or NCCL call failed on the device backend. The communicator is now broken.
    #[error("communicator {comm}: {what}")]
    Device {
        /// The communicator's name (or the device, before a communicator exists).
        comm: String,
        /// The call that failed and the library's own error text.
        what: String,
    },
    /// A peer sent something that is not part of the protocol (a bug or a foreign process).
    #[error("communicator {comm}: protocol violation: {what}")]
    Protocol {
        /// The communicator's name.
        comm: String,
        /// What was wrong.
        what: String,
    },
}

fn lost_suffix(lost: &[usize]) -> String {
    if lost.is_empty() {
        String::new()
    } else {
        format!(" after losing rank(s) {lost:?}")
    }
}

impl CommError {
    /// Whether this error leaves the communicator unusable (timeouts, dead peers, I/O and protocol failures).
    /// Argument errors and rank disagreements do not: every rank skipped the same operation.
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            CommError::UnsupportedOption { .. }
                | CommError::OptionNeedsNewerLibrary { .. }
                | CommError::Unavailable { .. }
                | CommError::InvalidArgument { .. }
                | CommError::Mismatch { .. }
        )
    }
}
