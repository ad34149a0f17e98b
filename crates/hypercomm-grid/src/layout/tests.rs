//! Layout tests: Megatron-Core's documented examples, its validation rules, and where we deliberately differ.

use std::collections::BTreeSet;

use crate::layout::{GroupKind, LayoutConfig, LayoutError, ParallelLayout};

fn groups(layout: &ParallelLayout, kind: GroupKind) -> Vec<Vec<usize>> {
    layout.groups(kind).unwrap().collect()
}

fn as_set(groups: Vec<Vec<usize>>) -> BTreeSet<Vec<usize>> {
    groups.into_iter().collect()
}

fn r(range: std::ops::Range<usize>) -> Vec<usize> {
    range.collect()
}

#[test]
fn initialize_model_parallel_docstring_16_gpus_tp2_pp4() {
    let layout = LayoutConfig::new(16).tp(2).pp(4).build().unwrap();
    assert_eq!(
        groups(&layout, GroupKind::Dp),
        [
            [0, 2],
            [1, 3],
            [4, 6],
            [5, 7],
            [8, 10],
            [9, 11],
            [12, 14],
            [13, 15]
        ]
    );
    assert_eq!(
        groups(&layout, GroupKind::Tp),
        [
            [0, 1],
            [2, 3],
            [4, 5],
            [6, 7],
            [8, 9],
            [10, 11],
            [12, 13],
            [14, 15]
        ]
    );
    assert_eq!(
        groups(&layout, GroupKind::Pp),
        [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    );
    assert_eq!(
        groups(&layout, GroupKind::Mp),
        [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]]
    );
    assert_eq!(
        groups(&layout, GroupKind::TpDpCp),
        [r(0..4), r(4..8), r(8..12), r(12..16)]
    );
    assert_eq!(
        groups(&layout, GroupKind::DpCp),
        groups(&layout, GroupKind::Dp)
    );
    assert_eq!(
        groups(&layout, GroupKind::Cp),
        (0..16).map(|i| vec![i]).collect::<Vec<_>>()
    );
}

#[test]
fn context_parallel_docstring_8_gpus_tp4_cp2() {
    let layout = LayoutConfig::new(8).tp(4).cp(2).build().unwrap();
    assert_eq!(
        groups(&layout, GroupKind::Cp),
        [[0, 4], [1, 5], [2, 6], [3, 7]]
    );
}

