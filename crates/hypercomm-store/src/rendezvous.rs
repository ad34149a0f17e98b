//! Where am I? Rank, world size, local rank, local world size and the store address, read from the environment a
//! launcher left behind.
//!
//! [`Rendezvous::from_env`] looks for these launchers, in this order, and uses the first one present:
//!
//! | source | rank | world size | local rank | local world size |
//! |---|---|---|---|---|
//! | [`EnvSource::Hypercomm`] (`hypercomm launch`, or by hand) | `HYPERCOMM_RANK` | `HYPERCOMM_WORLD_SIZE` | `HYPERCOMM_LOCAL_RANK` | `HYPERCOMM_LOCAL_WORLD_SIZE` |
//! | [`EnvSource::Torchrun`] | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `LOCAL_WORLD_SIZE` |
//! | [`EnvSource::OpenMpi`] (`mpirun`) | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `OMPI_COMM_WORLD_LOCAL_SIZE` |
//! | [`EnvSource::Slurm`] (`srun`) | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` | `SLURM_TASKS_PER_NODE` at `SLURM_NODEID` |
//! | [`EnvSource::Pmi`] (MPICH, Intel MPI) | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` | `MPI_LOCALNRANKS` |
//!
//! A source counts as present when its rank or world-size variable is set; a present source must then be complete,
//! and a missing or unparsable variable is an error that names it. Lower-priority sources are not consulted once
//! one is present: the order puts the launcher that runs inside another first (under `srun torchrun ...` both are
//! set and torchrun's view is the one that matters; `mpirun` in a SLURM job script or under `srun` leaves the job
//! step's `SLURM_PROCID` and `SLURM_NTASKS` in every rank's environment, so Open MPI's variables come before
//! SLURM's). PMI comes after SLURM because `srun --mpi=pmi2` sets `PMI_RANK` and `PMI_SIZE` without the local
//! variables; MPICH's `mpiexec` inside a SLURM job is therefore read as the SLURM job step, so start MPICH jobs
//! there with `srun` instead.
//! [`EnvSource::detect`] applies the same rule and only says which source is present, for programs that start
//! their own ranks when no launcher started them.
//!
//! The store address comes from `HYPERCOMM_STORE_ADDR` (`host:port`) or else from `MASTER_ADDR` and
//! `MASTER_PORT`, for every source. Under SLURM, Open MPI and MPICH one of the two must be exported by the job
//! script. Under torchrun, `MASTER_PORT` is already taken by PyTorch's own store, so set `HYPERCOMM_STORE_ADDR`
//! to a different port there. The shared secret, when the job uses one, comes from
//! [`SECRET_ENV`](crate::SECRET_ENV).
//!
//! `hypercomm launch` also tells the ranks the communicator timeout its grace period was derived from, in
//! [`COMM_TIMEOUT_ENV`] ([`Rendezvous::comm_timeout`]): a rank that gives its communicators that timeout is sure
//! to report a lost peer before the launcher stops it.

use std::fmt;
use std::time::Duration;

use crate::secret::{Secret, SecretError};
use crate::tcp::{
    ClientOptions, NodeRelay, RELAY_ADDR_ENV, ServerError, ServerOptions, TcpStore, TcpStoreServer,
};
use crate::{StoreAddr, StoreError};

/// The launcher whose variables described this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EnvSource {
    /// `HYPERCOMM_*` variables, as set by `hypercomm launch`.
    Hypercomm,
    /// PyTorch's torchrun (`RANK`, `WORLD_SIZE`, ...).
    Torchrun,
    /// Open MPI's mpirun (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// SLURM's srun (`SLURM_PROCID`, ...).
    Slurm,
    /// MPICH-style PMI (`PMI_RANK`, `PMI_SIZE`).
    Pmi,
}

