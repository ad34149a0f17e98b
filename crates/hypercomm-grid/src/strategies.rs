//! Proptest strategies for grids, for users' own property tests. Enabled by the `proptest` cargo feature.
//!
//! ```
//! use hypercomm_grid::strategies::{arb_grid, arb_grid_and_dims};
//! use proptest::prelude::*;
//!
//! proptest!(|(grid in arb_grid(64))| {
//!     prop_assert!(grid.size() <= 64);
//! });
//! proptest!(|((grid, dims) in arb_grid_and_dims(64))| {
//!     let groups = grid.groups_in(dims);
//!     prop_assert_eq!(groups.len() * groups.group_size(), grid.size());
//! });
//! ```

use proptest::prelude::*;

use crate::{Dim, DimSet, Grid};

/// Names the generated grids use, shuffled per grid.
const NAMES: [&str; 6] = ["tp", "cp", "ep", "dp", "pp", "sp"];

/// Sizes per dimension, at most `max_world` ranks in all: 1 to 6 dimensions of size 1 to 8, trimmed to fit.
fn arb_sizes(max_world: usize) -> impl Strategy<Value = Vec<usize>> {
    let max_world = max_world.max(1);
    proptest::collection::vec(1usize..=8, 1..=NAMES.len()).prop_map(move |mut sizes| {
        let mut world = 1usize;
        for size in &mut sizes {
            while world * *size > max_world {
                *size -= 1;
            }
            world *= *size;
        }
        sizes
    })
}

/// Grids of at most `max_world` ranks (`max_world` below 1 counts as 1), with shuffled realistic dimension names
/// and an offset of up to `max_world`.
pub fn arb_grid(max_world: usize) -> impl Strategy<Value = Grid> {
    (
        arb_sizes(max_world),
        Just(NAMES.to_vec()).prop_shuffle(),
        0..=max_world,
    )
        .prop_map(|(sizes, names, offset)| {
            let dims = names.iter().zip(&sizes).map(|(n, &s)| Dim::new(*n, s));
            // Names are distinct tokens, sizes are in 1..=8 and the product is bounded: construction cannot fail.
            Grid::with_offset(dims, offset).expect("generated grid is valid")
        })
}

/// Any subset of a grid's dimensions.
pub fn arb_dims(grid: &Grid) -> impl Strategy<Value = DimSet> + use<> {
    let n = grid.dims().len();
    proptest::bits::u64::between(0, n).prop_map(move |bits| {
        (0..n)
            .filter(|&i| bits & (1 << i) != 0)
            .fold(DimSet::EMPTY, DimSet::with)
    })
}

/// A grid together with a subset of its dimensions.
pub fn arb_grid_and_dims(max_world: usize) -> impl Strategy<Value = (Grid, DimSet)> {
    arb_grid(max_world).prop_flat_map(|grid| {
        let dims = arb_dims(&grid);
        (Just(grid), dims)
    })
}

/// A grid and one of its ranks.
pub fn arb_grid_and_rank(max_world: usize) -> impl Strategy<Value = (Grid, usize)> {
    arb_grid(max_world).prop_flat_map(|grid| {
        let ranks = grid.ranks();
        (Just(grid), ranks)
    })
}

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n % d == 0).collect()
}

/// Valid Megatron-Core layouts of at most `max_world` ranks: every parallel size, a shuffled order, an offset,
/// distributed-optimizer instances and hierarchical cp sizes. Invalid combinations (an order that puts pp
/// before dp while expert dp differs from dp) are filtered out.
pub fn arb_layout(max_world: usize) -> impl Strategy<Value = crate::layout::ParallelLayout> {
    use crate::layout::LayoutConfig;
    let max_world = max_world.max(1);
    (
        arb_sizes(max_world).prop_map(|s| {
            // Reuse the bounded sizes: tp, cp, dp, pp from the first four (missing ones are 1).
            let at = |i: usize| s.get(i).copied().unwrap_or(1);
            (at(0), at(1), at(2), at(3))
        }),
        Just(["tp", "cp", "ep", "dp", "pp"].to_vec()).prop_shuffle(),
        any::<proptest::sample::Index>(),
        any::<proptest::sample::Index>(),
        any::<proptest::sample::Index>(),
        any::<proptest::sample::Index>(),
        0..=max_world,
    )
        .prop_filter_map(
            "order puts pp before dp while expert dp differs",
            |((tp, cp, dp, pp), order, etp_pick, ep_pick, inst_pick, hcp_pick, offset)| {
                let inner = tp * cp * dp;
                let etp_choices = divisors(inner);
                let etp = etp_choices[etp_pick.index(etp_choices.len())];
                let ep_choices = divisors(inner / etp);
                let ep = ep_choices[ep_pick.index(ep_choices.len())];
                let expert_dp = inner / (etp * ep);
                let common = divisors(gcd(dp * cp, expert_dp));
                let instances = common[inst_pick.index(common.len())];
                let cp_parts = divisors(cp);
                let first = cp_parts[hcp_pick.index(cp_parts.len())];
                let hcp = if first == cp {
                    vec![cp]
                } else {
                    vec![first, cp / first]
                };
                LayoutConfig::new(inner * pp)
                    .tp(tp)
                    .cp(cp)
                    .pp(pp)
                    .ep(ep)
                    .etp(etp)
                    .order(&order.join("-"))
                    .rank_offset(offset)
                    .dist_opt_instances(instances)
                    .hcp_sizes(hcp)
                    .build()
                    .ok()
            },
        )
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}
