//! The plan's properties over random layouts and shardings, checked against an oracle that works out each rank's
//! shard from its coordinates alone:
//!
//! - every destination byte is covered exactly once, with the byte of the full tensor it stands for (small
//!   worlds: every byte is moved through a simulated run of the plan; thousands of ranks: the runs tile each
//!   shard);
//! - the bytes moved are the bytes the destinations hold, and the sources send each destination shard once
//!   (forwarding) or once per replica (not);
//! - no source rank sends more than its balanced share plus one bucket (and within two elements per group);
//! - no rank sends or receives more than a bucket in one bucket, and forwards read bytes that already arrived;
//! - no transfer cuts an element;
//! - the plan is the same when built twice, and survives JSON.

use std::collections::{BTreeMap, BTreeSet};

use hypercomm_grid::Grid;
use hypercomm_grid::layout::ParallelLayout;
use proptest::prelude::*;

use crate::shard::Shard;
use crate::strategies::{RefitCase, arb_refit, arb_refit_at_scale};
use crate::{ParamSharding, Peer, RefitPlan, Runs, Sharding, Side, Split};

/// `(shard, parts)` of `param` that `rank` holds on `layout`, from the rank's coordinates.
fn held(
    layout: &ParallelLayout,
    sharding: &Sharding,
    param: &ParamSharding,
    rank: usize,
) -> Option<(u64, u64)> {
    let grid: &Grid = if param.expert.is_some() {
        layout.expert()
    } else {
        layout.decoder()
    };
    let coord = |name| grid.coord(rank, name).expect("rank in the layout");
    let stages = sharding.stages(param, layout).expect("the case fits");
    if !stages.contains(&coord("pp")) {
        return None;
    }
    if let Some(expert) = param.expert {
        let ep = grid.dim_size("ep").expect("expert grid has ep");
        if coord("ep") != expert / (sharding.experts / ep) {
            return None;
        }
    }
    match param.split {
        Split::Replicated => Some((0, 1)),
        Split::Tp { .. } => Some((coord("tp") as u64, grid.dim_size("tp").expect("tp") as u64)),
    }
}

fn shard(param: &ParamSharding, (index, parts): (u64, u64)) -> Shard {
    Shard::new(
        &param.shape,
        param.dtype.size(),
        param.split.dim_blocks(),
        parts,
        index,
    )
}

/// Per (destination rank, parameter): each byte of its shard, once written, with the bucket it arrived in.
type Shards = BTreeMap<(usize, usize), Vec<Option<(u64, usize)>>>;

/// Per (destination rank, parameter): the byte ranges it received, `(start, end, bucket)`.
type Arrivals = BTreeMap<(usize, usize), Vec<(u64, u64, usize)>>;

fn build(case: &RefitCase) -> RefitPlan {
    RefitPlan::build(
        Side::new(&case.source, &case.sharding),
        Side::new(&case.destination, &case.sharding),
        case.options,
    )
    .expect("generated cases fit both layouts")
}

