//! Which of a rank's communicators an eager build closes with a barrier.
//!
//! A build ends with barriers so that a rank missing after the bootstrap shows at start-up, not at first use. Each
//! rank enters them only after creating all of its communicators, so passing a barrier on communicator `D` proves
//! that every member of `D` has finished creating all of its own. A communicator `C` whose members all belong to
//! `D` is therefore finished by `D`'s barrier and needs none of its own: every member of `C` is a member of `D` and
//! passes the same proof. Skipping it is decided the same way on every member of `C` (each holds `D` too), so the
//! barriers that remain are entered by all of their members or by none, in slot order on every rank, and cannot
//! deadlock.
//!
//! Barriers are cheap on a quiet machine but each waits for every member to be scheduled: on a loaded one, a
//! barrier on each of the 22 communicators of a full 8-rank build costs about a third of the build, and the two
//! this leaves cost little (figures in `docs/perf/collection-build.md`, "Closing barriers").

/// For one rank's communicators in slot order (each given by its members), whether each needs a closing barrier
/// of its own: not when another of them contains all of its members and is larger, or is identical and earlier in
/// slot order (twins such as `dp_cp` and `dp_cp_ag` share one barrier).
///
/// ```text
/// [0, 1], [0, 1, 2, 3], [0, 1, 2, 3], [1, 5]  ->  false, true, false, true
/// ```
pub(crate) fn needs_barrier(groups: &[&[usize]]) -> Vec<bool> {
    let sorted: Vec<Vec<usize>> = groups
        .iter()
        .map(|g| {
            let mut s = g.to_vec();
            s.sort_unstable();
            s
        })
        .collect();
    (0..sorted.len())
        .map(|i| {
            let covered = sorted.iter().enumerate().any(|(j, d)| {
                j != i
                    && (d.len() > sorted[i].len() || (d.len() == sorted[i].len() && j < i))
                    && is_subset(&sorted[i], d)
            });
            !covered
        })
        .collect()
}

/// Whether every element of `small` is in `big` (both sorted ascending, without repeats).
fn is_subset(small: &[usize], big: &[usize]) -> bool {
    let mut rest = big.iter();
    small.iter().all(|x| rest.any(|y| y == x))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use hypercomm_grid::layout::LayoutConfig;

    use super::*;
    use crate::plan::Topology;

    #[test]
    fn contained_and_repeated_groups_share_the_covering_barrier() {
        let groups: [&[usize]; 5] = [&[0, 1], &[0, 1, 2, 3], &[3, 2, 1, 0], &[1, 5], &[5, 1]];
        assert_eq!(needs_barrier(&groups), [false, true, false, true, false]);
        // Overlapping groups that do not contain each other each keep theirs.
        assert_eq!(needs_barrier(&[&[0, 1, 2], &[1, 2, 3]]), [true, true]);
        assert_eq!(needs_barrier(&[&[4]]), [true]);
        assert!(needs_barrier(&[]).is_empty());
    }

    #[test]
    fn subsets_are_exact() {
        assert!(is_subset(&[1, 3], &[0, 1, 2, 3]));
        assert!(!is_subset(&[1, 4], &[0, 1, 2, 3]));
        assert!(is_subset(&[], &[0]));
        assert!(!is_subset(&[0], &[]));
    }

    /// The property the build relies on: every member of a group decides the same, so a barrier is entered by all
    /// of its members or by none. Checked on every rank of layouts with every kind of group, twins included.
    #[test]
    fn every_member_of_a_group_decides_alike() {
        let layouts = [
            // Every kind of group: tp, cp, pp, ep, two optimizer instances, hierarchical cp.
            LayoutConfig::new(8)
                .tp(2)
                .cp(2)
                .pp(2)
                .ep(2)
                .etp(1)
                .dist_opt_instances(2)
                .hcp_sizes(vec![2])
                .build()
                .unwrap(),
            LayoutConfig::new(16).tp(2).pp(2).ep(4).build().unwrap(),
            LayoutConfig::new(24).tp(2).cp(3).pp(2).build().unwrap(),
            LayoutConfig::new(8).build().unwrap(),
        ];
        for layout in layouts {
            let world = layout.ranks().count();
            let topology = Topology {
                layout: Some(layout),
                all_gather_groups: true,
                ..Topology::default()
            };
            // Per slot and member list: the decisions of the members.
            let mut decided: BTreeMap<(String, Vec<usize>), Vec<bool>> = BTreeMap::new();
            let mut barriers = 0;
            for rank in 0..world {
                let slots = topology.plan(rank, "test").unwrap();
                let members: Vec<(String, Vec<usize>)> = slots
                    .iter()
                    .filter_map(|s| {
                        let m = s.membership.as_ref().ok()?;
                        Some((s.id.to_string(), m.members.clone()))
                    })
                    .collect();
                let lists: Vec<&[usize]> = members.iter().map(|(_, m)| m.as_slice()).collect();
                for ((id, m), needs) in members.iter().zip(needs_barrier(&lists)) {
                    decided
                        .entry((id.clone(), m.clone()))
                        .or_default()
                        .push(needs);
                    barriers += usize::from(needs);
                }
            }
            for ((id, members), votes) in &decided {
                assert_eq!(votes.len(), members.len(), "{id} {members:?}");
                assert!(
                    votes.iter().all(|&v| v == votes[0]),
                    "{id} {members:?}: members disagree {votes:?}"
                );
            }
            let total: usize = decided.keys().map(|(_, m)| m.len()).sum();
            // Megatron's layouts nest most groups in a few large ones (2 barriers per rank of the 22 groups of
            // the full 8-rank layout): most closing barriers go.
            assert!(
                4 * barriers <= total,
                "world {world}: {barriers} barriers for {total} memberships"
            );
        }
    }
}
