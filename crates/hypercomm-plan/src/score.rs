//! Scoring one layout on one cluster: for each kind of traffic, which link classes its groups span, the slowest
//! link's effective bandwidth, and the time per step; plus a flag where a kind crosses a slower boundary than a
//! group of its size needs to.
//!
//! What is modelled:
//! - A collective group's slowest link is the worst [`LinkClass`] any pair of its members must cross; a pipeline
//!   group's is the worst class between adjacent stages.
//! - Time per group = `factor(n) · bytes / bandwidth` ([`Collective::factor`]); a kind's time is its slowest
//!   group's (groups run at once); a step's time is the sum over kinds (no overlap between kinds or with compute).
//! - Bandwidth of a class: NVLink per GPU; PCIe per GPU; leaving the host, `min(pcie, nic share)`; between racks
//!   also `min(.., spine share)`. The NIC share of a host is `nics · nic / k`, capped at `nic`, where `k` is the
//!   number of the host's ranks whose group of the kind leaves the host (they use the NICs at once, spread evenly);
//!   the spine share likewise with `spine`.
//!
//! What is not: rail-optimised fabrics, in-network reduction (SHARP), NVLink contention between kinds, latency,
//! hierarchical (two-level) collective algorithms, and traffic of different kinds overlapping.

use hypercomm_grid::layout::ParallelLayout;
use serde::Serialize;

use crate::cluster::Cluster;
use crate::error::TopologyError;
use crate::link::LinkClass;
use crate::placement::Placement;
use crate::traffic::{Traffic, TrafficKind};

/// The cost of one kind of traffic in one layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KindCost {
    /// The traffic kind.
    pub kind: TrafficKind,
    /// The group kind carrying it (its Megatron-Core `ProcessGroupCollection` name).
    pub group_kind: &'static str,
    /// Ranks per group.
    pub group_size: usize,
    /// Number of groups.
    pub groups: usize,
    /// Bytes per rank per step.
    pub bytes: f64,
    /// Every class some group's members cross between them, fastest first.
    pub spans: Vec<LinkClass>,
    /// The worst class any group crosses.
    pub worst: LinkClass,
    /// Whether some group has members on more than one host.
    pub crosses_hosts: bool,
    /// The effective bandwidth of the slowest group's slowest link, GB/s.
    pub bandwidth_gbs: f64,
    /// Seconds per step.
    pub seconds: f64,
    /// The fastest class a group of this size could stay within on this cluster.
    pub achievable: LinkClass,
    /// Whether the kind crosses a slower boundary than necessary. From [`score`]: `worst` is slower than
    /// `achievable`. In a [`search`](crate::search) ranking, additionally some candidate at least as fast
    /// overall keeps this kind in a faster class.
    pub flagged: bool,
}

/// One layout scored on a cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Score {
    /// The order string, fastest first, listing only dimensions of size above 1 (Megatron appends the rest).
    pub order: String,
    /// The placement of ranks on GPUs.
    pub placement: Placement,
    /// Communication seconds per step: the sum of `kinds[..].seconds`.
    pub seconds: f64,
    /// Each kind with a group size above 1 (`expt_dp` only when ep > 1).
    pub kinds: Vec<KindCost>,
}

/// Scores `layout` with its ranks on `cluster`'s GPUs as `placement` puts them, moving `traffic`.
///
/// ```
/// use hypercomm_grid::layout::LayoutConfig;
/// use hypercomm_plan::{score, Cluster, LinkClass, Placement, Traffic, TrafficKind};
///
/// let cluster = Cluster::from_json(r#"{"bandwidth": {"nvlink": 400, "nic": 50},
///     "hosts": [{"name": "a", "gpus": 4, "nics": 4, "nvlink_domain": "a"},
///               {"name": "b", "gpus": 4, "nics": 4, "nvlink_domain": "b"}]}"#)?;
/// let layout = LayoutConfig::new(8).tp(4).build()?;
/// let traffic = Traffic { tp: 8e9, dp: 1e9, ..Traffic::default() };
/// let s = score(&cluster, &layout, Placement::Launcher, &traffic)?;
/// let tp = &s.kinds[0];
/// assert_eq!((tp.kind, tp.worst, tp.flagged), (TrafficKind::Tp, LinkClass::Nvlink, false));
/// // all-reduce over 4 ranks: 2·3/4 · 8e9 bytes at 400 GB/s.
/// assert_eq!(tp.seconds, 1.5 * 8e9 / 400e9);
/// let dp = &s.kinds[1];
/// assert_eq!((dp.worst, dp.bandwidth_gbs), (LinkClass::Nic, 50.0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn score(
    cluster: &Cluster,
    layout: &ParallelLayout,
    placement: Placement,
    traffic: &Traffic,
) -> Result<Score, TopologyError> {
    let devices = placement.devices(cluster, layout.world())?;
    let offset = layout.ranks().start;
    let mut kinds = Vec::new();
    for kind in TrafficKind::ALL {
        let group_kind = kind.group_kind();
        // Without expert parallelism expt_dp groups are the dp groups again; dp already counts all parameters.
        if !layout.has(group_kind) || (kind == TrafficKind::ExptDp && layout.config().ep == 1) {
            continue;
        }
        let groups: Vec<Vec<usize>> = layout
            .groups(group_kind)?
            .map(|g| g.iter().map(|&r| devices[r - offset]).collect())
            .collect();
        let group_size = groups.first().map_or(0, Vec::len);
        if group_size > 1 {
            kinds.push(cost(cluster, kind, &groups, traffic.bytes(kind)));
        }
    }
    Ok(Score {
        order: effective_order(layout),
        placement,
        seconds: kinds.iter().map(|k| k.seconds).sum(),
        kinds,
    })
}