/// Totals, balance and bucket bounds, for any world size.
fn check_totals(case: &RefitCase, plan: &RefitPlan) -> Result<(), TestCaseError> {
    let params = &case.sharding.params;
    let bucket = case.options.bucket_bytes;
    // What the destinations hold, and each destination shard once.
    let (mut needed, mut once) = (0u64, 0u64);
    for (p, param) in params.iter().enumerate() {
        let mut shards = BTreeSet::new();
        let mut held_bytes = 0;
        for rank in case.destination.ranks() {
            if let Some(s) = held(&case.destination, &case.sharding, param, rank) {
                held_bytes += shard(param, s).bytes();
                shards.insert(s);
            }
        }
        prop_assert_eq!(plan.params()[p].needed(), held_bytes, "{}", &param.name);
        needed += held_bytes;
        once += shards.iter().map(|&s| shard(param, s).bytes()).sum::<u64>();
    }
    prop_assert_eq!(plan.moved_bytes(), needed);
    prop_assert_eq!(plan.needed_bytes(), needed);
    let from_sources: u64 = plan
        .transfers()
        .iter()
        .filter(|t| matches!(t.from, Peer::Source(_)))
        .map(|t| t.bytes())
        .sum();
    prop_assert_eq!(
        from_sources,
        if case.options.forward { once } else { needed }
    );

    // Balance: the bytes each source shard serves, split evenly over the ranks holding it.
    let mut served: BTreeMap<(usize, (u64, u64)), u64> = BTreeMap::new();
    let mut sent: BTreeMap<usize, u64> = BTreeMap::new();
    for t in plan.transfers() {
        if let Peer::Source(r) = t.from {
            let s = held(&case.source, &case.sharding, &params[t.param], r);
            prop_assert!(
                s.is_some(),
                "source {} sends {} it does not hold",
                r,
                params[t.param].name
            );
            *served.entry((t.param, s.unwrap_or_default())).or_default() += t.bytes();
            *sent.entry(r).or_default() += t.bytes();
        }
    }
    let mut holders: BTreeMap<(usize, (u64, u64)), Vec<usize>> = BTreeMap::new();
    for &(p, s) in served.keys() {
        let ranks = case
            .source
            .ranks()
            .filter(|&r| held(&case.source, &case.sharding, &params[p], r) == Some(s))
            .collect();
        holders.insert((p, s), ranks);
    }
    // Groups: distinct holder sets, with the widest element among what they serve.
    let mut groups: BTreeMap<&Vec<usize>, u64> = BTreeMap::new();
    for (&(p, _), ranks) in &holders {
        let elem = groups.entry(ranks).or_default();
        *elem = (*elem).max(params[p].dtype.size());
    }
    for rank in case.source.ranks() {
        let share: f64 = served
            .iter()
            .filter(|(key, _)| holders[key].contains(&rank))
            .map(|(key, &bytes)| bytes as f64 / holders[key].len() as f64)
            .sum();
        let slack: u64 = groups
            .iter()
            .filter(|(g, _)| g.contains(&rank))
            .map(|(_, &e)| 2 * e)
            .sum();
        let got = sent.get(&rank).copied().unwrap_or(0) as f64;
        prop_assert!(
            got <= share + bucket as f64,
            "rank {} sends {} > share {} + bucket",
            rank,
            got,
            share
        );
        prop_assert!(
            (got - share).abs() < slack.max(1) as f64,
            "rank {} sends {}, share {}",
            rank,
            got,
            share
        );
        prop_assert!((plan.balanced_share(rank) - share).abs() < 1e-6 * share.max(1.0));
    }

    // Buckets: bounded per rank, in order, every transfer within one bucket and normalised.
    let mut load: BTreeMap<(usize, Peer, bool), u64> = BTreeMap::new();
    let mut last = 0;
    for t in plan.transfers() {
        prop_assert!(t.bucket >= last && t.bucket < plan.bucket_count());
        last = t.bucket;
        prop_assert!(t.bytes() > 0 && t.bytes() <= bucket);
        prop_assert_eq!(&t.runs.clone().normalized(), &t.runs);
        let elem = params[t.param].dtype.size();
        let r = &t.runs;
        let numbers = [r.src_offset, r.dst_offset, r.len]
            .into_iter()
            .chain(r.repeat.iter().flat_map(|s| [s.src, s.dst]));
        prop_assert!(
            numbers.into_iter().all(|n| n % elem == 0),
            "{:?} cuts a {}-byte element",
            r,
            elem
        );
        *load.entry((t.bucket, t.from, true)).or_default() += t.bytes();
        *load
            .entry((t.bucket, Peer::Destination(t.to), false))
            .or_default() += t.bytes();
    }
    prop_assert!(load.values().all(|&l| l <= bucket));
    Ok(())
}

/// Runs the plan on bytes that name their place in the full tensor: every destination byte is written once, with
/// the right byte, and forwards read only what arrived in an earlier bucket.
fn simulate(case: &RefitCase, plan: &RefitPlan) -> Result<(), TestCaseError> {
    let params = &case.sharding.params;
    let id = |p: usize, byte: u64| ((p as u64) << 40) | byte;
    let mut dst = Shards::new();
    for (p, param) in params.iter().enumerate() {
        for rank in case.destination.ranks() {
            if let Some(s) = held(&case.destination, &case.sharding, param, rank) {
                dst.insert((rank, p), vec![None; shard(param, s).bytes() as usize]);
            }
        }
    }
    for t in plan.transfers() {
        let param = &params[t.param];
        let source = match t.from {
            Peer::Source(r) => {
                held(&case.source, &case.sharding, param, r).map(|s| shard(param, s))
            }
            Peer::Destination(_) => None,
        };
        for (s, d, len) in t.runs.iter() {
            for i in 0..len {
                let value = match t.from {
                    Peer::Source(r) => {
                        let byte = source
                            .as_ref()
                            .and_then(|sh| sh.full_byte(&param.shape, s + i));
                        prop_assert!(
                            byte.is_some(),
                            "source {} reads {} past its shard of {}",
                            r,
                            s + i,
                            param.name
                        );
                        id(t.param, byte.unwrap_or_default())
                    }
                    Peer::Destination(r) => {
                        let got = dst
                            .get(&(r, t.param))
                            .and_then(|b| b.get((s + i) as usize).copied().flatten());
                        prop_assert!(
                            matches!(got, Some((_, b)) if b < t.bucket),
                            "destination {} forwards byte {} of {} in bucket {} before it arrived ({:?})",
                            r,
                            s + i,
                            param.name,
                            t.bucket,
                            got
                        );
                        got.map_or(0, |(v, _)| v)
                    }
                };
                let slot = dst
                    .get_mut(&(t.to, t.param))
                    .and_then(|b| b.get_mut((d + i) as usize));
                prop_assert!(
                    slot.is_some(),
                    "destination {} receives byte {} of {} it does not hold",
                    t.to,
                    d + i,
                    param.name
                );
                if let Some(slot) = slot {
                    prop_assert!(
                        slot.is_none(),
                        "destination {} receives byte {} of {} twice",
                        t.to,
                        d + i,
                        param.name
                    );
                    *slot = Some((value, t.bucket));
                }
            }
        }
    }
    for (&(rank, p), bytes) in &dst {
        let param = &params[p];
        let sh = shard(
            param,
            held(&case.destination, &case.sharding, param, rank).unwrap_or_default(),
        );
        for (offset, got) in bytes.iter().enumerate() {
            let want = sh.full_byte(&param.shape, offset as u64).map(|b| id(p, b));
            prop_assert_eq!(
                got.map(|(v, _)| v),
                want,
                "destination {} byte {} of {}",
                rank,
                offset,
                &param.name
            );
        }
    }
    Ok(())
}

