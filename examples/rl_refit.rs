//! An RL job's weight refit end to end on the host backend: 12 ranks as 12 processes.
//!
//! - a trainer on ranks 0-7 (tp 2, pp 2, dp 2) holding a 4-layer model of `hypercomm::candle` tensor-parallel MLP
//!   blocks, two layers per pipeline stage, each rank its shards (`ParallelMlp::from_full`);
//! - two inference engines on ranks 8-11 (tp 2 each; one layout `tp=2,dp=2`), each rank holding every layer's
//!   shards as candle variables, zero at first (`ParallelMlp::new` over `from_shards`);
//! - a refit group of all 12 ranks (`RefitGroup`, namespace `rl`, epoch 1) over which the plan runs.
//!
//! Each side describes its model from its own layers (`param_shardings`); the descriptions are gathered over the
//! refit group, so every rank builds the same plan. Then, 5 times: the trainer changes its weights (an update on
//! every shard), the refit runs (one batch of sends and receives per bucket, written straight into the engines'
//! variables: `hypercomm::candle::refit::TensorShards`), and every engine rank checks every byte of its shards
//! against the full model, recomputed on its own. Rank 0 prints the bytes moved and the time of each refit.
//!
//! Run with `cargo run --features candle --example rl_refit [-- --bucket BYTES --refits N]`. Started by hand it
//! launches itself as 12 ranks; under a launcher (`hypercomm launch -n 12`, torchrun) it runs as one rank.

mod support;

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm::candle::TensorGroup;
use hypercomm::candle::candle_core::{DType, Device, Tensor, Var};
use hypercomm::candle::candle_nn::Activation;
use hypercomm::candle::refit::TensorShards;
use hypercomm::candle::tp::{ColumnParallelLinear, MlpWeights, ParallelMlp, RowParallelLinear};
use hypercomm::comm::{Communicator, ReduceOp, as_bytes};
use hypercomm::grid::layout::{LayoutConfig, ParallelLayout};
use hypercomm::pgc::ProcessGroupCollection;
use hypercomm::refit::{
    ParamSharding, Peer, Place, PlanOptions, Refit, RefitGroup, RefitGroupOptions, RefitPlan,
    Sharding, Side, Summary, format_bytes,
};
use hypercomm::store::{EnvSource, Rendezvous, Store};

use support::Lcg;

const TRAINER: usize = 8;
const ENGINES: usize = 4;
const LAYERS: usize = 4;
const HIDDEN: usize = 256;
const FFN: usize = 1024;
const TIMEOUT: Duration = Duration::from_secs(60);

struct Args {
    bucket: u64,
    refits: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        bucket: 1 << 20,
        refits: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let number = value
            .parse()
            .map_err(|_| format!("{flag} {value:?} is not a number"))?;
        match flag.as_str() {
            "--bucket" => args.bucket = number,
            "--refits" => args.refits = number,
            other => return Err(format!("unknown flag {other} (--bucket BYTES, --refits N)")),
        }
    }
    Ok(args)
}

fn main() -> Result<(), Box<dyn Error>> {
    let args = parse_args()?;
    if EnvSource::detect().is_none() {
        let forwarded: Vec<String> = std::env::args().skip(1).collect();
        return support::launch_self(&forwarded, TRAINER + ENGINES);
    }
    rank_main(&args)
}

/// Layer `layer`'s full weights after `step` updates: `[fc1 weight, fc1 bias, fc2 weight, fc2 bias]`, drawn from
/// the seeded generator, then updated as the trainer updates its shards (element by element, so the same on a
/// shard and on the whole tensor).
fn full_weights(layer: usize, step: u64) -> Result<[Tensor; 4], Box<dyn Error>> {
    let mut lcg = Lcg::new(7, layer as u64);
    let [w1, b1] = lcg.layer(FFN, HIDDEN)?;
    let [w2, b2] = lcg.layer(HIDDEN, FFN)?;
    let mut full = [w1, b1, w2, b2].map(Var::into_inner);
    for s in 1..=step {
        for t in &mut full {
            *t = update(t, s)?;
        }
    }
    Ok(full)
}

/// The trainer's update at step `step`, on a shard or on a whole tensor.
fn update(t: &Tensor, step: u64) -> Result<Tensor, Box<dyn Error>> {
    Ok(t.affine(0.5, 0.125 * step as f64)?)
}

