//! Timing collection builds: every rank of a small world builds a full process-group collection, by either
//! bootstrap, and the time each rank takes is recorded. Ranks are threads sharing one in-process store
//! ([`time_builds`]) or processes sharing a TCP store, each calling [`time_builds_as_rank`]. Used by `hypercomm
//! bench --collection [--processes] [--backend nccl]` and `cargo bench --bench collection`.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hypercomm_comm::device::{DeviceRuntime, Gpu, placement};
use hypercomm_comm::{CommError, CommOptions, Communicator};
use hypercomm_grid::layout::{LayoutConfig, ParallelLayout};
use hypercomm_store::{MemoryStore, Store};
use process_group_collection::{CollectionError, ProcessGroupCollection};

/// How the collection is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// [`CollectionBuilder::build`](process_group_collection::CollectionBuilder::build): members meet through the store.
    StoreKeyed,
    /// [`CollectionBuilder::build_by_split`](process_group_collection::CollectionBuilder::build_by_split): one split of the world
    /// communicator per group slot (the world communicator itself is not timed).
    Split,
}

impl Strategy {
    /// Both strategies.
    pub const ALL: [Strategy; 2] = [Strategy::StoreKeyed, Strategy::Split];

    /// `store` or `split`.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::StoreKeyed => "store",
            Strategy::Split => "split",
        }
    }
}

/// The 8-rank layout whose collection has all 22 kinds: tp 2, cp 2, pp 2, ep 2 (etp 1), two distributed-optimizer
/// instances, hierarchical cp `[2]`.
pub fn full_layout_8() -> ParallelLayout {
    // These sizes satisfy every rule (checked by this module's tests); building cannot fail.
    LayoutConfig::new(8)
        .tp(2)
        .cp(2)
        .pp(2)
        .ep(2)
        .etp(1)
        .dist_opt_instances(2)
        .hcp_sizes(vec![2])
        .build()
        .expect("the full 8-rank layout is valid")
}

/// Builds the collection of `layout` (all kinds, all-gather groups on) `repeats` times on every rank, with ranks as
/// threads; returns every rank's build time of every repeat, and the number of groups each rank holds. With
/// `gpus` (one per rank, in rank order), every group also gets an NCCL communicator, and the split strategy
/// splits a world communicator's NCCL flavor too.
pub fn time_builds(
    layout: &ParallelLayout,
    strategy: Strategy,
    repeats: usize,
    gpus: Option<&[Arc<Gpu>]>,
) -> Result<(Vec<Duration>, usize), CollectionError> {
    if let Some(g) = gpus
        && g.len() != layout.world()
    {
        return Err(CollectionError::Invalid {
            collection: "bench".into(),
            what: format!("{} gpus for {} ranks", g.len(), layout.world()),
        });
    }
    let world = layout.world();
    let offset = layout.ranks().start;
    let mut times = Vec::with_capacity(world * repeats);
    let mut communicators = 0;
    for repeat in 0..repeats {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let start = Arc::new(Barrier::new(world));
        let threads: Vec<_> = (offset..offset + world)
            .map(|rank| {
                let (store, start, layout) =
                    (Arc::clone(&store), Arc::clone(&start), layout.clone());
                let gpu = gpus.map(|g| Arc::clone(&g[rank - offset]));
                std::thread::spawn(move || -> Result<(Duration, usize), CollectionError> {
                    let mut builder = ProcessGroupCollection::for_layout(
                        format!("bench{repeat}"),
                        layout.clone(),
                    )
                    .with_all_gather_groups(true)
                    .with_timeout(Duration::from_secs(120));
                    if let Some(gpu) = &gpu {
                        builder = builder.with_gpu(Arc::clone(gpu));
                    }
                    let (elapsed, pgc) = match strategy {
                        Strategy::StoreKeyed => {
                            start.wait();
                            let t = Instant::now();
                            let pgc = builder.build(rank, store)?;
                            (t.elapsed(), pgc)
                        }
                        Strategy::Split => {
                            let failed = |source| CollectionError::Invalid {
                                collection: "bench".into(),
                                what: format!("world communicator: {source}"),
                            };
                            let world = Communicator::connect(
                                gpu,
                                store,
                                layout.ranks().collect(),
                                rank,
                                CommOptions::named("world"),
                            )
                            .map_err(failed)?;
                            start.wait();
                            let t = Instant::now();
                            let pgc = builder.build_by_split(&world)?;
                            (t.elapsed(), pgc)
                        }
                    };
                    let held = pgc.groups().filter(|id| pgc.get(id).is_ok()).count();
                    Ok((elapsed, held))
                })
            })
            .collect();
        for thread in threads {
            let (elapsed, held) = thread.join().map_err(|_| CollectionError::Invalid {
                collection: "bench".into(),
                what: "a rank thread panicked".into(),
            })??;
            times.push(elapsed);
            communicators = communicators.max(held);
        }
    }
    Ok((times, communicators))
}