/// The layout's order without size-1 dimensions (`tp-dp-pp`).
pub(crate) fn effective_order(layout: &ParallelLayout) -> String {
    let sizes = layout.config().token_sizes();
    layout
        .order()
        .tokens()
        .into_iter()
        .filter(|&t| sizes.of(t) > 1)
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join("-")
}

/// The cost of one kind whose groups, as flat device indices, are `groups` (each ascending by rank).
fn cost(cluster: &Cluster, kind: TrafficKind, groups: &[Vec<usize>], bytes: f64) -> KindCost {
    let pipeline = kind == TrafficKind::Pp;
    // Each group's worst class: over all members, or over adjacent stages for pipelines.
    let worst_of: Vec<LinkClass> = groups
        .iter()
        .map(|g| {
            if pipeline {
                g.windows(2)
                    .map(|w| cluster.class_between(w[0], w[1]))
                    .max()
                    .unwrap_or(LinkClass::SameDevice)
            } else {
                cluster.class_of(g)
            }
        })
        .collect();
    let mut spans: Vec<LinkClass> = Vec::new();
    for g in groups {
        let classes = if pipeline {
            g.windows(2)
                .map(|w| cluster.class_between(w[0], w[1]))
                .collect()
        } else {
            cluster.classes_spanned(g)
        };
        spans.extend(classes);
    }
    spans.sort();
    spans.dedup();
    // Ranks per host whose group leaves the host through a NIC, and through the spine.
    let hosts = cluster.hosts().len();
    let (mut nic_users, mut spine_users) = (vec![0usize; hosts], vec![0usize; hosts]);
    for (g, &worst) in groups.iter().zip(&worst_of) {
        for &d in g {
            let h = cluster.host_of(d);
            if worst >= LinkClass::Nic {
                nic_users[h] += 1;
            }
            if worst == LinkClass::Spine {
                spine_users[h] += 1;
            }
        }
    }
    let bw = cluster.bandwidth();
    let share = |per_nic: f64, users: usize, host: usize| {
        let nics = cluster.hosts()[host].nics as f64;
        (per_nic * nics / users.max(1) as f64).min(per_nic)
    };
    let collective = kind.collective();
    let mut slowest = (0.0f64, f64::INFINITY);
    let mut crosses_hosts = false;
    for (g, &worst) in groups.iter().zip(&worst_of) {
        let first_host = cluster.host_of(g[0]);
        crosses_hosts |= g.iter().any(|&d| cluster.host_of(d) != first_host);
        let mut bandwidth = cluster.class_bandwidth(worst);
        if worst.uses_nic() {
            for &d in g {
                let h = cluster.host_of(d);
                bandwidth = bandwidth.min(share(bw.nic, nic_users[h], h));
                if worst == LinkClass::Spine {
                    bandwidth = bandwidth.min(share(bw.spine, spine_users[h], h));
                }
            }
        }
        let seconds = if worst == LinkClass::SameDevice {
            0.0
        } else {
            collective.factor(g.len()) * bytes / (bandwidth * 1e9)
        };
        if seconds > slowest.0 || (seconds == slowest.0 && bandwidth < slowest.1) {
            slowest = (seconds, bandwidth);
        }
    }
    let worst = worst_of
        .iter()
        .copied()
        .max()
        .unwrap_or(LinkClass::SameDevice);
    let group_size = groups.first().map_or(0, Vec::len);
    // A pipeline's adjacent pairs could share the fastest class that holds two GPUs.
    let achievable = cluster.best_class_for(if pipeline {
        group_size.min(2)
    } else {
        group_size
    });
    KindCost {
        kind,
        group_kind: kind.group_kind().name(),
        group_size,
        groups: groups.len(),
        bytes,
        spans,
        worst,
        crosses_hosts,
        bandwidth_gbs: slowest.1,
        seconds: slowest.0,
        achievable,
        flagged: worst > achievable,
    }
}