impl EnvSource {
    /// The launcher whose variables this process's environment holds, by the rule and in the order
    /// [`Rendezvous::from_env`] uses; `None` when no recognised launcher started this process.
    ///
    /// A program that starts its own ranks when run by hand asks this, not for one variable, so that under any
    /// launcher `from_env` reads (`hypercomm launch`, torchrun, srun, mpirun, MPICH) it runs as one rank of that
    /// launcher's job instead of starting a job of its own in every rank:
    ///
    /// ```no_run
    /// use hypercomm_store::{EnvSource, Rendezvous};
    ///
    /// match EnvSource::detect() {
    ///     None => { /* started by hand: launch the ranks (hypercomm::launch::Launcher) */ }
    ///     Some(_) => { let rendezvous = Rendezvous::from_env()?; /* run as rendezvous.rank */ }
    /// }
    /// # Ok::<(), hypercomm_store::RendezvousError>(())
    /// ```
    ///
    /// Only presence is checked (a rank or world-size variable set); whether the launcher's variables are complete
    /// and consistent is [`Rendezvous::from_env`]'s to say.
    pub fn detect() -> Option<EnvSource> {
        EnvSource::detect_in(&|name| std::env::var(name).ok())
    }

    /// [`EnvSource::detect`] over variables read through `vars` (name → value), as [`Rendezvous::from_vars`]
    /// reads them.
    ///
    /// ```
    /// use hypercomm_store::EnvSource;
    ///
    /// let mpirun = |name: &str| (name == "OMPI_COMM_WORLD_SIZE").then(|| "8".to_owned());
    /// assert_eq!(EnvSource::detect_in(&mpirun), Some(EnvSource::OpenMpi));
    /// assert_eq!(EnvSource::detect_in(&|_: &str| None), None);
    /// ```
    pub fn detect_in(vars: &impl Fn(&str) -> Option<String>) -> Option<EnvSource> {
        present(vars).map(|names| names.source)
    }
}

impl fmt::Display for EnvSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EnvSource::Hypercomm => "hypercomm",
            EnvSource::Torchrun => "torchrun",
            EnvSource::Slurm => "slurm",
            EnvSource::OpenMpi => "open mpi",
            EnvSource::Pmi => "pmi",
        })
    }
}

/// Why the environment does not describe this process's place in a job.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RendezvousError {
    /// No launcher's variables are set at all.
    #[error(
        "no launcher environment found: set HYPERCOMM_RANK, HYPERCOMM_WORLD_SIZE, HYPERCOMM_LOCAL_RANK, \
         HYPERCOMM_LOCAL_WORLD_SIZE and HYPERCOMM_STORE_ADDR, or start under hypercomm launch, torchrun, srun or mpirun"
    )]
    NoSource,
    /// A source is present but one of its variables is not set.
    #[error("{launcher} environment is incomplete: {var} is not set")]
    Missing {
        /// The source being read.
        launcher: EnvSource,
        /// The variable that is missing.
        var: String,
    },
    /// A variable is set to something unusable.
    #[error("{var}={value:?} is not {expected}")]
    Invalid {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// What it should be.
        expected: String,
    },
    /// Two variables contradict each other.
    #[error("{0}")]
    Contradiction(String),
    /// The shared secret variable is unusable.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// Hosting the store failed.
    #[error(transparent)]
    Serve(#[from] ServerError),
    /// Connecting to the store failed.
    #[error(transparent)]
    Connect(#[from] StoreError),
}

/// This process's place in a job: who it is, how many there are, and where they meet.
///
/// ```
/// use hypercomm_store::{EnvSource, Rendezvous};
///
/// let env = [("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "3"), ("LOCAL_WORLD_SIZE", "4"),
///            ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29600")];
/// let rdv = Rendezvous::from_vars(&|name: &str| {
///     env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
/// })?;
/// assert_eq!((rdv.rank, rdv.world_size, rdv.local_rank, rdv.local_world_size), (3, 8, 3, 4));
/// assert_eq!(rdv.source, EnvSource::Torchrun);
/// assert_eq!(rdv.store_addr.to_string(), "127.0.0.1:29600");
/// # Ok::<(), hypercomm_store::RendezvousError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Rendezvous {
    /// This process's rank in the job, `0..world_size`.
    pub rank: usize,
    /// Number of processes in the job.
    pub world_size: usize,
    /// This process's rank on its node, `0..local_world_size`.
    pub local_rank: usize,
    /// Number of processes on this node.
    pub local_world_size: usize,
    /// Where the job's store server listens.
    pub store_addr: StoreAddr,
    /// The shared secret from [`SECRET_ENV`](crate::SECRET_ENV), if set.
    pub secret: Option<Secret>,
    /// This node's store relay, from [`RELAY_ADDR_ENV`] (set by `hypercomm launch`), and the node's index
    /// (`HYPERCOMM_NODE_RANK`, 0 when unset); [`Rendezvous::join`] connects there instead of to the store.
    pub relay: Option<(StoreAddr, usize)>,
    /// Which launcher's variables were used.
    pub source: EnvSource,
    /// The communicator timeout the launcher assumed, from [`COMM_TIMEOUT_ENV`] (set by `hypercomm launch`, which
    /// gives the ranks that long, plus a margin, to report after a rank fails); `None` when unset. Use it as the
    /// communicators' timeout (`CommOptions::timeout`, `CollectionBuilder::with_timeout`) so the two agree.
    pub comm_timeout: Option<Duration>,
}

