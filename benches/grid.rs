//! Group enumeration and one rank's group, on the layout tp=8, cp=2, ep=8, pp=16 at worlds of 65,536 and
//! 1,048,576 ranks, and one rank's groups of every kind at worlds up to 2^40.
//!
//! Run with `cargo bench --bench grid`. Prints the median of several samples for:
//! - streaming every group of each single dimension and of dp-cp into one reused buffer (`next_into`),
//! - the same collected as `Vec<Vec<usize>>` (one allocation per group),
//! - `group_of` for one rank,
//! - building the layout (`LayoutConfig::build`, which checks the expert grid against the decoder grid) and
//!   describing all 22 of one rank's groups (`compact_memberships`): what `hypercomm layout --rank` does before
//!   printing. Both must stay flat as the world grows; a per-rank loop anywhere shows here as a jump.

use std::hint::black_box;

use hypercomm::grid::Grid;
use hypercomm::grid::layout::{LayoutConfig, ParallelLayout};
use hypercomm_bench::harness::{human, median_per_call, smoke_run};

fn stream_all(grid: &Grid, dims: &[&str]) -> usize {
    let mut groups = grid.groups(dims.iter().copied()).expect("dims exist");
    let mut buf = Vec::with_capacity(groups.group_size());
    let mut sum = 0usize;
    while groups.next_into(&mut buf) {
        sum = sum.wrapping_add(buf[0]);
    }
    sum
}

fn layout(world: usize) -> ParallelLayout {
    LayoutConfig::new(world)
        .tp(8)
        .cp(2)
        .ep(8)
        .pp(16)
        .build()
        .expect("valid layout")
}

/// Builds the layout and describes every group of one rank; returns a checksum of the group sizes.
fn one_rank_every_kind(world: usize, rank: usize) -> usize {
    let layout = layout(black_box(world));
    let mut sum = 0usize;
    for kind in layout.kinds() {
        for m in layout
            .compact_memberships(rank, kind)
            .expect("rank in layout")
        {
            sum = sum.wrapping_add(m.ranks.len());
        }
    }
    sum
}

fn one_rank_table(smoke: bool) {
    let worlds: &[usize] = if smoke {
        &[1 << 20]
    } else {
        &[1 << 16, 1 << 20, 1 << 22, 1 << 24, 1 << 40]
    };
    println!();
    println!(
        "{:<16} {:>14} {:>22}",
        "world", "build layout", "build + rank's groups"
    );
    for &world in worlds {
        let (samples, iters) = if smoke { (1, 1) } else { (11, 200) };
        let build = median_per_call(samples, iters, || layout(black_box(world)));
        let all = median_per_call(samples, iters, || one_rank_every_kind(world, 777));
        println!("{world:<16} {:>14} {:>22}", human(build), human(all));
    }
}

fn main() {
    let smoke = smoke_run();
    let worlds: &[usize] = if smoke {
        &[65_536]
    } else {
        &[65_536, 1_048_576]
    };
    println!(
        "{:<10} {:<8} {:<6} {:>8} {:>6} {:>14} {:>14} {:>12}",
        "world", "grid", "dims", "groups", "size", "stream all", "collect all", "group_of"
    );
    for &world in worlds {
        let layout = layout(world);
        let rank = world / 2 + 3;
        let cases: [(&str, &Grid, &[&str]); 6] = [
            ("decoder", layout.decoder(), &["tp"]),
            ("decoder", layout.decoder(), &["cp"]),
            ("decoder", layout.decoder(), &["dp"]),
            ("decoder", layout.decoder(), &["pp"]),
            ("decoder", layout.decoder(), &["dp", "cp"]),
            ("expert", layout.expert().grid(), &["ep"]),
        ];
        for (name, grid, dims) in cases {
            let (samples, iters) = if smoke { (1, 1) } else { (11, 3) };
            let groups = grid.groups(dims.iter().copied()).expect("dims exist");
            let (count, size) = (groups.len(), groups.group_size());
            let stream = median_per_call(samples, iters, || stream_all(grid, dims));
            let collect = median_per_call(samples, iters, || {
                grid.groups(dims.iter().copied())
                    .expect("dims exist")
                    .collect::<Vec<_>>()
            });
            let set = grid.select(dims.iter().copied()).expect("dims exist");
            let one = median_per_call(
                if smoke { 1 } else { 21 },
                if smoke { 1 } else { 20_000 },
                || {
                    grid.group_of_in(black_box(rank), set)
                        .expect("rank in grid")
                },
            );
            println!(
                "{world:<10} {name:<8} {:<6} {count:>8} {size:>6} {:>14} {:>14} {:>12}",
                dims.join("-"),
                human(stream),
                human(collect),
                human(one)
            );
        }
    }
    one_rank_table(smoke);
}
