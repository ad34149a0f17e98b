//! The [`Launcher`] builder's setters, and [`Launcher::run`], which sets up what the ranks meet
//! through (the store server on node 0, the node's relay, the secret, signal forwarding) and hands the ranks to
//! the job (`crate::job`) that starts and supervises them.

use std::ffi::OsStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use hypercomm_store::{
    ClientOptions, SECRET_ENV, Secret, ServerOptions, StoreAddr, StoreRelay, TcpStoreServer,
};

use crate::config::{
    DEFAULT_COMM_TIMEOUT, DEFAULT_KILL_AFTER, Launcher, REPORT_MARGIN, cpu_shares,
};
use crate::job::Job;
use crate::{LaunchError, LaunchReport};

impl Launcher {
    /// A launcher for `program` with one rank on one node, store on `127.0.0.1` at a free port, the communicators'
    /// default timeout ([`DEFAULT_COMM_TIMEOUT`]) and the grace period derived from it ([`Launcher::grace_period`]),
    /// 5 s from SIGTERM to SIGKILL, no job timeout, output echoed and not captured, no signal forwarding, and a
    /// fresh random secret.
    pub fn new(program: impl AsRef<OsStr>) -> Self {
        Launcher {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            nproc: 1,
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 0,
            grace: None,
            kill_after: DEFAULT_KILL_AFTER,
            comm_timeout: DEFAULT_COMM_TIMEOUT,
            timeout: None,
            forward_signals: false,
            echo: true,
            capture: false,
            secret: None,
            relay: None,
            torchrun_env: false,
            bind_cpus: false,
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

    /// How long the other ranks may keep running after one fails, before SIGTERM. Unset, it is derived from the
    /// communicator timeout ([`Launcher::grace_period`]).
    #[must_use]
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }

    /// How long a rank has between SIGTERM (after a failure, the job timeout or a forwarded signal) and SIGKILL
    /// (default [`DEFAULT_KILL_AFTER`], 5 s).
    #[must_use]
    pub fn kill_after(mut self, kill_after: Duration) -> Self {
        self.kill_after = kill_after;
        self
    }

    /// The timeout the ranks' communicators use (default [`DEFAULT_COMM_TIMEOUT`], the communicators' own default).
    /// The launcher cannot see it, so it is told: the default grace period is derived from it, and every rank gets
    /// it in `HYPERCOMM_COMM_TIMEOUT_SECS` (read by `Rendezvous::from_env` into `Rendezvous::comm_timeout`), for the
    /// program to give its communicators.
    #[must_use]
    pub fn comm_timeout(mut self, timeout: Duration) -> Self {
        self.comm_timeout = timeout;
        self
    }

    /// The grace period this launcher applies after a rank fails: the one set with [`Launcher::grace`], or else
    /// the communicator timeout plus [`REPORT_MARGIN`].
    ///
    /// A survivor learns of a peer that died at once (a closed connection, a vanished process), but of a peer that
    /// never arrived (it failed before its communicators were made) or stalled only when its own wait times out,
    /// after the communicator timeout; the margin covers reading the failure records, printing and exiting. The
    /// job still ends as soon as every rank has exited, so a long grace costs nothing when the survivors report.
    ///
    /// ```
    /// use std::time::Duration;
    /// use hypercomm_launch::{Launcher, REPORT_MARGIN};
    ///
    /// let launcher = Launcher::new("train").comm_timeout(Duration::from_secs(60));
    /// assert_eq!(launcher.grace_period(), Duration::from_secs(60) + REPORT_MARGIN);
    /// assert_eq!(launcher.grace(Duration::from_secs(2)).grace_period(), Duration::from_secs(2));
    /// ```
    pub fn grace_period(&self) -> Duration {
        self.grace
            .unwrap_or_else(|| self.comm_timeout.saturating_add(REPORT_MARGIN))
    }

    /// Stop the whole job (SIGTERM, then SIGKILL after [`Launcher::kill_after`]) once it has run this long.
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
    ///
    /// [`MAX_CAPTURED_LINES`]: crate::MAX_CAPTURED_LINES
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

    /// Bind each local rank to its own share of the CPUs this launcher may run on: the allowed CPUs, in order, cut
    /// into `nproc` contiguous shares as equal as they can be, local rank `i` on the `i`-th (with 16 CPUs and 8
    /// ranks, two each; with 2 and 2, one each). [`Launcher::run`] fails if there are fewer CPUs than local ranks.
    ///
    /// Unbound, two ranks that take turns waiting on each other (every collective ends in a barrier) can be
    /// placed on one core together by the scheduler and stay there, and then every small collective pays for a
    /// context switch (`hypercomm bench` binds its ranks the same way; the figures are in
    /// `docs/perf/host-collectives.md`).
    #[must_use]
    pub fn bind_cpus(mut self, on: bool) -> Self {
        self.bind_cpus = on;
        self
    }

    /// Sets an extra environment variable for every rank.
    #[must_use]
    pub fn env(mut self, name: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((name.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// The CPUs each local rank is bound to ([`Launcher::bind_cpus`]), or `None` when ranks are not bound.
    fn cpu_plan(&self) -> Result<Option<Vec<Vec<usize>>>, LaunchError> {
        if !self.bind_cpus {
            return Ok(None);
        }
        let mask = rustix::thread::sched_getaffinity(None).map_err(|e| {
            LaunchError::Invalid(format!(
                "cannot bind ranks to CPUs: reading this process's CPU mask failed: {e}"
            ))
        })?;
        let allowed: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| mask.is_set(c))
            .collect();
        cpu_shares(&allowed, self.nproc).map(Some).ok_or_else(|| {
            LaunchError::Invalid(format!(
                "cannot bind {} local ranks to CPUs of their own: this process may run on {} CPU(s) ({allowed:?})",
                self.nproc,
                allowed.len()
            ))
        })
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
        if self.comm_timeout.is_zero() {
            return invalid(
                "communicator timeout 0s: the ranks' communicators wait a positive time".into(),
            );
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
        let cpus = self.cpu_plan()?;
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
            cpus.as_deref(),
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
