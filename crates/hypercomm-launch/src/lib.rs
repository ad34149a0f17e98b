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
//! On a job of several nodes the launcher also runs the node's [`StoreRelay`]: the ranks reach the store
//! through it (it is named in `HYPERCOMM_STORE_RELAY`), so the central store sees a few connections per node, and
//! identical waits of the node's ranks become one upstream wait. [`Launcher::relay`] turns it on or off.
//!
//! Each rank runs in its own process group, so stopping a rank also stops anything it started, and a Ctrl-C at
//! the terminal reaches only the launcher, which forwards it (with [`Launcher::forward_signals`]) exactly once.
//! Ranks are also set to receive SIGKILL if the launcher dies, so a killed launcher leaves no orphans.
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
//! [`Rendezvous::from_env`]: hypercomm_store::Rendezvous::from_env
//! [`TcpStoreServer`]: hypercomm_store::TcpStoreServer
//! [`StoreRelay`]: hypercomm_store::StoreRelay

mod output;
mod report;

use std::ffi::{OsStr, OsString};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

pub use output::MAX_CAPTURED_LINES;
pub use report::{Exit, LaunchReport, RankOutcome, signal_name};

use hypercomm_store::{
    ClientOptions, RELAY_ADDR_ENV, RelayError, SECRET_ENV, STORE_ADDR_ENV, Secret, SecretError,
    ServerError, ServerOptions, StoreAddr, StoreRelay, TcpStoreServer,
};
use output::{Sink, Stream, pump};

/// How often the launcher checks its ranks and pending signals.
const POLL: Duration = Duration::from_millis(5);
/// How long the launcher waits, after the last rank exits, for output still in flight in the pipes.
const DRAIN: Duration = Duration::from_secs(2);

/// Why a job could not be launched (a job that ran and failed is a [`LaunchReport`], not an error).
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

/// What to run and how. Build with [`Launcher::new`] and the setters, then [`Launcher::run`].
#[derive(Debug, Clone)]
pub struct Launcher {
    program: OsString,
    args: Vec<OsString>,
    nproc: usize,
    nnodes: usize,
    node_rank: usize,
    master_addr: String,
    master_port: u16,
    grace: Duration,
    timeout: Option<Duration>,
    forward_signals: bool,
    echo: bool,
    capture: bool,
    secret: Option<Secret>,
    relay: Option<bool>,
    torchrun_env: bool,
    env: Vec<(OsString, OsString)>,
}

impl Launcher {
    /// A launcher for `program` with one rank on one node, store on `127.0.0.1` at a free port, a 5 s grace
    /// period, no timeout, output echoed and not captured, no signal forwarding, and a fresh random secret.
    pub fn new(program: impl AsRef<OsStr>) -> Self {
        Launcher {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            nproc: 1,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 0,
            grace: Duration::from_secs(5),
            timeout: None,
            forward_signals: false,
            echo: true,
            capture: false,
            secret: None,
            relay: None,
            torchrun_env: false,
            env: Vec::new(),
        }
    }

    /// A launcher that runs the `#[ignore]`d test `test_name` of the current test binary as each rank.
    ///
    /// Output is captured rather than echoed, so it lands in the report instead of the test log.
    pub fn current_test(test_name: &str) -> io::Result<Self> {
        let exe = std::env::current_exe()?;
        Ok(Launcher::new(exe)
            .args([
                test_name,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
                "--quiet",
            ])
            .echo(false)
            .capture(true))
    }

    /// Appends arguments for the program.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Ranks to start on this node.
    #[must_use]
    pub fn nproc(mut self, n: usize) -> Self {
        self.nproc = n;
        self
    }

    /// Number of nodes in the job and this node's index; every node starts the same number of ranks.
    #[must_use]
    pub fn nodes(mut self, nnodes: usize, node_rank: usize) -> Self {
        self.nnodes = nnodes;
        self.node_rank = node_rank;
        self
    }

    /// Where the store listens (node 0 binds it; the ranks connect to it). Port 0 picks a free port, which only
    /// works on one node.
    #[must_use]
    pub fn master(mut self, addr: impl Into<String>, port: u16) -> Self {
        self.master_addr = addr.into();
        self.master_port = port;
        self
    }

