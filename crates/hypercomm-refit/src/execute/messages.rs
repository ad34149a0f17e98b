//! [`RankMessages`]: what one rank sends and receives in each bucket of a plan, as one message per peer and
//! direction, with the transfers each carries in the order both ends pack and unpack them.
//!
//! A sender packs every transfer it sends one receiver in a bucket into one message, in plan order; the receiver
//! finds the same transfers in the same order by filtering the plan the same way, so a message carries no header.
//! Ranks are the group's: sources `0..T`, then the destinations (see [`group_rank`]).

use std::collections::BTreeMap;

use crate::execute::error::ExecError;
use crate::{Peer, RefitPlan};

/// One message of a bucket: to or from `peer` (a group rank), carrying `transfers` (indices into
/// [`RefitPlan::transfers`], in plan order), `bytes` in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) peer: usize,
    pub(crate) transfers: Vec<usize>,
    pub(crate) bytes: usize,
}

/// A bucket's messages on one rank: what it sends and what it receives, each sorted by peer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct BucketMessages {
    pub(crate) sends: Vec<Message>,
    pub(crate) recvs: Vec<Message>,
}

/// Every bucket's messages on one rank, by bucket index (empty where the rank takes no part).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RankMessages {
    pub(crate) buckets: Vec<BucketMessages>,
}

/// The group rank of `peer`: source rank `r` is `r` minus the source layout's first rank; destination rank `d`
/// comes after the `T` sources, at `T + d` minus the destination layout's first rank.
pub fn group_rank(plan: &RefitPlan, peer: Peer) -> Result<usize, ExecError> {
    let (side, ranks, base) = match peer {
        Peer::Source(_) => ("source", plan.source().ranks(), 0),
        Peer::Destination(_) => (
            "destination",
            plan.destination().ranks(),
            plan.source().world(),
        ),
    };
    if !ranks.contains(&peer.rank()) {
        return Err(ExecError::NotInPlan {
            peer,
            side,
            first: ranks.start,
            end: ranks.end,
        });
    }
    Ok(base + peer.rank() - ranks.start)
}

/// The plan rank of group rank `rank`: the inverse of [`group_rank`].
pub fn plan_peer(plan: &RefitPlan, rank: usize) -> Result<Peer, ExecError> {
    let sources = plan.source().world();
    let peer = if rank < sources {
        Peer::Source(plan.source().ranks().start + rank)
    } else {
        Peer::Destination(plan.destination().ranks().start + (rank - sources))
    };
    // Checks the destination side's bound (and gives the error its words).
    group_rank(plan, peer)?;
    Ok(peer)
}

impl RankMessages {
    /// The messages of `me` in `plan`.
    pub(crate) fn of(plan: &RefitPlan, me: Peer) -> Result<RankMessages, ExecError> {
        group_rank(plan, me)?;
        // (bucket, send?, peer) -> transfers, bytes; a BTreeMap keeps peers sorted and transfers in plan order.
        let mut found: BTreeMap<(usize, bool, usize), (Vec<usize>, u64)> = BTreeMap::new();
        for (i, t) in plan.transfers().iter().enumerate() {
            let to = Peer::Destination(t.to);
            for (send, other) in [(true, to), (false, t.from)] {
                let mine = if send { t.from == me } else { to == me };
                if mine {
                    let entry = found
                        .entry((t.bucket, send, group_rank(plan, other)?))
                        .or_default();
                    entry.0.push(i);
                    entry.1 = entry.1.saturating_add(t.bytes());
                }
            }
        }
        let mut buckets = vec![BucketMessages::default(); plan.bucket_count()];
        for ((bucket, send, peer), (transfers, bytes)) in found {
            let bytes =
                usize::try_from(bytes).map_err(|_| ExecError::TooLarge { bucket, bytes })?;
            if buckets.len() <= bucket {
                buckets.resize(bucket + 1, BucketMessages::default());
            }
            let slot = &mut buckets[bucket];
            let message = Message {
                peer,
                transfers,
                bytes,
            };
            if send {
                slot.sends.push(message);
            } else {
                slot.recvs.push(message);
            }
        }
        Ok(RankMessages { buckets })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GptConfig, PlanOptions, Side, parse_layout};

    #[test]
    fn every_send_is_some_rank_s_receive_with_the_same_transfers() {
        let model = GptConfig::new(2, 64, 256).sharding().unwrap();
        let (from, to) = (
            parse_layout("tp=2,pp=2,dp=2").unwrap(),
            parse_layout("tp=2,dp=2").unwrap(),
        );
        let plan = RefitPlan::build(
            Side::new(&from, &model),
            Side::new(&to, &model),
            PlanOptions::default().bucket_bytes(4096),
        )
        .unwrap();
        let n = from.world() + to.world();
        let ranks: Vec<RankMessages> = (0..n)
            .map(|r| RankMessages::of(&plan, plan_peer(&plan, r).unwrap()).unwrap())
            .collect();
        let mut moved = 0;
        for (r, messages) in ranks.iter().enumerate() {
            for (b, bucket) in messages.buckets.iter().enumerate() {
                for send in &bucket.sends {
                    let recv = ranks[send.peer].buckets[b]
                        .recvs
                        .iter()
                        .find(|m| m.peer == r)
                        .expect("the receiver expects the message");
                    assert_eq!(
                        recv,
                        &Message {
                            peer: r,
                            ..send.clone()
                        }
                    );
                    moved += send.bytes;
                }
                assert!(bucket.sends.iter().map(|m| m.bytes).sum::<usize>() <= 4096);
                assert!(bucket.recvs.iter().map(|m| m.bytes).sum::<usize>() <= 4096);
            }
        }
        assert_eq!(moved as u64, plan.moved_bytes());
        assert!(matches!(
            plan_peer(&plan, n),
            Err(ExecError::NotInPlan {
                side: "destination",
                ..
            })
        ));
    }
}
