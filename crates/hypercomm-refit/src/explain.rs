//! Explaining a plan: bytes per link and per rank ([`Summary`]), compared with the naive refit, and in words
//! ([`explain`]).
//!
//! The baseline is what a refit without a plan does: source rank 0 (the layout's first rank) broadcasts every full
//! tensor to every destination rank, which then keeps its shard: `model bytes × destination ranks` leave one rank.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Peer, RefitPlan, describe_layout};

/// What one source rank sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceLoad {
    /// The rank, in the source layout.
    pub rank: usize,
    /// The bytes it sends.
    pub sent: u64,
    /// Its balanced share ([`RefitPlan::balanced_share`]).
    pub share: f64,
}

/// What one destination rank receives and forwards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DestinationLoad {
    /// The rank, in the destination layout.
    pub rank: usize,
    /// The bytes it receives from source ranks.
    pub from_sources: u64,
    /// The bytes it receives from destination replicas.
    pub from_replicas: u64,
    /// The bytes it forwards to destination replicas.
    pub forwarded: u64,
}

/// The bytes one sender sends one receiver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkLoad {
    /// The sender.
    pub from: Peer,
    /// The receiving destination rank.
    pub to: usize,
    /// The bytes.
    pub bytes: u64,
    /// The transfers that carry them.
    pub transfers: usize,
}

/// The naive refit: one source rank broadcasts every full tensor to every destination rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    /// The broadcasting source rank (the source layout's first).
    pub sender: usize,
    /// The destination ranks it sends to.
    pub receivers: usize,
    /// The bytes it sends: every full tensor to each receiver.
    pub bytes: u64,
}

/// A plan in numbers: totals, every source and destination rank, every link, and the baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The source layout, as `tp=2,pp=2,dp=2`.
    pub source: String,
    /// The destination layout.
    pub destination: String,
    /// The number of parameters.
    pub params: usize,
    /// The bucket size.
    pub bucket_bytes: u64,
    /// Whether destination replicas forward to each other.
    pub forward: bool,
    /// The bytes the destination ranks hold, together.
    pub needed: u64,
    /// The bytes all transfers move.
    pub moved: u64,
    /// The bytes source ranks send.
    pub from_sources: u64,
    /// The bytes destination ranks forward.
    pub forwarded: u64,
    /// The number of transfers.
    pub transfers: usize,
    /// The number of buckets.
    pub buckets: usize,
    /// Every source rank, ascending.
    pub sources: Vec<SourceLoad>,
    /// Every destination rank, ascending.
    pub destinations: Vec<DestinationLoad>,
    /// Every link that carries bytes, by sender then receiver.
    pub links: Vec<LinkLoad>,
    /// The naive refit, for comparison.
    pub baseline: Baseline,
}

