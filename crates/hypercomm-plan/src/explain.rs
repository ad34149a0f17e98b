//! Explanations in words: one sentence per kind of traffic of a scored layout ("tp stays inside each host over
//! NVLink at 450 GB/s"), and a line comparing the best candidate with Megatron's default.

use crate::cluster::Cluster;
use crate::link::LinkClass;
use crate::score::{KindCost, Score};
use crate::search::Ranking;

/// One sentence per kind of `score`, in the order of `score.kinds`.
///
/// ```
/// use hypercomm_grid::layout::LayoutConfig;
/// use hypercomm_plan::{explain, score, Cluster, Placement, Traffic};
///
/// let cluster = Cluster::from_json(r#"{"fabric": "InfiniBand", "bandwidth": {"nvlink": 450, "nic": 50},
///     "hosts": [{"name": "a", "gpus": 8, "nics": 8, "nvlink_domain": "a"},
///               {"name": "b", "gpus": 8, "nics": 8, "nvlink_domain": "b"}]}"#)?;
/// let layout = LayoutConfig::new(16).tp(8).build()?;
/// let s = score(&cluster, &layout, Placement::Launcher, &Traffic { tp: 9e9, dp: 1e9, ..Traffic::default() })?;
/// assert_eq!(explain(&s, &cluster), [
///     "tp (8 ranks, all-reduce) stays inside each host over NVLink at 450 GB/s: 35 ms per step",
///     "dp (2 ranks in dp_cp, reduce-scatter + all-gather) crosses hosts over InfiniBand at 50 GB/s: 20 ms per step; \
///      a group of 2 alone could stay within one NVLink domain",
/// ]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn explain(score: &Score, cluster: &Cluster) -> Vec<String> {
    score.kinds.iter().map(|k| sentence(k, cluster)).collect()
}

fn sentence(k: &KindCost, cluster: &Cluster) -> String {
    let group = if k.group_kind == k.kind.name() {
        format!("{} ranks", k.group_size)
    } else {
        format!("{} ranks in {}", k.group_size, k.group_kind)
    };
    let fabric = cluster.fabric();
    let route = match (k.worst, k.crosses_hosts) {
        (LinkClass::SameDevice, _) => "stays on one device".to_owned(),
        (LinkClass::Nvlink, false) => "stays inside each host over NVLink".to_owned(),
        (LinkClass::Nvlink, true) => "spans hosts inside one NVLink domain".to_owned(),
        (LinkClass::Pcie, _) => "stays inside each host over PCIe".to_owned(),
        (LinkClass::Nic, _) => format!("crosses hosts over {fabric}"),
        (LinkClass::Spine, _) => format!("crosses racks over {fabric} through the spine"),
    };
    let cost = if k.bytes == 0.0 {
        "no traffic given".to_owned()
    } else {
        format!("{} per step", seconds(k.seconds))
    };
    let mut text = format!(
        "{} ({group}, {}) {route} at {} GB/s: {cost}",
        k.kind,
        k.kind.collective().describe(),
        number(k.bandwidth_gbs)
    );
    if k.flagged {
        text.push_str(&format!(
            "; a group of {} alone could stay within {}",
            k.group_size,
            within(k.achievable)
        ));
    }
    text
}

fn within(class: LinkClass) -> &'static str {
    match class {
        LinkClass::SameDevice => "one device",
        LinkClass::Nvlink => "one NVLink domain",
        LinkClass::Pcie => "one host",
        LinkClass::Nic => "one rack",
        LinkClass::Spine => "the cluster",
    }
}

/// A line comparing the best candidate with Megatron's default order.
pub fn verdict(ranking: &Ranking) -> String {
    let best = ranking.best();
    let default = ranking.default();
    let name = |s: &Score| {
        if s.order.is_empty() {
            "(no dimension above 1)".to_owned()
        } else {
            s.order.clone()
        }
    };
    if ranking.default_index == 0 {
        return format!(
            "Megatron's default order {} is the best of {} candidates: {} of communication per step",
            name(default),
            ranking.candidates.len(),
            seconds(default.seconds)
        );
    }
    let ratio = if best.seconds > 0.0 {
        format!(" ({}x the best)", number(default.seconds / best.seconds))
    } else {
        String::new()
    };
    let same = if default.seconds == best.seconds {
        ", as fast as the best"
    } else {
        ""
    };
    format!(
        "best: order {} with the {} placement, {} of communication per step; Megatron's default order {} ranks #{} of {}: {}{}{}",
        name(best),
        best.placement,
        seconds(best.seconds),
        name(default),
        ranking.default_index + 1,
        ranking.candidates.len(),
        seconds(default.seconds),
        ratio,
        same
    )
}

/// Seconds as `35 ms`, `1.23 s` or `410 µs`, three significant digits.
pub fn seconds(s: f64) -> String {
    if s == 0.0 {
        "0 ms".to_owned()
    } else if s >= 1.0 {
        format!("{} s", number(s))
    } else if s >= 1e-3 {
        format!("{} ms", number(s * 1e3))
    } else {
        format!("{} µs", number(s * 1e6))
    }
}

/// A number with three significant digits and no trailing zeros: `450`, `6.25`, `0.123`.
pub fn number(x: f64) -> String {
    if !x.is_finite() {
        return "unlimited".to_owned();
    }
    let digits = if x.abs() >= 100.0 {
        0
    } else if x.abs() >= 10.0 {
        1
    } else {
        2
    };
    let text = format!("{x:.digits$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_keep_three_significant_digits() {
        assert_eq!(number(450.0), "450");
        assert_eq!(number(6.25), "6.25");
        assert_eq!(number(12.34), "12.3");
        assert_eq!(number(1.5), "1.5");
        assert_eq!(number(f64::INFINITY), "unlimited");
        assert_eq!(seconds(0.035), "35 ms");
        assert_eq!(seconds(2.5), "2.5 s");
        assert_eq!(seconds(0.00041), "410 µs");
        assert_eq!(seconds(0.0), "0 ms");
    }
}
