//! The executor against an oracle: ranks as threads over one in-memory store, every destination byte compared
//! with the shard cut from the full tensors; the group's namespaces, epochs and store keys.

use std::sync::Arc;
use std::time::Duration;

use hypercomm_grid::layout::ParallelLayout;
use hypercomm_store::{MemoryStore, Store};
use proptest::prelude::*;

use super::*;
use crate::strategies::arb_refit;
use crate::{GptConfig, Peer, PlanOptions, RefitPlan, Sharding, Side, parse_layout};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The full tensor of plan parameter `p` at training step `step`: bytes that differ between parameters, positions
/// and steps.
fn full(plan: &RefitPlan, p: usize, step: u64) -> Vec<u8> {
    (0..plan.params()[p].bytes)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 8) ^ (p as u64 * 7) ^ step.wrapping_mul(101)) as u8)
        .collect()
}

/// Rank `rank`'s shards of every plan parameter on `layout` at `step` (empty where it holds none).
fn shards_of(
    plan: &RefitPlan,
    sharding: &Sharding,
    layout: &ParallelLayout,
    rank: usize,
    step: u64,
) -> Vec<Vec<u8>> {
    plan.params()
        .iter()
        .enumerate()
        .map(|(p, pp)| {
            let param = sharding
                .params
                .iter()
                .find(|s| s.name == pp.name)
                .expect("the plan's parameters are the sharding's");
            sharding
                .local_shard(param, layout, rank, &full(plan, p, step))
                .expect("the layout fits")
                .unwrap_or_default()
        })
        .collect()
}

