//! The cost simulation replays what a real build sends to the store: build real collections on ranks that are
//! threads, each with its own counting store, and compare every rank's traffic with the simulation's.

use std::sync::Arc;
use std::time::Duration;

use hypercomm_grid::layout::LayoutConfig;
use hypercomm_store::{CountingStore, MemoryStore, Store};
use process_group_collection::ProcessGroupCollection;
use process_group_collection::cost::simulate_store_cost;

#[test]
fn simulated_store_traffic_matches_a_real_build() {
    let layout = LayoutConfig::new(16)
        .tp(2)
        .pp(2)
        .cp(2)
        .ep(2)
        .dist_opt_instances(2)
        .build()
        .unwrap();
    let shared = Arc::new(MemoryStore::new());
    let counters: Vec<Arc<CountingStore<Arc<MemoryStore>>>> = (0..16)
        .map(|_| Arc::new(CountingStore::new(Arc::clone(&shared))))
        .collect();
    let threads: Vec<_> = counters
        .iter()
        .enumerate()
        .map(|(rank, counter)| {
            let store: Arc<dyn Store> = Arc::clone(counter) as Arc<dyn Store>;
            let layout = layout.clone();
            std::thread::spawn(move || {
                let pgc = ProcessGroupCollection::for_layout("cost", layout)
                    .with_all_gather_groups(true)
                    .with_timeout(Duration::from_secs(60))
                    .build(rank, store)
                    .unwrap();
                pgc.groups().filter(|id| pgc.membership(id).is_ok()).count()
            })
        })
        .collect();
    let real_groups: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let sim = simulate_store_cost("cost", &layout, true).unwrap();
    assert_eq!(real_groups, sim.groups_per_rank);
    let (mut real_sets, mut sim_sets, mut real_gets, mut sim_gets) = (0, 0, 0, 0);
    for (rank, counter) in counters.iter().enumerate() {
        let real = counter.counts();
        let model = sim.per_rank[rank];
        let groups = real_groups[rank] as u64;
        // One add per group joined without leading it.
        assert_eq!(real.adds, model.adds, "rank {rank}");
        assert_eq!((real.waits, real.other), (0, 0), "rank {rank}");
        // Per group: the leader writes its record and reads the decision; every other member reads the record and
        // either reads the decision or, arriving last, writes it. Who arrives last varies, the sum does not.
        assert_eq!(
            real.sets + real.gets,
            model.sets + model.gets,
            "rank {rank}: {real:?} {model:?}"
        );
        // At most 3 requests per group (groups here are far below 31 ranks: no arrival marks).
        assert!(real.requests() <= 3 * groups, "rank {rank}: {real:?}");
        real_sets += real.sets;
        sim_sets += model.sets;
        real_gets += real.gets;
        sim_gets += model.gets;
        // Bytes: equal but for who wrote the small decision records.
        let slack = 128 * groups;
        assert!(
            real.bytes().abs_diff(model.bytes()) <= slack,
            "rank {rank}: {real:?} vs {model:?}"
        );
    }
    assert_eq!((real_sets, real_gets), (sim_sets, sim_gets));
}
