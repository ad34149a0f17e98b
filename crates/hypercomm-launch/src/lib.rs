//! Starting the local ranks of a job and supervising them: the library behind `hypercomm launch`.
//!
//! This crate is the process side of rendezvous. [`hypercomm_store`] is where ranks meet (keys, stores, the TCP
//! server and relay, and [`Rendezvous::from_env`], which a rank uses to find out where it sits); this crate starts
//! the processes that meet there, and is only needed by whatever starts a job: the `hypercomm` tool, examples that
//! launch themselves, and multi-process tests. A rank started by torchrun, SLURM or MPI does not need it.
//!
//! [`Launcher`] starts N copies of a program with the `HYPERCOMM_*` variables that [`Rendezvous::from_env`]
//! reads, hosts the job's [`TcpStoreServer`] when it runs on node 0, prefixes every output line with
//! `[rank K] `, and watches the ranks: when one fails it gives the others a grace period to finish, then sends
//! SIGTERM, then SIGKILL, and returns a [`LaunchReport`] naming the rank that failed and how.
//!
//! The grace period is long enough, by default, for the survivors to report: a rank learns that a peer died at
//! once, but that a peer never arrived or stalled only when its communicator's timeout runs out. So unless set
//! ([`Launcher::grace`]), the grace is the ranks' communicator timeout ([`Launcher::comm_timeout`], by default
//! [`DEFAULT_COMM_TIMEOUT`], the communicators' own default) plus [`REPORT_MARGIN`]. The launcher tells the ranks
//! that timeout in `HYPERCOMM_COMM_TIMEOUT_SECS` (`Rendezvous::comm_timeout`), so a program can make the two agree.
//! The grace only bounds the wait: the job ends as soon as every rank has exited.
//!
//! On a job of several nodes the launcher also runs the node's [`StoreRelay`]: the ranks reach the store
//! through it (it is named in `HYPERCOMM_STORE_RELAY`), so the central store sees a few connections per node, and
//! identical waits of the node's ranks become one upstream wait. [`Launcher::relay`] turns it on or off.
//!
//! Each rank runs in its own process group, so stopping a rank also stops anything it started, and a Ctrl-C at
//! the terminal reaches only the launcher, which forwards it (with [`Launcher::forward_signals`]) exactly once.
//! Ranks are also set to receive SIGKILL if the launcher dies, so a killed launcher leaves no orphans.
//! With [`Launcher::bind_cpus`] each local rank is bound, before it runs the program, to its own share of the
//! CPUs the launcher may use.
//!
//! Multi-process tests use the same code: launch the test binary itself, running one `#[ignore]`d test as the
//! rank program ([`Launcher::current_test`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use hypercomm_launch::Launcher;
//!
//! let report = Launcher::new("/bin/sh")
//!     .args(["-c", "echo hello from $HYPERCOMM_RANK of $HYPERCOMM_WORLD_SIZE"])
//!     .nproc(4)
//!     .timeout(Duration::from_secs(60))
//!     .run()?;
//! assert!(report.success(), "{}", report.summary());
//! # Ok::<(), hypercomm_launch::LaunchError>(())
//! ```
//!
//! Inside, one module per idea: `config` holds [`Launcher`]'s data, `launcher` its setters and the setup of the
//! store, relay and secret; `job` starts the ranks and reaps them, `job::supervise` is the loop that applies the
//! failure, timeout and signal policies, and `job::exit_order` timestamps each exit so "failed first" is the real
//! order; `output` prefixes and keeps the ranks' lines; `report` ([`LaunchReport`]) says how the job ended.
//!
//! [`Rendezvous::from_env`]: hypercomm_store::Rendezvous::from_env
//! [`TcpStoreServer`]: hypercomm_store::TcpStoreServer
//! [`StoreRelay`]: hypercomm_store::StoreRelay

mod config;
mod error;
mod job;
mod launcher;
mod output;
mod report;

pub use config::{DEFAULT_COMM_TIMEOUT, DEFAULT_KILL_AFTER, Launcher, REPORT_MARGIN};
pub use error::LaunchError;
pub use output::MAX_CAPTURED_LINES;
pub use report::{Exit, LaunchReport, RankOutcome, signal_name};
