//! The refit benchmark: a [`RefitPlan`] run ([`Refit`], one batch of sends and receives per bucket) against the
//! baseline an RL job without a plan uses, gathering each full tensor on source rank 0 and broadcasting it to every
//! destination rank (which keeps its shard), with the same model, on the same ranks, in the same run.
//!
//! The ranks are threads of this process, each with its own communicators over one in-memory store: the `T` source
//! ranks, then the destination ranks, joined in one [`RefitGroup`]; the baseline's broadcast runs on a second
//! communicator of source rank 0 and the destination ranks. Each iteration runs the refit, then the baseline,
//! each started after a barrier; its time is the slowest rank's, and a method's figure the median over the
//! iterations (one warm-up iteration of each is not counted). Bytes moved are what crosses between ranks: the
//! plan's transfers for the refit; the shards rank 0 lacks plus every full tensor once per destination rank for
//! the baseline.
//!
//! The baseline, per parameter in plan order: the first holder of each source shard (rank 0 where it holds one)
//! sends it to rank 0 (one batch), rank 0 writes the shards into the full tensor, broadcasts it, and each
//! destination rank cuts its shard out ([`Sharding::local_shard`]). The buffers' contents are not checked here;
//! the executor's tests and `examples/rl_refit.rs` check every byte.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm_comm::{CommError, CommOptions, Communicator, P2p, ReduceOp};
use hypercomm_refit::{
    ExecError, ParamSharding, Peer, Placement, Refit, RefitError, RefitGroup, RefitGroupOptions,
    RefitPlan, Sharding, plan_peer,
};
use hypercomm_store::{MemoryStore, Store};

use crate::stats::median;

/// What to measure.
#[derive(Debug, Clone)]
pub struct RefitBenchConfig {
    /// The plan (its layouts, options and parameters).
    pub plan: RefitPlan,
    /// The model's sharding the plan was built from (the destination side's).
    pub sharding: Sharding,
    /// Timed iterations of each method.
    pub iters: usize,
    /// Every communicator's timeout.
    pub timeout: Duration,
}

/// One method's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// Bytes moved between ranks per iteration.
    pub bytes: u64,
    /// Each iteration's time, the slowest rank's, in seconds.
    pub seconds: Vec<f64>,
}

impl Measured {
    /// The median iteration time, in seconds.
    pub fn median(&self) -> f64 {
        let times: Vec<Duration> = self
            .seconds
            .iter()
            .map(|&s| Duration::from_secs_f64(s))
            .collect();
        median(&times).unwrap_or(Duration::ZERO).as_secs_f64()
    }

    /// Bytes moved per second at the median, in GB/s (10^9).
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.median().max(f64::MIN_POSITIVE) / 1e9
    }
}

/// Both methods' figures, from one run.
#[derive(Debug, Clone, PartialEq)]
pub struct RefitBenchResult {
    /// The plan run.
    pub refit: Measured,
    /// Gather on source rank 0, broadcast to the destination ranks.
    pub baseline: Measured,
    /// The host transport the refit group ran over (`shm`, `tcp`).
    pub transport: &'static str,
}

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum RefitBenchError {
    /// The refit failed.
    #[error(transparent)]
    Exec(#[from] Box<ExecError>),
    /// The baseline's or the timing's communication failed.
    #[error(transparent)]
    Comm(#[from] Box<CommError>),
    /// The sharding does not fit the plan's layouts.
    #[error(transparent)]
    Plan(#[from] RefitError),
    /// A parameter of the plan that the sharding lacks.
    #[error("the plan's parameter {0:?} is not in the sharding")]
    Missing(String),
    /// A rank's thread panicked.
    #[error("rank {0} panicked")]
    Panicked(usize),
}

impl From<ExecError> for RefitBenchError {
    fn from(e: ExecError) -> Self {
        RefitBenchError::Exec(Box::new(e))
    }
}

impl From<CommError> for RefitBenchError {
    fn from(e: CommError) -> Self {
        RefitBenchError::Comm(Box::new(e))
    }
}

/// Runs the benchmark: every rank a thread.
pub fn run(config: &RefitBenchConfig) -> Result<RefitBenchResult, RefitBenchError> {
    let plan = &config.plan;
    let n = plan.source().world() + plan.destination().world();
    let params = Params::of(config)?;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..n)
            .map(|rank| {
                let (store, params) = (Arc::clone(&store), &params);
                scope.spawn(move || run_rank(config, params, store, rank))
            })
            .collect();
        let mut first = None;
        for (rank, handle) in ranks.into_iter().enumerate() {
            let result = handle
                .join()
                .unwrap_or(Err(RefitBenchError::Panicked(rank)));
            if rank == 0 || result.is_err() {
                first.get_or_insert(result);
            }
        }
        first.unwrap_or(Err(RefitBenchError::Panicked(0)))
    })
}

