//! What building a process-group collection costs.
//!
//! Run with `cargo bench --bench collection`. Prints:
//! - the store traffic per rank of building a full collection (all kinds, all-gather groups on), simulated with the
//!   in-process store for worlds up to 131,072 ranks on layout tp 8, cp 2, pp 4, ep 8: requests and bytes per rank
//!   stay flat as the world grows, because each rank meets only its own groups' members;
//! - the median time per rank to build a full collection on 8 local ranks (threads), by each bootstrap.

mod support;

use std::time::Instant;

use hypercomm::grid::layout::LayoutConfig;
use hypercomm::pgc::bench::{Strategy, full_layout_8, median, time_builds};
use hypercomm::pgc::cost::simulate_store_cost;
use support::{human, smoke_run};

fn main() {
    let smoke = smoke_run();
    let worlds: &[usize] = if smoke {
        &[1024]
    } else {
        &[1024, 8192, 65_536, 131_072]
    };
    println!(
        "store traffic per rank, layout tp 8 cp 2 pp 4 ep 8 (etp 8), all kinds, all-gather groups on"
    );
    println!(
        "{:>9} {:>14} {:>18} {:>16} {:>18} {:>12}",
        "world",
        "groups/rank",
        "requests/rank max",
        "bytes/rank max",
        "total requests",
        "simulated in"
    );
    for &world in worlds {
        let layout = LayoutConfig::new(world)
            .tp(8)
            .cp(2)
            .pp(4)
            .ep(8)
            .build()
            .expect("valid layout");
        let t = Instant::now();
        let report = simulate_store_cost("bench", &layout, true).expect("simulation runs");
        let total: u64 = report.per_rank.iter().map(|c| c.requests()).sum();
        println!(
            "{world:>9} {:>14} {:>18} {:>16} {total:>18} {:>12}",
            report.max_groups(),
            report.max_requests(),
            report.max_bytes(),
            human(t.elapsed())
        );
    }
    let repeats = if smoke { 1 } else { 20 };
    println!();
    println!(
        "full collection (22 kinds) on 8 local ranks (threads), {repeats} repeat(s) per strategy"
    );
    let layout = full_layout_8();
    for strategy in Strategy::ALL {
        let (times, communicators) = time_builds(&layout, strategy, repeats, None).expect("builds");
        println!(
            "{:>6}: {communicators} communicators per rank, median build time per rank {}",
            strategy.name(),
            human(median(&times))
        );
    }
}