/// A joined job: the client every rank uses, and the server when this rank hosts it.
#[derive(Debug)]
pub struct Joined {
    /// This rank's client.
    pub store: TcpStore,
    /// The server, on the rank that hosts it; dropping it stops the store for everyone, so keep it alive until the
    /// job is done.
    pub server: Option<TcpStoreServer>,
}

/// Names of one source's four variables: rank, world size, local rank, local world size.
struct Names {
    source: EnvSource,
    rank: &'static str,
    world: &'static str,
    local_rank: &'static str,
    local_world: &'static str,
}

const SOURCES: [Names; 5] = [
    Names {
        source: EnvSource::Hypercomm,
        rank: "HYPERCOMM_RANK",
        world: "HYPERCOMM_WORLD_SIZE",
        local_rank: "HYPERCOMM_LOCAL_RANK",
        local_world: "HYPERCOMM_LOCAL_WORLD_SIZE",
    },
    Names {
        source: EnvSource::Torchrun,
        rank: "RANK",
        world: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_world: "LOCAL_WORLD_SIZE",
    },
    Names {
        source: EnvSource::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        world: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_world: "OMPI_COMM_WORLD_LOCAL_SIZE",
    },
    Names {
        source: EnvSource::Slurm,
        rank: "SLURM_PROCID",
        world: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_world: "SLURM_TASKS_PER_NODE",
    },
    Names {
        source: EnvSource::Pmi,
        rank: "PMI_RANK",
        world: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_world: "MPI_LOCALNRANKS",
    },
];

/// The first source, in priority order, whose rank or world-size variable is set.
fn present(vars: &impl Fn(&str) -> Option<String>) -> Option<&'static Names> {
    SOURCES
        .iter()
        .find(|n| vars(n.rank).is_some() || vars(n.world).is_some())
}

/// The variable giving the store's `host:port` directly.
pub const STORE_ADDR_ENV: &str = "HYPERCOMM_STORE_ADDR";

/// The variable in which `hypercomm launch` tells the ranks the communicator timeout it derived its grace period
/// from, in seconds (`"300"`, `"2.5"`); read into [`Rendezvous::comm_timeout`].
pub const COMM_TIMEOUT_ENV: &str = "HYPERCOMM_COMM_TIMEOUT_SECS";

impl Rendezvous {
    /// Reads the process environment: `HYPERCOMM_*`, then torchrun, Open MPI, SLURM and PMI variables, as in
    /// [`Rendezvous::from_vars`].
    pub fn from_env() -> Result<Self, RendezvousError> {
        Rendezvous::from_vars(&|name| std::env::var(name).ok())
    }

