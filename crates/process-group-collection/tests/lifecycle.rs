//! Dropping a collection releases everything: after building and dropping a full collection 100 times, this
//! process has as many threads, file descriptors and shared-memory segment mappings as before. (Its own test binary: the
//! counts are process-wide, so no other test may run beside it.)

mod support;

use std::time::Duration;

use hypercomm_grid::layout::LayoutConfig;
use process_group_collection::ProcessGroupCollection;
use support::run_ranks;

fn count_dir(path: &str, prefix: &str) -> usize {
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .count()
        })
        .unwrap_or(0)
}

/// Threads, open descriptors, and mappings of shared-memory segments (anonymous memfds, so they show only in
/// this process's memory map).
fn resources() -> (usize, usize, usize) {
    let segments = std::fs::read_to_string("/proc/self/maps")
        .map(|maps| {
            maps.lines()
                .filter(|l| l.contains("/memfd:hypercomm-segment"))
                .count()
        })
        .unwrap_or(0);
    (
        count_dir("/proc/self/task", ""),
        count_dir("/proc/self/fd", ""),
        segments,
    )
}

#[test]
fn a_full_collection_built_and_dropped_100_times_leaks_nothing() {
    let before = resources();
    let mut kinds = 0;
    for round in 0..100 {
        let per_rank = run_ranks(0..4, move |rank, store| {
            // Every kind: ep 2 (expert groups, expt_dp_ag), two optimizer instances (inter_dist_opt), hcp.
            let layout = LayoutConfig::new(4)
                .cp(2)
                .ep(2)
                .etp(1)
                .dist_opt_instances(2)
                .hcp_sizes(vec![2])
                .build()
                .map_err(|e| e.to_string())?;
            let pgc = ProcessGroupCollection::for_layout(format!("round{round}"), layout)
                .with_all_gather_groups(true)
                .with_timeout(Duration::from_secs(60))
                .build(rank, store)
                .map_err(|e| e.to_string())?;
            // The count below is of something real: while the collection lives, its segments are mapped.
            if resources().2 == 0 {
                return Err("no shared-memory segment is mapped while the collection lives".into());
            }
            Ok(pgc.groups().filter(|id| pgc.get(id).is_ok()).count())
        });
        kinds = per_rank[0];
    }
    assert!(kinds >= 20, "only {kinds} communicators per rank");
    let after = resources();
    assert_eq!(
        after, before,
        "(threads, fds, segments) before {before:?}, after {after:?}"
    );
}
