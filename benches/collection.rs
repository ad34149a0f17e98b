//! What building a process-group collection costs.
//!
//! Run with `cargo bench --bench collection`. Prints:
//! - the store traffic per rank of building a full collection (all kinds, all-gather groups on), simulated with the
//!   in-process store for worlds up to 131,072 ranks on layout tp 8, cp 2, pp 4, ep 8: requests and bytes per rank
//!   stay flat as the world grows, because each rank meets only its own groups' members;
//! - the same build through a store relay per node of 8 ranks, simulated up to 1,048,576 ranks: what each relay
//!   receives and forwards, and what the central store receives with and without relays;
//! - the median time per rank to build a full collection on 8 local ranks, by each bootstrap, with ranks as threads
//!   of this process and then as 8 processes started by the launcher (this bench binary run again with
//!   `--collection-worker`) sharing a TCP store, like for like with a multi-process Megatron-Core start-up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm::grid::layout::LayoutConfig;
use hypercomm::launch::Launcher;
use hypercomm::pgc::cost::{simulate_relay_cost, simulate_store_cost};
use hypercomm::store::{Rendezvous, Store};
use hypercomm_bench::collection::{Strategy, full_layout_8, time_builds, time_builds_as_rank};
use hypercomm_bench::harness::{human, smoke_run};
use hypercomm_bench::median;

/// One rank of the process run: times its builds and prints `<strategy> <microseconds>` per build.
fn worker(repeats: usize) {
    let rendezvous = Rendezvous::from_env().expect("started by the launcher");
    let joined = rendezvous
        .join(rendezvous.client_options())
        .expect("the launcher's store");
    let store: Arc<dyn Store> = Arc::new(joined.store);
    for strategy in Strategy::ALL {
        let (times, _) = time_builds_as_rank(
            &full_layout_8(),
            strategy,
            repeats,
            rendezvous.rank,
            Arc::clone(&store),
        )
        .expect("builds");
        for t in times {
            println!("{} {}", strategy.name(), t.as_micros());
        }
    }
}

/// Launches 8 copies of this binary as the ranks and prints the median build time per rank of each strategy.
fn as_processes(repeats: usize) {
    let program = std::env::current_exe().expect("this bench binary");
    let report = Launcher::new(program)
        .args(["--collection-worker".to_owned(), repeats.to_string()])
        .nproc(8)
        .echo(false)
        .capture(true)
        .timeout(Duration::from_secs(600))
        .run()
        .expect("launch");
    assert!(report.success(), "{}", report.summary());
    for strategy in Strategy::ALL {
        let times: Vec<Duration> = report
            .ranks
            .iter()
            .flat_map(|r| &r.stdout)
            .filter_map(|line| line.split_once(' '))
            .filter(|(name, _)| *name == strategy.name())
            .map(|(_, micros)| Duration::from_micros(micros.parse().expect("microseconds")))
            .collect();
        assert_eq!(times.len(), 8 * repeats, "{}", strategy.name());
        println!(
            "{:>6}: median build time per rank {}",
            strategy.name(),
            human(median(&times).unwrap_or_default())
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--collection-worker") {
        let repeats = args
            .get(at + 1)
            .and_then(|r| r.parse().ok())
            .expect("--collection-worker REPEATS");
        worker(repeats);
        return;
    }
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
    relay_traffic(smoke);
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
            human(median(&times).unwrap_or_default())
        );
    }
    println!();
    println!(
        "full collection (22 kinds) on 8 local ranks (processes, TCP store), {repeats} repeat(s) per strategy"
    );
    as_processes(repeats);
}

/// The build's store traffic through a relay on each node of 8 ranks (as `hypercomm launch` runs one per node).
fn relay_traffic(smoke: bool) {
    const PER_NODE: usize = 8;
    let worlds: &[usize] = if smoke {
        &[1024]
    } else {
        // 100,352 = 12,544 nodes of 8: the world nearest 100,000 that tp 8 x cp 2 x pp 4 divides.
        &[8192, 100_352, 1_048_576]
    };
    println!();
    println!("the same build through one store relay per node of {PER_NODE} ranks");
    println!(
        "{:>9} {:>7} {:>13} {:>14} {:>14} {:>16} {:>16} {:>12}",
        "world",
        "nodes",
        "in/relay max",
        "out/relay max",
        "bytes out max",
        "central direct",
        "central relayed",
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
        let report =
            simulate_relay_cost("bench", &layout, true, PER_NODE).expect("simulation runs");
        println!(
            "{world:>9} {:>7} {:>13} {:>14} {:>14} {:>16} {:>16} {:>12}",
            report.nodes(),
            report.max_local_requests(),
            report.max_upstream_requests(),
            report.max_upstream_bytes(),
            report.direct_requests(),
            report.central_requests(),
            human(t.elapsed())
        );
    }
}
