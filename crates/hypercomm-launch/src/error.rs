//! [`LaunchError`]: why a job could not be started.

use std::io;

use hypercomm_store::{RelayError, SecretError, ServerError};

/// Why a job could not be launched (a job that ran and failed is a [`LaunchReport`], not an error).
///
/// [`LaunchReport`]: crate::LaunchReport
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// The launch options contradict each other.
    #[error("{0}")]
    Invalid(String),
    /// The store server could not start.
    #[error(transparent)]
    Store(#[from] ServerError),
    /// The node's store relay could not start.
    #[error(transparent)]
    Relay(#[from] RelayError),
    /// The shared secret could not be made.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// A rank's process could not be started.
    #[error("cannot start rank {rank} ({program}): {source}")]
    Spawn {
        /// The rank.
        rank: usize,
        /// The program, as given.
        program: String,
        /// The operating system's reason.
        #[source]
        source: io::Error,
    },
    /// SIGINT/SIGTERM handling could not be installed.
    #[error("cannot install signal forwarding: {0}")]
    Signals(#[source] io::Error),
    /// No free port could be found for torchrun's `MASTER_PORT`.
    #[error("cannot find a free port for torchrun's MASTER_PORT: {0}")]
    TorchPort(#[source] io::Error),
}