/// The refit's name of layer `layer`'s block.
fn prefix(layer: usize) -> String {
    format!("layers.{layer}.mlp")
}

fn rank_main(args: &Args) -> Result<(), Box<dyn Error>> {
    let rendezvous = Rendezvous::from_env()?;
    let rank = rendezvous.rank;
    if rendezvous.world_size != TRAINER + ENGINES {
        return Err(format!(
            "this example needs {} ranks, got {}",
            TRAINER + ENGINES,
            rendezvous.world_size
        )
        .into());
    }
    let store: Arc<dyn Store> = Arc::new(rendezvous.join(rendezvous.client_options())?.store);
    let trainer = LayoutConfig::new(TRAINER).tp(2).pp(2).build()?;
    let engines = LayoutConfig::new(ENGINES)
        .tp(2)
        .rank_offset(TRAINER)
        .build()?;

    // This rank's model: the trainer's stage, or an engine's every layer; each job's collection has its own name.
    let (layout, name) = if rank < TRAINER {
        (&trainer, "trainer")
    } else {
        (&engines, "engines")
    };
    let pgc = Arc::new(
        ProcessGroupCollection::for_layout(name, layout.clone())
            .with_timeout(TIMEOUT)
            .build(rank, Arc::clone(&store))?,
    );
    let tp = TensorGroup::kind(&pgc, "tp")?;
    let blocks: Vec<(usize, ParallelMlp)> = if rank < TRAINER {
        let stage = trainer.decoder().coord(rank, "pp")?;
        let per_stage = LAYERS / 2;
        (stage * per_stage..(stage + 1) * per_stage)
            .map(|l| {
                let [w1, b1, w2, b2] = full_weights(l, 0)?;
                let weights = MlpWeights {
                    fc1_weight: &w1,
                    fc1_bias: Some(&b1),
                    fc2_weight: &w2,
                    fc2_bias: Some(&b2),
                };
                Ok((
                    l,
                    ParallelMlp::from_full(weights, Activation::Silu, tp.clone())?,
                ))
            })
            .collect::<Result<_, Box<dyn Error>>>()?
    } else {
        let zeros = |shape: &[usize]| Var::zeros(shape, DType::F32, &Device::Cpu);
        (0..LAYERS)
            .map(|l| {
                let fc1 = ColumnParallelLinear::from_shards(
                    zeros(&[FFN / 2, HIDDEN])?,
                    Some(zeros(&[FFN / 2])?),
                    tp.clone(),
                )?;
                let fc2 = RowParallelLinear::from_shards(
                    zeros(&[HIDDEN, FFN / 2])?,
                    Some(zeros(&[HIDDEN])?),
                    tp.clone(),
                )?;
                Ok((l, ParallelMlp::new(fc1, Activation::Silu, fc2)))
            })
            .collect::<Result<_, Box<dyn Error>>>()?
    };

    // The refit group, and the plan every rank builds from both sides' descriptions of their layers.
    let options = RefitGroupOptions::new("rl", 1).timeout(TIMEOUT);
    let group = RefitGroup::join(Arc::clone(&store), options, TRAINER, ENGINES, rank)?;
    let comm = group.comm()?;
    let mut described = Vec::new();
    for (l, block) in &blocks {
        described.extend(block.param_shardings(&prefix(*l), Place::Layer(*l))?);
    }
    let [from, to] = gather_shardings(comm, &described)?;
    let plan = RefitPlan::build(
        Side::new(&trainer, &from),
        Side::new(&engines, &to),
        PlanOptions::default().bucket_bytes(args.bucket),
    )?;
    let me = if rank < TRAINER {
        Peer::Source(rank)
    } else {
        Peer::Destination(rank)
    };
    let vars: Vec<(String, Var)> = blocks
        .iter()
        .flat_map(|(l, block)| {
            let names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"];
            names
                .map(|n| format!("{}.{n}", prefix(*l)))
                .into_iter()
                .zip(block.vars())
        })
        .collect();
    let mut shards = TensorShards::new(
        &plan,
        vars.iter().map(|(n, v)| (n.clone(), v.as_tensor().clone())),
    )?;
    let mut refit = Refit::new(&plan, me)?;

    if rank == 0 {
        let summary = Summary::of(&plan);
        println!(
            "plan: {} parameters from {} to {}, {} moved in {} bucket(s) of at most {}; broadcasting every full \
             tensor from rank 0 would send {}",
            summary.params,
            summary.source,
            summary.destination,
            format_bytes(summary.moved),
            summary.buckets,
            format_bytes(summary.bucket_bytes),
            format_bytes(summary.baseline.bytes)
        );
    }
    for step in 1..=args.refits {
        if rank < TRAINER {
            for (_, var) in &vars {
                var.set(&update(var.as_tensor(), step)?)?;
            }
        }
        comm.barrier()?.wait()?;
        let started = Instant::now();
        let stats = group.run(&mut refit, &mut shards)?;
        let took = started.elapsed().as_secs_f64();
        let wrong = if rank < TRAINER {
            0
        } else {
            check(&to, &engines, rank, &vars, step)?
        };
        let totals = comm
            .all_reduce(vec![stats.sent, wrong], ReduceOp::Sum)?
            .wait()?;
        let slowest = comm.all_reduce(vec![took], ReduceOp::Max)?.wait()?[0];
        if totals[1] != 0 {
            return Err(format!(
                "refit {step}: {} bytes differ from the full model",
                totals[1]
            )
            .into());
        }
        if rank == 0 {
            println!(
                "refit {step}: {} moved in {:.1} ms ({:.2} GB/s); every engine byte checked",
                format_bytes(totals[0]),
                slowest * 1e3,
                totals[0] as f64 / slowest / 1e9
            );
        }
    }
    if rank == 0 {
        println!(
            "engines: every byte of every shard equals the full model after each of {} refits",
            args.refits
        );
    }
    // Nobody leaves while a peer may still be reading: a last barrier over all ranks.
    comm.barrier()?.wait()?;
    Ok(())
}

