//! `hypercomm bench --processes` for the host collectives: the ranks as processes, the way a training job runs
//! them, instead of threads of one process.
//!
//! This command launches `-n` copies of itself through the launcher (the one behind `hypercomm launch`, which hosts
//! a TCP store and binds each rank to a CPU of its own, as the threads would be: unless `--unpinned`, or there are
//! more ranks than CPUs). Each copy runs with `--bench-worker` and the same benchmark arguments, joins the store,
//! builds its communicator and measures its part (`hypercomm_bench::host::run_rank`); rank 0 prints one line per
//! size (`result <bytes> <microseconds>`), which the launcher captures and this command turns back into the
//! table, JSON and plot of a threads run.

use std::sync::Arc;
use std::time::Duration;

use hypercomm_bench::BenchResult;
use hypercomm_bench::cpus::rank_cpus;
use hypercomm_bench::host::{self, BenchConfig};
use hypercomm_comm::Communicator;
use hypercomm_store::Rendezvous;

use crate::error::CliError;

/// The prefix of rank 0's result lines.
const RESULT: &str = "result";

/// How long the launched ranks may take in all.
const TIMEOUT: Duration = Duration::from_secs(600);

/// Runs one benchmark with the ranks as processes; `worker_args` are the arguments each copy gets after `bench`
/// (the benchmark's own, which must describe `config`). Returns rank 0's results, one per size.
pub fn launch(
    config: &BenchConfig,
    worker_args: Vec<String>,
) -> Result<Vec<BenchResult>, CliError> {
    let mut args = vec!["bench".to_owned(), "--bench-worker".to_owned()];
    args.extend(worker_args);
    let report = super::launch::launch_copies(
        args,
        config.ranks,
        // Bound as threads would be: one CPU each when there are enough, otherwise floating.
        rank_cpus(config.placement, config.ranks).is_some(),
        TIMEOUT,
        "the benchmark ranks",
    )?;
    let rank0 = report
        .ranks
        .iter()
        .find(|r| r.rank == 0)
        .ok_or_else(|| CliError::Failed("rank 0 left no output".into()))?;
    let transport = if config.options.force_tcp {
        "tcp"
    } else {
        "shm"
    };
    let results = rank0
        .stdout
        .iter()
        .filter(|line| line.starts_with(RESULT))
        .map(|line| parse_result(line, config, transport))
        .collect::<Result<Vec<_>, _>>()?;
    if results.len() != config.sizes.len() {
        return Err(CliError::Failed(format!(
            "rank 0 reported {} sizes, expected {}",
            results.len(),
            config.sizes.len()
        )));
    }
    Ok(results)
}

/// One of rank 0's lines, `result <bytes> <microseconds>`, as the result a threads run would have made.
fn parse_result(
    line: &str,
    config: &BenchConfig,
    transport: &'static str,
) -> Result<BenchResult, CliError> {
    let bad = || CliError::Failed(format!("rank 0 printed {line:?}"));
    let mut words = line.split_whitespace().skip(1);
    let bytes: usize = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
    let time_us: f64 = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
    if !config.sizes.contains(&bytes) || !time_us.is_finite() {
        return Err(bad());
    }
    let (input, output) = config.op.buffer_lens(bytes, config.ranks);
    Ok(BenchResult::new(
        config.op,
        config.ranks,
        input.max(output),
        time_us,
        transport,
    ))
}

/// One rank of a `--processes` run: joins the launcher's store, measures its part of `config` and, on rank 0,
/// prints a line per size.
pub fn worker(config: &BenchConfig) -> Result<(), CliError> {
    let failed = |e: &dyn std::fmt::Display| CliError::Failed(e.to_string());
    let rendezvous = Rendezvous::from_env().map_err(|e| failed(&e))?;
    if rendezvous.world_size != config.ranks {
        return Err(CliError::Failed(format!(
            "launched as one of {} ranks, but the benchmark is for -n {}",
            rendezvous.world_size, config.ranks
        )));
    }
    let joined = rendezvous
        .join(rendezvous.client_options())
        .map_err(|e| failed(&e))?;
    let options = host::comm_options(config).map_err(|e| failed(&e))?;
    let comm = Communicator::world(
        Arc::new(joined.store),
        config.ranks,
        rendezvous.rank,
        options,
    )
    .map_err(|e| failed(&e))?;
    let me = rendezvous.rank;
    host::run_rank(config, &comm, &|r| {
        if me == 0 {
            println!("{RESULT} {} {}", r.bytes, r.time_us);
        }
    })
    .map_err(|e| failed(&e))?;
    // Every rank leaves the last collective together, so the store's host may stop it now.
    comm.barrier()
        .and_then(hypercomm_comm::Work::wait)
        .map_err(|e| failed(&e))?;
    drop(joined.server);
    Ok(())
}
