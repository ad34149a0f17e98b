//! Test support: ranks as threads of one process, each with a collection over a shared `MemoryStore`.

use std::sync::Arc;
use std::time::Duration;

use hypercomm_grid::layout::LayoutConfig;
use hypercomm_store::{MemoryStore, Store};
use process_group_collection::{GroupOptions, ProcessGroupCollection};

/// Runs `f(rank, collection)` on `world` threads, each with its rank's collection over a Megatron layout with
/// `tp` (dp = world / tp; tp varies fastest, so the tp groups are `{0, 1}, {2, 3}, ..`), and returns the results
/// in rank order.
pub(crate) fn run_ranks<R: Send + 'static>(
    world: usize,
    tp: usize,
    f: impl Fn(usize, Arc<ProcessGroupCollection>) -> R + Send + Sync + 'static,
) -> Vec<R> {
    run_ranks_with(world, tp, GroupOptions::new(), f)
}

/// [`run_ranks`] with per-kind group options (as a user's options file gives them).
pub(crate) fn run_ranks_with<R: Send + 'static>(
    world: usize,
    tp: usize,
    options: GroupOptions,
    f: impl Fn(usize, Arc<ProcessGroupCollection>) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let f = Arc::new(f);
    let threads: Vec<_> = (0..world)
        .map(|rank| {
            let store = Arc::clone(&store);
            let f = Arc::clone(&f);
            let options = options.clone();
            std::thread::spawn(move || {
                let layout = LayoutConfig::new(world).tp(tp).build().expect("layout");
                let pgc = ProcessGroupCollection::for_layout("t", layout)
                    .with_timeout(Duration::from_secs(30))
                    .with_options(options)
                    .build(rank, store)
                    .expect("collection");
                f(rank, Arc::new(pgc))
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("rank thread panicked"))
        .collect()
}