impl Summary {
    /// Adds up `plan`'s transfers.
    pub fn of(plan: &RefitPlan) -> Summary {
        let mut links: BTreeMap<(Peer, usize), (u64, usize)> = BTreeMap::new();
        for t in plan.transfers() {
            let link = links.entry((t.from, t.to)).or_default();
            link.0 = link.0.saturating_add(t.bytes());
            link.1 += 1;
        }
        let mut sources: Vec<SourceLoad> = plan
            .source()
            .ranks()
            .map(|rank| SourceLoad {
                rank,
                sent: 0,
                share: plan.balanced_share(rank),
            })
            .collect();
        let mut destinations: Vec<DestinationLoad> = plan
            .destination()
            .ranks()
            .map(|rank| DestinationLoad {
                rank,
                from_sources: 0,
                from_replicas: 0,
                forwarded: 0,
            })
            .collect();
        let (src_start, dst_start) = (
            plan.source().ranks().start,
            plan.destination().ranks().start,
        );
        // A plan read back from JSON may name ranks its layouts lack; those count in the links only.
        let index = |rank: usize, start: usize| rank.checked_sub(start);
        for (&(from, to), &(bytes, _)) in &links {
            let receiver = index(to, dst_start);
            match from {
                Peer::Source(rank) => {
                    if let Some(r) = receiver.and_then(|i| destinations.get_mut(i)) {
                        r.from_sources = r.from_sources.saturating_add(bytes);
                    }
                    if let Some(s) = index(rank, src_start).and_then(|i| sources.get_mut(i)) {
                        s.sent = s.sent.saturating_add(bytes);
                    }
                }
                Peer::Destination(rank) => {
                    if let Some(r) = receiver.and_then(|i| destinations.get_mut(i)) {
                        r.from_replicas = r.from_replicas.saturating_add(bytes);
                    }
                    if let Some(d) = index(rank, dst_start).and_then(|i| destinations.get_mut(i)) {
                        d.forwarded = d.forwarded.saturating_add(bytes);
                    }
                }
            }
        }
        let from_sources = sources.iter().fold(0u64, |a, s| a.saturating_add(s.sent));
        let forwarded = destinations
            .iter()
            .fold(0u64, |a, d| a.saturating_add(d.forwarded));
        let receivers = plan.destination().world();
        Summary {
            source: describe_layout(plan.source()),
            destination: describe_layout(plan.destination()),
            params: plan.params().len(),
            bucket_bytes: plan.options().bucket_bytes,
            forward: plan.options().forward,
            needed: plan.needed_bytes(),
            moved: plan.moved_bytes(),
            from_sources,
            forwarded,
            transfers: plan.transfers().len(),
            buckets: plan.bucket_count(),
            sources,
            destinations,
            links: links
                .into_iter()
                .map(|((from, to), (bytes, transfers))| LinkLoad {
                    from,
                    to,
                    bytes,
                    transfers,
                })
                .collect(),
            baseline: Baseline {
                sender: src_start,
                receivers,
                bytes: plan
                    .params()
                    .iter()
                    .fold(0u64, |a, p| a.saturating_add(p.bytes))
                    .saturating_mul(receivers as u64),
            },
        }
    }

    /// The source rank that sends the most (the lowest on a tie); `None` when no source rank sends.
    pub fn busiest_source(&self) -> Option<&SourceLoad> {
        self.sources
            .iter()
            .filter(|s| s.sent > 0)
            .max_by_key(|s| (s.sent, std::cmp::Reverse(s.rank)))
    }
}

/// The plan in a few sentences: what moves, how the sources share it, and the baseline.
///
/// ```
/// use hypercomm_refit::{explain, parse_layout, GptConfig, PlanOptions, RefitPlan, Side, Summary};
///
/// let sharding = GptConfig::new(2, 64, 256).sharding()?;
/// let (trainer, engines) = (parse_layout("tp=2,dp=2")?, parse_layout("dp=2")?);
/// let plan = RefitPlan::build(Side::new(&trainer, &sharding), Side::new(&engines, &sharding), PlanOptions::default())?;
/// let lines = explain(&Summary::of(&plan));
/// assert!(lines[0].starts_with("28 parameters from tp=2,dp=2 (4 ranks) to dp=2 (2 ranks)"), "{}", lines[0]);
/// assert!(lines[3].starts_with("baseline: source rank 0 broadcasting every full tensor"), "{}", lines[3]);
/// # Ok::<(), hypercomm_refit::RefitError>(())
/// ```
pub fn explain(summary: &Summary) -> Vec<String> {
    let s = summary;
    let arrives = if s.moved == s.needed {
        "each destination byte arrives once".to_owned()
    } else {
        format!(
            "{} more than needed",
            format_bytes(s.moved.abs_diff(s.needed))
        )
    };
    let mut lines = vec![format!(
        "{} parameters from {} ({} ranks) to {} ({} ranks): {} needed, {} moved in {} transfers over {} bucket(s) of at most {}; {arrives}",
        s.params,
        s.source,
        s.sources.len(),
        s.destination,
        s.destinations.len(),
        format_bytes(s.needed),
        format_bytes(s.moved),
        s.transfers,
        s.buckets,
        format_bytes(s.bucket_bytes),
    )];
    lines.push(if s.forward {
        format!(
            "source ranks send {}, each destination shard once; destination replicas forward {} to one another",
            format_bytes(s.from_sources),
            format_bytes(s.forwarded)
        )
    } else {
        format!(
            "source ranks send all {} (no forwarding between destination replicas)",
            format_bytes(s.from_sources)
        )
    });
    let senders = s.sources.iter().filter(|r| r.sent > 0).count();
    lines.push(match s.busiest_source() {
        Some(busiest) => format!(
            "busiest source rank {} sends {}, its balanced share {}; {senders} of {} source ranks send",
            busiest.rank,
            format_bytes(busiest.sent),
            format_bytes(busiest.share.round() as u64),
            s.sources.len()
        ),
        None => "no source rank sends anything".to_owned(),
    });
    let mut baseline = format!(
        "baseline: source rank {} broadcasting every full tensor to the {} destination ranks sends {}",
        s.baseline.sender,
        s.baseline.receivers,
        format_bytes(s.baseline.bytes)
    );
    if let Some(busiest) = s.busiest_source() {
        baseline.push_str(&format!(
            ", {}x what the busiest source rank sends here",
            significant(s.baseline.bytes as f64 / busiest.sent as f64)
        ));
    }
    lines.push(baseline);
    lines
}

