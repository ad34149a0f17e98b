//! Property tests of the grid's algebra: partitions, intersections, unions, and agreement between the streaming
//! and the direct group computations.

use std::collections::BTreeSet;

use proptest::prelude::*;

use crate::strategies::{arb_dims, arb_grid, arb_grid_and_dims, arb_grid_and_rank};
use crate::{Dim, DimSet, Grid, GridView};

const MAX_WORLD: usize = 256;

/// Two disjoint dimension sets of a grid.
fn arb_disjoint(grid: &Grid) -> impl Strategy<Value = (DimSet, DimSet)> + use<> {
    (arb_dims(grid), arb_dims(grid)).prop_map(|(s, t)| (s, t.difference(s)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn groups_partition_the_grid((grid, dims) in arb_grid_and_dims(MAX_WORLD)) {
        let groups: Vec<Vec<usize>> = grid.groups_in(dims).collect();
        let size = grid.group_size_in(dims);
        let mut seen = BTreeSet::new();
        for group in &groups {
            prop_assert_eq!(group.len(), size);
            prop_assert!(group.windows(2).all(|w| w[0] < w[1]), "not ascending: {:?}", group);
            for &rank in group {
                prop_assert!(grid.contains(rank));
                prop_assert!(seen.insert(rank), "rank {} in two groups", rank);
            }
        }
        prop_assert_eq!(seen.len(), grid.size());
    }

    #[test]
    fn coordinates_round_trip((grid, rank) in arb_grid_and_rank(MAX_WORLD)) {
        let coords = grid.coords(rank).unwrap();
        prop_assert_eq!(grid.rank_of(&coords).unwrap(), rank);
        for (dim, coord) in grid.dims().iter().zip(&coords) {
            prop_assert_eq!(grid.coord(rank, &dim.name).unwrap(), *coord);
        }
    }

    #[test]
    fn group_of_agrees_with_groups((grid, dims) in arb_grid_and_dims(MAX_WORLD)) {
        for (index, group) in grid.groups_in(dims).enumerate() {
            for (position, &rank) in group.iter().enumerate() {
                let m = grid.group_of_in(rank, dims).unwrap();
                prop_assert_eq!(&m.members, &group);
                prop_assert_eq!(m.index, position);
                prop_assert_eq!(m.group, index);
            }
        }
    }

    #[test]
    fn disjoint_groups_that_agree_elsewhere_meet_in_one_rank(
        (grid, (s, t), pick) in arb_grid(MAX_WORLD).prop_flat_map(|g| {
            let sets = arb_disjoint(&g);
            (Just(g), sets, any::<proptest::sample::Index>())
        }),
        rank_pick in any::<proptest::sample::Index>(),
    ) {
        let rank = grid.offset() + rank_pick.index(grid.size());
        // Any rank in rank's S∪T group agrees with it outside S∪T; its T group must meet rank's S group once.
        let union = grid.group_of_in(rank, s.union(t)).unwrap().members;
        let other = union[pick.index(union.len())];
        let a: BTreeSet<usize> = grid.group_of_in(rank, s).unwrap().members.into_iter().collect();
        let b: BTreeSet<usize> = grid.group_of_in(other, t).unwrap().members.into_iter().collect();
        prop_assert_eq!(a.intersection(&b).count(), 1);
    }

    #[test]
    fn union_group_is_the_union_of_the_groups_it_contains(
        (grid, (s, t)) in arb_grid(MAX_WORLD).prop_flat_map(|g| { let sets = arb_disjoint(&g); (Just(g), sets) }),
        rank_pick in any::<proptest::sample::Index>(),
    ) {
        let rank = grid.offset() + rank_pick.index(grid.size());
        let union = grid.group_of_in(rank, s.union(t)).unwrap().members;
        let mut from_s = BTreeSet::new();
        for &member in &union {
            from_s.extend(grid.group_of_in(member, s).unwrap().members);
        }
        prop_assert_eq!(from_s.into_iter().collect::<Vec<_>>(), union);
    }

    #[test]
    fn serde_round_trips(grid in arb_grid(MAX_WORLD)) {
        let json = serde_json::to_string(&grid).unwrap();
        prop_assert_eq!(serde_json::from_str::<Grid>(&json).unwrap(), grid);
    }

    /// A view that refactors the dimensions before the last one keeps the last dimension's groups (Megatron's
    /// expert grid keeps pp); moving that dimension elsewhere breaks them unless the groups happen to coincide.
    #[test]
    fn views_agree_on_shared_dims(
        (grid, split) in arb_grid(MAX_WORLD).prop_flat_map(|g| { let n = g.size(); (Just(g), 1..=n) }),
    ) {
        let last = grid.dims().last().unwrap().clone();
        let inner = grid.size() / last.size;
        // Factor the inner ranks as (a, inner / a) with a the largest divisor of inner not above `split`.
        let a = (1..=split.min(inner)).rev().find(|a| inner % a == 0).unwrap();
        let refactored = Grid::with_offset(
            [Dim::new("x", a), Dim::new("y", inner / a), last.clone()],
            grid.offset(),
        ).unwrap();
        let view = GridView::new(&grid, refactored, [last.name.as_str()]).unwrap();
        let base_groups: Vec<Vec<usize>> = grid.groups([last.name.as_str()]).unwrap().collect();
        let view_groups: Vec<Vec<usize>> = view.groups([last.name.as_str()]).unwrap().collect();
        prop_assert_eq!(base_groups, view_groups);

        let moved = Grid::with_offset(
            [last.clone(), Dim::new("x", inner)],
            grid.offset(),
        ).unwrap();
        let same = last.size == 1 || inner == 1;
        prop_assert_eq!(GridView::new(&grid, moved, [last.name.as_str()]).is_ok(), same);
    }

    /// The view check compares run structures in O(dims); it must accept exactly when enumerating every group
    /// finds the same partitions, and otherwise name the first rank with two different groups.
    #[test]
    fn view_check_agrees_with_enumeration(
        (grid, shuffled, shared) in arb_grid(MAX_WORLD).prop_flat_map(|g| {
            let dims = g.dims().to_vec();
            let n = dims.len();
            (Just(g), Just(dims).prop_shuffle(), proptest::collection::btree_set(0..n, 1..=n))
        }),
    ) {
        let other = Grid::with_offset(shuffled, grid.offset()).unwrap();
        let names: Vec<String> = shared.iter().map(|&i| grid.dims()[i].name.clone()).collect();
        let partition = |g: &Grid, dims: &[String]| -> BTreeSet<Vec<usize>> {
            g.groups(dims).unwrap().collect()
        };
        let mut checks: Vec<Vec<String>> = names.iter().map(|n| vec![n.clone()]).collect();
        checks.push(names.clone());
        let agree = checks.iter().all(|d| partition(&grid, d) == partition(&other, d));
        match GridView::new(&grid, other.clone(), &names) {
            Ok(_) => prop_assert!(agree, "accepted {} against {}", other, grid),
            Err(crate::GridError::ViewMismatch { rank, view_group, base_group, .. }) => {
                prop_assert!(!agree, "rejected {} against {}", other, grid);
                prop_assert_eq!(rank, grid.offset());
                prop_assert_ne!(view_group, base_group);
            }
            Err(e) => prop_assert!(false, "unexpected error {}", e),
        }
    }

    #[test]
    fn compact_groups_list_the_same_members((grid, dims) in arb_grid_and_dims(MAX_WORLD)) {
        let size = grid.group_size_in(dims);
        let parts = [3, 2, 1].into_iter().find(|p| size % p == 0).unwrap_or(1);
        for rank in grid.ranks() {
            let m = grid.group_of_in(rank, dims).unwrap();
            let c = grid.compact_group_of_in(rank, dims).unwrap();
            prop_assert_eq!(c.ranks.iter().collect::<Vec<_>>(), m.members.clone());
            prop_assert_eq!((c.index, c.group, c.ranks.len()), (m.index, m.group, m.members.len()));
            prop_assert_eq!(c.ranks.get(c.index), Some(rank));
            // A part is the run of `size / parts` consecutive members of the whole group that holds the rank.
            let p = grid.compact_group_part_of(rank, dims, parts).unwrap();
            let len = size / parts;
            let start = m.index / len * len;
            prop_assert_eq!(p.ranks.len(), len);
            prop_assert_eq!(p.index, m.index - start);
            prop_assert_eq!(p.ranks.to_vec(), m.members[start..start + len].to_vec());
            prop_assert_eq!(p.ranks.iter().collect::<Vec<_>>(), m.members[start..start + len].to_vec());
        }
    }
}

mod layouts {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use crate::layout::GroupKind;
    use crate::strategies::arb_layout;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Every kind: groups are ascending, those of a partitioning kind cover every rank once, and each rank's
        /// directly computed memberships are exactly the streamed groups that hold it, at the right position.
        #[test]
        fn group_of_agrees_with_groups_for_every_kind(layout in arb_layout(96)) {
            for kind in layout.kinds() {
                let all: Vec<Vec<usize>> = layout.groups(kind).unwrap().collect();
                prop_assert_eq!(all.len(), layout.groups(kind).unwrap().len());
                let partitions = !matches!(kind, GroupKind::Embd | GroupKind::PosEmbd | GroupKind::Hcp);
                let mut seen = BTreeSet::new();
                for group in &all {
                    prop_assert!(group.windows(2).all(|w| w[0] < w[1]), "{}: {:?}", kind, group);
                    for &rank in group {
                        prop_assert!(layout.ranks().contains(&rank));
                        if partitions {
                            prop_assert!(seen.insert(rank), "{}: rank {} twice", kind, rank);
                        }
                    }
                }
                if partitions {
                    prop_assert_eq!(seen.len(), layout.world());
                }
                for rank in layout.ranks() {
                    let mine = layout.memberships(rank, kind).unwrap();
                    let holding: Vec<&Vec<usize>> = all.iter().filter(|g| g.contains(&rank)).collect();
                    prop_assert_eq!(mine.len(), holding.len(), "{} rank {}", kind, rank);
                    for m in &mine {
                        prop_assert!(holding.contains(&&m.members), "{} rank {}: {:?}", kind, rank, m);
                        prop_assert_eq!(m.members[m.index], rank);
                    }
                }
            }
        }

        /// Ranks in one group agree on its index, and different groups of a kind have different indices.
        #[test]
        fn group_indices_name_groups_consistently(layout in arb_layout(64)) {
            for kind in layout.kinds() {
                let mut by_index = std::collections::BTreeMap::new();
                for rank in layout.ranks() {
                    for m in layout.memberships(rank, kind).unwrap() {
                        let level = layout.memberships(rank, kind).unwrap().iter().position(|x| x == &m);
                        let previous = by_index.insert((level, m.group), m.members.clone());
                        if let Some(previous) = previous {
                            prop_assert_eq!(previous, m.members, "{} group {}", kind, m.group);
                        }
                    }
                }
            }
        }

        #[test]
        fn layouts_round_trip_through_json(layout in arb_layout(128)) {
            let json = serde_json::to_string(&layout).unwrap();
            prop_assert_eq!(serde_json::from_str::<crate::layout::ParallelLayout>(&json).unwrap(), layout);
        }
    }
}
