//! An RL pipeline's process groups, end to end on the host backend: 8 ranks as 8 processes.
//!
//! - a policy model on ranks 0-3 (tp 2, dp 2),
//! - a reference model on ranks 4-7 (tp 4),
//! - a weight-sync group joining policy rank 0 with the reference ranks.
//!
//! Each model is its own `ProcessGroupCollection`, namespaced by its name, so the collections never collide in the
//! store. The program checks every collective's result.
//!
//! Run with `cargo run --example rl_pipeline`. Started by hand it launches itself as 8 ranks (through
//! `hypercomm::launch::Launcher`); under any launcher `Rendezvous::from_env` reads (`hypercomm launch -n 8`,
//! torchrun, `srun -n 8`, `mpirun -n 8`) it runs as one rank of that launcher's job. Under srun and mpirun, export
//! the store's address as `HYPERCOMM_STORE_ADDR=host:port` (rank 0 hosts the store there).

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use hypercomm::comm::ReduceOp;
use hypercomm::grid::layout::LayoutConfig;
use hypercomm::launch::Launcher;
use hypercomm::pgc::{GroupId, ProcessGroupCollection};
use hypercomm::store::{EnvSource, Rendezvous, Store};

const WORLD: usize = 8;
const TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> Result<(), Box<dyn Error>> {
    if EnvSource::detect().is_none() {
        let report = Launcher::new(std::env::current_exe()?)
            .nproc(WORLD)
            .timeout(Duration::from_secs(120))
            .run()?;
        println!("{}", report.summary());
        return if report.success() {
            Ok(())
        } else {
            Err("a rank failed".into())
        };
    }
    rank_main()
}

fn rank_main() -> Result<(), Box<dyn Error>> {
    let rendezvous = Rendezvous::from_env()?;
    let rank = rendezvous.rank;
    if rendezvous.world_size != WORLD {
        return Err(format!(
            "this example needs {WORLD} ranks, got {}",
            rendezvous.world_size
        )
        .into());
    }
    let joined = rendezvous.join(rendezvous.client_options())?;
    let store: Arc<dyn Store> = Arc::new(joined.store);

    // The model this rank serves.
    let (model, layout) = if rank < 4 {
        ("policy", LayoutConfig::new(4).tp(2).build()?)
    } else {
        (
            "reference",
            LayoutConfig::new(4).tp(4).rank_offset(4).build()?,
        )
    };
    let pgc = ProcessGroupCollection::for_layout(model, layout)
        .with_timeout(TIMEOUT)
        .build(rank, Arc::clone(&store))?;

    // Tensor parallel: all-reduce within the model's tp group.
    let tp = pgc.tp()?;
    let members = tp.ranks().to_vec();
    let sum = tp.all_reduce(vec![rank as f32; 4], ReduceOp::Sum)?.wait()?;
    let want: f32 = members.iter().map(|&r| r as f32).sum();
    check(sum == vec![want; 4], || {
        format!("rank {rank}: {model} tp sum {sum:?}, want {want}")
    })?;

    // Data parallel (policy only: the reference model has dp = 1).
    let dp = pgc.dp()?;
    let avg = dp.all_reduce(vec![rank as f64], ReduceOp::Avg)?.wait()?;
    let want = dp.ranks().iter().map(|&r| r as f64).sum::<f64>() / dp.size() as f64;
    check(avg == vec![want], || {
        format!("rank {rank}: {model} dp average {avg:?}, want {want}")
    })?;

    // Weight sync: policy rank 0 broadcasts its weights to the reference model.
    let sync = ProcessGroupCollection::custom("weight-sync")
        .with_explicit_groups("weights", vec![vec![0, 4, 5, 6, 7]])
        .with_explicit_groups("all", vec![(0..WORLD).collect()])
        .with_timeout(TIMEOUT)
        .build(rank, Arc::clone(&store))?;
    if let Ok(weights) = sync.get(&GroupId::kind("weights")) {
        let mine = if rank == 0 {
            (0..1024).map(|i| i as f32 * 0.5).collect()
        } else {
            vec![0.0f32; 1024]
        };
        let got = weights.broadcast(mine, 0)?.wait()?;
        check(
            got.iter().enumerate().all(|(i, &v)| v == i as f32 * 0.5),
            || format!("rank {rank}: weights not synchronised"),
        )?;
    }
    println!(
        "rank {rank}: {model} tp {members:?} sum ok, dp {:?} average ok{}",
        dp.ranks(),
        if rank == 0 || rank >= 4 {
            ", weights synced"
        } else {
            ""
        }
    );
    // Nobody leaves while a peer may still be reading: a last barrier over all ranks.
    sync.get(&GroupId::kind("all"))?.barrier()?.wait()?;
    Ok(())
}

fn check(ok: bool, message: impl FnOnce() -> String) -> Result<(), Box<dyn Error>> {
    if ok { Ok(()) } else { Err(message().into()) }
}
