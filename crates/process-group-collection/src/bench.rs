//! Timing collection builds: every rank of a small world (threads sharing one in-process store) builds a full
//! collection, by either bootstrap, and the time each rank takes is recorded. Used by `hypercomm bench
//! --collection` (`--backend nccl` gives every group an NCCL communicator too) and `cargo bench --bench
//! collection`.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hypercomm_comm::device::{Gpu, ProcessGroup};
use hypercomm_comm::{BackendKind, CommOptions, Communicator};
use hypercomm_grid::layout::{LayoutConfig, ParallelLayout};
use hypercomm_store::{MemoryStore, Store};

use crate::{CollectionError, ProcessGroupCollection};

/// How the collection is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// [`CollectionBuilder::build`](crate::CollectionBuilder::build): members meet through the store.
    StoreKeyed,
    /// [`CollectionBuilder::build_by_split`](crate::CollectionBuilder::build_by_split): one split of the world
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
/// splits a world process group's NCCL communicator too.
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
                            let world = match gpu {
                                Some(gpu) => ProcessGroup::connect(
                                    Some(gpu),
                                    store,
                                    layout.ranks().collect(),
                                    rank,
                                    CommOptions::named("world"),
                                ),
                                None => Communicator::new(
                                    BackendKind::Host,
                                    store,
                                    layout.ranks().collect(),
                                    rank,
                                    CommOptions::named("world"),
                                )
                                .and_then(|host| ProcessGroup::new(host, None)),
                            }
                            .map_err(failed)?;
                            start.wait();
                            let t = Instant::now();
                            let pgc = builder.build_by_split_group(&world)?;
                            (t.elapsed(), pgc)
                        }
                    };
                    let held = pgc
                        .groups()
                        .filter(|id| pgc.process_group(id).is_ok())
                        .count();
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

/// The median of `times` (zero when empty).
pub fn median(times: &[Duration]) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
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