/// The model's sharding, and each plan parameter's with its placements on both layouts.
struct Params<'a> {
    sharding: &'a Sharding,
    params: Vec<(&'a ParamSharding, Placement, Placement)>,
}

impl<'a> Params<'a> {
    fn of(config: &'a RefitBenchConfig) -> Result<Params<'a>, RefitBenchError> {
        let plan = &config.plan;
        let params = plan
            .params()
            .iter()
            .map(|p| {
                let param = config
                    .sharding
                    .params
                    .iter()
                    .find(|s| s.name == p.name)
                    .ok_or_else(|| RefitBenchError::Missing(p.name.clone()))?;
                Ok((
                    param,
                    config.sharding.placement(param, plan.source())?,
                    config.sharding.placement(param, plan.destination())?,
                ))
            })
            .collect::<Result<_, RefitBenchError>>()?;
        Ok(Params {
            sharding: &config.sharding,
            params,
        })
    }
}

/// This rank's shards (zeros), by plan index: empty where it holds none.
fn shards(params: &Params<'_>, me: Peer) -> Result<Vec<Vec<u8>>, RefitError> {
    params
        .params
        .iter()
        .map(|(param, source, destination)| {
            let placement = match me {
                Peer::Source(_) => source,
                Peer::Destination(_) => destination,
            };
            Ok(match placement.shard_of(me.rank()) {
                Some(_) => vec![0u8; (param.bytes()? / placement.parts) as usize],
                None => Vec::new(),
            })
        })
        .collect()
}

fn run_rank(
    config: &RefitBenchConfig,
    params: &Params<'_>,
    store: Arc<dyn Store>,
    rank: usize,
) -> Result<RefitBenchResult, RefitBenchError> {
    let plan = &config.plan;
    let sources = plan.source().world();
    let me = plan_peer(plan, rank)?;
    let options = RefitGroupOptions::new("bench", 1).timeout(config.timeout);
    let group = RefitGroup::for_plan(Arc::clone(&store), options, plan, me)?;
    let comm = group.comm()?;
    let broadcast = if rank == 0 || rank >= sources {
        let members = std::iter::once(0).chain(sources..comm.size()).collect();
        let options = CommOptions {
            timeout: config.timeout,
            ..CommOptions::named("refit-bench/broadcast")
        };
        Some(Communicator::new(store, members, rank, options)?)
    } else {
        None
    };
    let mut shards = shards(params, me)?;
    let mut refit = Refit::new(plan, me)?;
    let (mut refit_times, mut baseline_times) = (Vec::new(), Vec::new());
    let (mut refit_sent, mut baseline_sent) = (0, 0);
    for iter in 0..=config.iters {
        comm.barrier()?.wait()?;
        let started = Instant::now();
        refit_sent = refit.run(comm, &mut shards)?.sent;
        refit_times.push(started.elapsed().as_secs_f64());
        comm.barrier()?.wait()?;
        let started = Instant::now();
        baseline_sent = baseline(plan, params, comm, broadcast.as_ref(), me, &mut shards)?;
        baseline_times.push(started.elapsed().as_secs_f64());
        if iter == 0 {
            // The warm-up: first touches of every buffer, the transports' first messages.
            refit_times.clear();
            baseline_times.clear();
        }
    }
    let slowest = |times: Vec<f64>| -> Result<Vec<f64>, CommError> {
        comm.all_reduce(times, ReduceOp::Max)?.wait()
    };
    let bytes = comm
        .all_reduce(vec![refit_sent, baseline_sent], ReduceOp::Sum)?
        .wait()?;
    Ok(RefitBenchResult {
        refit: Measured {
            bytes: bytes[0],
            seconds: slowest(refit_times)?,
        },
        baseline: Measured {
            bytes: bytes[1],
            seconds: slowest(baseline_times)?,
        },
        transport: comm.transport(),
    })
}

/// One run of the baseline on this rank; returns the bytes it sent (a destination rank counts what it received
/// from the broadcast, so that the ranks' sum is the bytes moved).
fn baseline(
    plan: &RefitPlan,
    params: &Params<'_>,
    comm: &Communicator,
    broadcast: Option<&Communicator>,
    me: Peer,
    shards: &mut [Vec<u8>],
) -> Result<u64, RefitBenchError> {
    let root = plan.source().ranks().start;
    let mut sent = 0u64;
    for (index, (param, source, destination)) in params.params.iter().enumerate() {
        if destination.holders.iter().all(Vec::is_empty) {
            continue;
        }
        let bytes = param.bytes()? as usize;
        // Who sends each source shard to the root: the root where it holds it, else the shard's first holder.
        let senders: Vec<usize> = source
            .holders
            .iter()
            .filter_map(|h| {
                if h.contains(&root) {
                    Some(root)
                } else {
                    h.first().copied()
                }
            })
            .collect();
        let mut full = Vec::new();
        match me {
            Peer::Source(r) if r == root => {
                full = vec![0u8; bytes];
                let mut parts = Vec::new();
                for &from in senders.iter().filter(|&&s| s != root) {
                    let shard = vec![0u8; bytes / source.parts as usize];
                    parts.push(P2p::recv(shard, from - root));
                }
                let mut received = comm.batch(parts)?.wait()?.into_iter();
                for &from in &senders {
                    let shard = if from == root {
                        std::mem::take(&mut shards[index])
                    } else {
                        received.next().unwrap_or_default()
                    };
                    params.sharding.put_local_shard(
                        param,
                        plan.source(),
                        from,
                        &shard,
                        &mut full,
                    )?;
                    if from == root {
                        shards[index] = shard;
                    }
                }
            }
            Peer::Source(r) if senders.contains(&r) => {
                let shard = std::mem::take(&mut shards[index]);
                sent += shard.len() as u64;
                let back = comm.batch(vec![P2p::send(shard, 0)])?.wait()?;
                shards[index] = back.into_iter().next().unwrap_or_default();
            }
            _ => {}
        }
        let Some(broadcast) = broadcast else {
            continue;
        };
        if let Peer::Destination(d) = me {
            full = vec![0u8; bytes];
            sent += bytes as u64;
            full = broadcast.broadcast(full, 0)?.wait()?;
            let sharding = params.sharding;
            if let Some(mine) = sharding.local_shard(param, plan.destination(), d, &full)? {
                // Both are this rank's shard of the parameter: `shards` made it of the placement's size.
                shards[index].copy_from_slice(&mine);
            }
        } else {
            broadcast.broadcast(full, 0)?.wait()?;
        }
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use hypercomm_refit::{GptConfig, PlanOptions, Side, Split, Summary, parse_layout};

    use super::*;

    #[test]
    fn both_methods_run_and_count_the_bytes_they_move() {
        let sharding = GptConfig::new(1, 32, 64).sharding().unwrap();
        let (from, to) = (
            parse_layout("tp=2").unwrap(),
            parse_layout("tp=1,dp=2").unwrap(),
        );
        let plan = RefitPlan::build(
            Side::new(&from, &sharding),
            Side::new(&to, &sharding),
            PlanOptions::default().bucket_bytes(4096),
        )
        .unwrap();
        let config = RefitBenchConfig {
            plan: plan.clone(),
            sharding: sharding.clone(),
            iters: 2,
            timeout: Duration::from_secs(30),
        };
        let result = run(&config).unwrap();
        assert_eq!(result.refit.bytes, plan.moved_bytes());
        assert_eq!(result.refit.seconds.len(), 2);
        // Rank 1 sends rank 0 half of every split tensor; rank 0 broadcasts every full tensor to both engines.
        let gathered: u64 = sharding
            .params
            .iter()
            .filter(|p| p.split != Split::Replicated)
            .map(|p| p.bytes().unwrap() / 2)
            .sum();
        assert_eq!(
            Summary::of(&plan).baseline.bytes,
            2 * sharding.bytes().unwrap()
        );
        assert_eq!(
            result.baseline.bytes,
            gathered + Summary::of(&plan).baseline.bytes
        );
        assert!(result.refit.gbps() > 0.0 && result.baseline.gbps() > 0.0);
    }
}