    /// How long the other ranks may keep running after one fails, and again between SIGTERM and SIGKILL.
    #[must_use]
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Stop the whole job (SIGTERM, then SIGKILL after the grace period) once it has run this long.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Catch SIGINT and SIGTERM while the job runs and forward them to every rank; a second one sends SIGKILL.
    /// Meant for the `hypercomm launch` process; note that the catching handler stays installed afterwards.
    #[must_use]
    pub fn forward_signals(mut self, on: bool) -> Self {
        self.forward_signals = on;
        self
    }

    /// Echo every rank's output, prefixed `[rank K] `, to this process's stdout and stderr.
    #[must_use]
    pub fn echo(mut self, on: bool) -> Self {
        self.echo = on;
        self
    }

    /// Keep every rank's output lines in the report (up to [`MAX_CAPTURED_LINES`] per stream).
    #[must_use]
    pub fn capture(mut self, on: bool) -> Self {
        self.capture = on;
        self
    }

    /// The store's shared secret. Without one, a single-node job gets a fresh random secret; a multi-node job
    /// runs unauthenticated (every node would need the same secret: pass it, e.g. from [`Secret::from_env`]).
    #[must_use]
    pub fn secret(mut self, secret: Option<Secret>) -> Self {
        self.secret = secret;
        self
    }

    /// Whether this node's ranks reach the store through a relay run by the launcher ([`StoreRelay`]). By default
    /// a job of several nodes uses one and a single node does not (its ranks are as close to the store as the
    /// relay would be).
    #[must_use]
    pub fn relay(mut self, on: bool) -> Self {
        self.relay = Some(on);
        self
    }

    /// Also give every rank torchrun's environment, so a program written for `torchrun` (PyTorch's
    /// `init_process_group("env://")`, Megatron) runs unchanged: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `LOCAL_WORLD_SIZE`, `GROUP_RANK` (the node), `MASTER_ADDR` and `MASTER_PORT`. `MASTER_PORT` is for PyTorch's
    /// own TCPStore, which its rank 0 hosts (it does not speak hypercomm's protocol): on one node a free port, on
    /// several nodes the store's port + 1, which every node's launcher computes alike.
    #[must_use]
    pub fn torchrun_env(mut self, on: bool) -> Self {
        self.torchrun_env = on;
        self
    }

