//! Searching orders and placements for the one that minimises communication time per step.
//!
//! The space is explicit: every ordering of the dimensions whose size is above 1 (at most 5! = 120) that
//! [`LayoutConfig::build`] accepts, times each placement of [`Placement::candidates`]. Orders differing only in where
//! size-1 dimensions sit give the same groups, so they are tried once. Megatron's default order `tp-cp-ep-dp-pp`
//! with the launcher's placement is always among the candidates, so the best is never worse than it.
//!
//! Ranking is deterministic: by communication time, then placement (launcher first), then how far the order is
//! from Megatron's default (pairs of dimensions swapped), then the order string.

use std::cmp::Ordering;

use hypercomm_grid::layout::{LayoutConfig, Order, Token};
use itertools::Itertools;
use serde::Serialize;

use crate::cluster::Cluster;
use crate::error::TopologyError;
use crate::link::LinkClass;
use crate::placement::Placement;
use crate::score::{Score, effective_order, score};
use crate::traffic::{Traffic, TrafficKind};

/// Every candidate, best first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ranking {
    /// The candidates, best first.
    pub candidates: Vec<Score>,
    /// The position in `candidates` of Megatron's default order with the launcher's placement (or the explicit
    /// placement, when the cluster gives one).
    pub default_index: usize,
}

impl Ranking {
    /// The best candidate.
    pub fn best(&self) -> &Score {
        // `search` fails rather than return an empty ranking: the default order is always a candidate.
        &self.candidates[0]
    }

    /// Megatron's default order's candidate.
    pub fn default(&self) -> &Score {
        &self.candidates[self.default_index]
    }
}

/// The distinct orders to try for `config`: permutations of its size-above-1 tokens, as order strings, in
/// lexicographic order of the permutations of `tp, cp, ep, dp, pp`. Megatron's default comes first.
pub fn candidate_orders(config: &LayoutConfig) -> Vec<String> {
    let sizes = config.token_sizes();
    let tokens: Vec<Token> = Order::DEFAULT
        .tokens()
        .into_iter()
        .filter(|&t| sizes.of(t) > 1)
        .collect();
    let n = tokens.len();
    tokens
        .into_iter()
        .permutations(n)
        .map(|p| p.iter().map(|t| t.name()).join("-"))
        .collect()
}

/// Scores every candidate order and placement of `config` on `cluster` moving `traffic`, best first.
///
/// ```
/// use hypercomm_grid::layout::LayoutConfig;
/// use hypercomm_plan::{search, Cluster, Traffic};
///
/// let cluster = Cluster::from_json(r#"{"bandwidth": {"nvlink": 400, "nic": 50},
///     "hosts": [{"name": "a", "gpus": 4, "nics": 4, "nvlink_domain": "a"},
///               {"name": "b", "gpus": 4, "nics": 4, "nvlink_domain": "b"}]}"#)?;
/// // Heavy dp traffic, light tp: keeping dp inside each host beats Megatron's tp-first default.
/// let config = LayoutConfig::new(8).tp(2);
/// let ranking = search(&cluster, &config, &Traffic { tp: 1e6, dp: 1e10, ..Traffic::default() })?;
/// assert_eq!(ranking.best().order, "dp-tp");
/// assert_eq!(ranking.default().order, "tp-dp");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn search(
    cluster: &Cluster,
    config: &LayoutConfig,
    traffic: &Traffic,
) -> Result<Ranking, TopologyError> {
    // The user's own order is irrelevant to the search, but the rest of the configuration must be valid.
    let base = config.clone().order(&Order::DEFAULT.to_string()).build()?;
    let placements = Placement::candidates(cluster, base.world());
    let default_order = effective_order(&base);
    let mut candidates = Vec::new();
    for order in candidate_orders(config) {
        let layout = if order == default_order {
            base.clone()
        } else {
            match config.clone().order(&order).build() {
                Ok(layout) => layout,
                Err(_) => continue,
            }
        };
        for &placement in &placements {
            candidates.push(score(cluster, &layout, placement, traffic)?);
        }
    }
    let default_key = (default_order.as_str(), placements[0]);
    refine_flags(&mut candidates);
    candidates.sort_by(compare);
    let default_index = candidates
        .iter()
        .position(|c| (c.order.as_str(), c.placement) == default_key)
        // candidate_orders lists the default's effective order (the identity permutation), which is scored from
        // `base` without rebuilding, with placements[0]; so it is in the list.
        .expect("the default order is always a candidate");
    Ok(Ranking {
        candidates,
        default_index,
    })
}

/// Within a search, "slower than necessary" has a sharper meaning than [`score`] alone can give it: a kind stays
/// flagged only when some candidate that is at least as fast overall keeps that kind in a faster link class. A dp
/// group that leaves the host because tp fills it is then not flagged (keeping dp inside would push tp out and cost
/// more), while a tp group leaving its NVLink domain in a slower order still is.
fn refine_flags(candidates: &mut [Score]) {
    let summary: Vec<(f64, Vec<(TrafficKind, LinkClass)>)> = candidates
        .iter()
        .map(|c| {
            (
                c.seconds,
                c.kinds.iter().map(|k| (k.kind, k.worst)).collect(),
            )
        })
        .collect();
    for candidate in candidates.iter_mut() {
        let seconds = candidate.seconds;
        for k in &mut candidate.kinds {
            k.flagged = k.flagged
                && summary.iter().any(|(other_seconds, kinds)| {
                    *other_seconds <= seconds
                        && kinds
                            .iter()
                            .any(|&(kind, worst)| kind == k.kind && worst < k.worst)
                });
        }
    }
}

/// The ranking order: time, placement, distance from the default order, order string.
fn compare(a: &Score, b: &Score) -> Ordering {
    a.seconds
        .total_cmp(&b.seconds)
        .then(a.placement.cmp(&b.placement))
        .then(inversions(&a.order).cmp(&inversions(&b.order)))
        .then(a.order.cmp(&b.order))
}

/// The number of token pairs that `order` puts in the opposite order from Megatron's default.
fn inversions(order: &str) -> usize {
    let position = |name: &str| {
        Order::DEFAULT
            .tokens()
            .iter()
            .position(|t| t.name() == name)
            .unwrap_or(usize::MAX)
    };
    let p: Vec<usize> = order.split('-').map(position).collect();
    p.iter()
        .enumerate()
        .map(|(i, a)| p[i + 1..].iter().filter(|b| *b < a).count())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_skip_size_one_tokens_and_start_with_the_default() {
        let config = LayoutConfig::new(64).tp(8).pp(2);
        assert_eq!(
            candidate_orders(&config),
            [
                "tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"
            ]
        );
        let all = LayoutConfig::new(64).tp(2).pp(2).cp(2).ep(2).etp(1);
        // cp and ep cannot both exceed 1 in one grid, but the orders are still all listed: build() filters.
        assert_eq!(candidate_orders(&all).len(), 120);
        assert_eq!(candidate_orders(&LayoutConfig::new(1)), [""]);
    }

    #[test]
    fn inversions_count_swapped_pairs() {
        assert_eq!(inversions("tp-cp-ep-dp-pp"), 0);
        assert_eq!(inversions("tp-dp-pp"), 0);
        assert_eq!(inversions("dp-tp-pp"), 1);
        assert_eq!(inversions("pp-dp-tp"), 3);
    }
}
