//! An eager build's closing barriers run on the building thread: a collection whose groups nobody has used yet
//! holds no progress thread, whichever bootstrap built it. (Its own test binary: thread counts are process-wide.)

mod support;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use hypercomm_comm::{CommOptions, Communicator};
use hypercomm_grid::layout::LayoutConfig;
use process_group_collection::ProcessGroupCollection;
use support::run_ranks;

/// How many threads of this process are named `name` (Linux keeps the first 15 bytes of a thread's name).
fn threads_named(name: &str) -> usize {
    let short = &name[..name.len().min(15)];
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == short)
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn built_collections_hold_no_progress_thread_until_a_group_is_used() {
    let ranks = 4;
    let built = Arc::new(Barrier::new(ranks));
    let counted = Arc::new(Barrier::new(ranks));
    let seen = run_ranks(0..ranks, move |rank, store| {
        let layout = LayoutConfig::new(4)
            .tp(2)
            .cp(2)
            .build()
            .map_err(|e| e.to_string())?;
        let builder = |name: &str| {
            ProcessGroupCollection::for_layout(name, layout.clone())
                .with_timeout(Duration::from_secs(60))
        };
        // Communicator threads are named `hypercomm-<name>`: `hypercomm-quiet` for the store-keyed build's
        // groups, `hypercomm-par/s` for the split children (`par/split<n>/color<c>`), `hypercomm-par` for the parent.
        let keyed = builder("quiet")
            .build(rank, Arc::clone(&store))
            .map_err(|e| e.to_string())?;
        let parent = Communicator::world(store, ranks, rank, CommOptions::named("par"))
            .map_err(|e| e.to_string())?;
        let split = builder("splitted")
            .build_by_split(&parent)
            .map_err(|e| e.to_string())?;
        built.wait();
        let idle = (
            threads_named("hypercomm-quiet"),
            threads_named("hypercomm-par/s"),
        );
        counted.wait();
        // Using a group starts its progress thread: what the counts above would have seen had the builds used them.
        keyed
            .tp()
            .map_err(|e| e.to_string())?
            .barrier()
            .and_then(hypercomm_comm::Work::wait)
            .map_err(|e| e.to_string())?;
        // A thread takes its name when it first runs, which may come after the barrier returned (the barrier runs
        // on this thread): look until it shows, for a while.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut used = threads_named("hypercomm-quiet");
        while used == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            used = threads_named("hypercomm-quiet");
        }
        let groups = (keyed.groups().count(), split.groups().count());
        Ok((idle, used, groups))
    });
    for (rank, ((keyed, split), used, groups)) in seen.into_iter().enumerate() {
        assert!(groups.0 >= 5 && groups.1 >= 5, "rank {rank}: {groups:?}");
        assert_eq!(
            (keyed, split),
            (0, 0),
            "rank {rank}: progress threads of built, unused collections"
        );
        assert!(used >= 1, "rank {rank}: using tp started no thread");
    }
}