/// Builds the collection of `layout` (all kinds, all-gather groups on) `repeats` times as rank `rank` of a job whose
/// ranks are processes sharing `store`; returns this rank's build times and the number of communicators it holds.
///
/// Every build starts after a barrier on a world communicator (`bench-<strategy>-world`, created first and not
/// timed), so the ranks start together as the threads of [`time_builds`] do; the split strategy splits that
/// communicator. Each rank of the job must call this with the same arguments but its rank.
pub fn time_builds_as_rank(
    layout: &ParallelLayout,
    strategy: Strategy,
    repeats: usize,
    rank: usize,
    store: Arc<dyn Store>,
) -> Result<(Vec<Duration>, usize), CollectionError> {
    let comm_err = |what: &str, source: hypercomm_comm::CommError| CollectionError::Invalid {
        collection: "bench".into(),
        what: format!("{what}: {source}"),
    };
    let world = Communicator::new(
        Arc::clone(&store),
        layout.ranks().collect(),
        rank,
        CommOptions::named(format!("bench-{}-world", strategy.name())),
    )
    .map_err(|e| comm_err("world communicator", e))?;
    let mut times = Vec::with_capacity(repeats);
    let mut communicators = 0;
    for repeat in 0..repeats {
        let builder = ProcessGroupCollection::for_layout(
            format!("bench-{}-{repeat}", strategy.name()),
            layout.clone(),
        )
        .with_all_gather_groups(true)
        .with_timeout(Duration::from_secs(120));
        world
            .barrier()
            .and_then(|w| w.wait())
            .map_err(|e| comm_err("start barrier", e))?;
        let start = Instant::now();
        let pgc = match strategy {
            Strategy::StoreKeyed => builder.build(rank, Arc::clone(&store))?,
            Strategy::Split => builder.build_by_split(&world)?,
        };
        times.push(start.elapsed());
        communicators = pgc.groups().filter(|id| pgc.get(id).is_ok()).count();
    }
    world
        .barrier()
        .and_then(|w| w.wait())
        .map_err(|e| comm_err("end barrier", e))?;
    Ok((times, communicators))
}

/// One GPU per rank for a collection whose `ranks` ranks are threads of this process, as
/// [`placement`] assigns devices (`multi_rank_gpu_enabled`: the job's `NCCL_MULTI_RANK_GPU_ENABLE=1`).
pub fn open_gpus(
    runtime: &Arc<DeviceRuntime>,
    ranks: usize,
    multi_rank_gpu_enabled: bool,
) -> Result<Vec<Arc<Gpu>>, CommError> {
    placement(
        ranks,
        runtime.device_count(),
        runtime.nccl().version(),
        multi_rank_gpu_enabled,
    )?
    .into_iter()
    .map(|device| Gpu::open(Arc::clone(runtime), device))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypercomm_grid::layout::GroupKind;

    #[test]
    fn the_full_layout_has_every_kind_and_both_strategies_build_it() {
        let layout = full_layout_8();
        assert_eq!(layout.kinds(), GroupKind::ALL.to_vec());
        for strategy in Strategy::ALL {
            let (times, communicators) = time_builds(&layout, strategy, 1, None).unwrap();
            assert_eq!(times.len(), 8);
            // 22 kinds, hcp with one level; embd and pos_embd leave some ranks out.
            assert!(communicators >= 21, "{strategy:?}: {communicators}");
        }
    }
}
