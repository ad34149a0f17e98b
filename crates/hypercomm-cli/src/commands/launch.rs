//! `hypercomm launch`: start the local ranks of a job with rendezvous variables set, and supervise them.

use std::ffi::OsString;
use std::time::Duration;

use hypercomm_launch::{LaunchError, LaunchReport, Launcher};
use hypercomm_store::Secret;

use crate::error::CliError;
use crate::numbers::non_negative;

/// Arguments of `hypercomm launch`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Ranks to start on this node.
    #[arg(short = 'n', long = "nproc-per-node", allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    nproc: usize,
    /// Nodes in the job.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    nnodes: usize,
    /// This node's index, `0..nnodes`; node 0 hosts the store.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    node_rank: usize,
    /// Host the store binds on node 0 and the ranks connect to.
    #[arg(long, default_value = "127.0.0.1")]
    master_addr: String,
    /// Store port (0: a free port, single node only).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = non_negative::<u16>)]
    master_port: u16,
    /// Seconds the other ranks get, after one fails, to report and exit before SIGTERM [default: the
    /// communicator timeout + 15]. Survivors learn of a dead peer at once, but of a peer that never arrived or
    /// stalled only when their communicator timeout runs out; the job ends as soon as every rank has exited.
    #[arg(long, allow_negative_numbers = true)]
    grace_secs: Option<f64>,
    /// The timeout of the ranks' communicators, which the default grace is derived from; exported to every rank
    /// as HYPERCOMM_COMM_TIMEOUT_SECS (Rendezvous::comm_timeout) for the program to use.
    #[arg(long, default_value_t = 300.0, allow_negative_numbers = true)]
    comm_timeout_secs: f64,
    /// Seconds between SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 5.0, allow_negative_numbers = true)]
    kill_after_secs: f64,
    /// Reach the store through a relay on this node (`on`), or directly (`off`). By default a job of several
    /// nodes uses a relay on each node and a single node does not.
    #[arg(long, value_parser = ["on", "off"])]
    relay: Option<String>,
    /// Also set torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
    /// MASTER_PORT), so programs written for torchrun run unchanged.
    #[arg(long)]
    torchrun_env: bool,
    /// Bind each local rank to its own share of the CPUs this launcher may use (contiguous, as equal as they can
    /// be); refused when there are fewer CPUs than ranks. Unbound ranks that wait on each other can end up
    /// sharing one core.
    #[arg(long)]
    bind_cpus: bool,
    /// Stop the whole job after this many seconds.
    #[arg(long, allow_negative_numbers = true)]
    timeout_secs: Option<f64>,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "PROGRAM ARGS")]
    command: Vec<OsString>,
}

/// For the commands whose ranks are copies of this program (the benchmarks' `--processes`): launches `nproc` of
/// them with `args`, each bound to a CPU of its own when `bind_cpus`, their output captured rather than echoed,
/// and waits for all of them (at most `timeout`). `Ok` with the report when every rank exited cleanly; otherwise an
/// error naming what failed (`what`), the launcher's summary and what the ranks wrote to stderr.
pub fn launch_copies(
    args: Vec<String>,
    nproc: usize,
    bind_cpus: bool,
    timeout: Duration,
    what: &str,
) -> Result<LaunchReport, CliError> {
    let program = std::env::current_exe()
        .map_err(|e| CliError::Failed(format!("cannot find this program to launch it: {e}")))?;
    let report = Launcher::new(program)
        .args(args)
        .nproc(nproc)
        .bind_cpus(bind_cpus)
        .echo(false)
        .capture(true)
        .timeout(timeout)
        .run()
        .map_err(|e| CliError::Failed(format!("cannot launch {what}: {e}")))?;
    if report.success() {
        return Ok(report);
    }
    let stderr: Vec<&str> = report
        .ranks
        .iter()
        .flat_map(|r| r.stderr.iter().map(String::as_str))
        .collect();
    Err(CliError::Failed(format!(
        "{what} failed: {}; {}",
        report.summary(),
        stderr.join(" | ")
    )))
}

fn seconds(flag: &str, value: f64) -> Result<Duration, CliError> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        CliError::Usage(format!(
            "--{flag}={value} is not a non-negative number of seconds"
        ))
    })
}

/// Runs the job; when a rank fails, prints the summary and exits with the job's status.
pub fn run(args: Args) -> Result<(), CliError> {
    let Some((program, rest)) = args.command.split_first() else {
        return Err(CliError::Usage("no program given after --".into()));
    };
    let secret = Secret::from_env().map_err(|e| CliError::Usage(e.to_string()))?;
    let mut launcher = Launcher::new(program)
        .args(rest)
        .nproc(args.nproc)
        .nodes(args.nnodes, args.node_rank)
        .master(args.master_addr, args.master_port)
        .comm_timeout(seconds("comm-timeout-secs", args.comm_timeout_secs)?)
        .kill_after(seconds("kill-after-secs", args.kill_after_secs)?)
        .secret(secret)
        .torchrun_env(args.torchrun_env)
        .bind_cpus(args.bind_cpus)
        .forward_signals(true);
    if let Some(relay) = &args.relay {
        launcher = launcher.relay(relay == "on");
    }
    if let Some(grace) = args.grace_secs {
        launcher = launcher.grace(seconds("grace-secs", grace)?);
    }
    if let Some(t) = args.timeout_secs {
        launcher = launcher.timeout(seconds("timeout-secs", t)?);
    }
    let report = launcher.run().map_err(|e| match e {
        LaunchError::Invalid(msg) => CliError::Usage(msg),
        other => CliError::Failed(other.to_string()),
    })?;
    if report.success() {
        eprintln!("hypercomm launch: {}", report.summary());
        Ok(())
    } else {
        // Like torchrun: the job's status (the first failing rank's, 124 on timeout, 128 + N on signal N).
        Err(CliError::Exit {
            code: u8::try_from(report.exit_code().clamp(1, 255)).unwrap_or(1),
            message: report.summary(),
        })
    }
}
