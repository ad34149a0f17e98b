//! Process-group collections with a GPU: every group gets an NCCL communicator whose members are the layout's,
//! on one rank with per-kind knobs, and on two ranks both store-keyed and by split.

use std::sync::Arc;
use std::time::Duration;

use hypercomm_comm::ReduceOp;
use hypercomm_comm::device::Gpu;
use hypercomm_store::MemoryStore;

use crate::device_checks::all_reduced;
use crate::fake_support::nccl;
use crate::{gpu_or_skip, on_two_ranks, pair};

/// Every group of `pgc` this rank is in: its NCCL communicator's members are the layout's, and an all-reduce of
/// the global rank sums over them.
fn check_device_collection(
    pgc: &process_group_collection::ProcessGroupCollection,
    gpu: &Arc<Gpu>,
    rank: usize,
) -> usize {
    let mut checked = 0;
    for id in pgc.groups().cloned().collect::<Vec<_>>() {
        let Ok(m) = pgc.membership(&id) else { continue };
        let comm = pgc.get(&id).unwrap();
        assert_eq!(comm.ranks(), m.members, "{id}");
        assert_eq!(nccl(comm).ranks(), m.members, "{id}");
        let got = all_reduced(comm, gpu, &[rank as f32; 256], ReduceOp::Sum);
        let want = m.members.iter().sum::<usize>() as f32;
        assert!(got.iter().all(|&v| v == want), "{id}");
        checked += 1;
    }
    checked
}

#[test]
fn a_collection_with_a_gpu_gives_every_group_an_nccl_communicator() {
    // One rank: every kind of a one-rank layout (and the all-gather twin), with per-kind knobs; any NCCL.
    let Some(gpu) = gpu_or_skip("device collection") else {
        return;
    };
    let layout = hypercomm_grid::layout::LayoutConfig::new(1)
        .build()
        .unwrap();
    let options = process_group_collection::GroupOptions::from_json(
        r#"{"tp": {"max_ctas": 4}, "dp_cp": {"high_priority_stream": true}}"#,
    )
    .unwrap();
    let pgc = process_group_collection::ProcessGroupCollection::for_layout("one", layout)
        .with_all_gather_groups(true)
        .with_options(options)
        .with_timeout(Duration::from_secs(60))
        .with_gpu(Arc::clone(&gpu))
        .build(0, Arc::new(MemoryStore::new()))
        .unwrap();
    let checked = check_device_collection(&pgc, &gpu, 0);
    assert!(checked >= 15, "{checked} groups");
}

#[test]
fn two_ranks_build_a_device_collection_both_ways() {
    on_two_ranks("two-rank device collection", |rank, gpu, store| {
        let layout = || {
            hypercomm_grid::layout::LayoutConfig::new(2)
                .tp(2)
                .build()
                .unwrap()
        };
        let build = || {
            process_group_collection::ProcessGroupCollection::for_layout("pair", layout())
                .with_all_gather_groups(true)
                .with_timeout(Duration::from_secs(60))
                .with_gpu(Arc::clone(&gpu))
        };
        let pgc = build().build(rank, Arc::clone(&store)).unwrap();
        assert!(check_device_collection(&pgc, &gpu, rank) >= 15);
        drop(pgc);
        let world = pair(&gpu, &store, rank, "world");
        let by_split =
            process_group_collection::ProcessGroupCollection::for_layout("split", layout())
                .with_all_gather_groups(true)
                .with_timeout(Duration::from_secs(60))
                .with_gpu(Arc::clone(&gpu))
                .build_by_split(&world)
                .unwrap();
        assert!(check_device_collection(&by_split, &gpu, rank) >= 15);
    });
}