/// Runs `plan` `steps` times over threads, each time with new weights, and checks every destination byte; returns
/// each rank's stats of the last run.
fn run_threads(
    plan: &RefitPlan,
    sharding: &Sharding,
    namespace: &str,
    steps: u64,
) -> Vec<RefitStats> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let n = plan.source().world() + plan.destination().world();
    std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..n)
            .map(|rank| {
                let store = Arc::clone(&store);
                scope.spawn(move || {
                    let peer = plan_peer(plan, rank).unwrap();
                    let options = RefitGroupOptions::new(namespace, 1).timeout(TIMEOUT);
                    let group = RefitGroup::for_plan(store, options, plan, peer).unwrap();
                    let mut refit = Refit::new(plan, peer).unwrap();
                    let mut stats = RefitStats::default();
                    for step in 0..steps {
                        let mut shards = match peer {
                            Peer::Source(r) => shards_of(plan, sharding, plan.source(), r, step),
                            Peer::Destination(d) => {
                                // Garbage where the shards will land: every byte must be overwritten.
                                shards_of(plan, sharding, plan.destination(), d, 0)
                                    .into_iter()
                                    .map(|s| vec![0xEE; s.len()])
                                    .collect()
                            }
                        };
                        stats = group.run(&mut refit, &mut shards).unwrap();
                        if let Peer::Destination(d) = peer {
                            let want = shards_of(plan, sharding, plan.destination(), d, step);
                            for (p, (got, want)) in shards.iter().zip(&want).enumerate() {
                                assert!(
                                    got == want,
                                    "destination {d}, step {step}: shard of {} differs",
                                    plan.params()[p].name
                                );
                            }
                        }
                        let bucket = plan.options().bucket_bytes as usize;
                        assert!(refit.staging_bytes() <= 2 * bucket);
                    }
                    stats
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

fn plan(from: &str, to: &str, sharding: &Sharding, options: PlanOptions) -> RefitPlan {
    let (from, to) = (parse_layout(from).unwrap(), parse_layout(to).unwrap());
    RefitPlan::build(
        Side::new(&from, sharding),
        Side::new(&to, sharding),
        options,
    )
    .unwrap()
}

#[test]
fn layout_pairs_refit_every_byte_again_and_again() {
    let model = GptConfig::new(2, 64, 256).sharding().unwrap();
    for (from, to, options) in [
        // The shape, forwarding between the engine replicas, in many small buckets.
        (
            "tp=2,pp=2,dp=2",
            "tp=2,dp=2",
            PlanOptions::default().bucket_bytes(8192),
        ),
        // Row-parallel weights re-split (tp 4 into tp 2), every replica served by the trainer.
        (
            "tp=4",
            "tp=2,dp=2",
            PlanOptions::default().bucket_bytes(4096).forward(false),
        ),
        // Stages merged, shards split finer.
        ("tp=2,pp=2", "tp=4", PlanOptions::default()),
    ] {
        let plan = plan(from, to, &model, options);
        let stats = run_threads(&plan, &model, &format!("{from}->{to}"), 3);
        let sent: u64 = stats.iter().map(|s| s.sent).sum();
        let received: u64 = stats.iter().map(|s| s.received).sum();
        assert_eq!(sent, plan.moved_bytes(), "{from} -> {to}");
        assert_eq!(received, plan.moved_bytes(), "{from} -> {to}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    #[test]
    fn random_layouts_and_shardings_refit_every_byte(case in arb_refit(6, 3)) {
        let plan = RefitPlan::build(
            Side::new(&case.source, &case.sharding),
            Side::new(&case.destination, &case.sharding),
            case.options,
        ).unwrap();
        run_threads(&plan, &case.sharding, "random", 1);
    }
}

#[test]
fn a_shard_of_the_wrong_size_is_refused_before_anything_is_sent() {
    let model = GptConfig::new(1, 32, 64).sharding().unwrap();
    let plan = plan("tp=2", "tp=1", &model, PlanOptions::default());
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let results: Vec<Result<RefitStats, ExecError>> = std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..3)
            .map(|rank| {
                let (store, plan, model) = (Arc::clone(&store), &plan, &model);
                scope.spawn(move || {
                    let peer = plan_peer(plan, rank).unwrap();
                    let options = RefitGroupOptions::new("sizes", 1).timeout(TIMEOUT);
                    let group =
                        RefitGroup::for_plan(Arc::clone(&store), options, plan, peer).unwrap();
                    // Rank 0 fails only once the others have left the join (whose closing barrier it would
                    // otherwise break).
                    let joined = |r: usize| hypercomm_store::Key::new("joined").push(r);
                    store.set(&joined(rank), b"").unwrap();
                    let layout = match peer {
                        Peer::Source(_) => plan.source(),
                        Peer::Destination(_) => plan.destination(),
                    };
                    let mut shards = shards_of(plan, model, layout, peer.rank(), 0);
                    if rank == 0 {
                        store.wait(&[joined(1), joined(2)], TIMEOUT).unwrap();
                        shards[0].pop();
                    }
                    let started = std::time::Instant::now();
                    let result = group.run(&mut Refit::new(plan, peer).unwrap(), &mut shards);
                    assert!(
                        started.elapsed() < TIMEOUT / 2,
                        "rank {rank} waited for its timeout"
                    );
                    result
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let name = &plan.params()[0].name;
    let want = plan.params()[0].bytes / 2;
    let err = results[0].as_ref().unwrap_err();
    assert!(
        matches!(err, ExecError::ShardSize { name: n, side: "source", have, want: w, .. }
            if n == name && *have == want - 1 && *w == want),
        "{err}"
    );
    // The destination, which waits for rank 0's bytes, stops at once: rank 0 aborted rather than leave it to its
    // timeout. (Source rank 1 may finish its sends first.)
    let err = results[2].as_ref().unwrap_err();
    assert!(matches!(err, ExecError::Comm { bucket: 0, .. }), "{err}");
}

#[test]
fn a_communicator_numbered_otherwise_is_refused_naming_both() {
    let model = GptConfig::new(1, 32, 64).sharding().unwrap();
    let plan = plan("tp=2", "tp=1", &model, PlanOptions::default());
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let comm = hypercomm_comm::Communicator::world(
        store,
        1,
        0,
        hypercomm_comm::CommOptions::named("alone"),
    )
    .unwrap();
    let err = Refit::new(&plan, Peer::Destination(0))
        .unwrap()
        .run(&comm, &mut vec![vec![0u8; 0]; plan.params().len()])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "communicator alone has 1 ranks with this one at 0, but the plan needs 3 ranks (2 sources, then the \
         destinations) with destination 0 at 2"
    );
}

/// Joins a group of one source and `joins.len() - 1` destinations as each rank, with its namespace, epoch and
/// timeout, on threads; returns each join's result and how long it took.
fn join_all(
    store: &Arc<dyn Store>,
    joins: &[(&str, u64, Duration)],
) -> Vec<(Result<RefitGroup, ExecError>, Duration)> {
    std::thread::scope(|scope| {
        let ranks: Vec<_> = joins
            .iter()
            .enumerate()
            .map(|(rank, &(namespace, epoch, timeout))| {
                let store = Arc::clone(store);
                scope.spawn(move || {
                    let started = std::time::Instant::now();
                    let options = RefitGroupOptions::new(namespace, epoch).timeout(timeout);
                    let joined = RefitGroup::join(store, options, 1, joins.len() - 1, rank);
                    (joined, started.elapsed())
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

#[test]
fn another_namespace_or_epoch_is_an_error_naming_both() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let short = Duration::from_millis(300);
    let joined = join_all(&store, &[("rl", 1, short), ("rl-old", 1, short)]);
    for (rank, (result, _)) in joined.into_iter().enumerate() {
        let err = result.unwrap_err();
        let (me, other) = if rank == 0 {
            ("rl", "rl-old")
        } else {
            ("rl-old", "rl")
        };
        assert_eq!(
            err.to_string(),
            format!(
                "refit rank {} joined namespace {other:?} epoch 1, but refit rank {rank} joins namespace {me:?} \
                 epoch 1",
                1 - rank
            )
        );
    }
    // A rank already at a later epoch makes a stale rank fail at once, not at its timeout; the rank at the later
    // epoch waits for the other to rejoin, and names it at its own timeout.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let long = Duration::from_secs(20);
    let joined = join_all(
        &store,
        &[("rl", 3, Duration::from_secs(1)), ("rl", 2, long)],
    );
    let (stale, took) = (joined[1].0.as_ref().unwrap_err(), joined[1].1);
    assert_eq!(
        stale.to_string(),
        "refit rank 0 joined namespace \"rl\" epoch 3, but refit rank 1 joins namespace \"rl\" epoch 2"
    );
    assert!(took < long / 2, "the stale rank waited {took:?}");
    let ahead = joined[0].0.as_ref().unwrap_err();
    assert!(
        matches!(
            ahead,
            ExecError::Mismatch {
                peer: 1,
                peer_epoch: 2,
                epoch: 3,
                ..
            }
        ),
        "{ahead}"
    );
}

#[test]
fn epochs_move_forward_and_the_store_keeps_one_key_per_rank() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let model = GptConfig::new(1, 32, 64).sharding().unwrap();
    let plan = plan(
        "tp=2",
        "tp=1",
        &model,
        PlanOptions::default().bucket_bytes(2048),
    );
    for epoch in [1, 2] {
        std::thread::scope(|scope| {
            for rank in 0..3 {
                let (store, plan, model) = (Arc::clone(&store), &plan, &model);
                scope.spawn(move || {
                    let peer = plan_peer(plan, rank).unwrap();
                    let options = RefitGroupOptions::new("rl", epoch).timeout(TIMEOUT);
                    let group = RefitGroup::for_plan(store, options, plan, peer).unwrap();
                    let layout = match peer {
                        Peer::Source(_) => plan.source(),
                        Peer::Destination(_) => plan.destination(),
                    };
                    let mut refit = Refit::new(plan, peer).unwrap();
                    for step in 0..4 {
                        let mut shards = shards_of(plan, model, layout, peer.rank(), step);
                        group.run(&mut refit, &mut shards).unwrap();
                    }
                    // Nobody leaves before all are done: the counts below are of a quiet store.
                    group.comm().unwrap().barrier().unwrap().wait().unwrap();
                });
            }
        });
        // One announcement per rank, and nothing else: no bootstrap record outlives the join, no refit adds one.
        assert_eq!(store.num_keys().unwrap(), 3, "epoch {epoch}");
        assert_eq!(
            RefitGroup::last_epoch(&*store, "rl", 2).unwrap(),
            Some(epoch)
        );
    }
    // Epoch 2 again: refused before anything is read.
    let err =
        RefitGroup::join(Arc::clone(&store), RefitGroupOptions::new("rl", 2), 2, 1, 2).unwrap_err();
    assert_eq!(
        err.to_string(),
        "refit rank 2 already joined namespace \"rl\" epoch 2: a rank joins each epoch once, so a restarted rank \
         joins a later epoch than 2, not 2"
    );
    assert_eq!(RefitGroup::last_epoch(&*store, "other", 2).unwrap(), None);
}