    /// Reads variables through `vars` (name → value), so tests and embedders need not touch the process
    /// environment.
    ///
    /// The first source whose rank or world-size variable is set is used, in this order: `HYPERCOMM_RANK` /
    /// `HYPERCOMM_WORLD_SIZE` / `HYPERCOMM_LOCAL_RANK` / `HYPERCOMM_LOCAL_WORLD_SIZE`; torchrun's `RANK` /
    /// `WORLD_SIZE` / `LOCAL_RANK` / `LOCAL_WORLD_SIZE`; Open MPI's `OMPI_COMM_WORLD_RANK` / `_SIZE` /
    /// `_LOCAL_RANK` / `_LOCAL_SIZE`; SLURM's `SLURM_PROCID` / `SLURM_NTASKS` / `SLURM_LOCALID` /
    /// `SLURM_TASKS_PER_NODE` at `SLURM_NODEID`; PMI's `PMI_RANK` / `PMI_SIZE` / `MPI_LOCALRANKID` / `MPI_LOCALNRANKS`. The
    /// store address is [`STORE_ADDR_ENV`] or `MASTER_ADDR` and `MASTER_PORT`.
    pub fn from_vars(vars: &impl Fn(&str) -> Option<String>) -> Result<Self, RendezvousError> {
        let names = present(vars).ok_or(RendezvousError::NoSource)?;
        let source = names.source;
        let required = |var: &'static str| -> Result<String, RendezvousError> {
            vars(var).ok_or_else(|| RendezvousError::Missing {
                launcher: source,
                var: var.to_owned(),
            })
        };
        let number = |var: &'static str| -> Result<usize, RendezvousError> {
            let value = required(var)?;
            parse_count(var, &value)
        };
        let rank = number(names.rank)?;
        let world_size = number(names.world)?;
        let local_rank = number(names.local_rank)?;
        let local_world_size = if source == EnvSource::Slurm {
            slurm_local_world(vars)?
        } else {
            number(names.local_world)?
        };
        let check = |ok: bool, msg: String| {
            if ok {
                Ok(())
            } else {
                Err(RendezvousError::Contradiction(msg))
            }
        };
        check(
            world_size > 0,
            format!("{}=0: a job has at least one process", names.world),
        )?;
        check(
            rank < world_size,
            format!(
                "{}={rank} is not below {}={world_size}",
                names.rank, names.world
            ),
        )?;
        check(
            local_rank < local_world_size,
            format!(
                "{}={local_rank} is not below the local world size {local_world_size} ({})",
                names.local_rank, names.local_world
            ),
        )?;
        check(
            local_world_size <= world_size,
            format!(
                "local world size {local_world_size} ({}) exceeds {}={world_size}",
                names.local_world, names.world
            ),
        )?;
        Ok(Rendezvous {
            rank,
            world_size,
            local_rank,
            local_world_size,
            store_addr: store_addr(vars, source)?,
            secret: Secret::from_vars(vars)?,
            relay: relay_addr(vars)?,
            source,
            comm_timeout: comm_timeout(vars)?,
        })
    }

    /// Whether this process should host the store server: rank 0, unless `hypercomm launch` (which hosts it
    /// itself) started the job.
    pub fn hosts_store(&self) -> bool {
        self.rank == 0 && self.source != EnvSource::Hypercomm
    }

    /// Client options carrying this job's secret.
    pub fn client_options(&self) -> ClientOptions {
        ClientOptions::default().with_secret(self.secret.clone())
    }

    /// Joins the job's store: starts the server first when [`Rendezvous::hosts_store`], then connects a client
    /// (retrying until `options.connect_timeout`, so ranks may start in any order) to this node's relay when the
    /// launcher started one, or else to the store itself.
    pub fn join(&self, options: ClientOptions) -> Result<Joined, RendezvousError> {
        let server = if self.hosts_store() {
            let server_options = ServerOptions {
                secret: self.secret.clone(),
                max_frame: options.max_frame,
                ..ServerOptions::default()
            };
            Some(TcpStoreServer::bind(
                self.store_addr.to_string(),
                server_options,
            )?)
        } else {
            None
        };
        let store = match &self.relay {
            Some((relay, node)) => {
                TcpStore::connect(NodeRelay::new(relay.clone(), *node), options)?
            }
            None => TcpStore::connect(self.store_addr.to_string(), options)?,
        };
        Ok(Joined { store, server })
    }
}

