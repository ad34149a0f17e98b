//! Group enumeration and one rank's group, on the layout tp=8, cp=2, ep=8, pp=16 at worlds of 65,536 and
//! 1,048,576 ranks.
//!
//! Run with `cargo bench --bench grid`. Prints the median of several samples for:
//! - streaming every group of each single dimension and of dp-cp into one reused buffer (`next_into`),
//! - the same collected as `Vec<Vec<usize>>` (one allocation per group),
//! - `group_of` for one rank.

mod support;

use std::hint::black_box;

use hypercomm::grid::Grid;
use hypercomm::grid::layout::LayoutConfig;
use support::{human, median_per_call, smoke_run};

fn stream_all(grid: &Grid, dims: &[&str]) -> usize {
    let mut groups = grid.groups(dims.iter().copied()).expect("dims exist");
    let mut buf = Vec::with_capacity(groups.group_size());
    let mut sum = 0usize;
    while groups.next_into(&mut buf) {
        sum = sum.wrapping_add(buf[0]);
    }
    sum
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
        let layout = LayoutConfig::new(world)
            .tp(8)
            .cp(2)
            .ep(8)
            .pp(16)
            .build()
            .expect("valid layout");
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
}
