//! [`Launcher`]'s data: what to run and how. Its own room, below both the builder (`launcher`: the setters and
//! `run`) and the job (`job`) that reads it while it starts and supervises the ranks.

use std::ffi::OsString;
use std::time::Duration;

use hypercomm_store::Secret;

/// The communicator timeout a launcher assumes unless told otherwise: the default of hypercomm's communicators
/// (`CommOptions::named`, `CollectionBuilder`), 300 s.
pub const DEFAULT_COMM_TIMEOUT: Duration = Duration::from_secs(300);

/// What the default grace period adds to the communicator timeout: the time a rank needs, once its wait has timed
/// out, to read its peers' failure records (up to about 3 s), print its error and exit, on a loaded machine.
pub const REPORT_MARGIN: Duration = Duration::from_secs(15);

/// How long a rank has between SIGTERM and SIGKILL unless told otherwise.
pub const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(5);

/// What to run and how. Build with [`Launcher::new`] and the setters, then [`Launcher::run`].
///
/// The job (`crate::job`) reads the fields while it starts and supervises the ranks.
#[derive(Debug, Clone)]
pub struct Launcher {
    pub(crate) program: OsString,
    pub(crate) args: Vec<OsString>,
    pub(crate) nproc: usize,
    pub(crate) nnodes: usize,
    pub(crate) node_rank: usize,
    pub(crate) master_addr: String,
    pub(crate) master_port: u16,
    /// Failure to SIGTERM; `None`: derived from `comm_timeout` ([`Launcher::grace_period`]).
    pub(crate) grace: Option<Duration>,
    /// SIGTERM to SIGKILL.
    pub(crate) kill_after: Duration,
    /// The ranks' communicator timeout, as far as the launcher knows it; told to the ranks.
    pub(crate) comm_timeout: Duration,
    pub(crate) timeout: Option<Duration>,
    pub(crate) forward_signals: bool,
    pub(crate) echo: bool,
    pub(crate) capture: bool,
    pub(crate) secret: Option<Secret>,
    pub(crate) relay: Option<bool>,
    pub(crate) torchrun_env: bool,
    pub(crate) env: Vec<(OsString, OsString)>,
}