fn parse_count(var: &str, value: &str) -> Result<usize, RendezvousError> {
    value
        .trim()
        .parse::<usize>()
        .map_err(|_| RendezvousError::Invalid {
            var: var.to_owned(),
            value: value.to_owned(),
            expected: "a non-negative integer".to_owned(),
        })
}

/// This node's task count from `SLURM_TASKS_PER_NODE` (`"4(x2),3"`: two nodes of 4, one of 3) at `SLURM_NODEID`.
fn slurm_local_world(vars: &impl Fn(&str) -> Option<String>) -> Result<usize, RendezvousError> {
    const VAR: &str = "SLURM_TASKS_PER_NODE";
    let missing = |var: &str| RendezvousError::Missing {
        launcher: EnvSource::Slurm,
        var: var.to_owned(),
    };
    let spec = vars(VAR).ok_or_else(|| missing(VAR))?;
    let invalid = || RendezvousError::Invalid {
        var: VAR.to_owned(),
        value: spec.clone(),
        expected: "a list like 4(x2),3".to_owned(),
    };
    let mut per_node = Vec::new();
    for group in spec.split(',') {
        let (count, repeat) = match group.split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')').ok_or_else(invalid)?),
            None => (group, "1"),
        };
        let count: usize = count.trim().parse().map_err(|_| invalid())?;
        let repeat: usize = repeat.trim().parse().map_err(|_| invalid())?;
        // Bounded by the node count SLURM itself wrote; refuse absurd repeat counts rather than allocate them.
        if repeat > 1 << 20 || per_node.len() + repeat > 1 << 20 {
            return Err(invalid());
        }
        per_node.extend(std::iter::repeat_n(count, repeat));
    }
    let node = match vars("SLURM_NODEID") {
        Some(v) => parse_count("SLURM_NODEID", &v)?,
        None if per_node.len() == 1 => 0,
        None => return Err(missing("SLURM_NODEID")),
    };
    per_node.get(node).copied().ok_or_else(|| {
        RendezvousError::Contradiction(format!(
            "SLURM_NODEID={node} but {VAR}={spec:?} lists only {} node(s)",
            per_node.len()
        ))
    })
}

/// The communicator timeout from [`COMM_TIMEOUT_ENV`]: a positive, finite number of seconds.
fn comm_timeout(
    vars: &impl Fn(&str) -> Option<String>,
) -> Result<Option<Duration>, RendezvousError> {
    let Some(value) = vars(COMM_TIMEOUT_ENV) else {
        return Ok(None);
    };
    match value.trim().parse::<f64>().map(Duration::try_from_secs_f64) {
        Ok(Ok(timeout)) if !timeout.is_zero() => Ok(Some(timeout)),
        _ => Err(RendezvousError::Invalid {
            var: COMM_TIMEOUT_ENV.to_owned(),
            value,
            expected: "a positive number of seconds".to_owned(),
        }),
    }
}

/// This node's relay and the node's index, when the launcher started a relay.
fn relay_addr(
    vars: &impl Fn(&str) -> Option<String>,
) -> Result<Option<(StoreAddr, usize)>, RendezvousError> {
    let Some(value) = vars(RELAY_ADDR_ENV) else {
        return Ok(None);
    };
    let addr = value
        .parse()
        .map_err(|reason: String| RendezvousError::Invalid {
            var: RELAY_ADDR_ENV.to_owned(),
            value,
            expected: format!("host:port ({reason})"),
        })?;
    let node = match vars("HYPERCOMM_NODE_RANK") {
        Some(v) => parse_count("HYPERCOMM_NODE_RANK", &v)?,
        None => 0,
    };
    Ok(Some((addr, node)))
}

