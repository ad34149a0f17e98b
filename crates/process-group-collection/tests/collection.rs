//! Building collections on ranks that are threads: every kind's communicator has the layout's members and
//! reduces correctly, both bootstraps agree, AG/RS overlap works, many collections coexist, errors say why.

mod support;

use std::sync::Arc;
use std::time::Duration;

use hypercomm_comm::{CommOptions, Communicator, ReduceOp};
use hypercomm_grid::layout::{GroupKind, LayoutConfig, ParallelLayout};
use hypercomm_store::Store;
use process_group_collection::{
    CollectionError, Creation, GroupId, GroupOptions, ProcessGroupCollection,
};
use support::run_ranks;

const TIMEOUT: Duration = Duration::from_secs(60);

fn layout() -> ParallelLayout {
    LayoutConfig::new(16)
        .tp(2)
        .pp(2)
        .cp(2)
        .ep(2)
        .dist_opt_instances(2)
        .build()
        .unwrap()
}

/// For every group the rank is in: the communicator's ranks are the layout's members, its rank is the
/// membership index, and an all-reduce of (rank + 1) sums over exactly those members.
fn check_every_group(
    pgc: &ProcessGroupCollection,
    layout: &ParallelLayout,
    rank: usize,
) -> Result<usize, String> {
    let mut checked = 0;
    for id in pgc.groups().cloned().collect::<Vec<_>>() {
        let Ok(m) = pgc.membership(&id) else { continue };
        let comm = pgc.get(&id).map_err(|e| e.to_string())?;
        if comm.ranks() != m.members.as_slice() || comm.rank() != m.index {
            return Err(format!(
                "{id}: comm ranks {:?} rank {} vs {:?} {}",
                comm.ranks(),
                comm.rank(),
                m.members,
                m.index
            ));
        }
        if let Ok(kind) = id.kind.parse::<GroupKind>() {
            if kind != GroupKind::Hcp {
                let expected = layout
                    .group_of(rank, kind)
                    .map_err(|e| e.to_string())?
                    .map(|m| m.members);
                if expected.as_ref() != Some(&m.members) {
                    return Err(format!("{id}: {:?} vs layout {expected:?}", m.members));
                }
            }
        }
        let sum = comm
            .all_reduce(vec![(rank + 1) as i64; 3], ReduceOp::Sum)
            .and_then(|w| w.wait())
            .map_err(|e| format!("{id}: {e}"))?;
        let want: i64 = m.members.iter().map(|&r| r as i64 + 1).sum();
        if sum != vec![want; 3] {
            return Err(format!("{id}: sum {sum:?}, want {want}"));
        }
        checked += 1;
    }
    Ok(checked)
}

#[test]
fn store_keyed_collection_has_every_kind_with_the_layout_members() {
    let checked = run_ranks(0..16, |rank, store| {
        let layout = layout();
        let pgc = ProcessGroupCollection::for_layout("model", layout.clone())
            .with_all_gather_groups(true)
            .with_timeout(TIMEOUT)
            .build(rank, store)
            .map_err(|e| e.to_string())?;
        check_every_group(&pgc, &layout, rank)
    });
    // 21 kinds exist (no hcp); pp = 2 puts every rank in an embd group, and half of them in a pos_embd group.
    assert!(checked.iter().all(|&n| n >= 20), "{checked:?}");
}

#[test]
fn split_bootstrap_builds_the_same_groups() {
    run_ranks(0..16, |rank, store| {
        let layout = layout();
        let parent = Communicator::world(
            store,
            16,
            rank,
            CommOptions {
                timeout: TIMEOUT,
                ..CommOptions::named("world")
            },
        )
        .map_err(|e| e.to_string())?;
        let pgc = ProcessGroupCollection::for_layout("model", layout.clone())
            .with_all_gather_groups(true)
            .with_timeout(TIMEOUT)
            .build_by_split(&parent)
            .map_err(|e| e.to_string())?;
        check_every_group(&pgc, &layout, rank).map(|_| ())
    });
}