    /// Sets an extra environment variable for every rank.
    #[must_use]
    pub fn env(mut self, name: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((name.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    fn validate(&self) -> Result<(), LaunchError> {
        let invalid = |msg: String| Err(LaunchError::Invalid(msg));
        if self.nproc == 0 {
            return invalid("nproc=0: start at least one rank per node".into());
        }
        if self.nnodes == 0 {
            return invalid("nnodes=0: a job has at least one node".into());
        }
        if self.node_rank >= self.nnodes {
            return invalid(format!(
                "node rank {} is not below nnodes={}",
                self.node_rank, self.nnodes
            ));
        }
        if self.nnodes > 1 && self.master_port == 0 {
            return invalid(format!(
                "nnodes={} needs an explicit master port: the other nodes cannot learn a port picked at random",
                self.nnodes
            ));
        }
        if self.nproc.checked_mul(self.nnodes).is_none() {
            return invalid(format!(
                "{} ranks on each of {} nodes overflows",
                self.nproc, self.nnodes
            ));
        }
        Ok(())
    }

    /// Runs the job to the end and reports how every rank ended.
    ///
    /// Returns `Err` only when the job could not start; a rank failing, the timeout running out or a forwarded
    /// signal are all reported in the [`LaunchReport`]. Without [`Launcher::timeout`] this waits as long as the
    /// ranks run.
    pub fn run(&self) -> Result<LaunchReport, LaunchError> {
        self.validate()?;
        let secret = match (&self.secret, self.nnodes) {
            (Some(secret), _) => Some(secret.clone()),
            (None, 1) => Some(Secret::random()?),
            (None, _) => {
                tracing::warn!(
                    "multi-node launch without {SECRET_ENV}: the store accepts any client"
                );
                None
            }
        };
        let server = if self.node_rank == 0 {
            let options = ServerOptions {
                secret: secret.clone(),
                ..ServerOptions::default()
            };
            let bind = StoreAddr {
                host: self.master_addr.clone(),
                port: self.master_port,
            };
            Some(TcpStoreServer::bind(bind.to_string(), options)?)
        } else {
            None
        };
        let store_addr = StoreAddr {
            host: connect_host(&self.master_addr),
            port: server
                .as_ref()
                .map_or(self.master_port, |s| s.local_addr().port()),
        };
        let relay = if self.relay.unwrap_or(self.nnodes > 1) {
            let options = ServerOptions {
                secret: secret.clone(),
                ..ServerOptions::default()
            };
            let upstream = ClientOptions::default().with_secret(secret.clone());
            let relay = StoreRelay::start(
                "127.0.0.1:0",
                store_addr.to_string(),
                self.node_rank,
                options,
                upstream,
            )?;
            Some(relay)
        } else {
            None
        };
        let relay_addr = relay.as_ref().map(|r| StoreAddr {
            host: r.local_addr().ip().to_string(),
            port: r.local_addr().port(),
        });
        let signals = if self.forward_signals {
            Some(
                signal_hook::iterator::Signals::new([
                    signal_hook::consts::SIGINT,
                    signal_hook::consts::SIGTERM,
                ])
                .map_err(LaunchError::Signals)?,
            )
        } else {
            None
        };
        let torch_master = if self.torchrun_env {
            Some(StoreAddr {
                host: connect_host(&self.master_addr),
                port: torch_master_port(self.nnodes, store_addr.port)?,
            })
        } else {
            None
        };
        let mut job = Job::start(
            self,
            &store_addr,
            relay_addr.as_ref(),
            secret.as_ref(),
            torch_master.as_ref(),
        )?;
        let result = job.watch(self, signals);
        if let Some(signals) = &result.signals {
            signals.handle().close();
        }
        let ranks = job.finish();
        drop(relay);
        drop(server);
        Ok(LaunchReport {
            ranks,
            first_failure: result.first_failure,
            timed_out: result.timed_out,
            interrupted_by: result.interrupted_by,
            store_addr,
            elapsed: result.elapsed,
        })
    }
}

/// The host ranks connect to: the bind host, or loopback when the store binds every interface.
fn connect_host(bind: &str) -> String {
    match bind.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) if ip.is_unspecified() => Ipv4Addr::LOCALHOST.to_string(),
        Ok(IpAddr::V6(ip)) if ip.is_unspecified() => Ipv6Addr::LOCALHOST.to_string(),
        _ => bind.to_owned(),
    }
}

/// The port of PyTorch's own store for `--torchrun-env`: a free one on one node, the hypercomm store's port + 1
/// across nodes (every node computes the same).
fn torch_master_port(nnodes: usize, store_port: u16) -> Result<u16, LaunchError> {
    if nnodes > 1 {
        return store_port.checked_add(1).ok_or_else(|| {
            LaunchError::Invalid(format!(
                "torchrun's MASTER_PORT is the store's port + 1, but the store's port is {store_port}"
            ))
        });
    }
    // Bound and released at once: PyTorch's rank 0 binds it again moments later.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(LaunchError::TorchPort)?;
    Ok(listener
        .local_addr()
        .map_err(LaunchError::TorchPort)?
        .port())
}

/// One started rank.
struct Rank {
    rank: usize,
    local_rank: usize,
    child: Child,
    pid: Pid,
    exit: Option<Exit>,
    stopped_by_launcher: bool,
    stdout: Option<Arc<Mutex<Vec<String>>>>,
    stderr: Option<Arc<Mutex<Vec<String>>>>,
}

/// The running job: its ranks, the threads pumping their output, and the notices of ranks' exits in the order
/// they happened.
struct Job {
    ranks: Vec<Rank>,
    pumps_done: mpsc::Receiver<()>,
    pumps: usize,
    /// `(index in ranks, when)` sent by each rank's exit watcher as soon as the rank exits.
    exits: mpsc::Receiver<(usize, Instant)>,
}

/// Watches rank `index` (process `pid`) and sends `(index, now)` the moment it exits. It waits with `WNOWAIT`, so
/// the rank stays unreaped (a zombie) until the launcher's loop reaps it: until then its pid cannot be reused, and
/// signalling the ranks the loop still thinks are running stays safe.
fn watch_exit(index: usize, rank: usize, pid: Pid, tx: mpsc::Sender<(usize, Instant)>) {
    let spawned = thread::Builder::new()
        .name(format!("rank-{rank}-exit"))
        .spawn(move || {
            use rustix::process::{WaitId, WaitIdOptions, waitid};
            // Blocks until the rank exits; retried only on EINTR.
            while let Err(rustix::io::Errno::INTR) = waitid(
                WaitId::Pid(pid),
                WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
            ) {}
            let _ = tx.send((index, Instant::now()));
        });
    if let Err(e) = spawned {
        // The loop still polls every rank; only the order of near-simultaneous exits is less exact.
        tracing::debug!(rank, error = %e, "no exit watcher for rank");
    }
}

/// What happened while watching.
struct Watched {
    first_failure: Option<usize>,
    timed_out: bool,
    interrupted_by: Option<i32>,
    elapsed: Duration,
    signals: Option<signal_hook::iterator::Signals>,
}

impl Job {
    fn start(
        launcher: &Launcher,
        store_addr: &StoreAddr,
        relay_addr: Option<&StoreAddr>,
        secret: Option<&Secret>,
        torch_master: Option<&StoreAddr>,
    ) -> Result<Job, LaunchError> {
        let (done_tx, pumps_done) = mpsc::channel();
        let (exits_tx, exits) = mpsc::channel();
        let mut job = Job {
            ranks: Vec::with_capacity(launcher.nproc),
            pumps_done,
            pumps: 0,
            exits,
        };
        let world = launcher.nproc * launcher.nnodes;
        for local_rank in 0..launcher.nproc {
            let rank = launcher.node_rank * launcher.nproc + local_rank;
            let mut cmd = Command::new(&launcher.program);
            cmd.args(&launcher.args)
                .envs(launcher.env.iter().map(|(k, v)| (k, v)))
                .env("HYPERCOMM_RANK", rank.to_string())
                .env("HYPERCOMM_WORLD_SIZE", world.to_string())
                .env("HYPERCOMM_LOCAL_RANK", local_rank.to_string())
                .env("HYPERCOMM_LOCAL_WORLD_SIZE", launcher.nproc.to_string())
                .env("HYPERCOMM_NODE_RANK", launcher.node_rank.to_string())
                .env("HYPERCOMM_NNODES", launcher.nnodes.to_string())
                .env(STORE_ADDR_ENV, store_addr.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
            if let Some(master) = torch_master {
                cmd.env("RANK", rank.to_string())
                    .env("WORLD_SIZE", world.to_string())
                    .env("LOCAL_RANK", local_rank.to_string())
                    .env("LOCAL_WORLD_SIZE", launcher.nproc.to_string())
                    .env("GROUP_RANK", launcher.node_rank.to_string())
                    .env("MASTER_ADDR", &master.host)
                    .env("MASTER_PORT", master.port.to_string());
            }
            match secret {
                Some(secret) => cmd.env(SECRET_ENV, OsStr::from_bytes(secret.expose())),
                None => cmd.env_remove(SECRET_ENV),
            };
            match relay_addr {
                Some(relay) => cmd.env(RELAY_ADDR_ENV, relay.to_string()),
                None => cmd.env_remove(RELAY_ADDR_ENV),
            };
            // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe calls are
            // allowed. It makes one prctl(PR_SET_PDEATHSIG) system call through rustix's raw-syscall backend,
            // which neither allocates nor takes locks; the error path converts an errno without allocating.
            unsafe {
                cmd.pre_exec(|| {
                    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
                        .map_err(io::Error::from)
                });
            }
            let mut child = match cmd.spawn() {
                Ok(child) => child,
                Err(source) => {
                    job.kill_all(Signal::KILL);
                    job.finish();
                    return Err(LaunchError::Spawn {
                        rank,
                        program: launcher.program.to_string_lossy().into_owned(),
                        source,
                    });
                }
            };
            let capture = || launcher.capture.then(|| Arc::new(Mutex::new(Vec::new())));
            let (stdout, stderr) = (capture(), capture());
            let pipes = [
                (
                    child
                        .stdout
                        .take()
                        .map(|p| Box::new(p) as Box<dyn io::Read + Send>),
                    Stream::Stdout,
                    &stdout,
                ),
                (
                    child
                        .stderr
                        .take()
                        .map(|p| Box::new(p) as Box<dyn io::Read + Send>),
                    Stream::Stderr,
                    &stderr,
                ),
            ];
            for (pipe, stream, store) in pipes {
                let Some(pipe) = pipe else { continue };
                let sink = Sink {
                    rank,
                    stream,
                    echo: launcher.echo,
                    capture: store.clone(),
                };
                let done = done_tx.clone();
                let spawned = thread::Builder::new()
                    .name(format!("rank-{rank}-output"))
                    .spawn(move || {
                        pump(pipe, &sink);
                        let _ = done.send(());
                    });
                if spawned.is_ok() {
                    job.pumps += 1;
                }
            }
            let pid = Pid::from_child(&child);
            watch_exit(job.ranks.len(), rank, pid, exits_tx.clone());
            job.ranks.push(Rank {
                rank,
                local_rank,
                child,
                pid,
                exit: None,
                stopped_by_launcher: false,
                stdout,
                stderr,
            });
        }
        Ok(job)
    }

    /// Polls until every rank has exited, applying the failure, timeout and signal policies.
    fn watch(
        &mut self,
        launcher: &Launcher,
        mut signals: Option<signal_hook::iterator::Signals>,
    ) -> Watched {
        let started = Instant::now();
        let mut first_failure = None;
        let mut timed_out = false;
        let mut interrupted_by = None;
        // When to send SIGTERM and then SIGKILL to every rank still running, once a reason to stop exists.
        let mut term_at: Option<Instant> = None;
        let mut kill_at: Option<Instant> = None;
        let mut termed = false;
        let mut killed = false;
        let mut pending_notice: Option<(usize, Instant)> = None;
        loop {
            let now = Instant::now();
            if let Some(signals) = signals.as_mut() {
                for sig in signals.pending() {
                    if interrupted_by.is_none() {
                        interrupted_by = Some(sig);
                        tracing::warn!(signal = %signal_name(sig), "forwarding signal to every rank");
                        if let Some(signal) = Signal::from_named_raw(sig) {
                            self.signal_running(signal);
                        }
                        kill_at = Some(now + launcher.grace);
                    } else {
                        tracing::warn!("second signal: killing every rank");
                        self.signal_running(Signal::KILL);
                        killed = true;
                    }
                }
            }
            // Ranks whose exit watchers reported, in the order they exited, then every other rank in index order
            // (a fallback; without it a rank whose watcher could not start would never be reaped).
            let mut noticed: Vec<(Instant, usize)> = pending_notice
                .take()
                .into_iter()
                .chain(self.exits.try_iter())
                .map(|(i, at)| (at, i))
                .collect();
            noticed.sort_unstable();
            let order: Vec<usize> = noticed
                .iter()
                .map(|&(_, i)| i)
                .chain(0..self.ranks.len())
                .collect();
            for i in order {
                let rank = &mut self.ranks[i];
                if rank.exit.is_some() {
                    continue;
                }
                match rank.child.try_wait() {
                    Ok(Some(status)) => {
                        let exit = match (status.code(), status.signal()) {
                            (Some(code), _) => Exit::Code(code),
                            (None, Some(sig)) => Exit::Signal(sig),
                            (None, None) => Exit::Code(-1),
                        };
                        rank.exit = Some(exit);
                        if !exit.success() && first_failure.is_none() && !rank.stopped_by_launcher {
                            first_failure = Some(rank.rank);
                            tracing::warn!(
                                rank = rank.rank,
                                "rank {} {exit}; stopping the others",
                                rank.rank
                            );
                            term_at.get_or_insert(now + launcher.grace);
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(rank = rank.rank, error = %e, "cannot poll rank; treating it as failed");
                        rank.exit = Some(Exit::Code(-1));
                        first_failure.get_or_insert(rank.rank);
                        term_at.get_or_insert(now + launcher.grace);
                    }
                }
            }
            if self.ranks.iter().all(|r| r.exit.is_some()) {
                break;
            }
            if let Some(limit) = launcher.timeout
                && !timed_out
                && now.duration_since(started) >= limit
            {
                timed_out = true;
                tracing::warn!(?limit, "job timed out; stopping every rank");
                term_at = Some(now);
            }
            if let Some(at) = term_at
                && !termed
                && now >= at
            {
                termed = true;
                self.signal_running(Signal::TERM);
                kill_at.get_or_insert(now + launcher.grace);
            }
            if let Some(at) = kill_at
                && !killed
                && now >= at
            {
                killed = true;
                self.signal_running(Signal::KILL);
            }
            // Sleep until a rank exits or POLL passes; the notice goes back for the next round's ordering.
            if let Ok(notice) = self.exits.recv_timeout(POLL) {
                pending_notice = Some(notice);
            }
        }
        Watched {
            first_failure,
            timed_out,
            interrupted_by,
            elapsed: started.elapsed(),
            signals,
        }
    }

    /// Sends `signal` to the process group of every rank still running, and marks them stopped by the launcher.
    /// A SIGTERM is preceded by SIGCONT: a stopped rank (SIGSTOP, a debugger) would otherwise hold the SIGTERM
    /// pending until SIGKILL, and never get to report.
    fn signal_running(&mut self, signal: Signal) {
        for rank in self.ranks.iter_mut().filter(|r| r.exit.is_none()) {
            rank.stopped_by_launcher = true;
            if signal == Signal::TERM {
                // Same pid argument as below; a rank that is not stopped ignores SIGCONT.
                let _ = rustix::process::kill_process_group(rank.pid, Signal::CONT);
            }
            // The rank leads its own process group (process_group(0)), so its pid names the group. The rank is
            // not reaped yet (exit is None), so the pid cannot have been reused.
            if let Err(e) = rustix::process::kill_process_group(rank.pid, signal) {
                tracing::debug!(rank = rank.rank, error = %e, "signalling rank failed (it may have just exited)");
            }
        }
    }

    fn kill_all(&mut self, signal: Signal) {
        self.signal_running(signal);
    }

    /// Reaps every rank and collects its outcome, waiting briefly for the last output.
    fn finish(mut self) -> Vec<RankOutcome> {
        for rank in &mut self.ranks {
            if rank.exit.is_none() {
                // Only reached when start-up failed part-way; the ranks were sent SIGKILL, so this returns soon.
                let status = rank.child.wait();
                rank.exit = Some(match status {
                    Ok(s) => s
                        .code()
                        .map_or_else(|| Exit::Signal(s.signal().unwrap_or(0)), Exit::Code),
                    Err(_) => Exit::Code(-1),
                });
            }
        }
        let deadline = Instant::now() + DRAIN;
        for _ in 0..self.pumps {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.pumps_done.recv_timeout(left).is_err() {
                tracing::debug!(
                    "some rank output was still open after the ranks exited; not waiting for it"
                );
                break;
            }
        }
        let take = |lines: &Option<Arc<Mutex<Vec<String>>>>| {
            lines.as_ref().map_or_else(Vec::new, |l| {
                std::mem::take(&mut *l.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
            })
        };
        self.ranks
            .iter()
            .map(|r| RankOutcome {
                rank: r.rank,
                local_rank: r.local_rank,
                exit: r.exit.unwrap_or(Exit::Code(-1)),
                stopped_by_launcher: r.stopped_by_launcher,
                stdout: take(&r.stdout),
                stderr: take(&r.stderr),
            })
            .collect()
    }
}