#[test]
fn hierarchical_cp_docstring_16_gpus_2_2_4() {
    let layout = LayoutConfig::new(16)
        .cp(16)
        .hcp_sizes(vec![2, 2, 4])
        .build()
        .unwrap();
    let all = groups(&layout, GroupKind::Hcp);
    assert_eq!(all.len(), 8 + 8 + 4);
    assert_eq!(
        all[..8],
        [
            [0, 1],
            [2, 3],
            [4, 5],
            [6, 7],
            [8, 9],
            [10, 11],
            [12, 13],
            [14, 15]
        ]
    );
    assert_eq!(
        all[8..16],
        [
            [0, 2],
            [1, 3],
            [4, 6],
            [5, 7],
            [8, 10],
            [9, 11],
            [12, 14],
            [13, 15]
        ]
    );
    assert_eq!(
        all[16..],
        [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    );
    let mine: Vec<Vec<usize>> = layout
        .memberships(6, GroupKind::Hcp)
        .unwrap()
        .into_iter()
        .map(|m| m.members)
        .collect();
    assert_eq!(mine, [vec![6, 7], vec![4, 6], vec![2, 6, 10, 14]]);
    assert_eq!(
        layout.group_of(6, GroupKind::Hcp),
        Err(LayoutError::MultiLevel { kind: "hcp" })
    );
}

#[test]
fn expert_grid_world16_tp2_cp2_pp2_ep2() {
    // Computed with Megatron-Core 0.16.1's RankGenerator (default order).
    let layout = LayoutConfig::new(16)
        .tp(2)
        .cp(2)
        .pp(2)
        .ep(2)
        .build()
        .unwrap();
    assert_eq!((layout.dp(), layout.expert_dp(), layout.etp()), (2, 2, 2));
    assert_eq!(
        groups(&layout, GroupKind::Cp)[..5],
        [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10]]
    );
    assert_eq!(
        groups(&layout, GroupKind::Dp)[..5],
        [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12]]
    );
    assert_eq!(
        groups(&layout, GroupKind::DpCp),
        [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    );
    assert_eq!(
        groups(&layout, GroupKind::TpCp),
        [r(0..4), r(4..8), r(8..12), r(12..16)]
    );
    assert_eq!(groups(&layout, GroupKind::Pp)[..2], [[0, 8], [1, 9]]);
    assert_eq!(groups(&layout, GroupKind::Pp)[7], [7, 15]);
    assert_eq!(
        groups(&layout, GroupKind::Mp),
        [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    );
    assert_eq!(groups(&layout, GroupKind::TpDpCp), [r(0..8), r(8..16)]);
    assert_eq!(groups(&layout, GroupKind::ExptTp)[..2], [[0, 1], [2, 3]]);
    assert_eq!(
        groups(&layout, GroupKind::Ep)[..3],
        [[0, 2], [1, 3], [4, 6]]
    );
    assert_eq!(groups(&layout, GroupKind::ExptDp)[..2], [[0, 4], [1, 5]]);
    assert_eq!(
        groups(&layout, GroupKind::TpEp),
        [r(0..4), r(4..8), r(8..12), r(12..16)]
    );
    assert_eq!(
        groups(&layout, GroupKind::TpEpPp),
        [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    );
    assert_eq!(
        groups(&layout, GroupKind::ExptDpAg),
        groups(&layout, GroupKind::ExptDp)
    );
}

#[test]
fn non_default_order_tp_cp_ep_pp_dp() {
    let layout = LayoutConfig::new(16)
        .tp(2)
        .pp(4)
        .order("tp-cp-ep-pp-dp")
        .build()
        .unwrap();
    assert_eq!(
        groups(&layout, GroupKind::Dp),
        [
            [0, 8],
            [1, 9],
            [2, 10],
            [3, 11],
            [4, 12],
            [5, 13],
            [6, 14],
            [7, 15]
        ]
    );
    assert_eq!(
        groups(&layout, GroupKind::Pp),
        [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    );
}

#[test]
fn embedding_groups_are_first_and_last_stage() {
    let layout = LayoutConfig::new(16).tp(2).pp(4).build().unwrap();
    assert_eq!(
        groups(&layout, GroupKind::Embd),
        [[0, 12], [1, 13], [2, 14], [3, 15]]
    );
    assert_eq!(groups(&layout, GroupKind::PosEmbd), [[0], [1], [2], [3]]);
    let last = layout.group_of(13, GroupKind::Embd).unwrap().unwrap();
    assert_eq!((last.members, last.index, last.group), (vec![1, 13], 1, 1));
    assert_eq!(layout.group_of(5, GroupKind::Embd).unwrap(), None);
    assert_eq!(layout.group_of(13, GroupKind::PosEmbd).unwrap(), None);
    assert_eq!(
        layout
            .group_of(1, GroupKind::PosEmbd)
            .unwrap()
            .unwrap()
            .members,
        [1]
    );

    let flat = LayoutConfig::new(4).tp(2).build().unwrap();
    assert_eq!(groups(&flat, GroupKind::Embd), [[0], [1], [2], [3]]);
    assert_eq!(
        flat.group_of(3, GroupKind::Embd).unwrap().unwrap().members,
        [3]
    );
}

#[test]
fn distributed_optimizer_instances_world16_tp2() {
    let layout = LayoutConfig::new(16)
        .tp(2)
        .dist_opt_instances(2)
        .build()
        .unwrap();
    assert_eq!(
        as_set(groups(&layout, GroupKind::IntraDpCp)),
        as_set(vec![
            vec![0, 2, 4, 6],
            vec![8, 10, 12, 14],
            vec![1, 3, 5, 7],
            vec![9, 11, 13, 15]
        ])
    );
    assert_eq!(
        as_set(groups(&layout, GroupKind::IntraExptDp)),
        as_set(groups(&layout, GroupKind::IntraDpCp))
    );
    assert_eq!(
        as_set(groups(&layout, GroupKind::InterDistOpt)),
        as_set(vec![
            vec![0, 8],
            vec![2, 10],
            vec![4, 12],
            vec![6, 14],
            vec![1, 9],
            vec![3, 11],
            vec![5, 13],
            vec![7, 15]
        ])
    );
    assert_eq!(
        groups(&layout, GroupKind::IntraDistOpt),
        [r(0..8), r(8..16)]
    );

    let piped = LayoutConfig::new(16)
        .tp(2)
        .pp(2)
        .dist_opt_instances(2)
        .build()
        .unwrap();
    assert_eq!(
        groups(&piped, GroupKind::IntraDistOpt),
        [
            vec![0, 1, 2, 3, 8, 9, 10, 11],
            vec![4, 5, 6, 7, 12, 13, 14, 15]
        ]
    );
}

#[test]
fn one_instance_keeps_whole_groups_and_has_no_inter_group() {
    let layout = LayoutConfig::new(16).tp(2).cp(2).build().unwrap();
    assert_eq!(
        groups(&layout, GroupKind::IntraDpCp),
        groups(&layout, GroupKind::DpCp)
    );
    assert_eq!(
        groups(&layout, GroupKind::IntraExptDp),
        groups(&layout, GroupKind::ExptDp)
    );
    assert_eq!(groups(&layout, GroupKind::IntraDistOpt), [r(0..16)]);
    let err = layout.groups(GroupKind::InterDistOpt).unwrap_err();
    assert!(
        err.to_string()
            .contains("more than one distributed-optimizer instance"),
        "{err}"
    );
    assert!(!layout.kinds().contains(&GroupKind::InterDistOpt));
}

#[test]
fn all_gather_groups_match_their_twins_for_any_order_and_offset() {
    for order in [
        "tp-cp-ep-dp-pp",
        "tp-pp-cp-ep-dp",
        "pp-dp-ep-cp-tp",
        "cp-tp-dp-ep-pp",
    ] {
        let layout = LayoutConfig::new(64)
            .tp(2)
            .cp(2)
            .ep(2)
            .order(order)
            .rank_offset(100)
            .build()
            .unwrap();
        assert_eq!(
            groups(&layout, GroupKind::DpCpAg),
            groups(&layout, GroupKind::DpCp),
            "{order}"
        );
        assert_eq!(
            groups(&layout, GroupKind::ExptDpAg),
            groups(&layout, GroupKind::ExptDp),
            "{order}"
        );
        for rank in layout.ranks() {
            assert_eq!(
                layout.group_of(rank, GroupKind::DpCpAg).unwrap(),
                layout.group_of(rank, GroupKind::DpCp).unwrap()
            );
        }
    }
    let no_ep = LayoutConfig::new(8).tp(2).build().unwrap();
    let err = no_ep.group_of(0, GroupKind::ExptDpAg).unwrap_err();
    assert_eq!(
        err.to_string(),
        "this layout has no expt_dp_ag group: expt_dp_ag exists only when ep > 1"
    );
}

#[test]
fn rank_offset_shifts_every_kind() {
    let base = LayoutConfig::new(32)
        .tp(2)
        .pp(2)
        .cp(2)
        .ep(2)
        .dist_opt_instances(2);
    let at0 = base.clone().build().unwrap();
    let at64 = base.rank_offset(64).build().unwrap();
    assert_eq!(at64.ranks(), 64..96);
    for kind in at0.kinds() {
        let shifted: Vec<Vec<usize>> = groups(&at0, kind)
            .into_iter()
            .map(|g| g.into_iter().map(|r| r + 64).collect())
            .collect();
        assert_eq!(groups(&at64, kind), shifted, "{kind}");
    }
    assert!(matches!(
        at64.group_of(3, GroupKind::Tp),
        Err(LayoutError::Grid(_))
    ));
}

#[test]
fn validation_follows_megatron_rules() {
    let err = |c: LayoutConfig| c.build().unwrap_err().to_string();
    assert_eq!(
        err(LayoutConfig::new(64).tp(3)),
        "tp*pp*cp=3 does not divide world 64"
    );
    assert_eq!(
        err(LayoutConfig::new(64).tp(2).ep(3)),
        "etp*ep*pp=6 does not divide world 64"
    );
    assert_eq!(
        err(LayoutConfig::new(64).tp(0)),
        "tp=0: parallel sizes must be at least 1"
    );
    assert_eq!(
        err(LayoutConfig::new(0)),
        "world=0: parallel sizes must be at least 1"
    );
    assert_eq!(
        err(LayoutConfig::new(64).tp(2).order("tp-cp-ep-dp-pp-tp")),
        "order \"tp-cp-ep-dp-pp-tp\" names tp more than once"
    );
    assert_eq!(
        err(LayoutConfig::new(64).tp(2).order("tp-cp-ep-xp-pp")),
        "order \"tp-cp-ep-xp-pp\" has unknown token \"xp\" (known: tp, cp, ep, dp, pp)"
    );
    assert_eq!(
        err(LayoutConfig::new(64).tp(2).pp(2).order("tp-dp")),
        "order \"tp-dp\" leaves out pp, whose size is 2 (only size-1 dims may be left out)"
    );
    // Expert dp differs from dp (ep takes part of it), so pp must be the slowest dimension.
    assert_eq!(
        err(LayoutConfig::new(16).pp(2).ep(2).order("tp-cp-ep-pp-dp")),
        "order tp-cp-ep-pp-dp puts a dim of size > 1 after pp, so dp=8 and expert dp=4 must be equal (pp=2)"
    );
    assert_eq!(
        err(LayoutConfig::new(16).tp(2).dist_opt_instances(3)),
        "3 distributed-optimizer instances do not divide dp*cp=8"
    );
    assert_eq!(
        err(LayoutConfig::new(16).ep(4).cp(2).dist_opt_instances(8)),
        "8 distributed-optimizer instances do not divide expert_dp=4"
    );
    assert_eq!(
        err(LayoutConfig::new(16).cp(8).hcp_sizes(vec![2, 2])),
        "hierarchical cp sizes [2, 2] multiply to 4, not cp=8"
    );
    assert!(err(LayoutConfig::new(16).cp(8).hcp_sizes(vec![])).contains("non-empty"));
    // Size-1 dims after pp are harmless: ep is appended after pp here, and dp=8 differs from expert dp=16.
    let layout = LayoutConfig::new(64)
        .tp(2)
        .pp(2)
        .cp(2)
        .order("cp-dp-tp-pp")
        .build()
        .unwrap();
    assert_eq!(layout.order().to_string(), "cp-dp-tp-pp-ep");
    assert_eq!((layout.dp(), layout.expert_dp()), (8, 16));
    // Order strings are case-insensitive; a left-out size-1 dim is appended.
    let layout = LayoutConfig::new(8).tp(2).order("TP-DP").build().unwrap();
    assert_eq!(layout.order().to_string(), "tp-dp-pp-ep-cp");
}

#[test]
fn ep_and_cp_together_live_in_separate_grids() {
    // Megatron forbids ep > 1 with cp > 1 in one rank generator; the layout keeps them apart (ep = 1 in the
    // decoder grid, cp = 1 in the expert grid), so the combination is valid and cp folds into expert dp.
    let layout = LayoutConfig::new(8).tp(2).cp(2).ep(2).build().unwrap();
    assert_eq!(
        groups(&layout, GroupKind::Ep),
        [[0, 2], [1, 3], [4, 6], [5, 7]]
    );
    assert_eq!(
        groups(&layout, GroupKind::ExptDp),
        [[0, 4], [1, 5], [2, 6], [3, 7]]
    );
    let sizes = crate::layout::TokenSizes {
        tp: 2,
        cp: 2,
        ep: 2,
        dp: 1,
        pp: 1,
    };
    let err = crate::layout::rank_generator(layout.order(), sizes, 0).unwrap_err();
    assert_eq!(err, LayoutError::EpWithCp { ep: 2, cp: 2 });
}

#[test]
fn layouts_round_trip_through_json() {
    let layout = LayoutConfig::new(64)
        .tp(2)
        .pp(2)
        .cp(2)
        .ep(2)
        .etp(1)
        .order("tp-cp-ep-dp-pp")
        .rank_offset(8)
        .dist_opt_instances(2)
        .hcp_sizes(vec![2])
        .build()
        .unwrap();
    let json = serde_json::to_string(&layout).unwrap();
    assert_eq!(
        serde_json::from_str::<ParallelLayout>(&json).unwrap(),
        layout
    );
    let partial: ParallelLayout = serde_json::from_str(r#"{"world": 16, "tp": 4}"#).unwrap();
    assert_eq!((partial.dp(), partial.etp()), (4, 4));
    let err = serde_json::from_str::<ParallelLayout>(r#"{"world": 16, "tp": 3}"#).unwrap_err();
    assert!(
        err.to_string()
            .contains("tp*pp*cp=3 does not divide world 16"),
        "{err}"
    );
    let err = serde_json::from_str::<ParallelLayout>(r#"{"world": 16, "tq": 2}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `tq`"), "{err}");
}

#[test]
fn hcp_levels_are_reachable_one_by_one_and_agree_with_the_flat_stream() {
    let layout = LayoutConfig::new(16)
        .tp(2)
        .cp(8)
        .hcp_sizes(vec![2, 4])
        .build()
        .unwrap();
    let flat: Vec<Vec<usize>> = layout.groups(GroupKind::Hcp).unwrap().collect();
    let by_level: Vec<Vec<usize>> = (0..layout.hcp_levels())
        .flat_map(|l| layout.hcp_groups(l).unwrap())
        .collect();
    assert_eq!(flat, by_level);
    for level in 0..2 {
        let groups: Vec<Vec<usize>> = layout.hcp_groups(level).unwrap().collect();
        for rank in 0..16 {
            let m = layout.hcp_group_of(rank, level).unwrap();
            assert!(groups.contains(&m.members), "rank {rank} level {level}");
            assert_eq!(m.members[m.index], rank);
        }
    }
    let e = layout.hcp_groups(2).err().unwrap().to_string();
    assert!(e.contains("hcp has levels 0..2, not level 2"), "{e}");
    assert!(layout.hcp_group_of(3, 5).is_err());
}

/// One rank's groups cost O(dims), not O(world): at 2^50 ranks, where listing a world-sized group (`intra_dist_opt`
/// holds half the world here) or checking the layout group by group could neither finish nor allocate, building
/// the layout and describing every group of rank 777 must still work, and agree with the small worlds.
#[test]
fn one_rank_s_groups_do_not_depend_on_the_world_size() {
    let rank = 777;
    let mut small_groups: Option<Vec<Vec<usize>>> = None;
    for world in [1usize << 16, 1 << 20, 1 << 50] {
        let layout = LayoutConfig::new(world)
            .tp(8)
            .cp(2)
            .ep(8)
            .pp(16)
            .dist_opt_instances(2)
            .hcp_sizes(vec![2, 1])
            .build()
            .unwrap();
        let (dp, edp) = (world / 256, world / 1024);
        let expected_len = |kind: GroupKind| -> Vec<usize> {
            match kind {
                GroupKind::Tp | GroupKind::Ep | GroupKind::ExptTp => vec![8],
                GroupKind::Pp => vec![16],
                GroupKind::Mp => vec![128],
                GroupKind::Embd | GroupKind::Cp | GroupKind::InterDistOpt => vec![2],
                GroupKind::PosEmbd => vec![1],
                GroupKind::TpCp => vec![16],
                GroupKind::Hcp => vec![2, 1],
                GroupKind::TpEp => vec![64],
                GroupKind::TpEpPp => vec![1024],
                GroupKind::TpDpCp => vec![16 * dp],
                GroupKind::Dp | GroupKind::IntraDpCp => vec![dp],
                GroupKind::DpCp | GroupKind::DpCpAg => vec![2 * dp],
                GroupKind::ExptDp | GroupKind::ExptDpAg => vec![edp],
                GroupKind::IntraExptDp => vec![edp / 2],
                GroupKind::IntraDistOpt => vec![world / 2],
            }
        };
        assert_eq!(layout.kinds().len(), GroupKind::ALL.len());
        let mut small = Vec::new();
        for kind in layout.kinds() {
            let memberships = layout.compact_memberships(rank, kind).unwrap();
            let lens: Vec<usize> = memberships.iter().map(|m| m.ranks.len()).collect();
            assert_eq!(lens, expected_len(kind), "{kind} at world {world}");
            for m in &memberships {
                assert_eq!(m.ranks.get(m.index), Some(rank), "{kind} at world {world}");
                let head: Vec<usize> = m.ranks.iter().take(1000).collect();
                assert!(head.windows(2).all(|w| w[0] < w[1]), "{kind}: {head:?}");
                let last = m.ranks.get(m.ranks.len() - 1).unwrap();
                assert!(last < world, "{kind} at world {world}: last member {last}");
                // Groups inside one pipeline stage and one data-parallel replica are the same in every world.
                if [GroupKind::Tp, GroupKind::Cp, GroupKind::TpCp, GroupKind::Ep]
                    .into_iter()
                    .chain([GroupKind::ExptTp, GroupKind::TpEp, GroupKind::PosEmbd])
                    .any(|k| k == kind)
                {
                    small.push(m.ranks.to_vec());
                }
            }
        }
        match &small_groups {
            None => small_groups = Some(small),
            Some(first) => assert_eq!(first, &small, "world {world}"),
        }
    }
}