#[test]
fn split_from_a_parent_missing_ranks_fails_before_splitting() {
    let errors = run_ranks(0..4, |rank, store| {
        let layout = LayoutConfig::new(8)
            .tp(2)
            .build()
            .map_err(|e| e.to_string())?;
        let parent = Communicator::world(store, 4, rank, CommOptions::named("small"))
            .map_err(|e| e.to_string())?;
        Ok(ProcessGroupCollection::for_layout("big", layout)
            .build_by_split(&parent)
            .unwrap_err()
            .to_string())
    });
    // tp_dp_cp (the first slot whose groups reach beyond ranks 0-3) is named; no split was attempted.
    for e in errors {
        assert!(e.contains("group tp_dp_cp needs rank 4"), "{e}");
        assert!(
            e.contains("which the parent communicator small (ranks [0, 1, 2, 3]) lacks"),
            "{e}"
        );
    }
}

#[test]
fn all_gather_and_reduce_scatter_overlap_in_opposite_orders() {
    // world 8, tp 2: dp_cp groups of 4. Even ranks issue all-gather first, odd ranks reduce-scatter first; on one
    // communicator the two would pair up wrongly, on twins both complete with correct results.
    run_ranks(0..8, |rank, store| {
        let layout = LayoutConfig::new(8)
            .tp(2)
            .build()
            .map_err(|e| e.to_string())?;
        let pgc = ProcessGroupCollection::for_layout("overlap", layout)
            .with_all_gather_groups(true)
            .with_timeout(TIMEOUT)
            .build(rank, store)
            .map_err(|e| e.to_string())?;
        let (rs, ag) = (
            pgc.dp_cp().map_err(|e| e.to_string())?,
            pgc.dp_cp_ag().map_err(|e| e.to_string())?,
        );
        let members = pgc
            .membership(&GroupId::kind("dp_cp"))
            .map_err(|e| e.to_string())?
            .members
            .clone();
        let n = members.len();
        for round in 0..20u32 {
            let chunk = 1024;
            let grads: Vec<f32> = (0..n * chunk)
                .map(|i| (i as f32) + rank as f32 + round as f32)
                .collect();
            let params = vec![rank as f32 * 10.0 + round as f32; chunk];
            let err = |e: hypercomm_comm::CommError| e.to_string();
            let all_gather = |p: Vec<f32>| ag.all_gather_into(p, vec![0.0; n * chunk]).map_err(err);
            let reduce_scatter = |g: Vec<f32>| {
                rs.reduce_scatter_into(g, vec![0.0; chunk], ReduceOp::Sum)
                    .map_err(err)
            };
            // Even ranks start the all-gather first, odd ranks the reduce-scatter.
            let (ag_work, rs_work) = if rank % 2 == 0 {
                let ag_work = all_gather(params)?;
                (ag_work, reduce_scatter(grads)?)
            } else {
                let rs_work = reduce_scatter(grads)?;
                (all_gather(params)?, rs_work)
            };
            let (_, gathered) = ag_work.wait().map_err(err)?;
            let (_, reduced) = rs_work.wait().map_err(err)?;
            for (i, &member) in members.iter().enumerate() {
                let want = member as f32 * 10.0 + round as f32;
                if gathered[i * chunk..(i + 1) * chunk]
                    .iter()
                    .any(|&v| v != want)
                {
                    return Err(format!("round {round}: all-gather block {i} wrong"));
                }
            }
            let me = members.iter().position(|&r| r == rank).unwrap();
            let member_sum: f32 = members.iter().map(|&r| r as f32).sum();
            for (j, &v) in reduced.iter().enumerate() {
                let i = me * chunk + j;
                let want = n as f32 * (i as f32 + round as f32) + member_sum;
                if v != want {
                    return Err(format!(
                        "round {round}: reduce-scatter element {j} is {v}, want {want}"
                    ));
                }
            }
        }
        Ok(())
    });
}