fn store_addr(
    vars: &impl Fn(&str) -> Option<String>,
    source: EnvSource,
) -> Result<StoreAddr, RendezvousError> {
    if let Some(value) = vars(STORE_ADDR_ENV) {
        return value
            .parse()
            .map_err(|reason: String| RendezvousError::Invalid {
                var: STORE_ADDR_ENV.to_owned(),
                value,
                expected: format!("host:port ({reason})"),
            });
    }
    match (vars("MASTER_ADDR"), vars("MASTER_PORT")) {
        (Some(host), Some(port)) => {
            let port = port
                .trim()
                .parse::<u16>()
                .map_err(|_| RendezvousError::Invalid {
                    var: "MASTER_PORT".to_owned(),
                    value: port.clone(),
                    expected: "a port number from 0 to 65535".to_owned(),
                })?;
            if host.is_empty() {
                return Err(RendezvousError::Invalid {
                    var: "MASTER_ADDR".into(),
                    value: host,
                    expected: "a host name or address".into(),
                });
            }
            Ok(StoreAddr { host, port })
        }
        (Some(_), None) => Err(RendezvousError::Missing {
            launcher: source,
            var: "MASTER_PORT".into(),
        }),
        (None, Some(_)) => Err(RendezvousError::Missing {
            launcher: source,
            var: "MASTER_ADDR".into(),
        }),
        (None, None) => Err(RendezvousError::Missing {
            launcher: source,
            var: format!("{STORE_ADDR_ENV} (or MASTER_ADDR and MASTER_PORT)"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn read(pairs: &[(&str, &str)]) -> Result<Rendezvous, RendezvousError> {
        Rendezvous::from_vars(&vars(pairs))
    }

    const ADDR: (&str, &str) = ("HYPERCOMM_STORE_ADDR", "127.0.0.1:29500");

    #[test]
    fn each_source_is_recognised() {
        let cases: [(&[(&str, &str)], EnvSource); 5] = [
            (
                &[
                    ("HYPERCOMM_RANK", "1"),
                    ("HYPERCOMM_WORLD_SIZE", "4"),
                    ("HYPERCOMM_LOCAL_RANK", "1"),
                    ("HYPERCOMM_LOCAL_WORLD_SIZE", "2"),
                    ADDR,
                ],
                EnvSource::Hypercomm,
            ),
            (
                &[
                    ("RANK", "1"),
                    ("WORLD_SIZE", "4"),
                    ("LOCAL_RANK", "1"),
                    ("LOCAL_WORLD_SIZE", "2"),
                    ADDR,
                ],
                EnvSource::Torchrun,
            ),
            (
                &[
                    ("SLURM_PROCID", "1"),
                    ("SLURM_NTASKS", "4"),
                    ("SLURM_LOCALID", "1"),
                    ("SLURM_TASKS_PER_NODE", "2(x2)"),
                    ("SLURM_NODEID", "0"),
                    ADDR,
                ],
                EnvSource::Slurm,
            ),
            (
                &[
                    ("OMPI_COMM_WORLD_RANK", "1"),
                    ("OMPI_COMM_WORLD_SIZE", "4"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
                    ADDR,
                ],
                EnvSource::OpenMpi,
            ),
            (
                &[
                    ("PMI_RANK", "1"),
                    ("PMI_SIZE", "4"),
                    ("MPI_LOCALRANKID", "1"),
                    ("MPI_LOCALNRANKS", "2"),
                    ADDR,
                ],
                EnvSource::Pmi,
            ),
        ];
        for (pairs, source) in cases {
            let rdv = read(pairs).unwrap();
            assert_eq!(rdv.source, source);
            assert_eq!(
                (
                    rdv.rank,
                    rdv.world_size,
                    rdv.local_rank,
                    rdv.local_world_size
                ),
                (1, 4, 1, 2),
                "{source}"
            );
            assert_eq!(rdv.store_addr.to_string(), "127.0.0.1:29500");
        }
    }

    #[test]
    fn detect_finds_each_launcher_by_its_rank_or_its_world_size_alone() {
        for names in &SOURCES {
            for var in [names.rank, names.world] {
                assert_eq!(
                    EnvSource::detect_in(&vars(&[(var, "3")])),
                    Some(names.source),
                    "{var}"
                );
            }
            // The local variables alone do not make a launcher present, as for from_vars.
            let local = [(names.local_rank, "0"), (names.local_world, "1")];
            assert_eq!(
                EnvSource::detect_in(&vars(&local)),
                None,
                "{}",
                names.source
            );
        }
        assert_eq!(EnvSource::detect_in(&vars(&[ADDR])), None);
    }

    #[test]
    fn detect_agrees_with_from_vars_on_priority_and_on_incomplete_sources() {
        // Under `srun torchrun` and `mpirun` inside a SLURM job, several launchers' variables are set at once; the
        // inner launcher's are the ones that describe the process.
        let torchrun_in_slurm = [
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_TASKS_PER_NODE", "1(x2)"),
            ADDR,
        ];
        let mpirun_in_slurm = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_TASKS_PER_NODE", "1"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "8"),
            ADDR,
        ];
        for (pairs, inner) in [
            (&torchrun_in_slurm[..], EnvSource::Torchrun),
            (&mpirun_in_slurm[..], EnvSource::OpenMpi),
        ] {
            assert_eq!(EnvSource::detect_in(&vars(pairs)), Some(inner));
            assert_eq!(read(pairs).unwrap().source, inner);
        }
        // Present but incomplete: detect says which launcher, from_vars says what is missing.
        let incomplete = [("OMPI_COMM_WORLD_SIZE", "8")];
        assert_eq!(
            EnvSource::detect_in(&vars(&incomplete)),
            Some(EnvSource::OpenMpi)
        );
        assert!(matches!(
            read(&incomplete),
            Err(RendezvousError::Missing { .. })
        ));
    }

    #[test]
    fn higher_priority_source_wins_when_both_are_complete() {
        let rdv = read(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_TASKS_PER_NODE", "1(x2)"),
            ADDR,
        ])
        .unwrap();
        assert_eq!(rdv.source, EnvSource::Torchrun);
        assert_eq!(rdv.rank, 5);
    }

    #[test]
    fn partial_source_names_the_missing_variable() {
        let err = read(&[
            ("RANK", "0"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "1"),
            ADDR,
        ])
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "torchrun environment is incomplete: WORLD_SIZE is not set"
        );
        let err = read(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ADDR,
        ])
        .unwrap_err();
        assert!(
            err.to_string().contains("OMPI_COMM_WORLD_LOCAL_SIZE"),
            "{err}"
        );
    }

    #[test]
    fn contradictions_name_both_variables() {
        let err = read(&[
            ("RANK", "4"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "1"),
            ADDR,
        ])
        .unwrap_err();
        assert_eq!(err.to_string(), "RANK=4 is not below WORLD_SIZE=4");
        let err = read(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
            ADDR,
        ])
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("LOCAL_RANK=2 is not below the local world size 2"),
            "{err}"
        );
        let err = read(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "3"),
            ADDR,
        ])
        .unwrap_err();
        assert!(err.to_string().contains("exceeds WORLD_SIZE=2"), "{err}");
    }

    #[test]
    fn unparsable_numbers_are_named_with_their_value() {
        let err = read(&[
            ("RANK", "zero"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "1"),
            ADDR,
        ])
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "RANK=\"zero\" is not a non-negative integer"
        );
    }

    #[test]
    fn store_address_sources_and_errors() {
        let base = [
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "1"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut all = base.to_vec();
            all.extend_from_slice(extra);
            read(&all)
        };
        let rdv = with(&[("MASTER_ADDR", "node0"), ("MASTER_PORT", "1234")]).unwrap();
        assert_eq!(
            rdv.store_addr,
            StoreAddr {
                host: "node0".into(),
                port: 1234
            }
        );
        // HYPERCOMM_STORE_ADDR overrides MASTER_*.
        let rdv = with(&[
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "1234"),
            ("HYPERCOMM_STORE_ADDR", "[::1]:99"),
        ])
        .unwrap();
        assert_eq!(rdv.store_addr.host, "::1");
        assert_eq!(rdv.store_addr.to_string(), "[::1]:99");
        let err = with(&[("MASTER_ADDR", "node0")]).unwrap_err();
        assert!(err.to_string().contains("MASTER_PORT is not set"), "{err}");
        let err = with(&[]).unwrap_err();
        assert!(err.to_string().contains("HYPERCOMM_STORE_ADDR"), "{err}");
        let err = with(&[("HYPERCOMM_STORE_ADDR", "node0:http")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("HYPERCOMM_STORE_ADDR=\"node0:http\""),
            "{err}"
        );
    }

    #[test]
    fn slurm_tasks_per_node_is_read_at_this_node() {
        let base = [
            ("SLURM_PROCID", "9"),
            ("SLURM_NTASKS", "11"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_TASKS_PER_NODE", "4(x2),3"),
            ADDR,
        ];
        let at = |node: &'static str| {
            let mut all = base.to_vec();
            all.push(("SLURM_NODEID", node));
            read(&all)
        };
        assert_eq!(at("0").unwrap().local_world_size, 4);
        assert_eq!(at("2").unwrap().local_world_size, 3);
        let err = at("3").unwrap_err();
        assert!(err.to_string().contains("lists only 3 node(s)"), "{err}");
        let err = read(&base).unwrap_err();
        assert!(err.to_string().contains("SLURM_NODEID is not set"), "{err}");
    }

    #[test]
    fn nothing_set_is_a_clear_error() {
        let err = read(&[]).unwrap_err();
        assert!(matches!(err, RendezvousError::NoSource));
        assert!(err.to_string().contains("HYPERCOMM_RANK"), "{err}");
    }

    #[test]
    fn hosting_rule() {
        let torch = read(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "2"),
            ADDR,
        ])
        .unwrap();
        assert!(torch.hosts_store());
        let launched = read(&[
            ("HYPERCOMM_RANK", "0"),
            ("HYPERCOMM_WORLD_SIZE", "2"),
            ("HYPERCOMM_LOCAL_RANK", "0"),
            ("HYPERCOMM_LOCAL_WORLD_SIZE", "2"),
            ADDR,
        ])
        .unwrap();
        assert!(!launched.hosts_store());
    }

    #[test]
    fn the_launchers_communicator_timeout_is_read_and_checked() {
        let base = [
            ("HYPERCOMM_RANK", "0"),
            ("HYPERCOMM_WORLD_SIZE", "2"),
            ("HYPERCOMM_LOCAL_RANK", "0"),
            ("HYPERCOMM_LOCAL_WORLD_SIZE", "2"),
            ADDR,
        ];
        assert_eq!(read(&base).unwrap().comm_timeout, None);
        let with = |value: &'static str| {
            let mut pairs = base.to_vec();
            pairs.push((COMM_TIMEOUT_ENV, value));
            read(&pairs)
        };
        assert_eq!(
            with("2.5").unwrap().comm_timeout,
            Some(Duration::from_millis(2500))
        );
        assert_eq!(
            with(" 300 ").unwrap().comm_timeout,
            Some(Duration::from_secs(300))
        );
        for bad in ["0", "-1", "soon", "inf", "NaN", ""] {
            let err = with(bad).unwrap_err();
            assert!(
                err.to_string()
                    .contains(&format!("HYPERCOMM_COMM_TIMEOUT_SECS={bad:?}")),
                "{bad}: {err}"
            );
        }
    }
}
