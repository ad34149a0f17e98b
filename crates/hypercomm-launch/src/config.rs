//! [`Launcher`]'s data: what to run and how. Its own room, below both the builder (`launcher`: the setters and
//! `run`) and the job (`job`) that reads it while it starts and supervises the ranks.

use std::ffi::OsString;
use std::time::Duration;

use hypercomm_store::Secret;

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
    pub(crate) grace: Duration,
    pub(crate) timeout: Option<Duration>,
    pub(crate) forward_signals: bool,
    pub(crate) echo: bool,
    pub(crate) capture: bool,
    pub(crate) secret: Option<Secret>,
    pub(crate) relay: Option<bool>,
    pub(crate) torchrun_env: bool,
    pub(crate) env: Vec<(OsString, OsString)>,
}