#[test]
fn a_group_given_symmetric_bytes_all_reduces_buffers_in_place_and_the_others_have_no_window() {
    // world 4, tp 2: dp groups {0, 2} and {1, 3}. Only dp's host communicators get windows.
    run_ranks(0..4, |rank, store| {
        let layout = LayoutConfig::new(4)
            .tp(2)
            .build()
            .map_err(|e| e.to_string())?;
        let opts = GroupOptions::from_json(r#"{"dp": {"symmetric_bytes": 4194304}}"#)
            .map_err(|e| e.to_string())?;
        let pgc = ProcessGroupCollection::for_layout("symmetric", layout)
            .with_options(opts)
            .with_timeout(TIMEOUT)
            .build(rank, store)
            .map_err(|e| e.to_string())?;
        let dp = pgc.dp().map_err(|e| e.to_string())?;
        let len = 300_000;
        let mut grads = dp
            .symmetric_buffer(len, 0.0f32)
            .map_err(|e| e.to_string())?;
        if !grads.is_shared() {
            return Err(
                "ranks of one process share memory, so the dp window should be shared".into(),
            );
        }
        grads.fill(rank as f32 + 1.0);
        let grads = dp
            .all_reduce_symmetric(grads, ReduceOp::Sum)
            .and_then(|w| w.wait())
            .map_err(|e| e.to_string())?;
        // dp partners differ by 2: ranks r and r + 2 (counted from 1: r + 1 and r + 3).
        let want = 2.0 * (rank % 2) as f32 + 4.0;
        if grads.iter().any(|&g| g != want) {
            return Err(format!("rank {rank}: dp sum {}, want {want}", grads[0]));
        }
        let tp = pgc.tp().map_err(|e| e.to_string())?;
        match tp.symmetric_buffer(4, 0u8) {
            Err(e) if e.to_string().contains("no symmetric window") => Ok(()),
            other => Err(format!("tp has no window, yet: {other:?}")),
        }
    });
}

#[test]
fn tagged_twins_and_side_by_side_collections() {
    // An RL-like world of 8: a policy on ranks 0-3 (tp 2, dp 2) with two extra dp_cp twins, a reference model on
    // 4-7 (tp 4), and a weight-sync group of policy rank 0 plus the reference ranks; all through one store.
    run_ranks(0..8, |rank, store| {
        let policy_layout = LayoutConfig::new(4)
            .tp(2)
            .build()
            .map_err(|e| e.to_string())?;
        let reference_layout = LayoutConfig::new(4)
            .tp(4)
            .rank_offset(4)
            .build()
            .map_err(|e| e.to_string())?;
        let sync = ProcessGroupCollection::custom("sync")
            .with_explicit_groups("weights", vec![vec![0, 4, 5, 6, 7]])
            .with_timeout(TIMEOUT)
            .build(rank, Arc::clone(&store))
            .map_err(|e| e.to_string())?;
        let model = if rank < 4 {
            ProcessGroupCollection::for_layout("policy", policy_layout)
                .with_tagged("dp_cp", "a")
                .with_tagged("dp_cp", "b")
        } else {
            ProcessGroupCollection::for_layout("reference", reference_layout)
        }
        .with_timeout(TIMEOUT)
        .build(rank, Arc::clone(&store))
        .map_err(|e| e.to_string())?;
        let tp = model.tp().map_err(|e| e.to_string())?;
        let tp_sum = tp
            .all_reduce(vec![rank as u64], ReduceOp::Sum)
            .and_then(|w| w.wait())
            .map_err(|e| e.to_string())?;
        let want: u64 = if rank < 4 {
            (rank / 2 * 2) as u64 * 2 + 1
        } else {
            4 + 5 + 6 + 7
        };
        if tp_sum != vec![want] {
            return Err(format!("tp sum {tp_sum:?}, want {want}"));
        }
        if rank < 4 {
            // Three communicators over identical ranks, all in flight at once.
            let comms = [
                model.dp_cp().map_err(|e| e.to_string())?,
                model
                    .get(&GroupId::tagged("dp_cp", "a"))
                    .map_err(|e| e.to_string())?,
                model
                    .get(&GroupId::tagged("dp_cp", "b"))
                    .map_err(|e| e.to_string())?,
            ];
            let works: Vec<_> = comms
                .iter()
                .enumerate()
                .map(|(i, c)| c.all_reduce(vec![(rank * 10 + i) as u64], ReduceOp::Max))
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            for (i, w) in works.into_iter().enumerate() {
                let got = w.wait().map_err(|e| e.to_string())?;
                // dp_cp groups are [0, 2] and [1, 3]: the larger member is rank % 2 + 2.
                let top = rank % 2 + 2;
                if got != vec![(top * 10 + i) as u64] {
                    return Err(format!("twin {i}: {got:?}"));
                }
            }
        }
        match sync.get(&GroupId::kind("weights")) {
            Ok(weights) => {
                let mut payload = if rank == 0 {
                    vec![1.5f32, 2.5]
                } else {
                    vec![0.0; 2]
                };
                payload = weights
                    .broadcast(payload, 0)
                    .and_then(|w| w.wait())
                    .map_err(|e| e.to_string())?;
                if payload != vec![1.5, 2.5] {
                    return Err(format!("weights {payload:?}"));
                }
            }
            Err(CollectionError::NotMember { .. }) if (1..4).contains(&rank) => {}
            Err(e) => return Err(e.to_string()),
        }
        Ok(())
    });
}

#[test]
fn lazy_creation_builds_only_what_is_used() {
    let built = Arc::new(std::sync::Barrier::new(4));
    let counts = run_ranks(0..4, move |rank, store| {
        let layout = LayoutConfig::new(4)
            .tp(2)
            .build()
            .map_err(|e| e.to_string())?;
        let pgc = ProcessGroupCollection::for_layout("lazy", layout)
            .with_creation(Creation::Lazy)
            .with_timeout(TIMEOUT)
            .build(rank, Arc::clone(&store))
            .map_err(|e| e.to_string())?;
        // Every rank has built its (lazy) collection before any measures the store.
        built.wait();
        let before = store.num_keys().map_err(|e| e.to_string())?;
        built.wait();
        let tp = pgc.tp().map_err(|e| e.to_string())?;
        tp.barrier()
            .and_then(|w| w.wait())
            .map_err(|e| e.to_string())?;
        let after = store.num_keys().map_err(|e| e.to_string())?;
        Ok((before, after))
    });
    // Nothing was written before first use; using tp wrote its bootstrap records.
    assert!(
        counts
            .iter()
            .all(|&(before, after)| before == 0 && after > 0),
        "{counts:?}"
    );
}

#[test]
fn errors_say_why_a_group_is_missing() {
    run_ranks(0..4, |rank, store| {
        let layout = LayoutConfig::new(4)
            .pp(4)
            .build()
            .map_err(|e| e.to_string())?;
        let pgc = ProcessGroupCollection::for_layout("errs", layout)
            .with_timeout(TIMEOUT)
            .build(rank, store)
            .map_err(|e| e.to_string())?;
        let text = |r: Result<&Communicator, CollectionError>| {
            r.err().map(|e| e.to_string()).unwrap_or_default()
        };
        let ag = text(pgc.expt_dp_ag());
        if !ag.contains("expt_dp_ag exists only when ep > 1") {
            return Err(ag);
        }
        let dp_ag = text(pgc.dp_cp_ag());
        if !dp_ag.contains("with_all_gather_groups(true)") {
            return Err(dp_ag);
        }
        let embd = text(pgc.embd());
        if (rank == 1 || rank == 2) != embd.contains("rank") {
            return Err(format!("rank {rank}: {embd:?}"));
        }
        let unknown = text(pgc.get(&GroupId::kind("tensor")));
        if !unknown.contains("unknown group kind") {
            return Err(unknown);
        }
        let tag = text(pgc.get(&GroupId::tagged("dp", "x")));
        if !tag.contains("no communicator tagged \"x\"") {
            return Err(tag);
        }
        Ok(())
    });
}

#[test]
fn bad_requests_fail_before_any_communication() {
    let store: Arc<dyn Store> = Arc::new(hypercomm_store::MemoryStore::new());
    let layout = LayoutConfig::new(4).tp(2).build().unwrap();
    let err = |b: process_group_collection::CollectionBuilder| {
        b.build(0, Arc::clone(&store)).unwrap_err().to_string()
    };
    let opts = GroupOptions::from_json(r#"{"tensor": {"timeout_secs": 1}}"#).unwrap();
    assert!(
        err(ProcessGroupCollection::for_layout("a", layout.clone()).with_options(opts))
            .contains("unknown group kind \"tensor\"")
    );
    let opts = GroupOptions::from_json(r#"{"tp": {"cga_cluster_size": 2}}"#).unwrap();
    let e = err(ProcessGroupCollection::for_layout("b", layout.clone()).with_options(opts));
    assert!(
        e.contains("does not support option cga_cluster_size"),
        "{e}"
    );
    let e = err(ProcessGroupCollection::for_layout("c", layout.clone()).with_tagged("ep", ""));
    assert!(e.contains("non-empty tag"), "{e}");
    let e = err(ProcessGroupCollection::for_layout("d", layout.clone()).with_tagged("tensor", "x"));
    assert!(e.contains("no group kind tensor"), "{e}");
    let e =
        err(ProcessGroupCollection::custom("e")
            .with_explicit_groups("w", vec![vec![0, 1], vec![1, 2]]));
    assert!(e.contains("lists rank 1 in more than one group"), "{e}");
    let e = err(ProcessGroupCollection::for_layout("f", layout.clone())
        .with_tagged("tp", "x")
        .with_tagged("tp", "x"));
    assert!(e.contains("tp#x is requested twice"), "{e}");
    // Nothing reached the store.
    assert_eq!(store.num_keys().unwrap(), 0);
}

#[test]
fn the_world_group_spans_the_layout_with_its_offset() {
    // Ranks 4..8: a model instance that does not start at rank 0.
    let sums = run_ranks(4..8, |rank, store| {
        let layout = LayoutConfig::new(4)
            .tp(2)
            .rank_offset(4)
            .build()
            .map_err(|e| e.to_string())?;
        let pgc = ProcessGroupCollection::for_layout("w", layout)
            .with_world_group(true)
            .with_timeout(TIMEOUT)
            .build(rank, store)
            .map_err(|e| e.to_string())?;
        let world = pgc.world().map_err(|e| e.to_string())?;
        assert_eq!(world.ranks(), [4, 5, 6, 7]);
        let v = world
            .all_reduce(vec![rank as u32], ReduceOp::Sum)
            .and_then(hypercomm_comm::Work::wait)
            .map_err(|e| e.to_string())?;
        Ok(v[0])
    });
    assert_eq!(sums, [22; 4]);
    // Without it, asking says how to get it.
    let layout = LayoutConfig::new(1).build().unwrap();
    let pgc = ProcessGroupCollection::for_layout("nw", layout)
        .build(0, Arc::new(hypercomm_store::MemoryStore::new()))
        .unwrap();
    let e = pgc.world().unwrap_err().to_string();
    assert!(e.contains("with_world_group(true)"), "{e}");
}

#[test]
fn aborting_a_collection_fails_every_group_here_and_tells_the_peers() {
    let outcomes = run_ranks(0..4, |rank, store| {
        let layout = LayoutConfig::new(4)
            .tp(2)
            .build()
            .map_err(|e| e.to_string())?;
        let pgc = ProcessGroupCollection::for_layout("ab", layout)
            .with_timeout(TIMEOUT)
            .build(rank, Arc::clone(&store))
            .map_err(|e| e.to_string())?;
        // Rank 0 aborts only once every rank's build has returned: an eager build ends each group with a barrier,
        // and a rank still finishing the last one would see the abort there (seen under load). A barrier of
        // our own would have the same race, so the ranks say so through the store.
        let built = |r: usize| {
            hypercomm_store::Key::new("abort-test")
                .push("built")
                .push(r)
        };
        store.set(&built(rank), b"1").map_err(|e| e.to_string())?;
        if rank == 0 {
            let all: Vec<_> = (0..4).map(built).collect();
            store.wait(&all, TIMEOUT).map_err(|e| e.to_string())?;
            pgc.abort();
            // Every group of this rank is broken now.
            for kind in ["tp", "dp", "mp"] {
                let e = pgc
                    .get(&GroupId::kind(kind))
                    .map_err(|e| e.to_string())?
                    .all_reduce(vec![1u8], ReduceOp::Sum)
                    .and_then(hypercomm_comm::Work::wait)
                    .expect_err("aborted");
                assert!(
                    matches!(e, hypercomm_comm::CommError::Broken { .. }),
                    "{kind}: {e}"
                );
            }
            return Ok(String::new());
        }
        if rank == 3 {
            // Its tp group [2, 3] and dp group [1, 3] do not hold rank 0.
            return Ok(String::new());
        }
        // A peer of rank 0 learns at once rather than after the 60 s timeout.
        let started = std::time::Instant::now();
        let peer_group = if rank == 1 { "tp" } else { "dp" };
        let result = pgc
            .get(&GroupId::kind(peer_group))
            .map_err(|e| e.to_string())?
            .all_reduce(vec![1u8], ReduceOp::Sum)
            .and_then(hypercomm_comm::Work::wait);
        match (rank, result) {
            (1 | 2, Err(e)) => {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "{e} after {:?}",
                    started.elapsed()
                );
                Ok(e.to_string())
            }
            (1 | 2, Ok(v)) => Err(format!(
                "rank {rank}: {peer_group} all-reduce with an aborted peer gave {v:?}"
            )),
            (_, _) => Err(format!("rank {rank} has nothing to check")),
        }
    });
    assert!(outcomes[1].contains("ab/tp"), "{outcomes:?}");
    assert!(outcomes[2].contains("ab/dp"), "{outcomes:?}");
}

#[test]
fn a_collection_built_by_split_fails_together() {
    // Short enough that a peer left waiting would show as a timeout, long enough for a loaded machine otherwise.
    const WAIT: Duration = Duration::from_secs(20);
    let outcomes = run_ranks(0..4, |rank, store| {
        let layout = LayoutConfig::new(4)
            .tp(2)
            .build()
            .map_err(|e| e.to_string())?;
        let parent = Communicator::world(
            Arc::clone(&store),
            4,
            rank,
            CommOptions {
                timeout: WAIT,
                ..CommOptions::named("fail-together")
            },
        )
        .map_err(|e| e.to_string())?;
        let pgc = ProcessGroupCollection::for_layout("ft", layout)
            .with_timeout(WAIT)
            .build_by_split(&parent)
            .map_err(|e| e.to_string())?;
        // Rank 3 aborts only once every build has returned (a build ends with barriers that would see it).
        let built = |r: usize| hypercomm_store::Key::new("ft-test").push("built").push(r);
        store.set(&built(rank), b"1").map_err(|e| e.to_string())?;
        let comm = |kind: &str| pgc.get(&GroupId::kind(kind)).map_err(|e| e.to_string());
        let all_reduce = |kind: &str| {
            comm(kind)?
                .all_reduce(vec![1u8], ReduceOp::Sum)
                .and_then(hypercomm_comm::Work::wait)
                .map_err(|e| e.to_string())
        };
        match rank {
            // Gives up on its tp group [2, 3] alone.
            3 => {
                let all: Vec<_> = (0..4).map(built).collect();
                store.wait(&all, WAIT).map_err(|e| e.to_string())?;
                comm("tp")?.abort();
                Ok(String::new())
            }
            // Learns it in tp; its failure domain then aborts its other groups too, dp [0, 2] among them.
            2 => match all_reduce("tp") {
                Err(e) => Ok(e),
                Ok(v) => Err(format!(
                    "rank 2: tp all-reduce with an aborted peer gave {v:?}"
                )),
            },
            // Waits on rank 2 in dp, which never calls it: told by rank 2's abort, not by the timeout.
            0 => {
                let started = std::time::Instant::now();
                match all_reduce("dp") {
                    Err(e) if started.elapsed() < WAIT / 2 => Ok(e),
                    Err(e) => Err(format!("rank 0 waited {:?}: {e}", started.elapsed())),
                    Ok(v) => Err(format!("rank 0: dp all-reduce gave {v:?}")),
                }
            }
            _ => Ok(String::new()),
        }
    });
    assert!(outcomes[2].contains("aborted by rank 3"), "{}", outcomes[2]);
    assert!(outcomes[0].contains("aborted by rank 2"), "{}", outcomes[0]);
}