/// Bytes with three significant digits in decimal units: `512 B`, `12.6 MB`, `1.5 GB`.
pub fn format_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    let (value, unit) = [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")]
        .into_iter()
        .find(|(scale, _)| b >= *scale)
        .map_or((b, "B"), |(scale, unit)| (b / scale, unit));
    format!("{} {unit}", significant(value))
}

/// A number with three significant digits and no trailing zeros: `450`, `6.25`, `0.5`.
fn significant(x: f64) -> String {
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
    use crate::{GptConfig, PlanOptions, Side, parse_layout};

    #[test]
    fn bytes_keep_three_significant_digits() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(12_600_000), "12.6 MB");
        assert_eq!(format_bytes(64 << 20), "67.1 MB");
        assert_eq!(format_bytes(1_500_000_000), "1.5 GB");
        assert_eq!(format_bytes(0), "0 B");
    }

    #[test]
    fn summary_adds_up_links_ranks_and_the_baseline() {
        // Trainer tp 2, pp 2, dp 2; engines: two replicas of tp 2.
        let sharding = GptConfig::new(4, 128, 1024).sharding().unwrap();
        let (trainer, engines) = (
            parse_layout("tp=2,pp=2,dp=2").unwrap(),
            parse_layout("tp=2,dp=2").unwrap(),
        );
        let plan = RefitPlan::build(
            Side::new(&trainer, &sharding),
            Side::new(&engines, &sharding),
            PlanOptions::default(),
        )
        .unwrap();
        let s = Summary::of(&plan);
        let model = sharding.bytes().unwrap();
        let replicated: u64 = sharding
            .params
            .iter()
            .filter(|p| p.split == crate::Split::Replicated)
            .map(|p| p.bytes().unwrap())
            .sum();
        // Each of the 4 engine ranks holds half of each split tensor and every replicated one.
        let per_rank = (model - replicated) / 2 + replicated;
        assert_eq!(s.needed, 4 * per_rank);
        // The sources send each engine shard once: the model once; the rest is forwarded.
        assert_eq!(
            (s.moved, s.from_sources, s.forwarded),
            (4 * per_rank, model, 4 * per_rank - model)
        );
        assert_eq!(s.links.iter().map(|l| l.bytes).sum::<u64>(), s.moved);
        assert_eq!(s.sources.len(), 8);
        assert_eq!(s.sources.iter().map(|r| r.sent).sum::<u64>(), model);
        // Every trainer rank holds data and sends its share: no rank idles.
        assert!(
            s.sources
                .iter()
                .all(|r| r.sent > 0 && (r.sent as f64 - r.share).abs() < 8.0),
            "{:?}",
            s.sources
        );
        for d in &s.destinations {
            assert_eq!(d.from_sources + d.from_replicas, per_rank);
        }
        assert_eq!(
            s.baseline,
            Baseline {
                sender: 0,
                receivers: 4,
                bytes: 4 * model
            }
        );
        let lines = explain(&s);
        assert_eq!(lines.len(), 4);
        assert!(
            lines[0].ends_with("each destination byte arrives once"),
            "{}",
            lines[0]
        );
        assert!(
            lines[3].ends_with("x what the busiest source rank sends here"),
            "{}",
            lines[3]
        );
    }
}
