//! The running job: start every local rank with its environment and output pumps, signal the ranks still
//! running, and reap them into [`RankOutcome`]s. What to do while they run is [`supervise`]'s; knowing the order
//! they exited in is [`exit_order`]'s.

mod exit_order;
mod supervise;

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hypercomm_store::{
    COMM_TIMEOUT_ENV, RELAY_ADDR_ENV, SECRET_ENV, STORE_ADDR_ENV, Secret, StoreAddr,
};
use rustix::process::{Pid, Signal};

use crate::config::Launcher;
use crate::output::{Sink, Stream, pump};
use crate::{Exit, LaunchError, RankOutcome};
use exit_order::watch_exit;

/// How long the launcher waits, after the last rank exits, for output still in flight in the pipes.
const DRAIN: Duration = Duration::from_secs(2);

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
pub(crate) struct Job {
    ranks: Vec<Rank>,
    pumps_done: mpsc::Receiver<()>,
    pumps: usize,
    /// `(index in ranks, when)` sent by each rank's exit watcher as soon as the rank exits.
    exits: mpsc::Receiver<(usize, Instant)>,
}

impl Job {
    /// Starts every local rank of `launcher`, each in its own process group with its output pumped and its exit
    /// watched. If one cannot be started, the ones already started are killed and reaped. With `cpus`, local
    /// rank `i` is bound to the CPUs `cpus[i]` before it runs the program.
    pub(crate) fn start(
        launcher: &Launcher,
        store_addr: &StoreAddr,
        relay_addr: Option<&StoreAddr>,
        secret: Option<&Secret>,
        torch_master: Option<&StoreAddr>,
        cpus: Option<&[Vec<usize>]>,
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
                .env(
                    COMM_TIMEOUT_ENV,
                    launcher.comm_timeout.as_secs_f64().to_string(),
                )
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
            // Built here, in the parent: the child only hands it to the kernel.
            let bind = cpus.map(|shares| {
                let mut set = rustix::thread::CpuSet::new();
                shares[local_rank].iter().for_each(|&c| set.set(c));
                set
            });
            // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe calls are
            // allowed. It makes at most two system calls, prctl(PR_SET_PDEATHSIG) and sched_setaffinity on a CPU
            // set built before the fork, through rustix's raw-syscall backend, which neither allocates nor takes
            // locks; the error path converts an errno without allocating.
            unsafe {
                cmd.pre_exec(move || {
                    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
                        .map_err(io::Error::from)?;
                    if let Some(set) = &bind {
                        rustix::thread::sched_setaffinity(None, set).map_err(io::Error::from)?;
                    }
                    Ok(())
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
    pub(crate) fn finish(mut self) -> Vec<RankOutcome> {
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