/// Every rank's description of its layers, gathered over the refit group: the trainer's sharding and the engines'
/// (each the union of its ranks' parameters, in rank order, so every rank builds the same plan).
fn gather_shardings(
    comm: &Communicator,
    mine: &[ParamSharding],
) -> Result<[Sharding; 2], Box<dyn Error>> {
    let bytes = serde_json::to_vec(mine)?;
    let (_, lens) = comm
        .all_gather_into(vec![bytes.len() as u64], vec![0u64; comm.size()])?
        .wait()?;
    let counts: Vec<usize> = lens.iter().map(|&l| l as usize).collect();
    let total = counts.iter().sum();
    let (_, all) = comm
        .all_gather_v(bytes, vec![0u8; total], counts.clone())?
        .wait()?;
    let mut sides = [Sharding::new(LAYERS, 0), Sharding::new(LAYERS, 0)];
    let mut at = 0;
    for (r, count) in counts.into_iter().enumerate() {
        let params: Vec<ParamSharding> = serde_json::from_slice(&all[at..at + count])?;
        at += count;
        let side = &mut sides[usize::from(r >= TRAINER)];
        for p in params {
            match side.params.iter().find(|q| q.name == p.name) {
                Some(q) if *q != p => {
                    return Err(
                        format!("rank {r} describes {} otherwise: {p:?} vs {q:?}", p.name).into(),
                    );
                }
                Some(_) => {}
                None => side.push(p),
            }
        }
    }
    Ok(sides)
}

/// How many bytes of this engine rank's shards differ from its shards of the full model after `step` updates.
fn check(
    sharding: &Sharding,
    engines: &ParallelLayout,
    rank: usize,
    vars: &[(String, Var)],
    step: u64,
) -> Result<u64, Box<dyn Error>> {
    let mut wrong = 0;
    for l in 0..LAYERS {
        let full = full_weights(l, step)?;
        for (t, part) in ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
            .iter()
            .enumerate()
        {
            let name = format!("{}.{part}", prefix(l));
            let param = sharding
                .params
                .iter()
                .find(|p| p.name == name)
                .ok_or(format!("no parameter {name}"))?;
            let whole = full[t].flatten_all()?.to_vec1::<f32>()?;
            let want = sharding
                .local_shard(param, engines, rank, as_bytes(&whole))?
                .ok_or(format!("rank {rank} holds no {name}"))?;
            let var = &vars
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or(format!("rank {rank} has no variable {name}"))?
                .1;
            let got = var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
            wrong += as_bytes(&got)
                .iter()
                .zip(&want)
                .filter(|(a, b)| a != b)
                .count() as u64;
            wrong += (want.len() as u64).abs_diff(as_bytes(&got).len() as u64);
        }
    }
    Ok(wrong)
}
