//! Topology tests: the cluster model's checks and classes, golden rankings on the shipped example clusters, and
//! properties of the search on random clusters and layouts.

use hypercomm_grid::layout::{LayoutConfig, Order};
use proptest::prelude::*;

use crate::strategies::arb_cluster;
use crate::*;

const HGX: &str = include_str!("../../../examples/clusters/hgx-h100-8x8-infiniband.json");
const NVL72: &str = include_str!("../../../examples/clusters/gb200-nvl72.json");
const NVL72_X2: &str = include_str!("../../../examples/clusters/gb200-nvl72-x2.json");

fn cluster(json: &str) -> Cluster {
    Cluster::from_json(json).unwrap()
}

fn err(json: &str) -> String {
    Cluster::from_json(json).unwrap_err().to_string()
}

fn model_traffic(config: &LayoutConfig) -> Traffic {
    Traffic::from_model(&ModelShape::default(), &config.clone().build().unwrap()).unwrap()
}

fn kind(score: &Score, kind: TrafficKind) -> &KindCost {
    score.kinds.iter().find(|k| k.kind == kind).unwrap()
}

#[test]
fn validation_errors_name_the_bad_entry() {
    let bw = r#""bandwidth": {"nvlink": 450, "nic": 50}"#;
    assert_eq!(
        err(&format!(r#"{{{bw}, "hosts": []}}"#)),
        "the cluster lists no hosts"
    );
    assert_eq!(
        err(&format!(
            r#"{{{bw}, "hosts": [{{"name": "a", "gpus": 8}}, {{"name": "a", "gpus": 8}}]}}"#
        )),
        "host \"a\" is listed more than once"
    );
    assert_eq!(
        err(&format!(
            r#"{{{bw}, "hosts": [{{"name": "a", "gpus": 8}}, {{"name": "b", "gpus": 0}}]}}"#
        )),
        "host \"b\" has gpus=0: every host needs at least one GPU"
    );
    assert_eq!(
        err(&format!(
            r#"{{{bw}, "hosts": [{{"name": "", "gpus": 8}}]}}"#
        )),
        "host #0 has an empty name"
    );
    assert_eq!(
        err(&format!(
            r#"{{{bw}, "hosts": [{{"name": "a", "gpus": 8}}, {{"name": "b", "gpus": 8, "nics": 0}}]}}"#
        )),
        "host \"b\" has nics=0: in a cluster of 2 hosts every host needs a NIC"
    );
    assert_eq!(
        err(
            r#"{"bandwidth": {"nic": 50}, "hosts": [{"name": "a", "gpus": 8, "nvlink_domain": "a"}]}"#
        ),
        "bandwidth.nvlink is not given, but host \"a\" names an nvlink_domain"
    );
    assert_eq!(
        err(r#"{"bandwidth": {}, "hosts": [{"name": "a", "gpus": 8}, {"name": "b", "gpus": 8}]}"#),
        "bandwidth.nic is not given, but the cluster has 2 hosts"
    );
    assert_eq!(
        err(r#"{"bandwidth": {"nic": -5}, "hosts": [{"name": "a", "gpus": 8}]}"#),
        "bandwidth.nic=-5 must be a positive number of GB/s"
    );
    assert_eq!(
        err(r#"{"bandwidth": {"nvlink": 10}, "hosts": [{"name": "a", "gpus": 8}]}"#),
        "bandwidth.nvlink=10 is below bandwidth.pcie=64: NVLink must be the faster link"
    );
    assert_eq!(
        err(&format!(
            r#"{{{bw}, "hosts": [{{"name": "a", "gpus": 8, "rack": "r"}}, {{"name": "b", "gpus": 8}}]}}"#
        )),
        "host \"b\" names no rack while host \"a\" does: give every host a rack or none"
    );
    let placed = |placement: &str| {
        err(&format!(
            r#"{{{bw}, "hosts": [{{"name": "a", "gpus": 2}}, {{"name": "b", "gpus": 2}}], "placement": {placement}}}"#
        ))
    };
    assert_eq!(
        placed(r#"[{"host": "a", "device": 0}, {"host": "c", "device": 0}]"#),
        "placement[1] names host \"c\", which the cluster does not list"
    );
    assert_eq!(
        placed(r#"[{"host": "a", "device": 2}]"#),
        "placement[0] names device 2 of host \"a\", which has 2 GPUs"
    );
    assert_eq!(
        placed(r#"[{"host": "b", "device": 1}, {"host": "b", "device": 1}]"#),
        "placement[1] puts a second rank on device 1 of host \"b\" (first: rank 0)"
    );
    let e = err(r#"{"bandwidth": {}, "hosts": [{"name": "a", "gpus": 8, "colour": "red"}]}"#);
    assert!(
        e.starts_with("cluster description: unknown field `colour`"),
        "{e}"
    );
}

#[test]
fn graph_has_the_documented_nodes_and_edges() {
    let c = cluster(HGX);
    let g = c.graph();
    // 64 GPUs, 8 hosts, 8 NVSwitches, 2 leaves, 1 spine.
    assert_eq!(g.node_count(), 64 + 8 + 8 + 2 + 1);
    // Per GPU a PCIe and an NVLink edge; per host a NIC edge; per rack a spine edge.
    assert_eq!(g.edge_count(), 64 * 2 + 8 + 2);
    let nic_edges: Vec<f64> = g
        .edge_weights()
        .filter(|l| l.class == LinkClass::Nic)
        .map(|l| l.bandwidth)
        .collect();
    assert_eq!(nic_edges, [400.0; 8], "eight 50 GB/s NICs per host");
    assert_eq!(
        g[petgraph::graph::NodeIndex::new(9)],
        Node::Device { host: 1, device: 1 }
    );
}

#[test]
fn classes_follow_hosts_domains_and_racks() {
    let hgx = cluster(HGX);
    assert_eq!(hgx.class_between(0, 7), LinkClass::Nvlink);
    assert_eq!(
        hgx.class_between(7, 8),
        LinkClass::Nic,
        "node0 and node1 share rack0"
    );
    assert_eq!(
        hgx.class_between(0, 32),
        LinkClass::Spine,
        "node0 in rack0, node4 in rack1"
    );
    assert_eq!(
        hgx.classes_spanned(&[0, 1, 8, 32]),
        [LinkClass::Nvlink, LinkClass::Nic, LinkClass::Spine]
    );
    assert_eq!(hgx.class_of(&[3]), LinkClass::SameDevice);
    assert_eq!(hgx.best_class_for(8), LinkClass::Nvlink);
    assert_eq!(hgx.best_class_for(9), LinkClass::Nic);
    assert_eq!(hgx.best_class_for(33), LinkClass::Spine);
    let nvl = cluster(NVL72);
    assert_eq!(nvl.devices(), 72);
    assert_eq!(
        nvl.class_between(0, 71),
        LinkClass::Nvlink,
        "one NVLink domain across 18 trays"
    );
    assert_eq!(nvl.best_class_for(72), LinkClass::Nvlink);
    let pcie = cluster(
        r#"{"bandwidth": {"nic": 25}, "hosts": [{"name": "a", "gpus": 4}, {"name": "b", "gpus": 4}]}"#,
    );
    assert_eq!(pcie.class_between(0, 3), LinkClass::Pcie);
    assert_eq!(pcie.class_between(0, 4), LinkClass::Nic);
    assert_eq!(pcie.class_bandwidth(LinkClass::Nic), 25.0);
}

#[test]
fn cluster_round_trips_through_serde() {
    let c = cluster(NVL72_X2);
    let json = serde_json::to_string(&c).unwrap();
    let back: Cluster = serde_json::from_str(&json).unwrap();
    assert_eq!(back, c);
    assert_eq!(back.devices(), 144);
}

#[test]
fn nic_share_divides_a_host_s_nics_among_ranks_leaving_it() {
    // Two hosts of 8 GPUs with 2 NICs each; tp=1, dp=16: all 8 ranks of a host leave it at once.
    let c = cluster(
        r#"{"bandwidth": {"nvlink": 450, "nic": 50}, "hosts": [
            {"name": "a", "gpus": 8, "nics": 2, "nvlink_domain": "a"},
            {"name": "b", "gpus": 8, "nics": 2, "nvlink_domain": "b"}]}"#,
    );
    let layout = LayoutConfig::new(16).build().unwrap();
    let s = score(
        &c,
        &layout,
        Placement::Launcher,
        &Traffic {
            dp: 1e9,
            ..Traffic::default()
        },
    )
    .unwrap();
    let dp = kind(&s, TrafficKind::Dp);
    assert_eq!(dp.bandwidth_gbs, 2.0 * 50.0 / 8.0);
    assert_eq!(dp.seconds, 2.0 * 15.0 / 16.0 * 1e9 / (12.5 * 1e9));
}

/// 8 HGX hosts in 2 racks of 4, world 64, tp 8, pp 2 (dp 4), the default model's traffic.
///
/// tp=8 fills a host, so tp must be innermost to stay on NVLink. Then dp (reduce-scatter + all-gather of
/// 7e9·2/16 bytes, factor 1.5) outweighs pp (2·8 micro-batches of 4096·4096·2 bytes, factor 1): with tp-dp-pp
/// the dp groups (stride 8, 4 hosts) stay in a rack on the NIC and the pp pairs (stride 32) cross the 25 GB/s
/// spine; tp-pp-dp would put dp on the spine instead, which costs more.
#[test]
fn golden_hgx_8x8_tp8_pp2() {
    let c = cluster(HGX);
    let config = LayoutConfig::new(64).tp(8).pp(2);
    let ranking = search(&c, &config, &model_traffic(&config)).unwrap();
    let best = ranking.best();
    assert_eq!(
        (best.order.as_str(), best.placement),
        ("tp-dp-pp", Placement::Launcher)
    );
    assert_eq!(ranking.default_index, 0);
    let (tp, dp, pp) = (
        kind(best, TrafficKind::Tp),
        kind(best, TrafficKind::Dp),
        kind(best, TrafficKind::Pp),
    );
    assert_eq!(
        (tp.worst, tp.crosses_hosts, tp.flagged),
        (LinkClass::Nvlink, false, false)
    );
    assert_eq!((dp.worst, dp.bandwidth_gbs), (LinkClass::Nic, 50.0));
    assert_eq!((pp.worst, pp.bandwidth_gbs), (LinkClass::Spine, 25.0));
    let act = 4096.0 * 4096.0 * 2.0;
    assert_eq!(pp.seconds, 2.0 * 8.0 * act / 25e9);
    assert_eq!(dp.seconds, 1.5 * (7e9 * 2.0 / 16.0) / 50e9);
    assert_eq!(tp.seconds, 1.75 * (4.0 * 16.0 * 8.0 * act) / 450e9);
    // Round-robin placement with the order reversed builds the same groups on the same hosts: a tie, ranked after.
    let second = &ranking.candidates[1];
    assert_eq!(
        (second.order.as_str(), second.placement),
        ("dp-pp-tp", Placement::RoundRobin)
    );
    assert_eq!(second.seconds, best.seconds);
    let swapped = ranking
        .candidates
        .iter()
        .find(|s| (s.order.as_str(), s.placement) == ("tp-pp-dp", Placement::Launcher))
        .unwrap();
    assert_eq!(kind(swapped, TrafficKind::Dp).worst, LinkClass::Spine);
    assert!(swapped.seconds > best.seconds);
    assert_eq!(
        explain(best, &c),
        [
            "tp (8 ranks, all-reduce) stays inside each host over NVLink at 450 GB/s: 66.8 ms per step",
            "dp (4 ranks in dp_cp, reduce-scatter + all-gather) crosses hosts over InfiniBand at 50 GB/s: \
             26.2 ms per step",
            "pp (2 ranks, send/receive) crosses racks over InfiniBand through the spine at 25 GB/s: 21.5 ms per \
             step",
        ]
    );
    // In the ranking, the best order has no flags: dp and pp leave the host only because tp fills it. The order
    // that sends tp across hosts is flagged for tp, since a faster candidate keeps tp on NVLink.
    assert!(best.kinds.iter().all(|k| !k.flagged), "{:?}", best.kinds);
    let tp_out = ranking
        .candidates
        .iter()
        .find(|s| (s.order.as_str(), s.placement) == ("dp-tp-pp", Placement::Launcher))
        .unwrap();
    assert!(kind(tp_out, TrafficKind::Tp).flagged);
    assert!(!kind(tp_out, TrafficKind::Dp).flagged);
    // The classic mistake: tp outermost-but-one leaves the host and is flagged.
    let bad = LayoutConfig::new(64)
        .tp(8)
        .pp(2)
        .order("dp-tp-pp")
        .build()
        .unwrap();
    let s = score(&c, &bad, Placement::Launcher, &model_traffic(&config)).unwrap();
    let tp = kind(&s, TrafficKind::Tp);
    assert!(
        tp.flagged && tp.crosses_hosts && tp.worst == LinkClass::Nic,
        "{tp:?}"
    );
    assert!(
        explain(&s, &c)[0]
            .starts_with("tp (8 ranks, all-reduce) crosses hosts over InfiniBand at 50 GB/s")
    );
    assert!(
        explain(&s, &c)[0].ends_with("; a group of 8 alone could stay within one NVLink domain")
    );
}

/// One NVL72 rack, world 64, tp 8, pp 2: every group stays in the NVLink domain, tp groups span two 4-GPU trays
/// over NVLink, nothing is flagged and Megatron's default order wins the tie-break.
#[test]
fn golden_nvl72_everything_on_nvlink() {
    let c = cluster(NVL72);
    let config = LayoutConfig::new(64).tp(8).pp(2);
    let ranking = search(&c, &config, &model_traffic(&config)).unwrap();
    assert_eq!(ranking.default_index, 0);
    let best = ranking.best();
    assert_eq!(best.order, "tp-dp-pp");
    for k in &best.kinds {
        assert_eq!((k.worst, k.flagged), (LinkClass::Nvlink, false), "{k:?}");
        assert_eq!(k.bandwidth_gbs, 900.0);
    }
    assert!(kind(best, TrafficKind::Tp).crosses_hosts);
    assert_eq!(
        explain(best, &c)[0],
        "tp (8 ranks, all-reduce) spans hosts inside one NVLink domain at 900 GB/s: 33.4 ms per step"
    );
}

/// Two NVL72 racks, world 144, tp 8, pp 2 (dp 9): with tp-dp-pp each dp group (stride 8, 9 members, 72 ranks)
/// stays inside one rack's NVLink domain and only pp crosses racks; tp-pp-dp would send dp across racks.
#[test]
fn golden_two_nvl72_racks() {
    let c = cluster(NVL72_X2);
    let config = LayoutConfig::new(144).tp(8).pp(2);
    let ranking = search(&c, &config, &model_traffic(&config)).unwrap();
    let best = ranking.best();
    assert_eq!(best.order, "tp-dp-pp");
    assert_eq!(kind(best, TrafficKind::Dp).worst, LinkClass::Nvlink);
    assert_eq!(kind(best, TrafficKind::Pp).worst, LinkClass::Spine);
    let worse = ranking
        .candidates
        .iter()
        .find(|s| s.order == "tp-pp-dp")
        .unwrap();
    assert_eq!(kind(worse, TrafficKind::Dp).worst, LinkClass::Spine);
    assert!(worse.seconds > best.seconds);
    assert!(verdict(&ranking).starts_with("Megatron's default order tp-dp-pp is the best of"));
}

#[test]
fn explicit_placement_is_the_only_one_searched() {
    // Ranks 0 and 1 placed on different hosts: tp=2 must cross hosts whatever the order.
    let c = cluster(
        r#"{"bandwidth": {"nvlink": 450, "nic": 50}, "hosts": [
            {"name": "a", "gpus": 1, "nvlink_domain": "a"}, {"name": "b", "gpus": 1, "nvlink_domain": "b"}],
            "placement": [{"host": "b", "device": 0}, {"host": "a", "device": 0}]}"#,
    );
    let config = LayoutConfig::new(2).tp(2);
    let ranking = search(
        &c,
        &config,
        &Traffic {
            tp: 1e9,
            ..Traffic::default()
        },
    )
    .unwrap();
    assert!(
        ranking
            .candidates
            .iter()
            .all(|s| s.placement == Placement::Explicit)
    );
    assert_eq!(ranking.best().kinds[0].worst, LinkClass::Nic);
    let too_big = search(&c, &LayoutConfig::new(4).tp(2), &Traffic::default()).unwrap_err();
    assert_eq!(
        too_big.to_string(),
        "world 4 needs 4 devices but the explicit placement has 2"
    );
}

#[test]
fn a_world_larger_than_the_cluster_is_refused() {
    let c = cluster(HGX);
    let e = search(&c, &LayoutConfig::new(128).tp(8), &Traffic::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "world 128 needs 128 devices but cluster \"8 x HGX H100, 8 x 400G InfiniBand per host, 2 racks\" has 64"
    );
    let e = search(&c, &LayoutConfig::new(64).tp(3), &Traffic::default()).unwrap_err();
    assert_eq!(e.to_string(), "tp*pp*cp=3 does not divide world 64");
}

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n % d == 0).collect()
}

/// A random cluster and a layout over all its GPUs: tp, pp, cp (or ep) chosen among divisors.
fn arb_cluster_and_config() -> impl Strategy<Value = (Cluster, LayoutConfig)> {
    arb_cluster(6).prop_flat_map(|c| {
        let world = c.devices();
        (Just(c), any::<[proptest::sample::Index; 4]>()).prop_map(move |(c, picks)| {
            let pick = |i: usize, n: usize| {
                let d = divisors(n);
                d[picks[i].index(d.len())]
            };
            let tp = pick(0, world);
            let pp = pick(1, world / tp);
            let third = pick(2, world / (tp * pp));
            let config = LayoutConfig::new(world).tp(tp).pp(pp);
            let config = if picks[3].index(2) == 0 {
                config.cp(third)
            } else {
                config.ep(third)
            };
            (c, config)
        })
    })
}

fn arb_traffic() -> impl Strategy<Value = Traffic> {
    proptest::array::uniform6(0.0..1e10f64).prop_map(|b| Traffic {
        tp: b[0],
        cp: b[1],
        ep: b[2],
        dp: b[3],
        expt_dp: b[4],
        pp: b[5],
    })
}

/// The same cluster with every host, NVLink domain and rack renamed.
fn renamed(c: &Cluster, salt: u32) -> Cluster {
    let mut spec = c.spec().clone();
    let rename = |s: &str| format!("{salt}-{}", s.chars().rev().collect::<String>());
    for h in &mut spec.hosts {
        h.name = rename(&h.name);
        h.nvlink_domain = h.nvlink_domain.as_deref().map(rename);
        h.rack = h.rack.as_deref().map(rename);
    }
    Cluster::new(spec).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn best_is_never_worse_than_megatron_default((c, config) in arb_cluster_and_config(), traffic in arb_traffic()) {
        let ranking = search(&c, &config, &traffic).unwrap();
        // Score Megatron's default order independently of the search.
        let default = config.clone().order(&Order::DEFAULT.to_string()).build().unwrap();
        let direct = score(&c, &default, Placement::Launcher, &traffic).unwrap();
        // The same score, except that the search may clear flags that a faster candidate shows were necessary.
        let unflagged = |s: &Score| {
            let mut s = s.clone();
            s.kinds.iter_mut().for_each(|k| k.flagged = false);
            s
        };
        prop_assert_eq!(unflagged(ranking.default()), unflagged(&direct));
        for (ranked, alone) in ranking.default().kinds.iter().zip(&direct.kinds) {
            prop_assert!(!ranked.flagged || alone.flagged, "search added a flag: {:?}", ranked);
        }
        // The best order can only be flagged where another candidate ties with it.
        let best = ranking.best();
        let tied = ranking.candidates[1..].iter().any(|c| c.seconds == best.seconds);
        prop_assert!(tied || best.kinds.iter().all(|k| !k.flagged), "{:?}", best);
        prop_assert!(ranking.best().seconds <= direct.seconds);
        prop_assert!(ranking.candidates.windows(2).all(|w| w[0].seconds <= w[1].seconds));
    }

    #[test]
    fn scores_are_invariant_under_renaming_hosts(
        (c, config) in arb_cluster_and_config(),
        traffic in arb_traffic(),
        salt in any::<u32>(),
    ) {
        let a = search(&c, &config, &traffic).unwrap();
        let b = search(&renamed(&c, salt), &config, &traffic).unwrap();
        prop_assert_eq!(a, b);
    }

    /// With tp traffic dominant (others at most 1e5 bytes, tp at least 1e9, bandwidths at least 1.5x apart from
    /// PCIe to NIC, see `arb_cluster`), leaving the host costs tp more than any other kind could save, so a tp
    /// that fits a host never uses a NIC; where each host is its own NVLink domain (or has none), it never leaves
    /// the host at all.
    #[test]
    fn tp_that_fits_a_host_stays_inside_it(
        (c, config) in arb_cluster_and_config(),
        tp_bytes in 1e9..1e10f64,
        others in proptest::array::uniform5(0.0..1e5f64),
    ) {
        let gpus = c.hosts()[0].gpus;
        prop_assume!(gpus % config.tp == 0);
        let traffic = Traffic { tp: tp_bytes, cp: others[0], ep: others[1], dp: others[2], expt_dp: others[3], pp: others[4] };
        let ranking = search(&c, &config, &traffic).unwrap();
        if let Some(tp) = ranking.best().kinds.iter().find(|k| k.kind == TrafficKind::Tp) {
            prop_assert!(!tp.worst.uses_nic(), "{:?}", tp);
            let domains_within_hosts = c.hosts().iter().all(|h| {
                c.hosts().iter().all(|o| o.name == h.name || o.nvlink_domain.is_none() || o.nvlink_domain != h.nvlink_domain)
            });
            if domains_within_hosts {
                prop_assert!(!tp.crosses_hosts, "{:?}", tp);
            }
        }
    }
}