/// At any scale: the runs each destination rank receives tile each shard it holds exactly, and forwards read
/// byte ranges that arrived in earlier buckets.
fn check_coverage(case: &RefitCase, plan: &RefitPlan) -> Result<(), TestCaseError> {
    let params = &case.sharding.params;
    let mut arrived = Arrivals::new();
    for t in plan.transfers() {
        let runs = arrived.entry((t.to, t.param)).or_default();
        runs.extend(t.runs.iter().map(|(_, d, len)| (d, d + len, t.bucket)));
    }
    for runs in arrived.values_mut() {
        runs.sort_unstable();
    }
    let mut expected = BTreeSet::new();
    for (p, param) in params.iter().enumerate() {
        for rank in case.destination.ranks() {
            if let Some(s) = held(&case.destination, &case.sharding, param, rank) {
                expected.insert((rank, p));
                let runs = arrived.get(&(rank, p)).map_or(&[][..], Vec::as_slice);
                let mut end = 0;
                for &(start, stop, _) in runs {
                    prop_assert_eq!(
                        start,
                        end,
                        "destination {} shard of {}: gap or overlap",
                        rank,
                        &param.name
                    );
                    end = stop;
                }
                prop_assert_eq!(
                    end,
                    shard(param, s).bytes(),
                    "destination {} misses the end of {}",
                    rank,
                    &param.name
                );
            }
        }
    }
    prop_assert_eq!(arrived.keys().copied().collect::<BTreeSet<_>>(), expected);
    for t in plan.transfers() {
        let Peer::Destination(from) = t.from else {
            continue;
        };
        let runs = &arrived[&(from, t.param)];
        for (s, _, len) in t.runs.iter() {
            let mut at = runs.partition_point(|&(_, stop, _)| stop <= s);
            while at < runs.len() && runs[at].0 < s + len {
                prop_assert!(
                    runs[at].2 < t.bucket,
                    "destination {} forwards before receiving",
                    from
                );
                at += 1;
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn plans_move_every_byte_once_to_the_right_place(case in arb_refit(32, 5)) {
        let plan = build(&case);
        simulate(&case, &plan)?;
        check_totals(&case, &plan)?;
        check_coverage(&case, &plan)?;
        prop_assert_eq!(&build(&case), &plan);
        let json = serde_json::to_string(&plan).expect("plans serialise");
        prop_assert_eq!(&serde_json::from_str::<RefitPlan>(&json).expect("and deserialise"), &plan);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn plans_hold_on_paper_at_thousands_of_ranks(case in arb_refit_at_scale(4096, 4)) {
        let plan = build(&case);
        check_totals(&case, &plan)?;
        check_coverage(&case, &plan)?;
    }
}

#[test]
fn runs_of_a_shard_pair_stay_few_whatever_the_tensor_size() {
    // A 8192 x 8192 row-parallel weight re-split from tp 8 to tp 2: one Runs per pair of shards, 8192 rows each.
    let shape = [8192u64, 8192];
    let src = Shard::new(&shape, 2, Some((1, 1)), 8, 3);
    let dst = Shard::new(&shape, 2, Some((1, 1)), 2, 0);
    let runs: Vec<Runs> = src.overlap(&dst);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].run_count(), 8192);
    assert_eq!(runs[0].bytes(), 8192 * 1024 * 2);
}
